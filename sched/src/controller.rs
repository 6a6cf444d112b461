//! The EPD controller: every orchestration decision of one run — admission,
//! placement, encode dispatch, the SM share of each micro-batch and of the
//! co-located prefill worker, prefill routing, prefill batching, KV placement
//! and decode runs — as a sans-IO state machine, in the shape of
//! quinn-proto's `Connection`.
//!
//! Two drivers run it: the simulator (`easerve-sim`, which adds the physics:
//! how long a pass, a batch, a step or a transfer takes) and the executor
//! (`easerve exec`, whose worker processes do the work for real). Neither
//! decides anything itself.
//!
//! # Inputs
//! * [`Controller::handle`]`(now, `[`Event`]`)`: something happened at `now` —
//!   a request arrived, an encode pass reached its GPU phase or ended, an
//!   embeddings envelope or a KV cache landed, a prefill batch or a decode
//!   run ended, a worker died, or the run is being cut short.
//! * [`Controller::handle_timeout`]`(now)`: the time [`Controller::poll_timeout`]
//!   returned has come. A spurious or early call is a no-op.
//!
//! # Outputs
//! * [`Controller::poll_command`]: the next [`Command`] for the driver to carry
//!   out (run a pass, move embeddings, change a running batch's SM share, …).
//!   Commands carry no vectors: the requests of a pass, a batch, an envelope or
//!   a decode run are read with [`Controller::encode_batch`],
//!   [`Controller::prefill_batch`], [`Controller::envelope`] and
//!   [`Controller::decode_batch`] when the driver needs them.
//! * [`Controller::poll_timeout`]: the earliest time the controller wants to be
//!   woken (a batcher's deadline), if any. The controller owns every timer; a
//!   driver keeps no generation counters.
//! * [`Controller::decisions`]: the [`Decision`] log, kept only when
//!   [`ControllerConfig::log_decisions`] is set (off in the simulator's hot path,
//!   on for tests and `--decisions FILE`).
//!
//! # Call order
//! 1. For each input: `handle(now, event)` (or `handle_timeout(now)`), with `now`
//!    never going back.
//! 2. Drain `poll_command()` until it returns `None`, carrying out each command
//!    in order. A command's effects are reported back later as events (a pass
//!    ends with [`Event::EncodeDone`], and so on). Every [`Command::Embeddings`]
//!    and [`Command::Kv`] must get its landing event, even when the destination
//!    is dead (then at once): an encode worker's envelopes in flight count
//!    against its cap until they land.
//! 3. Read `poll_timeout()` and arrange to call `handle_timeout` then, or sooner
//!    when another event comes.
//!
//! Decode goes in runs ([`Command::DecodeRun`]): the iterations until the
//! first running sequence finishes, over a batch that does not change, so the
//! controller hears of decode once per run rather than once per token. When
//! a KV cache lands that can join the batch at once, the controller ends the
//! run early ([`Command::DecodeYield`]) at the end of the iteration in
//! progress, where deciding iteration by iteration would have admitted it:
//! the outcome is the same as one decision per iteration.
//!
//! Ties at one instant are the driver's to order; the simulator delivers
//! completions, then transfers, then arrivals, then the timeout.
//!
//! Times are seconds since the start of the run (`f64`), as everywhere in
//! easerve. Request ids are their index in the request list.

use crate::{
    Batcher, DecodeScheduler, DecodeSeq, LeastOutstanding, PrefillItem, PrefillQueue, Request,
    RequestId, RequestRecord, Route, Router, RouterPolicy, SmSplit, Topology,
};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// A stage's worker, as the controller names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WorkerRef {
    /// Encode worker `i` (`E{i}`).
    Encode(usize),
    /// Prefill worker `i`: remote workers first (`P{i}`), then local ones
    /// co-located on encode GPUs (`L{i - remote}`).
    Prefill(usize),
    /// Decode worker `i` (`D{i}`).
    Decode(usize),
}

/// Under time-slicing (no SM partition) an encode pass in its GPU phase and
/// the co-located prefill batch each get this share of the GPU's time.
pub const TIME_SLICE_SHARE: f64 = 0.5;

/// One embeddings envelope in flight: a slot index in its low 32 bits and the
/// slot's generation in its high 32 bits, so a stale landing never matches a
/// later envelope in the same slot.
pub type EnvelopeId = u64;

/// Something that happened, reported by the driver with [`Controller::handle`].
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Request `id` arrived (open loop, at its scheduled time).
    Arrival {
        /// Request.
        id: RequestId,
    },
    /// Encode worker `worker`'s pass finished its host phase (the fixed
    /// per-pass overhead and preprocessing) and now holds the GPU's SMs.
    EncodeGpuStarted {
        /// Encode worker.
        worker: usize,
    },
    /// Encode worker `worker` finished its pass.
    EncodeDone {
        /// Encode worker.
        worker: usize,
    },
    /// An embeddings envelope is held by its prefill worker.
    EmbeddingsLanded {
        /// The envelope ([`Command::Embeddings`]).
        envelope: EnvelopeId,
        /// When it left the encode worker (after waiting for the link), seconds.
        sent_at: f64,
    },
    /// Prefill worker `worker` finished its batch (first tokens emitted).
    PrefillDone {
        /// Prefill worker.
        worker: usize,
    },
    /// Request `id`'s KV cache is held by the decode worker it was sent to.
    KvLanded {
        /// Request.
        id: RequestId,
        /// When it left the prefill worker (after waiting for the link), seconds.
        sent_at: f64,
    },
    /// Decode worker `worker` ended its run ([`Command::DecodeRun`]) after
    /// `steps` iterations: all of them, or fewer when it was told to yield
    /// ([`Command::DecodeYield`]). A driver may end a run earlier still (the
    /// controller then starts the next at once): `harness::Cluster` does, to
    /// check runs against one decision per iteration.
    DecodeRunDone {
        /// Decode worker.
        worker: usize,
        /// Iterations run, at least 1 and at most the run's `steps`.
        steps: u64,
    },
    /// A worker died (it exited, was killed, or its connection broke): every
    /// request it holds fails with `reason`, and requests later sent to it fail
    /// on arrival there. Nothing is retried.
    WorkerFailed {
        /// The worker.
        worker: WorkerRef,
        /// Why.
        reason: String,
    },
    /// The run is cut short (Ctrl-C or a deadline): every request not at an
    /// end yet, arrived or not, fails with `reason`; nothing more starts.
    Interrupt {
        /// Why.
        reason: String,
    },
}

/// One scheduling decision, in the order it was taken. Two drivers that feed
/// the same events at the same times get the same log (the simulator and
/// `harness::Cluster` are checked to, `tests/drivers_agree.rs`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Decision {
    /// Arrival `id` was turned away: the admission queue was full.
    Reject {
        /// Request.
        id: RequestId,
    },
    /// Arrival `id` goes to encode worker `worker` (placement).
    PlaceEncode {
        /// Request.
        id: RequestId,
        /// Encode worker.
        worker: usize,
    },
    /// Encode worker `worker` starts a micro-batch of `ids` at SM share `sm_share`.
    Dispatch {
        /// Time of the decision.
        at: f64,
        /// Encode worker.
        worker: usize,
        /// Requests, FCFS.
        ids: Vec<RequestId>,
        /// SM share of the pass (1 without a co-located prefill worker).
        sm_share: f64,
    },
    /// Request `id`'s prefill goes to prefill worker `worker` (deficit router
    /// and placement).
    Route {
        /// Request.
        id: RequestId,
        /// Prefill worker (remote first, then local).
        worker: usize,
        /// Whether it stays on the encode GPU's local prefill worker.
        local: bool,
    },
    /// Prefill worker `worker` starts a batch of `ids` at SM share `sm_share`.
    Prefill {
        /// Time of the decision.
        at: f64,
        /// Prefill worker.
        worker: usize,
        /// Requests in the batch.
        ids: Vec<RequestId>,
        /// SM share (1 for a remote worker; for a local one, what the encode
        /// pass on its GPU leaves).
        sm_share: f64,
    },
    /// The running batch of local prefill worker `worker` changes SM share
    /// because an encode pass on its GPU entered or left its GPU phase.
    Share {
        /// Time of the decision.
        at: f64,
        /// Prefill worker.
        worker: usize,
        /// The new share.
        sm_share: f64,
    },
    /// Request `id`'s KV cache goes to decode worker `worker`.
    PlaceDecode {
        /// Request.
        id: RequestId,
        /// Decode worker.
        worker: usize,
    },
    /// Decode worker `worker` runs up to `steps` iterations over `batch`
    /// sequences holding `context` tokens at the first (`context + i · batch`
    /// at the `i`-th): the iterations until a sequence finishes.
    DecodeRun {
        /// Time of the decision.
        at: f64,
        /// Decode worker.
        worker: usize,
        /// Running sequences.
        batch: u64,
        /// Total context tokens at the first iteration.
        context: u64,
        /// Iterations until the first sequence generates its last token.
        steps: u64,
    },
    /// Decode worker `worker`'s run ends after the iteration in progress: a
    /// KV cache landed that can join the batch now.
    DecodeYield {
        /// Time of the decision.
        at: f64,
        /// Decode worker.
        worker: usize,
    },
    /// Request `id` failed (a worker died, its KV cache can never fit, the run
    /// was interrupted).
    Fail {
        /// Request.
        id: RequestId,
        /// Why.
        reason: String,
    },
}

/// What the controller asks its driver to do. No command owns a vector; see
/// the accessors named on each variant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Command {
    /// Request `id` was placed on encode worker `worker`: start preprocessing
    /// its media on the worker's host threads now, ahead of the pass that will
    /// encode it, while earlier passes hold the GPU (only when
    /// [`ControllerConfig::preprocess_ahead`] is set). The pass that takes the
    /// request ([`Command::Encode`]) enters its GPU phase once the request's
    /// preprocessing is done; nothing is reported back for this command.
    Preprocess {
        /// Encode worker.
        worker: usize,
        /// Request placed there.
        id: RequestId,
    },
    /// Run an encode pass on encode worker `worker` with SM share `sm_share`
    /// over [`Controller::encode_batch`]`(worker)`; report its GPU phase with
    /// [`Event::EncodeGpuStarted`] and its end with [`Event::EncodeDone`].
    Encode {
        /// Encode worker.
        worker: usize,
        /// SM (or thread) share for the pass: a fraction in (0, 1].
        sm_share: f64,
    },
    /// Move the embeddings of [`Controller::envelope`]`(envelope)` from encode
    /// worker `from` to prefill worker `to`; report the landing with
    /// [`Event::EmbeddingsLanded`]. `local` envelopes stay on the encode GPU
    /// (they land at once).
    Embeddings {
        /// The envelope.
        envelope: EnvelopeId,
        /// Encode worker.
        from: usize,
        /// Prefill worker.
        to: usize,
        /// Whether the destination is the co-located local prefill worker.
        local: bool,
    },
    /// Run a prefill batch, [`Controller::prefill_batch`]`(worker)`, on prefill
    /// worker `worker` at SM share `sm_share`; report [`Event::PrefillDone`].
    Prefill {
        /// Prefill worker.
        worker: usize,
        /// SM share, a fraction in [0, 1] (1 for a remote prefill worker;
        /// under time-slicing ([`Controller::time_sliced`]) a share of time).
        sm_share: f64,
    },
    /// The batch running on local prefill worker `worker` now has SM share
    /// `sm_share` (an encode pass on its GPU entered or left its GPU phase).
    /// The simulator re-rates the batch; the executor applies it at the next
    /// batch.
    PrefillShare {
        /// Prefill worker.
        worker: usize,
        /// The new share.
        sm_share: f64,
    },
    /// Move request `id`'s KV cache from prefill worker `from` to decode
    /// worker `to`; report [`Event::KvLanded`].
    Kv {
        /// Prefill worker.
        from: usize,
        /// Decode worker.
        to: usize,
        /// Request.
        id: RequestId,
    },
    /// Run up to `steps` decode iterations on `worker` over its running
    /// sequences ([`Controller::decode_batch`], unchanged through the run),
    /// the `i`-th (from 0) over `context + i · batch` context tokens; report
    /// the end with [`Event::DecodeRunDone`]. No sequence finishes before the
    /// last iteration, so nothing the controller decides depends on the
    /// iterations in between; a driver may time them one by one (the
    /// executor) or all at once (the simulator).
    DecodeRun {
        /// Decode worker.
        worker: usize,
        /// Running sequences.
        batch: u64,
        /// Their total context tokens at the first iteration.
        context: u64,
        /// Iterations in the run, at least 1.
        steps: u64,
    },
    /// End decode worker `worker`'s run after the iteration in progress (the
    /// first whose end is strictly after now) and report the iterations run
    /// with [`Event::DecodeRunDone`]: a sequence that can join the batch has
    /// arrived. A run that ends there anyway is unaffected.
    DecodeYield {
        /// Decode worker.
        worker: usize,
    },
    /// Request `id` generated its last token: decode worker `worker` may free
    /// its KV cache.
    Release {
        /// Decode worker.
        worker: usize,
        /// Finished request.
        id: RequestId,
    },
}

/// How a [`Controller`] is laid out: the deployment's workers and knobs.
pub struct ControllerConfig {
    /// One batcher per encode worker.
    pub batchers: Vec<Batcher>,
    /// The workers and where they run (remote prefill, local prefill groups).
    pub topology: Topology,
    /// One decode scheduler per decode worker.
    pub decode: Vec<DecodeScheduler>,
    /// Prefill token budget per batch.
    pub prefill_token_budget: u64,
    /// Prefill sequences per batch.
    pub prefill_max_seqs: usize,
    /// Embedding envelopes one encode worker may have in flight.
    pub max_inflight_transfers: usize,
    /// Prefill routing policy and offload ratio `s`.
    pub router: (RouterPolicy, f64),
    /// SM split between an encode pass and its co-located prefill worker.
    pub split: SmSplit,
    /// Admission bound: requests admitted and not yet finished; an arrival
    /// beyond it is rejected. `None` admits everything.
    pub admission_limit: Option<usize>,
    /// Keep the [`Decision`] log ([`Controller::decisions`]).
    pub log_decisions: bool,
    /// Preprocessing is a pipelined host stage: each request placed on an
    /// encode worker is handed to it at once ([`Command::Preprocess`]), so its
    /// media are preprocessed while the worker's earlier passes run. Off: an
    /// encode pass preprocesses its own micro-batch first, in series with its
    /// GPU phase.
    pub preprocess_ahead: bool,
}

/// Where a request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    NotArrived,
    Encode(usize),
    Prefill(usize),
    Decode(usize),
    Done,
}

struct EncodeSlot {
    batcher: Batcher,
    /// The pass running, FCFS; empty when idle.
    pass: Vec<RequestId>,
    busy: bool,
    /// Whether the pass holds the GPU's SMs (its host phase is over).
    gpu_phase: bool,
    /// The batcher's wake-up, when it waits on a timer.
    timer: Option<f64>,
    inflight: usize,
    local: Option<usize>,
    alive: bool,
}

struct PrefillSlot {
    queue: PrefillQueue,
    batch: Vec<PrefillItem>,
    busy: bool,
    /// SM share of the running batch.
    share: f64,
    encode_workers: Vec<usize>,
    local: bool,
    alive: bool,
}

struct DecodeSlot {
    sched: DecodeScheduler,
    /// A run is in flight.
    in_run: bool,
    /// Iterations of the run in flight.
    run_steps: u64,
    /// The run in flight was told to yield.
    yielded: bool,
    alive: bool,
}

struct Envelope {
    gen: u32,
    from: usize,
    to: usize,
    local: bool,
    ids: Vec<RequestId>,
    in_flight: bool,
}

/// Counters for the report's encode summary.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ControllerCounters {
    /// Encode passes started.
    pub passes: usize,
    /// Requests in those passes.
    pub passed_requests: usize,
    /// Prefill routing decisions.
    pub routed: usize,
    /// Of which remote.
    pub remote_routed: usize,
    /// Arrivals rejected by admission.
    pub rejected: usize,
    /// Requests that failed (a worker died, their KV cache can never fit, or
    /// the run was interrupted).
    pub failed: usize,
}

/// The controller (module doc).
pub struct Controller {
    requests: Vec<Request>,
    records: Vec<RequestRecord>,
    place: Vec<Place>,
    encode: Vec<EncodeSlot>,
    encode_place: LeastOutstanding,
    router: Router,
    split: SmSplit,
    prefill: Vec<PrefillSlot>,
    topology: Topology,
    remote_place: LeastOutstanding,
    decode: Vec<DecodeSlot>,
    decode_place: LeastOutstanding,
    envelopes: Vec<Envelope>,
    free_envelopes: Vec<u32>,
    max_inflight: usize,
    admission_limit: Option<usize>,
    in_system: usize,
    /// Requests finished, and the latest finish time (seconds; 0 before one).
    finished: (usize, f64),
    counters: ControllerCounters,
    log: Option<Vec<Decision>>,
    commands: VecDeque<Command>,
    /// Routing scratch (destination, ids), reused by every pass.
    groups: Vec<(usize, Vec<RequestId>)>,
    preprocess_ahead: bool,
}

impl Controller {
    /// A controller for `requests` (ids = indices, ascending arrival) laid out
    /// as `cfg` says.
    pub fn new(requests: Vec<Request>, cfg: ControllerConfig) -> Controller {
        let records = requests.iter().map(RequestRecord::new).collect();
        let mut encode: Vec<EncodeSlot> = cfg
            .batchers
            .into_iter()
            .map(|batcher| EncodeSlot {
                batcher,
                pass: Vec::new(),
                busy: false,
                gpu_phase: false,
                timer: None,
                inflight: 0,
                local: None,
                alive: true,
            })
            .collect();
        let queue = || PrefillQueue::new(cfg.prefill_token_budget, cfg.prefill_max_seqs);
        let prefill: Vec<PrefillSlot> = cfg
            .topology
            .prefill()
            .iter()
            .map(|w| PrefillSlot {
                queue: queue(),
                batch: Vec::new(),
                busy: false,
                share: 1.0,
                encode_workers: w.encode_workers.clone(),
                local: w.local,
                alive: true,
            })
            .collect();
        for (slot, w) in encode.iter_mut().zip(cfg.topology.encode()) {
            slot.local = w.local_prefill;
        }
        let decode: Vec<DecodeSlot> = cfg
            .decode
            .into_iter()
            .map(|sched| DecodeSlot {
                sched,
                in_run: false,
                run_steps: 0,
                yielded: false,
                alive: true,
            })
            .collect();
        Controller {
            place: vec![Place::NotArrived; requests.len()],
            records,
            requests,
            encode_place: LeastOutstanding::new(encode.len()),
            remote_place: LeastOutstanding::new(cfg.topology.remote_prefill()),
            decode_place: LeastOutstanding::new(decode.len()),
            router: Router::new(&cfg.router.0, cfg.router.1),
            split: cfg.split,
            topology: cfg.topology,
            encode,
            prefill,
            decode,
            envelopes: Vec::new(),
            free_envelopes: Vec::new(),
            max_inflight: cfg.max_inflight_transfers.max(1),
            admission_limit: cfg.admission_limit,
            in_system: 0,
            finished: (0, 0.0),
            counters: ControllerCounters::default(),
            log: cfg.log_decisions.then(Vec::new),
            commands: VecDeque::new(),
            groups: Vec::new(),
            preprocess_ahead: cfg.preprocess_ahead,
        }
    }

    // ----------------------------------------------------------- the API

    /// Append a request that was not known when the controller was built (a
    /// server learns of its requests as they come): it takes the next id,
    /// `requests().len()`, which this returns, whatever `req.id` said. Its
    /// arrival is still an input: hand [`Event::Arrival`] with that id.
    pub fn add_request(&mut self, mut req: Request) -> RequestId {
        let id = self.requests.len() as RequestId;
        req.id = id;
        self.records.push(RequestRecord::new(&req));
        self.place.push(Place::NotArrived);
        self.requests.push(req);
        id
    }

    /// Hand the controller something that happened at `now` (module doc).
    /// Events that no longer apply (a pass that ended already, an envelope
    /// that landed, a worker that died) are no-ops.
    ///
    /// # Panics
    /// If the event names a worker or request the controller does not have
    /// (an index beyond the topology or the request list): a driver bug.
    pub fn handle(&mut self, now: f64, event: Event) {
        match event {
            Event::Arrival { id } => self.on_arrival(now, id),
            Event::EncodeGpuStarted { worker } => self.on_encode_gpu(now, worker),
            Event::EncodeDone { worker } => self.on_encode_done(now, worker),
            Event::EmbeddingsLanded { envelope, sent_at } => {
                self.on_embeddings(now, envelope, sent_at)
            }
            Event::PrefillDone { worker } => self.on_prefill_done(now, worker),
            Event::KvLanded { id, sent_at } => self.on_kv(now, id, sent_at),
            Event::DecodeRunDone { worker, steps } => {
                self.complete_decode_run(now, worker, steps);
                self.try_decode(now, worker);
            }
            Event::WorkerFailed { worker, reason } => self.on_worker_failed(now, worker, &reason),
            Event::Interrupt { reason } => self.interrupt(&reason),
        }
    }

    /// The earliest time the controller wants [`Controller::handle_timeout`]
    /// called (absolute, seconds since the start of the run), if any.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<f64> {
        let mut t: Option<f64> = None;
        for e in &self.encode {
            if let Some(at) = e.timer {
                t = Some(t.map_or(at, |x| x.min(at)));
            }
        }
        t
    }

    /// A timer the controller asked for may be due at `now`: every batcher
    /// whose wake-up has come is re-examined. Spurious calls are no-ops.
    pub fn handle_timeout(&mut self, now: f64) {
        for w in 0..self.encode.len() {
            if self.encode[w].timer.is_some_and(|at| at <= now) {
                self.encode[w].timer = None;
                self.try_dispatch(now, w);
            }
        }
    }

    /// The next command to carry out, in order; `None` when there is none.
    #[must_use]
    pub fn poll_command(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    /// The requests of the pass running on encode worker `w`, FCFS (empty when idle).
    pub fn encode_batch(&self, w: usize) -> &[RequestId] {
        &self.encode[w].pass
    }

    /// The batch running on prefill worker `p` (empty when idle).
    pub fn prefill_batch(&self, p: usize) -> &[PrefillItem] {
        &self.prefill[p].batch
    }

    /// The requests of an envelope in flight (empty once it landed or is unknown).
    pub fn envelope(&self, e: EnvelopeId) -> &[RequestId] {
        self.live_envelope(e).map_or(&[], |x| &x.ids)
    }

    /// The sequences of decode worker `d`'s running batch, in no particular order.
    pub fn decode_batch(&self, d: usize) -> impl Iterator<Item = RequestId> + '_ {
        self.decode[d].sched.batch()
    }

    /// Shape of decode worker `d`'s running batch: (sequences, context tokens).
    pub fn decode_shape(&self, d: usize) -> (u64, u64) {
        self.decode[d].sched.step_shape()
    }

    /// Sequences at decode worker `d` waiting for KV blocks.
    pub fn decode_waiting(&self, d: usize) -> usize {
        self.decode[d].sched.waiting()
    }

    /// Whether an encode GPU and its local prefill worker share the SMs by
    /// time-slicing (no partition): both then run on every SM and slow each
    /// other, and a share below 1 is a share of time.
    pub fn time_sliced(&self) -> bool {
        self.split.encode_share(1).is_none()
    }

    /// The SM split in force (for the report's notes).
    pub fn split(&self) -> &SmSplit {
        &self.split
    }

    // --------------------------------------------------------- inspection

    /// The requests of the run.
    pub fn requests(&self) -> &[Request] {
        &self.requests
    }

    /// Lifecycle records so far, by request id.
    pub fn records(&self) -> &[RequestRecord] {
        &self.records
    }

    /// Requests that finished (their last token emitted) so far, and the
    /// latest of their finish times (seconds; 0 before any): what a report's
    /// span needs without another pass over the records.
    pub fn finished(&self) -> (usize, f64) {
        self.finished
    }

    /// Hand over the records at the end of the run.
    pub fn into_records(self) -> Vec<RequestRecord> {
        self.records
    }

    /// Every decision so far (empty unless [`ControllerConfig::log_decisions`]).
    pub fn decisions(&self) -> &[Decision] {
        self.log.as_deref().unwrap_or(&[])
    }

    /// Take the decision log.
    pub fn take_decisions(&mut self) -> Vec<Decision> {
        self.log.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Counters for the report.
    pub fn counters(&self) -> ControllerCounters {
        self.counters
    }

    /// Resolved batcher parameters of encode worker 0 (for the report).
    pub fn batcher_params(&self) -> Option<&crate::BatcherParams> {
        self.encode.first().map(|w| w.batcher.params())
    }

    /// Worker label as the report writes it: `E0`, `P0`, `L0`, `D0`.
    pub fn label(&self, w: WorkerRef) -> &str {
        self.topology.label(w)
    }

    /// The workers and where they run.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Whether prefill worker `p` is co-located on an encode GPU.
    pub fn is_local_prefill(&self, p: usize) -> bool {
        self.prefill[p].local
    }

    /// Whether every request has arrived and reached an end (finished, failed
    /// or rejected).
    pub fn is_finished(&self) -> bool {
        self.place.iter().all(|p| *p == Place::Done)
    }

    /// Requests admitted and not yet at an end.
    pub fn in_system(&self) -> usize {
        self.in_system
    }

    /// Requests queued at encode worker `w`.
    pub fn encode_queue_len(&self, w: usize) -> usize {
        self.encode[w].batcher.len()
    }

    /// Requests queued at prefill worker `p`.
    pub fn prefill_queue_len(&self, p: usize) -> usize {
        self.prefill[p].queue.len()
    }

    // ------------------------------------------------------------ helpers

    fn decide(&mut self, d: impl FnOnce() -> Decision) {
        if let Some(log) = self.log.as_mut() {
            log.push(d());
        }
    }

    fn fail(&mut self, id: RequestId, reason: &str) {
        let i = id as usize;
        if self.place[i] == Place::Done {
            return;
        }
        if self.place[i] != Place::NotArrived {
            self.in_system -= 1;
        }
        self.place[i] = Place::Done;
        self.records[i].failure = Some(reason.to_string());
        self.counters.failed += 1;
        self.decide(|| Decision::Fail {
            id,
            reason: reason.to_string(),
        });
    }

    fn done(&mut self, id: RequestId, at: f64) {
        let i = id as usize;
        if self.place[i] != Place::Done {
            self.records[i].finish = Some(at);
            self.place[i] = Place::Done;
            self.in_system -= 1;
            self.finished = (self.finished.0 + 1, self.finished.1.max(at));
        }
    }

    fn live_envelope(&self, e: EnvelopeId) -> Option<&Envelope> {
        let slot = (e & 0xffff_ffff) as usize;
        let gen = (e >> 32) as u32;
        self.envelopes
            .get(slot)
            .filter(|x| x.gen == gen && x.in_flight)
    }

    fn new_envelope(&mut self, from: usize, to: usize, local: bool) -> (EnvelopeId, usize) {
        let slot = match self.free_envelopes.pop() {
            Some(s) => s as usize,
            None => {
                self.envelopes.push(Envelope {
                    gen: 0,
                    from,
                    to,
                    local,
                    ids: Vec::new(),
                    in_flight: false,
                });
                self.envelopes.len() - 1
            }
        };
        let e = &mut self.envelopes[slot];
        e.gen = e.gen.wrapping_add(1);
        e.from = from;
        e.to = to;
        e.local = local;
        e.in_flight = true;
        e.ids.clear();
        ((e.gen as u64) << 32 | slot as u64, slot)
    }

    // ------------------------------------------------------------- encode

    fn on_arrival(&mut self, now: f64, id: RequestId) {
        let i = id as usize;
        if self.place[i] != Place::NotArrived {
            return;
        }
        if self
            .admission_limit
            .is_some_and(|cap| self.in_system >= cap)
        {
            self.place[i] = Place::Done;
            self.records[i].rejected = true;
            self.counters.rejected += 1;
            self.decide(|| Decision::Reject { id });
            return;
        }
        self.in_system += 1;
        let req = &self.requests[i];
        if !req.needs_encode() || self.encode.is_empty() {
            let p = self.remote_place.assign(req.prefill_tokens() as f64);
            self.decide(|| Decision::Route {
                id,
                worker: p,
                local: false,
            });
            self.arrive_at_prefill(now, p, id);
            self.try_prefill(now, p);
            return;
        }
        let enc = req.encoder_tokens as f64;
        let w = self.encode_place.assign(enc);
        self.decide(|| Decision::PlaceEncode { id, worker: w });
        self.records[i].encode_worker = Some(w);
        self.place[i] = Place::Encode(w);
        if !self.encode[w].alive {
            self.fail(id, &format!("encode worker E{w} is down"));
            self.encode_place.complete(w, enc);
            return;
        }
        if self.preprocess_ahead {
            self.commands
                .push_back(Command::Preprocess { worker: w, id });
        }
        self.encode[w].batcher.on_arrival(now, id);
        self.try_dispatch(now, w);
    }

    fn try_dispatch(&mut self, now: f64, w: usize) {
        let colocated = self.encode[w].local.is_some();
        let worker = &mut self.encode[w];
        if !worker.alive {
            return;
        }
        // backpressure: no new pass while the worker's envelopes in flight are at the cap
        let free = !worker.busy && worker.inflight < self.max_inflight;
        match worker.batcher.poll_dispatch(now, free) {
            Some(ids) => {
                worker.timer = None;
                let sm_share = match self.split.encode_share(ids.len()) {
                    Some(f) if colocated => f,
                    _ => 1.0,
                };
                for &id in &ids {
                    let r = &mut self.records[id as usize];
                    r.encode_start = Some(now);
                    r.encode_batch = Some(ids.len());
                }
                self.counters.passes += 1;
                self.counters.passed_requests += ids.len();
                self.decide(|| Decision::Dispatch {
                    at: now,
                    worker: w,
                    ids: ids.clone(),
                    sm_share,
                });
                let worker = &mut self.encode[w];
                worker.pass = ids;
                worker.busy = true;
                worker.gpu_phase = false;
                self.commands.push_back(Command::Encode {
                    worker: w,
                    sm_share,
                });
            }
            None => {
                if free {
                    worker.timer = worker.batcher.poll_timeout().map(|at| at.max(now));
                }
            }
        }
    }

    /// SM share of local prefill worker `p` now: the least over its GPUs of
    /// what the encode pass there leaves while it holds the SMs (its GPU
    /// phase); under time-slicing, half the time.
    pub fn local_prefill_share(&self, p: usize) -> f64 {
        self.prefill[p]
            .encode_workers
            .iter()
            .map(|&w| {
                let e = &self.encode[w];
                let batch = (e.busy && e.gpu_phase).then_some(e.pass.len());
                match self.split.prefill_share(batch) {
                    Some(f) => f,
                    None if batch.is_some() => TIME_SLICE_SHARE,
                    None => 1.0,
                }
            })
            .fold(1.0, f64::min)
    }

    /// The SM share of encode worker `w`'s local prefill batch may have
    /// changed: tell the driver and log it.
    fn reshare_local(&mut self, now: f64, w: usize) {
        let Some(p) = self.encode[w].local else {
            return;
        };
        if !self.prefill[p].busy || !self.prefill[p].alive {
            return;
        }
        let share = self.local_prefill_share(p);
        if share == self.prefill[p].share {
            return;
        }
        self.prefill[p].share = share;
        self.decide(|| Decision::Share {
            at: now,
            worker: p,
            sm_share: share,
        });
        self.commands.push_back(Command::PrefillShare {
            worker: p,
            sm_share: share,
        });
    }

    fn on_encode_gpu(&mut self, now: f64, w: usize) {
        let e = &mut self.encode[w];
        if !e.busy || e.gpu_phase || !e.alive {
            return;
        }
        e.gpu_phase = true;
        self.reshare_local(now, w);
    }

    /// Encode worker `w` finished its pass at `now`: route each request's
    /// prefill (deficit router, then placement), then one embedding envelope
    /// per destination.
    fn on_encode_done(&mut self, now: f64, w: usize) {
        if !self.encode[w].busy || !self.encode[w].alive {
            return;
        }
        self.encode[w].busy = false;
        self.encode[w].gpu_phase = false;
        self.reshare_local(now, w);
        let ids = std::mem::take(&mut self.encode[w].pass);
        let mut groups = std::mem::take(&mut self.groups);
        for &id in &ids {
            let i = id as usize;
            let enc = self.requests[i].encoder_tokens as f64;
            self.encode_place.complete(w, enc);
            if self.place[i] == Place::Done {
                continue;
            }
            self.records[i].encode_end = Some(now);
            let route = match self.encode[w].local {
                Some(_) => self.router.route(),
                None => Route::Remote,
            };
            self.counters.routed += 1;
            let dest = match route {
                Route::Remote => {
                    self.counters.remote_routed += 1;
                    self.remote_place
                        .assign(self.requests[i].prefill_tokens() as f64)
                }
                Route::Local => {
                    self.records[i].prefill_local = true;
                    self.encode[w]
                        .local
                        .expect("local route only with a local worker")
                }
            };
            self.decide(|| Decision::Route {
                id,
                worker: dest,
                local: route == Route::Local,
            });
            self.place[i] = Place::Prefill(dest);
            match groups.iter_mut().find(|g| g.0 == dest) {
                Some(g) => g.1.push(id),
                None => groups.push((dest, vec![id])),
            }
        }
        // keep the pass's vector for the next pass
        let mut ids = ids;
        ids.clear();
        self.encode[w].pass = ids;
        for (dest, ids) in groups.drain(..) {
            let local = self.prefill[dest].local;
            let (envelope, slot) = self.new_envelope(w, dest, local);
            self.envelopes[slot].ids = ids;
            if !local {
                self.encode[w].inflight += 1;
            }
            self.commands.push_back(Command::Embeddings {
                envelope,
                from: w,
                to: dest,
                local,
            });
        }
        self.groups = groups;
        self.try_dispatch(now, w);
    }

    // ------------------------------------------------------------ prefill

    /// Request `id` is held by prefill worker `p` at `now` (queued, or failed
    /// when the worker is down).
    fn arrive_at_prefill(&mut self, now: f64, p: usize, id: RequestId) {
        let i = id as usize;
        if self.place[i] == Place::Done {
            return;
        }
        self.place[i] = Place::Prefill(p);
        if !self.prefill[p].alive {
            let why = format!(
                "prefill worker {} is down",
                self.label(WorkerRef::Prefill(p))
            );
            self.fail(id, &why);
            return;
        }
        self.records[i].prefill_ready = Some(now);
        self.prefill[p].queue.push(PrefillItem {
            id,
            tokens: self.requests[i].prefill_tokens(),
        });
    }

    fn on_embeddings(&mut self, now: f64, e: EnvelopeId, sent_at: f64) {
        let Some(env) = self.live_envelope(e) else {
            return;
        };
        let slot = (e & 0xffff_ffff) as usize;
        let (from, to, local) = (env.from, env.to, env.local);
        let ids = std::mem::take(&mut self.envelopes[slot].ids);
        self.envelopes[slot].in_flight = false;
        self.free_envelopes.push(slot as u32);
        if !local {
            self.encode[from].inflight = self.encode[from].inflight.saturating_sub(1);
        }
        for &id in &ids {
            self.records[id as usize].embedding_sent = Some(sent_at);
            self.arrive_at_prefill(now, to, id);
        }
        // hand the vector back to the slot for reuse
        let mut ids = ids;
        ids.clear();
        self.envelopes[slot].ids = ids;
        self.try_prefill(now, to);
        if !local {
            self.try_dispatch(now, from);
        }
    }

    fn try_prefill(&mut self, now: f64, p: usize) {
        let slot = &self.prefill[p];
        if !slot.alive || slot.busy || slot.queue.is_empty() {
            return;
        }
        let items = self.prefill[p].queue.next_batch();
        for it in &items {
            self.records[it.id as usize].prefill_start = Some(now);
        }
        let sm_share = if self.prefill[p].local {
            self.local_prefill_share(p)
        } else {
            1.0
        };
        self.decide(|| Decision::Prefill {
            at: now,
            worker: p,
            ids: items.iter().map(|i| i.id).collect(),
            sm_share,
        });
        let slot = &mut self.prefill[p];
        slot.batch = items;
        slot.busy = true;
        slot.share = sm_share;
        self.commands.push_back(Command::Prefill {
            worker: p,
            sm_share,
        });
    }

    /// Prefill worker `p` finished its batch at `now` (first tokens emitted):
    /// place each KV cache on a decode worker.
    fn on_prefill_done(&mut self, now: f64, p: usize) {
        if !self.prefill[p].busy || !self.prefill[p].alive {
            return;
        }
        self.prefill[p].busy = false;
        let items = std::mem::take(&mut self.prefill[p].batch);
        for it in &items {
            let i = it.id as usize;
            if !self.prefill[p].local {
                self.remote_place.complete(p, it.tokens as f64);
            }
            if self.place[i] == Place::Done {
                continue;
            }
            self.records[i].first_token = Some(now);
            let out = self.requests[i].output_tokens;
            if out <= 1 {
                self.done(it.id, now);
                continue;
            }
            let d = self.decode_place.assign((it.tokens + out as u64) as f64);
            self.decide(|| Decision::PlaceDecode {
                id: it.id,
                worker: d,
            });
            self.place[i] = Place::Decode(d);
            self.commands.push_back(Command::Kv {
                from: p,
                to: d,
                id: it.id,
            });
        }
        self.try_prefill(now, p);
    }

    // ------------------------------------------------------------- decode

    fn on_kv(&mut self, now: f64, id: RequestId, sent_at: f64) {
        let i = id as usize;
        let Place::Decode(d) = self.place[i] else {
            return;
        };
        if self.records[i].decode_ready.is_some() {
            // a duplicate landing: the cache is already queued
            return;
        }
        self.records[i].kv_sent = Some(sent_at);
        if !self.decode[d].alive {
            self.fail(id, &format!("decode worker D{d} is down"));
            return;
        }
        self.records[i].decode_ready = Some(now);
        let seq = DecodeSeq {
            id,
            prompt_tokens: self.requests[i].prefill_tokens(),
            remaining: self.requests[i].output_tokens - 1,
        };
        if !self.decode[d].sched.can_ever_fit(&seq) {
            // release the placement its prefill made
            let work = (seq.prompt_tokens + self.requests[i].output_tokens as u64) as f64;
            self.decode_place.complete(d, work);
            self.fail(
                id,
                &format!("its KV cache can never fit decode worker D{d}"),
            );
            return;
        }
        self.decode[d].sched.enqueue(seq);
        let slot = &mut self.decode[d];
        if slot.in_run && !slot.yielded && slot.sched.can_admit_next() {
            // it joins at the end of the iteration in progress, as it would
            // if the iterations were decided one by one
            slot.yielded = true;
            self.decide(|| Decision::DecodeYield { at: now, worker: d });
            self.commands.push_back(Command::DecodeYield { worker: d });
        }
        self.try_decode(now, d);
    }

    /// Start a run on decode worker `d` if it is idle and has work: the
    /// iterations until its first running sequence finishes.
    fn try_decode(&mut self, now: f64, d: usize) {
        let slot = &mut self.decode[d];
        if slot.in_run || !slot.alive {
            return;
        }
        for id in slot.sched.admit() {
            self.records[id as usize].decode_start = Some(now);
        }
        let (batch, context) = slot.sched.step_shape();
        if batch == 0 {
            return;
        }
        let steps = slot.sched.steps_to_finish().unwrap_or(1);
        slot.in_run = true;
        slot.run_steps = steps;
        slot.yielded = false;
        self.decide(|| Decision::DecodeRun {
            at: now,
            worker: d,
            batch,
            context,
            steps,
        });
        self.commands.push_back(Command::DecodeRun {
            worker: d,
            batch,
            context,
            steps,
        });
    }

    /// Decode worker `d`'s run ended at `now` after `steps` iterations:
    /// sequences that generated their last token finish.
    fn complete_decode_run(&mut self, now: f64, d: usize, steps: u64) {
        let slot = &mut self.decode[d];
        if !slot.in_run {
            return;
        }
        debug_assert!(
            (1..=slot.run_steps).contains(&steps),
            "decode worker D{d} reported {steps} iterations of a run of {}",
            slot.run_steps
        );
        slot.in_run = false;
        slot.yielded = false;
        for id in slot
            .sched
            .complete_steps(steps.clamp(1, slot.run_steps.max(1)))
        {
            let i = id as usize;
            let work =
                (self.requests[i].prefill_tokens() + self.requests[i].output_tokens as u64) as f64;
            self.decode_place.complete(d, work);
            self.done(id, now);
            self.commands.push_back(Command::Release { worker: d, id });
        }
    }

    // ------------------------------------------------------------- faults

    fn on_worker_failed(&mut self, now: f64, w: WorkerRef, reason: &str) {
        let label = self.label(w);
        let why = format!("{label} failed: {reason}");
        let victims: Vec<RequestId> = match w {
            WorkerRef::Encode(i) => {
                let e = &mut self.encode[i];
                e.alive = false;
                e.busy = false;
                e.gpu_phase = false;
                e.pass.clear();
                e.timer = None;
                self.encode_place.retire(i);
                // its GPU's SMs are the local prefill worker's again
                self.reshare_local(now, i);
                self.place_ids(Place::Encode(i))
            }
            WorkerRef::Prefill(i) => {
                self.prefill[i].alive = false;
                self.prefill[i].busy = false;
                self.prefill[i].batch.clear();
                if !self.prefill[i].local {
                    self.remote_place.retire(i);
                }
                self.place_ids(Place::Prefill(i))
            }
            WorkerRef::Decode(i) => {
                self.decode[i].alive = false;
                self.decode[i].in_run = false;
                self.decode_place.retire(i);
                self.place_ids(Place::Decode(i))
            }
        };
        // an encode worker that lost its local prefill partner keeps routing
        // there: those requests fail when their embeddings land
        for id in victims {
            self.fail(id, &why);
        }
        if let WorkerRef::Prefill(p) = w {
            // envelopes in flight to it land nowhere: their senders get their
            // in-flight slots back (their requests failed above)
            let lost: Vec<EnvelopeId> = self
                .envelopes
                .iter()
                .enumerate()
                .filter(|(_, e)| e.in_flight && e.to == p)
                .map(|(s, e)| (e.gen as u64) << 32 | s as u64)
                .collect();
            for e in lost {
                self.on_embeddings(now, e, now);
            }
        }
    }

    fn interrupt(&mut self, reason: &str) {
        // nothing more starts, not even what was asked for before
        self.commands.clear();
        for i in 0..self.place.len() {
            self.fail(i as RequestId, reason);
        }
        for e in &mut self.encode {
            e.alive = false;
            e.timer = None;
        }
        for p in &mut self.prefill {
            p.alive = false;
        }
        for d in &mut self.decode {
            d.alive = false;
            d.in_run = false;
        }
    }

    fn place_ids(&self, place: Place) -> Vec<RequestId> {
        (0..self.place.len())
            .filter(|&i| self.place[i] == place)
            .map(|i| i as RequestId)
            .collect()
    }
}
