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
//!   run ended, a worker died, a request's client left, or the run is being
//!   cut short.
//! * [`Controller::handle_timeout`]`(now)`: the time [`Controller::poll_timeout`]
//!   returned has come (a batcher's deadline, or a request's: see
//!   [`ControllerConfig::client_timeout_s`]). A spurious or early call is a
//!   no-op.
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
//! At each instant `now` (never going back):
//! 1. For each input due at `now`, in the driver's order: `handle(now, event)`,
//!    then drain `poll_command()` until it returns `None`, carrying out each
//!    command in order, before the next input. A command's effects are
//!    reported back later as events (a pass ends with [`Event::EncodeDone`],
//!    and so on). Every [`Command::Embeddings`] and [`Command::Kv`] must get
//!    its landing event, even when the destination is dead (then at once, an
//!    input due at `now`): an encode worker's envelopes in flight count
//!    against its cap until they land.
//! 2. When no input is left at `now`: `handle_timeout(now)` if the time
//!    `poll_timeout()` returned has come, and drain its commands; then 1
//!    again if they made an input due.
//! 3. Read `poll_timeout()` and arrange to call `handle_timeout` then, or sooner
//!    when another input comes.
//!
//! [`crate::driver`] holds this order in one place: a driver implements
//! [`crate::Driver`] (what is due, what a command does) and calls
//! [`crate::driver::instant`], or [`crate::driver::step`] and
//! [`crate::driver::run`] on a virtual clock. The simulator,
//! `harness::Cluster`, `easerve exec` and `easerve serve` all do.
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
//! completions, then transfers, then arrivals; the timeout always goes last.
//!
//! Times are seconds since the start of the run (`f64`), as everywhere in
//! easerve. Request ids are their index in the request list.
//!
//! # Where it is
//! * `mod.rs` (here): the [`Controller`], its [`ControllerConfig`], the
//!   constructor, the entry points (`handle`, `handle_timeout`,
//!   `poll_command`, `poll_timeout`), the accessors and the bookkeeping every
//!   stage shares (the decision log, a request's end, envelope slots).
//! * `event.rs`: the inputs — [`Event`], [`WorkerRef`], [`EnvelopeId`].
//! * `command.rs`: the outputs — [`Command`] and the [`Decision`] log.
//! * `encode.rs`: arrival and admission, encode placement and dispatch, the
//!   SM share of a co-located prefill worker, the end of a pass and its
//!   prefill routing.
//! * `prefill.rs`: embeddings landing, prefill batching, the end of a batch.
//! * `decode.rs`: KV caches landing, decode runs and their ends.
//! * `replica.rs`: the aggregated system's replicas — front-end
//!   preprocessing, placement, and iterations that encode, prefill and
//!   decode together.
//! * `shards.rs`: intra-request parallelism (EPD-Serve) — a request's items
//!   as shards on several encode workers, its prefill waiting for all of them.
//! * `steps.rs`: HydraInfer's instance steps — encode workers and their local
//!   prefill worker starting work together — and its chunked prefill.
//! * `abort.rs`: a request no longer wanted (its client left, its deadline
//!   passed) leaving every queue, and the deadlines' timer.
//! * `faults.rs`: a worker's death (what becomes of its requests), its
//!   rejoin, the run's interruption, and the wording of an injected kill
//!   ([`kill_reason`]).
//! * `supervision.rs`: restarts with backoff ([`Backoff`],
//!   [`Command::Restart`]), which requests survive a death, per stage, and
//!   the run's deaths, restarts, degraded and down time ([`SupervisionCounters`]).

mod abort;
mod command;
mod decode;
mod encode;
mod event;
mod faults;
mod plan;
mod prefill;
mod replica;
mod shards;
mod steps;
mod supervision;

pub use command::{Command, Decision};
pub use encode::TIME_SLICE_SHARE;
pub use event::{EnvelopeId, Event, WorkerRef};
pub use faults::kill_reason;
pub use plan::{Change, StageLoad};
pub use supervision::{Backoff, Outage, SupervisionCounters};

use crate::mintree::MinTree;
use crate::{
    Batcher, DecodeScheduler, EncodePlacement, LeastOutstanding, Mechanisms, PrefillItem,
    PrefillQueue, Request, RequestId, RequestRecord, Router, RouterPolicy, SmSplit, Stamp,
    Topology,
};
use std::collections::VecDeque;

/// How a [`Controller`] is laid out: the deployment's workers and knobs.
pub struct ControllerConfig {
    /// One batcher per encode worker.
    pub batchers: Vec<Batcher>,
    /// The workers and where they run (remote prefill, local prefill groups).
    pub topology: Topology,
    /// One decode scheduler per decode worker.
    pub decode: Vec<DecodeScheduler>,
    /// One KV and batch scheduler per aggregated replica
    /// ([`Topology::replicas`]); non-empty only for the aggregated system,
    /// whose requests go to the front end and then to a replica
    /// (`replica.rs`), never to an encode, prefill or decode worker.
    pub replicas: Vec<DecodeScheduler>,
    /// Prefill token budget per batch.
    pub prefill_token_budget: u64,
    /// Prefill sequences per batch.
    pub prefill_max_seqs: usize,
    /// Embedding envelopes one encode worker may have in flight.
    pub max_inflight_transfers: usize,
    /// Prefill routing policy and offload ratio `s`.
    pub router: (RouterPolicy, f64),
    /// `(Λ, τ)`: the offload ratio tracks the arrival rate, tuned at `Λ`
    /// requests/s, estimated with time constant `τ` seconds
    /// ([`Router::tracking`]); `None`: `s` is fixed.
    pub offload_tracking: Option<(f64, f64)>,
    /// SM split between an encode pass and its co-located prefill worker.
    pub split: SmSplit,
    /// Admission bound: requests admitted and not yet finished; an arrival
    /// beyond it is rejected. `None` admits everything.
    pub admission_limit: Option<usize>,
    /// Seconds after its arrival at which a request is aborted if it has not
    /// finished (a client timeout: [`Event::Abort`] with
    /// [`crate::Abort::Deadline`], from the controller's own timer); `None`:
    /// no deadline unless [`Controller::set_timeout`] gives one.
    pub client_timeout_s: Option<f64>,
    /// What one request may ask for: an arrival over a limit is refused
    /// before any work ([`Decision::Reject`] with the reason).
    pub limits: crate::Limits,
    /// Keep the [`Decision`] log ([`Controller::decisions`]).
    pub log_decisions: bool,
    /// Preprocessing is a pipelined host stage: each request placed on an
    /// encode worker is handed to it at once ([`Command::Preprocess`]), so its
    /// media are preprocessed while the worker's earlier passes run. Off: an
    /// encode pass preprocesses its own micro-batch first, in series with its
    /// GPU phase. Not with [`Mechanisms::split_items`], whose shards a pass
    /// preprocesses itself.
    pub preprocess_ahead: bool,
    /// The serving system's own mechanisms ([`crate::System::mechanisms`]):
    /// encode placement, intra-request parallelism, chunked prefill,
    /// lockstep steps on a shared GPU.
    pub mechanisms: Mechanisms,
    /// The caches (all off by default): the encoder cache of each encode
    /// worker. Not with [`Mechanisms::split_items`] or aggregated replicas.
    pub caches: crate::CacheConfig,
    /// Keep each stage's queue integrated over time
    /// ([`StageLoad::queued_s`]), for a planner that reads the mean queue
    /// over its window (`planner.queue_signal = "mean"`). Each event then
    /// sums the queues of every worker: off by default.
    pub queue_area: bool,
}

/// Where a request is: a worker's index (`u32`, so that the entry kept per
/// request is 8 bytes, not 16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    NotArrived,
    Encode(u32),
    Prefill(u32),
    Decode(u32),
    /// Being preprocessed in the front end (the aggregated system).
    FrontEnd,
    Replica(u32),
    Done,
}

struct EncodeSlot {
    batcher: Batcher,
    /// The pass running, FCFS; empty when idle.
    pass: Vec<RequestId>,
    /// When the pass running started, seconds.
    since: f64,
    /// Seconds busy with passes that ended.
    busy_s: f64,
    /// Requests of the pass with items to encode ([`Controller::encoding`]).
    pass_encoding: usize,
    /// With intra-request parallelism: the item each entry of `pass` encodes.
    items: Vec<u32>,
    /// With intra-request parallelism: the shards queued at the batcher, in
    /// its order (request, item).
    queued: VecDeque<(RequestId, u32)>,
    busy: bool,
    /// Whether the pass holds the GPU's SMs (its host phase is over).
    gpu_phase: bool,
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
    /// When the batch running started, seconds.
    since: f64,
    /// Seconds busy with batches that ended.
    busy_s: f64,
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
    /// When the run in flight started, seconds.
    since: f64,
    /// Seconds busy with runs that ended.
    busy_s: f64,
    /// Sequences aborted during the run in flight: they leave at its end.
    leaving: Vec<RequestId>,
    alive: bool,
}

struct Envelope {
    gen: u32,
    from: usize,
    to: usize,
    local: bool,
    ids: Vec<RequestId>,
    /// With intra-request parallelism: the item of each entry of `ids`.
    items: Vec<u32>,
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
    /// Arrivals refused for asking more than the limits allow.
    pub refused: usize,
    /// Requests that failed (a worker died, their KV cache can never fit, or
    /// the run was interrupted).
    pub failed: usize,
    /// Requests placed on each stage (encode, prefill, decode).
    pub stage_arrivals: [u64; 3],
    /// Requests aborted (their client left, or their deadline passed).
    pub aborted: usize,
}

/// The controller (module doc).
pub struct Controller {
    requests: Vec<Request>,
    records: Vec<RequestRecord>,
    place: Vec<Place>,
    encode: Vec<EncodeSlot>,
    /// Each encode worker's batcher wake-up, when it waits on a timer
    /// (infinite when it does not).
    encode_timers: MinTree,
    encode_place: LeastOutstanding,
    router: Router,
    split: SmSplit,
    prefill: Vec<PrefillSlot>,
    topology: Topology,
    remote_place: LeastOutstanding,
    decode: Vec<DecodeSlot>,
    decode_place: LeastOutstanding,
    replicas: Vec<replica::ReplicaSlot>,
    replica_place: LeastOutstanding,
    envelopes: Vec<Envelope>,
    free_envelopes: Vec<u32>,
    max_inflight: usize,
    admission_limit: Option<usize>,
    limits: crate::Limits,
    client_timeout_s: Option<f64>,
    /// Per-request timeouts set before arrival ([`Controller::set_timeout`]).
    timeouts: std::collections::HashMap<RequestId, f64>,
    /// Deadlines armed at admission, earliest first: (seconds as bits, id).
    deadlines: std::collections::BinaryHeap<std::cmp::Reverse<(u64, RequestId)>>,
    in_system: usize,
    /// Requests finished, and the latest finish time (seconds; 0 before one).
    finished: (usize, f64),
    counters: ControllerCounters,
    log: Option<Vec<Decision>>,
    commands: VecDeque<Command>,
    /// Routing scratch (destination, ids, items), reused by every pass.
    groups: Vec<EnvelopeGroup>,
    /// Emptied envelope id vectors, for the next passes' groups.
    spare_ids: Vec<Vec<RequestId>>,
    /// Scratch for the ids a decode worker admits or finishes (each use
    /// clears it first).
    scratch_ids: Vec<RequestId>,
    preprocess_ahead: bool,
    mechanisms: Mechanisms,
    sup: supervision::Supervision,
    /// The run was interrupted: nothing rejoins.
    interrupted: bool,
    /// With intra-request parallelism, per request: the shards whose
    /// embeddings have not landed yet, and its prefill worker once the first
    /// shard was routed. Empty otherwise.
    shards: Vec<shards::ShardState>,
    /// Workers draining ([`Change::Drain`]) and the worker to start on each
    /// one's GPUs once it stopped.
    draining: Vec<(WorkerRef, Option<WorkerRef>)>,
    /// Workers loading their model ([`Command::LoadWorker`]).
    loading: Vec<WorkerRef>,
    /// The encoder cache's directory, when on.
    encoder_cache: Option<crate::EncoderCache>,
    /// With the encoder cache or the store on, per request: bit `k` set
    /// when its item `k` hit the cache of the worker it was placed on or
    /// the store. Empty otherwise.
    encoder_hits: Vec<u64>,
    /// With the store on, per request: bit `k` set when its item `k` was
    /// fetched from the store. Empty otherwise.
    store_hits: Vec<u64>,
    /// Each placed request's [`crate::ItemOp`]s, kept for a driver that
    /// holds real embeddings ([`Controller::keep_encoder_ops`]); `None`
    /// keeps nothing.
    encoder_ops: Option<crate::cache::PendingOps>,
    /// The prefix cache's directory, when on.
    prefix_cache: Option<crate::PrefixCache>,
    /// With the prefix cache on, per request: its hit tokens at the prefill
    /// worker it was queued on and the chain links pinned there. Empty
    /// otherwise.
    prefix_hits: Vec<[u32; 2]>,
    caches: crate::CacheConfig,
    /// With [`ControllerConfig::queue_area`]: each stage's queue integrated
    /// up to the last event (request-seconds), and that event's time.
    queue_area: Option<([f64; 3], f64)>,
}

/// One envelope a pass sends: its prefill worker, the requests and (with
/// intra-request parallelism) their items.
type EnvelopeGroup = (usize, Vec<RequestId>, Vec<u32>);

/// A worker index as the `u32` a request's record and place keep it in:
/// workers number at most the cluster's GPUs (a few thousand).
fn index_u32(w: usize) -> u32 {
    u32::try_from(w).expect("a worker index fits 32 bits")
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
                since: 0.0,
                busy_s: 0.0,
                pass_encoding: 0,
                items: Vec::new(),
                queued: VecDeque::new(),
                busy: false,
                gpu_phase: false,
                inflight: 0,
                local: None,
                alive: true,
            })
            .collect();
        let mech = cfg.mechanisms;
        debug_assert!(
            !(mech.split_items && cfg.preprocess_ahead),
            "shards are preprocessed by their passes"
        );
        let queue = || PrefillQueue::new(cfg.prefill_token_budget, cfg.prefill_max_seqs);
        let prefill_queue = || {
            if mech.chunked_prefill {
                PrefillQueue::chunked(cfg.prefill_token_budget, cfg.prefill_max_seqs)
            } else {
                queue()
            }
        };
        let prefill: Vec<PrefillSlot> = cfg
            .topology
            .prefill()
            .iter()
            .map(|w| PrefillSlot {
                queue: prefill_queue(),
                batch: Vec::new(),
                busy: false,
                share: 1.0,
                since: 0.0,
                busy_s: 0.0,
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
                since: 0.0,
                busy_s: 0.0,
                leaving: Vec::new(),
                alive: true,
            })
            .collect();
        let replicas: Vec<replica::ReplicaSlot> = cfg
            .replicas
            .into_iter()
            .map(|sched| replica::ReplicaSlot::new(queue(), sched))
            .collect();
        let shards = if mech.split_items {
            vec![shards::ShardState::default(); requests.len()]
        } else {
            Vec::new()
        };
        let (requests_len, encode_len) = (requests.len(), encode.len());
        let prefix_cache = cfg.caches.prefix.map(|c| prefix_cache_of(c, &prefill));
        debug_assert!(
            cfg.caches.is_off() || (!mech.split_items && replicas.is_empty()),
            "caches run on whole requests at EPD workers"
        );
        let mut ctrl = Controller {
            place: vec![Place::NotArrived; requests.len()],
            replica_place: LeastOutstanding::new(replicas.len()),
            replicas,
            records,
            requests,
            encode_place: match mech.encode_placement {
                EncodePlacement::LeastOutstanding => LeastOutstanding::new(encode.len()),
                EncodePlacement::RoundRobin => LeastOutstanding::round_robin(encode.len()),
            },
            shards,
            remote_place: LeastOutstanding::new(cfg.topology.remote_prefill()),
            decode_place: LeastOutstanding::new(decode.len()),
            router: match cfg.offload_tracking {
                Some((rate, tau)) => Router::new(&cfg.router.0, cfg.router.1).tracking(rate, tau),
                None => Router::new(&cfg.router.0, cfg.router.1),
            },
            split: cfg.split,
            topology: cfg.topology,
            encode_timers: MinTree::new(encode_len),
            encode,
            prefill,
            decode,
            envelopes: Vec::new(),
            free_envelopes: Vec::new(),
            max_inflight: cfg.max_inflight_transfers.max(1),
            admission_limit: cfg.admission_limit,
            limits: cfg.limits,
            client_timeout_s: cfg.client_timeout_s,
            timeouts: std::collections::HashMap::new(),
            deadlines: std::collections::BinaryHeap::new(),
            in_system: 0,
            finished: (0, 0.0),
            counters: ControllerCounters::default(),
            log: cfg.log_decisions.then(Vec::new),
            commands: VecDeque::new(),
            groups: Vec::new(),
            spare_ids: Vec::new(),
            scratch_ids: Vec::new(),
            preprocess_ahead: cfg.preprocess_ahead,
            mechanisms: mech,
            encoder_hits: match (cfg.caches.encoder, cfg.caches.store) {
                (None, None) => Vec::new(),
                _ => vec![0; requests_len],
            },
            store_hits: match cfg.caches.store {
                Some(_) => vec![0; requests_len],
                None => Vec::new(),
            },
            encoder_ops: None,
            encoder_cache: crate::EncoderCache::with(
                encode_len,
                cfg.caches.encoder,
                cfg.caches.store,
            ),
            prefix_hits: match cfg.caches.prefix {
                Some(_) => vec![[0; 2]; requests_len],
                None => Vec::new(),
            },
            prefix_cache,
            caches: cfg.caches,
            queue_area: cfg.queue_area.then_some(([0.0; 3], 0.0)),
            sup: supervision::Supervision::default(),
            interrupted: false,
            draining: Vec::new(),
            loading: Vec::new(),
        };
        ctrl.retire_standby();
        ctrl
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
        if self.mechanisms.split_items {
            self.shards.push(shards::ShardState::default());
        }
        if self.encoder_cache.is_some() {
            self.encoder_hits.push(0);
        }
        if self.caches.store.is_some() {
            self.store_hits.push(0);
        }
        if self.prefix_cache.is_some() {
            self.prefix_hits.push([0; 2]);
        }
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
        self.integrate_queues(now);
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
            Event::Preprocessed { id } => self.on_preprocessed(now, id),
            Event::ReplicaStepDone {
                replica,
                prefill_start,
            } => self.on_replica_step_done(now, replica, prefill_start),
            Event::WorkerFailed { worker, reason } => self.on_worker_failed(now, worker, &reason),
            Event::Abort { id, reason } => self.abort(now, id, reason),
            Event::Interrupt { reason } => self.interrupt(&reason),
            Event::Reconfigure { change } => self.on_reconfigure(now, change),
            Event::WorkerLoaded { worker } => self.on_worker_loaded(now, worker),
        }
        if !self.draining.is_empty() {
            self.check_drained(now);
        }
    }

    /// Request `id`'s own timeout, seconds after its arrival (a server's
    /// request that carries one): it is aborted then if it has not finished
    /// ([`crate::Abort::Deadline`]); with the run's
    /// [`ControllerConfig::client_timeout_s`] too, the earlier deadline holds.
    /// Set it before the request arrives; a later call is ignored.
    pub fn set_timeout(&mut self, id: RequestId, seconds: f64) {
        if self.place.get(id as usize) == Some(&Place::NotArrived) {
            self.timeouts.insert(id, seconds);
        }
    }

    /// The earliest time the controller wants [`Controller::handle_timeout`]
    /// called (absolute, seconds since the start of the run), if any.
    #[inline]
    #[must_use]
    pub fn poll_timeout(&self) -> Option<f64> {
        let t = self.next_deadline();
        match self.encode_timers.min() {
            Some((_, at)) if at < f64::INFINITY => Some(t.map_or(at, |x| x.min(at))),
            _ => t,
        }
    }

    /// A timer the controller asked for may be due at `now`: requests whose
    /// deadline passed are aborted, then every batcher whose wake-up has
    /// come is re-examined, in worker order. Spurious calls are no-ops.
    pub fn handle_timeout(&mut self, now: f64) {
        self.integrate_queues(now);
        self.expire_deadlines(now);
        let mut from = 0;
        while let Some(w) = self.encode_timers.first_at_most(from, now) {
            self.encode_timers.set(w, f64::INFINITY);
            self.try_dispatch(now, w);
            from = w + 1;
        }
        if !self.draining.is_empty() {
            self.check_drained(now);
        }
    }

    /// The next command to carry out, in order; `None` when there is none.
    #[inline]
    #[must_use]
    pub fn poll_command(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    /// The requests of the pass running on encode worker `w`, FCFS (empty when idle).
    pub fn encode_batch(&self, w: usize) -> &[RequestId] {
        &self.encode[w].pass
    }

    /// With intra-request parallelism ([`Mechanisms::split_items`]): the
    /// item (index into the request's items) each entry of
    /// [`Controller::encode_batch`]`(w)` encodes; empty when each pass
    /// encodes its requests' items whole.
    pub fn encode_items(&self, w: usize) -> &[u32] {
        &self.encode[w].items
    }

    /// The batch running on prefill worker `p` (empty when idle).
    pub fn prefill_batch(&self, p: usize) -> &[PrefillItem] {
        &self.prefill[p].batch
    }

    /// The requests of an envelope in flight (empty once it landed or is unknown).
    pub fn envelope(&self, e: EnvelopeId) -> &[RequestId] {
        self.live_envelope(e).map_or(&[], |x| &x.ids)
    }

    /// With intra-request parallelism: the item of each entry of
    /// [`Controller::envelope`]`(e)` whose embeddings it carries; empty when
    /// envelopes carry whole requests.
    pub fn envelope_items(&self, e: EnvelopeId) -> &[u32] {
        self.live_envelope(e).map_or(&[], |x| &x.items)
    }

    /// The sequences of decode worker `d`'s running batch, in no particular order.
    pub fn decode_batch(&self, d: usize) -> impl Iterator<Item = RequestId> + '_ {
        self.decode[d].sched.batch()
    }

    /// The requests aggregated replica `r`'s iteration in flight admitted (and
    /// encodes and prefills), in admission order; empty when idle.
    pub fn replica_admitted(&self, r: usize) -> &[RequestId] {
        &self.replicas[r].admitted
    }

    /// The running sequences of aggregated replica `r`, in no particular order.
    pub fn replica_batch(&self, r: usize) -> impl Iterator<Item = RequestId> + '_ {
        self.replicas[r].sched.batch()
    }

    /// Shape of decode worker `d`'s running batch: (sequences, context tokens).
    pub fn decode_shape(&self, d: usize) -> (u64, u64) {
        self.decode[d].sched.step_shape()
    }

    /// Decode worker `d`'s KV blocks: those its running sequences hold, and
    /// all of them.
    pub fn decode_kv(&self, d: usize) -> &crate::KvBlocks {
        self.decode[d].sched.kv()
    }

    /// Sequences at decode worker `d` waiting for KV blocks.
    pub fn decode_waiting(&self, d: usize) -> usize {
        self.decode[d].sched.waiting()
    }

    /// The decode worker request `id` is placed on, once its prefill placed
    /// it there (until it finishes or fails).
    pub fn decode_worker_of(&self, id: RequestId) -> Option<usize> {
        match self.place.get(id as usize) {
            Some(Place::Decode(d)) => Some(*d as usize),
            _ => None,
        }
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

    /// With the encoder cache on: bit `k` set when request `id`'s item `k`
    /// hit the cache of its encode worker, so its encode is skipped (and,
    /// with [`crate::EncoderCacheConfig::hash_raw_bytes`], its
    /// preprocessing); 0 with the cache off.
    pub fn encoder_hits(&self, id: RequestId) -> u64 {
        self.encoder_hits.get(id as usize).copied().unwrap_or(0)
    }

    /// With the shared store on: bit `k` set when request `id`'s item `k`
    /// missed its encode worker's own cache and was fetched from the store
    /// (a subset of [`Controller::encoder_hits`]); 0 with the store off.
    pub fn store_hits(&self, id: RequestId) -> u64 {
        self.store_hits.get(id as usize).copied().unwrap_or(0)
    }

    /// Bytes of request `id`'s items fetched from the store (0 with it off).
    pub fn store_fetch_bytes(&self, id: RequestId) -> u64 {
        let (Some(cache), mask) = (&self.encoder_cache, self.store_hits(id)) else {
            return 0;
        };
        self.items_of(id, mask, true)
            .map(|(_, t)| cache.item_bytes(t))
            .sum()
    }

    /// Bytes of the encoded items of requests `ids` (a pass) the store
    /// does not hold yet, each item once: what their encode worker writes
    /// there when the pass ends (0 with the store off). Read before the
    /// controller hears the pass ended.
    pub fn store_write_bytes(&self, ids: &[RequestId]) -> u64 {
        let Some(c) = self
            .encoder_cache
            .as_ref()
            .filter(|_| self.caches.store.is_some())
        else {
            return 0;
        };
        let mut items: Vec<(u64, u64)> = ids
            .iter()
            .flat_map(|&id| self.items_of(id, self.encoder_hits(id), false))
            .collect();
        items.sort_unstable();
        items.dedup_by_key(|i| i.0);
        c.unwritten_bytes(items.into_iter())
    }

    /// Request `id`'s items with content ids (ids and LLM tokens) whose bit
    /// in `mask` is `set` (items past the 64th count as clear).
    pub(super) fn items_of(
        &self,
        id: RequestId,
        mask: u64,
        set: bool,
    ) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.requests[id as usize]
            .content
            .as_ref()
            .into_iter()
            .flat_map(|c| c.items())
            .enumerate()
            .filter(move |&(k, _)| (k < 64 && mask & (1 << k) != 0) == set)
            .map(|(_, t)| (t.id, t.llm_tokens as u64))
    }

    /// The shared store's counters, when it is on.
    pub fn store_counters(&self) -> Option<crate::StoreCounters> {
        self.encoder_cache.as_ref().and_then(|c| c.store_counters())
    }

    /// Bytes of embeddings the shared store holds (0 with it off).
    pub fn encoder_store_bytes(&self) -> u64 {
        self.encoder_cache.as_ref().map_or(0, |c| c.store_bytes())
    }

    /// Keep, from now on, what each encode worker must do with each placed
    /// request's items ([`crate::ItemOp`]: reuse, store, drop), for a driver
    /// whose workers hold the embeddings ([`Controller::take_encoder_ops`]).
    /// Nothing is kept with the encoder cache off.
    pub fn keep_encoder_ops(&mut self) {
        if let Some(c) = self.encoder_cache.as_mut() {
            c.log_store_evictions();
            self.encoder_ops.get_or_insert_with(Default::default);
        }
    }

    /// With [`Controller::keep_encoder_ops`] and the shared store on: the
    /// keys the store evicted since last taken, in order, for a driver that
    /// holds the store's embeddings.
    pub fn take_store_evictions(&mut self) -> Vec<u64> {
        self.encoder_cache
            .as_mut()
            .map(|c| c.take_store_evicted())
            .unwrap_or_default()
    }

    /// Whether the store holds `key` now (false with it off).
    pub fn store_holds(&self, key: u64) -> bool {
        self.encoder_cache
            .as_ref()
            .is_some_and(|c| c.store_holds(key))
    }

    /// Whether a placed request whose operations were not taken yet
    /// ([`Controller::take_encoder_ops`]) fetches `key` from the store: its
    /// embeddings must outlive the store's eviction of it until then.
    pub fn store_fetch_pending(&self, key: u64) -> bool {
        self.store_fetches_pending(key) > 0
    }

    /// How many fetches of `key` from the store wait in placed requests
    /// whose operations were not taken yet: one per such request (twice
    /// for a request that holds the item twice), less those taken, those
    /// replaced by a later placement and those of requests that failed or
    /// were aborted before their pass went out.
    pub fn store_fetches_pending(&self, key: u64) -> u32 {
        self.encoder_ops.as_ref().map_or(0, |m| m.fetching(key))
    }

    /// Request `id`'s item operations on the encode worker it was last
    /// placed on, one per item in order (empty with the cache off, for a
    /// request without content ids, without [`Controller::keep_encoder_ops`],
    /// or once the request failed or was aborted: it will not run).
    pub fn take_encoder_ops(&mut self, id: RequestId) -> Vec<crate::ItemOp> {
        self.encoder_ops
            .as_mut()
            .map_or_else(Vec::new, |m| m.take(id))
    }

    /// Keep, from now on, what each prefill worker must do with the KV
    /// caches it computes ([`crate::PrefixOp`]: keep under the prompt's
    /// links, drop), for a driver whose workers hold the KV blocks
    /// ([`Controller::take_prefix_ops`]). Nothing with the cache off.
    pub fn keep_prefix_ops(&mut self) {
        if let Some(c) = self.prefix_cache.as_mut() {
            c.keep_ops();
        }
    }

    /// Prefill worker `p`'s prefix-cache operations since last taken, in
    /// the directory's order (empty unless [`Controller::keep_prefix_ops`]).
    pub fn take_prefix_ops(&mut self, p: usize) -> Vec<crate::PrefixOp> {
        self.prefix_cache
            .as_mut()
            .map_or_else(Vec::new, |c| c.take_ops(p))
    }

    /// With the prefix cache on: request `id`'s cached prompt tokens and
    /// the chain links that hold them at its prefill worker (`(0, 0)` with
    /// the cache off or no hit).
    pub fn prefix_hit(&self, id: RequestId) -> (u64, usize) {
        self.prefix_hits
            .get(id as usize)
            .map_or((0, 0), |h| (h[0] as u64, h[1] as usize))
    }

    /// The caches in force.
    pub fn caches(&self) -> &crate::CacheConfig {
        &self.caches
    }

    /// Each cache's lookups and hits so far: (encoder cache, prefix
    /// cache), `None` for a cache that is off.
    pub fn cache_counters(&self) -> (Option<crate::CacheCounters>, Option<crate::CacheCounters>) {
        (
            self.encoder_cache
                .as_ref()
                .filter(|c| c.per_worker())
                .map(|c| c.counters()),
            self.prefix_cache.as_ref().map(|c| c.counters()),
        )
    }

    /// Bytes of embeddings the encoder caches of every encode worker hold
    /// (0 with the cache off).
    pub fn encoder_cache_bytes(&self) -> u64 {
        self.encoder_cache
            .as_ref()
            .map_or(0, |c| (0..self.encode.len()).map(|w| c.used_bytes(w)).sum())
    }

    /// The prefix cache's block size, tokens, when it is on.
    pub fn prefix_block_size(&self) -> Option<u32> {
        self.prefix_cache.as_ref().map(|c| c.block_size())
    }

    /// With the prefix cache on: the leading prompt tokens of request `id`
    /// found cached at its prefill worker, whose prefill is skipped (its
    /// batch computes the rest, attending over the whole prompt); 0 with
    /// the cache off.
    pub fn prefix_hit_tokens(&self, id: RequestId) -> u64 {
        self.prefix_hits.get(id as usize).map_or(0, |h| h[0] as u64)
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
        self.take_encoder_ops(id);
        self.records[i].failure = Some(reason.into());
        self.counters.failed += 1;
        self.prune_deadlines();
        self.decide(|| Decision::Fail {
            id,
            reason: reason.to_string(),
        });
    }

    /// Whether request `id` was aborted ([`Controller::abort`] sets its
    /// place to `Done` first). The dense vector of places (8 bytes a
    /// request) is read first, so a request finishing its decode has its
    /// record only written (its `finish`), not read: a load that missed the
    /// caches on most requests of a 10,000,000-request run
    /// (docs/datacenter.md, "Less memory per request").
    fn aborted(&self, id: RequestId) -> bool {
        let i = id as usize;
        debug_assert!(self.records[i].aborted.is_none() || self.place[i] == Place::Done);
        self.place[i] == Place::Done && self.records[i].aborted.is_some()
    }

    fn done(&mut self, id: RequestId, at: f64) {
        let i = id as usize;
        if self.place[i] != Place::Done {
            self.records[i].finish = Stamp::at(at);
            self.place[i] = Place::Done;
            self.in_system -= 1;
            self.finished = (self.finished.0 + 1, self.finished.1.max(at));
            self.prune_deadlines();
        }
    }

    /// Request `id`'s outstanding work for least-outstanding placement on a
    /// decode worker or a replica: prompt plus output tokens.
    fn work(&self, id: RequestId) -> f64 {
        let r = &self.requests[id as usize];
        (r.prefill_tokens() + r.output_tokens as u64) as f64
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
                    items: Vec::new(),
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
        e.items.clear();
        ((e.gen as u64) << 32 | slot as u64, slot)
    }
}

/// The prefix cache with config `c`: one pool of `c.local_blocks` KV blocks
/// per local prefill worker of `prefill`, `c.remote_blocks` per remote one.
fn prefix_cache_of(c: crate::PrefixCacheConfig, prefill: &[PrefillSlot]) -> crate::PrefixCache {
    let pools = prefill.iter().map(|w| {
        if w.local {
            c.local_blocks
        } else {
            c.remote_blocks
        }
    });
    crate::PrefixCache::new(pools, c.block_size)
}
