//! `easerve profile`: measure the calibration tables of a model on the real backend.
//!
//! What is timed (each point: `warmup` untimed runs, then `repetitions` timed runs;
//! the median and 90th percentile are written, in seconds):
//! * **encode** — a micro-batch of `batch` identical synthetic items (one per
//!   encoder-token size of [`Plan`]); `t_pre` is the host preprocessing of the batch
//!   (resize, patching, log-mel), the rest is host→device copy + encoder + projector.
//!   `t_pass` is 0: the fixed per-pass cost is inside the measured forward.
//! * **prefill** — one sequence of `tokens` input embeddings through the LM (KV cache
//!   written, last-position logits).
//! * **decode** — one step for `batch` sequences sharing `context_tokens` cached
//!   positions evenly (random caches of the right shape; timing does not depend on
//!   values).
//! * **transfer** — a `bytes` message over a loopback TCP socket and a 1-byte ack.
//! * **TP k > 1** (CPU, [`ProfileOptions::tp`]) — prefill and decode as above
//!   through a tensor-parallel worker's rank processes ([`crate::tp`]: rank 0
//!   in the level process, ranks `1..k` as `easerve worker` processes, the
//!   executor's code path), each rank on `threads / k` threads (at least 1),
//!   as the executor gives a TP k worker k slots. A prefill row includes
//!   sending the input to the ranks, their all-reduces and gathering the KV
//!   shards; a decode row one step with the KV shards already on the ranks.
//!   Where the encoder splits at TP k ([`easerve_model::EncoderArch::executor_tp`]),
//!   the full level also times the encode grid through an encode worker's
//!   rank processes (rank 0 preprocesses and sends the images, every rank
//!   runs its shard of every block, two all-reduces per block): the profile's
//!   `encode_tp` rows.
//! * **all-reduce** — for each TP k > 1, one sum of a `bytes` message among k
//!   ranks over the same loopback star ([`crate::tp::TcpGroup`]; the ranks
//!   are threads of the profiling process), at the message sizes the tiny
//!   models' passes send ([`Plan::all_reduce_bytes`]).
//!
//! SM levels: on CPU a level is the thread share `threads / cores` for the thread
//! counts of [`easerve_exec::device::cpu_levels`] (at most five); every level runs in its own
//! process (see [`easerve_exec::device`]), started by the caller's `spawn` function. Decode is
//! measured at the full level only (the decode table has no SM axis). On CUDA the
//! levels come from libsmctrl's TPC mask (`crate::cuda`, feature `cuda`).
//!
//! `t_pre` times preprocessing of already-decoded media (resize, patching, log-mel);
//! decoding PNG/JPEG/WAV files is not in it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Instant;

use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use easerve_calib::refine::median;
use easerve_calib::{
    monotone_envelope, Efficiency, Profile, ProfileError, Provenance, Source, Stage,
};
use easerve_model::nn::{KvCache, MultimodalModel};
use easerve_model::tokens::select_best_resolution;
use easerve_model::{EncoderKind, ModelArch};
use easerve_sched::MmItem;
use easerve_workload::generate::item_tokens;
use serde::{Deserialize, Serialize};

use easerve_exec::input::{prepare, Media};

/// Why a profile could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum ProfilerError {
    /// The model could not be built or run.
    #[error(transparent)]
    Model(#[from] easerve_model::nn::NnError),
    /// A synthetic input could not be prepared.
    #[error(transparent)]
    Input(#[from] easerve_exec::input::InputError),
    /// The device reported an error at a synchronisation.
    #[error("device sync failed: {0}")]
    Device(String),
    /// The loopback socket of the transfer measurement failed (what failed,
    /// and how).
    #[error("loopback {0}: {1}")]
    Loopback(String, std::io::Error),
    /// A level process could not start, failed (its message), or printed no
    /// rows.
    #[error("{0}")]
    Level(String),
    /// The measured profile failed the profile's validation.
    #[error("measured profile failed validation: {0}")]
    Invalid(ProfileError),
    /// This process's CPU threads could not be bounded.
    #[error(transparent)]
    Threads(#[from] easerve_exec::device::DeviceError),
}

/// burn version the executor is built against (pinned in the workspace manifest).
pub const BURN_VERSION: &str = "0.21.0";

/// Measurement settings.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProfileOptions {
    /// Timed runs per point (≥ 1).
    pub repetitions: u32,
    /// Untimed runs before them.
    pub warmup: u32,
    /// Seed of the weights and synthetic inputs.
    pub seed: u64,
    /// A smaller grid (2 encode batches, 4 prefill sizes, 2x2 decode points) for tests.
    pub quick: bool,
    /// Tensor-parallel degrees of the prefill and decode rows (CPU), ascending,
    /// starting at 1; each degree > 1 also gets the all-reduce rows.
    pub tp: Vec<usize>,
    /// Seconds of each window of the `[host_sharing]` measurement (CPU,
    /// [`crate::sharing`]); 0 leaves the table out.
    #[serde(default)]
    pub host_sharing_s: f64,
}

impl Default for ProfileOptions {
    fn default() -> Self {
        ProfileOptions {
            repetitions: 5,
            warmup: 2,
            seed: 0,
            quick: false,
            tp: vec![1],
            host_sharing_s: 0.0,
        }
    }
}

/// One encode grid point's item and its encoder tokens.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EncodeItem {
    /// The synthetic item's shape.
    pub item: MmItem,
    /// Its encoder tokens (`ModelArch` token rules).
    pub encoder_tokens: u64,
}

/// The grid of one profile run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Plan {
    /// Encode micro-batch sizes.
    pub encode_batch: Vec<usize>,
    /// Items of distinct encoder-token sizes, ascending.
    pub encode_items: Vec<EncodeItem>,
    /// Prefill sequence lengths (tokens).
    pub prefill_tokens: Vec<usize>,
    /// Decode batch sizes.
    pub decode_batch: Vec<usize>,
    /// Decode total context tokens (split evenly over the batch).
    pub decode_context: Vec<usize>,
    /// Transfer sizes in bytes.
    pub transfer_bytes: Vec<usize>,
    /// All-reduce message sizes in bytes: `rows × hidden × 4` (f32) for 1, 4,
    /// 16, 64, 256 and 2048 rows (a decode step's batch up to the longest
    /// prefill of the grid).
    pub all_reduce_bytes: Vec<usize>,
    /// Positions of one sequence's KV cache whose landing on a decode worker
    /// is timed (the `kv_land` table; CPU).
    pub kv_land_tokens: Vec<usize>,
}

impl Plan {
    /// The grid for `arch`: items of each distinct encoder size the preprocessor
    /// produces (anyres: one image per tile count; Qwen: 2, 4, 8, 16 frames at the
    /// largest video frame; Whisper: 1, 2, 4 windows), batches 1, 2, 4, 8, prefill
    /// 16..2048 tokens, decode batch 1..16 x context 16, 64, 256, 1024, 4096 (the
    /// batch's tokens in cache; the tiny presets' runs decode at tens of tokens), transfers
    /// 1 KiB..64 MiB.
    pub fn for_model(arch: &ModelArch, quick: bool) -> Plan {
        let mut items: Vec<EncodeItem> = Vec::new();
        let mut push = |item: MmItem| {
            let t = item_tokens(arch, &item);
            if let Ok(t) = t {
                if !items.iter().any(|i| i.encoder_tokens == t.encoder_tokens) {
                    items.push(EncodeItem {
                        item,
                        encoder_tokens: t.encoder_tokens,
                    });
                }
            }
        };
        match arch.encoder.as_ref().map(|e| &e.kind) {
            Some(EncoderKind::ClipAnyres { grid_pinpoints, .. }) => {
                for &(h, w) in grid_pinpoints {
                    if select_best_resolution(h, w, grid_pinpoints).is_some() {
                        push(MmItem::Image {
                            height: h,
                            width: w,
                        });
                    }
                }
            }
            Some(EncoderKind::QwenVit {
                video_max_pixels, ..
            }) => {
                let side = ((*video_max_pixels as f64).sqrt() as u32).max(28);
                for frames in [2, 4, 8, 16] {
                    push(MmItem::Video {
                        frames,
                        height: side,
                        width: side,
                    });
                }
            }
            // not runnable in the executor (model/src/nn has no module for it)
            Some(
                EncoderKind::Siglip { .. }
                | EncoderKind::TiledVit { .. }
                | EncoderKind::OmniAudio { .. },
            ) => {}
            Some(EncoderKind::Whisper { window_s, .. }) => {
                for w in [1.0, 2.0, 4.0] {
                    push(MmItem::Audio {
                        seconds: w * window_s,
                    });
                }
            }
            None => {}
        }
        items.sort_by_key(|i| i.encoder_tokens);
        if quick {
            items.truncate(2);
        }
        let pick = |full: Vec<usize>, q: Vec<usize>| if quick { q } else { full };
        Plan {
            encode_batch: pick(vec![1, 2, 4, 8], vec![1, 2]),
            encode_items: items,
            prefill_tokens: pick((4..=11).map(|e| 1 << e).collect(), vec![16, 64, 256, 512]),
            decode_batch: pick(vec![1, 2, 4, 8, 16], vec![1, 4]),
            decode_context: pick(vec![16, 64, 256, 1024, 4096], vec![64, 256]),
            transfer_bytes: pick(
                (0..=8).map(|e| 1024 << (2 * e)).collect(),
                vec![1024, 1 << 20],
            ),
            kv_land_tokens: pick(vec![64, 256, 1024, 4096], vec![64, 1024]),
            all_reduce_bytes: pick(vec![1, 4, 16, 64, 256, 2048], vec![1, 512])
                .into_iter()
                .map(|rows| rows * arch.llm.hidden as usize * 4)
                .collect(),
        }
    }

    /// Grid points one level measures (encode + prefill, plus decode at full level).
    pub fn points_per_level(&self, with_decode: bool) -> usize {
        self.encode_batch.len() * self.encode_items.len()
            + self.prefill_tokens.len()
            + if with_decode {
                self.decode_batch.len() * self.decode_context.len() + self.kv_land_tokens.len()
            } else {
                0
            }
    }
}

/// Rows measured at one SM level (columns as [`Profile::from_measurements`]).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LevelRows {
    /// Encode rows.
    pub encode: Vec<Vec<f64>>,
    /// Prefill rows.
    pub prefill: Vec<Vec<f64>>,
    /// Decode rows (full level only).
    pub decode: Vec<Vec<f64>>,
    /// Encode rows of a TP > 1 level (full level only, where the encoder
    /// splits): `[tp, batch, encoder_tokens, median, p90, t_pass, t_pre]`.
    #[serde(default)]
    pub encode_tp: Vec<Vec<f64>>,
    /// KV landing rows (full level only, CPU): `[tp, tokens, median, p90]`
    /// ([`time_kv_land`]).
    #[serde(default)]
    pub kv_land: Vec<Vec<f64>>,
}

/// Median and 90th percentile (nearest rank) of `xs`.
fn median_p90(xs: &mut [f64]) -> (f64, f64) {
    let med = median(xs);
    let n = xs.len();
    let p90 = xs[((0.9 * n as f64).ceil() as usize).clamp(1, n) - 1];
    (med, p90.max(med))
}

/// Time `f` `warmup + reps` times; returns (median, p90) of the timed runs and the
/// mean of the side value `f` reports (e.g. preprocessing seconds).
fn time_point<F: FnMut() -> f64>(opts: &ProfileOptions, mut f: F) -> (f64, f64, f64) {
    for _ in 0..opts.warmup {
        f();
    }
    let reps = opts.repetitions.max(1) as usize;
    let mut ts = Vec::with_capacity(reps);
    let mut side = 0.0;
    for _ in 0..reps {
        let t0 = Instant::now();
        side += f();
        ts.push(t0.elapsed().as_secs_f64());
    }
    let (m, p) = median_p90(&mut ts);
    (m, p, side / reps as f64)
}

/// Measure encode and prefill (and decode when `with_decode`) at `sm_level` in this
/// process, calling `progress` after each point with its label.
pub fn measure_level<B: Backend>(
    arch: &ModelArch,
    plan: &Plan,
    opts: &ProfileOptions,
    sm_level: f64,
    with_decode: bool,
    device: &B::Device,
    progress: &mut dyn FnMut(&str),
) -> Result<LevelRows, ProfilerError> {
    B::seed(device, opts.seed);
    let model = MultimodalModel::<B>::from_arch(arch, device)?;
    let sync = || B::sync(device).map_err(|e| ProfilerError::Device(format!("{e:?}")));
    let mut rows = LevelRows::default();
    for ei in &plan.encode_items {
        let media = Media::synthetic(&ei.item, opts.seed);
        for &b in &plan.encode_batch {
            let mut err = None;
            let (m, p, pre) = time_point(opts, || {
                let t0 = Instant::now();
                let prepared: Vec<_> = (0..b).map(|_| prepare(arch, &media)).collect();
                let pre = t0.elapsed().as_secs_f64();
                let items: Result<Vec<_>, _> = prepared
                    .into_iter()
                    .map(|p| p.map(|p| crate::items::to_device::<B>(&p.item, device)))
                    .collect();
                match items
                    .map_err(ProfilerError::from)
                    .and_then(|it| model.encode(&it).map_err(ProfilerError::from))
                {
                    Ok(out) => drop(out),
                    Err(e) => err = Some(e),
                }
                if let Err(e) = sync() {
                    err = Some(e);
                }
                pre
            });
            if let Some(e) = err {
                return Err(e);
            }
            rows.encode.push(vec![
                b as f64,
                ei.encoder_tokens as f64,
                sm_level,
                m,
                p,
                0.0,
                pre.min(m),
            ]);
            progress(&format!("encode b={b} tokens={}", ei.encoder_tokens));
        }
    }
    let d = model.lm.d_model();
    for &n in &plan.prefill_tokens {
        let x: Tensor<B, 2> = Tensor::random([n, d], Distribution::Normal(0.0, 1.0), device);
        let mut err = None;
        let (m, p, _) = time_point(opts, || {
            let out = model.lm.prefill(std::slice::from_ref(&x));
            drop(out);
            if let Err(e) = sync() {
                err = Some(e);
            }
            0.0
        });
        if let Some(e) = err {
            return Err(e);
        }
        rows.prefill.push(vec![n as f64, 1.0, sm_level, m, p]);
        progress(&format!("prefill tokens={n}"));
    }
    if with_decode {
        for &b in &plan.decode_batch {
            for &c in &plan.decode_context {
                let per = (c / b).max(1);
                // preallocated with room, as a server's caches are: each step
                // writes one position in place, and every run starts again
                // from `per` filled positions, so each run sees the same context
                let mut caches = random_caches::<B>(arch, b, per, 1, device);
                let x: Tensor<B, 2> =
                    Tensor::random([b, d], Distribution::Normal(0.0, 1.0), device);
                let mut err = None;
                let (m, p, _) = time_point(opts, || {
                    for c in caches.iter_mut() {
                        c.len = per;
                    }
                    let out = model.lm.decode(x.clone(), &mut caches);
                    drop(out);
                    if let Err(e) = sync() {
                        err = Some(e);
                    }
                    0.0
                });
                if let Some(e) = err {
                    return Err(e);
                }
                rows.decode
                    .push(vec![b as f64, (per * b) as f64, 1.0, m, p]);
                progress(&format!("decode b={b} context={}", per * b));
            }
        }
    }
    Ok(rows)
}

/// Measure prefill (and decode when `with_decode`) of a TP `tp` worker at
/// `sm_level`: this process is rank 0 and starts ranks `1..tp` as `easerve
/// worker` processes of `exe`, each on `threads` threads, as the executor
/// does ([`crate::tp`]). Rows as [`measure_level`]'s with `tp` in their TP
/// column; at the full level (`with_decode`), where the encoder splits at
/// `tp`, the encode rows at `tp` ([`measure_encode_tp`]).
///
/// Errors: a rank that cannot start or split the model, a failed exchange.
#[allow(clippy::too_many_arguments)]
pub fn measure_level_tp(
    arch: &ModelArch,
    plan: &Plan,
    opts: &ProfileOptions,
    sm_level: f64,
    with_decode: bool,
    tp: usize,
    threads: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<LevelRows, ProfilerError> {
    type B = burn::backend::NdArray;
    let device = Default::default();
    let ranks_err = |e: crate::process::WorkerError| ProfilerError::Level(e.to_string());
    let wopts = rank0_options(arch, opts, easerve_exec::wire::Role::Prefill, tp, threads);
    B::seed(&device, opts.seed);
    let full = MultimodalModel::<B>::from_arch(arch, &device)?;
    let lm = full
        .lm
        .shard(0, tp)
        .map_err(|e| ProfilerError::Level(e.to_string()))?;
    drop(full);
    let ranks = crate::tp::Ranks::start(&wopts, arch.llm.kv_heads as usize).map_err(ranks_err)?;
    let d = lm.d_model();
    let mut rows = LevelRows::default();
    for &n in &plan.prefill_tokens {
        let x: Tensor<B, 2> = Tensor::random([n, d], Distribution::Normal(0.0, 1.0), &device);
        let mut ts = timed_runs(opts, || {
            let t0 = Instant::now();
            ranks.prefill(&lm, std::slice::from_ref(&x), 1.0)?;
            Ok(t0.elapsed().as_secs_f64())
        })
        .map_err(ranks_err)?;
        let (m, p) = median_p90(&mut ts);
        rows.prefill.push(vec![n as f64, tp as f64, sm_level, m, p]);
        progress(&format!("prefill tp={tp} tokens={n}"));
    }
    if with_decode {
        for &b in &plan.decode_batch {
            for &c in &plan.decode_context {
                let per = (c / b).max(1);
                let (m, p) = time_tp_decode(arch, &ranks, &lm, opts, b, per).map_err(ranks_err)?;
                rows.decode
                    .push(vec![b as f64, (per * b) as f64, tp as f64, m, p]);
                progress(&format!("decode tp={tp} b={b} context={}", per * b));
            }
        }
        let x: Tensor<B, 2> = Tensor::random([1, d], Distribution::Normal(0.0, 1.0), &device);
        for &n in &plan.kv_land_tokens {
            let id: easerve_sched::RequestId = 0;
            let (m, p) = time_kv_land::<B>(
                arch,
                opts,
                n,
                &device,
                &mut |w| {
                    let whole = crate::process::kv_from_wire::<B>(w, &device)?;
                    ranks.land_kv(id, whole)
                },
                &mut |caches| ranks.decode(&lm, &[id], x.clone(), caches).map(drop),
            )
            .map_err(ranks_err)?;
            rows.kv_land.push(vec![tp as f64, n as f64, m, p]);
            progress(&format!("kv land tp={tp} tokens={n}"));
        }
    }
    drop(ranks);
    let splits = (arch.encoder.as_ref()).is_some_and(|e| e.executor_tp().contains(&tp));
    if with_decode && splits {
        rows.encode_tp = measure_encode_tp(arch, plan, opts, tp, threads, progress)?;
    }
    Ok(rows)
}

/// Rank 0's options of a TP `tp` worker of `role` the profiler starts (its
/// ranks `1..tp` on `threads` threads each, on the CPU).
pub(crate) fn rank0_options(
    arch: &ModelArch,
    opts: &ProfileOptions,
    role: easerve_exec::wire::Role,
    tp: usize,
    threads: usize,
) -> crate::process::WorkerOptions {
    crate::process::WorkerOptions {
        role,
        index: 0,
        connect: std::net::SocketAddr::from(([127, 0, 0, 1], 9)),
        model: arch.name.clone(),
        threads,
        seed: opts.seed,
        device: easerve_exec::device::DeviceKind::Cpu,
        gpu: 0,
        cores: easerve_exec::device::CoreSide::Any,
        preprocess_threads: 0,
        tp,
        tp_rank: 0,
        tp_root: None,
    }
}

/// The encode grid of `plan` on an encode worker at TP `tp`: this process
/// is rank 0 (its shard of the encoder) and starts ranks `1..tp` as
/// `easerve worker --role encode` processes on `threads` threads each, as
/// the executor does ([`crate::tp::Ranks::encode`]). A point times
/// preprocessing `batch` items on rank 0, sending them to the ranks and
/// every rank's pass (with its all-reduces) until rank 0 has the
/// embeddings. Rows `[tp, batch, encoder_tokens, median, p90, t_pass = 0,
/// t_pre]` in seconds.
///
/// Errors: a rank that cannot start or split the encoder, an input that
/// cannot be prepared, a failed exchange.
pub fn measure_encode_tp(
    arch: &ModelArch,
    plan: &Plan,
    opts: &ProfileOptions,
    tp: usize,
    threads: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<Vec<f64>>, ProfilerError> {
    type B = burn::backend::NdArray;
    let device = Default::default();
    let ranks_err = |e: crate::process::WorkerError| ProfilerError::Level(e.to_string());
    let wopts = rank0_options(arch, opts, easerve_exec::wire::Role::Encode, tp, threads);
    B::seed(&device, opts.seed);
    let full = MultimodalModel::<B>::from_arch(arch, &device)?;
    let model = full
        .shard(0, tp, true)
        .map_err(|e| ProfilerError::Level(e.to_string()))?;
    drop(full);
    let ranks = crate::tp::Ranks::start(&wopts, arch.llm.kv_heads as usize).map_err(ranks_err)?;
    let mut rows = Vec::new();
    for ei in &plan.encode_items {
        let media = Media::synthetic(&ei.item, opts.seed);
        for &b in &plan.encode_batch {
            let (mut pre_sum, mut calls) = (0.0, 0u32);
            let mut ts = timed_runs(opts, || -> Result<f64, ProfilerError> {
                let t0 = Instant::now();
                let prepared = (0..b)
                    .map(|_| prepare(arch, &media))
                    .collect::<Result<Vec<_>, _>>()?;
                pre_sum += t0.elapsed().as_secs_f64();
                calls += 1;
                let items: Vec<_> = (prepared.iter())
                    .map(|p| crate::items::to_device::<B>(&p.item, &device))
                    .collect();
                let wire = (prepared.iter())
                    .map(|p| crate::tp::AnyresTiles::of(&p.item))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        ProfilerError::Level(format!(
                            "{}: only LLaVA-NeXT anyres images encode at TP > 1",
                            arch.name
                        ))
                    })?;
                drop(ranks.encode(&model, &items, wire, 1.0).map_err(ranks_err)?);
                Ok(t0.elapsed().as_secs_f64())
            })?;
            let (m, p) = median_p90(&mut ts);
            let pre = pre_sum / f64::from(calls.max(1));
            rows.push(vec![
                tp as f64,
                b as f64,
                ei.encoder_tokens as f64,
                m,
                p,
                0.0,
                pre.min(m),
            ]);
            progress(&format!(
                "encode tp={tp} b={b} tokens={}",
                ei.encoder_tokens
            ));
        }
    }
    Ok(rows)
}

/// `warmup` untimed then `repetitions` timed runs of `f`, which returns the
/// seconds of its timed part.
fn timed_runs<E>(
    opts: &ProfileOptions,
    mut f: impl FnMut() -> Result<f64, E>,
) -> Result<Vec<f64>, E> {
    for _ in 0..opts.warmup {
        f()?;
    }
    (0..opts.repetitions.max(1)).map(|_| f()).collect()
}

/// `b` caches of `per` random positions each (every layer and KV head of
/// `arch`'s LLM, per layer `[kv_heads, per, head_dim]`), with room for
/// `reserve` more positions before they grow.
pub(crate) fn random_caches<B: Backend>(
    arch: &ModelArch,
    b: usize,
    per: usize,
    reserve: usize,
    device: &B::Device,
) -> Vec<KvCache<B>> {
    let l = &arch.llm;
    let kv = || -> Tensor<B, 3> {
        Tensor::random(
            [l.kv_heads as usize, per, l.head_dim as usize],
            Distribution::Normal(0.0, 1.0),
            device,
        )
    };
    (0..b)
        .map(|_| {
            KvCache::from_positions(
                (0..l.layers).map(|_| kv()).collect(),
                (0..l.layers).map(|_| kv()).collect(),
                reserve,
            )
        })
        .collect()
}

/// The least a KV landing row holds, seconds (a difference of two timings
/// that noise can make 0 or less; a table's values must be positive).
const KV_LAND_FLOOR_S: f64 = 1e-7;

/// Turns a cache's wire form into a decode worker's cache ([`time_kv_land`]).
type LandFn<'a, B> =
    dyn FnMut(easerve_exec::wire::KvData) -> Result<KvCache<B>, crate::process::WorkerError> + 'a;

/// One decode step of the caches' sequences ([`time_kv_land`]).
type StepFn<'a, B> =
    dyn FnMut(&mut Vec<KvCache<B>>) -> Result<(), crate::process::WorkerError> + 'a;

/// Median and p90 of landing one sequence's KV cache of `tokens` positions
/// on a decode worker, as the executor's does at the first step that holds
/// it (`worker/src/process.rs`, `Job::DecodeStep`): `land` turns the wire
/// form into the worker's cache (read from the wire; at TP > 1 resharded by
/// heads and the followers' heads sent to them, rank 0's kept), `step` runs
/// one decode step of the sequence. Each timed run: the landing and the
/// first step, less a second step (the followers read their heads before
/// their first step, so it holds their side), at least
/// [`KV_LAND_FLOOR_S`]. The cache's wire form is made untimed.
fn time_kv_land<B: Backend>(
    arch: &ModelArch,
    opts: &ProfileOptions,
    tokens: usize,
    device: &B::Device,
    land: &mut LandFn<'_, B>,
    step: &mut StepFn<'_, B>,
) -> Result<(f64, f64), crate::process::WorkerError> {
    let whole = random_caches::<B>(arch, 1, tokens, 1, device).remove(0);
    let wire = crate::process::kv_to_wire(whole)?;
    let mut ts = timed_runs(opts, || {
        let w = wire.clone();
        let t0 = Instant::now();
        let mut caches = vec![land(w)?];
        step(&mut caches)?;
        let first = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        step(&mut caches)?;
        Ok((first - t1.elapsed().as_secs_f64()).max(KV_LAND_FLOOR_S))
    })?;
    Ok(median_p90(&mut ts))
}

/// KV landing rows at TP 1 on the CPU (`[1, tokens, median, p90]` for each
/// of `plan.kv_land_tokens`): read from the wire, then one decode step
/// ([`time_kv_land`]).
pub fn measure_kv_land_tp1(
    arch: &ModelArch,
    plan: &Plan,
    opts: &ProfileOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<Vec<f64>>, ProfilerError> {
    type B = burn::backend::NdArray;
    let device = Default::default();
    B::seed(&device, opts.seed);
    let model = MultimodalModel::<B>::from_arch(arch, &device)?;
    let x: Tensor<B, 2> = Tensor::random(
        [1, model.lm.d_model()],
        Distribution::Normal(0.0, 1.0),
        &device,
    );
    let err = |e: crate::process::WorkerError| ProfilerError::Level(e.to_string());
    let mut rows = Vec::new();
    for &n in &plan.kv_land_tokens {
        let (m, p) = time_kv_land::<B>(
            arch,
            opts,
            n,
            &device,
            &mut |w| crate::process::kv_from_wire::<B>(w, &device),
            &mut |caches| {
                drop(model.lm.decode(x.clone(), caches));
                Ok(())
            },
        )
        .map_err(err)?;
        rows.push(vec![1.0, n as f64, m, p]);
        progress(&format!("kv land tp=1 tokens={n}"));
    }
    Ok(rows)
}

/// Median and p90 of one decode step of `b` sequences with `per` cached
/// positions each on a TP worker's ranks. Before each timed step (untimed):
/// every rank gets its heads of fresh random caches of `per − 1` positions
/// (`per` when `per` is 1) and runs one step, which also waits for the ranks
/// to have read their caches; the timed step then sees `per` positions
/// (`per + 1` when `per` is 1) on every rank.
fn time_tp_decode(
    arch: &ModelArch,
    ranks: &crate::tp::Ranks,
    lm: &easerve_model::nn::DecoderLm<burn::backend::NdArray>,
    opts: &ProfileOptions,
    b: usize,
    per: usize,
) -> Result<(f64, f64), crate::process::WorkerError> {
    type B = burn::backend::NdArray;
    let device = Default::default();
    let start = per.saturating_sub(1).max(1);
    let whole = random_caches::<B>(arch, b, start, 2, &device);
    let ids: Vec<easerve_sched::RequestId> = (0..b as u64).collect();
    let x: Tensor<B, 2> =
        Tensor::random([b, lm.d_model()], Distribution::Normal(0.0, 1.0), &device);
    let mut ts = timed_runs(opts, || {
        let mut caches = ids
            .iter()
            .zip(&whole)
            .map(|(&id, w)| ranks.land_kv(id, w.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        ranks.decode(lm, &ids, x.clone(), &mut caches)?;
        let t0 = Instant::now();
        ranks.decode(lm, &ids, x.clone(), &mut caches)?;
        Ok(t0.elapsed().as_secs_f64())
    })?;
    Ok(median_p90(&mut ts))
}

/// One all-reduce of each of `plan.all_reduce_bytes` among `tp` ranks over
/// the loopback star of [`crate::tp::TcpGroup`] (ranks `1..tp` are threads
/// here): rows `[tp, bytes, median, p90]` in seconds, timed on rank 0.
///
/// Errors: a socket that fails.
pub fn measure_all_reduce(
    plan: &Plan,
    opts: &ProfileOptions,
    tp: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<Vec<f64>>, ProfilerError> {
    use crate::tp::TcpGroup;
    use easerve_model::nn::AllReduce;
    type B = burn::backend::NdArray;
    let io = |what: &'static str| move |e| ProfilerError::Loopback(what.into(), e);
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io("all-reduce socket"))?;
    let root = listener.local_addr().map_err(io("all-reduce socket"))?;
    let runs = (opts.warmup + opts.repetitions.max(1)) as usize;
    let sizes = plan.all_reduce_bytes.clone();
    let followers: Vec<_> = (1..tp)
        .map(|r| {
            let sizes = sizes.clone();
            std::thread::spawn(move || -> std::io::Result<()> {
                let g = TcpGroup::connect(root, r, tp)?;
                for &n in &sizes {
                    let mut data = vec![1f32; n / 4];
                    for _ in 0..runs {
                        AllReduce::<B>::sum_host(&g, &mut data)?;
                    }
                }
                Ok(())
            })
        })
        .collect();
    let g = TcpGroup::accept(&listener, tp, std::time::Duration::from_secs(20))
        .map_err(io("all-reduce ranks"))?;
    let mut rows = Vec::new();
    for &n in &sizes {
        let mut data = vec![1f32; n / 4];
        let mut ts = timed_runs(opts, || {
            let t0 = Instant::now();
            AllReduce::<B>::sum_host(&g, &mut data)?;
            Ok(t0.elapsed().as_secs_f64())
        })
        .map_err(io("all-reduce"))?;
        let (m, p) = median_p90(&mut ts);
        rows.push(vec![tp as f64, n as f64, m, p]);
        progress(&format!("all-reduce tp={tp} bytes={n}"));
    }
    for f in followers {
        f.join()
            .map_err(|_| {
                ProfilerError::Loopback("all-reduce rank".into(), std::io::Error::other("panicked"))
            })?
            .map_err(io("all-reduce rank"))?;
    }
    Ok(rows)
}

/// Time `bytes`-sized messages over a loopback TCP socket (send + 1-byte ack).
pub fn measure_loopback(
    plan: &Plan,
    opts: &ProfileOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<Vec<f64>>, ProfilerError> {
    let loopback = |what: &'static str| move |e| ProfilerError::Loopback(what.into(), e);
    let listener = TcpListener::bind("127.0.0.1:0").map_err(loopback("socket"))?;
    let addr = listener.local_addr().map_err(loopback("socket"))?;
    let sizes = plan.transfer_bytes.clone();
    let per_size = (opts.warmup + opts.repetitions.max(1)) as usize;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let mut buf = vec![0u8; 1 << 20];
        for &n in &sizes {
            for _ in 0..per_size {
                let mut left = n;
                while left > 0 {
                    let k = s.read(&mut buf[..left.min(1 << 20)])?;
                    if k == 0 {
                        return Ok(());
                    }
                    left -= k;
                }
                s.write_all(&[1])?;
            }
        }
        Ok(())
    });
    let mut c = TcpStream::connect(addr).map_err(loopback("connect"))?;
    c.set_nodelay(true).map_err(loopback("connect"))?;
    let mut rows = Vec::new();
    for &n in &plan.transfer_bytes {
        let msg = vec![7u8; n];
        let mut ack = [0u8; 1];
        let mut failed = None;
        let (m, p, _) = time_point(opts, || {
            if let Err(e) = c.write_all(&msg).and_then(|_| c.read_exact(&mut ack)) {
                failed = Some(e);
            }
            0.0
        });
        if let Some(e) = failed {
            return Err(ProfilerError::Loopback(format!("transfer of {n} bytes"), e));
        }
        rows.push(vec![n as f64, m, p]);
        progress(&format!("transfer bytes={n}"));
    }
    drop(c);
    server
        .join()
        .map_err(|_| ProfilerError::Loopback("server".into(), std::io::Error::other("panicked")))?
        .map_err(loopback("server"))?;
    Ok(rows)
}

/// A line a level process prints on stdout: progress, or its result.
#[derive(Debug, Serialize, Deserialize)]
pub enum LevelMessage {
    /// One grid point finished.
    Point(String),
    /// All rows of the level.
    Rows(LevelRows),
    /// The level failed.
    Failed(String),
    /// A host-sharing process's pass times, seconds ([`crate::sharing`]).
    Passes(Vec<f64>),
}

/// Run a CPU profile: one child process per thread level `1..=cores` and TP
/// degree of `opts.tp` (started by `spawn(threads, tp)`, which must run this
/// crate's level entry point with [`LevelMessage`] lines on stdout), loopback
/// transfers and all-reduces in this process, then assemble and validate the
/// profile; with `opts.host_sharing_s` > 0, the `[host_sharing]` table from
/// processes started by `spawn_sharing(threads, tp)`, which must run
/// [`crate::sharing::run_sharing_process`].
///
/// Errors: a level process that fails or prints no rows; a profile the validator
/// rejects.
pub fn profile_cpu(
    arch: &ModelArch,
    opts: &ProfileOptions,
    cores: usize,
    spawn: &dyn Fn(usize, usize) -> Command,
    spawn_sharing: &dyn Fn(usize, usize) -> Command,
    progress: &mut dyn FnMut(&str),
    date: &str,
) -> Result<Profile, ProfilerError> {
    let plan = Plan::for_model(arch, opts.quick);
    let mut levels = Vec::new();
    let tps = if opts.tp.is_empty() {
        vec![1]
    } else {
        opts.tp.clone()
    };
    for (tp, threads) in tps.iter().flat_map(|&tp| {
        easerve_exec::device::cpu_levels(cores)
            .into_iter()
            .map(move |t| (tp, t))
    }) {
        let mut cmd = spawn(threads, tp);
        cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = cmd
            .spawn()
            .map_err(|e| ProfilerError::Level(format!("cannot start the level process: {e}")))?;
        let out = child
            .stdout
            .take()
            .ok_or_else(|| ProfilerError::Level("level process has no stdout".into()))?;
        let mut rows = None;
        for line in BufReader::new(out).lines() {
            let line =
                line.map_err(|e| ProfilerError::Level(format!("reading its output: {e}")))?;
            match serde_json::from_str::<LevelMessage>(&line) {
                Ok(LevelMessage::Point(p)) => progress(&format!("{threads}/{cores} threads: {p}")),
                Ok(LevelMessage::Rows(r)) => rows = Some(r),
                Ok(LevelMessage::Passes(_)) | Err(_) => {}
                Ok(LevelMessage::Failed(e)) => {
                    let _ = child.wait();
                    return Err(ProfilerError::Level(e));
                }
            }
        }
        let status = child
            .wait()
            .map_err(|e| ProfilerError::Level(format!("waiting for it: {e}")))?;
        let rows = rows.ok_or_else(|| {
            ProfilerError::Level(format!(
                "the {threads}-thread level process exited ({status}) without results"
            ))
        })?;
        levels.push(rows);
    }
    let transfer = measure_loopback(&plan, opts, progress)?;
    let mut all_reduce = Vec::new();
    for &tp in tps.iter().filter(|&&tp| tp > 1) {
        all_reduce.extend(measure_all_reduce(&plan, opts, tp, progress)?);
    }
    let eff = Efficiency::default();
    let tp_note = if tps == [1] {
        String::new()
    } else {
        format!("TP {tps:?}: a TP k > 1 row times rank 0 of k rank processes on threads/k threads each (at least 1; loopback TCP all-reduces inside), all-reduce = one sum among k ranks (threads) over the loopback star; ")
    };
    let provenance = Provenance {
        model: arch.name.clone(),
        device: "cpu".into(),
        link: "loopback".into(),
        source: Source::Measured,
        backend: format!("burn {BURN_VERSION} ndarray (f32)"),
        driver: format!("{} ({cores} cores)", easerve_exec::device::cpu_name()),
        libraries: vec![
            format!("burn {BURN_VERSION}"),
            format!("easerve-worker {}", env!("CARGO_PKG_VERSION")),
        ],
        date: date.into(),
        method: format!(
            "easerve profile: {} warm-up + {} timed runs per point, median and p90; SM level = threads/cores ({cores} cores), one process per level (rayon pool + MATMUL_NUM_THREADS + CPU affinity); {tp_note}encode t_pre = host preprocessing of decoded synthetic items (no file decoding), t_pass = 0 (inside the forward); decode with random caches of the given context; kv_land = one sequence's cache read from the wire (and at TP > 1 resharded and sent to the ranks) plus one decode step, less a second step; transfer = loopback TCP message + 1-byte ack; latencies made non-decreasing along work axes (running max)",
            opts.warmup, opts.repetitions
        ),
        repetitions: opts.repetitions,
        cores: u32::try_from(cores).ok(),
    };
    let mut encode_tp: Vec<Vec<f64>> = levels
        .iter_mut()
        .flat_map(|l| l.encode_tp.drain(..))
        .collect();
    let mut kv_land: Vec<Vec<f64>> = levels
        .iter_mut()
        .flat_map(|l| l.kv_land.drain(..))
        .collect();
    let mut profile = assemble(
        arch,
        provenance,
        (eff.time_slice_penalty, eff.bandwidth_interference),
        levels,
        transfer,
    )?;
    for (stage, rows) in [
        (Stage::AllReduce, &mut all_reduce),
        (Stage::EncodeTp, &mut encode_tp),
        (Stage::KvLand, &mut kv_land),
    ] {
        if rows.is_empty() {
            continue;
        }
        fix_measured(stage, rows);
        let rows = std::mem::take(rows);
        profile = match stage {
            Stage::AllReduce => profile.with_all_reduce(rows),
            Stage::KvLand => profile.with_kv_land(rows),
            _ => profile.with_encode_tp(rows),
        }
        .map_err(ProfilerError::Invalid)?;
    }
    if opts.host_sharing_s > 0.0 {
        let curve = crate::sharing::measure_host_sharing(
            arch,
            opts,
            cores,
            opts.host_sharing_s,
            spawn_sharing,
            progress,
        )?;
        profile = profile.with_host_sharing(Some(curve));
    }
    Ok(profile)
}

/// Make measured rows of `stage` non-decreasing along its work axes
/// ([`monotone_envelope`]) and each p90 at least its median.
fn fix_measured(stage: Stage, rows: &mut [Vec<f64>]) {
    let na = stage.axes().len();
    monotone_envelope(stage, rows);
    for r in rows.iter_mut() {
        r[na + 1] = r[na + 1].max(r[na]);
    }
}

/// Merge level rows into a validated profile (decode from the level that has it).
pub fn assemble(
    arch: &ModelArch,
    provenance: Provenance,
    scalars: (f64, f64),
    levels: Vec<LevelRows>,
    mut transfer: Vec<Vec<f64>>,
) -> Result<Profile, ProfilerError> {
    let mut encode = Vec::new();
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    for l in levels {
        encode.extend(l.encode);
        prefill.extend(l.prefill);
        decode.extend(l.decode);
    }
    fix_measured(Stage::Encode, &mut encode);
    fix_measured(Stage::Prefill, &mut prefill);
    fix_measured(Stage::Decode, &mut decode);
    fix_measured(Stage::Transfer, &mut transfer);
    let note =
        "not measured: easerve-calib Efficiency defaults (assumptions, see calib/src/eff.rs)"
            .to_string();
    Profile::from_measurements(
        provenance,
        (scalars.0, scalars.1, note),
        arch.encoder.as_ref().map(|_| encode),
        prefill,
        decode,
        transfer,
    )
    .map_err(ProfilerError::Invalid)
}

/// The entry point of a level process: bound threads, measure, print
/// [`LevelMessage`] lines on stdout.
pub fn run_level_cpu(
    arch: &ModelArch,
    opts: &ProfileOptions,
    threads: usize,
    cores: usize,
    tp: usize,
) -> Result<(), ProfilerError> {
    let rank_threads = (threads / tp.max(1)).max(1);
    if tp > 1 {
        easerve_exec::device::limit_cpu_threads(rank_threads)?;
    } else {
        easerve_exec::device::bound_cpu_threads(threads)?;
    }
    let plan = Plan::for_model(arch, opts.quick);
    let mut out = std::io::stdout().lock();
    let mut emit = |m: &LevelMessage| {
        let _ = writeln!(out, "{}", serde_json::to_string(m).unwrap_or_default());
        let _ = out.flush();
    };
    let device = Default::default();
    let level = threads as f64 / cores.max(1) as f64;
    let mut point = |p: &str| emit(&LevelMessage::Point(p.to_string()));
    let res = if tp > 1 {
        measure_level_tp(
            arch,
            &plan,
            opts,
            level,
            threads == cores,
            tp,
            rank_threads,
            &mut point,
        )
    } else {
        measure_level::<burn::backend::NdArray>(
            arch,
            &plan,
            opts,
            level,
            threads == cores,
            &device,
            &mut point,
        )
        .and_then(|mut rows| {
            if threads == cores {
                rows.kv_land = measure_kv_land_tp1(arch, &plan, opts, &mut point)?;
            }
            Ok(rows)
        })
    };
    match res {
        Ok(rows) => {
            emit(&LevelMessage::Rows(rows));
            Ok(())
        }
        Err(e) => {
            emit(&LevelMessage::Failed(e.to_string()));
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_p90_by_nearest_rank() {
        let mut xs = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(median_p90(&mut xs), (3.0, 5.0));
        let mut ys: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(median_p90(&mut ys), (5.5, 9.0));
    }

    #[test]
    fn plans_have_distinct_encoder_sizes() {
        for name in ["tiny-image", "tiny-video", "tiny-audio", "llava-v1.6-34b"] {
            let arch = ModelArch::preset(name).unwrap();
            let plan = Plan::for_model(&arch, false);
            assert!(
                plan.encode_items.len() >= 2,
                "{name}: {:?}",
                plan.encode_items
            );
            let t: Vec<u64> = plan.encode_items.iter().map(|i| i.encoder_tokens).collect();
            assert!(t.windows(2).all(|w| w[0] < w[1]), "{name}: {t:?}");
        }
        let p = Plan::for_model(&ModelArch::preset("tiny-image").unwrap(), false);
        let t: Vec<u64> = p.encode_items.iter().map(|i| i.encoder_tokens).collect();
        assert_eq!(t, vec![195, 325]);
    }
}
