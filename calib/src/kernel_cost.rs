//! Stage costs composed from measured kernels: the default cost source on GPUs
//! with aiconfigurator tables.
//!
//! Every stage is its model's operator list ([`easerve_model::ops`]) priced kernel
//! by kernel from [`KernelTables`]:
//!
//! * GEMMs from the GEMM table at `(m, n, k)`; attention from the encoder, context
//!   or generation table at the op's `(head_dim, kv_heads, heads, batch, seq)`;
//!   all-reduce from vLLM's custom all-reduce table (CUDA-graph backend for decode,
//!   eager for prefill and encode); elementwise work as
//!   `bytes / (mem_bw · mem_bw_empirical_scaling_factor) + kernels · mem_empirical_constant_latency`
//!   with the figures of the GPU's aiconfigurator YAML.
//! * **SM share.** A kernel on a fraction `f` of the SMs runs its CTAs (GEMM output
//!   tiles of [`GEMM_TILE`]², flash-attention blocks of [`ATTN_BLOCK`] query rows per
//!   sequence and head) in `⌈ctas / ⌊f·SMs⌋⌉` waves instead of `⌈ctas / SMs⌉`; its
//!   time scales by that ratio. A kernel with fewer CTAs than the share's SMs does not
//!   slow down at all, so small batches stop gaining at a low share while large ones
//!   keep scaling (the paper's Fig. 7). Elementwise and all-reduce kernels are not
//!   re-timed (HBM and the links are not partitioned).
//! * **Encode pass** = the serving system's framework terms + measured preprocessing
//!   per item ([`crate::preprocess`]) + the GPU phase above.
//! * **Co-location.** SM partitioning does not isolate HBM bandwidth: while a local
//!   prefill runs beside it, an encode pass's memory-bound kernels share HBM. The
//!   slowdown is derived, not set: the fraction of a typical encode pass's GPU time
//!   spent in memory-bound kernels (bytes/bandwidth above FLOPs/peak) times the HBM
//!   utilisation of a typical prefill at the remaining share
//!   ([`KernelCost::bandwidth_interference`]).
//! * **Proxy GPUs.** A GPU without tables of its own may borrow another's (the RTX 6000
//!   Ada borrows the L40S's: the same AD102 die and 142 SMs). Each kernel's time is
//!   rescaled by the ratio of its roofline bound on the two GPUs: compute-bound
//!   kernels by the peak ratio (362 → 364 TFLOPS), memory-bound ones by the bandwidth
//!   ratio (864 → 960 GB/s).
//!
//! Lookups outside a table extend its edge cell and are counted; [`StageCost::notes`]
//! reports them once per run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use easerve_model::{AttnKind, ItemTokens, ModelArch, Op, Parallel, PrefillShape};

use crate::aic::{look, KernelTables, MoeShape, MoeTables};
use crate::launch::{Launch, LaunchStage};
use crate::preprocess::EncodeTerms;
use crate::roofline::{EncodeTime, MIN_SM_SHARE};
use crate::{Efficiency, GpuSpec, StageCost};

/// GEMM output tile side (rows = columns) for the wave count: 128, CUTLASS's and
/// cuBLAS's usual BF16 tile on Ampere, Ada and Hopper (an assumption: the library
/// picks per shape).
pub const GEMM_TILE: u64 = 128;
/// Query rows per flash-attention CTA (FlashAttention-2/3's block of 128 rows).
pub const ATTN_BLOCK: u64 = 128;

/// Another GPU's tables standing in for this one's.
#[derive(Clone, Debug, PartialEq)]
pub struct Proxy {
    /// The GPU whose tables are used (`l40s`).
    pub from: String,
    /// Its dense BF16 FLOP/s.
    pub from_flops: f64,
    /// Its memory bandwidth, bytes/s.
    pub from_bw: f64,
    /// Why this proxy.
    pub why: String,
}

/// Most memoised decode steps (16 bytes each); beyond it steps are priced
/// afresh.
const STEP_MEMO_MAX: usize = 1 << 20;

/// Most memoised encode passes and prefill batches; beyond it they are priced
/// afresh.
const OPS_MEMO_MAX: usize = 1 << 18;

type FxMap<K, V> = std::collections::HashMap<K, V, rustc_hash::FxBuildHasher>;

/// A memo shared by the threads of a search (a `StageCost` is `Send + Sync`).
type Memo<K, V> = std::sync::RwLock<FxMap<K, V>>;

/// Seconds and whether a lookup left its table.
type Timed = (f64, bool);

/// `(Parallel::key, SM share bits, sequences, RMS length)` of a prefill batch.
type TailKey = (u32, u64, u64, u64);
/// Encode passes by their items.
type ByItems = FxMap<Box<[ItemTokens]>, Timed>;

/// Dense memo rows: seconds and whether a lookup extrapolated, by a key and
/// then an index (`NaN` seconds where not priced yet); at most
/// [`STEP_MEMO_MAX`] entries in all. Decode steps are keyed by `(tp, batch)`
/// and indexed by the mean context per sequence, so consecutive steps of a
/// batch read neighbouring entries (the mean context grows by one a step);
/// prefill batches' layers by `(tp, SM share bits)` and indexed by tokens.
#[derive(Default)]
struct Rows {
    rows: FxMap<(u32, u64), Vec<(f64, bool)>>,
    entries: usize,
}

impl Rows {
    /// The row of `key`, `NaN` seconds where not priced yet.
    fn row(&self, key: (u32, u64)) -> Option<&[(f64, bool)]> {
        self.rows.get(&key).map(Vec::as_slice)
    }

    fn get(&self, key: (u32, u64), index: u64) -> Option<(f64, bool)> {
        let row = self.rows.get(&key)?;
        let v = *row.get(usize::try_from(index).ok()?)?;
        (!v.0.is_nan()).then_some(v)
    }

    fn insert(&mut self, key: (u32, u64), index: u64, v: (f64, bool)) {
        let Ok(i) = usize::try_from(index) else {
            return;
        };
        let row = self.rows.entry(key).or_default();
        if i >= row.len() {
            // rows grow by doubling, within the memo's bound
            let want = (i + 1).max(row.len() * 2).max(64);
            let grow = want - row.len();
            if self.entries + grow > STEP_MEMO_MAX {
                return;
            }
            self.entries += grow;
            row.resize(want, (f64::NAN, false));
        }
        row[i] = v;
    }
}

/// Stage costs from measured kernels (see the module doc).
pub struct KernelCost {
    model: ModelArch,
    gpu: GpuSpec,
    /// The encoder's tables (BF16).
    tables: Arc<KernelTables>,
    /// The LLM stages' tables: the LLM's GEMM and KV-cache dtypes (the same
    /// tables for a BF16 model).
    llm_tables: Arc<KernelTables>,
    proxy: Option<Proxy>,
    terms: EncodeTerms,
    eff: Efficiency,
    interference: f64,
    extrapolated: [AtomicU64; 3],
    /// [`KernelCost::decode_fixed`] by `(tp, batch)`.
    decode_memo: Memo<(u32, u64), (f64, f64, bool)>,
    /// Priced decode steps by `(tp, batch)`, then mean context.
    step_memo: std::sync::RwLock<Rows>,
    /// The layers of prefill batches (all ops before the context attention)
    /// by `(tp, SM share bits)`, then tokens.
    prefill_layers: std::sync::RwLock<Rows>,
    /// The rest of a prefill batch (context attention, LM head, whether either
    /// extrapolated) by `(tp, SM share bits, sequences, RMS length)`.
    prefill_tail: Memo<TailKey, (f64, f64, bool)>,
    /// Priced encode GPU phases (seconds, whether a lookup left its table) by
    /// `(tp, SM share bits)`, then by the pass's items.
    encode_memo: Memo<(u32, u64), ByItems>,
    /// Entries in the encode memo and `prefill_tail`; at most [`OPS_MEMO_MAX`].
    ops_entries: AtomicU64,
    /// The fused-MoE table of the GPU, for an MoE model.
    moe: Option<Arc<MoeTables>>,
    /// MoE layers priced as grouped GEMMs (shape not measured), and from the table.
    moe_priced: [AtomicU64; 2],
    /// How the engine runs each stage's passes (the eager launch floor).
    launch: Launch,
    /// Kernel launches of a prefill batch (all but its context attention and
    /// LM head repeat per layer, so the count depends only on the
    /// parallelism) and of a decode step, by [`Parallel::key`].
    launches: Memo<(u8, u32), u64>,
}

/// Rows per block of vLLM's fused-MoE Triton kernel: each expert's rows are
/// padded to it (`get_default_config` in vLLM's `fused_moe.py`: `BLOCK_SIZE_M`
/// 16 when the tokens are at most the experts, else 64).
pub fn moe_block_rows(tokens: u64, experts: u32) -> u64 {
    if tokens <= u64::from(experts) {
        16
    } else {
        64
    }
}

/// Which stage a priced op belongs to (all-reduce backend, counters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Encode = 0,
    Prefill = 1,
    Decode = 2,
}

/// The parts of one pass's priced time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Priced {
    /// Seconds.
    pub seconds: f64,
    /// Seconds in kernels whose roofline is bandwidth-bound.
    pub memory_bound_s: f64,
    /// HBM bytes moved.
    pub bytes: f64,
    /// Whether any lookup left its table.
    pub extrapolated: bool,
}

impl KernelCost {
    /// Price `model` on `gpu` from `tables` (or a `proxy`'s), with the serving
    /// system's encode `terms` (framework and measured preprocessing); `eff`
    /// supplies the per-step framework terms of prefill and decode
    /// and the time-slicing penalty.
    pub fn new(
        model: ModelArch,
        gpu: GpuSpec,
        tables: Arc<KernelTables>,
        proxy: Option<Proxy>,
        terms: EncodeTerms,
        eff: Efficiency,
    ) -> KernelCost {
        let mut c = KernelCost {
            model,
            gpu,
            llm_tables: tables.clone(),
            tables,
            proxy,
            terms,
            eff,
            interference: 0.0,
            extrapolated: Default::default(),
            decode_memo: Default::default(),
            step_memo: Default::default(),
            encode_memo: Default::default(),
            prefill_layers: Default::default(),
            prefill_tail: Default::default(),
            ops_entries: AtomicU64::new(0),
            moe: None,
            moe_priced: Default::default(),
            launch: Launch::default(),
            launches: Default::default(),
        };
        c.interference = c.derive_interference();
        c
    }

    /// Run the stages' passes as `launch` says (eager or graphed, and the
    /// per-launch cost); [`Launch::default`] (vLLM's) until set.
    pub fn with_launch(mut self, launch: Launch) -> KernelCost {
        self.launch = launch;
        self.clear_memos();
        self
    }

    /// How the stages' passes are launched.
    pub fn launch(&self) -> &Launch {
        &self.launch
    }

    /// Empties the priced-pass memos (after a change of what prices them).
    fn clear_memos(&mut self) {
        self.decode_memo = Default::default();
        self.step_memo = Default::default();
        self.encode_memo = Default::default();
        self.prefill_layers = Default::default();
        self.prefill_tail = Default::default();
        self.launches = Default::default();
        self.ops_entries = AtomicU64::new(0);
    }

    /// Kernel launches of a prefill batch (`0`) or a decode step (`1`) at `par`.
    fn launches_of(&self, which: u8, par: Parallel) -> u64 {
        let key = (which, par.key());
        if let Some(n) = self.launches.read().ok().and_then(|m| m.get(&key).copied()) {
            return n;
        }
        let ops = if which == 0 {
            self.model.prefill_ops(&[1], par)
        } else {
            self.model.decode_ops(1, 1, par)
        };
        let n = ops.iter().map(Op::launches).sum();
        if let Ok(mut m) = self.launches.write() {
            m.insert(key, n);
        }
        n
    }

    /// The tables in use.
    pub fn tables(&self) -> &KernelTables {
        &self.tables
    }

    /// Price the LLM stages (prefill, decode) from these tables: the LLM's own
    /// GEMM and KV-cache dtypes, e.g. FP8.
    pub fn with_llm_tables(mut self, llm: Arc<KernelTables>) -> KernelCost {
        self.llm_tables = llm;
        self.interference = self.derive_interference();
        self
    }

    /// Price MoE layers from this fused-MoE table where it measured their shape.
    pub fn with_moe(mut self, moe: Arc<MoeTables>) -> KernelCost {
        self.moe = Some(moe);
        // the co-location slowdown prices a prefill: again, from the table
        self.interference = self.derive_interference();
        for c in &self.moe_priced {
            c.store(0, Ordering::Relaxed);
        }
        self
    }

    /// Seconds of one fused-MoE layer call from the table, `None` when its
    /// shape (or the table) is missing.
    pub fn moe_measured(&self, op: &Op) -> Option<(f64, bool)> {
        let Op::Moe {
            tokens,
            hidden,
            inter,
            top_k,
            experts,
            moe_tp,
            moe_ep,
            routing,
            ..
        } = *op
        else {
            return None;
        };
        let key = MoeShape {
            hidden,
            inter,
            top_k,
            experts,
            moe_tp,
            moe_ep,
            routing,
        };
        let g = self.moe.as_ref()?.shapes.get(&key)?;
        Some(look(g, &[tokens as f64]))
    }

    /// Seconds of one fused-MoE layer call built from the GEMM table, for a
    /// shape the MoE table lacks: the busiest rank's experts
    /// ([`Op::moe_rank_shape`]) each padded to [`moe_block_rows`] rows, run as
    /// one grouped GEMM per projection (gate+up `[rows, hidden] x [hidden,
    /// 2·inter/tp]`, down `[rows, inter/tp] x [inter/tp, hidden]`) priced as the
    /// GEMM of that many rows (same tiles, same FLOPs), but never below
    /// streaming the touched experts' weights at the GPU's HBM bandwidth
    /// (a single GEMM reads one weight matrix, the grouped one one per expert);
    /// plus the activation and the gather/scatter of the routed rows as
    /// elementwise traffic.
    pub fn moe_grouped_gemm(&self, op: &Op) -> (f64, bool) {
        let Op::Moe {
            tokens,
            hidden,
            inter,
            top_k,
            experts,
            moe_tp,
            moe_ep,
            routing,
            ..
        } = *op
        else {
            return (0.0, false);
        };
        let t = &*self.llm_tables;
        let ep = moe_ep.max(1) as usize;
        let block = moe_block_rows(tokens, experts);
        let loads = routing.expert_loads(tokens, top_k, experts);
        let mine: Vec<u64> = loads.iter().step_by(ep).copied().collect();
        let rows: u64 = mine
            .iter()
            .filter(|&&l| l > 0)
            .map(|&l| l.div_ceil(block) * block)
            .sum();
        let touched = mine.iter().filter(|&&l| l > 0).count() as f64;
        let pairs: u64 = mine.iter().sum();
        if rows == 0 {
            return (0.0, false);
        }
        let h = u64::from(hidden);
        let n = u64::from(inter).div_ceil(u64::from(moe_tp.max(1)));
        let bw = t.system.mem_bw * t.system.mem_bw_scaling;
        let mut ext = false;
        let mut seconds = 0.0;
        for (gn, gk) in [(2 * n, h), (h, n)] {
            let (v, e) = look(&t.gemm, &[rows as f64, gn as f64, gk as f64]);
            ext |= e;
            let stream = touched * (gn * gk) as f64 * 2.0 / bw + t.system.mem_latency_s;
            seconds += v.max(stream);
        }
        // SiLU-and-mul over the gate/up output, the routed rows gathered in
        // and the weighted outputs summed back (3 elementwise kernels)
        let act = 2.0 * pairs as f64 * (3.0 * n as f64 + 2.0 * h as f64);
        seconds += act / bw + 3.0 * t.system.mem_latency_s;
        (seconds, ext)
    }

    /// HBM bytes of `op`: the tables time BF16 kernels, 2 bytes per element.
    fn bytes_of(&self, op: &Op) -> f64 {
        op.bytes(2.0)
    }

    /// Whether the op's roofline on the tables' GPU is bandwidth-bound.
    fn memory_bound(&self, op: &Op) -> bool {
        let s = &self.tables.system;
        match op {
            Op::Memory { .. } => true,
            Op::AllReduce { .. } | Op::Collective { .. } => false,
            _ => self.bytes_of(op) / s.mem_bw > op.flops() / s.bf16_flops,
        }
    }

    /// Seconds of `op` at `share` of the SMs, and whether a lookup extrapolated.
    fn price(&self, op: &Op, share: f64, phase: Phase) -> (f64, bool) {
        // the encoder runs in BF16; the LLM stages at the LLM's dtypes
        let t = match phase {
            Phase::Encode => &*self.tables,
            Phase::Prefill | Phase::Decode => &*self.llm_tables,
        };
        let sms = f64::from(self.gpu.sms.max(1));
        let share = if share.is_finite() {
            share.clamp(MIN_SM_SHARE, 1.0)
        } else {
            1.0
        };
        let waves = |ctas: u64| -> f64 {
            let full = (ctas as f64 / sms).ceil().max(1.0);
            let part = (ctas as f64 / (share * sms).floor().max(1.0))
                .ceil()
                .max(1.0);
            part / full
        };
        let (raw, ext, ctas, count) = match *op {
            Op::Gemm { m, n, k, count, .. } => {
                let (mut v, mut e) = look(&t.gemm, &[m as f64, n as f64, k as f64]);
                // an FP8 GEMM first quantizes its [m, k] input: dynamic
                // scale, then the scaled cast (vLLM's dynamic FP8 path)
                if let Some([scale, cast]) = &t.quant {
                    for g in [scale, cast] {
                        let (q, qe) = look(g, &[m as f64, k as f64]);
                        v += q;
                        e |= qe;
                    }
                }
                let ctas = m.div_ceil(GEMM_TILE) * n.div_ceil(GEMM_TILE);
                (v, e, Some(ctas), count)
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
                let (hd, kv, h, b, s) = (
                    f64::from(head_dim),
                    f64::from(kv_heads),
                    f64::from(heads),
                    batch as f64,
                    seq as f64,
                );
                let (v, e) = match kind {
                    AttnKind::Encoder => match &t.encoder {
                        Some(enc) => look(enc, &[hd, h, b, s]),
                        // no encoder table (A100): non-causal attention does twice
                        // the work of causal attention over the same tokens
                        None => {
                            let (v, e) = look(&t.context, &[hd, h, h, b, s]);
                            (2.0 * v, e)
                        }
                    },
                    AttnKind::Context => look(&t.context, &[hd, kv, h, b, s]),
                    AttnKind::Generation => look(&t.generation, &[hd, kv, h, b, s]),
                };
                let ctas = match kind {
                    AttnKind::Generation => batch * u64::from(heads),
                    _ => batch * u64::from(heads) * seq.div_ceil(ATTN_BLOCK),
                };
                (v, e, Some(ctas), count)
            }
            Op::AllReduce {
                elements,
                tp,
                count,
            } => {
                let table = if phase == Phase::Decode {
                    &t.allreduce_graph
                } else {
                    &t.allreduce_eager
                };
                let (v, e) = look(table, &[f64::from(tp), elements as f64]);
                (v, e, None, count)
            }
            Op::Collective {
                kind,
                elements,
                gpus,
                count,
            } => {
                let (v, e) = match &t.nccl {
                    Some(g) => look(
                        &g[match kind {
                            easerve_model::CollectiveKind::AllGather => 0,
                            easerve_model::CollectiveKind::ReduceScatter => 1,
                        }],
                        &[f64::from(gpus), elements as f64],
                    ),
                    // an all-reduce is a reduce-scatter and an all-gather
                    None => {
                        let (v, e) = look(&t.allreduce_eager, &[f64::from(gpus), elements as f64]);
                        (v / 2.0, e)
                    }
                };
                (v, e, None, count)
            }
            Op::Moe { count, .. } => {
                let (v, e) = match self.moe_measured(op) {
                    Some(v) => {
                        self.moe_priced[1].fetch_add(1, Ordering::Relaxed);
                        v
                    }
                    None => {
                        self.moe_priced[0].fetch_add(1, Ordering::Relaxed);
                        self.moe_grouped_gemm(op)
                    }
                };
                // the MoE table's kernels fill the GPU like a GEMM of the
                // routed rows: re-timed by their tiles at the SM share
                let (pairs, _, inter) = op.moe_rank_shape();
                let ctas =
                    (pairs as u64).div_ceil(GEMM_TILE) * ((2.0 * inter) as u64).div_ceil(GEMM_TILE);
                (v, e, Some(ctas.max(1)), count)
            }
            Op::Memory {
                bytes,
                kernels,
                count,
                ..
            } => {
                let bw = match &self.proxy {
                    Some(_) => self.gpu.peak_bandwidth(),
                    None => t.system.mem_bw,
                } * t.system.mem_bw_scaling;
                let v = bytes / bw + f64::from(kernels) * t.system.mem_latency_s;
                (v, false, None, count)
            }
        };
        let mut v = raw;
        if let (Some(p), Some(_)) = (&self.proxy, ctas) {
            let (f, b) = (op.flops(), self.bytes_of(op));
            let from = (f / p.from_flops).max(b / p.from_bw);
            let to = (f / self.gpu.peak_flops()).max(b / self.gpu.peak_bandwidth());
            if from > 0.0 {
                v *= to / from;
            }
        }
        if let Some(c) = ctas {
            v *= waves(c);
        }
        (v * f64::from(count), ext)
    }

    /// Seconds of `ops` at `share`, priced op by op, and whether a lookup
    /// left its table.
    fn price_all(&self, ops: &[Op], share: f64, phase: Phase) -> (f64, bool) {
        let mut seconds = 0.0;
        let mut extrapolated = false;
        for op in ops {
            let (s, e) = self.price(op, share, phase);
            seconds += s;
            extrapolated |= e;
        }
        (seconds, extrapolated)
    }

    /// Counts a pass, batch or step of `phase` that needed extrapolation.
    fn count_extrapolated(&self, phase: Phase, extrapolated: bool) {
        if extrapolated {
            self.extrapolated[phase as usize].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether the encode and prefill memos may take one more entry.
    fn ops_memo_has_room(&self) -> bool {
        self.ops_entries.fetch_add(1, Ordering::Relaxed) < OPS_MEMO_MAX as u64
    }

    /// The GPU phase of an encode pass over `items` at `share` on each of the
    /// `tp` ranks of a TP `tp` encoder, memoised by all three (the same sum
    /// as [`KernelCost::price_all`] of its ops,
    /// [`easerve_model::ModelArch::encode_ops_tp`]).
    fn encode_seconds(&self, items: &[ItemTokens], share: f64, tp: u32) -> (f64, bool) {
        let key = (tp.max(1), share.to_bits());
        let hit = self
            .encode_memo
            .read()
            .ok()
            .and_then(|m| m.get(&key).and_then(|by| by.get(items)).copied());
        if let Some(v) = hit {
            return v;
        }
        let ops = self.model.encode_ops_tp(items, tp);
        let (t, ext) = self.price_all(&ops, share, Phase::Encode);
        let tokens = items.iter().map(|i| i.encoder_tokens).sum();
        let v = (
            t.max(self.launch.floor_of(LaunchStage::Encode, tokens, &ops)),
            ext,
        );
        if self.ops_memo_has_room() {
            if let Ok(mut m) = self.encode_memo.write() {
                m.entry(key).or_default().insert(items.into(), v);
            }
        }
        v
    }

    /// A prefill batch of this shape at `share`: the same sum, in the same
    /// order, as [`KernelCost::price_all`] of its ops, from two memos (the
    /// layers depend only on the tokens, the rest on the sequences).
    fn prefill_seconds(&self, shape: PrefillShape, par: Parallel, share: f64) -> (f64, bool) {
        let bits = share.to_bits();
        let tail_key = (par.key(), bits, shape.sequences, shape.rms_len);
        let layers = self
            .prefill_layers
            .read()
            .ok()
            .and_then(|m| m.get((par.key(), bits), shape.tokens));
        let tail = self
            .prefill_tail
            .read()
            .ok()
            .and_then(|m| m.get(&tail_key).copied());
        let (layers, (attn, head, tail_ext)) = match (layers, tail) {
            (Some(l), Some(t)) => (l, t),
            (l, t) => {
                // `prefill_shape_ops` lists the layers, then the context
                // attention, then the LM head
                let ops = self.model.prefill_shape_ops(shape, par);
                let (body, rest) = ops.split_at(ops.len().saturating_sub(2));
                let l = l.unwrap_or_else(|| {
                    let v = self.price_all(body, share, Phase::Prefill);
                    if let Ok(mut m) = self.prefill_layers.write() {
                        m.insert((par.key(), bits), shape.tokens, v);
                    }
                    v
                });
                let t = t.unwrap_or_else(|| {
                    let (a, ea) = self.price(&rest[0], share, Phase::Prefill);
                    let (h, eh) = self.price(&rest[1], share, Phase::Prefill);
                    let v = (a, h, ea || eh);
                    if self.ops_memo_has_room() {
                        if let Ok(mut m) = self.prefill_tail.write() {
                            m.insert(tail_key, v);
                        }
                    }
                    v
                });
                (l, t)
            }
        };
        let floor = self.launch.floor(
            LaunchStage::Prefill,
            shape.tokens,
            if self.launch.prefill.eager(shape.tokens) {
                self.launches_of(0, par)
            } else {
                0
            },
        );
        ((layers.0 + attn + head).max(floor), layers.1 || tail_ext)
    }

    /// Seconds of the context-independent ops of one decode step at `(batch,
    /// tp)`: those before the attention (summed in order), the LM head after
    /// it, and whether either left its table; computed once per key.
    fn decode_fixed(&self, batch: u64, par: Parallel) -> (f64, f64, bool) {
        let key = (par.key(), batch);
        if let Some(v) = self
            .decode_memo
            .read()
            .ok()
            .and_then(|m| m.get(&key).copied())
        {
            return v;
        }
        let ops = self.model.decode_ops(batch, 1, par);
        let (mut before, mut after, mut ext, mut seen) = (0.0, 0.0, false, false);
        for op in &ops {
            if matches!(
                op,
                Op::Attention {
                    kind: AttnKind::Generation,
                    ..
                }
            ) {
                seen = true;
                continue;
            }
            let (s, e) = self.price(op, 1.0, Phase::Decode);
            ext |= e;
            if seen {
                after += s;
            } else {
                before += s;
            }
        }
        let v = (before, after, ext);
        if let Ok(mut m) = self.decode_memo.write() {
            m.insert(key, v);
        }
        v
    }

    /// Seconds of `ops` at `share` with their HBM demand (bytes, and the time in
    /// bandwidth-bound kernels); counts nothing.
    fn demand(&self, ops: &[Op], share: f64, phase: Phase) -> Priced {
        let mut p = Priced::default();
        for op in ops {
            let (s, e) = self.price(op, share, phase);
            p.seconds += s;
            p.bytes += self.bytes_of(op);
            if self.memory_bound(op) {
                p.memory_bound_s += s;
            }
            p.extrapolated |= e;
        }
        p
    }

    /// The GPU phase of one encode pass over `items` at `sm_share`, with its HBM
    /// demand.
    pub fn encode_gpu(&self, items: &[ItemTokens], sm_share: f64) -> Priced {
        self.demand(&self.model.encode_ops(items), sm_share, Phase::Encode)
    }

    /// The derived co-location slowdown (module doc): memory-bound fraction of a
    /// typical encode pass (one item of 2048 encoder tokens at half the SMs) times
    /// the HBM utilisation of a typical prefill (2048 tokens, the other half).
    fn derive_interference(&self) -> f64 {
        if self.model.encoder.is_none() {
            return 0.0;
        }
        let item = crate::profile::synthetic_item(&self.model, 2048);
        let enc = self.encode_gpu(&[item], 0.5);
        let pre = self.demand(&self.model.prefill_ops(&[2048], 1), 0.5, Phase::Prefill);
        if enc.seconds <= 0.0 || pre.seconds <= 0.0 {
            return 0.0;
        }
        let bw = self.gpu.peak_bandwidth();
        let util = (pre.bytes / pre.seconds / bw).min(1.0);
        (enc.memory_bound_s / enc.seconds) * util
    }

    /// Where each stage's figures come from (one line each).
    pub fn sources(&self) -> Vec<String> {
        let k = self.tables.describe();
        let proxy = self
            .proxy
            .as_ref()
            .map(|p| format!(" via the {} proxy ({})", p.from, p.why))
            .unwrap_or_default();
        let l = &self.llm_tables;
        let dtypes = if (l.gemm_dtype.as_str(), l.kv_dtype.as_str()) == ("bfloat16", "bfloat16") {
            String::new()
        } else {
            format!(
                "; {} GEMMs{}, {} KV cache",
                l.gemm_dtype,
                if l.quant.is_some() {
                    " after FP8 activation quantization (quantize tables)"
                } else {
                    ""
                },
                l.kv_dtype
            )
        };
        let mut lines = vec![
            format!(
                "encode: GPU phase from {k}{proxy}, SM share by output tiles/waves over {} SMs; {}",
                self.gpu.sms,
                self.terms.note()
            ),
            format!(
                "prefill: measured kernels ({}{dtypes}){proxy} + {} s per batch (assumption, calib/src/eff.rs)",
                self.tables.provenance.system, self.eff.prefill_batch_s
            ),
            format!(
                "decode: measured kernels ({}{dtypes}, CUDA-graph all-reduce){proxy} + {} s per step (assumption, calib/src/eff.rs)",
                self.tables.provenance.system, self.eff.decode_step_s
            ),
            self.launch.note(),
            format!(
                "co-location: encode slowdown next to a prefill {:.3} (derived from HBM demand), time-slicing penalty {} (assumption, EAServe §4.4)",
                self.interference, self.eff.time_slice_penalty
            ),
        ];
        if let Some(m) = &self.model.llm.moe {
            lines.push(match &self.moe {
                Some(t) => format!(
                    "MoE layers ({} experts, top {}, {} routing): aiconfigurator fused-MoE table ({}, {}, {}) where the shape is measured, else grouped GEMMs from the GEMM table (derived, calib/src/kernel_cost.rs)",
                    m.experts, m.top_k, m.routing.name(), t.dtype, t.version, t.kernel_source
                ),
                None => format!(
                    "MoE layers ({} experts, top {}, {} routing): grouped GEMMs from the GEMM table (no fused-MoE table read)",
                    m.experts, m.top_k, m.routing.name()
                ),
            });
        }
        lines
    }
}

impl StageCost for KernelCost {
    /// The GPU phase from the split kernels of
    /// [`easerve_model::ModelArch::encode_ops_tp`], its two all-reduces per
    /// block from the tables' all-reduce (aiconfigurator's vLLM custom
    /// all-reduce, `vllm_eager`, as prefill's); the
    /// host terms as at TP 1 (rank 0 preprocesses and schedules the pass).
    fn encode_tp(&self, items: &[ItemTokens], sm_share: f64, tp: u32) -> EncodeTime {
        if items.is_empty() || self.model.encoder.is_none() {
            return EncodeTime::default();
        }
        let (t_gpu, ext) = self.encode_seconds(items, sm_share, tp);
        self.count_extrapolated(Phase::Encode, ext);
        EncodeTime {
            t_pass: self.terms.pass_s(items.len()),
            t_pre: self.terms.pre_s(&self.model, items),
            t_gpu,
        }
    }

    fn preprocess(&self, items: &[ItemTokens]) -> f64 {
        if self.model.encoder.is_none() {
            return 0.0;
        }
        self.terms.pre_s(&self.model, items)
    }

    fn prefill(&self, seq_lens: &[u64], par: Parallel, sm_share: f64) -> f64 {
        let Some(shape) = PrefillShape::of(seq_lens) else {
            return 0.0;
        };
        let (seconds, ext) = self.prefill_seconds(shape, par, sm_share);
        self.count_extrapolated(Phase::Prefill, ext);
        seconds + self.eff.prefill_batch_s
    }

    /// The layers at the new tokens and the context attention at the
    /// length that does the new queries' causal work over the whole
    /// context ([`PrefillShape::with_cache`]), from the same tables.
    fn prefill_cached(&self, new: &[u64], cached: &[u64], par: Parallel, sm_share: f64) -> f64 {
        let Some(shape) = PrefillShape::with_cache(new, cached) else {
            return 0.0;
        };
        let (seconds, ext) = self.prefill_seconds(shape, par, sm_share);
        self.count_extrapolated(Phase::Prefill, ext);
        seconds + self.eff.prefill_batch_s
    }

    fn decode_step(&self, batch: u64, total_context_tokens: u64, par: Parallel) -> f64 {
        if batch == 0 {
            return 0.0;
        }
        // the same sum, in the same order, as pricing `decode_ops` op by op; the
        // ops around the attention depend only on (par.key(), batch) and are memoised
        // the step depends on the context only through the mean context per
        // sequence, so whole steps are memoised by (tp, batch, mean context)
        let seq = easerve_model::ops::decode_mean_context(batch, total_context_tokens);
        let hit = self
            .step_memo
            .read()
            .ok()
            .and_then(|m| m.get((par.key(), batch), seq));
        let (t, ext) = hit.unwrap_or_else(|| {
            let fixed = self.decode_fixed(batch, par);
            let attn = self
                .model
                .decode_attention(batch, total_context_tokens, par);
            let (a, ext) = self.price(&attn, 1.0, Phase::Decode);
            let floor = if self.launch.decode.eager(batch) {
                self.launch
                    .floor(LaunchStage::Decode, batch, self.launches_of(1, par))
            } else {
                0.0
            };
            let v = ((fixed.0 + a + fixed.1).max(floor), ext || fixed.2);
            if let Ok(mut m) = self.step_memo.write() {
                m.insert((par.key(), batch), seq, v);
            }
            v
        });
        self.count_extrapolated(Phase::Decode, ext);
        t + self.eff.decode_step_s
    }

    /// The same figures as [`StageCost::decode_step`] one by one: the run's
    /// mean contexts are consecutive (`⌈(c + i·b)/b⌉ = ⌈c/b⌉ + i` for `c ≥ 1`;
    /// an empty context is priced at mean context 1, like the step after it,
    /// so it is priced on its own), so the memoised part is read from one row
    /// under one lock; the rest is priced step by step.
    fn decode_steps(
        &self,
        batch: u64,
        mut context: u64,
        par: Parallel,
        mut steps: u64,
        out: &mut Vec<f64>,
    ) {
        if batch == 0 {
            out.resize(out.len() + steps as usize, 0.0);
            return;
        }
        if context == 0 && steps > 0 {
            out.push(self.decode_step(batch, 0, par));
            (context, steps) = (batch, steps - 1);
        }
        let first = easerve_model::ops::decode_mean_context(batch, context);
        let mut done = 0u64;
        if let Ok(m) = self.step_memo.read() {
            let cached = m
                .row((par.key(), batch))
                .and_then(|row| row.get(usize::try_from(first).ok()?..))
                .unwrap_or(&[]);
            // the priced prefix of the row: three tight passes instead of one
            // branchy loop that pushes step by step
            let cached = &cached[..cached.len().min(steps as usize)];
            let priced = &cached[..cached
                .iter()
                .position(|&(t, _)| t.is_nan())
                .unwrap_or(cached.len())];
            let extrapolated = priced.iter().filter(|&&(_, ext)| ext).count();
            if extrapolated > 0 {
                self.extrapolated[Phase::Decode as usize]
                    .fetch_add(extrapolated as u64, Ordering::Relaxed);
            }
            let overhead = self.eff.decode_step_s;
            out.extend(priced.iter().map(|&(t, _)| t + overhead));
            done = priced.len() as u64;
        }
        out.extend((done..steps).map(|i| self.decode_step(batch, context + i * batch, par)));
    }

    fn transfer(&self, bytes: f64) -> f64 {
        self.gpu.link.transfer_time(bytes)
    }

    fn time_slice_penalty(&self) -> f64 {
        self.eff.time_slice_penalty
    }

    fn bandwidth_interference(&self) -> f64 {
        self.interference
    }

    fn notes(&self) -> Vec<String> {
        let mut notes = self.sources();
        let (grouped, measured) = (
            self.moe_priced[0].swap(0, Ordering::Relaxed),
            self.moe_priced[1].swap(0, Ordering::Relaxed),
        );
        if grouped > 0 {
            notes.push(format!(
                "{grouped} of {} MoE layer shapes priced were not in the fused-MoE table: built from the GEMM table as grouped GEMMs at each expert's token count",
                grouped + measured
            ));
        }
        for (i, stage) in ["encode", "prefill", "decode"].iter().enumerate() {
            let n = self.extrapolated[i].swap(0, Ordering::Relaxed);
            if n > 0 {
                notes.push(format!(
                    "{n} {stage} passes needed a kernel outside its measured table (edge cell extended as a power law)"
                ));
            }
        }
        notes
    }
}

/// Which measured tables price a GPU preset: its own aiconfigurator system, or a
/// documented proxy's. `None` for a GPU with neither (the roofline applies).
///
/// The RTX 6000 Ada (the EAServe paper's testbed) has no table; it borrows the
/// L40S's: the same AD102 die and SM count (142), 364 vs 362 dense BF16 TFLOPS,
/// 960 vs 864 GB/s. Rescaling measured L40S kernels by the two bounds keeps their
/// measured efficiency curves, which the roofline (one fitted efficiency) lacks.
pub fn kernel_source_for(gpu: &str) -> Option<(&'static str, Option<Proxy>)> {
    if let Some(s) = crate::aic::aic_system(gpu) {
        return Some((s, None));
    }
    if gpu == "rtx-6000-ada" {
        let l40s = GpuSpec::preset("l40s")?;
        return Some((
            "l40s",
            Some(Proxy {
                from: "l40s".into(),
                from_flops: l40s.peak_flops(),
                from_bw: l40s.peak_bandwidth(),
                why: "same AD102 die and 142 SMs; rescaled by each kernel's bound: 362→364 TFLOPS, 864→960 GB/s".into(),
            }),
        ));
    }
    None
}

type CacheKey = (std::path::PathBuf, String, String);

/// [`KernelTables::load`] once per process per `(dir, system, dtype)`: a search or
/// sweep builds many scenarios on the same GPU; across processes through the
/// prepared-grid cache ([`crate::grid_cache`]).
pub fn load_cached(
    dir: &std::path::Path,
    system: &str,
    dtype: &str,
    kv_dtype: &str,
) -> Result<Arc<KernelTables>, crate::aic::KernelError> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static CACHE: OnceLock<Mutex<HashMap<CacheKey, Arc<KernelTables>>>> = OnceLock::new();
    let key = (
        dir.to_path_buf(),
        system.to_string(),
        format!("{dtype}/{kv_dtype}"),
    );
    let cache = CACHE.get_or_init(Default::default);
    if let Some(t) = cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
        return Ok(t);
    }
    let cache_dir = crate::grid_cache::cache_dir();
    let (t, _) =
        crate::grid_cache::kernel_tables(cache_dir.as_deref(), dir, system, dtype, kv_dtype)?;
    let t = Arc::new(t);
    if let Ok(mut c) = cache.lock() {
        c.insert(key, t.clone());
    }
    Ok(t)
}

/// The aiconfigurator dtypes of `model`'s LLM stages, `(GEMM and MoE, KV
/// cache)`: `dtype` (the LLM's weight format: `bfloat16`, `fp8` per-tensor,
/// `fp8_block` 128x128 block-scaled; `fp8` when `dtype` is `bfloat16` but the
/// model's weights take one byte), and `fp8` where the KV cache
/// ([`easerve_model::LlmArch::kv_bytes`]) takes one byte, else `bfloat16`.
pub fn llm_dtypes<'a>(model: &ModelArch, dtype: &'a str) -> (&'a str, &'static str) {
    let gemm = if model.llm.dtype_bytes == 1 && dtype == "bfloat16" {
        "fp8"
    } else {
        dtype
    };
    let kv = if model.llm.kv_bytes() == 1 {
        "fp8"
    } else {
        "bfloat16"
    };
    (gemm, kv)
}

/// [`MoeTables::load`], read once per process for each `(dir, system, dtype)`,
/// and across processes through the prepared-grid cache ([`crate::grid_cache`]).
pub fn load_moe_cached(
    dir: &std::path::Path,
    system: &str,
    dtype: &str,
) -> Result<Arc<MoeTables>, crate::aic::KernelError> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static CACHE: OnceLock<Mutex<HashMap<CacheKey, Arc<MoeTables>>>> = OnceLock::new();
    let key = (dir.to_path_buf(), system.to_string(), dtype.to_string());
    let cache = CACHE.get_or_init(Default::default);
    if let Some(t) = cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
        return Ok(t);
    }
    let cache_dir = crate::grid_cache::cache_dir();
    let (t, _) = crate::grid_cache::moe_tables(cache_dir.as_deref(), dir, system, dtype)?;
    let t = Arc::new(t);
    if let Ok(mut c) = cache.lock() {
        c.insert(key, t.clone());
    }
    Ok(t)
}

impl KernelCost {
    /// The measured-kernel cost of `model` on the GPU preset `gpu` as the serving
    /// `system` (`easerve`, `passthrough`, `aggregated`) runs it: the GPU's own tables
    /// from the aiconfigurator folder `dir` (the encoder's GEMMs BF16, the LLM's of `dtype` with the model's KV-cache dtype, [`llm_dtypes`]), or — for the RTX 6000
    /// Ada when `allow_proxy` — the L40S's ([`kernel_source_for`]); framework terms of
    /// the system ([`FrameworkTerms::for_system`]); the measured preprocessing of the
    /// implementation the system runs, scaled by `host_scale`; per-step terms and the
    /// time-slicing penalty from [`Efficiency::default`]. `Ok(None)` when the GPU has
    /// no tables (or only a proxy and `allow_proxy` is false).
    ///
    /// # Errors
    /// The tables cannot be read ([`KernelTables::load`]).
    pub fn from_data(
        dir: &std::path::Path,
        model: &ModelArch,
        gpu: &GpuSpec,
        system: &str,
        dtype: &str,
        host_scale: f64,
        allow_proxy: bool,
    ) -> Result<Option<KernelCost>, crate::aic::KernelError> {
        let Some((sys, proxy)) = kernel_source_for(&gpu.name) else {
            return Ok(None);
        };
        if proxy.is_some() && !allow_proxy {
            return Ok(None);
        }
        let tables = load_cached(dir, sys, "bfloat16", "bfloat16")?;
        let eff = Efficiency::default();
        let terms = EncodeTerms::for_system(model, system, eff.encode_pass_s, host_scale);
        let mut cost = KernelCost::new(model.clone(), gpu.clone(), tables, proxy, terms, eff);
        // the LLM's weights and KV cache may be FP8 while the encoder stays BF16
        let (gemm, kv) = llm_dtypes(model, dtype);
        if (gemm, kv) != ("bfloat16", "bfloat16") {
            cost = cost.with_llm_tables(load_cached(dir, sys, gemm, kv)?);
        }
        Ok(Some(match model.llm.moe {
            Some(_) => cost.with_moe(load_moe_cached(dir, sys, gemm)?),
            None => cost,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aic::tests::data;

    fn cost(model: &str, gpu: &str, system: &str) -> Option<KernelCost> {
        let dir = data()?;
        let m = ModelArch::preset(model).unwrap();
        let g = GpuSpec::preset(gpu).unwrap();
        Some(
            KernelCost::from_data(&dir, &m, &g, system, "bfloat16", 1.0, true)
                .unwrap()
                .unwrap(),
        )
    }

    /// The SM-share curve follows from waves: on a fifth of the SMs one small image
    /// slows far less than 1/share (measured 2.26×: its kernels need few waves), a
    /// large micro-batch close to it (3.94×; elementwise kernels are not re-timed).
    #[test]
    fn small_passes_stop_gaining_at_a_low_share_large_ones_keep_scaling() {
        let Some(c) = cost("qwen2.5-vl-32b", "h100-sxm", "easerve") else {
            return;
        };
        let m = ModelArch::preset("qwen2.5-vl-32b").unwrap();
        let small = [m.image_tokens(224, 224).unwrap()];
        let big = vec![m.image_tokens(1344, 1344).unwrap(); 8];
        let ratio = |items: &[ItemTokens]| {
            c.encode_gpu(items, 0.2).seconds / c.encode_gpu(items, 1.0).seconds
        };
        let (rs, rb) = (ratio(&small), ratio(&big));
        println!("slowdown at 0.2 of the SMs: small {rs:.2}x, large {rb:.2}x");
        assert!(rs < 2.5, "{rs}");
        assert!(rb > 3.5 && rb < 5.5 && rb > 1.5 * rs, "{rb}");
        let t = c.encode(&big, 1.0);
        assert!(t.t_pre > 0.0 && t.t_pass == crate::preprocess::EASERVE_PASS_S);
    }

    /// An encode worker at TP 2 (LLaVA-NeXT's CLIP tower on an H100, 4
    /// images of 672 × 672): its pass is the sum of the split ops'
    /// measured kernels, its all-reduces the tables' vLLM custom all-reduce
    /// of `tokens × hidden` at TP 2, two per block, and it is faster than at
    /// TP 1 (the blocks' GEMMs halve per rank; the all-reduces cost less).
    #[test]
    fn an_encoder_at_tp2_is_its_split_kernels_plus_two_all_reduces_per_block() {
        // without the data, `data()` prints SKIPPED
        let Some(c) = cost("llava-v1.6-34b", "h100-sxm", "easerve") else {
            return;
        };
        let m = ModelArch::preset("llava-v1.6-34b").unwrap();
        let e = m.encoder.as_ref().unwrap();
        let items = vec![m.image_tokens(672, 672).unwrap(); 4];
        let (one, two) = (c.encode(&items, 1.0), c.encode_tp(&items, 1.0, 2));
        let ops = m.encode_ops_tp(&items, 2);
        let (sum, _) = c.price_all(&ops, 1.0, Phase::Encode);
        assert_eq!(two.t_gpu, sum);
        let tokens: u64 = items.iter().map(|i| i.encoder_tokens).sum();
        let (ar, _) = look(
            &c.tables.allreduce_eager,
            &[2.0, (tokens * u64::from(e.hidden)) as f64],
        );
        let priced: f64 = (ops.iter())
            .filter(|o| matches!(o, Op::AllReduce { .. }))
            .map(|o| c.price(o, 1.0, Phase::Encode).0)
            .sum();
        assert!(ar > 0.0);
        assert!((priced - 2.0 * f64::from(e.layers) * ar).abs() < 1e-12 * priced);
        println!(
            "4 images 672x672 on h100-sxm: E(TP1) {:.2} ms, E(TP2) {:.2} ms ({:.2} ms all-reduce)",
            one.t_gpu * 1e3,
            two.t_gpu * 1e3,
            priced * 1e3
        );
        assert!(two.t_gpu < one.t_gpu && two.t_gpu > one.t_gpu / 2.0);
        assert_eq!((two.t_pass, two.t_pre), (one.t_pass, one.t_pre));
    }

    /// The launch floor (`crate::launch`): a small eager encode pass costs its
    /// launches × the per-launch cost, not its kernels; graphed it is its
    /// kernels; a large pass is its kernels either way. vLLM's graphed decode
    /// has no floor; easerve's eager one has, and it binds at a small batch.
    #[test]
    fn an_eager_pass_takes_at_least_its_launches() {
        use crate::launch::{Engine, Launch, StageLaunch, EAGER_LAUNCH_S};
        let Some(eager) = cost("qwen2.5-vl-32b", "h100-sxm", "aggregated") else {
            return;
        };
        let mut g = Launch::of_engine(Engine::Vllm);
        g.encode = StageLaunch::graph(1 << 20);
        let graph = cost("qwen2.5-vl-32b", "h100-sxm", "aggregated")
            .unwrap()
            .with_launch(g);
        let m = ModelArch::preset("qwen2.5-vl-32b").unwrap();
        let small = [m.image_tokens(112, 112).unwrap()];
        let big = vec![m.image_tokens(1344, 1344).unwrap(); 4];
        let launches: u64 = m.encode_ops(&small).iter().map(Op::launches).sum();
        let (e, k) = (
            eager.encode(&small, 1.0).t_gpu,
            graph.encode(&small, 1.0).t_gpu,
        );
        println!(
            "112² image: eager {:.2} ms ({launches} launches), graph {:.2} ms",
            e * 1e3,
            k * 1e3
        );
        assert!(k < e, "{k} {e}");
        assert!((e - launches as f64 * EAGER_LAUNCH_S).abs() < 1e-12, "{e}");
        // the kernels of a small pass finish faster than they can be launched
        assert!(k < 0.5 * e, "{k} {e}");
        let (eb, kb) = (eager.encode(&big, 1.0).t_gpu, graph.encode(&big, 1.0).t_gpu);
        assert_eq!(eb, kb);
        // the floor does not scale with the SM share: a small eager pass
        // costs the same on a fifth of the SMs
        assert_eq!(eager.encode(&small, 0.2).t_gpu, e);

        let par = Parallel::from(1);
        // a prefill of 512 tokens replays a graph under vLLM; easerve's runs eagerly
        let p = |c: &KernelCost, n: u64| c.prefill(&[n], par, 1.0);
        assert_eq!(p(&eager, 512), p(&graph, 512));
        // an MoE model reads 3.3e9 parameters a step: its eager decode step is
        // launch-bound, its graphed one is not
        let m = ModelArch::preset("qwen3-vl-30b-a3b").unwrap();
        let vllm = cost("qwen3-vl-30b-a3b", "h100-sxm", "aggregated").unwrap();
        let easerve = cost("qwen3-vl-30b-a3b", "h100-sxm", "aggregated")
            .unwrap()
            .with_launch(Launch::of_engine(Engine::Easerve));
        assert!(p(&easerve, 1) > p(&vllm, 1));
        let (dv, de) = (
            vllm.decode_step(1, 512, par),
            easerve.decode_step(1, 512, par),
        );
        let step_launches: u64 = m.decode_ops(1, 1, par).iter().map(Op::launches).sum();
        println!(
            "decode step, batch 1: vLLM graph {:.2} ms, eager {:.2} ms ({step_launches} launches)",
            dv * 1e3,
            de * 1e3
        );
        assert!(de > dv);
        assert!(
            (de - easerve.eff.decode_step_s - step_launches as f64 * EAGER_LAUNCH_S).abs() < 1e-9
        );
    }

    /// A decode run reads its memo row at once; its figures are the steps'
    /// one by one, whether the row was priced before (second half) or not.
    #[test]
    fn a_decode_run_is_priced_as_its_iterations_one_by_one() {
        let Some(c) = cost("qwen2.5-vl-32b", "h100-sxm", "easerve") else {
            return;
        };
        let fresh = cost("qwen2.5-vl-32b", "h100-sxm", "easerve").expect("loaded once");
        for (batch, context, tp) in [(7, 5000, 2), (1, 300, 1), (33, 40_000, 4), (5, 0, 1)] {
            let one_by_one: Vec<f64> = (0..60)
                .map(|i| fresh.decode_step(batch, context + i * batch, tp.into()))
                .collect();
            // half the run priced before: the cached part, then the rest
            for i in 0..30 {
                c.decode_step(batch, context + i * batch, tp.into());
            }
            let mut run = Vec::new();
            c.decode_steps(batch, context, tp.into(), 60, &mut run);
            assert_eq!(run, one_by_one, "batch {batch}, TP{tp}");
        }
    }

    #[test]
    fn llm_stages_scale_with_tp_context_and_system() {
        let Some(c) = cost("qwen2.5-vl-32b", "h100-sxm", "passthrough") else {
            return;
        };
        let p1 = c.prefill(&[4096], 1.into(), 1.0);
        let p2 = c.prefill(&[4096], 2.into(), 1.0);
        assert!(p2 < 0.7 * p1 && p2 > 0.4 * p1, "{p1} {p2}");
        assert!(c.decode_step(32, 32 * 8192, 2.into()) > c.decode_step(32, 32 * 512, 2.into()));
        assert_eq!(c.encode(&[], 1.0), EncodeTime::default());
        let m = ModelArch::preset("qwen2.5-vl-32b").unwrap();
        assert_eq!(
            c.encode(&[m.image_tokens(448, 448).unwrap()], 1.0).t_pass,
            1.5
        );
        let bw = c.bandwidth_interference();
        assert!(bw > 0.0 && bw < 1.0, "{bw}");
        let notes = c.notes();
        assert!(
            notes[0].starts_with("encode: GPU phase from aiconfigurator"),
            "{notes:?}"
        );
        assert!(notes
            .iter()
            .any(|n| n.starts_with("decode: measured kernels")));
    }

    /// The RTX 6000 Ada priced from the L40S: memory-bound decode gains the
    /// bandwidth ratio (864 → 960 GB/s), compute-bound prefill the peak ratio.
    #[test]
    fn the_l40s_proxy_rescales_by_each_kernels_bound() {
        let (Some(ada), Some(l40s)) = (
            cost("llava-v1.6-34b", "rtx-6000-ada", "easerve"),
            cost("llava-v1.6-34b", "l40s", "easerve"),
        ) else {
            return;
        };
        let step = |c: &KernelCost| c.decode_step(1, 1024, 2.into()) - c.eff.decode_step_s;
        let r = step(&ada) / step(&l40s);
        assert!(r > 0.86 && r < 0.95, "decode {r}");
        let pre = |c: &KernelCost| c.prefill(&[8192], 2.into(), 1.0) - c.eff.prefill_batch_s;
        let r = pre(&ada) / pre(&l40s);
        assert!(r > 0.97 && r <= 1.0, "prefill {r}");
        assert!(ada.sources()[0].contains("via the l40s proxy"));
    }

    #[test]
    fn gpus_without_tables_get_none() {
        let Some(dir) = data() else { return };
        let m = ModelArch::preset("qwen2.5-vl-32b").unwrap();
        let ada = GpuSpec::preset("rtx-6000-ada").unwrap();
        let cpu = GpuSpec::preset("cpu").unwrap();
        let f = |g: &GpuSpec, proxy| {
            KernelCost::from_data(&dir, &m, g, "easerve", "bfloat16", 1.0, proxy)
                .unwrap()
                .is_none()
        };
        assert!(f(&ada, false) && !f(&ada, true) && f(&cpu, true));
    }

    /// The grouped-GEMM build of an MoE layer against the fused-MoE table on
    /// the measured Qwen3-30B-A3B and Qwen3-235B-A22B shapes (BF16, H100,
    /// balanced, MoE TP 1/2/4, EP 1), every measured token count: prints the
    /// median and worst |error|.
    #[test]
    fn grouped_gemm_moe_agrees_with_the_fused_moe_table() {
        let Some(c) = cost("qwen3-vl-30b-a3b", "h100-sxm", "easerve") else {
            return;
        };
        let mut errs = Vec::new();
        let mut worst = (0.0, String::new());
        for (hidden, inter) in [(2048, 768), (4096, 1536)] {
            for tp in [1, 2, 4] {
                for tokens in [1u64, 4, 16, 64, 128, 256, 1024, 4096, 16384] {
                    let op = Op::Moe {
                        tokens,
                        hidden,
                        inter,
                        top_k: 8,
                        experts: 128,
                        moe_tp: tp,
                        moe_ep: 1,
                        routing: easerve_model::MoeRouting::Balanced,
                        count: 1,
                    };
                    let (m, ext) = c.moe_measured(&op).expect("shape measured");
                    assert!(!ext);
                    let (g, _) = c.moe_grouped_gemm(&op);
                    let e = (g - m) / m;
                    if e.abs() > worst.0 {
                        worst = (e.abs(), format!("{hidden}/{inter} TP{tp} {tokens} tokens: grouped {g:.3e} s, table {m:.3e} s"));
                    }
                    errs.push(e.abs());
                }
            }
        }
        errs.sort_by(f64::total_cmp);
        let median = errs[errs.len() / 2];
        println!(
            "grouped GEMM vs fused-MoE table, {} shapes: median |error| {:.1} %, worst {:.1} % ({})",
            errs.len(),
            100.0 * median,
            100.0 * worst.0,
            worst.1
        );
        assert!(median < 0.5, "median {median}");
    }

    /// An MoE decode step reads only the routed experts: one sequence costs
    /// far less than 128 (priced from the fused-MoE table), and the report's
    /// notes name the table.
    #[test]
    fn moe_decode_is_priced_from_the_fused_moe_table() {
        let Some(c) = cost("qwen3-vl-30b-a3b", "h100-sxm", "easerve") else {
            return;
        };
        let one = c.decode_step(1, 1000, 1.into());
        let many = c.decode_step(128, 128 * 1000, 1.into());
        println!(
            "Qwen3-VL-30B-A3B decode step on one H100: batch 1 {one:.4} s, batch 128 {many:.4} s"
        );
        assert!(one > 0.0 && many > 2.0 * one, "{one} {many}");
        let notes = c.notes().join("\n");
        assert!(notes.contains("fused-MoE table"), "{notes}");
        assert!(
            !notes.contains("were not in the fused-MoE table"),
            "{notes}"
        );
    }

    /// FP8 weights and KV cache: the LLM's GEMMs from the fp8 rows plus the
    /// activation-quantization kernels, attention from the fp8-KV rows; a
    /// decode step (bandwidth-bound: half the weight and KV bytes) is faster,
    /// the encoder unchanged, and the notes say so.
    #[test]
    fn fp8_llm_is_priced_from_the_fp8_rows_and_the_encoder_stays_bf16() {
        let Some(bf16) = cost("qwen3-vl-32b", "h100-sxm", "easerve") else {
            return;
        };
        let dir = data().unwrap();
        let mut m = ModelArch::preset("qwen3-vl-32b").unwrap();
        m.llm.dtype_bytes = 1;
        m.llm.kv_dtype_bytes = Some(1);
        let g = GpuSpec::preset("h100-sxm").unwrap();
        let fp8 = KernelCost::from_data(&dir, &m, &g, "easerve", "bfloat16", 1.0, true)
            .unwrap()
            .unwrap();
        let d = |c: &KernelCost| c.decode_step(32, 32 * 4000, 2.into()) - c.eff.decode_step_s;
        let p = |c: &KernelCost| c.prefill(&[8192], 2.into(), 1.0) - c.eff.prefill_batch_s;
        let (d16, d8, p16, p8) = (d(&bf16), d(&fp8), p(&bf16), p(&fp8));
        println!("Qwen3-VL-32B at TP2 on H100: decode step (32 x 4000) BF16 {d16:.4} s, FP8 {d8:.4} s; prefill 8192 BF16 {p16:.4} s, FP8 {p8:.4} s");
        assert!(d8 < 0.8 * d16, "{d8} vs {d16}");
        assert!(p8 < p16, "{p8} vs {p16}");
        let item = m.image_tokens(448, 448).unwrap();
        assert_eq!(bf16.encode(&[item], 1.0), fp8.encode(&[item], 1.0));
        let notes = fp8.notes().join("\n");
        assert!(
            notes.contains("fp8 GEMMs after FP8 activation quantization"),
            "{notes}"
        );
        assert!(notes.contains("fp8 KV cache"), "{notes}");
        // block-scaled FP8 (the format of Qwen's FP8 checkpoints): the fused
        // MoE layer of Qwen3-VL-30B-A3B from the fp8_block rows, faster than BF16
        let mut moe = ModelArch::preset("qwen3-vl-30b-a3b").unwrap();
        let b16 = KernelCost::from_data(&dir, &moe, &g, "easerve", "bfloat16", 1.0, true)
            .unwrap()
            .unwrap();
        moe.llm.dtype_bytes = 1;
        let blk = KernelCost::from_data(&dir, &moe, &g, "easerve", "fp8_block", 1.0, true)
            .unwrap()
            .unwrap();
        let layer = moe
            .decode_ops(32, 32_000, 2)
            .into_iter()
            .find(|o| matches!(o, Op::Moe { .. }))
            .unwrap();
        let (t16, t8) = (
            b16.moe_measured(&layer).unwrap().0,
            blk.moe_measured(&layer).unwrap().0,
        );
        println!(
            "Qwen3-VL-30B-A3B MoE layer, 32 tokens, TP2: BF16 {:.1} us, FP8 block {:.1} us",
            t16 * 1e6,
            t8 * 1e6
        );
        assert!(t8 < t16);
        assert!(blk.notes().join(" ").contains("fp8_block"));
        // the A100 has no FP8 units: its tables say so
        let a100 = GpuSpec::preset("a100-sxm4-80gb").unwrap();
        let e = KernelCost::from_data(&dir, &m, &a100, "easerve", "bfloat16", 1.0, true)
            .err()
            .expect("no fp8 on the A100");
        assert!(e.message.contains("bfloat16"), "{e}");
    }
}
