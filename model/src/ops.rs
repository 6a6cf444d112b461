//! Operator lists: the kernels one stage pass launches, with their shapes.
//!
//! A cost model prices each [`Op`] (from measured kernel tables, or a roofline)
//! and sums them; [`crate::work`] counts the same passes as FLOPs and bytes. The
//! shapes follow the model definitions in `nn/` (and the Hugging Face modules they
//! mirror); the tests assert the two agree.
//!
//! Conventions, every list:
//! * a GEMM is `[m, k] x [k, n]` with `m` = rows (tokens), as aiconfigurator's and
//!   cuBLAS's tables key it; identical layers appear once with `count = layers`;
//! * attention is one varlen kernel over `batch` sequences of `seq` tokens each
//!   (for prefill: the RMS length of the batch's sequences, which keeps the
//!   quadratic work of the real lengths; for decode: the mean context);
//! * at TP `t` every projection is split over the `t` ranks (column-parallel
//!   QKV/gate-up, row-parallel O/down), query heads are split and KV heads are
//!   split until one is left per rank (then replicated), and each layer ends its
//!   attention and its MLP with an all-reduce of `tokens * hidden` elements;
//! * norms, activations, residual adds and RoPE are one [`Op::Memory`] per layer:
//!   the activation bytes of [`crate::work`]'s accounting, read and written once.

use crate::arch::{omni_conv_out, EncoderArch, EncoderKind, ModelArch, MoeRouting};
use crate::ItemTokens;

/// Which attention kernel an [`Op::Attention`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnKind {
    /// Non-causal attention over whole sequences (ViT tiles, windows, audio windows).
    Encoder,
    /// Causal prefill attention over `seq` new tokens per sequence.
    Context,
    /// One decode step: one query token per sequence over `seq` cached tokens.
    Generation,
}

/// Which NCCL collective an [`Op::Collective`] is (aiconfigurator's
/// `nccl_perf` `op_name`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CollectiveKind {
    /// `all_gather`.
    AllGather,
    /// `reduce_scatter`.
    ReduceScatter,
}

impl CollectiveKind {
    /// The `op_name` of the NCCL table.
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::ReduceScatter => "reduce_scatter",
        }
    }
}

/// How one worker of a prefill or decode stage spreads over its GPUs, in the
/// allocation notation's `(TPt,EPe)`: `e` data-parallel attention replicas,
/// each over `t` GPUs with tensor parallelism, and the MoE layers' experts
/// split over the `e` replicas, each expert's width over `t` (aiconfigurator's
/// `moe_tp_size = t`, `moe_ep_size = e`); `t·e` GPUs in all. `EP1` is plain
/// tensor parallelism. A step's sequences and tokens are shared evenly by the
/// replicas (rounded up: the busiest replica sets the time).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Parallel {
    /// Tensor-parallel degree of each attention replica and each expert.
    pub tp: u32,
    /// Expert-parallel degree (= data-parallel attention replicas).
    pub ep: u32,
}

impl Parallel {
    /// `(TPtp,EPep)`, each at least 1.
    pub fn new(tp: u32, ep: u32) -> Parallel {
        Parallel {
            tp: tp.max(1),
            ep: ep.max(1),
        }
    }

    /// GPUs of one worker: `tp · ep`.
    pub fn gpus(self) -> u32 {
        self.tp * self.ep
    }

    /// One number per layout for memo keys (`tp` and `ep` are at most 2^16).
    pub fn key(self) -> u32 {
        (self.ep << 16) | (self.tp & 0xffff)
    }
}

impl From<u32> for Parallel {
    /// Plain tensor parallelism: `(TPtp,EP1)`.
    fn from(tp: u32) -> Parallel {
        Parallel::new(tp, 1)
    }
}

impl std::fmt::Display for Parallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.ep > 1 {
            write!(f, "TP{},EP{}", self.tp, self.ep)
        } else {
            write!(f, "TP{}", self.tp)
        }
    }
}

/// One kernel (or a run of identical kernels) of a stage pass.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// Dense GEMM `[m, k] x [k, n]`, `count` times.
    Gemm {
        /// What it is (`"qkv"`, `"o"`, `"mlp_up"`, `"mlp_down"`, `"lm_head"`, …).
        name: &'static str,
        /// Rows (tokens).
        m: u64,
        /// Output columns per rank.
        n: u64,
        /// Inner dimension per rank.
        k: u64,
        /// How many times the pass runs it (layers).
        count: u32,
    },
    /// An attention kernel over `batch` sequences of `seq` tokens, `count` times.
    Attention {
        /// Which kernel.
        kind: AttnKind,
        /// Sequences in the call.
        batch: u64,
        /// Tokens per sequence (query length for encoder/context, cached context for generation).
        seq: u64,
        /// Query heads per rank.
        heads: u32,
        /// KV heads per rank (= `heads` for encoders).
        kv_heads: u32,
        /// Head width.
        head_dim: u32,
        /// How many times the pass runs it (layers).
        count: u32,
    },
    /// A TP all-reduce of `elements` activation elements over `tp` ranks, `count` times.
    AllReduce {
        /// Elements reduced (`tokens * hidden`).
        elements: u64,
        /// Ranks.
        tp: u32,
        /// How many times the pass runs it.
        count: u32,
    },
    /// One fused mixture-of-experts layer (router gather, the routed experts'
    /// gated GEMMs, combine) over `tokens` tokens, `count` times, as NVIDIA
    /// aiconfigurator's `moe_perf` table keys it: each token goes to `top_k`
    /// of `experts` experts of width `inter`; the experts are split over
    /// `moe_ep` expert-parallel groups and each expert's width over `moe_tp`
    /// ranks. The router GEMM and shared experts are separate [`Op::Gemm`]s.
    Moe {
        /// Tokens entering the layer.
        tokens: u64,
        /// Model width.
        hidden: u32,
        /// One expert's MLP width (unsharded).
        inter: u32,
        /// Experts per token.
        top_k: u32,
        /// Routed experts (all ranks).
        experts: u32,
        /// Ranks each expert's width is split over.
        moe_tp: u32,
        /// Expert-parallel groups the experts are split over.
        moe_ep: u32,
        /// How the tokens spread over the experts.
        routing: MoeRouting,
        /// How many times the pass runs it (MoE layers).
        count: u32,
    },
    /// A NCCL collective over `gpus` ranks moving `elements` activation
    /// elements (the gathered or the scattered tensor), `count` times: the
    /// all-gather before and the reduce-scatter after an expert-parallel MoE
    /// layer (vLLM's `allgather_reducescatter` all-to-all backend).
    Collective {
        /// Which collective.
        kind: CollectiveKind,
        /// Elements of the full tensor (`tokens * hidden`).
        elements: u64,
        /// Ranks taking part.
        gpus: u32,
        /// How many times the pass runs it.
        count: u32,
    },
    /// Bandwidth-bound elementwise work (norms, activation, residual adds, RoPE).
    Memory {
        /// What it is.
        name: &'static str,
        /// HBM bytes read + written per call, per rank.
        bytes: f64,
        /// Kernel launches per call (each pays the device's fixed memory-op latency).
        kernels: u32,
        /// How many times the pass runs it.
        count: u32,
    },
}

/// Kernel launches of one fused MoE layer as vLLM's Triton `fused_moe` path
/// runs it (`vllm/model_executor/layers/fused_moe/fused_moe.py`): the top-k
/// softmax of the router logits, `moe_align_block_size`, the gate/up expert
/// GEMM, the SiLU-and-multiply, the down expert GEMM and the weighted sum over
/// the top k — six.
pub const MOE_LAUNCHES: u64 = 6;

impl Op {
    /// FLOPs of the op, all `count` calls, per rank (2 per multiply-accumulate; the
    /// attention term counts QK^T and AV, halved for causal prefill).
    pub fn flops(&self) -> f64 {
        match *self {
            Op::Gemm { m, n, k, count, .. } => 2.0 * (m * n * k) as f64 * f64::from(count),
            Op::Attention {
                kind,
                batch,
                seq,
                heads,
                head_dim,
                count,
                ..
            } => {
                let per = match kind {
                    AttnKind::Encoder => 4.0 * (seq * seq) as f64,
                    AttnKind::Context => 2.0 * (seq * seq) as f64,
                    AttnKind::Generation => 4.0 * seq as f64,
                };
                per * batch as f64 * f64::from(heads) * f64::from(head_dim) * f64::from(count)
            }
            Op::Moe { count, .. } => {
                let (pairs, _, inter) = self.moe_rank_shape();
                2.0 * 3.0 * pairs * inter * self.moe_hidden() * f64::from(count)
            }
            Op::AllReduce { .. } | Op::Collective { .. } | Op::Memory { .. } => 0.0,
        }
    }

    /// Of an [`Op::Moe`], per rank: the token-expert pairs it computes (its
    /// share of `tokens·top_k`, the busiest rank's under a skewed routing),
    /// the experts it holds that receive at least one token, and each
    /// expert's width on it (`inter / moe_tp`); zeros for another op.
    pub fn moe_rank_shape(&self) -> (f64, f64, f64) {
        let Op::Moe {
            tokens,
            inter,
            top_k,
            experts,
            moe_tp,
            moe_ep,
            routing,
            ..
        } = *self
        else {
            return (0.0, 0.0, 0.0);
        };
        let ep = moe_ep.max(1) as usize;
        let loads = routing.expert_loads(tokens, top_k, experts);
        // experts are dealt to the ranks round-robin by load rank, so each
        // rank holds a similar mix; the busiest rank (rank 0) sets the time
        let mine: Vec<u64> = loads.iter().step_by(ep).copied().collect();
        let pairs: u64 = mine.iter().sum();
        let touched = mine.iter().filter(|&&l| l > 0).count();
        (
            pairs as f64,
            touched as f64,
            f64::from(inter) / f64::from(moe_tp.max(1)),
        )
    }

    /// Kernel launches of the op, all `count` calls: one per GEMM, attention,
    /// all-reduce and collective call; `kernels` per elementwise call; and
    /// [`MOE_LAUNCHES`] per fused MoE layer. An engine that runs a pass eagerly
    /// dispatches each from the host (`easerve_calib::launch`).
    pub fn launches(&self) -> u64 {
        let (per, count) = match *self {
            Op::Gemm { count, .. }
            | Op::Attention { count, .. }
            | Op::AllReduce { count, .. }
            | Op::Collective { count, .. } => (1, count),
            Op::Moe { count, .. } => (MOE_LAUNCHES, count),
            Op::Memory { kernels, count, .. } => (u64::from(kernels), count),
        };
        per * u64::from(count)
    }

    fn moe_hidden(&self) -> f64 {
        match *self {
            Op::Moe { hidden, .. } => f64::from(hidden),
            _ => 0.0,
        }
    }

    /// HBM bytes of the op, all `count` calls, per rank, with `elem_bytes` bytes per
    /// element (2 for BF16): a GEMM reads `[m, k]` and `[k, n]` and writes `[m, n]`;
    /// encoder/context attention reads Q, K, V and writes O over `seq` tokens per
    /// sequence; a decode step reads one query and writes one output per head and
    /// reads `seq` cached K and V per KV head; elementwise ops move their `bytes`; an
    /// all-reduce is counted on the link, not in HBM (0).
    pub fn bytes(&self, elem_bytes: f64) -> f64 {
        match *self {
            Op::Gemm { m, n, k, count, .. } => {
                elem_bytes * ((m * k + k * n + m * n) as f64) * f64::from(count)
            }
            Op::Attention {
                kind,
                batch,
                seq,
                heads,
                kv_heads,
                head_dim,
                count,
            } => {
                let (h, kv, hd, s) = (
                    f64::from(heads),
                    f64::from(kv_heads),
                    f64::from(head_dim),
                    seq as f64,
                );
                let per_seq = match kind {
                    AttnKind::Generation => (2.0 * h + 2.0 * kv * s) * hd,
                    _ => (2.0 * h + 2.0 * kv) * hd * s,
                };
                elem_bytes * per_seq * batch as f64 * f64::from(count)
            }
            Op::Moe { count, .. } => {
                // the touched experts' gate, up and down weights, and each
                // pair's input row, gate/up output and down output
                let (pairs, touched, inter) = self.moe_rank_shape();
                let h = self.moe_hidden();
                elem_bytes
                    * (touched * 3.0 * h * inter + pairs * (2.0 * h + 3.0 * inter))
                    * f64::from(count)
            }
            Op::AllReduce { .. } | Op::Collective { .. } => 0.0,
            Op::Memory { bytes, count, .. } => bytes * f64::from(count),
        }
    }
}

/// The projector's two GEMMs `(k_in, n_mid, k_mid, n_out)` per family, as `nn/`
/// builds it: LLaVA `mlp2x_gelu` `hidden -> d_llm -> d_llm`; Qwen merger
/// `hidden*merge^2 -> same -> d_llm`; Ultravox `hidden*stack -> h -> SwiGLU (h/2) ->
/// d_llm` with `h` from `projector_params = stack*hidden*h + h/2*d_llm`.
pub fn projector_shapes(m: &ModelArch, e: &EncoderArch) -> (u64, u64, u64, u64) {
    let h = u64::from(e.hidden);
    let d_llm = u64::from(m.llm.hidden);
    match &e.kind {
        EncoderKind::ClipAnyres { .. } => (h, d_llm, d_llm, d_llm),
        EncoderKind::QwenVit { spatial_merge, .. } => {
            let k_in = h * u64::from(*spatial_merge).pow(2);
            (k_in, k_in, k_in, d_llm)
        }
        // one linear layer (`mm_input_projection_weight`) after the pooling: no second GEMM
        EncoderKind::Siglip { .. } => (h, d_llm, 0, 0),
        // the first two layers of the chain ([`projector_gemms`] has them all)
        EncoderKind::TiledVit { projector, .. } | EncoderKind::OmniAudio { projector, .. } => {
            let w = |i: usize| projector.get(i).map_or(0, |&x| u64::from(x));
            (w(0), w(1), w(1), w(2))
        }
        EncoderKind::Whisper { stack, .. } => {
            let stacked = u64::from(*stack) * h;
            let mid =
                (e.projector_params as f64 / (stacked as f64 + d_llm as f64 / 2.0)).round() as u64;
            let mid = (mid.max(2) / 2) * 2;
            (stacked, mid, mid / 2, d_llm)
        }
    }
}

/// The projector's GEMMs `(k, n)` in order: [`projector_shapes`]' one or two
/// for the older families, every consecutive pair of widths of the chain for
/// [`EncoderKind::TiledVit`] and [`EncoderKind::OmniAudio`] (InternVL3-38B:
/// 12800 -> 5120 -> 5120; Llama 4: 5632 -> 4096 -> 4096 -> 5120).
pub fn projector_gemms(m: &ModelArch, e: &EncoderArch) -> Vec<(u64, u64)> {
    match &e.kind {
        EncoderKind::TiledVit { projector, .. } | EncoderKind::OmniAudio { projector, .. } => {
            projector
                .windows(2)
                .map(|w| (u64::from(w[0]), u64::from(w[1])))
                .collect()
        }
        _ => {
            let (k_in, n_mid, k_mid, n_out) = projector_shapes(m, e);
            let mut v = vec![(k_in, n_mid)];
            if k_mid > 0 {
                v.push((k_mid, n_out));
            }
            v
        }
    }
}

/// GEMM names of the projector's layers, in order.
const PROJECTOR_NAMES: [&str; 4] = [
    "projector_fc1",
    "projector_fc2",
    "projector_fc3",
    "projector_fc4",
];

/// Sequences of one Qwen window layer over `item`: windows of up to
/// `(window_px/patch)^2` patches within each attention span.
fn qwen_window(span: u64, window_tokens: u64) -> u64 {
    span.min(window_tokens).max(1)
}

/// One encoder attention op: `count` layers of `batch` sequences of `seq` tokens.
fn encoder_attn(e: &EncoderArch, batch: u64, seq: u64, count: u32) -> Op {
    Op::Attention {
        kind: AttnKind::Encoder,
        batch,
        seq,
        heads: e.heads,
        kv_heads: e.heads,
        head_dim: e.hidden / e.heads.max(1),
        count,
    }
}

/// The encoder kind's own ops: its patch embedding or convolutions, its
/// attention over each item's spans, and any pooling or pixel shuffle.
fn encoder_stem_ops(e: &EncoderArch, items: &[ItemTokens], tokens: u64, ops: &mut Vec<Op>) {
    let h = u64::from(e.hidden);
    let layers = e.layers;
    let attn = |batch: u64, seq: u64, count: u32| encoder_attn(e, batch, seq, count);
    match &e.kind {
        EncoderKind::ClipAnyres { patch, .. } => {
            let tiles: u64 = items
                .iter()
                .map(|i| i.encoder_tokens / i.attn_span.max(1))
                .sum();
            let span = items[0].attn_span.max(1);
            let patches = tiles * (span - 1);
            let p = u64::from(*patch);
            ops.push(gemm("patch_embed", patches, h, 3 * p * p, 1));
            ops.push(attn(tiles, span, layers));
        }
        EncoderKind::QwenVit {
            patch,
            temporal_patch,
            window_px,
            fullatt_every,
            ..
        } => {
            ops.extend(qwen_vit_stem_ops(
                e,
                items,
                tokens,
                *patch,
                *temporal_patch,
                *window_px,
                *fullatt_every,
            ));
        }
        EncoderKind::Siglip {
            patch, pooled_side, ..
        } => {
            let p = u64::from(*patch);
            let span = items[0].attn_span.max(1);
            ops.push(gemm("patch_embed", tokens, h, 3 * p * p, 1));
            ops.push(attn(tokens / span, span, layers));
            // average pooling of each crop's patches to pooled_side² tokens
            let pooled = (tokens / span) * u64::from(*pooled_side).pow(2);
            ops.push(Op::Memory {
                name: "avg_pool",
                bytes: (tokens + pooled) as f64 * h as f64 * f64::from(e.dtype_bytes),
                kernels: 1,
                count: 1,
            });
        }
        EncoderKind::TiledVit { patch, .. } => {
            let p = u64::from(*patch);
            let span = items[0].attn_span.max(1);
            let tiles = tokens / span;
            ops.push(gemm("patch_embed", tiles * (span - 1), h, 3 * p * p, 1));
            ops.push(attn(tiles, span, layers));
            // the class token dropped and the patches folded into
            // pixel_shuffle² wider tokens: a copy of the features
            ops.push(Op::Memory {
                name: "pixel_shuffle",
                bytes: 2.0 * (tiles * (span - 1)) as f64 * h as f64 * f64::from(e.dtype_bytes),
                kernels: 2,
                count: 1,
            });
        }
        EncoderKind::OmniAudio {
            mel_bins,
            chunk_frames,
            conv_channels,
            ..
        } => {
            ops.extend(omni_audio_stem_ops(
                e,
                items,
                tokens,
                *mel_bins,
                *chunk_frames,
                *conv_channels,
            ));
        }
        EncoderKind::Whisper { mel_bins, .. } => {
            ops.push(gemm("conv1", 2 * tokens, h, 3 * u64::from(*mel_bins), 1));
            ops.push(gemm("conv2", tokens, h, 3 * h, 1));
            let span = items[0].attn_span.max(1);
            ops.push(attn(tokens / span, span, layers));
        }
    }
}

/// Qwen-VL's stem: the patch embedding over all tokens, then per item its
/// full-attention blocks over whole spans and its window-attention blocks.
fn qwen_vit_stem_ops(
    e: &EncoderArch,
    items: &[ItemTokens],
    tokens: u64,
    patch: u32,
    temporal_patch: u32,
    window_px: u32,
    fullatt_every: u32,
) -> Vec<Op> {
    let mut ops = Vec::new();
    let h = u64::from(e.hidden);
    let layers = e.layers;
    let attn = |batch: u64, seq: u64, count: u32| encoder_attn(e, batch, seq, count);
    let p = u64::from(patch);
    ops.push(gemm(
        "patch_embed",
        tokens,
        h,
        3 * u64::from(temporal_patch) * p * p,
        1,
    ));
    let full = layers / fullatt_every.max(1);
    let side = u64::from(window_px / patch.max(1));
    let win = side * side;
    // items in a batch share the encoder call: group them by span
    for it in items {
        let span = it.attn_span.max(1);
        let slices = it.encoder_tokens / span;
        if full > 0 {
            ops.push(attn(slices, span, full));
        }
        if layers > full {
            let w = qwen_window(span, win);
            ops.push(attn(it.encoder_tokens.div_ceil(w), w, layers - full));
        }
    }
    ops
}

/// Qwen3-Omni audio's stem: three 3x3 stride-2 Conv2d layers over each
/// (mel, time) chunk as GEMMs (im2col), the linear layer per time step, then
/// one batched attention per window length.
fn omni_audio_stem_ops(
    e: &EncoderArch,
    items: &[ItemTokens],
    tokens: u64,
    mel_bins: u32,
    chunk_frames: u32,
    conv_channels: u32,
) -> Vec<Op> {
    let mut ops = Vec::new();
    let h = u64::from(e.hidden);
    let layers = e.layers;
    let attn = |batch: u64, seq: u64, count: u32| encoder_attn(e, batch, seq, count);
    // three 3x3 stride-2 Conv2d layers over each (mel, time) chunk
    // as GEMMs (im2col), then the linear layer per time step
    let c = u64::from(conv_channels);
    let (f1, t1) = (omni_conv_out(mel_bins), omni_conv_out(chunk_frames));
    let (f2, t2) = (omni_conv_out(f1), omni_conv_out(t1));
    let (f3, t3) = (omni_conv_out(f2), omni_conv_out(t2));
    // each item's audio is cut into its own chunks
    let chunks: u64 = items
        .iter()
        .map(|it| it.encoder_tokens.div_ceil(u64::from(t3.max(1))))
        .sum();
    let pos = |f: u32, t: u32| chunks * u64::from(f) * u64::from(t);
    ops.push(gemm("conv2d1", pos(f1, t1), c, 9, 1));
    ops.push(gemm("conv2d2", pos(f2, t2), c, 9 * c, 1));
    ops.push(gemm("conv2d3", pos(f3, t3), c, 9 * c, 1));
    ops.push(gemm("conv_out", tokens, h, c * u64::from(f3), 1));
    // each item's whole windows and its shorter last window, one
    // batched attention per window length over the pass
    let mut windows = std::collections::BTreeMap::<u64, u64>::new();
    for it in items {
        let span = it.attn_span.max(1);
        let (whole, rest) = (it.encoder_tokens / span, it.encoder_tokens % span);
        if whole > 0 {
            *windows.entry(span).or_default() += whole;
        }
        if rest > 0 {
            *windows.entry(rest).or_default() += 1;
        }
    }
    for (span, count) in windows {
        ops.push(attn(count, span, layers));
    }
    ops
}

impl ModelArch {
    /// The kernels of one encoder pass over a micro-batch of `items` on one GPU
    /// (TP 1): stem, `layers` transformer blocks, projector
    /// ([`ModelArch::encode_ops_tp`] at TP 1).
    ///
    /// Per family:
    /// * CLIP anyres: each tile is a sequence of `attn_span` tokens (576 patches +
    ///   CLS); the stem is the patch conv as a GEMM `[patches, 3*p*p] x [3*p*p, hidden]`;
    ///   the projector runs over [`ModelArch::projector_rows`] (CLS dropped).
    /// * Qwen ViT: `layers/fullatt_every` full-attention blocks over each temporal
    ///   slice (`attn_span` patches) and window blocks over windows of
    ///   `(window_px/patch)^2` patches; the stem is the 3-D patch conv
    ///   `[patches, 3*tp*p*p]`; the merger runs over `llm_tokens` rows.
    /// * Tiled ViT (InternViT, Llama 4): each tile a sequence of `attn_span` tokens
    ///   (patches + class token), the patch conv as a GEMM over the patches, the
    ///   pixel shuffle as a copy, the projector chain over `llm_tokens` rows.
    /// * Qwen3-Omni audio: the three Conv2d layers as im2col GEMMs per 100-frame
    ///   chunk and the linear layer per time step, the blocks over windows of
    ///   `attn_span` tokens, the projector chain over `llm_tokens` rows.
    /// * Whisper: conv1 (`mel -> hidden`, kernel 3) at twice the frame rate and conv2
    ///   (`hidden -> hidden`, kernel 3, stride 2) as GEMMs, then the blocks over
    ///   30-s windows of `attn_span` frames; the stacking projector over `llm_tokens` rows.
    ///
    /// Empty when there is no encoder or no item.
    pub fn encode_ops(&self, items: &[ItemTokens]) -> Vec<Op> {
        self.encode_ops_tp(items, 1)
    }

    /// The kernels of one rank of an encoder pass over `items` at TP `tp`
    /// (Megatron-style, as the executor splits the LLaVA-NeXT CLIP tower,
    /// [`crate::EncoderArch::executor_tp`]): each block's QKV and MLP-up
    /// GEMMs split by columns (`n / tp`), its output and MLP-down GEMMs by
    /// rows (`k / tp`), attention over `heads / tp` heads, the FFN-width
    /// activations split; stem and projector whole on every rank; plus
    /// [`ModelArch::encode_allreduce`]. `tp` ≤ 1 is the pass on one GPU.
    pub fn encode_ops_tp(&self, items: &[ItemTokens], tp: u32) -> Vec<Op> {
        let Some(e) = self.encoder.as_ref() else {
            return Vec::new();
        };
        let tokens: u64 = items.iter().map(|i| i.encoder_tokens).sum();
        if items.is_empty() || tokens == 0 {
            return Vec::new();
        }
        let h = u64::from(e.hidden);
        let layers = e.layers;
        let rows: u64 = items.iter().map(|i| self.projector_rows(i)).sum();
        let tp = tp.max(1);
        let k = u64::from(tp);
        let mut ops = Vec::with_capacity(13);
        encoder_stem_ops(e, items, tokens, &mut ops);
        if tp > 1 {
            // the stem's attention ops are the blocks': heads split
            for op in &mut ops {
                if let Op::Attention {
                    heads, kv_heads, ..
                } = op
                {
                    *heads = heads.div_ceil(tp);
                    *kv_heads = kv_heads.div_ceil(tp);
                }
            }
        }
        let ffn = u64::from(e.ffn).div_ceil(k);
        let up = if e.gated_mlp { 2 * ffn } else { ffn };
        ops.push(gemm("qkv", tokens, (3 * h).div_ceil(k), h, layers));
        ops.push(gemm("o", tokens, h, h.div_ceil(k), layers));
        ops.push(gemm("mlp_up", tokens, up, h, layers));
        ops.push(gemm("mlp_down", tokens, h, ffn, layers));
        ops.extend(self.encode_allreduce(items, tp));
        ops.push(Op::Memory {
            name: "norm_act_residual",
            bytes: tokens as f64 * e.act_bytes_per_token_layer_tp(tp),
            kernels: 4,
            count: layers,
        });
        if rows > 0 {
            // the merger, and one merger of the same shape per deepstack tap
            let mergers = self.embedding_sets();
            for (i, (k, n)) in projector_gemms(self, e).into_iter().enumerate() {
                let name = PROJECTOR_NAMES[i.min(PROJECTOR_NAMES.len() - 1)];
                ops.push(gemm(name, rows, n, k, mergers));
            }
        }
        ops
    }

    /// The all-reduces of one encoder pass over `items` at TP `tp`: two per
    /// block (after the attention output and the MLP down projection, the
    /// row-parallel GEMMs) of `tokens × hidden` elements, as the LLM's
    /// layers at TP > 1 ([`Op::AllReduce`]); `None` at TP ≤ 1 or without an
    /// encoder or tokens.
    pub fn encode_allreduce(&self, items: &[ItemTokens], tp: u32) -> Option<Op> {
        let e = self.encoder.as_ref()?;
        let tokens: u64 = items.iter().map(|i| i.encoder_tokens).sum();
        (tp > 1 && tokens > 0).then(|| Op::AllReduce {
            elements: tokens * u64::from(e.hidden),
            tp,
            count: 2 * e.layers,
        })
    }

    /// Query and KV heads per rank at TP `tp` (KV heads replicated once `tp` exceeds them).
    pub fn heads_per_rank(&self, tp: u32) -> (u32, u32) {
        let tp = tp.max(1);
        (
            self.llm.heads.div_ceil(tp).max(1),
            self.llm.kv_heads.div_ceil(tp).max(1),
        )
    }

    /// The LLM layers' kernels for `tokens` rows of the whole worker at
    /// `par`, without attention: each attention replica's share of the rows
    /// through the attention projections and dense MLPs, all rows through the
    /// MoE layers (gathered from the replicas before, scattered back after).
    fn llm_layer_ops(&self, tokens: u64, par: Parallel, ops: &mut Vec<Op>) {
        let l = &self.llm;
        let tp = par.tp;
        let rows = tokens.div_ceil(u64::from(par.ep));
        let (qh, kvh) = self.heads_per_rank(tp);
        let h = u64::from(l.hidden);
        let hd = u64::from(l.head_dim);
        let ffn = u64::from(l.ffn).div_ceil(u64::from(tp));
        let (dense, moe_layers) = l.layer_split();
        ops.push(gemm("qkv", rows, u64::from(qh + 2 * kvh) * hd, h, l.layers));
        ops.push(gemm("o", rows, h, u64::from(qh) * hd, l.layers));
        if dense > 0 {
            ops.push(gemm("mlp_up", rows, 2 * ffn, h, dense));
            ops.push(gemm("mlp_down", rows, h, ffn, dense));
        }
        if let (Some(m), true) = (&l.moe, moe_layers > 0) {
            // the router is replicated on every rank; the routed experts'
            // width is split over the TP ranks and the experts over the EP
            // groups; shared experts split like a dense MLP
            ops.push(gemm("router", rows, u64::from(m.router), h, moe_layers));
            ops.push(Op::Moe {
                tokens,
                hidden: l.hidden,
                inter: m.expert_ffn,
                top_k: m.top_k,
                experts: m.experts,
                moe_tp: tp,
                moe_ep: par.ep,
                routing: m.routing,
                count: moe_layers,
            });
            if m.shared_experts > 0 {
                let shared =
                    (u64::from(m.shared_ffn) * u64::from(m.shared_experts)).div_ceil(u64::from(tp));
                ops.push(gemm("shared_up", rows, 2 * shared, h, moe_layers));
                ops.push(gemm("shared_down", rows, h, shared, moe_layers));
            }
            if par.ep > 1 {
                for kind in [CollectiveKind::AllGather, CollectiveKind::ReduceScatter] {
                    ops.push(Op::Collective {
                        kind,
                        elements: tokens * h,
                        gpus: par.gpus(),
                        count: moe_layers,
                    });
                }
            }
        }
        if tp > 1 {
            ops.push(Op::AllReduce {
                elements: rows * h,
                tp,
                count: 2 * l.layers,
            });
        }
        ops.push(Op::Memory {
            name: "norm_act_residual",
            bytes: rows as f64 * self.llm_act_bytes_per_token_layer() / f64::from(tp),
            kernels: 4,
            count: l.layers,
        });
    }

    /// The kernels of one prefill batch of sequences with these prompt lengths at
    /// `par` (a TP degree, or [`Parallel`]): the layers over all `Σ seq_lens`
    /// tokens, causal attention over the sequences (at their RMS length), and
    /// the LM head over the last token of each. Empty for an empty batch.
    pub fn prefill_ops(&self, seq_lens: &[u64], par: impl Into<Parallel>) -> Vec<Op> {
        match PrefillShape::of(seq_lens) {
            Some(shape) => self.prefill_shape_ops(shape, par),
            None => Vec::new(),
        }
    }

    /// [`ModelArch::prefill_ops`] of a batch with this shape (everything the
    /// kernels of a prefill batch depend on): the layers' ops at `m = tokens`,
    /// then the context attention, then the LM head, in that order. With
    /// `EPe`, each attention replica takes `⌈sequences/e⌉` of the sequences.
    pub fn prefill_shape_ops(&self, shape: PrefillShape, par: impl Into<Parallel>) -> Vec<Op> {
        let par = par.into();
        let mut ops = Vec::with_capacity(10);
        self.llm_layer_ops(shape.tokens, par, &mut ops);
        let (qh, kvh) = self.heads_per_rank(par.tp);
        let seqs = shape.sequences.div_ceil(u64::from(par.ep));
        ops.push(Op::Attention {
            kind: AttnKind::Context,
            batch: seqs,
            seq: shape.rms_len,
            heads: qh,
            kv_heads: kvh,
            head_dim: self.llm.head_dim,
            count: self.llm.layers,
        });
        ops.push(self.lm_head(seqs, par.tp));
        ops
    }

    /// The kernels of one decode iteration of `batch` sequences holding
    /// `total_context_tokens`, at `par`: the layers at `m = batch`, generation
    /// attention at the mean context, the LM head. Empty for `batch == 0`.
    pub fn decode_ops(
        &self,
        batch: u64,
        total_context_tokens: u64,
        par: impl Into<Parallel>,
    ) -> Vec<Op> {
        if batch == 0 {
            return Vec::new();
        }
        let par = par.into();
        let mut ops = Vec::with_capacity(10);
        self.llm_layer_ops(batch, par, &mut ops);
        ops.push(self.decode_attention(batch, total_context_tokens, par));
        ops.push(self.lm_head(batch.div_ceil(u64::from(par.ep)), par.tp));
        ops
    }

    /// The one op of [`ModelArch::decode_ops`] that depends on the context:
    /// generation attention of `batch` sequences at their mean context
    /// `⌈total_context_tokens / batch⌉`, every layer (with `EPe`, over one
    /// replica's `⌈batch/e⌉` sequences). The ops before it in the list depend
    /// only on `(batch, par)`, the last (the LM head) too.
    pub fn decode_attention(
        &self,
        batch: u64,
        total_context_tokens: u64,
        par: impl Into<Parallel>,
    ) -> Op {
        let par = par.into();
        let (qh, kvh) = self.heads_per_rank(par.tp);
        Op::Attention {
            kind: AttnKind::Generation,
            batch: batch.div_ceil(u64::from(par.ep)),
            seq: decode_mean_context(batch, total_context_tokens),
            heads: qh,
            kv_heads: kvh,
            head_dim: self.llm.head_dim,
            count: self.llm.layers,
        }
    }

    fn lm_head(&self, rows: u64, tp: u32) -> Op {
        gemm(
            "lm_head",
            rows,
            u64::from(self.llm.vocab).div_ceil(u64::from(tp.max(1))),
            u64::from(self.llm.hidden),
            1,
        )
    }
}

/// The mean context per sequence that [`ModelArch::decode_attention`] prices a
/// decode iteration at: `⌈total_context_tokens / batch⌉`, at least 1.
pub fn decode_mean_context(batch: u64, total_context_tokens: u64) -> u64 {
    total_context_tokens.div_ceil(batch.max(1)).max(1)
}

/// What a prefill batch's kernels depend on ([`ModelArch::prefill_shape_ops`]):
/// its tokens, its non-empty sequences and the root mean square of the
/// sequence lengths (the one context-attention op's length, rounded, ≥ 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PrefillShape {
    /// Prompt tokens in the batch.
    pub tokens: u64,
    /// Sequences with at least one token.
    pub sequences: u64,
    /// `round(sqrt(Σ len² / sequences))`, at least 1.
    pub rms_len: u64,
}

impl PrefillShape {
    /// The shape of a batch of sequences of these lengths; `None` when it has
    /// no tokens.
    pub fn of(seq_lens: &[u64]) -> Option<PrefillShape> {
        let sq: f64 = seq_lens.iter().map(|&l| (l as f64).powi(2)).sum();
        PrefillShape::with_square_sum(seq_lens, sq)
    }

    /// The shape of a batch of sequences of `seq_lens` new tokens whose
    /// attention does the work of `sq` squared lengths in all; `None`
    /// without tokens.
    fn with_square_sum(seq_lens: &[u64], sq: f64) -> Option<PrefillShape> {
        let tokens: u64 = seq_lens.iter().sum();
        if tokens == 0 {
            return None;
        }
        let sequences = seq_lens.iter().filter(|&&l| l > 0).count() as u64;
        let rms_len = (sq / sequences as f64).sqrt().round().max(1.0) as u64;
        Some(PrefillShape {
            tokens,
            sequences,
            rms_len,
        })
    }

    /// The shape of a batch whose sequence `i` computes its last `new[i]`
    /// tokens after `cached[i]` tokens found in a prefix cache: the layers
    /// run over the new tokens only, and the context attention of the new
    /// queries over the whole context `L = cached + new` does the causal
    /// work of `(L² − cached²)/2` query–key pairs, which the one
    /// context-attention op prices at the length `√(L² − cached²)` (the
    /// square root of the mean over sequences). Equal to
    /// [`PrefillShape::of`]`(new)` when nothing is cached; `None` when no
    /// token is new.
    pub fn with_cache(new: &[u64], cached: &[u64]) -> Option<PrefillShape> {
        let sq: f64 = new
            .iter()
            .enumerate()
            .filter(|(_, &n)| n > 0)
            .map(|(i, &n)| {
                let c = cached.get(i).copied().unwrap_or(0);
                ((n + c) as f64).powi(2) - (c as f64).powi(2)
            })
            .sum();
        PrefillShape::with_square_sum(new, sq)
    }
}

fn gemm(name: &'static str, m: u64, n: u64, k: u64, count: u32) -> Op {
    Op::Gemm {
        name,
        m,
        n,
        k,
        count,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_prefix_keeps_the_new_tokens_and_the_attention_over_the_whole_context() {
        let new = [100, 300];
        assert_eq!(
            PrefillShape::with_cache(&new, &[0, 0]),
            PrefillShape::of(&new)
        );
        let s = PrefillShape::with_cache(&new, &[900, 0]).unwrap();
        assert_eq!((s.tokens, s.sequences), (400, 2));
        // (1000² − 900² + 300²) / 2 query–key pairs per sequence, on average
        let want = ((1000f64.powi(2) - 900f64.powi(2) + 300f64.powi(2)) / 2.0).sqrt();
        assert_eq!(s.rms_len, want.round() as u64);
        assert_eq!(PrefillShape::with_cache(&[0], &[64]), None);
    }

    fn m(name: &str) -> ModelArch {
        ModelArch::preset(name).unwrap()
    }

    fn gemm_macs(ops: &[Op]) -> f64 {
        ops.iter()
            .map(|o| match *o {
                Op::Gemm { .. } => o.flops() / 2.0,
                _ => 0.0,
            })
            .sum()
    }

    #[test]
    fn bytes_count_operands_once() {
        let g = gemm("x", 4, 8, 16, 3);
        assert_eq!(
            g.bytes(2.0),
            2.0 * (4.0 * 16.0 + 16.0 * 8.0 + 4.0 * 8.0) * 3.0
        );
        let dec = Op::Attention {
            kind: AttnKind::Generation,
            batch: 2,
            seq: 100,
            heads: 8,
            kv_heads: 2,
            head_dim: 64,
            count: 1,
        };
        // the KV cache dominates: 2 sequences x 2 KV heads x 100 tokens x (K + V)
        assert_eq!(dec.bytes(2.0), 2.0 * 2.0 * (16.0 + 400.0) * 64.0);
        assert_eq!(
            Op::AllReduce {
                elements: 10,
                tp: 2,
                count: 1
            }
            .bytes(2.0),
            0.0
        );
    }

    #[test]
    fn projector_shapes_match_the_parameter_counts() {
        // the real-size presets; the tiny ones' `projector_params` are nominal
        for name in ["llava-v1.6-34b", "qwen2.5-vl-32b", "ultravox-v0.6-27b"] {
            let a = m(name);
            let Some(e) = a.encoder.as_ref() else {
                continue;
            };
            let (k_in, n_mid, k_mid, n_out) = projector_shapes(&a, e);
            let p = (k_in * n_mid + k_mid * n_out) as f64;
            let want = e.projector_params as f64;
            assert!((p - want).abs() <= 1e-3 * want, "{name}: {p} vs {want}");
        }
    }

    /// The GEMMs of every encoder family multiply-accumulate exactly what
    /// `encode_work` counts as linear work (stem + blocks + projector).
    #[test]
    fn encoder_gemms_match_the_work_accounting() {
        let cases = [
            (
                "llava-v1.6-34b",
                m("llava-v1.6-34b").image_tokens(672, 672).unwrap(),
            ),
            (
                "qwen2.5-vl-32b",
                m("qwen2.5-vl-32b").video_tokens(16, 448, 448).unwrap(),
            ),
            (
                "ultravox-v0.6-27b",
                m("ultravox-v0.6-27b").audio_tokens(12.0).unwrap(),
            ),
        ];
        for (name, item) in cases {
            let a = m(name);
            let e = a.encoder.as_ref().unwrap();
            let ops = a.encode_ops(&[item, item]);
            let n = 2.0 * item.encoder_tokens as f64;
            let blocks = f64::from(e.layers) * e.layer_params() * n;
            let stem = e.stem_macs_per_token() * n;
            let proj = 2.0 * a.projector_rows(&item) as f64 * e.projector_params as f64;
            let want = blocks + stem + proj;
            let got = gemm_macs(&ops);
            // CLIP's stem skips the CLS token of each tile (1 in 577)
            assert!((got - want).abs() < 3e-3 * want, "{name}: {got} vs {want}");
        }
    }

    /// At TP 2 the LLaVA-NeXT CLIP tower's blocks run half their GEMM work
    /// per rank, by the split shapes (QKV and MLP-up by columns, out and
    /// down by rows), attention over half the heads, the stem and projector
    /// whole, plus two all-reduces of `tokens × hidden` per block.
    #[test]
    fn an_encoder_at_tp2_splits_its_blocks_and_all_reduces_twice_per_block() {
        let a = m("llava-v1.6-34b");
        let e = a.encoder.as_ref().unwrap();
        let item = a.image_tokens(672, 672).unwrap();
        let items = [item; 4];
        let (one, two) = (a.encode_ops(&items), a.encode_ops_tp(&items, 2));
        let tokens = 4 * item.encoder_tokens;
        let h = u64::from(e.hidden);
        let shape = |ops: &[Op], want: &str| {
            ops.iter()
                .find_map(|o| match *o {
                    Op::Gemm { name, m, n, k, .. } if name == want => Some((m, n, k)),
                    _ => None,
                })
                .unwrap()
        };
        let f = u64::from(e.ffn);
        assert_eq!(shape(&two, "qkv"), (tokens, 3 * h / 2, h));
        assert_eq!(shape(&two, "o"), (tokens, h, h / 2));
        assert_eq!(shape(&two, "mlp_up"), (tokens, f / 2, h));
        assert_eq!(shape(&two, "mlp_down"), (tokens, h, f / 2));
        for name in ["patch_embed", "projector_fc1"] {
            assert_eq!(shape(&two, name), shape(&one, name), "{name}");
        }
        // the blocks' MACs halve; the stem's and projector's stay
        let blocks = f64::from(e.layers) * e.layer_params() * tokens as f64;
        let (m1, m2) = (gemm_macs(&one), gemm_macs(&two));
        assert!(
            (m1 - m2 - blocks / 2.0).abs() < 1e-9 * m1,
            "{m1} {m2} {blocks}"
        );
        let heads = |ops: &[Op]| {
            ops.iter()
                .find_map(|o| match *o {
                    Op::Attention { heads, .. } => Some(heads),
                    _ => None,
                })
                .unwrap()
        };
        assert_eq!(heads(&two) * 2, heads(&one));
        let ar: Vec<_> = two
            .iter()
            .filter(|o| matches!(o, Op::AllReduce { .. }))
            .collect();
        assert_eq!(
            ar,
            [&Op::AllReduce {
                elements: tokens * h,
                tp: 2,
                count: 2 * e.layers
            }]
        );
        assert!(!one.iter().any(|o| matches!(o, Op::AllReduce { .. })));
        // the work of one rank agrees: blocks' FLOPs and weights halved
        let (w1, w2) = (a.encode_work(&items), a.encode_work_tp(&items, 2));
        let weights = f64::from(e.layers) * e.layer_params() * f64::from(e.dtype_bytes);
        assert!((w1.bytes - w2.bytes - weights / 2.0) > 0.0);
        let attn = 4.0 * (h * tokens * item.attn_span) as f64 * f64::from(e.layers);
        let halved = (2.0 * blocks + attn) / 2.0;
        assert!((w1.flops - w2.flops - halved).abs() < 1e-9 * w1.flops);
    }

    #[test]
    fn clip_tiles_are_sequences_of_577() {
        let a = m("llava-v1.6-34b");
        let item = a.image_tokens(672, 672).unwrap();
        let ops = a.encode_ops(&[item]);
        let att = ops
            .iter()
            .find(|o| matches!(o, Op::Attention { .. }))
            .unwrap();
        assert_eq!(
            *att,
            Op::Attention {
                kind: AttnKind::Encoder,
                batch: 5,
                seq: 577,
                heads: 16,
                kv_heads: 16,
                head_dim: 64,
                count: a.encoder.as_ref().unwrap().layers,
            }
        );
    }

    #[test]
    fn qwen_has_full_and_window_attention() {
        let a = m("qwen2.5-vl-32b");
        let item = a.image_tokens(448, 448).unwrap(); // 32x32 patches
        let ops = a.encode_ops(&[item]);
        let att: Vec<_> = ops
            .iter()
            .filter_map(|o| match *o {
                Op::Attention {
                    batch, seq, count, ..
                } => Some((batch, seq, count)),
                _ => None,
            })
            .collect();
        assert_eq!(att, vec![(1, 1024, 4), (16, 64, 28)]);
    }

    #[test]
    fn llm_ops_split_over_tp_and_match_prefill_work() {
        let a = m("llava-v1.6-34b");
        let ops = a.prefill_ops(&[3000], 1);
        let layers = f64::from(a.llm.layers);
        let want = layers * a.llm.layer_params() * 3000.0 + a.llm.vocab_matrix_params();
        assert!((gemm_macs(&ops) - want).abs() < 1e-9 * want);
        let t2 = a.prefill_ops(&[3000], 2);
        let ratio = gemm_macs(&t2) / gemm_macs(&ops);
        assert!((ratio - 0.5).abs() < 0.01, "{ratio}");
        assert!(t2.iter().any(|o| matches!(
            o,
            Op::AllReduce {
                tp: 2,
                count: 120,
                ..
            }
        )));
        assert!(!ops.iter().any(|o| matches!(o, Op::AllReduce { .. })));
        // 56 heads, 8 KV heads: TP 16 replicates KV heads
        assert_eq!(a.heads_per_rank(16), (4, 1));
        assert!(a.prefill_ops(&[], 2).is_empty());
        assert!(a.decode_ops(0, 0, 2).is_empty());
    }

    #[test]
    fn prefill_attention_keeps_the_quadratic_work() {
        let a = m("qwen2.5-vl-32b");
        let ops = a.prefill_ops(&[1000, 3000], 1);
        let flops: f64 = ops
            .iter()
            .filter(|o| matches!(o, Op::Attention { .. }))
            .map(Op::flops)
            .sum();
        let want = 4.0 * f64::from(a.llm.layers) * a.llm.q_width() * (1e6 + 9e6) / 2.0;
        assert!((flops - want).abs() < 1e-3 * want, "{flops} vs {want}");
    }

    #[test]
    fn decode_attention_is_at_the_mean_context() {
        let a = m("qwen2.5-vl-32b");
        let ops = a.decode_ops(8, 8 * 1000, 4);
        assert!(ops.iter().any(|o| matches!(
            o,
            Op::Attention {
                kind: AttnKind::Generation,
                batch: 8,
                seq: 1000,
                heads: 10,
                kv_heads: 2,
                ..
            }
        )));
    }

    fn moe_macs(ops: &[Op]) -> f64 {
        ops.iter()
            .map(|o| match *o {
                Op::Moe { .. } => o.flops() / 2.0,
                _ => 0.0,
            })
            .sum()
    }

    /// An MoE model's layers multiply-accumulate its active parameters per
    /// token: attention, router and top-k experts (balanced, TP 1).
    #[test]
    fn moe_layers_compute_the_active_parameters() {
        let a = m("qwen3-vl-30b-a3b");
        let ops = a.prefill_ops(&[4096], 1);
        assert!(ops.iter().any(|o| matches!(
            o,
            Op::Moe {
                tokens: 4096,
                hidden: 2048,
                inter: 768,
                top_k: 8,
                experts: 128,
                moe_tp: 1,
                moe_ep: 1,
                count: 48,
                ..
            }
        )));
        assert!(!ops
            .iter()
            .any(|o| matches!(o, Op::Gemm { name: "mlp_up", .. })));
        let got = gemm_macs(&ops) + moe_macs(&ops);
        let want = a.llm.active_body_params() * 4096.0 + a.llm.vocab_matrix_params();
        assert!((got - want).abs() < 1e-9 * want, "{got} vs {want}");
        // at TP 2 each rank computes half the experts' width
        let t2 = a.prefill_ops(&[4096], 2);
        assert!((moe_macs(&t2) / moe_macs(&ops) - 0.5).abs() < 1e-9);
    }

    /// A decode step of a few tokens reads only the experts they are routed
    /// to; a large prefill reads them all.
    #[test]
    fn moe_bytes_follow_the_touched_experts() {
        let a = m("qwen3-vl-30b-a3b");
        let moe = |ops: Vec<Op>| {
            ops.into_iter()
                .find(|o| matches!(o, Op::Moe { .. }))
                .unwrap()
        };
        let one = moe(a.decode_ops(1, 1000, 1));
        let (pairs, touched, inter) = one.moe_rank_shape();
        assert_eq!((pairs, touched, inter), (8.0, 8.0, 768.0));
        let big = moe(a.prefill_ops(&[8192], 1));
        assert_eq!(big.moe_rank_shape().1, 128.0);
        let expert_bytes = 2.0 * 3.0 * 2048.0 * 768.0 * 48.0;
        assert!(one.bytes(2.0) > 8.0 * expert_bytes && one.bytes(2.0) < 8.1 * expert_bytes);
        // power-law routing concentrates the pairs: the busiest rank does more
        let mut skew = big;
        if let Op::Moe {
            routing, moe_ep, ..
        } = &mut skew
        {
            *routing = MoeRouting::PowerLaw12;
            *moe_ep = 8;
        }
        let mut even = big;
        if let Op::Moe { moe_ep, .. } = &mut even {
            *moe_ep = 8;
        }
        assert_eq!(even.moe_rank_shape().0, 8192.0 * 8.0 / 8.0);
        assert!(skew.moe_rank_shape().0 > even.moe_rank_shape().0);
    }

    /// Qwen3-VL's mergers: the final one and one per deepstack tap, each of
    /// the Qwen merger's shape, together `projector_params`.
    #[test]
    fn qwen3_vl_runs_a_merger_per_deepstack_tap() {
        let a = m("qwen3-vl-30b-a3b");
        let e = a.encoder.as_ref().unwrap();
        assert_eq!(a.embedding_sets(), 4);
        let (k_in, n_mid, k_mid, n_out) = projector_shapes(&a, e);
        assert_eq!((k_in, n_mid, k_mid, n_out), (4608, 4608, 4608, 2048));
        let p = 4 * (k_in * n_mid + k_mid * n_out);
        assert_eq!(p, e.projector_params);
        let item = a.image_tokens(448, 448).unwrap();
        let ops = a.encode_ops(&[item]);
        assert!(ops.contains(&gemm("projector_fc1", 196, 4608, 4608, 4)));
        // every block attends fully over the 784 patches; no window layers
        let att: Vec<_> = ops
            .iter()
            .filter_map(|o| match *o {
                Op::Attention {
                    batch, seq, count, ..
                } => Some((batch, seq, count)),
                _ => None,
            })
            .collect();
        assert_eq!(att, vec![(1, 784, 27)]);
        // the LLM receives four feature sets per image token
        assert_eq!(a.embedding_bytes_per_token(), 4.0 * 2048.0 * 2.0);
        assert_eq!(a.allreduce_bytes_per_layer(1), 2048.0 * 2.0);
    }

    /// Gemma 3's SigLIP: one full-attention sequence of 4096 patches per image
    /// or crop, average pooling, one projection GEMM over the 256 pooled
    /// tokens; the GEMMs multiply-accumulate the stem, the blocks and the
    /// projector.
    #[test]
    fn siglip_encodes_each_crop_and_projects_pooled_tokens() {
        let a = m("gemma-3-27b");
        let e = a.encoder.as_ref().unwrap();
        let item = a.image_tokens(1080, 1920).unwrap();
        let ops = a.encode_ops(&[item, item]);
        assert!(ops.contains(&Op::Attention {
            kind: AttnKind::Encoder,
            batch: 2,
            seq: 4096,
            heads: 16,
            kv_heads: 16,
            head_dim: 72,
            count: 27,
        }));
        assert!(ops.contains(&gemm("projector_fc1", 512, 5376, 1152, 1)));
        assert!(!ops.iter().any(|o| matches!(
            o,
            Op::Gemm {
                name: "projector_fc2",
                ..
            }
        )));
        assert!(ops.iter().any(|o| matches!(
            o,
            Op::Memory {
                name: "avg_pool",
                ..
            }
        )));
        let n = 2.0 * 4096.0;
        let want = f64::from(e.layers) * e.layer_params() * n
            + e.stem_macs_per_token() * n
            + 512.0 * e.projector_params as f64;
        let got = gemm_macs(&ops);
        assert!((got - want).abs() < 1e-9 * want, "{got} vs {want}");
    }

    /// InternVL3-38B: 13 tiles of 1025 tokens for a 1024x768 image, each
    /// attending within itself; the patch conv over the patches only; the
    /// projector's two layers over the 3328 shuffled tokens.
    #[test]
    fn internvit_encodes_tiles_and_projects_shuffled_tokens() {
        let a = m("internvl3-38b");
        let e = a.encoder.as_ref().unwrap();
        let item = a.image_tokens(768, 1024).unwrap();
        let ops = a.encode_ops(&[item]);
        assert!(ops.contains(&Op::Attention {
            kind: AttnKind::Encoder,
            batch: 13,
            seq: 1025,
            heads: 25,
            kv_heads: 25,
            head_dim: 128,
            count: 45,
        }));
        assert!(ops.contains(&gemm("patch_embed", 13 * 1024, 3200, 3 * 14 * 14, 1)));
        assert!(ops.contains(&gemm("projector_fc1", 3328, 5120, 12800, 1)));
        assert!(ops.contains(&gemm("projector_fc2", 3328, 5120, 5120, 1)));
        let p: u64 = projector_gemms(&a, e).iter().map(|(k, n)| k * n).sum();
        assert_eq!(p, e.projector_params);
    }

    /// Llama 4's projector is three linear layers (vision adapter fc1, fc2,
    /// multi-modal projector), 60,817,408 weights in all.
    #[test]
    fn llama4_projects_through_three_layers() {
        let a = m("llama-4-scout-17b-16e");
        let e = a.encoder.as_ref().unwrap();
        assert_eq!(
            projector_gemms(&a, e),
            vec![(5632, 4096), (4096, 4096), (4096, 5120)]
        );
        let item = a.image_tokens(336, 336).unwrap();
        let ops = a.encode_ops(&[item]);
        assert!(ops.contains(&gemm("projector_fc3", 144, 5120, 4096, 1)));
        assert_eq!(e.projector_params, 60_817_408);
    }

    /// Qwen3-Omni audio: 10 s = 1000 mel frames = 10 chunks; the Conv2d
    /// layers as GEMMs over (64x50, 32x25, 16x13) positions per chunk; 130
    /// tokens in one window of 104 and one of 26.
    #[test]
    fn omni_audio_runs_its_conv_front_end_and_windows() {
        let a = m("qwen3-omni-30b-a3b");
        let item = a.audio_tokens(10.0).unwrap();
        assert_eq!((item.encoder_tokens, item.attn_span), (130, 104));
        let ops = a.encode_ops(&[item]);
        assert!(ops.contains(&gemm("conv2d1", 10 * 64 * 50, 480, 9, 1)));
        assert!(ops.contains(&gemm("conv2d2", 10 * 32 * 25, 480, 9 * 480, 1)));
        assert!(ops.contains(&gemm("conv2d3", 10 * 16 * 13, 480, 9 * 480, 1)));
        assert!(ops.contains(&gemm("conv_out", 130, 1280, 480 * 16, 1)));
        let att: Vec<_> = ops
            .iter()
            .filter_map(|o| match *o {
                Op::Attention { batch, seq, .. } => Some((batch, seq)),
                _ => None,
            })
            .collect();
        assert_eq!(att, vec![(1, 26), (1, 104)]);
        // the GEMMs multiply-accumulate what the stem's MACs per token say
        let e = a.encoder.as_ref().unwrap();
        let stem: f64 = ops
            .iter()
            .filter_map(|o| match *o {
                Op::Gemm { name, m, n, k, .. } if name.starts_with("conv") => {
                    Some((m * n * k) as f64)
                }
                _ => None,
            })
            .sum();
        assert!(
            (stem - e.stem_macs_per_token() * 130.0).abs() < 1e-6 * stem,
            "{stem}"
        );
        // two 1.1 s clips: 15 tokens each (one whole chunk, one of 10 frames),
        // so two chunks each (four in the pass, not ceil(30 / 13) = 3), and one
        // attention over both clips' 15-token windows
        let short = a.audio_tokens(1.1).unwrap();
        assert_eq!(short.encoder_tokens, 15);
        let ops = a.encode_ops(&[short, short]);
        assert!(ops.contains(&gemm("conv2d1", 4 * 64 * 50, 480, 9, 1)));
        let att: Vec<_> = ops
            .iter()
            .filter_map(|o| match *o {
                Op::Attention { batch, seq, .. } => Some((batch, seq)),
                _ => None,
            })
            .collect();
        assert_eq!(att, vec![(2, 15)]);
    }
}
