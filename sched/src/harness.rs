//! Virtual-clock harnesses for the scheduler, with no simulator and no executor:
//!
//! * [`Cluster`] drives a whole [`Controller`] against fake workers whose times
//!   come from a [`Service`], in the style of quinn-proto's test `Pair`: faults,
//!   interruption and SM share changes can be injected and checked.
//! * [`EncodeHarness`] drives only the encode front end — placement, the
//!   [`Batcher`] of each encode worker and the [`Router`] — so each policy can be
//!   tested alone. Encode passes take `service(k)` seconds for a batch of `k`;
//!   nothing downstream of encode is modelled there.
//! * [`Schedule`] orders what fake workers will do on a virtual clock, and
//!   [`Replay`] hands back what another driver's workers took (a
//!   [`ServiceLog`]), and [`assert_same_log`], [`assert_same_outcomes`] and
//!   [`assert_same_transfer_times`] compare two drivers' runs of the same
//!   workload: the simulator's and this harness's (`tests/drivers_agree.rs`),
//!   or the executor's (`easerve-exec`'s own tests).
//!
//! ```
//! use easerve_sched::{harness::EncodeHarness, DispatchPolicy, RouterPolicy};
//! let arrivals: Vec<f64> = (0..100).map(|i| i as f64 * 0.01).collect();
//! let mut h = EncodeHarness::new(
//!     2, &DispatchPolicy::poisson_gap(), 8, &RouterPolicy::Deficit, 0.5,
//!     |k| 0.05 + 0.01 * k as f64, arrivals,
//! );
//! h.drive();
//! assert_eq!(h.dispatched(), 100);
//! ```

use crate::driver::{self, Driver, Liveness, SerialLink, VirtualClock};
use crate::{
    Batcher, Command, Controller, ControllerConfig, Decision, DecodeRunProgress, DispatchPolicy,
    EnvelopeId, Event, LeastOutstanding, PrefillItem, Request, RequestId, RequestRecord, Route,
    Router, RouterPolicy, ServiceLog, SmSplit, WorkerRef,
};
use std::collections::{BinaryHeap, VecDeque};

// the wording of an injected kill lives with the controller's fault handling,
// shared with the simulator
pub use crate::controller::kill_reason;

/// One encode pass started by the harness.
#[derive(Clone, Debug, PartialEq)]
pub struct DispatchRecord {
    /// When the pass started.
    pub time: f64,
    /// Encode worker index.
    pub worker: usize,
    /// Requests in the micro-batch, FCFS.
    pub ids: Vec<RequestId>,
    /// Arrival time of the oldest request in the batch.
    pub oldest_arrival: f64,
    /// When the worker last became free before this pass.
    pub free_since: f64,
}

struct Worker {
    batcher: Batcher,
    busy_until: Option<f64>,
    batch_len: usize,
    free_since: f64,
}

/// The harness: a virtual clock, a list of arrival times, `n` encode workers.
pub struct EncodeHarness {
    /// Current virtual time, seconds.
    pub now: f64,
    arrivals: VecDeque<f64>,
    arrival_of: Vec<f64>,
    workers: Vec<Worker>,
    placement: LeastOutstanding,
    router: Router,
    service: Box<dyn Fn(usize) -> f64>,
    /// Every pass started, in order.
    pub log: Vec<DispatchRecord>,
    /// Every routing decision, in order.
    pub routes: Vec<(RequestId, Route)>,
}

impl EncodeHarness {
    /// A harness with `workers` encode workers, each batching with `policy` and
    /// bound `max_batch`, routing with `router` at offload `s`; passes take
    /// `service(k)` seconds; requests arrive at `arrivals` (seconds, ascending).
    pub fn new(
        workers: usize,
        policy: &DispatchPolicy,
        max_batch: usize,
        router: &RouterPolicy,
        s: f64,
        service: impl Fn(usize) -> f64 + 'static,
        arrivals: Vec<f64>,
    ) -> Self {
        let workers = (0..workers.max(1))
            .map(|_| Worker {
                batcher: Batcher::new(policy, max_batch, &service),
                busy_until: None,
                batch_len: 0,
                free_since: 0.0,
            })
            .collect::<Vec<_>>();
        EncodeHarness {
            now: 0.0,
            arrival_of: Vec::with_capacity(arrivals.len()),
            arrivals: arrivals.into(),
            placement: LeastOutstanding::new(workers.len()),
            workers,
            router: Router::new(router, s),
            service: Box::new(service),
            log: Vec::new(),
            routes: Vec::new(),
        }
    }

    /// Requests dispatched so far.
    pub fn dispatched(&self) -> usize {
        self.log.iter().map(|r| r.ids.len()).sum()
    }

    fn next_time(&self) -> Option<f64> {
        let mut t = self.arrivals.front().copied();
        let mut consider = |x: f64| t = Some(t.map_or(x, |y: f64| y.min(x)));
        for w in &self.workers {
            match w.busy_until {
                Some(b) => consider(b),
                None => {
                    if let Some(wake) = w.batcher.poll_timeout() {
                        consider(wake.max(self.now));
                    }
                }
            }
        }
        t
    }

    /// Advance to the next event and process everything due then; false when
    /// nothing is left to do.
    pub fn step(&mut self) -> bool {
        let Some(t) = self.next_time() else {
            return false;
        };
        debug_assert!(t >= self.now, "time went back");
        self.now = t;
        for (i, w) in self.workers.iter_mut().enumerate() {
            if w.busy_until.is_some_and(|b| b <= t) {
                w.busy_until = None;
                w.free_since = t;
                self.placement.complete(i, w.batch_len as f64);
            }
        }
        while self.arrivals.front().is_some_and(|&a| a <= t) {
            let a = self.arrivals.pop_front().unwrap_or(t);
            let id = self.arrival_of.len() as RequestId;
            self.arrival_of.push(a);
            let w = self.placement.assign(1.0);
            self.workers[w].batcher.on_arrival(t, id);
        }
        for (i, w) in self.workers.iter_mut().enumerate() {
            if let Some(ids) = w.batcher.poll_dispatch(t, w.busy_until.is_none()) {
                let oldest_arrival = ids
                    .iter()
                    .map(|&id| self.arrival_of[id as usize])
                    .fold(f64::INFINITY, f64::min);
                w.busy_until = Some(t + (self.service)(ids.len()));
                w.batch_len = ids.len();
                for &id in &ids {
                    self.routes.push((id, self.router.route()));
                }
                self.log.push(DispatchRecord {
                    time: t,
                    worker: i,
                    ids,
                    oldest_arrival,
                    free_since: w.free_since,
                });
            }
        }
        true
    }

    /// Run until nothing is left.
    pub fn drive(&mut self) {
        while self.step() {}
    }

    /// Run at most `max_steps` steps; true when everything finished.
    pub fn drive_bounded(&mut self, max_steps: usize) -> bool {
        for _ in 0..max_steps {
            if !self.step() {
                return true;
            }
        }
        self.next_time().is_none()
    }
}

// ------------------------------------------------------------------ Cluster

/// Service times of a [`Cluster`]'s fake workers, seconds. Each call prices
/// one unit of work as the driver starts it; the `n`-th call for a worker is
/// that worker's `n`-th unit, so a replay can hand back measured times.
pub trait Service {
    /// Host phase (overhead and preprocessing) and GPU phase of a pass of
    /// `ids` on encode worker `w` at SM share `sm_share`.
    fn encode(&mut self, w: usize, ids: &[RequestId], sm_share: f64) -> (f64, f64);
    /// A batch of `items` on prefill worker `p` at SM share `sm_share`.
    fn prefill(&mut self, p: usize, items: &[PrefillItem], sm_share: f64) -> f64;
    /// One iteration of `batch` sequences holding `context` tokens on decode worker `d`.
    fn decode(&mut self, d: usize, batch: u64, context: u64) -> f64;
    /// Moving the embeddings of `ids` off encode worker `from` (its link is
    /// serialised: a transfer waits for the one before).
    fn embeddings(&mut self, from: usize, ids: &[RequestId]) -> f64;
    /// Moving request `id`'s KV cache off prefill worker `from` (serialised).
    fn kv(&mut self, from: usize, id: RequestId) -> f64;
    /// Preprocessing request `id` in the server's front end (the aggregated
    /// system).
    fn front_end(&mut self, id: RequestId) -> f64;
    /// One iteration of aggregated replica `r` that admits `admitted` and
    /// runs `batch` sequences over `context` tokens: (its inline encode, the
    /// whole iteration).
    fn replica_step(
        &mut self,
        r: usize,
        admitted: &[RequestId],
        batch: u64,
        context: u64,
    ) -> (f64, f64);
}

#[derive(Debug)]
enum ClusterEvent {
    Arrival(RequestId),
    GpuPhase(usize, u64),
    EncodeDone(usize, u64),
    Landed(EnvelopeId, f64),
    PrefillDone(usize, u64),
    Kv(RequestId, f64),
    DecodeDone(usize, u64),
    Preprocessed(RequestId),
    /// A replica's iteration ends: (replica, generation, when its prefill began).
    ReplicaDone(usize, u64, f64),
    Fail(WorkerRef),
    /// A restarted worker is loaded: (worker, its deaths when the restart
    /// began; a death since makes it stale).
    Rejoin(WorkerRef, usize),
    Interrupt,
    /// A planner's change reaches the controller.
    Reconfigure(crate::Change),
    /// A worker's model is loaded.
    Ready(WorkerRef),
    /// A client leaves.
    Abort(RequestId),
}

/// What fake workers will do, in the order a virtual clock meets it: by
/// time (seconds), then by a tie class (lower first: the simulator's
/// completions, then transfers, then arrivals), then first in, first out.
pub struct Schedule<E> {
    heap: BinaryHeap<Due<E>>,
    seq: u64,
}

struct Due<E> {
    time: f64,
    class: u8,
    seq: u64,
    ev: E,
}

impl<E> PartialEq for Due<E> {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == std::cmp::Ordering::Equal
    }
}
impl<E> Eq for Due<E> {}
impl<E> PartialOrd for Due<E> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<E> Ord for Due<E> {
    /// Reversed: the heap pops the earliest.
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.time
            .total_cmp(&self.time)
            .then(o.class.cmp(&self.class))
            .then(o.seq.cmp(&self.seq))
    }
}

impl<E> Default for Schedule<E> {
    fn default() -> Self {
        Schedule {
            heap: BinaryHeap::new(),
            seq: 0,
        }
    }
}

impl<E> Schedule<E> {
    /// Nothing scheduled.
    pub fn new() -> Self {
        Schedule::default()
    }

    /// `ev` happens at `time` (seconds), in tie class `class`.
    pub fn push(&mut self, time: f64, class: u8, ev: E) {
        self.seq += 1;
        self.heap.push(Due {
            time,
            class,
            seq: self.seq,
            ev,
        });
    }

    /// When the next thing happens, if anything is scheduled.
    pub fn next_time(&self) -> Option<f64> {
        self.heap.peek().map(|d| d.time)
    }

    /// The next thing, if it happens at or before `now`.
    pub fn pop_due(&mut self, now: f64) -> Option<E> {
        if self.next_time()? <= now {
            self.heap.pop().map(|d| d.ev)
        } else {
            None
        }
    }
}

/// A [`Controller`] and fake workers on a virtual clock, in the style of
/// quinn-proto's test `Pair`: the driver an executor would be, with every
/// worker replaced by a [`Service`] time. Like the executor, it applies an SM
/// share change ([`Command::PrefillShare`]) at the next batch, not to the one
/// running; it records every share change it was told of.
///
/// Ties at one instant go as in the simulator: completions (and injected
/// faults), then transfers, then arrivals, then the controller's timeout.
///
/// ```
/// use easerve_sched::harness::{Cluster, Service};
/// use easerve_sched::{RequestId, PrefillItem};
/// struct Fixed;
/// impl Service for Fixed {
///     fn encode(&mut self, _: usize, ids: &[RequestId], _: f64) -> (f64, f64) {
///         (0.01, 0.02 * ids.len() as f64)
///     }
///     fn prefill(&mut self, _: usize, items: &[PrefillItem], _: f64) -> f64 {
///         0.001 * items.len() as f64
///     }
///     fn decode(&mut self, _: usize, _: u64, _: u64) -> f64 { 0.005 }
///     fn embeddings(&mut self, _: usize, _: &[RequestId]) -> f64 { 0.001 }
///     fn kv(&mut self, _: usize, _: RequestId) -> f64 { 0.001 }
///     fn front_end(&mut self, _: RequestId) -> f64 { 0.002 }
///     fn replica_step(&mut self, _: usize, a: &[RequestId], _: u64, _: u64) -> (f64, f64) {
///         (0.02 * a.len() as f64, 0.005 + 0.03 * a.len() as f64)
///     }
/// }
/// let mut c = Cluster::new(easerve_sched::harness::small_controller(20, 4.0, None), Fixed);
/// c.drive();
/// assert!(c.ctrl.is_finished());
/// assert_eq!(c.ctrl.records().iter().filter(|r| r.finish.is_some()).count(), 20);
/// ```
pub struct Cluster<S: Service> {
    /// The controller under test.
    pub ctrl: Controller,
    /// The fake workers' times.
    pub service: S,
    /// Current virtual time, seconds.
    pub now: f64,
    /// Every share change the controller issued: `(time, prefill worker, share)`.
    pub share_changes: Vec<(f64, usize, f64)>,
    /// Seconds a worker takes to load its model: a restarted one after its
    /// backoff ([`Command::Restart`]), or one a planner starts
    /// ([`Command::LoadWorker`]); 1 s by default.
    pub load_s: f64,
    /// End every decode run after its first iteration, as a driver that asked
    /// for one decision per iteration would: the reference a run's outcome
    /// is checked against (off by default).
    pub one_iteration_runs: bool,
    /// Interrupt reason, when [`Cluster::interrupt_at`] was called.
    interrupt: Option<String>,
    queue: Schedule<ClusterEvent>,
    encode_gen: Vec<u64>,
    prefill_gen: Vec<u64>,
    decode_gen: Vec<u64>,
    decode_run: Vec<DecodeRunProgress>,
    replica_gen: Vec<u64>,
    encode_link: Vec<SerialLink>,
    prefill_link: Vec<SerialLink>,
    /// Workers that died: transfers to them land at once.
    live: Liveness,
    /// Every worker stopped ([`Command::StopWorker`]): `(time, worker)`.
    pub stops: Vec<(f64, WorkerRef)>,
    /// Every death, in order (a restart that died while loading included).
    deaths: Vec<WorkerRef>,
}

const DONE: u8 = 0;
const LANDED: u8 = 1;
const ARRIVES: u8 = 2;

impl<S: Service> Cluster<S> {
    /// A cluster around `ctrl` whose requests arrive at their arrival times.
    pub fn new(ctrl: Controller, service: S) -> Self {
        let t = ctrl.topology();
        let (ne, np, nd) = (t.encode().len(), t.prefill().len(), t.decode().len());
        let nr = t.replica().len();
        let mut c = Cluster {
            service,
            now: 0.0,
            share_changes: Vec::new(),
            load_s: 1.0,
            one_iteration_runs: false,
            interrupt: None,
            queue: Schedule::new(),
            encode_gen: vec![0; ne],
            prefill_gen: vec![0; np],
            decode_gen: vec![0; nd],
            decode_run: vec![DecodeRunProgress::default(); nd],
            replica_gen: vec![0; nr],
            encode_link: vec![SerialLink::default(); ne],
            prefill_link: vec![SerialLink::default(); np],
            live: Liveness::new(),
            stops: Vec::new(),
            deaths: Vec::new(),
            ctrl,
        };
        let arrivals: Vec<(RequestId, f64)> = c
            .ctrl
            .requests()
            .iter()
            .map(|r| (r.id, r.arrival))
            .collect();
        for (id, at) in arrivals {
            c.push(at, ARRIVES, ClusterEvent::Arrival(id));
        }
        c
    }

    fn push(&mut self, time: f64, class: u8, ev: ClusterEvent) {
        self.queue.push(time, class, ev);
    }

    /// Worker `w` dies at `at` (seconds): its work in progress is lost.
    pub fn kill_at(&mut self, w: WorkerRef, at: f64) {
        self.push(at, DONE, ClusterEvent::Fail(w));
    }

    /// A planner's `change` reaches the controller at `at` (seconds).
    pub fn reconfigure_at(&mut self, at: f64, change: crate::Change) {
        self.push(at, DONE, ClusterEvent::Reconfigure(change));
    }

    /// Request `id`'s client leaves at `at` (seconds): [`Event::Abort`]
    /// with [`crate::Abort::Disconnected`], fed after the instant's other
    /// inputs, as a server hears a dropped connection after the workers.
    pub fn abort_at(&mut self, id: RequestId, at: f64) {
        self.push(at, ARRIVES, ClusterEvent::Abort(id));
    }

    /// The run is cut short at `at` with `reason`.
    pub fn interrupt_at(&mut self, at: f64, reason: &str) {
        self.interrupt = Some(reason.to_string());
        self.push(at, DONE, ClusterEvent::Interrupt);
    }

    fn deaths_of(&self, w: WorkerRef) -> usize {
        self.deaths.iter().filter(|x| **x == w).count()
    }

    /// Run the next instant ([`driver::step`]); false when nothing is left.
    pub fn step(&mut self) -> bool {
        driver::step(self)
    }

    /// Run until nothing is left.
    pub fn drive(&mut self) {
        driver::run(self)
    }

    /// What the queued input `ev` means to the controller now, if anything:
    /// the end of work a fault lost means nothing, nor does the end of a
    /// decode iteration before its run's last (the next one starts).
    fn input(&mut self, now: f64, ev: ClusterEvent) -> Option<Event> {
        Some(match ev {
            ClusterEvent::Arrival(id) => Event::Arrival { id },
            ClusterEvent::GpuPhase(w, g) if g == self.encode_gen[w] => {
                Event::EncodeGpuStarted { worker: w }
            }
            ClusterEvent::EncodeDone(w, g) if g == self.encode_gen[w] => {
                Event::EncodeDone { worker: w }
            }
            ClusterEvent::Landed(envelope, sent_at) => {
                Event::EmbeddingsLanded { envelope, sent_at }
            }
            ClusterEvent::PrefillDone(p, g) if g == self.prefill_gen[p] => {
                Event::PrefillDone { worker: p }
            }
            ClusterEvent::Kv(id, sent_at) => Event::KvLanded { id, sent_at },
            ClusterEvent::DecodeDone(d, g) if g == self.decode_gen[d] => {
                // iteration by iteration, as the executor's workers run them
                let run = &mut self.decode_run[d];
                if self.one_iteration_runs {
                    run.yield_now();
                }
                let Some(steps) = run.iteration_done() else {
                    let (batch, context) = run.next_shape();
                    let t = self.service.decode(d, batch, context);
                    self.push(now + t, DONE, ClusterEvent::DecodeDone(d, g));
                    return None;
                };
                Event::DecodeRunDone { worker: d, steps }
            }
            ClusterEvent::Preprocessed(id) => Event::Preprocessed { id },
            ClusterEvent::ReplicaDone(r, g, prefill_start) if g == self.replica_gen[r] => {
                Event::ReplicaStepDone {
                    replica: r,
                    prefill_start,
                }
            }
            ClusterEvent::Fail(w) => {
                self.live.kill(w);
                self.deaths.push(w);
                // whatever it was doing never ends
                match w {
                    WorkerRef::Encode(i) => self.encode_gen[i] += 1,
                    WorkerRef::Prefill(i) => self.prefill_gen[i] += 1,
                    WorkerRef::Decode(i) => self.decode_gen[i] += 1,
                    WorkerRef::Replica(i) => self.replica_gen[i] += 1,
                }
                Event::WorkerFailed {
                    worker: w,
                    reason: kill_reason(now),
                }
            }
            ClusterEvent::Reconfigure(change) => Event::Reconfigure { change },
            ClusterEvent::Ready(worker) => Event::WorkerLoaded { worker },
            ClusterEvent::Rejoin(w, deaths) if deaths == self.deaths_of(w) => {
                self.live.revive(w);
                Event::WorkerLoaded { worker: w }
            }
            ClusterEvent::Abort(id) => Event::Abort {
                id,
                reason: crate::Abort::Disconnected,
            },
            ClusterEvent::Interrupt => {
                // decode runs in flight go no further
                for g in self.decode_gen.iter_mut().chain(&mut self.replica_gen) {
                    *g += 1;
                }
                Event::Interrupt {
                    reason: self.interrupt.clone().unwrap_or_default(),
                }
            }
            // the end of work lost to a fault
            _ => return None,
        })
    }
}

impl<S: Service> Driver for Cluster<S> {
    fn controller(&mut self) -> &mut Controller {
        &mut self.ctrl
    }

    fn next_due(&mut self, now: f64) -> Option<Event> {
        while let Some(due) = self.queue.pop_due(now) {
            if let Some(ev) = self.input(now, due) {
                return Some(ev);
            }
        }
        None
    }

    fn carry_out(&mut self, now: f64, cmd: Command) {
        if self.live.lands_at_once(&cmd) {
            match cmd {
                Command::Embeddings { envelope, .. } => {
                    self.push(now, LANDED, ClusterEvent::Landed(envelope, now))
                }
                Command::Kv { id, .. } => self.push(now, LANDED, ClusterEvent::Kv(id, now)),
                _ => {}
            }
            return;
        }
        match cmd {
            // the host phase a pass reports ([`Service::encode`]) holds
            // whatever preprocessing it still waited for
            Command::Preprocess { .. } => {}
            Command::Encode { worker, sm_share } => {
                let (host, gpu) =
                    self.service
                        .encode(worker, self.ctrl.encode_batch(worker), sm_share);
                self.encode_gen[worker] += 1;
                let g = self.encode_gen[worker];
                self.push(now + host, DONE, ClusterEvent::GpuPhase(worker, g));
                self.push(now + host + gpu, DONE, ClusterEvent::EncodeDone(worker, g));
            }
            Command::Embeddings { envelope, from, .. } => {
                let t = self.service.embeddings(from, self.ctrl.envelope(envelope));
                let (start, end) = self.encode_link[from].send(now, t);
                self.push(end, LANDED, ClusterEvent::Landed(envelope, start));
            }
            Command::Prefill { worker, sm_share } => {
                let t = self
                    .service
                    .prefill(worker, self.ctrl.prefill_batch(worker), sm_share);
                self.prefill_gen[worker] += 1;
                let g = self.prefill_gen[worker];
                self.push(now + t, DONE, ClusterEvent::PrefillDone(worker, g));
            }
            Command::DecodeRun {
                worker,
                batch,
                context,
                steps,
            } => {
                self.decode_run[worker] = DecodeRunProgress::new(batch, context, steps);
                let t = self.service.decode(worker, batch, context);
                self.decode_gen[worker] += 1;
                let g = self.decode_gen[worker];
                self.push(now + t, DONE, ClusterEvent::DecodeDone(worker, g));
            }
            Command::DecodeYield { worker } => self.decode_run[worker].yield_now(),
            Command::PrefillShare { worker, sm_share } => {
                self.share_changes.push((now, worker, sm_share));
            }
            Command::Kv { from, id, .. } => {
                let t = self.service.kv(from, id);
                let (start, end) = self.prefill_link[from].send(now, t);
                self.push(end, LANDED, ClusterEvent::Kv(id, start));
            }
            Command::Release { .. } | Command::Discard { .. } => {}
            Command::Restart { worker, delay_s } => {
                let at = now + delay_s + self.load_s;
                let ev = ClusterEvent::Rejoin(worker, self.deaths_of(worker));
                self.push(at, DONE, ev);
            }
            Command::FrontEndPreprocess { id } => {
                let t = self.service.front_end(id);
                self.push(now + t, LANDED, ClusterEvent::Preprocessed(id));
            }
            Command::ReplicaStep {
                replica,
                batch,
                context,
            } => {
                let admitted = self.ctrl.replica_admitted(replica);
                let (t_enc, t) = self.service.replica_step(replica, admitted, batch, context);
                self.replica_gen[replica] += 1;
                let g = self.replica_gen[replica];
                let ev = ClusterEvent::ReplicaDone(replica, g, now + t_enc);
                self.push(now + t, DONE, ev);
            }
            Command::LoadWorker { worker, .. } => {
                self.push(now + self.load_s, DONE, ClusterEvent::Ready(worker));
            }
            Command::StopWorker { worker } => self.stops.push((now, worker)),
        }
    }
}

impl<S: Service> VirtualClock for Cluster<S> {
    fn now(&self) -> f64 {
        self.now
    }

    fn set_now(&mut self, t: f64) {
        self.now = t;
    }

    fn next_input(&self) -> Option<f64> {
        self.queue.next_time()
    }
}

// ------------------------------------------------------------------ Replay

/// A [`Service`] that hands back what another driver's workers took
/// ([`ServiceLog`], the simulator's), unit by unit, per worker: a driver
/// with fake workers then makes the same run. Work the log never finished
/// (lost to a fault) never ends.
pub struct Replay {
    log: ServiceLog,
    /// Per kind (encode, prefill, decode, embeddings, KV, front end,
    /// replica), per worker: the next unit.
    next: [Vec<usize>; 7],
    /// Per encode worker: the next pass's store write.
    store_next: Vec<usize>,
}

impl Replay {
    /// Replay `log`.
    pub fn new(log: ServiceLog) -> Self {
        let next = [
            vec![0; log.encode.len()],
            vec![0; log.prefill.len()],
            vec![0; log.decode.len()],
            vec![0; log.embeddings.len()],
            vec![0; log.kv.len()],
            vec![0; 1],
            vec![0; log.replica.len()],
        ];
        let store_next = vec![0; log.store_writes.len()];
        Replay {
            log,
            next,
            store_next,
        }
    }

    /// The next pass of encode worker `w` to end: its write to the shared
    /// store, (seconds after the pass ended that the store's link was free
    /// for it, seconds it held the worker's link); `(0, 0)` without one.
    pub fn store_write(&mut self, w: usize) -> (f64, f64) {
        let log = &self.log.store_writes[w];
        let i = self.store_next.get(w).copied().unwrap_or(0);
        if let Some(n) = self.store_next.get_mut(w) {
            *n += 1;
        }
        log.get(i).copied().unwrap_or((0.0, 0.0))
    }

    /// The next unit of `kind` on worker `w`.
    fn take<T: Copy>(next: &mut [Vec<usize>; 7], kind: usize, w: usize, log: &[T]) -> Option<T> {
        let i = next[kind][w];
        next[kind][w] += 1;
        log.get(i).copied()
    }
}

impl Service for Replay {
    fn encode(&mut self, w: usize, _: &[RequestId], _: f64) -> (f64, f64) {
        Self::take(&mut self.next, 0, w, &self.log.encode[w]).unwrap_or((f64::INFINITY, 0.0))
    }
    fn prefill(&mut self, p: usize, _: &[PrefillItem], _: f64) -> f64 {
        Self::take(&mut self.next, 1, p, &self.log.prefill[p]).unwrap_or(f64::INFINITY)
    }
    fn decode(&mut self, d: usize, _: u64, _: u64) -> f64 {
        Self::take(&mut self.next, 2, d, &self.log.decode[d]).unwrap_or(f64::INFINITY)
    }
    fn embeddings(&mut self, from: usize, _: &[RequestId]) -> f64 {
        Self::take(&mut self.next, 3, from, &self.log.embeddings[from]).unwrap_or(f64::INFINITY)
    }
    fn kv(&mut self, from: usize, _: RequestId) -> f64 {
        Self::take(&mut self.next, 4, from, &self.log.kv[from]).unwrap_or(f64::INFINITY)
    }
    fn front_end(&mut self, _: RequestId) -> f64 {
        Self::take(&mut self.next, 5, 0, &self.log.front_end).unwrap_or(f64::INFINITY)
    }
    fn replica_step(&mut self, r: usize, _: &[RequestId], _: u64, _: u64) -> (f64, f64) {
        Self::take(&mut self.next, 6, r, &self.log.replica[r])
            .unwrap_or((f64::INFINITY, f64::INFINITY))
    }
}

// ------------------------------------------------------ comparing two runs

/// Whether two times (seconds) or shares agree: within `1e-9` relative (of
/// the larger magnitude, at least 1), what two drivers adding the same
/// service times in another order may differ by.
pub fn close(x: f64, y: f64) -> bool {
    (x - y).abs() <= 1e-9 * x.abs().max(1.0)
}

/// Whether two decisions are the same: equal, but for their times and SM
/// shares, which need only be [`close`].
pub fn same_decision(a: &Decision, b: &Decision) -> bool {
    match (a, b) {
        (
            Decision::Dispatch {
                at: t1,
                worker: w1,
                ids: i1,
                sm_share: s1,
            },
            Decision::Dispatch {
                at: t2,
                worker: w2,
                ids: i2,
                sm_share: s2,
            },
        )
        | (
            Decision::Prefill {
                at: t1,
                worker: w1,
                ids: i1,
                sm_share: s1,
            },
            Decision::Prefill {
                at: t2,
                worker: w2,
                ids: i2,
                sm_share: s2,
            },
        ) => close(*t1, *t2) && w1 == w2 && i1 == i2 && close(*s1, *s2),
        (
            Decision::Share {
                at: t1,
                worker: w1,
                sm_share: s1,
            },
            Decision::Share {
                at: t2,
                worker: w2,
                sm_share: s2,
            },
        ) => close(*t1, *t2) && w1 == w2 && close(*s1, *s2),
        (
            Decision::DecodeRun {
                at: t1,
                worker: w1,
                batch: b1,
                context: c1,
                steps: s1,
            },
            Decision::DecodeRun {
                at: t2,
                worker: w2,
                batch: b2,
                context: c2,
                steps: s2,
            },
        ) => close(*t1, *t2) && w1 == w2 && b1 == b2 && c1 == c2 && s1 == s2,
        (
            Decision::DecodeYield { at: t1, worker: w1 },
            Decision::DecodeYield { at: t2, worker: w2 },
        ) => close(*t1, *t2) && w1 == w2,
        (
            Decision::PrefillChunk {
                at: t1,
                worker: w1,
                id: i1,
                tokens: k1,
                queued_tokens: q1,
            },
            Decision::PrefillChunk {
                at: t2,
                worker: w2,
                id: i2,
                tokens: k2,
                queued_tokens: q2,
            },
        ) => close(*t1, *t2) && (w1, i1, k1, q1) == (w2, i2, k2, q2),
        (
            Decision::ReplicaStep {
                at: t1,
                replica: r1,
                ids: i1,
                batch: b1,
                context: c1,
            },
            Decision::ReplicaStep {
                at: t2,
                replica: r2,
                ids: i2,
                batch: b2,
                context: c2,
            },
        ) => close(*t1, *t2) && r1 == r2 && i1 == i2 && b1 == b2 && c1 == c2,
        (
            Decision::Restart {
                at: t1,
                worker: w1,
                attempt: n1,
                delay_s: d1,
            },
            Decision::Restart {
                at: t2,
                worker: w2,
                attempt: n2,
                delay_s: d2,
            },
        ) => close(*t1, *t2) && w1 == w2 && n1 == n2 && close(*d1, *d2),
        (Decision::Rejoin { at: t1, worker: w1 }, Decision::Rejoin { at: t2, worker: w2 }) => {
            close(*t1, *t2) && w1 == w2
        }
        _ => a == b,
    }
}

/// Decisions of each kind in `log`: reject, place-encode, dispatch, route,
/// prefill, share, place-decode, decode run, fail, decode yield,
/// place-replica, replica step, place-shard, prefill chunk, the planner's
/// reconfigurations (a change, a worker ready or stopped), encoder-cache
/// or store lookup or store write, prefix-cache lookup, restart, rejoin, abort.
pub fn decision_kinds(log: &[Decision]) -> [usize; 20] {
    let mut n = [0usize; 20];
    for d in log {
        n[match d {
            Decision::Reject { .. } => 0,
            Decision::PlaceEncode { .. } => 1,
            Decision::Dispatch { .. } => 2,
            Decision::Route { .. } => 3,
            Decision::Prefill { .. } => 4,
            Decision::Share { .. } => 5,
            Decision::PlaceDecode { .. } => 6,
            Decision::DecodeRun { .. } => 7,
            Decision::Fail { .. } => 8,
            Decision::DecodeYield { .. } => 9,
            Decision::PlaceReplica { .. } => 10,
            Decision::ReplicaStep { .. } => 11,
            Decision::PlaceShard { .. } => 12,
            Decision::PrefillChunk { .. } => 13,
            Decision::Reconfigure { .. }
            | Decision::WorkerReady { .. }
            | Decision::LoadFailed { .. }
            | Decision::WorkerStopped { .. } => 14,
            Decision::EncoderCache { .. }
            | Decision::EncoderStore { .. }
            | Decision::StoreWrite { .. } => 15,
            Decision::PrefixCache { .. } => 16,
            Decision::Restart { .. } => 17,
            Decision::Rejoin { .. } => 18,
            Decision::Abort { .. } => 19,
        }] += 1;
    }
    n
}

/// Panic at the first decision where `driver`'s log differs from the
/// simulator's `sim` ([`same_decision`]), with the three before it, or when
/// one log is longer.
pub fn assert_same_log(sim: &[Decision], driver: &[Decision]) {
    if let Some(i) = (0..sim.len().min(driver.len())).find(|&i| !same_decision(&sim[i], &driver[i]))
    {
        panic!(
            "decision {i} differs:\n  sim:    {:?}\n  driver: {:?}\n(previous: {:?})",
            sim[i],
            driver[i],
            &sim[i.saturating_sub(3)..i]
        );
    }
    assert_eq!(
        sim.len(),
        driver.len(),
        "{:?} vs {:?}",
        decision_kinds(sim),
        decision_kinds(driver)
    );
}

/// Panic unless every request ended alike in both runs: the same encode
/// batch size, local or remote prefill, failure, and a finish time
/// [`close`] to the other's (tolerance relative to the larger of the time and 1 s).
pub fn assert_same_outcomes(a: &[RequestRecord], b: &[RequestRecord]) {
    assert_eq!(a.len(), b.len(), "request counts");
    for (a, b) in a.iter().zip(b) {
        assert_eq!(a.encode_batch, b.encode_batch, "request {}", a.id);
        assert_eq!(a.prefill_local, b.prefill_local, "request {}", a.id);
        assert_eq!(a.failure, b.failure, "request {}", a.id);
        assert_eq!(a.finish.is_some(), b.finish.is_some(), "request {}", a.id);
        if let (Some(fa), Some(fb)) = (a.finish.get(), b.finish.get()) {
            assert!(
                (fa - fb).abs() < 1e-9 * fa.max(1.0),
                "request {}: {fa} vs {fb}",
                a.id
            );
        }
    }
}

/// Panic unless every request's KV cache and embeddings left (after waiting
/// for their link), and its prefill started, at the same times in both runs.
pub fn assert_same_transfer_times(a: &[RequestRecord], b: &[RequestRecord]) {
    for (a, b) in a.iter().zip(b) {
        for (x, y) in [
            (a.kv_sent, b.kv_sent),
            (a.embedding_sent, b.embedding_sent),
            (a.prefill_start, b.prefill_start),
        ] {
            assert_eq!(x.is_some(), y.is_some(), "request {}", a.id);
            if let (Some(x), Some(y)) = (x.get(), y.get()) {
                assert!(
                    (x - y).abs() < 1e-9 * x.max(1.0),
                    "request {}: {x} vs {y}",
                    a.id
                );
            }
        }
    }
}

/// A small controller for tests and examples: `n` image requests arriving at
/// `rate` per second (evenly spaced), one encode, one remote prefill and one
/// decode worker (`1E(TP1)+1P(TP1)+1D(TP1)`), immediate dispatch with `B = 4`,
/// a roomy KV cache, and `admission_limit`. Every request needs 600 encoder
/// tokens, a 128-token prompt and 8 output tokens.
pub fn small_controller(n: usize, rate: f64, admission_limit: Option<usize>) -> Controller {
    let alloc: crate::Allocation = "1E(TP1)+1P(TP1)+1D(TP1)".parse().expect("valid allocation");
    controller_for(
        &alloc,
        None,
        SmSplit::Static(1.0),
        (0..n).map(|i| test_request(i, i as f64 / rate)).collect(),
        crate::KvBlocks::new(1 << 20, 16),
        admission_limit,
    )
}

/// A test request `i` arriving at `arrival`: one image of 600 encoder tokens
/// (576 to the LLM), a 128-token text prompt, 8 output tokens.
pub fn test_request(i: usize, arrival: f64) -> Request {
    Request {
        id: i as RequestId,
        arrival,
        prompt_tokens: 128,
        output_tokens: 8,
        items: vec![crate::MmItem::Image {
            height: 336,
            width: 336,
        }]
        .into(),
        encoder_tokens: 600,
        mm_tokens: 576,
        content: None,
    }
}

/// A controller over `requests` for `alloc`, with local prefill workers of TP
/// `local_tp` when given, SM split `split`, immediate dispatch at `B = 4`, an
/// offload ratio of 0.5 (deficit router), decode caches of `kv` and
/// `admission_limit`; the decision log is on.
pub fn controller_for(
    alloc: &crate::Allocation,
    local_tp: Option<u32>,
    split: SmSplit,
    requests: Vec<Request>,
    kv: crate::KvBlocks,
    admission_limit: Option<usize>,
) -> Controller {
    let cfg = config_for(alloc, local_tp, split, kv, admission_limit);
    Controller::new(requests, cfg)
}

/// The layout and policies of [`controller_for`], for a test that changes one
/// of them before building its controller.
pub fn config_for(
    alloc: &crate::Allocation,
    local_tp: Option<u32>,
    split: SmSplit,
    kv: crate::KvBlocks,
    admission_limit: Option<usize>,
) -> ControllerConfig {
    let topology = crate::Topology::new(alloc, local_tp);
    ControllerConfig {
        batchers: (0..alloc.encode.workers)
            .map(|_| Batcher::new(&DispatchPolicy::Immediate, 4, |k| 0.01 * k as f64))
            .collect(),
        decode: (0..alloc.decode.workers)
            .map(|_| crate::DecodeScheduler::new(kv, 64))
            .collect(),
        replicas: Vec::new(),
        topology,
        prefill_token_budget: 8192,
        prefill_max_seqs: 16,
        max_inflight_transfers: 4,
        router: (
            RouterPolicy::Deficit,
            if local_tp.is_some() { 0.5 } else { 1.0 },
        ),
        offload_tracking: None,
        split,
        admission_limit,
        limits: crate::Limits::default(),
        client_timeout_s: None,
        log_decisions: true,
        preprocess_ahead: false,
        mechanisms: crate::Mechanisms::default(),
        caches: crate::CacheConfig::default(),
        queue_area: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Decision, KvBlocks};
    use proptest::prelude::*;

    /// Fixed fake-worker times: host 10 ms, GPU 20 ms per request, prefill
    /// `prefill_s` per batch, decode 5 ms a step, transfers 1 ms.
    struct Fixed {
        prefill_s: f64,
        /// Every decode iteration run: (worker, batch, context tokens).
        decodes: Vec<(usize, u64, u64)>,
    }

    impl Service for Fixed {
        fn encode(&mut self, _: usize, ids: &[RequestId], _: f64) -> (f64, f64) {
            (0.01, 0.02 * ids.len() as f64)
        }
        fn prefill(&mut self, _: usize, _: &[PrefillItem], _: f64) -> f64 {
            self.prefill_s
        }
        fn decode(&mut self, d: usize, batch: u64, context: u64) -> f64 {
            self.decodes.push((d, batch, context));
            0.005
        }
        fn embeddings(&mut self, _: usize, _: &[RequestId]) -> f64 {
            0.001
        }
        fn kv(&mut self, _: usize, _: RequestId) -> f64 {
            0.001
        }
        fn front_end(&mut self, _: RequestId) -> f64 {
            0.002
        }
        fn replica_step(&mut self, _: usize, a: &[RequestId], _: u64, _: u64) -> (f64, f64) {
            let t_enc = 0.02 * a.len() as f64;
            (
                t_enc,
                t_enc + self.prefill_s * (!a.is_empty()) as u64 as f64 + 0.005,
            )
        }
    }

    /// A controller running the aggregated system: `replicas` replicas with
    /// decode caches of `kv`, over `n` test requests at `rate` per second.
    fn aggregated(n: usize, rate: f64, replicas: usize, kv: crate::KvBlocks) -> Controller {
        let cfg = ControllerConfig {
            batchers: Vec::new(),
            topology: crate::Topology::replicas(replicas as u32, 1),
            decode: Vec::new(),
            replicas: (0..replicas)
                .map(|_| crate::DecodeScheduler::new(kv, 64))
                .collect(),
            prefill_token_budget: 8192,
            prefill_max_seqs: 16,
            max_inflight_transfers: 4,
            router: (RouterPolicy::Deficit, 1.0),
            offload_tracking: None,
            split: SmSplit::Static(1.0),
            admission_limit: None,
            limits: crate::Limits::default(),
            client_timeout_s: None,
            log_decisions: true,
            preprocess_ahead: false,
            mechanisms: crate::Mechanisms::default(),
            caches: crate::CacheConfig::default(),
            queue_area: false,
        };
        let requests = (0..n).map(|i| test_request(i, i as f64 / rate)).collect();
        Controller::new(requests, cfg)
    }

    #[test]
    fn aggregated_replicas_encode_prefill_and_decode_in_one_iteration() {
        let mut c = Cluster::new(
            aggregated(12, 40.0, 2, crate::KvBlocks::new(1 << 20, 16)),
            fixed(),
        );
        c.drive();
        assert!(c.ctrl.is_finished());
        let recs = c.ctrl.records();
        assert!(recs
            .iter()
            .all(|r| r.finish.is_some() && r.failure.is_none()));
        let log = c.ctrl.decisions();
        // every request is placed once, on one of the two replicas, and both are used
        let placed: Vec<usize> = log
            .iter()
            .filter_map(|d| match d {
                Decision::PlaceReplica { replica, .. } => Some(*replica),
                _ => None,
            })
            .collect();
        assert_eq!(placed.len(), 12);
        assert!(placed.contains(&0) && placed.contains(&1));
        for (i, r) in recs.iter().enumerate() {
            // preprocessing in the front end comes first, then the inline
            // encode, then prefill, whose iteration emits the first token
            let arrival = i as f64 / 40.0;
            let enc = r.encode_start.get().expect("encoded inline");
            assert!(enc >= arrival + 0.002 - 1e-12, "request {i}");
            assert!(r.encode_end.get().unwrap() > enc);
            assert_eq!(r.prefill_start, r.encode_end);
            assert!(r.first_token.get().unwrap() > r.prefill_start.get().unwrap());
            // 8 output tokens: the prefill iteration's and 7 more
            assert!(r.finish.get().unwrap() >= r.first_token.get().unwrap() + 7.0 * 0.005 - 1e-9);
        }
        // an iteration admits what waits and steps every running sequence
        let steps = log
            .iter()
            .filter(|d| matches!(d, Decision::ReplicaStep { .. }))
            .count();
        // each request takes 8 iterations; requests share them
        assert!((8..8 * 12).contains(&steps), "{steps} iterations");
    }

    #[test]
    fn a_dead_replica_fails_its_requests_and_the_other_serves_on() {
        let mut c = Cluster::new(
            aggregated(20, 40.0, 2, crate::KvBlocks::new(1 << 20, 16)),
            fixed(),
        );
        c.kill_at(WorkerRef::Replica(1), 0.1);
        c.drive();
        assert!(c.ctrl.is_finished());
        let recs = c.ctrl.records();
        let failed: Vec<&str> = recs.iter().filter_map(|r| r.failure.as_deref()).collect();
        assert!(!failed.is_empty());
        assert!(failed
            .iter()
            .all(|f| f.starts_with("R1 failed: killed") || f == &"replica R1 is down"));
        let done = recs.iter().filter(|r| r.finish.is_some()).count();
        assert_eq!(done + failed.len(), 20);
        assert!(done >= 10, "{done} finished");
    }

    #[test]
    fn a_request_whose_kv_cache_never_fits_a_replica_fails() {
        // 4 blocks of 16 tokens hold 64; a request needs 128 + 576 + 8
        let mut c = Cluster::new(aggregated(3, 10.0, 1, crate::KvBlocks::new(4, 16)), fixed());
        c.drive();
        let recs = c.ctrl.records();
        assert!(recs
            .iter()
            .all(|r| r.failure.as_deref()
                == Some("its KV cache can never fit one aggregated replica")));
    }

    fn fixed() -> Fixed {
        Fixed {
            prefill_s: 0.002,
            decodes: Vec::new(),
        }
    }

    /// Decode goes in runs up to the first finishing sequence, cut short when
    /// a KV cache lands that can join: it starts at the end of the iteration
    /// in progress (one fixed 5 ms iteration at most), as deciding iteration
    /// by iteration would have it, not at the end of the run (up to 7).
    #[test]
    fn a_kv_cache_that_can_join_starts_at_the_next_iteration_not_the_run_end() {
        let mut c = Cluster::new(small_controller(40, 100.0, None), fixed());
        c.drive();
        all_ended(&c);
        let log = c.ctrl.decisions();
        let yields = log
            .iter()
            .filter(|d| matches!(d, Decision::DecodeYield { .. }))
            .count();
        let long_runs = log
            .iter()
            .filter(|d| matches!(d, Decision::DecodeRun { steps, .. } if *steps > 1))
            .count();
        assert!(
            yields > 5 && long_runs > 5,
            "{yields} yields, {long_runs} runs"
        );
        for r in c.ctrl.records() {
            let (ready, start) = (r.decode_ready.get().unwrap(), r.decode_start.get().unwrap());
            assert!(
                (0.0..0.005 + 1e-12).contains(&(start - ready)),
                "request {} waited {} s for the batch",
                r.id,
                start - ready
            );
        }
    }

    /// Decode runs decide what one decision per iteration would: with every
    /// run ended after its first iteration (the controller then decides again
    /// at every iteration), the decode workers run the same iterations (worker,
    /// batch, context, in order), and every request starts decoding and
    /// finishes at the same instant.
    #[test]
    fn decode_runs_give_the_outcome_of_one_decision_per_iteration() {
        for (n, rate) in [(40, 100.0), (60, 400.0), (30, 20.0)] {
            let mut runs = Cluster::new(small_controller(n, rate, None), fixed());
            runs.drive();
            let mut steps = Cluster::new(small_controller(n, rate, None), fixed());
            steps.one_iteration_runs = true;
            steps.drive();
            all_ended(&runs);
            all_ended(&steps);
            assert!(
                steps.service.decodes.len() > 2 * n,
                "too few iterations: {}",
                steps.service.decodes.len()
            );
            assert_eq!(runs.service.decodes, steps.service.decodes);
            for (a, b) in runs.ctrl.records().iter().zip(steps.ctrl.records()) {
                assert_eq!(a.decode_start, b.decode_start, "request {}", a.id);
                assert_eq!(a.finish, b.finish, "request {}", a.id);
            }
            let run_count = |c: &Cluster<Fixed>| {
                c.ctrl
                    .decisions()
                    .iter()
                    .filter(|d| matches!(d, Decision::DecodeRun { .. }))
                    .count()
            };
            assert!(run_count(&runs) < run_count(&steps));
        }
    }

    /// Every request reached exactly one end, and the controller is done.
    fn all_ended(c: &Cluster<Fixed>) {
        assert!(c.ctrl.is_finished());
        assert_eq!(c.ctrl.in_system(), 0);
        for r in c.ctrl.records() {
            let ends = [
                r.finish.is_some(),
                r.failure.is_some(),
                r.rejected,
                r.refused.is_some(),
                r.aborted.is_some(),
            ];
            assert_eq!(
                ends.iter().filter(|e| **e).count(),
                1,
                "request {}: {r:?}",
                r.id
            );
        }
        // nothing is left to do
        assert!(c.ctrl.poll_timeout().is_none());
    }

    fn failures(c: &Cluster<Fixed>) -> Vec<(RequestId, String)> {
        c.ctrl
            .decisions()
            .iter()
            .filter_map(|d| match d {
                Decision::Fail { id, reason } => Some((*id, reason.clone())),
                _ => None,
            })
            .collect()
    }

    /// With preprocessing pipelined, every admitted request placed on an
    /// encode worker is handed to it at once, before (and whether or not) a
    /// pass takes it; without, no such command is issued.
    #[test]
    fn placement_hands_each_request_to_its_encode_worker_for_preprocessing() {
        let alloc: crate::Allocation = "2E(TP1)+1P(TP1)+1D(TP1)".parse().unwrap();
        for ahead in [true, false] {
            let mut cfg = config_for(
                &alloc,
                None,
                SmSplit::Static(1.0),
                KvBlocks::new(1 << 20, 16),
                Some(4),
            );
            cfg.preprocess_ahead = ahead;
            // six arrivals at once: four admitted, the rest rejected
            let reqs = (0..6).map(|i| test_request(i, 0.0)).collect();
            let mut ctrl = Controller::new(reqs, cfg);
            let mut handed = Vec::new();
            let mut encoded = Vec::new();
            for id in 0..6 {
                ctrl.handle(0.0, Event::Arrival { id });
                while let Some(cmd) = ctrl.poll_command() {
                    match cmd {
                        Command::Preprocess { worker, id } => {
                            assert!(
                                !encoded.contains(&id),
                                "request {id} preprocessed after its pass"
                            );
                            assert_eq!(
                                ctrl.records()[id as usize].encode_worker,
                                Some(worker as u32)
                            );
                            handed.push(id);
                        }
                        Command::Encode { worker, .. } => {
                            encoded.extend_from_slice(ctrl.encode_batch(worker));
                        }
                        _ => {}
                    }
                }
            }
            let want: Vec<RequestId> = if ahead { (0..4).collect() } else { Vec::new() };
            assert_eq!(handed, want, "preprocess_ahead = {ahead}");
            assert!(encoded.iter().all(|id| !ahead || handed.contains(id)));
        }
    }

    #[test]
    fn admission_rejects_arrivals_beyond_the_limit() {
        // 10 arrivals in one millisecond, at most 3 admitted at a time
        let mut c = Cluster::new(small_controller(10, 10_000.0, Some(3)), fixed());
        c.drive();
        all_ended(&c);
        let rejected: Vec<RequestId> = c
            .ctrl
            .decisions()
            .iter()
            .filter_map(|d| match d {
                Decision::Reject { id, .. } => Some(*id),
                _ => None,
            })
            .collect();
        assert_eq!(rejected, (3..10).collect::<Vec<_>>());
        assert_eq!(c.ctrl.counters().rejected, 7);
        assert!(c.ctrl.records()[..3].iter().all(|r| r.finish.is_some()));
    }

    #[test]
    fn a_worker_failing_mid_pass_fails_its_pass_and_later_arrivals() {
        let mut c = Cluster::new(small_controller(20, 10.0, None), fixed());
        // request 5 arrives at 0.5 s; its pass (host 10 ms, GPU 20 ms) runs to 0.53 s
        c.kill_at(WorkerRef::Encode(0), 0.515);
        c.drive();
        all_ended(&c);
        let failed = failures(&c);
        assert_eq!(failed.first().map(|f| f.0), Some(5));
        assert!(failed[0].1.contains("E0 failed"), "{failed:?}");
        // every later arrival fails at placement
        assert_eq!(failed.len(), 15);
        assert!(failed[1..].iter().all(|f| f.1.contains("E0 is down")));
        assert!(c.ctrl.records()[..5].iter().all(|r| r.finish.is_some()));
    }

    /// A dead replica gets no more work: with two encode workers, killing one
    /// fails only what it held.
    #[test]
    fn placement_steers_around_a_dead_replica() {
        let alloc: crate::Allocation = "2E(TP1)+1P(TP1)+1D(TP1)".parse().unwrap();
        let requests = (0..20).map(|i| test_request(i, i as f64 / 10.0)).collect();
        let ctrl = controller_for(
            &alloc,
            None,
            SmSplit::Static(1.0),
            requests,
            KvBlocks::new(1 << 20, 16),
            None,
        );
        let mut c = Cluster::new(ctrl, fixed());
        c.kill_at(WorkerRef::Encode(0), 0.515);
        c.drive();
        all_ended(&c);
        let failed = failures(&c);
        assert!(failed.len() <= 1, "{failed:?}");
        let after = c.ctrl.records().iter().filter(|r| r.arrival > 0.515);
        assert!(after
            .clone()
            .all(|r| r.encode_worker == Some(1) && r.finish.is_some()));
    }

    #[test]
    fn a_worker_failing_mid_decode_fails_what_it_holds_and_what_is_sent_to_it() {
        let mut c = Cluster::new(small_controller(20, 10.0, None), fixed());
        c.kill_at(WorkerRef::Decode(0), 1.05);
        c.drive();
        all_ended(&c);
        let failed = failures(&c);
        assert!(!failed.is_empty());
        assert!(failed[0].1.contains("D0 failed"), "{failed:?}");
        assert!(failed[1..].iter().all(|f| f.1.contains("D0 is down")));
        // nothing decodes after the failure
        let last_step = c
            .ctrl
            .decisions()
            .iter()
            .filter_map(|d| match d {
                Decision::DecodeRun { at, .. } => Some(*at),
                _ => None,
            })
            .fold(0.0, f64::max);
        assert!(last_step < 1.05, "a decode run started at {last_step}");
    }

    #[test]
    fn an_interrupt_fails_everything_unfinished_and_starts_nothing() {
        let mut c = Cluster::new(small_controller(20, 10.0, None), fixed());
        c.interrupt_at(0.75, "interrupted by Ctrl-C");
        c.drive();
        all_ended(&c);
        let n = c.ctrl.decisions().len();
        let failed = failures(&c);
        assert_eq!(
            failed.len(),
            20 - c
                .ctrl
                .records()
                .iter()
                .filter(|r| r.finish.is_some())
                .count()
        );
        assert!(failed.iter().all(|f| f.1 == "interrupted by Ctrl-C"));
        // the failures are the last decisions: nothing started after them
        let first_fail = c
            .ctrl
            .decisions()
            .iter()
            .position(|d| matches!(d, Decision::Fail { .. }))
            .expect("failures");
        assert_eq!(first_fail + failed.len(), n);
    }

    #[test]
    fn a_kv_cache_that_can_never_fit_fails_the_request() {
        let alloc: crate::Allocation = "1E(TP1)+1P(TP1)+1D(TP1)".parse().unwrap();
        let requests = (0..3).map(|i| test_request(i, i as f64)).collect();
        // 8 blocks of 16 tokens: a 704-token prompt never fits
        let ctrl = controller_for(
            &alloc,
            None,
            SmSplit::Static(1.0),
            requests,
            KvBlocks::new(8, 16),
            None,
        );
        let mut c = Cluster::new(ctrl, fixed());
        c.drive();
        all_ended(&c);
        let failed = failures(&c);
        assert_eq!(failed.len(), 3);
        assert!(failed
            .iter()
            .all(|f| f.1 == "its KV cache can never fit decode worker D0"));
    }

    /// The SM share of a local prefill batch changes while it runs: when an
    /// encode pass on its GPU reaches its GPU phase (not when it is
    /// dispatched: drift regression, the controller used to count the host
    /// phase too) and when that pass ends.
    #[test]
    fn the_sm_share_changes_during_a_local_prefill_batch() {
        let alloc: crate::Allocation = "1E(TP1)+1P(TP1)+1D(TP1)".parse().unwrap();
        // time-slicing: a local batch gets half the GPU's time while an
        // encode pass holds it
        let requests = vec![test_request(0, 0.0), test_request(1, 0.031)];
        let ctrl = controller_for(
            &alloc,
            Some(1),
            SmSplit::None,
            requests,
            KvBlocks::new(1 << 20, 16),
            None,
        );
        // request 0: pass 0–30 ms, routed local (deficit router, s = 0.5),
        // its prefill runs 30–130 ms; request 1's pass starts at 31 ms, its
        // GPU phase at 41 ms, and ends at 61 ms
        let mut c = Cluster::new(
            ctrl,
            Fixed {
                prefill_s: 0.1,
                decodes: Vec::new(),
            },
        );
        c.drive();
        all_ended(&c);
        let shares: Vec<(f64, usize, f64)> = c
            .ctrl
            .decisions()
            .iter()
            .filter_map(|d| match d {
                Decision::Share {
                    at,
                    worker,
                    sm_share,
                } => Some((*at, *worker, *sm_share)),
                _ => None,
            })
            .collect();
        assert!(c.ctrl.records()[0].prefill_local);
        assert_eq!(shares.len(), 2, "{shares:?}");
        assert!((shares[0].0 - 0.041).abs() < 1e-12 && shares[0].2 == 0.5);
        assert!((shares[1].0 - 0.061).abs() < 1e-12 && shares[1].2 == 1.0);
        assert_eq!(shares[0].1, 1, "the local worker is prefill worker 1");
        // the driver was told the same
        assert_eq!(c.share_changes, shares);
    }

    fn t_enc(k: usize) -> f64 {
        0.3 + 0.02 * k as f64
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// No request is held by the batching rule beyond max_age = T_enc(B)
        /// once its worker is free; every request is dispatched exactly once.
        #[test]
        fn poisson_gap_respects_max_age_and_conserves_requests(
            gaps in proptest::collection::vec(0.0f64..0.5, 1..300),
            workers in 1usize..4,
            b in 1usize..16,
        ) {
            let mut t = 0.0;
            let arrivals: Vec<f64> = gaps.iter().map(|g| { t += g; t }).collect();
            let n = arrivals.len();
            let mut h = EncodeHarness::new(workers, &DispatchPolicy::poisson_gap(), b,
                &RouterPolicy::Deficit, 0.5, t_enc, arrivals);
            prop_assert!(h.drive_bounded(100_000));
            let max_age = t_enc(b);
            let mut seen = vec![false; n];
            for r in &h.log {
                prop_assert!(r.ids.len() <= b);
                let hold_from = r.oldest_arrival.max(r.free_since);
                prop_assert!(r.time <= hold_from.max(r.oldest_arrival + max_age) + 1e-9,
                    "dispatch at {} oldest {} free since {}", r.time, r.oldest_arrival, r.free_since);
                for &id in &r.ids {
                    prop_assert!(!seen[id as usize], "request {} dispatched twice", id);
                    seen[id as usize] = true;
                }
            }
            prop_assert!(seen.iter().all(|s| *s));
            prop_assert_eq!(h.routes.len(), n);
        }
    }

    #[test]
    fn batches_grow_with_load() {
        let mean_batch = |rate: f64| {
            let arrivals: Vec<f64> = (0..400).map(|i| i as f64 / rate).collect();
            let mut h = EncodeHarness::new(
                1,
                &DispatchPolicy::poisson_gap(),
                16,
                &RouterPolicy::Deficit,
                1.0,
                t_enc,
                arrivals,
            );
            h.drive();
            h.dispatched() as f64 / h.log.len() as f64
        };
        let (low, high) = (mean_batch(0.5), mean_batch(40.0));
        assert!((low - 1.0).abs() < 1e-9, "low-load batches {low}");
        assert!(high > 8.0, "high-load batches {high}");
    }

    // ------------------------------------------------------- supervision

    /// Decisions of `c`'s log that route to prefill worker `p`, after `t`.
    fn routes_to_after(c: &Cluster<Fixed>, p: usize, t: f64) -> usize {
        let routed_at: Vec<(RequestId, usize)> = c
            .ctrl
            .decisions()
            .iter()
            .filter_map(|d| match d {
                Decision::Route { id, worker, .. } => Some((*id, *worker)),
                _ => None,
            })
            .collect();
        routed_at
            .iter()
            .filter(|(id, w)| *w == p && c.ctrl.records()[*id as usize].arrival > t)
            .count()
    }

    /// Death → rerouting → rejoin at the prefill stage: the requests the dead
    /// remote prefill worker held go to the local one (re-run from their
    /// embeddings, none fails), the deficit counter's remote side is empty
    /// while it is down, and it takes remote routes again once it rejoins
    /// (0.5 s backoff + 1 s load).
    #[test]
    fn a_dead_prefill_worker_s_requests_go_to_the_local_worker_and_it_rejoins() {
        let alloc: crate::Allocation = "1E(TP1)+1P(TP1)+1D(TP1)".parse().unwrap();
        let requests = (0..60).map(|i| test_request(i, i as f64 / 20.0)).collect();
        let mut ctrl = controller_for(
            &alloc,
            Some(1),
            SmSplit::Static(0.5),
            requests,
            KvBlocks::new(1 << 20, 16),
            None,
        );
        ctrl.supervise(crate::Backoff::DEFAULT);
        // prefill takes 50 ms a batch: P0 holds a batch and a queue when it dies
        let mut c = Cluster::new(
            ctrl,
            Fixed {
                prefill_s: 0.05,
                decodes: Vec::new(),
            },
        );
        c.kill_at(WorkerRef::Prefill(0), 0.52);
        c.drive();
        all_ended(&c);
        assert_eq!(failures(&c), Vec::new());
        let log = c.ctrl.decisions();
        let restart = log.iter().find_map(|d| match d {
            Decision::Restart {
                worker, delay_s, ..
            } => Some((*worker, *delay_s)),
            _ => None,
        });
        assert_eq!(restart, Some((WorkerRef::Prefill(0), 0.5)));
        let back = log.iter().find_map(|d| match d {
            Decision::Rejoin { at, worker } => Some((*worker, *at)),
            _ => None,
        });
        assert_eq!(back.map(|b| b.0), Some(WorkerRef::Prefill(0)));
        assert!(close(back.unwrap().1, 0.52 + 1.5));
        // while down: no route to P0 for requests that arrived then
        let down: Vec<&RequestRecord> = c
            .ctrl
            .records()
            .iter()
            .filter(|r| r.arrival > 0.53 && r.arrival < 2.0)
            .collect();
        assert!(
            down.iter().all(|r| r.prefill_local),
            "routed remote while P0 was down"
        );
        assert!(
            routes_to_after(&c, 0, 2.1) > 0,
            "P0 took no work after rejoining"
        );
        let s = c.ctrl.supervision(c.now);
        assert_eq!((s.deaths, s.restarts), (1, 1));
        assert!(close(s.degraded_s, 1.5) && s.down_s == 0.0, "{s:?}");
        assert_eq!(c.ctrl.outages()[0].back_at, back.map(|b| b.1));
    }

    /// Death → rerouting → rejoin at the encode stage: what waited at the
    /// dead worker's batcher is placed on the live one; only its pass fails,
    /// naming it; it rejoins placement once back.
    #[test]
    fn a_dead_encode_worker_s_queue_moves_and_only_its_pass_fails() {
        let alloc: crate::Allocation = "2E(TP1)+1P(TP1)+1D(TP1)".parse().unwrap();
        // 8 arrivals in 10 ms: passes of 4 (host 10 ms, GPU 80 ms) leave a queue
        let requests = (0..40)
            .map(|i| test_request(i, 0.5 + i as f64 * 0.00125))
            .collect();
        let mut ctrl = controller_for(
            &alloc,
            None,
            SmSplit::Static(1.0),
            requests,
            KvBlocks::new(1 << 20, 16),
            None,
        );
        ctrl.supervise(crate::Backoff::DEFAULT);
        let mut c = Cluster::new(ctrl, fixed());
        c.kill_at(WorkerRef::Encode(0), 0.52);
        c.drive();
        all_ended(&c);
        let failed = failures(&c);
        // its pass, no more: every failure is a request dispatched there
        let pass: Vec<RequestId> = c
            .ctrl
            .decisions()
            .iter()
            .filter_map(|d| match d {
                Decision::Dispatch {
                    worker: 0, ids, at, ..
                } if *at < 0.52 => Some(ids.clone()),
                _ => None,
            })
            .next_back()
            .unwrap_or_default();
        assert_eq!(failed.iter().map(|f| f.0).collect::<Vec<_>>(), pass);
        assert!(failed.iter().all(|f| f.1.starts_with("E0 failed: killed")));
        // requests first placed on E0 and queued there finished on E1
        let moved = c
            .ctrl
            .decisions()
            .iter()
            .filter(|d| match d {
                Decision::PlaceEncode { id, worker: 0 } => {
                    let r = &c.ctrl.records()[*id as usize];
                    r.finish.is_some() && r.encode_worker == Some(1)
                }
                _ => false,
            })
            .count();
        assert!(moved > 0, "nothing was queued at E0 when it died");
        assert_eq!(failed.len() + c.ctrl.finished().0, 40);
        assert_eq!(c.ctrl.supervision(c.now).restarts, 1);
    }

    /// A single worker per stage: while the decode worker is down, what it
    /// held and what is sent to it fails, naming it; once it rejoins
    /// requests succeed again; a failed restart backs off longer.
    #[test]
    fn a_single_decode_worker_comes_back_and_requests_succeed_again() {
        let mut ctrl = small_controller(60, 10.0, None);
        ctrl.supervise(crate::Backoff::DEFAULT);
        let mut c = Cluster::new(ctrl, fixed());
        c.kill_at(WorkerRef::Decode(0), 1.05);
        // the first restart dies while loading (at 1.05 + 0.5 + 0.2 s)
        c.kill_at(WorkerRef::Decode(0), 1.75);
        c.drive();
        all_ended(&c);
        let failed = failures(&c);
        assert!(failed[0].1.starts_with("D0 failed"), "{failed:?}");
        assert!(failed[1..].iter().all(|f| f.1.contains("D0 is down")));
        let delays: Vec<f64> = c
            .ctrl
            .decisions()
            .iter()
            .filter_map(|d| match d {
                Decision::Restart { delay_s, .. } => Some(*delay_s),
                _ => None,
            })
            .collect();
        assert_eq!(delays, [0.5, 1.0]);
        // back at 1.75 + 1.0 + 1.0 s: later arrivals all finish
        let back = 3.75;
        let after = c.ctrl.records().iter().filter(|r| r.arrival > back);
        assert!(after.clone().count() > 10);
        assert!(after.into_iter().all(|r| r.finish.is_some()));
        let s = c.ctrl.supervision(c.now);
        assert_eq!((s.deaths, s.restarts), (2, 1));
        assert!(
            close(s.down_s, back - 1.05) && close(s.degraded_s, s.down_s),
            "{s:?}"
        );
    }

    /// `test_request(i, at)` showing item `item` (its content id) to the caches.
    fn showing(i: usize, at: f64, item: u64) -> Request {
        let mut r = test_request(i, at);
        let items = [crate::ContentItem {
            id: item,
            encoder_tokens: 600,
            llm_tokens: 576,
        }];
        let segments = [
            crate::Segment::item(0, item, 576),
            crate::Segment::text(1_000_000 + i as u64, 128),
        ];
        r.content = Some(crate::Content::new(items.into_iter(), &segments));
        r
    }

    /// The layout of [`controller_for`] for `alloc` with a shared store of
    /// `store` bytes (an item is 576 bytes) and, when given, per-worker
    /// caches of `cache` bytes.
    fn with_store(alloc: &str, cache: Option<u64>, store: u64) -> ControllerConfig {
        let alloc: crate::Allocation = alloc.parse().unwrap();
        let kv = KvBlocks::new(1 << 20, 16);
        let mut cfg = config_for(&alloc, None, SmSplit::Static(1.0), kv, None);
        cfg.caches.encoder = cache.map(|capacity_bytes| crate::EncoderCacheConfig {
            capacity_bytes,
            bytes_per_token: 1.0,
            hash_raw_bytes: false,
        });
        cfg.caches.store = Some(crate::EncoderStoreConfig {
            capacity_bytes: store,
            bytes_per_token: 1.0,
            link: None,
        });
        cfg
    }

    /// Regression: a request queued at an encode worker that died is placed
    /// again and looked up again, and both lookups were counted, so the
    /// caches' queries and hits grew with every request moved. Each
    /// request's items now count once, in the lookup its pass ran with.
    /// (The death scenario of
    /// `a_dead_encode_worker_s_queue_moves_and_only_its_pass_fails`, with
    /// runs of 3 requests for each of 4 images, caches of 2 items and the
    /// store; milliseconds.)
    #[test]
    fn a_request_moved_off_a_dead_encode_worker_counts_its_lookups_once() {
        let requests = (0..40)
            .map(|i| showing(i, 0.5 + i as f64 * 0.00125, 1 + (i as u64 / 3) % 4))
            .collect();
        let cfg = with_store("2E(TP1)+1P(TP1)+1D(TP1)", Some(1_200), 1 << 20);
        let mut ctrl = Controller::new(requests, cfg);
        ctrl.supervise(crate::Backoff::DEFAULT);
        let mut c = Cluster::new(ctrl, fixed());
        c.kill_at(WorkerRef::Encode(0), 0.52);
        c.drive();
        all_ended(&c);
        let placed = |d: &Decision| matches!(d, Decision::PlaceEncode { .. });
        let placements = c.ctrl.decisions().iter().filter(|d| placed(d)).count();
        assert!(placements > 40, "nothing was placed twice");
        let (cache, _) = c.ctrl.cache_counters();
        let (cache, store) = (
            cache.expect("cache on"),
            c.ctrl.store_counters().expect("on"),
        );
        assert_eq!(cache.queries, 40, "{cache:?}");
        assert_eq!(store.queries, cache.queries - cache.hits, "{store:?}");
        let ids = 0..40 as RequestId;
        let fetched: u32 = ids
            .clone()
            .map(|id| c.ctrl.store_hits(id).count_ones())
            .sum();
        let own: u32 =
            (ids.map(|id| (c.ctrl.encoder_hits(id) & !c.ctrl.store_hits(id)).count_ones())).sum();
        assert_eq!((cache.hits, store.hits), (own as u64, fetched as u64));
        assert_eq!(store.fetched_bytes, 576 * store.hits);
        assert!(store.hits > 0 && cache.hits > 0, "{cache:?} {store:?}");
    }

    /// The store's pending fetches are counted per key: two requests queued
    /// behind a pass, both fetching the same item, keep it pending until
    /// the second's operations are taken; one aborted before its pass went
    /// out holds it no longer. (Microseconds.)
    #[test]
    fn pending_store_fetches_are_counted_per_key() {
        const K: u64 = 7;
        let requests = [(0.0, K), (0.2, 8), (0.21, K), (0.21, K), (0.22, K)]
            .iter()
            .enumerate()
            .map(|(i, &(at, item))| showing(i, at, item))
            .collect();
        let cfg = with_store("1E(TP1)+1P(TP1)+1D(TP1)", None, 1 << 20);
        let mut ctrl = Controller::new(requests, cfg);
        ctrl.keep_encoder_ops();
        let step = |ctrl: &mut Controller, now: f64, ev: Event| {
            ctrl.handle(now, ev);
            while ctrl.poll_command().is_some() {}
        };
        // request 0's pass goes out, ends, and writes K to the store
        step(&mut ctrl, 0.0, Event::Arrival { id: 0 });
        assert_eq!(ctrl.encode_batch(0), &[0]);
        assert!(!ctrl.take_encoder_ops(0)[0].fetched);
        step(&mut ctrl, 0.01, Event::EncodeGpuStarted { worker: 0 });
        step(&mut ctrl, 0.03, Event::EncodeDone { worker: 0 });
        assert!(ctrl.store_holds(K) && !ctrl.store_fetch_pending(K));
        // request 1's pass holds the worker; 2 and 3 wait, fetching K
        step(&mut ctrl, 0.2, Event::Arrival { id: 1 });
        assert_eq!(ctrl.encode_batch(0), &[1]);
        ctrl.take_encoder_ops(1);
        step(&mut ctrl, 0.21, Event::Arrival { id: 2 });
        step(&mut ctrl, 0.21, Event::Arrival { id: 3 });
        assert_eq!(ctrl.store_fetches_pending(K), 2);
        assert!(ctrl.take_encoder_ops(2)[0].fetched);
        assert_eq!(ctrl.store_fetches_pending(K), 1);
        assert!(ctrl.store_fetch_pending(K));
        // a third waits, then its client leaves
        step(&mut ctrl, 0.22, Event::Arrival { id: 4 });
        assert_eq!(ctrl.store_fetches_pending(K), 2);
        let reason = crate::Abort::Disconnected;
        step(&mut ctrl, 0.23, Event::Abort { id: 4, reason });
        assert_eq!(ctrl.store_fetches_pending(K), 1);
        assert!(ctrl.take_encoder_ops(4).is_empty());
        assert!(ctrl.take_encoder_ops(3)[0].fetched);
        assert!(!ctrl.store_fetch_pending(K));
        assert_eq!(ctrl.store_fetches_pending(K), 0);
    }
}
