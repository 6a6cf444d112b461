//! A worker process (`easerve worker`, started by `easerve exec`): one stage
//! of one deployment on one device, running the real burn model and doing
//! what its controller's frames say.
//!
//! It connects to the controller, says [`FromWorker::Hello`], builds its model
//! (weights seeded by the run's seed, so every worker of a run holds the same
//! LM), warms it up, says [`FromWorker::Ready`], then serves [`ToWorker`]
//! frames one at a time until [`ToWorker::Shutdown`] or the end of the stream.
//! Any failure is reported as [`FromWorker::Error`] before exiting non-zero.
//!
//! Preprocessing ahead of the pass (`deployment.preprocess = "pipelined"`):
//! a [`ToWorker::Preprocess`] frame goes from the receiver thread straight to
//! the [`Preprocessor`]'s own thread pool, which prepares the request's items
//! in parallel while earlier passes compute; the pass that encodes the
//! request takes its prepared items, waiting for those still in progress.

use burn::prelude::*;
use burn::tensor::backend::ExecutionError;
use burn::tensor::{DataError, TensorData};
use easerve_exec::device::{DeviceError, DeviceKind};
use easerve_exec::input::{prepare, HostItem, InputError, Media};
use easerve_exec::wire::{
    read_frame, write_frame, EncodeRequest, FromWorker, KvData, Matrix, PrefillRequest, PromptPart,
    Role, ToWorker, WireMedia, WireMediaError,
};
use easerve_model::nn::{EncoderItem, KvCache, MultimodalModel, NnError};
use easerve_model::ModelArch;
use easerve_sched::RequestId;
use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Instant;

use easerve_exec::device::CoreSide;

/// What a worker process is told on its command line.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// Stage.
    pub role: Role,
    /// Index within the stage.
    pub index: usize,
    /// Controller address.
    pub connect: SocketAddr,
    /// Model preset.
    pub model: String,
    /// CPU threads this worker may use (its share of the host's cores).
    pub threads: usize,
    /// Run seed (weights and synthetic media).
    pub seed: u64,
    /// Device.
    pub device: DeviceKind,
    /// Device ordinal (CUDA): the first GPU of the worker's share of the allocation.
    pub gpu: usize,
    /// Which cores its passes run on (CPU): an encode worker's at the low end
    /// and its co-located prefill worker's at the high end, so their shares
    /// run on disjoint cores.
    pub cores: CoreSide,
    /// Preprocessing threads of an encode worker whose requests come ahead
    /// of their passes ([`ToWorker::Preprocess`]); 0: each pass preprocesses
    /// its own micro-batch on the compute thread (serial).
    pub preprocess_threads: usize,
    /// Tensor-parallel degree: the worker's ranks, one process each (CPU);
    /// 1 without TP. See [`crate::tp`].
    pub tp: usize,
    /// This process's rank (0: the process the controller started, which
    /// starts the others).
    pub tp_rank: usize,
    /// Rank 0's loopback address, given to ranks ≥ 1.
    pub tp_root: Option<SocketAddr>,
}

/// Why a worker stopped. Its message goes to the process's stderr, and to
/// the controller as [`FromWorker::Error`].
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// `--model` names no preset.
    #[error("--model: unknown model `{0}`")]
    UnknownModel(String),
    /// The controller cannot be reached.
    #[error("cannot connect to the controller at {addr}: {error}")]
    Connect {
        /// The controller's address.
        addr: SocketAddr,
        /// Why not.
        error: std::io::Error,
    },
    /// The socket cannot be cloned for the receiver thread.
    #[error("socket clone failed: {0}")]
    SocketClone(std::io::Error),
    /// A frame cannot be written to the controller.
    #[error("cannot write to the controller: {0}")]
    Write(std::io::Error),
    /// The worker's CPU threads cannot be bounded.
    #[error("{0}")]
    Device(DeviceError),
    /// A CUDA worker in a build without the `cuda` feature.
    #[error("this build has no CUDA support (build with --features cuda)")]
    NoCuda,
    /// The model cannot be built, or cannot encode the items given.
    #[error("{0}")]
    Model(NnError),
    /// The preprocessing pool cannot start.
    #[error("cannot start {threads} preprocessing threads: {error}")]
    PreprocessPool {
        /// The threads asked for.
        threads: usize,
        /// Why not.
        error: rayon::ThreadPoolBuildError,
    },
    /// The receiver thread cannot start.
    #[error("cannot start the receiver thread: {0}")]
    ReceiverThread(std::io::Error),
    /// The device cannot be synchronised.
    #[error("device sync failed: {0:?}")]
    Sync(ExecutionError),
    /// A result tensor cannot be read back to the host.
    #[error("tensor read-back failed: {0:?}")]
    ReadBack(DataError),
    /// A pass reuses an item's stored embeddings that this worker does not
    /// hold: its store and the controller's encoder-cache directory disagree.
    #[error(
        "request {id}: the embeddings of item {key:016x} are to be reused but are not held here"
    )]
    NotHeld {
        /// The request.
        id: RequestId,
        /// The item's content key.
        key: u64,
    },
    /// A prefill reuses a cached head that this worker does not keep: its
    /// store and the controller's prefix-cache directory disagree.
    #[error("request {id}: the KV cache kept under link {key:016x} is to be reused but is not held here")]
    PrefixNotHeld {
        /// The request.
        id: RequestId,
        /// The chain link's key.
        key: u64,
    },
    /// A prefill's embeddings do not have the rows its prompt's items name
    /// (or its prompt is empty): the encoder's token count and the
    /// workload's disagree.
    #[error("request {id}: its embeddings have {rows} rows but its prompt's items take {items} (an empty prompt takes at least one token)")]
    PromptRows {
        /// The request.
        id: RequestId,
        /// Rows of its embeddings.
        rows: usize,
        /// Tokens its prompt's items name.
        items: usize,
    },
    /// A decode step names a request whose KV cache has not landed here.
    #[error("decode step for request {0}, whose KV cache is not here")]
    NoKv(RequestId),
    /// A KV cache whose keys and values do not fill its layers.
    #[error("KV cache of {layers} layers × {per} values has {keys} keys and {values} values")]
    KvShape {
        /// Its layers.
        layers: u32,
        /// Values per layer (KV heads × positions × head width).
        per: usize,
        /// The keys that came.
        keys: usize,
        /// The values that came.
        values: usize,
    },
    /// A request's media that came malformed.
    #[error("request {id}: {error}")]
    Media {
        /// The request.
        id: RequestId,
        /// What is wrong.
        error: WireMediaError,
    },
    /// A request's item that cannot be prepared for the encoder.
    #[error("request {id}: {error}")]
    Input {
        /// The request.
        id: RequestId,
        /// Why not.
        error: InputError,
    },
    /// Prepared items other than the pass's items of a request.
    #[error("request {id}: {prepared} items prepared for {items} in the pass")]
    ItemCount {
        /// The request.
        id: RequestId,
        /// Items prepared.
        prepared: usize,
        /// Items the pass names.
        items: usize,
    },
    /// The tensor-parallel ranks cannot start, split the model, or exchange.
    #[error("tensor-parallel ranks: {0}")]
    Ranks(String),
    /// A request's embeddings that do not fit the LM's width.
    #[error("request {id}: embeddings {rows}×{cols} do not fit the LM's width {width}")]
    EmbeddingsWidth {
        /// The request.
        id: RequestId,
        /// Rows of the embeddings.
        rows: u32,
        /// Their columns.
        cols: u32,
        /// The LM's width.
        width: usize,
    },
}

/// Serve as a worker until shutdown. Errors go to the process's stderr; the
/// controller also gets them as [`FromWorker::Error`].
pub fn run_worker(opts: &WorkerOptions) -> Result<(), WorkerError> {
    if opts.tp_rank > 0 {
        let root = opts
            .tp_root
            .ok_or_else(|| WorkerError::Ranks("a rank ≥ 1 needs --tp-root".into()))?;
        return crate::tp::run_follower(opts, root);
    }
    let arch = ModelArch::preset(&opts.model)
        .ok_or_else(|| WorkerError::UnknownModel(opts.model.clone()))?;
    let stream = TcpStream::connect(opts.connect).map_err(|error| WorkerError::Connect {
        addr: opts.connect,
        error,
    })?;
    stream.set_nodelay(true).ok();
    let reader = stream.try_clone().map_err(WorkerError::SocketClone)?;
    let writer = Arc::new(Mutex::new(stream));
    send(
        &writer,
        &FromWorker::Hello {
            role: opts.role,
            index: opts.index,
            pid: std::process::id(),
        },
    )?;
    let res = match opts.device {
        DeviceKind::Cpu => match easerve_exec::device::limit_cpu_threads(opts.threads) {
            Ok(()) => serve::<burn::backend::NdArray>(
                &arch,
                opts,
                &Default::default(),
                reader,
                writer.clone(),
            ),
            Err(e) => Err(WorkerError::Device(e)),
        },
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => serve::<crate::cuda::Gpu>(
            &arch,
            opts,
            &burn::backend::cuda::CudaDevice::new(crate::cuda::visible_ordinal(opts.gpu)),
            reader,
            writer.clone(),
        ),
        #[cfg(not(feature = "cuda"))]
        DeviceKind::Cuda => {
            drop(reader);
            Err(WorkerError::NoCuda)
        }
    };
    if let Err(e) = &res {
        let message = e.to_string();
        let _ = send(&writer, &FromWorker::Error { message });
    }
    res
}

/// Synthetic media of request `id`'s item `j`, seeded by the run.
fn media_seed(seed: u64, id: RequestId, j: usize) -> u64 {
    seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (j as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9)
}

/// Synthetic media of the item with content id `key`, seeded by the run:
/// equal ids, equal media, whichever request sends them.
fn content_seed(seed: u64, key: u64) -> u64 {
    easerve_sched::cache::mix(seed, key)
}

/// The seed of request `r`'s item `j`'s synthetic media: by its content id
/// when it has one, else by the request.
fn item_seed(seed: u64, r: &EncodeRequest, j: usize) -> u64 {
    match r.keys.get(j) {
        Some(&k) => content_seed(seed, k),
        None => media_seed(seed, r.id, j),
    }
}

/// How a worker draws the text tokens of a prompt (the models have no
/// tokenizer): below the LM's vocabulary, from the run's seed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TextIds {
    /// LM vocabulary size.
    pub(crate) vocab: u32,
    /// Run seed.
    pub(crate) seed: u64,
}

impl TextIds {
    /// The `n` text tokens of request `id` without content (deterministic,
    /// its own: no other request shares them).
    fn of_request(self, id: RequestId, n: u32) -> Vec<u32> {
        (0..n)
            .map(|t| {
                ((id as u32)
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(t * 7919))
                    % self.vocab.max(1)
            })
            .collect()
    }

    /// The `n` tokens of the text segment of content id `id`, drawn on the
    /// named stream `exec-segment/{id:016x}` of the run's seed: equal ids,
    /// equal tokens, in every request and on every worker.
    fn of_segment(self, id: u64, n: u32) -> Vec<u32> {
        use rand::Rng;
        let mut rng = easerve_workload::rng::stream(self.seed, &format!("exec-segment/{id:016x}"));
        (0..n)
            .map(|_| rng.gen_range(0..self.vocab.max(1)))
            .collect()
    }
}

pub(crate) fn to_vec_f32<B: Backend, const D: usize>(
    t: Tensor<B, D>,
) -> Result<Vec<f32>, WorkerError> {
    t.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(WorkerError::ReadBack)
}

fn argmax_rows<B: Backend>(logits: Tensor<B, 2>) -> Result<Vec<u32>, WorkerError> {
    let ids = logits.argmax(1);
    Ok(ids
        .into_data()
        .convert::<i64>()
        .into_vec::<i64>()
        .map_err(WorkerError::ReadBack)?
        .into_iter()
        .map(|i| i.max(0) as u32)
        .collect())
}

pub(crate) fn kv_to_wire<B: Backend>(c: KvCache<B>) -> Result<KvData, WorkerError> {
    let layers = c.k.len();
    let [kv_heads, len, head_dim] = if layers == 0 {
        [0, 0, 0]
    } else {
        c.keys(0).dims()
    };
    let mut k = Vec::with_capacity(c.elements() / 2);
    let mut v = Vec::with_capacity(c.elements() / 2);
    for l in 0..layers {
        k.extend(to_vec_f32(c.keys(l))?);
        v.extend(to_vec_f32(c.values(l))?);
    }
    Ok(KvData {
        layers: layers as u32,
        kv_heads: kv_heads as u32,
        len: len as u32,
        head_dim: head_dim as u32,
        k,
        v,
    })
}

pub(crate) fn kv_from_wire<B: Backend>(
    kv: KvData,
    device: &B::Device,
) -> Result<KvCache<B>, WorkerError> {
    let per = (kv.kv_heads * kv.len * kv.head_dim) as usize;
    if kv.k.len() != per * kv.layers as usize || kv.v.len() != kv.k.len() {
        return Err(WorkerError::KvShape {
            layers: kv.layers,
            per,
            keys: kv.k.len(),
            values: kv.v.len(),
        });
    }
    let shape = [kv.kv_heads as usize, kv.len as usize, kv.head_dim as usize];
    let split = |all: &[f32]| -> Vec<Tensor<B, 3>> {
        all.chunks(per.max(1))
            .take(kv.layers as usize)
            .map(|c| Tensor::from_data(TensorData::new(c.to_vec(), shape), device))
            .collect()
    };
    Ok(KvCache::from_positions(split(&kv.k), split(&kv.v), 1))
}

/// A decode worker's sequences: cache and next input token.
struct Sequence<B: Backend> {
    cache: KvCache<B>,
    last: u32,
}

/// Thread pools by size, so a pass can run on its thread share; with a
/// [`CoreSide`] other than `Any`, the process is also pinned to that many cores
/// at its side of the host before the pass (see [`easerve_exec::device::core_set`]).
pub(crate) struct Pools {
    threads: usize,
    pools: HashMap<usize, rayon::ThreadPool>,
    side: CoreSide,
    /// The cores the worker was started on.
    allowed: Vec<usize>,
    /// The cores the process is pinned to now.
    pinned: Option<Vec<usize>>,
    /// Threads a pass's pinning leaves alone: the preprocessing pool's.
    keep: Vec<i32>,
}

impl Pools {
    pub(crate) fn new(threads: usize, side: CoreSide, keep: Vec<i32>) -> Pools {
        Pools {
            threads: threads.max(1),
            pools: HashMap::new(),
            side,
            allowed: easerve_exec::device::allowed_cores(),
            pinned: None,
            keep,
        }
    }

    pub(crate) fn run<T: Send>(&mut self, share: f64, f: impl FnOnce() -> T + Send) -> T {
        let n = easerve_sched::cpu::pass_threads(self.threads, share);
        if self.side != CoreSide::Any {
            let cores = easerve_exec::device::core_set(&self.allowed, n, self.side);
            if self.pinned.as_ref() != Some(&cores) {
                // best effort: a refused mask leaves the pool-size bound only
                if let Err(e) = easerve_exec::device::pin_process_except(&cores, &self.keep) {
                    eprintln!("warning: {e}");
                }
                self.pinned = Some(cores);
            }
        }
        if n >= self.threads {
            return f();
        }
        let pool = self.pools.entry(n).or_insert_with(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .expect("a rayon pool of a few threads builds")
        });
        pool.install(f)
    }
}

/// Work for the compute loop (data frames are handled by the receiver thread).
enum Job {
    Encode(Vec<EncodeRequest>, f64),
    Prefill(Vec<PrefillRequest>, f64),
    DecodeStep(Vec<RequestId>),
    Release(Vec<RequestId>),
    PrefixOps(Vec<easerve_sched::PrefixOp>),
    ReplicaStep {
        encode: Vec<EncodeRequest>,
        prefill: Vec<PrefillRequest>,
        decode: Vec<RequestId>,
    },
}

type Shared<T> = Arc<Mutex<T>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn send(writer: &Mutex<TcpStream>, m: &FromWorker) -> Result<(), WorkerError> {
    write_frame(&mut *lock(writer), m).map_err(WorkerError::Write)
}

/// The receiver thread: stores embeddings envelopes and KV caches as they
/// arrive (and acknowledges them at once, even while a batch computes) and
/// hands compute work to the compute loop. Ends the loop on shutdown or EOF.
fn receive(
    mut reader: TcpStream,
    writer: Shared<TcpStream>,
    embeddings: Shared<HashMap<RequestId, Matrix>>,
    kv: Shared<HashMap<RequestId, (u32, KvData)>>,
    preprocessor: Arc<Preprocessor>,
    jobs: mpsc::Sender<Result<Job, WorkerError>>,
) {
    loop {
        let msg = match read_frame::<_, ToWorker>(&mut reader) {
            Ok(Some(m)) => m,
            Ok(None) | Err(_) => return, // the controller is gone: stop
        };
        let job = match msg {
            ToWorker::Shutdown => return,
            // the heartbeat: this thread is alive and the socket works
            ToWorker::Ping => {
                if send(&writer, &FromWorker::Pong).is_err() {
                    return;
                }
                continue;
            }
            ToWorker::Embeddings {
                envelope,
                embeddings: e,
            } => {
                lock(&embeddings).extend(e);
                if send(&writer, &FromWorker::EmbeddingsLanded { envelope }).is_err() {
                    return;
                }
                continue;
            }
            ToWorker::Kv {
                id,
                last_token,
                kv: k,
            } => {
                lock(&kv).insert(id, (last_token, k));
                if send(&writer, &FromWorker::KvLanded { id }).is_err() {
                    return;
                }
                continue;
            }
            // registered before the next frame is read, so the pass that
            // names these requests (a later frame) finds them
            ToWorker::Preprocess { requests } => {
                for r in requests {
                    preprocessor.submit(r);
                }
                continue;
            }
            ToWorker::Encode { requests, sm_share } => Job::Encode(requests, sm_share),
            ToWorker::Prefill { requests, sm_share } => Job::Prefill(requests, sm_share),
            ToWorker::DecodeStep { ids } => Job::DecodeStep(ids),
            ToWorker::Release { ids } => Job::Release(ids),
            ToWorker::PrefixOps { ops } => Job::PrefixOps(ops),
            ToWorker::ReplicaStep {
                encode,
                prefill,
                decode,
            } => Job::ReplicaStep {
                encode,
                prefill,
                decode,
            },
        };
        if jobs.send(Ok(job)).is_err() {
            return;
        }
    }
}

/// The worker's model: the whole of it, or rank 0's shard with the other
/// ranks started ([`crate::tp::Ranks`]) when `opts.tp > 1`.
fn load_model<B: Backend>(
    arch: &ModelArch,
    opts: &WorkerOptions,
    device: &B::Device,
) -> Result<(MultimodalModel<B>, Option<crate::tp::Ranks>), WorkerError> {
    B::seed(device, opts.seed);
    let model = MultimodalModel::<B>::from_arch(arch, device).map_err(WorkerError::Model)?;
    if opts.tp <= 1 {
        return Ok((model, None));
    }
    let shard = model
        .shard(0, opts.tp, opts.role == Role::Encode)
        .map_err(|e| WorkerError::Ranks(e.to_string()))?;
    let ranks = crate::tp::Ranks::start(opts, arch.llm.kv_heads as usize)?;
    Ok((shard, Some(ranks)))
}

/// The request id of the warm-up's sequence on a TP worker's ranks (no
/// request has it: ids count up from 0).
const WARM_UP_ID: RequestId = RequestId::MAX;

/// Prompt tokens of an LM worker's warm-up prefill: the grid's 1024
/// (`easerve profile`'s prefill lengths, [`crate::profiler::Plan`]), longer
/// than the cpu-image scenarios' prompts (490–683 tokens in the
/// `cpu-image-tp2` loop's runs: two images and 8–24 text tokens), so that
/// none of their requests needs larger buffers than the warm-up took.
/// tiny-image's profile on the 2-core VM (2026-12-06) times a 1024-token
/// prefill at 0.38 s at TP 1 and 0.27 s at TP 2.
pub const WARM_UP_PROMPT_TOKENS: usize = 1024;

/// Warm-up: forwards of the stage's model before the first request, so
/// that it does not pay first-use costs (thread pools started, buffers
/// allocated and faulted in): on an encode worker at TP 1 one pass over one
/// item of the smallest shape `easerve profile` measures (synthetic media
/// of `seed`), on all of its threads; on an LM worker a prefill of
/// [`WARM_UP_PROMPT_TOKENS`] and a decode step (at TP > 1 through the
/// ranks, the prefill's cache landed on them as a request's is, then
/// released). An encode worker at TP > 1 is not warmed up.
///
/// Measured on `cpu-image-tp2` (`scripts/calib-loop`, 2026-12-06;
/// docs/calibration.md, "The LM workers' warm-up at a workload's size"):
/// with a 3-token warm-up prefill the run's 683-token local prefill took
/// 214–243 ms in five runs (the first, of 560 tokens: 175–250 ms); with
/// 1024 tokens 151–214 ms in nine runs, median 171 ms (the first:
/// 135–230 ms). A warm-up encode over one item of each measured shape left
/// the first encode pass where it was (65–75 ms against 64–83 ms, the
/// others' median 43–55 ms), so it stays one item.
fn warm_up<B: Backend>(
    model: &MultimodalModel<B>,
    arch: &ModelArch,
    opts: &WorkerOptions,
    ranks: Option<&crate::tp::Ranks>,
    pools: &mut Pools,
    device: &B::Device,
) -> Result<(), WorkerError> {
    if opts.role == Role::Encode {
        let plan = crate::profiler::Plan::for_model(arch, true);
        let (Some(first), None) = (plan.encode_items.first(), ranks) else {
            return Ok(());
        };
        let media = Media::synthetic(&first.item, opts.seed);
        let prepared = prepare(arch, &media).map_err(|error| WorkerError::Input {
            id: WARM_UP_ID,
            error,
        })?;
        let item = crate::items::to_device::<B>(&prepared.item, device);
        pools.run(1.0, || model.encode(&[item]).map_err(WorkerError::Model))?;
        return Ok(());
    }
    let prompt: Vec<u32> = (0..WARM_UP_PROMPT_TOKENS)
        .map(|i| 1 + i as u32 % arch.llm.vocab.saturating_sub(1).max(1))
        .collect();
    let x = model.lm.embed_tokens(&prompt, device);
    if let Some(r) = ranks {
        let (_logits, mut whole) = r.prefill(&model.lm, std::slice::from_ref(&x), 1.0)?;
        let mut caches = vec![r.land_kv(WARM_UP_ID, whole.remove(0))?];
        let x = model.lm.embed_tokens(&[4], device);
        r.decode(&model.lm, &[WARM_UP_ID], x, &mut caches)?;
        r.release(&[WARM_UP_ID])?;
    } else {
        let (_l, mut caches) = pools.run(1.0, || model.lm.prefill(std::slice::from_ref(&x)));
        let x = model.lm.embed_tokens(&[4], device);
        let _ = pools.run(1.0, || model.lm.decode(x, &mut caches));
    }
    Ok(())
}

fn serve<B: Backend>(
    arch: &ModelArch,
    opts: &WorkerOptions,
    device: &B::Device,
    reader: TcpStream,
    writer: Shared<TcpStream>,
) -> Result<(), WorkerError> {
    let t0 = Instant::now();
    let (model, ranks) = load_model::<B>(arch, opts, device)?;
    let ranks = ranks.as_ref();
    let text = TextIds {
        vocab: arch.llm.vocab,
        seed: opts.seed,
    };
    // built before any pass pins the process, so its threads start with the
    // worker's whole mask and keep it (see `Preprocessor::new`)
    let preprocessor = Arc::new(Preprocessor::new(
        arch.clone(),
        opts.seed,
        opts.preprocess_threads,
    )?);
    let mut pools = Pools::new(opts.threads, opts.cores, preprocessor.thread_ids.clone());
    warm_up(&model, arch, opts, ranks, &mut pools, device)?;
    let sync = || B::sync(device).map_err(WorkerError::Sync);
    sync()?;
    send(
        &writer,
        &FromWorker::Ready {
            load_s: t0.elapsed().as_secs_f64(),
        },
    )?;
    let embeddings: Shared<HashMap<RequestId, Matrix>> = Arc::default();
    let kv: Shared<HashMap<RequestId, (u32, KvData)>> = Arc::default();
    let (tx, rx) = mpsc::channel();
    {
        let (w, e, k, p) = (
            writer.clone(),
            embeddings.clone(),
            kv.clone(),
            preprocessor.clone(),
        );
        std::thread::Builder::new()
            .name("receiver".into())
            .spawn(move || receive(reader, w, e, k, p, tx))
            .map_err(WorkerError::ReceiverThread)?;
    }
    let mut seqs: HashMap<RequestId, Sequence<B>> = HashMap::new();
    let mut store = EmbeddingStore::default();
    let mut prefixes = PrefixStore::<B>::default();
    // the receiver drops its sender at shutdown or EOF, which ends this loop
    while let Ok(job) = rx.recv() {
        let reply = match job? {
            Job::Encode(requests, share) => {
                let on_device = || send(&writer, &FromWorker::EncodeGpuStarted);
                Some(pools.run(share, || {
                    encode(
                        &model,
                        &preprocessor,
                        &requests,
                        &mut store,
                        device,
                        on_device,
                        ranks.map(|r| (r, share)),
                    )
                })?)
            }
            Job::Prefill(requests, share) => {
                let mut batch = Vec::with_capacity(requests.len());
                {
                    let mut held = lock(&embeddings);
                    for r in requests {
                        let e = held.remove(&r.id);
                        batch.push((r, e));
                    }
                }
                Some(pools.run(share, || {
                    prefill(
                        &model,
                        text,
                        &batch,
                        &mut prefixes,
                        device,
                        ranks.map(|r| (r, share)),
                    )
                })?)
            }
            Job::DecodeStep(ids) => {
                for id in &ids {
                    if !seqs.contains_key(id) {
                        let (last, k) = lock(&kv).remove(id).ok_or(WorkerError::NoKv(*id))?;
                        let mut cache = kv_from_wire::<B>(k, device)?;
                        if let Some(r) = ranks {
                            cache = r.land_kv(*id, cache)?;
                        }
                        seqs.insert(*id, Sequence { cache, last });
                    }
                }
                Some(decode_step(&model, &mut seqs, &ids, device, ranks)?)
            }
            Job::PrefixOps(ops) => {
                prefixes.apply(ops);
                None
            }
            // a finished or aborted request: whatever this worker holds for
            // it (in order after the jobs sent before, which may still use it)
            Job::Release(ids) => {
                if let Some(r) = ranks {
                    r.release(&ids)?;
                }
                for id in ids {
                    prefixes.pending.remove(&id);
                    seqs.remove(&id);
                    lock(&kv).remove(&id);
                    lock(&embeddings).remove(&id);
                    preprocessor.discard(id);
                }
                None
            }
            Job::ReplicaStep {
                encode,
                prefill,
                decode,
            } => {
                let step = ReplicaWork {
                    encode: &encode,
                    prefill,
                    decode: &decode,
                };
                Some(pools.run(1.0, || {
                    replica_step(&model, &preprocessor, text, &mut seqs, step, device)
                })?)
            }
        };
        if let Some(r) = reply {
            sync()?;
            send(&writer, &r)?;
        }
    }
    Ok(())
}

/// Request `id`'s item `j` (of shape `item`) prepared for the encoder: its
/// own media, or synthetic media when none came.
fn prepare_item(
    arch: &ModelArch,
    item_seed: u64,
    id: RequestId,
    item: &easerve_sched::MmItem,
    media: Option<WireMedia>,
) -> Result<HostItem, WorkerError> {
    let media = match media {
        Some(m) => m
            .into_media()
            .map_err(|error| WorkerError::Media { id, error })?,
        None => Media::synthetic(item, item_seed),
    };
    prepare(arch, &media)
        .map(|p| p.item)
        .map_err(|error| WorkerError::Input { id, error })
}

/// What became of a request sent ahead of its pass.
enum Slot {
    /// Queued or being prepared on the preprocessing pool.
    Pending,
    /// Its items prepared, in order (or why they could not be); `None` for
    /// an item whose stored embeddings are reused unprepared.
    Ready(Result<Vec<Option<HostItem>>, WorkerError>),
    /// Held for its pass to prepare (a worker without preprocessing threads).
    Held(EncodeRequest),
    /// Released while being prepared: dropped when its preparation ends.
    Discarded,
}

/// An encode worker's preprocessing ahead of its passes: requests sent by
/// [`ToWorker::Preprocess`] are prepared on a pool of their own (each
/// request's items in parallel, queued requests concurrently) and held by
/// request id until their pass takes them ([`Preprocessor::take`]).
///
/// Affinity: the pool's threads keep the worker's whole allowed core set.
/// They are started before any pass pins the process, so they inherit that
/// mask, and a pass pins every thread but these ([`Pools`]). Preprocessing is
/// host work beside the device, as the twin prices it (threads of their own,
/// not the pass's SM share); pinning it to the pass's cores would charge it to
/// the encode share, and to the other side would take cores from the local
/// prefill worker. Left to the OS, it runs wherever a core is free.
struct Preprocessor {
    arch: ModelArch,
    seed: u64,
    /// `None`: no preprocessing threads; requests sent ahead are held and
    /// their pass prepares them (serial).
    pool: Option<rayon::ThreadPool>,
    /// Kernel ids of the pool's threads.
    thread_ids: Vec<i32>,
    slots: Mutex<HashMap<RequestId, Slot>>,
    ready: Condvar,
}

impl Preprocessor {
    fn new(arch: ModelArch, seed: u64, threads: usize) -> Result<Preprocessor, WorkerError> {
        let pool = if threads == 0 {
            None
        } else {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|k| format!("preprocess-{k}"))
                    .build()
                    .map_err(|error| WorkerError::PreprocessPool { threads, error })?,
            )
        };
        // every thread has started once a broadcast has run on each
        let thread_ids = pool.as_ref().map_or_else(Vec::new, |p| {
            p.broadcast(|_| easerve_exec::device::thread_id())
        });
        Ok(Preprocessor {
            arch,
            seed,
            pool,
            thread_ids,
            slots: Mutex::new(HashMap::new()),
            ready: Condvar::new(),
        })
    }

    /// Start preparing `r`'s items (or hold `r`, without a pool). Returns
    /// at once; the slot exists before it does.
    fn submit(self: &Arc<Self>, r: EncodeRequest) {
        let id = r.id;
        let Some(pool) = &self.pool else {
            lock(&self.slots).insert(id, Slot::Held(r));
            return;
        };
        lock(&self.slots).insert(id, Slot::Pending);
        let me = self.clone();
        pool.spawn(move || {
            use rayon::prelude::*;
            let skip = unprepared(&r);
            let seeds: Vec<u64> = (0..r.items.len())
                .map(|j| item_seed(me.seed, &r, j))
                .collect();
            let EncodeRequest {
                id, items, media, ..
            } = r;
            let mut media = media.into_iter();
            let work: Vec<(usize, &easerve_sched::MmItem, Option<WireMedia>)> = items
                .iter()
                .enumerate()
                .map(|(j, it)| (j, it, media.next()))
                .collect();
            let out = work
                .into_par_iter()
                .map(|(j, it, m)| match skip(j) {
                    true => Ok(None),
                    false => prepare_item(&me.arch, seeds[j], id, it, m).map(Some),
                })
                .collect::<Result<Vec<_>, _>>();
            let mut slots = lock(&me.slots);
            if matches!(slots.get(&id), Some(Slot::Discarded)) {
                slots.remove(&id);
            } else {
                slots.insert(id, Slot::Ready(out));
            }
            drop(slots);
            me.ready.notify_all();
        });
    }

    /// Request `r`'s prepared items: those sent ahead (waiting while they are
    /// in progress), else prepared here and now from `r`'s own media.
    fn take(&self, r: &EncodeRequest) -> Result<Vec<Option<HostItem>>, WorkerError> {
        let mut slots = lock(&self.slots);
        loop {
            match slots.remove(&r.id) {
                Some(Slot::Pending) => {
                    slots.insert(r.id, Slot::Pending);
                    slots = self.ready.wait(slots).unwrap_or_else(|p| p.into_inner());
                }
                Some(Slot::Ready(items)) => return items,
                Some(Slot::Held(held)) => {
                    drop(slots);
                    return self.prepare_here(held);
                }
                None | Some(Slot::Discarded) => {
                    drop(slots);
                    return self.prepare_here(r.clone());
                }
            }
        }
    }

    /// Drop what is held for request `id` (it was aborted): its items now,
    /// or once their preparation in progress ends.
    fn discard(&self, id: RequestId) {
        let mut slots = lock(&self.slots);
        if let Some(Slot::Pending) = slots.remove(&id) {
            slots.insert(id, Slot::Discarded);
        }
    }

    /// Prepare `r`'s items one after another on this thread.
    fn prepare_here(&self, r: EncodeRequest) -> Result<Vec<Option<HostItem>>, WorkerError> {
        let skip = unprepared(&r);
        let seeds: Vec<u64> = (0..r.items.len())
            .map(|j| item_seed(self.seed, &r, j))
            .collect();
        let mut media = r.media.into_iter();
        r.items
            .iter()
            .enumerate()
            .map(|(j, it)| {
                let m = media.next();
                match skip(j) {
                    true => Ok(None),
                    false => prepare_item(&self.arch, seeds[j], r.id, it, m).map(Some),
                }
            })
            .collect()
    }
}

/// Which of `r`'s items are not prepared: those whose stored embeddings
/// are reused when items are keyed by their raw bytes (otherwise every
/// item is prepared, as vLLM hashes the processed item).
fn unprepared(r: &EncodeRequest) -> impl Fn(usize) -> bool {
    let hits: Vec<bool> = match r.prepare_hits {
        true => Vec::new(),
        false => r.cache.iter().map(|o| o.hit).collect(),
    };
    move |j| hits.get(j).copied().unwrap_or(false)
}

/// The embeddings an encode worker keeps for the encoder cache, keyed by
/// item content (`ItemOp::key`): exactly those the controller's
/// `EncoderCache` directory says this worker holds, since the worker
/// applies the [`easerve_sched::ItemOp`]s of its passes in placement order
/// (store a miss, drop what its entry evicted). It decides nothing.
#[derive(Default)]
pub struct EmbeddingStore {
    /// `[llm_tokens, d]` row-major per item.
    items: HashMap<u64, Arc<Vec<f32>>>,
    /// Items encoded by this worker's passes.
    pub encoded: u64,
    /// Items whose stored embeddings a pass reused.
    pub reused: u64,
    /// Items whose embeddings came from the shared store with the request.
    pub fetched: u64,
}

impl EmbeddingStore {
    /// Items held.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// The items of an encode pass that the encoder cache does not hold, on
/// `device`, in order; with `tp`, also their copies for the follower ranks
/// (LLaVA-NeXT anyres images only).
///
/// # Errors
/// An item whose prepared count is wrong; at `tp`, an item of another
/// encoder family.
#[allow(clippy::type_complexity)]
fn pass_items<B: Backend>(
    preprocessor: &Preprocessor,
    requests: &[EncodeRequest],
    device: &B::Device,
    tp: bool,
) -> Result<(Vec<EncoderItem<B>>, Vec<crate::tp::AnyresTiles>), WorkerError> {
    let mut items = Vec::new();
    let mut wire = Vec::new();
    for r in requests {
        let host = preprocessor.take(r)?;
        if host.len() != r.items.len() {
            return Err(WorkerError::ItemCount {
                id: r.id,
                prepared: host.len(),
                items: r.items.len(),
            });
        }
        for (j, h) in host.iter().enumerate() {
            if !r.cache.get(j).is_some_and(|o| o.hit) {
                let h = h.as_ref().ok_or(WorkerError::ItemCount {
                    id: r.id,
                    prepared: j,
                    items: r.items.len(),
                })?;
                items.push(crate::items::to_device::<B>(h, device));
                if tp {
                    wire.push(crate::tp::AnyresTiles::of(h).ok_or(WorkerError::Ranks(
                        "only LLaVA-NeXT anyres images encode at TP > 1".into(),
                    ))?);
                }
            }
        }
    }
    Ok((items, wire))
}

/// One encode pass over `requests`: their items (prepared ahead, or here),
/// then the encoder over the items the encoder cache does not hold; the
/// others' embeddings come from `store`, which keeps what the pass's
/// [`easerve_sched::ItemOp`]s say. `preprocess_s` is the time from the
/// pass's start until its items are ready on the device: what it waited for
/// and spent on preprocessing. With `ranks` (a TP worker's ranks and the
/// pass's thread share), every rank runs its shard of the encoder.
///
/// # Errors
/// A model or read-back failure; an item whose prepared count is wrong; a
/// reused item this worker does not hold ([`WorkerError::NotHeld`]); an
/// all-reduce that failed.
fn encode<B: Backend>(
    model: &MultimodalModel<B>,
    preprocessor: &Preprocessor,
    requests: &[EncodeRequest],
    store: &mut EmbeddingStore,
    device: &B::Device,
    on_device: impl FnOnce() -> Result<(), WorkerError>,
    ranks: Option<(&crate::tp::Ranks, f64)>,
) -> Result<FromWorker, WorkerError> {
    let t0 = Instant::now();
    let (items, wire) = pass_items::<B>(preprocessor, requests, device, ranks.is_some())?;
    let preprocess_s = t0.elapsed().as_secs_f64();
    on_device()?;
    store.encoded += items.len() as u64;
    let mut out = match ranks {
        Some((r, share)) => r.encode(model, &items, wire, share)?,
        None => model.encode(&items).map_err(WorkerError::Model)?,
    }
    .into_iter();
    let d = model.lm.d_model();
    let mut embeddings = Vec::with_capacity(requests.len());
    let mut item_rows = Vec::with_capacity(requests.len());
    for r in requests {
        let mut data = Vec::new();
        let mut rows = Vec::with_capacity(r.items.len());
        for j in 0..r.items.len() {
            let op = r.cache.get(j);
            let e = match op {
                // the shared store's copy, sent with the request
                Some(o) if o.fetched => {
                    store.fetched += 1;
                    let f = r.fetched.iter().find(|f| f.0 == o.key);
                    Arc::new(
                        f.ok_or(WorkerError::NotHeld {
                            id: r.id,
                            key: o.key,
                        })?
                        .1
                        .clone(),
                    )
                }
                Some(o) if o.hit => {
                    store.reused += 1;
                    store
                        .items
                        .get(&o.key)
                        .cloned()
                        .ok_or(WorkerError::NotHeld {
                            id: r.id,
                            key: o.key,
                        })?
                }
                _ => Arc::new(to_vec_f32(out.next().ok_or(WorkerError::ItemCount {
                    id: r.id,
                    prepared: j,
                    items: r.items.len(),
                })?)?),
            };
            // an encoded or fetched item enters this worker's cache
            if let Some(o) = op.filter(|o| !o.hit || o.fetched) {
                for k in &o.evicted {
                    store.items.remove(k);
                }
                if o.stored {
                    store.items.insert(o.key, e.clone());
                }
            }
            rows.push((e.len() / d.max(1)) as u32);
            data.extend_from_slice(&e);
        }
        item_rows.push(rows);
        embeddings.push((
            r.id,
            Matrix {
                rows: (data.len() / d.max(1)) as u32,
                cols: d as u32,
                data,
            },
        ));
    }
    Ok(FromWorker::EncodeDone {
        embeddings,
        preprocess_s,
        compute_s: t0.elapsed().as_secs_f64(),
        item_rows,
    })
}

/// The KV caches a prefill worker keeps for the prefix cache: those of
/// finished prefills until the controller says under which chain links to
/// keep them (`pending`), and those kept under each link with the prompt
/// tokens up to its end. Exactly what the controller's `PrefixCache`
/// directory says this worker holds, since it applies the directory's
/// [`easerve_sched::PrefixOp`]s in order; it decides nothing.
///
/// A pending cache whose request the controller never keeps (it was
/// aborted, or its part of the pass was a chunk, between the pass's end and
/// the controller hearing of it) is dropped by this rule: the controller
/// hears a worker's passes in the order they end and sends the keeps of one
/// pass's requests before anything it decides later, so once a request of
/// pass `k` is kept, a cache still pending from a pass before `k` never
/// will be. [`ToWorker::Release`] drops one at once. So the worker holds
/// pending caches of at most its last passes the controller has not
/// answered yet, never a growing pile.
pub struct PrefixStore<B: Backend> {
    /// Each pending cache with the number of the pass that computed it.
    pending: HashMap<RequestId, (u64, KvCache<B>)>,
    links: HashMap<u64, (KvCache<B>, u64)>,
    /// Prefill passes run so far (numbers the pending caches).
    passes: u64,
    /// Prompt tokens whose prefill a cached head saved.
    pub reused_tokens: u64,
}

impl<B: Backend> Default for PrefixStore<B> {
    fn default() -> Self {
        PrefixStore {
            pending: HashMap::new(),
            links: HashMap::new(),
            passes: 0,
            reused_tokens: 0,
        }
    }
}

impl<B: Backend> PrefixStore<B> {
    /// Hold the KV caches of the pass that just ended until the controller
    /// keeps them (or the rule above drops them).
    fn hold(&mut self, caches: impl IntoIterator<Item = (RequestId, KvCache<B>)>) {
        self.passes += 1;
        let pass = self.passes;
        self.pending
            .extend(caches.into_iter().map(|(id, c)| (id, (pass, c))));
    }

    /// Requests whose KV caches wait for the controller's word.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Apply the directory's operations in order.
    pub fn apply(&mut self, ops: Vec<easerve_sched::PrefixOp>) {
        use easerve_sched::PrefixOp;
        for op in ops {
            match op {
                PrefixOp::Keep { id, links } => {
                    if let Some((pass, cache)) = self.pending.remove(&id) {
                        // the controller has answered every earlier pass
                        self.pending.retain(|_, (p, _)| *p >= pass);
                        for (key, end) in links {
                            self.links.insert(key, (cache.clone(), end));
                        }
                    }
                }
                PrefixOp::Drop { keys } => {
                    for k in keys {
                        self.links.remove(&k);
                    }
                }
            }
        }
    }

    /// Links kept.
    pub fn len(&self) -> usize {
        self.links.len()
    }

    /// Whether no link is kept.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// The first `tokens` positions kept under `key`, as a cache to extend.
    fn head(&self, id: RequestId, key: u64, tokens: usize) -> Result<KvCache<B>, WorkerError> {
        let (c, _) = self
            .links
            .get(&key)
            .filter(|(c, end)| *end as usize >= tokens && c.len >= tokens)
            .ok_or(WorkerError::PrefixNotHeld { id, key })?;
        let layers = c.k.len();
        Ok(KvCache::from_positions(
            (0..layers)
                .map(|l| c.keys(l).narrow(1, 0, tokens))
                .collect(),
            (0..layers)
                .map(|l| c.values(l).narrow(1, 0, tokens))
                .collect(),
            1,
        ))
    }
}

/// One prefill batch: the requests without a cached head prefilled together,
/// each request with one alone, its uncached suffix over the kept head
/// (`DecoderLm::prefill_cached`); the first token and KV cache of each.
fn prefill<B: Backend>(
    model: &MultimodalModel<B>,
    text: TextIds,
    batch: &[(PrefillRequest, Option<Matrix>)],
    prefixes: &mut PrefixStore<B>,
    device: &B::Device,
    ranks: Option<(&crate::tp::Ranks, f64)>,
) -> Result<FromWorker, WorkerError> {
    let t0 = Instant::now();
    // a prefix hit prefills its suffix over the kept KV cache on one rank; a
    // tensor-parallel worker's ranks hold shards, so it prefills the whole
    // prompt (the same tokens, the saving forgone)
    let (hits, fresh): (Vec<_>, Vec<_>) = batch
        .iter()
        .cloned()
        .partition(|(r, _)| r.cached > 0 && ranks.is_none());
    let mut done = Vec::with_capacity(batch.len());
    if !fresh.is_empty() {
        done.extend(prefill_caches(model, text, &fresh, device, ranks)?);
    }
    for (r, emb) in &hits {
        let seq = prompt_sequence(model, text, r, emb.as_ref(), device)?;
        let n = seq.dims()[0];
        let m = (r.cached as usize).min(n - 1);
        let past = prefixes.head(r.id, r.cached_key, m)?;
        let (logits, cache) = model.lm.prefill_cached(seq.narrow(0, m, n - m), &past);
        prefixes.reused_tokens += m as u64;
        done.push((r.id, argmax_rows(logits)?[0], cache));
    }
    let mut outputs = Vec::with_capacity(batch.len());
    let mut kept = Vec::new();
    for (r, _) in batch {
        let k = done.iter().position(|d| d.0 == r.id).expect("prefilled");
        let (id, tok, cache) = done.swap_remove(k);
        if r.keep {
            kept.push((id, cache.clone()));
        }
        outputs.push((id, tok, kv_to_wire(cache)?));
    }
    if !kept.is_empty() {
        prefixes.hold(kept);
    }
    Ok(FromWorker::PrefillDone {
        outputs,
        compute_s: t0.elapsed().as_secs_f64(),
    })
}

/// Prefill `batch` (each request's embeddings, if any, then its text
/// prompt): `(request, first token, KV cache)` per request. With `ranks`
/// (a TP worker's rank 0, and the pass's thread share), every rank runs the
/// pass and the caches are whole (every rank's KV heads).
fn prefill_caches<B: Backend>(
    model: &MultimodalModel<B>,
    text: TextIds,
    batch: &[(PrefillRequest, Option<Matrix>)],
    device: &B::Device,
    ranks: Option<(&crate::tp::Ranks, f64)>,
) -> Result<Vec<(RequestId, u32, KvCache<B>)>, WorkerError> {
    let seqs = batch
        .iter()
        .map(|(r, emb)| prompt_sequence(model, text, r, emb.as_ref(), device))
        .collect::<Result<Vec<_>, _>>()?;
    let (logits, caches) = match ranks {
        Some((r, share)) => r.prefill(&model.lm, &seqs, share)?,
        None => model.lm.prefill(&seqs),
    };
    let first = argmax_rows(logits)?;
    Ok(batch
        .iter()
        .zip(first)
        .zip(caches)
        .map(|(((r, _), tok), cache)| (r.id, tok, cache))
        .collect())
}

/// Request `r`'s prompt as the LLM takes it, `[tokens, d]`: its pieces in
/// order ([`PrefillRequest::prompt`]: each item's rows of `emb`, each text
/// segment's tokens), or without them its embeddings (if any), then its
/// text tokens (at least one without embeddings).
///
/// Errors: embeddings not `d` wide, or whose rows are not the items' tokens
/// the prompt names.
fn prompt_sequence<B: Backend>(
    model: &MultimodalModel<B>,
    text: TextIds,
    r: &PrefillRequest,
    emb: Option<&Matrix>,
    device: &B::Device,
) -> Result<Tensor<B, 2>, WorkerError> {
    let d = model.lm.d_model();
    let rows = match emb {
        Some(m) if m.cols as usize != d || m.data.len() != (m.rows * m.cols) as usize => {
            return Err(WorkerError::EmbeddingsWidth {
                id: r.id,
                rows: m.rows,
                cols: m.cols,
                width: d,
            })
        }
        Some(m) => m.rows as usize,
        None => 0,
    };
    let embedded = |from: usize, n: usize| {
        let m = emb.expect("rows only with embeddings");
        Tensor::<B, 2>::from_data(
            TensorData::new(m.data[from * d..(from + n) * d].to_vec(), [n, d]),
            device,
        )
    };
    let mut parts = Vec::new();
    if r.prompt.is_empty() {
        if rows > 0 {
            parts.push(embedded(0, rows));
        }
        let n = r.prompt_tokens.max(u32::from(parts.is_empty()));
        let ids = text.of_request(r.id, n);
        if !ids.is_empty() {
            parts.push(model.lm.embed_tokens(&ids, device));
        }
        return Ok(Tensor::cat(parts, 0));
    }
    let mut row = 0;
    for part in &r.prompt {
        match *part {
            PromptPart::Item { tokens } => {
                let n = tokens as usize;
                if row + n > rows {
                    return Err(WorkerError::PromptRows {
                        id: r.id,
                        rows,
                        items: item_tokens(&r.prompt),
                    });
                }
                if n > 0 {
                    parts.push(embedded(row, n));
                }
                row += n;
            }
            PromptPart::Text { id, tokens } if tokens > 0 => {
                parts.push(model.lm.embed_tokens(&text.of_segment(id, tokens), device));
            }
            PromptPart::Text { .. } => {}
        }
    }
    if row != rows || parts.is_empty() {
        return Err(WorkerError::PromptRows {
            id: r.id,
            rows,
            items: item_tokens(&r.prompt),
        });
    }
    Ok(Tensor::cat(parts, 0))
}

/// The item tokens `prompt` names.
fn item_tokens(prompt: &[PromptPart]) -> usize {
    prompt
        .iter()
        .map(|p| match p {
            PromptPart::Item { tokens } => *tokens as usize,
            PromptPart::Text { .. } => 0,
        })
        .sum()
}

/// One aggregated replica's iteration (see [`ToWorker::ReplicaStep`]).
struct ReplicaWork<'a> {
    encode: &'a [EncodeRequest],
    prefill: Vec<PrefillRequest>,
    decode: &'a [RequestId],
}

/// Run `w` on a replica that holds the running sequences `seqs`: encode,
/// then prefill on this iteration's embeddings (the new sequences join
/// `seqs`), then one decode step over those that ran before; sequences in
/// neither list are freed first.
fn replica_step<B: Backend>(
    model: &MultimodalModel<B>,
    preprocessor: &Preprocessor,
    text: TextIds,
    seqs: &mut HashMap<RequestId, Sequence<B>>,
    w: ReplicaWork<'_>,
    device: &B::Device,
) -> Result<FromWorker, WorkerError> {
    let t0 = Instant::now();
    let mut embeddings: HashMap<RequestId, Matrix> = HashMap::new();
    if !w.encode.is_empty() {
        if let FromWorker::EncodeDone { embeddings: e, .. } = encode(
            model,
            preprocessor,
            w.encode,
            &mut EmbeddingStore::default(),
            device,
            || Ok(()),
            None,
        )? {
            embeddings.extend(e);
        }
    }
    let encode_s = t0.elapsed().as_secs_f64();
    let keep: std::collections::HashSet<RequestId> = w
        .prefill
        .iter()
        .map(|r| r.id)
        .chain(w.decode.iter().copied())
        .collect();
    seqs.retain(|id, _| keep.contains(id));
    let mut tokens = Vec::with_capacity(keep.len());
    if !w.prefill.is_empty() {
        let batch: Vec<(PrefillRequest, Option<Matrix>)> = w
            .prefill
            .into_iter()
            .map(|r| {
                let e = embeddings.remove(&r.id);
                (r, e)
            })
            .collect();
        for (id, last, cache) in prefill_caches(model, text, &batch, device, None)? {
            tokens.push((id, last));
            seqs.insert(id, Sequence { cache, last });
        }
    }
    if !w.decode.is_empty() {
        if let FromWorker::DecodeDone { tokens: t, .. } =
            decode_step(model, seqs, w.decode, device, None)?
        {
            tokens.extend(t);
        }
    }
    Ok(FromWorker::ReplicaStepDone {
        tokens,
        encode_s,
        compute_s: t0.elapsed().as_secs_f64(),
    })
}

fn decode_step<B: Backend>(
    model: &MultimodalModel<B>,
    seqs: &mut HashMap<RequestId, Sequence<B>>,
    ids: &[RequestId],
    device: &B::Device,
    ranks: Option<&crate::tp::Ranks>,
) -> Result<FromWorker, WorkerError> {
    let t0 = Instant::now();
    let mut batch = Vec::with_capacity(ids.len());
    for id in ids {
        let s = seqs.remove(id).ok_or(WorkerError::NoKv(*id))?;
        batch.push((*id, s));
    }
    let last: Vec<u32> = batch.iter().map(|(_, s)| s.last).collect();
    let x = model.lm.embed_tokens(&last, device);
    // the caches are moved, not cloned: a decode step writes its position in
    // place only into a buffer it alone holds
    let (ids, mut caches): (Vec<RequestId>, Vec<KvCache<B>>) =
        batch.into_iter().map(|(id, s)| (id, s.cache)).unzip();
    let logits = match ranks {
        Some(r) => r.decode(&model.lm, &ids, x, &mut caches)?,
        None => model.lm.decode(x, &mut caches),
    };
    let next = argmax_rows(logits)?;
    let mut tokens = Vec::with_capacity(ids.len());
    for ((id, cache), tok) in ids.into_iter().zip(caches).zip(next) {
        tokens.push((id, tok));
        seqs.insert(id, Sequence { cache, last: tok });
    }
    Ok(FromWorker::DecodeDone {
        tokens,
        compute_s: t0.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;
    use easerve_sched::MmItem;
    use std::time::Duration;

    const SEED: u64 = 11;

    fn arch() -> ModelArch {
        ModelArch::preset("tiny-image").unwrap()
    }

    /// Three requests of two images each, with media of their own (unlike
    /// the synthetic media the worker would make for them), or none.
    fn requests(with_media: bool) -> Vec<EncodeRequest> {
        let shapes = [(224, 224), (112, 224), (240, 320)];
        (0..3u64)
            .map(|k| {
                let items: Vec<MmItem> = (0..2)
                    .map(|j| {
                        let (height, width) = shapes[(k as usize + j) % shapes.len()];
                        MmItem::Image { height, width }
                    })
                    .collect();
                let media = if with_media {
                    items
                        .iter()
                        .enumerate()
                        .map(|(j, it)| {
                            WireMedia::of(&Media::synthetic(it, 1000 + 10 * k + j as u64))
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                EncodeRequest {
                    id: 5 + k,
                    items,
                    media,
                    cache: Vec::new(),
                    keys: Vec::new(),
                    prepare_hits: false,
                    fetched: Vec::new(),
                }
            })
            .collect()
    }

    fn without_media(rs: &[EncodeRequest]) -> Vec<EncodeRequest> {
        rs.iter()
            .map(|r| EncodeRequest {
                media: Vec::new(),
                ..r.clone()
            })
            .collect()
    }

    /// A pass's embeddings and preprocessing seconds.
    fn pass(
        model: &MultimodalModel<NdArray>,
        pre: &Preprocessor,
        rs: &[EncodeRequest],
    ) -> (Vec<(RequestId, Matrix)>, f64) {
        pass_with(model, pre, rs, &mut EmbeddingStore::default())
    }

    /// A pass's embeddings and preprocessing seconds, over `store`.
    fn pass_with(
        model: &MultimodalModel<NdArray>,
        pre: &Preprocessor,
        rs: &[EncodeRequest],
        store: &mut EmbeddingStore,
    ) -> (Vec<(RequestId, Matrix)>, f64) {
        match encode(model, pre, rs, store, &Default::default(), || Ok(()), None).unwrap() {
            FromWorker::EncodeDone {
                embeddings,
                preprocess_s,
                ..
            } => (embeddings, preprocess_s),
            other => panic!("{other:?}"),
        }
    }

    fn text_ids() -> TextIds {
        TextIds {
            vocab: arch().llm.vocab,
            seed: SEED,
        }
    }

    fn model() -> MultimodalModel<NdArray> {
        let device = Default::default();
        <NdArray as Backend>::seed(&device, SEED);
        MultimodalModel::from_arch(&arch(), &device).unwrap()
    }

    /// Passes of requests whose items are drawn from a pool of three
    /// (content ids 1–3), with the encoder cache's operations as the
    /// controller's directory decides them for a cache of `capacity` items
    /// (`None`: the cache off), raw keying when `raw`.
    fn pooled_passes(capacity: Option<u64>, raw: bool) -> Vec<Vec<EncodeRequest>> {
        let shape = |k: u64| match k {
            1 => (224, 224),
            2 => (112, 224),
            _ => (240, 320),
        };
        let mut dir = capacity.map(|c| {
            easerve_sched::EncoderCache::new(
                1,
                easerve_sched::EncoderCacheConfig {
                    capacity_bytes: c,
                    bytes_per_token: 1.0,
                    hash_raw_bytes: raw,
                },
            )
        });
        let passes: [&[&[u64]]; 3] = [&[&[1, 2], &[1, 3]], &[&[2, 1]], &[&[3, 3], &[2, 1], &[1]]];
        let mut id = 0;
        passes
            .iter()
            .map(|pass| {
                pass.iter()
                    .map(|keys| {
                        id += 1;
                        let mut cache = Vec::new();
                        if let Some(d) = dir.as_mut() {
                            d.lookup_ops(0, keys.iter().map(|&k| (k, 1)), Some(&mut cache));
                        }
                        EncodeRequest {
                            id,
                            items: keys
                                .iter()
                                .map(|&k| {
                                    let (height, width) = shape(k);
                                    MmItem::Image { height, width }
                                })
                                .collect(),
                            media: Vec::new(),
                            cache,
                            keys: keys.to_vec(),
                            prepare_hits: !raw,
                            fetched: Vec::new(),
                        }
                    })
                    .collect()
            })
            .collect()
    }

    /// Runs 0.5–1 s (three passes of the tiny encoder, four times).
    #[test]
    fn the_encoder_cache_reuses_embeddings_equal_to_those_it_would_compute() {
        let model = model();
        let pre = Preprocessor::new(arch(), SEED, 0).unwrap();
        let run = |capacity, raw| {
            let mut store = EmbeddingStore::default();
            let out: Vec<_> = pooled_passes(capacity, raw)
                .iter()
                .flat_map(|p| pass_with(&model, &pre, p, &mut store).0)
                .collect();
            (out, store)
        };
        let (off, s0) = run(None, false);
        assert_eq!(s0.encoded, 11);
        // room for every item: each content id is encoded once
        let (all, s) = run(Some(3), false);
        assert_eq!(all, off);
        assert_eq!((s.encoded, s.reused, s.len()), (3, 8, 3));
        // hits prepare nothing with raw keying, and reuse the same embeddings
        let (raw, _) = run(Some(3), true);
        assert_eq!(raw, off);
        // room for two: evictions, still the same embeddings; the store holds
        // what the directory does, so no hit ever misses its embeddings
        let (two, s) = run(Some(2), false);
        assert_eq!(two, off);
        assert_eq!(s.encoded + s.reused, 11);
        assert!(s.encoded > 3 && s.len() == 2, "{} {}", s.encoded, s.len());
        // equal ids give equal media: requests 1, 2 and 6 open with item 1
        let one = &off[5].1.data;
        assert!(off[0].1.data.starts_with(one) && off[1].1.data.starts_with(one));
    }

    /// An item the shared store held comes with the request: the pass
    /// encodes only the others, sends the same embeddings, and keeps the
    /// fetched item in its own cache when the controller says so. Under 1 s.
    #[test]
    fn embeddings_fetched_from_the_store_replace_the_encode() {
        let model = model();
        let pre = Preprocessor::new(arch(), SEED, 0).unwrap();
        let mut reqs = pooled_passes(None, false).remove(0);
        reqs.truncate(1);
        let mut store = EmbeddingStore::default();
        let done = encode(
            &model,
            &pre,
            &reqs,
            &mut store,
            &Default::default(),
            || Ok(()),
            None,
        );
        let FromWorker::EncodeDone {
            embeddings,
            item_rows,
            ..
        } = done.unwrap()
        else {
            panic!("not an encode")
        };
        let m = &embeddings[0].1;
        let first = item_rows[0][0] as usize * m.cols as usize;
        // item 1 (the first) is in the store: its rows go with the request
        let op = |key, fetched| easerve_sched::ItemOp {
            key,
            hit: fetched,
            fetched,
            stored: true,
            evicted: Vec::new(),
        };
        let mut r = reqs[0].clone();
        r.cache = vec![op(1, true), op(2, false)];
        r.fetched = vec![(1, m.data[..first].to_vec())];
        let mut store = EmbeddingStore::default();
        let (got, _) = pass_with(&model, &pre, &[r.clone()], &mut store);
        assert_eq!(got, embeddings);
        assert_eq!((store.encoded, store.fetched, store.len()), (1, 1, 2));
        // without its rows the pass refuses rather than encode in secret
        r.fetched.clear();
        let err = encode(
            &model,
            &pre,
            &[r],
            &mut store,
            &Default::default(),
            || Ok(()),
            None,
        );
        assert!(matches!(err, Err(WorkerError::NotHeld { key: 1, .. })));
    }

    #[test]
    fn a_pass_sent_ahead_encodes_exactly_what_the_serial_pass_does() {
        let model = model();
        let rs = requests(true);
        let serial = Arc::new(Preprocessor::new(arch(), SEED, 0).unwrap());
        let (want, _) = pass(&model, &serial, &rs);
        assert_eq!(
            want.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
            [5, 6, 7]
        );
        // the media matter: synthetic media of the same shapes encode otherwise,
        // so a pass that fell back to them would be caught
        let (synthetic, _) = pass(&model, &serial, &without_media(&rs));
        assert_ne!(synthetic, want);

        for threads in [0, 1, 3] {
            let pre = Arc::new(Preprocessor::new(arch(), SEED, threads).unwrap());
            assert_eq!(pre.thread_ids.len(), threads);
            for r in rs.clone() {
                pre.submit(r);
            }
            // the pass names the requests again without their media
            let (got, _) = pass(&model, &pre, &without_media(&rs));
            assert_eq!(got, want, "{threads} preprocessing threads");
            assert!(lock(&pre.slots).is_empty(), "the pass took every request");
        }

        // a request never sent ahead is still prepared by its pass
        let pre = Arc::new(Preprocessor::new(arch(), SEED, 2).unwrap());
        pre.submit(rs[0].clone());
        let mixed = [without_media(&rs[..1]), rs[1..].to_vec()].concat();
        assert_eq!(pass(&model, &pre, &mixed).0, want);
    }

    /// An aggregated replica's iteration computes what the disaggregated
    /// stages compute: the first tokens of a separate encode pass and prefill
    /// batch, then the decode tokens of separate decode steps; a finished
    /// sequence's cache is freed.
    #[test]
    fn a_replica_iteration_computes_what_the_separate_stages_do() {
        let model = model();
        let device = Default::default();
        let pre = Preprocessor::new(arch(), SEED, 0).unwrap();
        let rs = requests(true);
        let prompts: Vec<PrefillRequest> = rs
            .iter()
            .map(|r| PrefillRequest {
                id: r.id,
                prompt_tokens: 4,
                prompt: Vec::new(),
                cached: 0,
                cached_key: 0,
                keep: false,
            })
            .collect();
        // the stages one by one
        let (emb, _) = pass(&model, &pre, &rs[..2]);
        let batch: Vec<(PrefillRequest, Option<Matrix>)> = prompts[..2]
            .iter()
            .cloned()
            .zip(emb.into_iter().map(|(_, m)| Some(m)))
            .collect();
        let mut want: HashMap<RequestId, Sequence<NdArray>> = HashMap::new();
        let mut first = Vec::new();
        for (id, last, cache) in prefill_caches(&model, text_ids(), &batch, &device, None).unwrap()
        {
            first.push((id, last));
            want.insert(id, Sequence { cache, last });
        }
        let step = |seqs: &mut HashMap<RequestId, Sequence<NdArray>>, ids: &[RequestId]| {
            match decode_step(&model, seqs, ids, &device, None).unwrap() {
                FromWorker::DecodeDone { tokens, .. } => tokens,
                other => panic!("{other:?}"),
            }
        };
        let second = step(&mut want, &[5, 6]);
        // the replica: iteration 1 admits 5 and 6, iteration 2 steps them
        let mut seqs = HashMap::new();
        let run = |seqs: &mut HashMap<RequestId, Sequence<NdArray>>, w: ReplicaWork<'_>| {
            match replica_step(&model, &pre, text_ids(), seqs, w, &device).unwrap() {
                FromWorker::ReplicaStepDone {
                    tokens,
                    encode_s,
                    compute_s,
                } => {
                    assert!(0.0 <= encode_s && encode_s <= compute_s);
                    tokens
                }
                other => panic!("{other:?}"),
            }
        };
        let got = run(
            &mut seqs,
            ReplicaWork {
                encode: &rs[..2],
                prefill: prompts[..2].to_vec(),
                decode: &[],
            },
        );
        assert_eq!(got, first);
        let got = run(
            &mut seqs,
            ReplicaWork {
                encode: &[],
                prefill: Vec::new(),
                decode: &[5, 6],
            },
        );
        let mut sorted = got.clone();
        sorted.sort_unstable();
        let mut second = second;
        second.sort_unstable();
        assert_eq!(sorted, second);
        // 5 finished: iteration 3 admits 7 and steps 6 only
        let got = run(
            &mut seqs,
            ReplicaWork {
                encode: &rs[2..],
                prefill: prompts[2..].to_vec(),
                decode: &[6],
            },
        );
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[0].0, 7,
            "the admitted request's first token comes first"
        );
        let mut held: Vec<RequestId> = seqs.keys().copied().collect();
        held.sort_unstable();
        assert_eq!(held, [6, 7]);
    }

    #[test]
    fn a_pass_waits_for_preprocessing_still_in_progress() {
        let model = model();
        let rs = requests(true);
        let (want, _) = pass(
            &model,
            &Arc::new(Preprocessor::new(arch(), SEED, 0).unwrap()),
            &rs,
        );
        let pre = Arc::new(Preprocessor::new(arch(), SEED, 1).unwrap());
        // the only preprocessing thread is busy until the gate opens, so the
        // requests wait in its queue when their pass starts
        let (open, gate) = mpsc::channel::<()>();
        pre.pool.as_ref().unwrap().spawn(move || {
            let _ = gate.recv();
        });
        for r in rs.clone() {
            pre.submit(r);
        }
        assert!(lock(&pre.slots)
            .values()
            .all(|s| matches!(s, Slot::Pending)));
        let hold = Duration::from_millis(300);
        let opener = std::thread::spawn(move || {
            std::thread::sleep(hold);
            let at = Instant::now();
            open.send(()).unwrap();
            at
        });
        let mut on_device_at = None;
        let done = encode(
            &model,
            &pre,
            &without_media(&rs),
            &mut EmbeddingStore::default(),
            &Default::default(),
            || {
                on_device_at = Some(Instant::now());
                Ok(())
            },
            None,
        )
        .unwrap();
        let opened_at = opener.join().unwrap();
        assert!(
            on_device_at.unwrap() >= opened_at,
            "the pass went to the device before its items were prepared"
        );
        let FromWorker::EncodeDone {
            embeddings,
            preprocess_s,
            compute_s,
            ..
        } = done
        else {
            panic!("{done:?}")
        };
        assert_eq!(embeddings, want);
        // the wait counts as the pass's preprocessing
        assert!(preprocess_s >= hold.as_secs_f64() * 0.9, "{preprocess_s}");
        assert!(compute_s > preprocess_s);
        assert!(lock(&pre.slots).is_empty());
    }

    /// `rows` rows of embeddings `d` wide, deterministic in `salt`.
    fn embedding_rows(rows: u32, d: usize, salt: u64) -> Matrix {
        let data = (0..rows as u64 * d as u64)
            .map(|i| (easerve_sched::cache::mix(salt, i) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        Matrix {
            rows,
            cols: d as u32,
            data,
        }
    }

    /// One prefill of `r` over `store`: its first token and KV cache.
    fn prefill_one(
        model: &MultimodalModel<NdArray>,
        r: PrefillRequest,
        emb: Matrix,
        store: &mut PrefixStore<NdArray>,
    ) -> (u32, KvData) {
        let batch = [(r, Some(emb))];
        match prefill(model, text_ids(), &batch, store, &Default::default(), None).unwrap() {
            FromWorker::PrefillDone { mut outputs, .. } => {
                let (_, tok, kv) = outputs.remove(0);
                (tok, kv)
            }
            other => panic!("{other:?}"),
        }
    }

    /// A conversation's second turn (a system prompt, the first turn's
    /// image, text and answer, a second image and text), prefilled over the
    /// KV cache its first turn left under the hash chain's links, gives the
    /// first token and KV cache of the same prompt prefilled from scratch by
    /// another request: equal segments are equal tokens, and the cached head
    /// is the prompt's head (under 1 s).
    #[test]
    fn a_later_turn_over_its_first_turns_cache_matches_one_from_scratch() {
        use easerve_sched::{cache::blocks_before, Content, ContentItem, PrefixOp, Segment};
        let model = model();
        let d = model.lm.d_model();
        let item = |id, llm_tokens| ContentItem {
            id,
            encoder_tokens: llm_tokens,
            llm_tokens,
        };
        let seg = Segment::text;
        let (image1, image2) = (item(7, 20), item(8, 12));
        let (system, text1, answer1, text2) = (seg(101, 24), seg(201, 9), seg(202, 5), seg(203, 7));
        let (seg1, seg2) = (Segment::item(0, 7, 20), Segment::item(1, 8, 12));
        let turn1 = Content::new([image1].into_iter(), &[system, seg1, text1]);
        let turn2 = Content::new(
            [image1, image2].into_iter(),
            &[system, seg1, text1, answer1, seg2, text2],
        );
        let request = |id, c: &Content, cached, cached_key| PrefillRequest {
            id,
            prompt_tokens: 0,
            prompt: PromptPart::of(c),
            cached,
            cached_key,
            keep: true,
        };
        let emb1 = embedding_rows(20, d, 1);
        let mut emb2 = emb1.clone();
        let more = embedding_rows(12, d, 2);
        emb2.rows += more.rows;
        emb2.data.extend(more.data);

        let mut store = PrefixStore::default();
        prefill_one(&model, request(1, &turn1, 0, 0), emb1, &mut store);
        let links = turn1.keys().iter().map(|k| (k.key, k.end)).collect();
        store.apply(vec![PrefixOp::Keep { id: 1, links }]);
        // the turns share their first three links (53 tokens): three full
        // blocks of 16 are cached
        assert_eq!(turn2.keys()[..3], turn1.keys()[..3]);
        let cached = blocks_before(turn2.keys(), 3, 16) as u32 * 16;
        assert_eq!(cached, 48);
        let hit = request(2, &turn2, cached, turn2.keys()[2].key);
        let (tok, kv) = prefill_one(&model, hit, emb2.clone(), &mut store);
        assert_eq!(store.reused_tokens, 48);

        let mut scratch = PrefixStore::default();
        let (want_tok, want_kv) = prefill_one(&model, request(3, &turn2, 0, 0), emb2, &mut scratch);
        assert_eq!(scratch.reused_tokens, 0);
        assert_eq!(tok, want_tok, "first token");
        assert_eq!((kv.len, kv.k.len()), (want_kv.len, want_kv.k.len()));
        assert_eq!(kv.len, 24 + 20 + 9 + 5 + 12 + 7);
        let far = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max)
        };
        assert!(
            far(&kv.k, &want_kv.k) < 1e-3,
            "keys differ by {}",
            far(&kv.k, &want_kv.k)
        );
        assert!(
            far(&kv.v, &want_kv.v) < 1e-3,
            "values differ by {}",
            far(&kv.v, &want_kv.v)
        );
        // a prompt whose items' tokens are not its embeddings' rows is refused
        let short = request(4, &turn2, 0, 0);
        let batch = [(short, Some(embedding_rows(20, d, 1)))];
        let mut s = PrefixStore::default();
        let e = prefill(
            &model,
            text_ids(),
            &batch,
            &mut s,
            &Default::default(),
            None,
        );
        assert!(matches!(
            e,
            Err(WorkerError::PromptRows {
                rows: 20,
                items: 32,
                ..
            })
        ));
    }

    /// The worker drops a pending KV cache the controller never keeps (its
    /// request aborted between the pass's end and the controller hearing of
    /// it) once it keeps a request of a later pass; those of the same pass
    /// stay until their keep comes.
    #[test]
    fn a_pending_cache_never_kept_is_dropped_when_a_later_pass_is_kept() {
        use easerve_sched::PrefixOp;
        let device = Default::default();
        let cache = || {
            let t = || Tensor::<NdArray, 3>::zeros([1, 4, 2], &device);
            KvCache::from_positions(vec![t()], vec![t()], 1)
        };
        let keep = |id, key| PrefixOp::Keep {
            id,
            links: vec![(key, 4)],
        };
        let mut store = PrefixStore::<NdArray>::default();
        // pass 1: requests 1 and 2 (2 is aborted, never kept); pass 2: 3 and 4
        store.hold([(1, cache()), (2, cache())]);
        store.hold([(3, cache()), (4, cache())]);
        store.apply(vec![keep(1, 11)]);
        assert_eq!(store.pending(), 3, "request 2 may still be kept");
        store.apply(vec![keep(3, 13)]);
        assert_eq!(store.pending(), 1, "request 2 dropped, request 4 waits");
        store.apply(vec![keep(4, 14)]);
        assert_eq!((store.pending(), store.len()), (0, 3));
    }
}
