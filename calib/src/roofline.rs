//! The roofline cost model: seconds of an encode pass, a prefill batch, a decode step,
//! a transfer, and the KV-cache memory left per GPU.
//!
//! GPU time of a pass is
//!
//! ```text
//! max(flops / (peak * gemm_eff * usable), bytes / (bw * mem_eff)) + layers * layer_overhead_s
//! ```
//!
//! with TP splitting work evenly and adding ring all-reduces over the GPU's link
//! (DESIGN.md "Cost").

use easerve_model::{ItemTokens, ModelArch, Parallel, Work};

use crate::eff::Efficiency;
use crate::gpu::GpuSpec;

/// Smallest SM share the model accepts; lower (or non-finite) shares are clamped to it
/// so a zero share cannot produce an infinite time.
pub const MIN_SM_SHARE: f64 = 1e-3;

/// Split of one encode pass into the DESIGN.md terms (seconds).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct EncodeTime {
    /// Fixed per forward pass (framework, launch, scheduling, transfer setup):
    /// [`Efficiency::encode_pass_s`].
    pub t_pass: f64,
    /// CPU preprocessing of all items: `Σ (preprocess_item_s + encoder_tokens * preprocess_per_token_s)`.
    pub t_pre: f64,
    /// GPU time: roofline of the pass at the granted SM share + per-layer overhead.
    pub t_gpu: f64,
}

impl EncodeTime {
    /// `t_pass + t_pre + t_gpu` (preprocessing is not overlapped with GPU work here).
    pub fn total(&self) -> f64 {
        self.t_pass + self.t_pre + self.t_gpu
    }

    /// Seconds a pass holds its encode worker once dispatched: its whole
    /// time when it preprocesses its own micro-batch (`preprocess_threads` =
    /// `None`); with preprocessing pipelined, `t_pass + t_gpu` (its requests
    /// were preprocessed while they queued). What the encode policies are
    /// priced with: the batcher's `T_enc(k)` and the SM split's latencies.
    pub fn pass(&self, preprocess_threads: Option<u32>) -> f64 {
        match preprocess_threads {
            Some(_) => self.t_pass + self.t_gpu,
            None => self.total(),
        }
    }

    /// Seconds between the starts of back-to-back passes of this size on one
    /// encode worker, which bound its throughput: [`EncodeTime::total`] when
    /// each pass preprocesses its own micro-batch (`preprocess_threads` =
    /// `None`); with preprocessing pipelined on `n` host threads, the slower of
    /// the GPU side (`t_pass + t_gpu`) and the host side (`t_pre / n`: the
    /// next micro-batch is preprocessed while this one encodes).
    pub fn cycle(&self, preprocess_threads: Option<u32>) -> f64 {
        match preprocess_threads {
            Some(n) => (self.t_pass + self.t_gpu).max(self.t_pre / f64::from(n.max(1))),
            None => self.total(),
        }
    }
}

/// Roofline profile of one model on one GPU kind with one set of efficiencies.
#[derive(Clone, Debug)]
pub struct Roofline {
    /// The model whose work is timed.
    pub model: ModelArch,
    /// The GPU every stage worker runs on (and its link for TP and transfers).
    pub gpu: GpuSpec,
    /// Efficiencies and fixed overheads.
    pub eff: Efficiency,
    /// The serving system's encode terms (framework and measured preprocessing);
    /// `None` prices them from [`Efficiency::encode_pass_s`],
    /// [`Efficiency::preprocess_item_s`] and [`Efficiency::preprocess_per_token_s`].
    pub terms: Option<crate::preprocess::EncodeTerms>,
}

fn clamp_share(sm_share: f64) -> f64 {
    if sm_share.is_finite() {
        sm_share.clamp(MIN_SM_SHARE, 1.0)
    } else {
        1.0
    }
}

impl Roofline {
    /// Bundle a model, a GPU and efficiencies.
    pub fn new(model: ModelArch, gpu: GpuSpec, eff: Efficiency) -> Self {
        Roofline {
            model,
            gpu,
            eff,
            terms: None,
        }
    }

    /// The same roofline with a serving system's measured encode terms in place
    /// of the efficiency scalars.
    pub fn with_terms(mut self, terms: crate::preprocess::EncodeTerms) -> Self {
        self.terms = Some(terms);
        self
    }

    /// Compute efficiency of GEMMs at TP `tp`: the asymptote `e_max` of the curve
    /// fitted on Vidur's measured A100 timings ([`crate::fitted::A100_GEMM_EFF`],
    /// 0.76–0.78 by TP) when [`Efficiency::gemm_eff_from_fit`] is set, else the scalar
    /// [`Efficiency::gemm_eff`]. Only the asymptote is used: the curve's roll-off at
    /// few tokens is the memory-bound regime, which the roofline's bandwidth term
    /// already models. `_tokens` (the GEMMs' rows) is kept for curves that need it.
    pub fn gemm_eff(&self, _tokens: f64, tp: u32) -> f64 {
        if self.eff.gemm_eff_from_fit {
            let fits = &crate::fitted::A100_GEMM_EFF;
            fits.iter()
                .rev()
                .find(|c| c.tp <= tp.max(1))
                .unwrap_or(&fits[0])
                .e_max
        } else {
            self.eff.gemm_eff
        }
    }

    /// Seconds of the roofline for `work` on one GPU using a fraction `usable` of its
    /// compute at GEMM efficiency `gemm_eff`:
    /// `max(flops / (peak * gemm_eff * usable), bytes / (bw * mem_eff))`.
    pub fn roofline_time(&self, work: Work, usable: f64, gemm_eff: f64) -> f64 {
        let compute = work.flops / (self.gpu.peak_flops() * gemm_eff * usable);
        let memory = work.bytes / (self.gpu.peak_bandwidth() * self.eff.mem_eff);
        compute.max(memory)
    }

    /// Seconds of one encode pass over `items` with `sm_share` in (0, 1] of the SMs.
    ///
    /// ```text
    /// t_gpu = max(flops / (peak * gemm_eff * usable), bytes / (bw * mem_eff))
    ///         + encoder_layers * layer_overhead_s
    /// ```
    ///
    /// with `usable = min(sm_share, fill)` and `fill = min(1, Σ encoder_tokens / tokens_to_fill_gpu)`: below the knee a pass
    /// cannot use every SM, so extra share does not help; above it latency scales with
    /// 1/share. `t_pass` and `t_pre` come from [`Roofline::terms`] when set, else
    /// `t_pass = encode_pass_s` and
    /// `t_pre = Σ (preprocess_item_s + encoder_tokens * preprocess_per_token_s)`.
    /// An empty batch or a model without encoder costs nothing. This is
    /// [`Roofline::encode_tp`] at TP 1.
    pub fn encode(&self, items: &[ItemTokens], sm_share: f64) -> EncodeTime {
        self.encode_tp(items, sm_share, 1)
    }

    /// [`Roofline::encode`] on an encode worker at TP `tp`: the roofline of
    /// one rank's share of the pass
    /// ([`easerve_model::ModelArch::encode_work_tp`]: the blocks split, stem
    /// and projector whole) at the GEMM efficiency of TP `tp`, plus the pass's
    /// all-reduces ([`easerve_model::ModelArch::encode_allreduce`]: two per
    /// block of `tokens × hidden × dtype_bytes`), each a ring all-reduce over
    /// the GPU's link ([`Roofline::allreduce`], as the LLM's). The host terms
    /// are as at TP 1.
    pub fn encode_tp(&self, items: &[ItemTokens], sm_share: f64, tp: u32) -> EncodeTime {
        let Some(enc) = self.model.encoder.as_ref() else {
            return EncodeTime::default();
        };
        if items.is_empty() {
            return EncodeTime::default();
        }
        let tokens: u64 = items.iter().map(|i| i.encoder_tokens).sum();
        let fill = (tokens as f64 / self.eff.tokens_to_fill_gpu).min(1.0);
        let usable = clamp_share(sm_share).min(fill.max(MIN_SM_SHARE));
        let tp = tp.max(1);
        let work = self.model.encode_work_tp(items, tp);
        let allreduce = match self.model.encode_allreduce(items, tp) {
            Some(easerve_model::Op::AllReduce {
                elements, count, ..
            }) => {
                f64::from(count) * self.allreduce(elements as f64 * f64::from(enc.dtype_bytes), tp)
            }
            _ => 0.0,
        };
        let t_gpu = self.roofline_time(work, usable, self.gemm_eff(tokens as f64, tp))
            + allreduce
            + f64::from(enc.layers) * self.eff.layer_overhead_s;
        let (t_pass, t_pre) = match &self.terms {
            Some(t) => (t.pass_s(items.len()), t.pre_s(&self.model, items)),
            None => (
                self.eff.encode_pass_s,
                items
                    .iter()
                    .map(|i| {
                        self.eff.preprocess_item_s
                            + i.encoder_tokens as f64 * self.eff.preprocess_per_token_s
                    })
                    .sum(),
            ),
        };
        EncodeTime {
            t_pass,
            t_pre,
            t_gpu,
        }
    }

    /// Seconds of one ring all-reduce of `bytes` over `tp` GPUs on the GPU's link:
    /// `2 * (tp-1)/tp * bytes / bw + latency_s`; zero at `tp <= 1` or zero bytes.
    pub fn allreduce(&self, bytes: f64, tp: u32) -> f64 {
        if tp <= 1 || bytes <= 0.0 {
            return 0.0;
        }
        let t = f64::from(tp);
        let link = &self.gpu.link;
        2.0 * (t - 1.0) / t * bytes / (link.bandwidth_gbs * 1e9) + link.latency_s
    }

    /// Seconds of the LLM body at TP `tp`: roofline of `work / tp` at `usable` share +
    /// `2 * layers` all-reduces of `tokens` tokens + `layers * layer_overhead_s`.
    fn llm_pass(&self, work: Work, tokens: u64, tp: u32, usable: f64) -> f64 {
        self.pass_time(&self.llm_pass_terms(tokens, tp, usable), work)
    }

    /// The terms of [`Roofline::llm_pass`] that depend on the tokens, TP and
    /// share but not on the work (a decode run keeps them for every iteration).
    fn llm_pass_terms(&self, tokens: u64, tp: u32, usable: f64) -> LlmPassTerms {
        let tp = tp.max(1);
        let layers = f64::from(self.model.llm.layers);
        // FP8 weights and activations: dense FP8 tensor throughput is twice
        // BF16's on Ada, Hopper and Blackwell (H100 SXM datasheet: 1,979 vs
        // 989 TFLOPS dense)
        let fp8 = if self.model.llm.dtype_bytes == 1 {
            2.0
        } else {
            1.0
        };
        LlmPassTerms {
            tp: f64::from(tp),
            usable,
            gemm_eff: self.gemm_eff(tokens as f64, tp) * fp8,
            allreduce: 2.0
                * layers
                * self.allreduce(self.model.allreduce_bytes_per_layer(tokens), tp),
            overhead: layers * self.eff.layer_overhead_s,
        }
    }

    fn pass_time(&self, p: &LlmPassTerms, work: Work) -> f64 {
        let per_gpu = Work {
            flops: work.flops / p.tp,
            bytes: work.bytes / p.tp,
        };
        self.roofline_time(per_gpu, p.usable, p.gemm_eff) + p.allreduce + p.overhead
    }

    /// Seconds of one prefill batch of sequences with these prompt lengths at TP `tp`
    /// with a fraction `sm_share` of each GPU's SMs: roofline of `prefill_work / tp` +
    /// `2 * layers` ring all-reduces over the GPU link + `layers * layer_overhead_s` +
    /// `prefill_batch_s`. An empty batch costs nothing.
    ///
    /// An `EPe` layout is priced as TP over its `tp · e` GPUs (the roofline has
    /// no term for data-parallel attention or the MoE all-to-all).
    pub fn prefill(&self, seq_lens: &[u64], par: impl Into<Parallel>, sm_share: f64) -> f64 {
        let tp = par.into().gpus();
        let tokens: u64 = seq_lens.iter().sum();
        if tokens == 0 {
            return 0.0;
        }
        let work = self.model.prefill_work(seq_lens);
        self.llm_pass(work, tokens, tp, clamp_share(sm_share)) + self.eff.prefill_batch_s
    }

    /// Seconds of one decode iteration for `batch` sequences whose contexts total
    /// `total_context_tokens`, at TP `tp` on whole GPUs: roofline of
    /// `decode_step_work / tp` + all-reduces + per-layer overhead + `decode_step_s`.
    /// `batch == 0` costs nothing.
    pub fn decode_step(
        &self,
        batch: u64,
        total_context_tokens: u64,
        par: impl Into<Parallel>,
    ) -> f64 {
        let tp = par.into().gpus();
        if batch == 0 {
            return 0.0;
        }
        let work = self.model.decode_step_work(batch, total_context_tokens);
        self.llm_pass(work, batch, tp, 1.0) + self.eff.decode_step_s
    }

    /// Bytes of GPU memory left for KV cache per GPU of a worker at `par` (a TP
    /// degree, or TP and EP): `memory_bytes * mem_util -`
    /// [`ModelArch::llm_weight_bytes_per_gpu`] `- extra_weight_bytes`, where
    /// `extra_weight_bytes` is anything else resident (e.g. a co-located encoder's
    /// [`ModelArch::encoder_weight_bytes`]) and `mem_util` is vLLM's
    /// `gpu_memory_utilization` ([`crate::DEFAULT_MEM_UTIL`] = 0.9). Activation
    /// workspace and CUDA graphs are not subtracted. `None` when nothing is left.
    pub fn kv_bytes_free_per_gpu(
        &self,
        par: impl Into<Parallel>,
        extra_weight_bytes: f64,
        mem_util: f64,
    ) -> Option<f64> {
        let free = self.gpu.memory_bytes() * mem_util
            - self.model.llm_weight_bytes_per_gpu(par.into())
            - extra_weight_bytes;
        (free > 0.0).then_some(free)
    }

    /// Tokens of KV cache the whole TP group holds: each GPU stores
    /// `kv_bytes_per_token / min(tp, kv_heads)` per token (KV heads are split over TP and
    /// replicated once TP exceeds them). `None` when nothing fits.
    pub fn kv_token_capacity(
        &self,
        tp: u32,
        extra_weight_bytes: f64,
        mem_util: f64,
    ) -> Option<u64> {
        let free = self.kv_bytes_free_per_gpu(tp, extra_weight_bytes, mem_util)?;
        let split = f64::from(tp.max(1).min(self.model.llm.kv_heads.max(1)));
        let per_gpu_per_token = self.model.kv_bytes_per_token() / split;
        Some((free / per_gpu_per_token).floor() as u64)
    }

    /// Seconds to move `bytes` once over the GPU's link ([`crate::LinkSpec::transfer_time`]).
    pub fn transfer(&self, bytes: f64) -> f64 {
        self.gpu.link.transfer_time(bytes)
    }
}

/// What [`Roofline::llm_pass`] needs besides the work: TP, the usable share,
/// the GEMM efficiency, the all-reduces' seconds and the per-layer overhead.
struct LlmPassTerms {
    tp: f64,
    usable: f64,
    gemm_eff: f64,
    allreduce: f64,
    overhead: f64,
}

impl crate::StageCost for Roofline {
    fn encode_tp(&self, items: &[ItemTokens], sm_share: f64, tp: u32) -> EncodeTime {
        Roofline::encode_tp(self, items, sm_share, tp)
    }
    fn prefill(&self, seq_lens: &[u64], par: Parallel, sm_share: f64) -> f64 {
        Roofline::prefill(self, seq_lens, par, sm_share)
    }
    /// The roofline of [`easerve_model::ModelArch::prefill_work_cached`],
    /// with the same all-reduce, per-layer and per-batch terms as
    /// [`Roofline::prefill`] over the new tokens.
    fn prefill_cached(&self, new: &[u64], cached: &[u64], par: Parallel, sm_share: f64) -> f64 {
        let tp = par.gpus();
        let tokens: u64 = new.iter().sum();
        if tokens == 0 {
            return 0.0;
        }
        let work = self.model.prefill_work_cached(new, cached);
        self.llm_pass(work, tokens, tp, clamp_share(sm_share)) + self.eff.prefill_batch_s
    }
    fn decode_step(&self, batch: u64, total_context_tokens: u64, par: Parallel) -> f64 {
        Roofline::decode_step(self, batch, total_context_tokens, par)
    }
    /// The same figures as [`Roofline::decode_step`] one by one, with the
    /// terms that do not depend on the context computed once for the run.
    fn decode_steps(
        &self,
        batch: u64,
        context: u64,
        par: Parallel,
        steps: u64,
        out: &mut Vec<f64>,
    ) {
        if batch == 0 {
            out.resize(out.len() + steps as usize, 0.0);
            return;
        }
        let work = self.model.decode_step_terms(batch);
        let pass = self.llm_pass_terms(batch, par.gpus(), 1.0);
        out.extend((0..steps).map(|i| {
            self.pass_time(&pass, work.work(context + i * batch)) + self.eff.decode_step_s
        }));
    }
    fn transfer(&self, bytes: f64) -> f64 {
        Roofline::transfer(self, bytes)
    }
    fn time_slice_penalty(&self) -> f64 {
        self.eff.time_slice_penalty
    }
    fn bandwidth_interference(&self) -> f64 {
        self.eff.bandwidth_interference
    }
    fn notes(&self) -> Vec<String> {
        let e = &self.eff;
        let gemm = if e.gemm_eff_from_fit {
            "GEMM efficiency fitted on Vidur's A100 timings"
        } else {
            "GEMM efficiency assumed"
        };
        let g = format!("{} on {}", self.model.name, self.gpu.name);
        let cpu = match &self.terms {
            Some(t) => t.note(),
            None => format!(
                "framework {} s per pass, calibrated from the EAServe paper's pass-through saturation (a 2-worker encode stage saturating near 1 req/s, §2.2, §4.2), an input rather than a prediction; preprocessing {} s per item + {} s per token (assumptions, calib/src/eff.rs)",
                e.encode_pass_s, e.preprocess_item_s, e.preprocess_per_token_s
            ),
        };
        vec![
            format!(
                "encode: roofline of {g} ({gemm}; SM-share knee at {} tokens, assumed); {cpu}",
                e.tokens_to_fill_gpu
            ),
            format!(
                "prefill: roofline of {g} ({gemm}, memory efficiency {} assumed) + {} s per batch (assumption)",
                e.mem_eff, e.prefill_batch_s
            ),
            format!(
                "decode: roofline of {g} (memory efficiency {} assumed) + {} s per step (assumption)",
                e.mem_eff, e.decode_step_s
            ),
            format!(
                "co-location: encode slowdown next to a prefill {}, time-slicing penalty {} (assumptions, calib/src/eff.rs)",
                e.bandwidth_interference, e.time_slice_penalty
            ),
        ]
    }
}

/// The roofline of two presets with the default efficiencies (tests only).
#[cfg(test)]
pub(crate) fn preset_roofline(model: &str, gpu: &str) -> Roofline {
    Roofline::new(
        ModelArch::preset(model).unwrap(),
        GpuSpec::preset(gpu).unwrap(),
        Efficiency::default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DEFAULT_MEM_UTIL;

    fn roof(model: &str, gpu: &str) -> Roofline {
        preset_roofline(model, gpu)
    }

    #[test]
    fn encode_terms_add_up() {
        let r = roof("llava-v1.6-34b", "rtx-6000-ada");
        let item = r.model.image_tokens(672, 672).unwrap();
        let t = r.encode(&[item], 1.0);
        assert_eq!(t.t_pass, r.eff.encode_pass_s);
        assert!((t.t_pre - (0.02 + 2885.0 * 2e-6)).abs() < 1e-12);
        assert!(t.t_gpu > 0.0 && t.t_gpu < 0.1, "{}", t.t_gpu);
        assert!((t.total() - (t.t_pass + t.t_pre + t.t_gpu)).abs() < 1e-15);
        // a 2-worker pass-through stage saturates near 1 req/s (encode_pass_s was
        // chosen for that): 1.3-2 s per single-image pass
        assert!(t.total() > 1.3 && t.total() < 2.0, "{}", t.total());
    }

    #[test]
    fn knee_big_batch_is_slow_at_small_share() {
        let r = roof("llava-v1.6-34b", "rtx-6000-ada");
        let item = r.model.image_tokens(672, 672).unwrap();
        let batch = [item; 8];
        let lo = r.encode(&batch, 0.2);
        let hi = r.encode(&batch, 1.0);
        assert!(lo.t_gpu > 3.0 * hi.t_gpu, "{} vs {}", lo.t_gpu, hi.t_gpu);
        assert!(lo.total() > hi.total());
    }

    #[test]
    fn knee_small_batch_flattens_above_fill() {
        let r = roof("llava-v1.6-34b", "rtx-6000-ada");
        let item = r.model.image_tokens(336, 336).unwrap(); // 1731 tokens < 4096
        let half = r.encode(&[item], 0.5).total();
        let full = r.encode(&[item], 1.0).total();
        assert!((half - full).abs() < 0.05 * full, "{half} vs {full}");
        // and below the knee share matters again
        assert!(r.encode(&[item], 0.1).t_gpu > 2.0 * r.encode(&[item], 1.0).t_gpu);
    }

    #[test]
    fn micro_batching_amortises_pass_cost() {
        let r = roof("qwen2.5-vl-32b", "rtx-6000-ada");
        let v = r.model.video_tokens(16, 448, 448).unwrap();
        let one = r.encode(&[v], 1.0).total();
        let eight = r.encode(&[v; 8], 1.0).total();
        assert!(eight < 8.0 * one / 2.0, "{eight} vs {one}");
    }

    #[test]
    fn empty_or_encoderless_encode_costs_nothing() {
        let r = roof("llava-v1.6-34b", "rtx-6000-ada");
        assert_eq!(r.encode(&[], 1.0), EncodeTime::default());
        let t = roof("text-lm-tiny", "rtx-6000-ada");
        let item = ItemTokens {
            encoder_tokens: 100,
            llm_tokens: 10,
            attn_span: 100,
        };
        assert_eq!(t.encode(&[item], 1.0).total(), 0.0);
    }

    #[test]
    fn prefill_grows_with_tokens_and_shrinks_with_tp() {
        let r = roof("llava-v1.6-34b", "rtx-6000-ada");
        let p1k = r.prefill(&[1000], 2, 1.0);
        let p3k = r.prefill(&[3000], 2, 1.0);
        assert!(p3k > p1k);
        assert!(r.prefill(&[3000], 4, 1.0) < p3k);
        assert!(r.prefill(&[3000], 2, 0.5) > p3k);
        assert_eq!(r.prefill(&[], 2, 1.0), 0.0);
    }

    #[test]
    fn a_decode_run_is_priced_as_its_iterations_one_by_one() {
        let r = roof("llava-v1.6-34b", "rtx-6000-ada");
        for (batch, context, tp) in [(1, 700, 1), (7, 5000, 4), (64, 90_000, 2), (0, 0, 1)] {
            let mut run = Vec::new();
            crate::StageCost::decode_steps(&r, batch, context, tp.into(), 40, &mut run);
            let one_by_one: Vec<f64> = (0..40)
                .map(|i| r.decode_step(batch, context + i * batch, tp))
                .collect();
            assert_eq!(run, one_by_one, "batch {batch}, TP{tp}");
        }
    }

    /// An encode worker at TP 2 on an H100 (LLaVA-NeXT's CLIP tower, 4
    /// images of 672 × 672): the roofline of one rank's share of the pass
    /// plus two ring all-reduces per block over the H100's NVLink, faster
    /// than TP 1.
    #[test]
    fn an_encoder_at_tp2_is_one_ranks_roofline_plus_its_all_reduces() {
        let r = roof("llava-v1.6-34b", "h100-sxm");
        let m = &r.model;
        let e = m.encoder.as_ref().unwrap();
        let items = vec![m.image_tokens(672, 672).unwrap(); 4];
        let tokens: u64 = items.iter().map(|i| i.encoder_tokens).sum();
        let (one, two) = (r.encode(&items, 1.0), r.encode_tp(&items, 1.0, 2));
        let usable = (tokens as f64 / r.eff.tokens_to_fill_gpu).min(1.0);
        let body = r.roofline_time(
            m.encode_work_tp(&items, 2),
            usable,
            r.gemm_eff(tokens as f64, 2),
        ) + f64::from(e.layers) * r.eff.layer_overhead_s;
        let bytes = (tokens * u64::from(e.hidden)) as f64 * f64::from(e.dtype_bytes);
        let ar = 2.0 * f64::from(e.layers) * r.allreduce(bytes, 2);
        assert!(ar > 0.0);
        assert!((two.t_gpu - body - ar).abs() < 1e-12 * two.t_gpu);
        println!(
            "roofline, 4 images 672x672 on h100-sxm: E(TP1) {:.2} ms, E(TP2) {:.2} ms ({:.2} ms all-reduce)",
            one.t_gpu * 1e3,
            two.t_gpu * 1e3,
            ar * 1e3
        );
        assert!(two.t_gpu < one.t_gpu, "{} vs {}", two.t_gpu, one.t_gpu);
    }

    #[test]
    fn allreduce_is_zero_at_tp1_and_ring_shaped() {
        let r = roof("llava-v1.6-34b", "rtx-6000-ada");
        assert_eq!(r.allreduce(1e6, 1), 0.0);
        // tp=2: 2*(1/2)*1e6/25e9 + 15e-6 = 55 µs
        assert!((r.allreduce(1e6, 2) - 55e-6).abs() < 1e-12);
    }

    #[test]
    fn decode_grows_with_context_and_is_memory_bound() {
        let r = roof("llava-v1.6-34b", "rtx-6000-ada");
        let short = r.decode_step(32, 32 * 500, 4);
        let long = r.decode_step(32, 32 * 2000, 4);
        assert!(long > short);
        // weights/4 over 768 GB/s effective ~ 22 ms: step is tens of ms
        assert!(long > 0.02 && long < 0.1, "{long}");
        assert_eq!(r.decode_step(0, 0, 4), 0.0);
    }

    #[test]
    fn yi_34b_needs_tp2_on_48_gb() {
        let r = roof("llava-v1.6-34b", "rtx-6000-ada");
        assert!(r.kv_bytes_free_per_gpu(1, 0.0, DEFAULT_MEM_UTIL).is_none());
        let free = r.kv_bytes_free_per_gpu(2, 0.0, DEFAULT_MEM_UTIL).unwrap();
        assert!((free - (43.2e9 - 34.39e9)).abs() < 0.05e9, "{free}");
        let with_enc = r
            .kv_bytes_free_per_gpu(2, r.model.encoder_weight_bytes(), DEFAULT_MEM_UTIL)
            .unwrap();
        assert!(with_enc < free);
        // KV capacity: 8 KV heads split over 2 GPUs
        let cap = r.kv_token_capacity(2, 0.0, DEFAULT_MEM_UTIL).unwrap();
        assert_eq!(cap, (free / (245_760.0 / 2.0)).floor() as u64);
    }

    #[test]
    fn transfer_uses_the_gpu_link() {
        let r = roof("llava-v1.6-34b", "rtx-6000-ada");
        let bytes = 2928.0 * r.model.embedding_bytes_per_token();
        let t = r.transfer(bytes);
        assert!((t - (15e-6 + bytes / 25e9)).abs() < 1e-12);
        let h = roof("llava-v1.6-34b", "h100-sxm");
        assert!(h.transfer(bytes) < t);
    }
}
