//! The EPD controller: every orchestration decision of one run — admission,
//! placement, encode dispatch, SM share per micro-batch, prefill routing,
//! prefill batching, KV placement and decode iterations — as a sans-IO state
//! machine.
//!
//! The executor (`easerve exec`) feeds it events (an arrival, a worker
//! finished, a transfer landed, a timer fired, a worker died) with the current
//! time and carries out the [`Command`]s it returns; it never decides anything
//! itself. Every decision is also appended to a [`Decision`] log, which the
//! simulator writes too, so the two faces can be compared decision by decision
//! (`tests/exec_equality.rs`).
//!
//! Times are seconds since the start of the run (`f64`), as everywhere in
//! easerve. Request ids are their index in the request list.

use crate::{
    Batcher, DecodeScheduler, DecodeSeq, LeastOutstanding, PrefillItem, PrefillQueue, Request,
    RequestId, RequestRecord, Route, Router, RouterPolicy, SmSplit, Topology,
};
use serde::{Deserialize, Serialize};

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

/// One scheduling decision, in the order it was taken. The simulator and the
/// executor produce the same log for the same arrivals and service times.
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
    /// Prefill worker `worker` starts a batch of `ids`.
    Prefill {
        /// Time of the decision.
        at: f64,
        /// Prefill worker.
        worker: usize,
        /// Requests in the batch.
        ids: Vec<RequestId>,
    },
    /// Request `id`'s KV cache goes to decode worker `worker`.
    PlaceDecode {
        /// Request.
        id: RequestId,
        /// Decode worker.
        worker: usize,
    },
    /// Decode worker `worker` runs one iteration over `batch` sequences
    /// holding `context` tokens.
    DecodeStep {
        /// Time of the decision.
        at: f64,
        /// Decode worker.
        worker: usize,
        /// Running sequences.
        batch: u64,
        /// Total context tokens.
        context: u64,
    },
}

/// What the controller asks its executor to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Run an encode pass of `ids` on encode worker `worker` with SM share `sm_share`.
    Encode {
        /// Encode worker.
        worker: usize,
        /// Requests of the micro-batch.
        ids: Vec<RequestId>,
        /// SM (or thread) share for the pass.
        sm_share: f64,
    },
    /// Call [`Controller::on_timer`] for encode worker `worker` at `at`
    /// (replaces any earlier timer of that worker).
    Timer {
        /// Encode worker.
        worker: usize,
        /// Absolute time, seconds.
        at: f64,
    },
    /// Move the embeddings of `ids` from encode worker `from` to prefill worker
    /// `to` as one envelope; report its landing with
    /// [`Controller::on_embeddings`]. `local` envelopes stay on the encode GPU.
    Embeddings {
        /// Encode worker.
        from: usize,
        /// Prefill worker.
        to: usize,
        /// Requests.
        ids: Vec<RequestId>,
        /// Whether the destination is the co-located local prefill worker.
        local: bool,
    },
    /// Run a prefill batch on prefill worker `worker` at SM share `sm_share`.
    Prefill {
        /// Prefill worker.
        worker: usize,
        /// Requests and their prompt tokens.
        items: Vec<PrefillItem>,
        /// SM share (1 for a remote prefill worker).
        sm_share: f64,
    },
    /// Move request `id`'s KV cache from prefill worker `from` to decode worker
    /// `to`; report its landing with [`Controller::on_kv`].
    Kv {
        /// Prefill worker.
        from: usize,
        /// Decode worker.
        to: usize,
        /// Request.
        id: RequestId,
    },
    /// Run one decode iteration on `worker` over the running sequences `ids`.
    DecodeStep {
        /// Decode worker.
        worker: usize,
        /// Running sequences.
        ids: Vec<RequestId>,
        /// Their total context tokens.
        context: u64,
    },
    /// Sequences that generated their last token: decode worker `worker` may
    /// free their KV caches.
    Release {
        /// Decode worker.
        worker: usize,
        /// Finished requests.
        ids: Vec<RequestId>,
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
    pass: Option<Vec<RequestId>>,
    inflight: usize,
    local: Option<usize>,
    alive: bool,
}

struct PrefillSlot {
    queue: PrefillQueue,
    batch: Option<Vec<PrefillItem>>,
    encode_workers: Vec<usize>,
    local: bool,
    alive: bool,
}

struct DecodeSlot {
    sched: DecodeScheduler,
    stepping: bool,
    alive: bool,
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
    /// Requests that failed (a worker died, or the run was interrupted).
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
    max_inflight: usize,
    admission_limit: Option<usize>,
    in_system: usize,
    counters: ControllerCounters,
    log: Vec<Decision>,
    commands: Vec<Command>,
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
                pass: None,
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
                batch: None,
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
                stepping: false,
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
            max_inflight: cfg.max_inflight_transfers.max(1),
            admission_limit: cfg.admission_limit,
            in_system: 0,
            counters: ControllerCounters::default(),
            log: Vec::new(),
            commands: Vec::new(),
        }
    }

    /// The requests of the run.
    pub fn requests(&self) -> &[Request] {
        &self.requests
    }

    /// Lifecycle records so far, by request id.
    pub fn records(&self) -> &[RequestRecord] {
        &self.records
    }

    /// Mutable record of `id`, for times only the executor knows (e.g. when a
    /// transfer actually left).
    pub fn record_mut(&mut self, id: RequestId) -> &mut RequestRecord {
        &mut self.records[id as usize]
    }

    /// Hand over the records at the end of the run.
    pub fn into_records(self) -> Vec<RequestRecord> {
        self.records
    }

    /// Every decision so far.
    pub fn decisions(&self) -> &[Decision] {
        &self.log
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

    /// Take the commands issued since the last call, in order.
    pub fn take_commands(&mut self) -> Vec<Command> {
        std::mem::take(&mut self.commands)
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
    }

    fn done(&mut self, id: RequestId, at: f64) {
        let i = id as usize;
        if self.place[i] != Place::Done {
            self.records[i].finish = Some(at);
            self.place[i] = Place::Done;
            self.in_system -= 1;
        }
    }

    // ---------------------------------------------------------------- encode

    /// Request `id` arrives at `now`.
    pub fn on_arrival(&mut self, now: f64, id: RequestId) {
        let i = id as usize;
        if self
            .admission_limit
            .is_some_and(|cap| self.in_system >= cap)
        {
            self.place[i] = Place::Done;
            self.records[i].rejected = true;
            self.counters.rejected += 1;
            self.log.push(Decision::Reject { id });
            return;
        }
        self.in_system += 1;
        let req = &self.requests[i];
        if !req.needs_encode() || self.encode.is_empty() {
            let work = req.prefill_tokens() as f64;
            let p = self.remote_place.assign(work);
            self.log.push(Decision::Route {
                id,
                worker: p,
                local: false,
            });
            self.on_embeddings(now, p, vec![id], None);
            return;
        }
        let enc = req.encoder_tokens as f64;
        let w = self.encode_place.assign(enc);
        self.log.push(Decision::PlaceEncode { id, worker: w });
        self.records[i].encode_worker = Some(w);
        self.place[i] = Place::Encode(w);
        if !self.encode[w].alive {
            self.fail(id, &format!("encode worker E{w} is down"));
            self.encode_place.complete(w, enc);
            return;
        }
        self.encode[w].batcher.on_arrival(now, id);
        self.try_dispatch(now, w);
    }

    /// The timer of encode worker `w` fired at `now` (spurious calls are no-ops).
    pub fn on_timer(&mut self, now: f64, w: usize) {
        self.try_dispatch(now, w);
    }

    /// Requests queued at encode worker `w`.
    pub fn encode_queue_len(&self, w: usize) -> usize {
        self.encode[w].batcher.len()
    }

    fn try_dispatch(&mut self, now: f64, w: usize) {
        let colocated = self.encode[w].local.is_some();
        let worker = &mut self.encode[w];
        if !worker.alive {
            return;
        }
        // backpressure: no new pass while the worker's envelopes in flight are at the cap
        let free = worker.pass.is_none() && worker.inflight < self.max_inflight;
        match worker.batcher.poll_dispatch(now, free) {
            Some(ids) => {
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
                worker.pass = Some(ids.clone());
                self.log.push(Decision::Dispatch {
                    at: now,
                    worker: w,
                    ids: ids.clone(),
                    sm_share,
                });
                self.commands.push(Command::Encode {
                    worker: w,
                    ids,
                    sm_share,
                });
            }
            None => {
                if free {
                    if let Some(at) = worker.batcher.poll_timeout() {
                        self.commands.push(Command::Timer {
                            worker: w,
                            at: at.max(now),
                        });
                    }
                }
            }
        }
    }

    /// SM share of local prefill worker `p` now: the least over its GPUs of
    /// what the encode pass there leaves (`None` entries: time-slicing, half).
    pub fn local_prefill_share(&self, p: usize) -> f64 {
        self.prefill[p]
            .encode_workers
            .iter()
            .map(|&w| {
                let batch = self.encode[w].pass.as_ref().map(Vec::len);
                match self.split.prefill_share(batch) {
                    Some(f) => f,
                    None if batch.is_some() => 0.5,
                    None => 1.0,
                }
            })
            .fold(1.0, f64::min)
    }

    /// Encode worker `w` finished its pass at `now`: route each request's
    /// prefill (deficit router, then placement), then one embedding envelope
    /// per destination.
    pub fn on_encode_done(&mut self, now: f64, w: usize) {
        let Some(ids) = self.encode[w].pass.take() else {
            return;
        };
        let mut groups: Vec<(usize, Vec<RequestId>)> = Vec::new();
        for id in ids {
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
            self.log.push(Decision::Route {
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
        for (dest, ids) in groups {
            let local = self.prefill[dest].local;
            for &id in &ids {
                self.records[id as usize].embedding_sent = Some(now);
            }
            if !local {
                self.encode[w].inflight += 1;
            }
            self.commands.push(Command::Embeddings {
                from: w,
                to: dest,
                ids,
                local,
            });
        }
        self.try_dispatch(now, w);
    }

    // --------------------------------------------------------------- prefill

    /// Embeddings of `ids` landed at prefill worker `p` at `now`; `from` is
    /// the encode worker of a remote envelope (it frees one in-flight slot).
    pub fn on_embeddings(&mut self, now: f64, p: usize, ids: Vec<RequestId>, from: Option<usize>) {
        if let Some(w) = from {
            self.encode[w].inflight = self.encode[w].inflight.saturating_sub(1);
        }
        for id in ids {
            let i = id as usize;
            if self.place[i] == Place::Done {
                continue;
            }
            self.place[i] = Place::Prefill(p);
            if !self.prefill[p].alive {
                let why = format!(
                    "prefill worker {} is down",
                    self.label(WorkerRef::Prefill(p))
                );
                self.fail(id, &why);
                continue;
            }
            self.records[i].prefill_ready = Some(now);
            self.prefill[p].queue.push(PrefillItem {
                id,
                tokens: self.requests[i].prefill_tokens(),
            });
        }
        self.try_prefill(now, p);
        if let Some(w) = from {
            self.try_dispatch(now, w);
        }
    }

    /// Requests queued at prefill worker `p`.
    pub fn prefill_queue_len(&self, p: usize) -> usize {
        self.prefill[p].queue.len()
    }

    fn try_prefill(&mut self, now: f64, p: usize) {
        let slot = &self.prefill[p];
        if !slot.alive || slot.batch.is_some() || slot.queue.is_empty() {
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
        self.log.push(Decision::Prefill {
            at: now,
            worker: p,
            ids: items.iter().map(|i| i.id).collect(),
        });
        self.prefill[p].batch = Some(items.clone());
        self.commands.push(Command::Prefill {
            worker: p,
            items,
            sm_share,
        });
    }

    /// Prefill worker `p` finished its batch at `now` (first tokens emitted):
    /// place each KV cache on a decode worker.
    pub fn on_prefill_done(&mut self, now: f64, p: usize) {
        let Some(items) = self.prefill[p].batch.take() else {
            return;
        };
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
            self.log.push(Decision::PlaceDecode {
                id: it.id,
                worker: d,
            });
            self.place[i] = Place::Decode(d);
            self.records[i].kv_sent = Some(now);
            self.commands.push(Command::Kv {
                from: p,
                to: d,
                id: it.id,
            });
        }
        self.try_prefill(now, p);
    }

    // ---------------------------------------------------------------- decode

    /// Request `id`'s KV cache landed at decode worker `d` at `now`.
    pub fn on_kv(&mut self, now: f64, d: usize, id: RequestId) {
        let i = id as usize;
        if self.place[i] == Place::Done {
            return;
        }
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
        self.try_decode(now, d);
    }

    /// Whether decode worker `d` is running an iteration.
    pub fn decode_stepping(&self, d: usize) -> bool {
        self.decode[d].stepping
    }

    /// Start an iteration on decode worker `d` if it is idle and has work;
    /// returns its shape `(batch, context tokens)` when one started.
    pub fn try_decode(&mut self, now: f64, d: usize) -> Option<(u64, u64)> {
        let slot = &mut self.decode[d];
        if slot.stepping || !slot.alive {
            return None;
        }
        for id in slot.sched.admit() {
            self.records[id as usize].decode_start = Some(now);
        }
        let (batch, context) = slot.sched.step_shape();
        if batch == 0 {
            return None;
        }
        slot.stepping = true;
        let ids: Vec<RequestId> = slot.sched.batch().collect();
        self.log.push(Decision::DecodeStep {
            at: now,
            worker: d,
            batch,
            context,
        });
        self.commands.push(Command::DecodeStep {
            worker: d,
            ids,
            context,
        });
        Some((batch, context))
    }

    /// Decode worker `d`'s iteration ended at `now`: sequences that generated
    /// their last token finish. Does not start the next iteration (call
    /// [`Controller::try_decode`]), so a simulator can run iterations inline.
    pub fn complete_decode_step(&mut self, now: f64, d: usize) {
        let slot = &mut self.decode[d];
        if !slot.stepping {
            return;
        }
        slot.stepping = false;
        let finished = slot.sched.complete_step();
        for &id in &finished {
            let i = id as usize;
            let work =
                (self.requests[i].prefill_tokens() + self.requests[i].output_tokens as u64) as f64;
            self.decode_place.complete(d, work);
            self.done(id, now);
        }
        if !finished.is_empty() {
            self.commands.push(Command::Release {
                worker: d,
                ids: finished,
            });
        }
    }

    /// Decode worker `d`'s iteration ended at `now`; the next one starts.
    pub fn on_decode_step(&mut self, now: f64, d: usize) {
        self.complete_decode_step(now, d);
        self.try_decode(now, d);
    }

    // ---------------------------------------------------------------- faults

    /// Worker `w` died (it exited, was killed, or its connection broke):
    /// every request it holds fails with `reason`, and requests later sent to
    /// it fail on arrival there. Nothing is retried.
    pub fn on_worker_failed(&mut self, w: WorkerRef, reason: &str) {
        let label = self.label(w);
        let why = format!("{label} failed: {reason}");
        let victims: Vec<RequestId> = match w {
            WorkerRef::Encode(i) => {
                self.encode[i].alive = false;
                self.encode[i].pass = None;
                self.place_ids(Place::Encode(i))
            }
            WorkerRef::Prefill(i) => {
                self.prefill[i].alive = false;
                self.prefill[i].batch = None;
                self.place_ids(Place::Prefill(i))
            }
            WorkerRef::Decode(i) => {
                self.decode[i].alive = false;
                self.decode[i].stepping = false;
                self.place_ids(Place::Decode(i))
            }
        };
        // an encode worker that lost its local prefill partner keeps routing
        // there: those requests fail when their embeddings land
        for id in victims {
            self.fail(id, &why);
        }
    }

    /// The run is being cut short (Ctrl-C or a deadline): every request not
    /// at an end yet, arrived or not, fails with `reason`; nothing more starts.
    pub fn interrupt(&mut self, reason: &str) {
        for i in 0..self.place.len() {
            self.fail(i as RequestId, reason);
        }
        for e in &mut self.encode {
            e.alive = false;
        }
        for p in &mut self.prefill {
            p.alive = false;
        }
        for d in &mut self.decode {
            d.alive = false;
            d.stepping = false;
        }
    }

    fn place_ids(&self, place: Place) -> Vec<RequestId> {
        (0..self.place.len())
            .filter(|&i| self.place[i] == place)
            .map(|i| i as RequestId)
            .collect()
    }
}
