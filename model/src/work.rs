//! FLOP and HBM-byte accounting of one stage pass, unsharded (TP = 1).
//!
//! FLOPs count 2 per multiply-accumulate. Linear layers cost `2 * params * rows`;
//! attention costs `4 * width * L * span` per layer for a sequence of `L` tokens that
//! each attend to `span` keys (QK^T and AV, 2 FLOPs per MAC each), halved for causal
//! prefill. Bytes are HBM traffic: weights read once per pass, KV read/written, and an
//! estimate of activation reads/writes ([`ACT_HIDDEN_RW`], [`ACT_FFN_RW_GATED`],
//! [`ACT_FFN_RW_PLAIN`]). Norms, softmax and rotary FLOPs (< 1 %) are left out.

use std::iter::Sum;
use std::ops::{Add, AddAssign};

use crate::arch::{EncoderArch, EncoderKind, ModelArch};
use crate::ItemTokens;

/// Work of one stage pass, before dividing over TP.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Work {
    /// Floating-point operations (2 per multiply-accumulate).
    pub flops: f64,
    /// Bytes moved to/from HBM (weights, KV cache, activations).
    pub bytes: f64,
}

impl Work {
    /// Arithmetic intensity, FLOPs per byte (0 when no bytes move).
    pub fn intensity(&self) -> f64 {
        if self.bytes > 0.0 {
            self.flops / self.bytes
        } else {
            0.0
        }
    }
}

impl Add for Work {
    type Output = Work;
    fn add(self, rhs: Work) -> Work {
        Work {
            flops: self.flops + rhs.flops,
            bytes: self.bytes + rhs.bytes,
        }
    }
}

impl AddAssign for Work {
    fn add_assign(&mut self, rhs: Work) {
        self.flops += rhs.flops;
        self.bytes += rhs.bytes;
    }
}

impl Sum for Work {
    fn sum<I: Iterator<Item = Work>>(iter: I) -> Work {
        iter.fold(Work::default(), Add::add)
    }
}

/// Hidden-width activation elements read + written per token per transformer layer
/// (pre-norm block: norm in/out, QKV out, attention in/out, O out, two residual adds,
/// second norm, MLP in/out; with the fusions vLLM applies). **Estimate**, to be
/// absorbed by the fitted `mem_eff`.
pub const ACT_HIDDEN_RW: f64 = 12.0;
/// FFN-width activation elements read + written per token per layer for a gated MLP
/// (gate+up written and read, product written and read). **Estimate.**
pub const ACT_FFN_RW_GATED: f64 = 6.0;
/// FFN-width activation elements per token per layer for a GELU MLP with the
/// activation fused into the first GEMM (written once, read once). **Estimate.**
pub const ACT_FFN_RW_PLAIN: f64 = 2.0;

impl EncoderArch {
    /// Activation bytes one token moves through one block (see
    /// [`ACT_HIDDEN_RW`]) on one rank of a TP `tp` encoder (1: the whole
    /// block): the hidden-width activations (norms, residuals, the
    /// all-reduced projections' outputs) whole on every rank, the MLP's
    /// FFN-width ones split over the ranks.
    pub(crate) fn act_bytes_per_token_layer_tp(&self, tp: u32) -> f64 {
        let ffn_rw = if self.gated_mlp {
            ACT_FFN_RW_GATED
        } else {
            ACT_FFN_RW_PLAIN
        };
        (ACT_HIDDEN_RW * f64::from(self.hidden)
            + ffn_rw * f64::from(self.ffn) / f64::from(tp.max(1)))
            * f64::from(self.dtype_bytes)
    }
}

impl ModelArch {
    /// Rows the projector runs over for one item:
    /// * CLIP anyres: every tile's patch features (CLS dropped), `tiles * 576`,
    ///   before unpadding (LLaVA projects, then unpads);
    /// * Qwen merger: one row per merged token (= `llm_tokens`);
    /// * Ultravox: one row per stacked frame group (= `llm_tokens`).
    pub fn projector_rows(&self, item: &ItemTokens) -> u64 {
        match self.encoder.as_ref().map(|e| &e.kind) {
            Some(EncoderKind::ClipAnyres {
                image_size, patch, ..
            }) => {
                let side = u64::from(image_size / patch);
                let tile = side * side;
                item.encoder_tokens / (tile + 1) * tile
            }
            Some(_) => item.llm_tokens,
            None => 0,
        }
    }

    /// One encoder forward pass over a micro-batch of items (incl. stem and projector):
    /// total FLOPs (2 per MAC; attention's quadratic term per attention span / window) and
    /// HBM bytes (weights read once per pass + activations read/written + embeddings out).
    ///
    /// Per item with `n` encoder tokens and span `s`, per layer:
    /// `2 * layer_params * n + 4 * hidden * n * s`. Qwen's window layers (all but every
    /// `fullatt_every`-th) use `s = min(span, (window_px/patch)^2)` = 64. Zero work when
    /// there is no encoder.
    ///
    /// One 672x672 LLaVA image: 2885 tokens -> 2.25 TFLOP (1.75 linear, 0.16 attention,
    /// 0.34 projector over 5*576 rows); 8 of them 18 TFLOP.
    pub fn encode_work(&self, items: &[ItemTokens]) -> Work {
        self.encode_work_tp(items, 1)
    }

    /// [`ModelArch::encode_work`] on one rank of an encoder at TP `tp`
    /// (Megatron-style, as [`crate::EncoderArch::executor_tp`] splits it):
    /// the blocks' linear and attention FLOPs, their weights and their
    /// FFN-width activations over `tp`; the stem, the projector, the
    /// hidden-width activations and the embeddings out whole on every rank.
    /// The all-reduces are not work: [`ModelArch::encode_allreduce`] names
    /// them. `tp` ≤ 1 is [`ModelArch::encode_work`].
    pub fn encode_work_tp(&self, items: &[ItemTokens], tp: u32) -> Work {
        let Some(enc) = self.encoder.as_ref() else {
            return Work::default();
        };
        if items.is_empty() {
            return Work::default();
        }
        let layers = f64::from(enc.layers);
        let h = f64::from(enc.hidden);
        let dtype = f64::from(enc.dtype_bytes);
        // (full-attention layers, window-attention layers, window tokens)
        let (full_layers, win_layers, win_tokens) = match &enc.kind {
            EncoderKind::QwenVit {
                patch,
                window_px,
                fullatt_every,
                ..
            } => {
                let full = enc.layers / (*fullatt_every).max(1);
                let side = u64::from(window_px / patch);
                (f64::from(full), f64::from(enc.layers - full), side * side)
            }
            _ => (layers, 0.0, 0),
        };
        let k = f64::from(tp.max(1));
        let block_weights = layers * enc.layer_params() * dtype;
        let mut w = Work {
            flops: 0.0,
            bytes: self.encoder_weight_bytes() - block_weights * (1.0 - 1.0 / k),
        };
        for it in items {
            let n = it.encoder_tokens as f64;
            let span = it.attn_span as f64;
            let win_span = it.attn_span.min(win_tokens) as f64;
            let linear = 2.0 * (layers * enc.layer_params() / k + enc.stem_macs_per_token()) * n;
            let attn = 4.0 * h * n * (full_layers * span + win_layers * win_span) / k;
            let proj = 2.0 * enc.projector_params as f64 * self.projector_rows(it) as f64;
            w.flops += linear + attn + proj;
            w.bytes += layers * n * enc.act_bytes_per_token_layer_tp(tp)
                + it.llm_tokens as f64 * self.embedding_bytes_per_token()
                + n * h * dtype;
        }
        w
    }

    /// LLM activation bytes one token moves through one decoder layer (estimate, see
    /// [`ACT_HIDDEN_RW`]; the LLM MLP is gated).
    pub(crate) fn llm_act_bytes_per_token_layer(&self) -> f64 {
        (ACT_HIDDEN_RW * f64::from(self.llm.hidden) + ACT_FFN_RW_GATED * self.llm_mean_ffn())
            * f64::from(self.llm.dtype_bytes)
    }

    /// The MLP width one token passes per layer, averaged over the layers:
    /// `ffn` for a dense model; for an MoE layer `top_k · expert_ffn` plus the
    /// shared experts' width.
    fn llm_mean_ffn(&self) -> f64 {
        let l = &self.llm;
        let Some(m) = &l.moe else {
            return f64::from(l.ffn);
        };
        let (dense, moe) = l.layer_split();
        let per_moe = f64::from(m.top_k) * f64::from(m.expert_ffn)
            + f64::from(m.shared_experts) * f64::from(m.shared_ffn);
        (f64::from(dense) * f64::from(l.ffn) + f64::from(moe) * per_moe)
            / f64::from(l.layers.max(1))
    }

    /// Weight bytes one LLM pass over `tokens` tokens streams from HBM: all
    /// layers (of an MoE model, the experts those tokens are routed to,
    /// [`crate::LlmArch::streamed_body_params`]) + LM head (the embedding table
    /// is only gathered row by row, so an untied table is not streamed).
    pub fn llm_streamed_weight_bytes(&self, tokens: u64) -> f64 {
        (self.llm.streamed_body_params(tokens) + self.llm.vocab_matrix_params())
            * f64::from(self.llm.dtype_bytes)
    }

    /// One prefill pass over a batch of sequences with these prompt lengths (tokens,
    /// incl. multimodal tokens), unsharded: FLOPs = linear `2 * body_params * T` +
    /// causal attention `4 * layers * (heads*head_dim) * L^2 / 2` per sequence + LM head
    /// `2 * vocab * hidden` for the last token of each sequence; bytes = streamed
    /// weights once + KV written (`kv_bytes_per_token * T`) + activations + embeddings in.
    /// Empty batch -> zero work.
    pub fn prefill_work(&self, seq_lens: &[u64]) -> Work {
        let total: u64 = seq_lens.iter().sum();
        if total == 0 {
            return Work::default();
        }
        let t = total as f64;
        let layers = f64::from(self.llm.layers);
        let attn: f64 = seq_lens
            .iter()
            .map(|&l| 4.0 * layers * self.llm.q_width() * (l as f64).powi(2) / 2.0)
            .sum();
        let nseq = seq_lens.iter().filter(|&&l| l > 0).count() as f64;
        let flops = 2.0 * self.llm.active_body_params() * t
            + attn
            + 2.0 * self.llm.vocab_matrix_params() * nseq;
        let bytes = self.llm_streamed_weight_bytes(total)
            + self.kv_bytes_per_token() * t
            + layers * t * self.llm_act_bytes_per_token_layer()
            + t * self.embedding_bytes_per_token();
        Work { flops, bytes }
    }

    /// [`ModelArch::prefill_work`] of a batch whose sequence `i` computes
    /// its last `new[i]` tokens after `cached[i]` cached ones: the linear
    /// terms over the new tokens, the causal attention of the new queries
    /// over the whole context (`(L² − cached²)/2` pairs, `L = cached +
    /// new`), and the cached KV read once more.
    pub fn prefill_work_cached(&self, new: &[u64], cached: &[u64]) -> Work {
        let mut w = self.prefill_work(new);
        let layers = f64::from(self.llm.layers);
        for (&n, &c) in new.iter().zip(cached) {
            if n == 0 || c == 0 {
                continue;
            }
            let (l, c) = ((n + c) as f64, c as f64);
            w.flops +=
                4.0 * layers * self.llm.q_width() * (l * l - c * c - (n as f64).powi(2)) / 2.0;
            w.bytes += self.kv_bytes_per_token() * c;
        }
        w
    }

    /// One decode iteration for `batch` sequences whose contexts total
    /// `total_context_tokens`, unsharded: FLOPs = `2 * (body + LM head) * batch` +
    /// attention `4 * layers * (heads*head_dim) * total_context_tokens`; bytes = streamed
    /// weights once + KV read of all contexts + KV written for the new tokens +
    /// activations. `batch == 0` -> zero work.
    pub fn decode_step_work(&self, batch: u64, total_context_tokens: u64) -> Work {
        self.decode_step_terms(batch).work(total_context_tokens)
    }

    /// The terms of [`ModelArch::decode_step_work`] that do not depend on the
    /// context, for pricing a run of iterations over one batch.
    pub fn decode_step_terms(&self, batch: u64) -> DecodeStepTerms {
        let b = batch as f64;
        let layers = f64::from(self.llm.layers);
        DecodeStepTerms {
            empty: batch == 0,
            b,
            flops_fixed: 2.0 * (self.llm.active_body_params() + self.llm.vocab_matrix_params()) * b,
            flops_per_context_token: 4.0 * layers * self.llm.q_width(),
            bytes_fixed: self.llm_streamed_weight_bytes(batch),
            kv_bytes_per_token: self.kv_bytes_per_token(),
            act_bytes: layers * b * self.llm_act_bytes_per_token_layer(),
        }
    }
}

/// [`ModelArch::decode_step_work`] of one batch size, with the context left
/// open ([`DecodeStepTerms::work`] gives the same figures as
/// `decode_step_work`, which is computed through it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeStepTerms {
    empty: bool,
    b: f64,
    flops_fixed: f64,
    flops_per_context_token: f64,
    bytes_fixed: f64,
    kv_bytes_per_token: f64,
    act_bytes: f64,
}

impl DecodeStepTerms {
    /// Work of one iteration whose sequences hold `total_context_tokens`.
    pub fn work(&self, total_context_tokens: u64) -> Work {
        if self.empty {
            return Work::default();
        }
        let ctx = total_context_tokens as f64;
        Work {
            flops: self.flops_fixed + self.flops_per_context_token * ctx,
            bytes: self.bytes_fixed + self.kv_bytes_per_token * (ctx + self.b) + self.act_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(name: &str) -> ModelArch {
        ModelArch::preset(name).unwrap()
    }

    #[test]
    fn work_adds() {
        let mut a = Work {
            flops: 1.0,
            bytes: 2.0,
        };
        a += Work {
            flops: 3.0,
            bytes: 4.0,
        };
        assert_eq!(
            a,
            Work {
                flops: 4.0,
                bytes: 6.0
            }
        );
        assert_eq!(
            a + a,
            Work {
                flops: 8.0,
                bytes: 12.0
            }
        );
        let s: Work = [a, a].into_iter().sum();
        assert_eq!(s, a + a);
        assert_eq!(a.intensity(), 4.0 / 6.0);
    }

    #[test]
    fn llava_image_encode_is_about_2_tflop() {
        let m = m("llava-v1.6-34b");
        let t = m.image_tokens(672, 672).unwrap();
        let w = m.encode_work(&[t]);
        // 2 * 302e6 * 2885 = 1.74e12 linear, + attention ~0.16e12 + projector ~0.34e12
        assert!(w.flops > 1.8e12 && w.flops < 2.5e12, "{}", w.flops);
        assert!(w.bytes > m.encoder_weight_bytes());
    }

    #[test]
    fn encode_flops_grow_with_tokens_and_batch_amortises_weights() {
        let m = m("qwen2.5-vl-32b");
        let small = m.video_tokens(4, 448, 448).unwrap();
        let big = m.video_tokens(16, 448, 448).unwrap();
        let ws = m.encode_work(&[small]);
        let wb = m.encode_work(&[big]);
        assert!(wb.flops > 3.9 * ws.flops);
        let w8 = m.encode_work(&[big; 8]);
        assert!((w8.flops - 8.0 * wb.flops).abs() < 1e-6 * w8.flops);
        // weights are read once per pass, not once per item
        assert!(w8.bytes < 8.0 * wb.bytes);
        assert_eq!(m.encode_work(&[]), Work::default());
    }

    #[test]
    fn qwen_window_layers_cost_less_attention_than_full() {
        // A large image's attention term is dominated by the 4 full layers; with all 32
        // layers full the FLOPs would be far larger.
        let q = m("qwen2.5-vl-32b");
        let t = q.image_tokens(1344, 1344).unwrap(); // 96x96 = 9216 patches
        let w = q.encode_work(&[t]);
        let enc = q.encoder.as_ref().unwrap();
        let n = t.encoder_tokens as f64;
        let all_full = 4.0 * 1280.0 * n * n * 32.0;
        let linear = 2.0 * (32.0 * enc.layer_params() + enc.stem_macs_per_token()) * n;
        assert!(w.flops - linear < all_full / 4.0);
    }

    #[test]
    fn audio_encode_pads_to_windows() {
        let u = m("ultravox-v0.6-27b");
        let a = u.encode_work(&[u.audio_tokens(1.0).unwrap()]);
        let b = u.encode_work(&[u.audio_tokens(29.0).unwrap()]);
        // same 1500 encoder frames; only the projector rows differ
        assert!(b.flops > a.flops && b.flops < 1.05 * a.flops);
    }

    #[test]
    fn text_model_encode_is_zero() {
        let t = m("text-lm-tiny");
        let item = ItemTokens {
            encoder_tokens: 10,
            llm_tokens: 10,
            attn_span: 10,
        };
        assert_eq!(t.encode_work(&[item]), Work::default());
    }

    #[test]
    fn prefill_flops_are_2_params_per_token_plus_attention() {
        let m = m("llava-v1.6-34b");
        let w = m.prefill_work(&[3000]);
        let linear = 2.0 * m.llm.body_params() * 3000.0;
        let attn = 4.0 * 60.0 * 7168.0 * 3000.0f64.powi(2) / 2.0;
        let head = 2.0 * 64064.0 * 7168.0;
        assert!((w.flops - (linear + attn + head)).abs() < 1e-9 * w.flops);
        // ~200 TFLOP for 3000 tokens of a 34B model
        assert!(w.flops > 2.0e14 && w.flops < 2.2e14, "{}", w.flops);
        assert!(m.prefill_work(&[4000]).flops > w.flops);
        // same tokens split into two sequences: less attention
        assert!(m.prefill_work(&[1500, 1500]).flops < w.flops);
        assert_eq!(m.prefill_work(&[]), Work::default());
    }

    #[test]
    fn decode_bytes_are_weights_plus_kv() {
        let m = m("llava-v1.6-34b");
        let w = m.decode_step_work(32, 64_000);
        let floor = m.llm_streamed_weight_bytes(32) + 64_000.0 * m.kv_bytes_per_token();
        assert!(w.bytes > floor && w.bytes < 1.01 * floor + 1e8);
        assert!(m.decode_step_work(32, 128_000).bytes > w.bytes);
        assert!(m.decode_step_work(32, 128_000).flops > w.flops);
        assert_eq!(m.decode_step_work(0, 0), Work::default());
    }
}
