//! The cluster model: E/P/D workers driven by `easerve-sched`, costs from
//! `easerve-calib`, one event loop.

use crate::event::{EventQueue, Priority};
use crate::meter::GpuMeter;
use crate::output::{assemble, RunParts};
use crate::timeline::Timeline;
use easerve_calib::StageCost;
use easerve_model::ItemTokens;
use easerve_sched::{
    Batcher, Decision, DecodeScheduler, DecodeSeq, LeastOutstanding, PrefillItem, PrefillQueue,
    Request, RequestId, RequestRecord, Route, Router, SmSplit, Topology, WorkerRef,
};
use easerve_workload::generate::generate_with_tokens;
use easerve_workload::report::EncodeSummary;
use easerve_workload::scenario::System;
use easerve_workload::{Report, Scenario};
use serde_json::json;

/// Progress below this SM share counts as stalled (no completion scheduled).
const MIN_PROGRESS_SHARE: f64 = 1e-3;

#[derive(Debug)]
enum Event {
    Arrival(usize),
    BatcherWake {
        worker: usize,
        gen: u64,
    },
    EncodeGpuPhase {
        worker: usize,
    },
    EncodeDone {
        worker: usize,
        gen: u64,
    },
    /// Embeddings of a micro-batch land at prefill worker `prefill`; `from` is
    /// the sending encode worker when they crossed its link.
    EmbeddingsLand {
        prefill: usize,
        ids: Vec<RequestId>,
        from: Option<usize>,
    },
    PrefillDone {
        prefill: usize,
        gen: u64,
    },
    KvLands {
        decode: usize,
        id: RequestId,
    },
    DecodeStepDone {
        decode: usize,
    },
}

struct Pass {
    ids: Vec<RequestId>,
    start: f64,
    gpu_start: f64,
    items: Vec<ItemTokens>,
    /// Whether the pass has reached its GPU phase (it holds SMs only then).
    gpu_phase: bool,
    /// GPU seconds of work at `share`, before any slowdown.
    t_gpu_work: f64,
    share: f64,
    /// Slowdown of the GPU phase (time-slicing or bandwidth interference),
    /// re-evaluated whenever the co-located prefill starts or stops.
    slow: f64,
    /// Fraction of the GPU phase done at `last_update`.
    done_frac: f64,
    last_update: f64,
    /// Generation of its pending completion event (stale ones are ignored);
    /// 0 until the GPU phase is first scheduled.
    gen: u64,
}

struct EncodeWorker {
    gpu: u32,
    batcher: Batcher,
    pass: Option<Pass>,
    wake_gen: u64,
    /// Local prefill worker co-located on this GPU.
    local: Option<usize>,
    /// When this worker's link is free for the next embedding transfer.
    link_free_at: f64,
    /// Embedding transfers sent and not yet landed.
    inflight: usize,
    /// Generation counter of encode completion events, never reset, so an
    /// event left over from an earlier pass can never match a later one.
    done_gen: u64,
}

/// A prefill batch in flight; its progress is tracked as the fraction done so
/// a change of SM share mid-flight changes its rate, not its past.
struct PrefillJob {
    items: Vec<PrefillItem>,
    start: f64,
    seq_lens: Vec<u64>,
    done_frac: f64,
    last_update: f64,
    share: f64,
    gen: u64,
}

struct PrefillWorker {
    gpus: Vec<u32>,
    tp: u32,
    local: bool,
    /// Encode workers whose GPUs this local worker shares.
    encode_workers: Vec<usize>,
    queue: PrefillQueue,
    job: Option<PrefillJob>,
    gen: u64,
    link_free_at: f64,
}

struct DecodeWorker {
    gpus: Vec<u32>,
    tp: u32,
    sched: DecodeScheduler,
    stepping: bool,
    step_start: f64,
}

/// Everything a finished run hands back.
#[derive(Debug, Clone)]
pub struct SimOutput {
    /// The report.
    pub report: Report,
    /// Per-request lifecycle records, by request id.
    pub records: Vec<RequestRecord>,
    /// Events the engine processed.
    pub events: u64,
    /// The Chrome/Perfetto trace-event JSON, when asked for.
    pub timeline: Option<serde_json::Value>,
    /// Largest sum of the SM shares of an encode pass and a co-located local
    /// prefill on one GPU during the run (0 without local prefill); at most 1.
    pub max_sm_share_sum: f64,
    /// Every scheduling decision in order, when asked for (the same log
    /// `easerve_sched::Controller` keeps for the executor).
    pub decisions: Vec<Decision>,
}

/// What a run records beyond the report.
#[derive(Clone, Debug, Default)]
pub struct SimOptions {
    /// Record a Chrome/Perfetto timeline (one track per worker and link).
    pub timeline: bool,
    /// Record every scheduling decision ([`SimOutput::decisions`]).
    pub decisions: bool,
}

struct Sim<'a> {
    sc: &'a Scenario,
    cost: Box<dyn StageCost>,
    now: f64,
    events: EventQueue<Event>,
    requests: Vec<Request>,
    tokens: Vec<Vec<ItemTokens>>,
    records: Vec<RequestRecord>,
    split: SmSplit,
    router: Router,
    encode: Vec<EncodeWorker>,
    encode_place: LeastOutstanding,
    /// Remote prefill workers first, then local ones.
    prefill: Vec<PrefillWorker>,
    /// Where every worker runs.
    topology: Topology,
    remote_place: LeastOutstanding,
    decode: Vec<DecodeWorker>,
    decode_place: LeastOutstanding,
    meters: Vec<GpuMeter>,
    passes: usize,
    passed_requests: usize,
    remote_routed: usize,
    routed: usize,
    processed: u64,
    /// Largest sum of SM shares seen on one encode GPU (see `note_sm_shares`).
    max_sm_share_sum: f64,
    /// Decode iterations run inline (each counts as one event).
    inline_steps: u64,
    timeline: Option<Timeline>,
    log: Option<Vec<Decision>>,
    /// Requests admitted and not finished (admission control).
    in_system: usize,
}

/// Run the scenario's workload through its deployment and report, with the
/// stage costs the scenario names ([`scenario_cost`]).
pub fn simulate(sc: &Scenario) -> SimOutput {
    simulate_with(sc, scenario_cost(sc), &SimOptions::default())
}

/// The cost source a scenario names ([`Scenario::cost`]): its `profile`, else
/// measured kernels, else the roofline of its model and GPU.
pub fn scenario_cost(sc: &Scenario) -> Box<dyn StageCost> {
    sc.cost()
}

/// Run the scenario with stage costs from `cost` (measured kernels, a roofline
/// or a profile).
pub fn simulate_with(sc: &Scenario, cost: Box<dyn StageCost>, opts: &SimOptions) -> SimOutput {
    if sc.system == System::Aggregated {
        return crate::aggregated::run(sc, cost, opts);
    }
    let mut sim = Sim::new(sc, cost);
    if opts.timeline {
        sim.timeline = Some(Timeline::default());
    }
    if opts.decisions {
        sim.log = Some(Vec::new());
    }
    sim.run();
    sim.finish()
}

impl<'a> Sim<'a> {
    fn new(sc: &'a Scenario, cost: Box<dyn StageCost>) -> Self {
        let (requests, tokens) = generate_with_tokens(sc);
        let records = requests.iter().map(RequestRecord::new).collect();
        let dep = &sc.deployment;

        let (batchers, split) = sc.encode_policies(&requests, &tokens, &*cost);
        let mut batchers = batchers.into_iter();

        // where every worker runs: one layout for controller, drivers and report
        let topology = sc.topology();
        let encode: Vec<EncodeWorker> = topology
            .encode()
            .iter()
            .map(|t| EncodeWorker {
                gpu: t.gpu(),
                batcher: batchers.next().expect("one batcher per encode worker"),
                pass: None,
                wake_gen: 0,
                local: t.local_prefill,
                link_free_at: 0.0,
                inflight: 0,
                done_gen: 0,
            })
            .collect();
        let knobs = &sc.knobs;
        let new_queue = || PrefillQueue::new(knobs.prefill_token_budget, knobs.prefill_max_seqs);
        let prefill: Vec<PrefillWorker> = topology
            .prefill()
            .iter()
            .map(|t| PrefillWorker {
                gpus: t.gpus.clone(),
                tp: t.tp,
                local: t.local,
                encode_workers: t.encode_workers.clone(),
                queue: new_queue(),
                job: None,
                gen: 0,
                link_free_at: 0.0,
            })
            .collect();
        let decode: Vec<DecodeWorker> = sc
            .decode_schedulers()
            .into_iter()
            .zip(topology.decode())
            .map(|(sched, t)| DecodeWorker {
                gpus: t.gpus.clone(),
                tp: t.tp,
                sched,
                stepping: false,
                step_start: 0.0,
            })
            .collect();
        let meters = (0..sc.gpus).map(|_| GpuMeter::default()).collect();
        let mut events = EventQueue::new();
        // arrivals are sorted: only the next one waits in the queue, which keeps
        // the heap as small as the number of busy workers
        if let Some(first) = requests.first() {
            events.push(first.arrival, Priority::Arrival, Event::Arrival(0));
        }
        Sim {
            sc,
            now: 0.0,
            events,
            tokens,
            records,
            router: Router::new(&dep.router, dep.offload),
            encode_place: LeastOutstanding::new(encode.len()),
            remote_place: LeastOutstanding::new(topology.remote_prefill()),
            decode_place: LeastOutstanding::new(decode.len()),
            split,
            encode,
            prefill,
            topology,
            decode,
            meters,
            requests,
            cost,
            passes: 0,
            passed_requests: 0,
            remote_routed: 0,
            routed: 0,
            processed: 0,
            max_sm_share_sum: 0.0,
            inline_steps: 0,
            timeline: None,
            log: None,
            in_system: 0,
        }
    }

    fn run(&mut self) {
        while let Some((t, ev)) = self.events.pop() {
            self.processed += 1;
            debug_assert!(t >= self.now - 1e-9, "time went back: {t} < {}", self.now);
            self.now = t.max(self.now);
            match ev {
                Event::Arrival(i) => self.on_arrival(i),
                Event::BatcherWake { worker, gen } => {
                    if gen == self.encode[worker].wake_gen {
                        self.try_dispatch(worker);
                    }
                }
                Event::EncodeGpuPhase { worker } => self.on_encode_gpu_phase(worker),
                Event::EncodeDone { worker, gen } => {
                    if self.encode[worker]
                        .pass
                        .as_ref()
                        .is_some_and(|p| p.gen == gen)
                    {
                        self.on_encode_done(worker);
                    }
                }
                Event::EmbeddingsLand { prefill, ids, from } => {
                    if let Some(w) = from {
                        self.encode[w].inflight -= 1;
                    }
                    self.on_embeddings(prefill, ids);
                    if let Some(w) = from {
                        self.try_dispatch(w);
                    }
                }
                Event::PrefillDone { prefill, gen } => {
                    if gen == self.prefill[prefill].gen {
                        self.on_prefill_done(prefill);
                    }
                }
                Event::KvLands { decode, id } => self.on_kv(decode, id),
                Event::DecodeStepDone { decode } => self.on_decode_step(decode),
            }
        }
    }

    // ---------------------------------------------------------------- encode

    fn on_arrival(&mut self, i: usize) {
        if let Some(next) = self.requests.get(i + 1) {
            self.events
                .push(next.arrival, Priority::Arrival, Event::Arrival(i + 1));
        }
        if self
            .sc
            .knobs
            .admission_limit
            .is_some_and(|cap| self.in_system >= cap)
        {
            self.records[i].rejected = true;
            let id = self.requests[i].id;
            self.decide(|| Decision::Reject { id });
            return;
        }
        self.in_system += 1;
        let req = &self.requests[i];
        if !req.needs_encode() || self.encode.is_empty() {
            let id = req.id;
            let p = self.remote_place.assign(req.prefill_tokens() as f64);
            self.decide(|| Decision::Route {
                id,
                worker: p,
                local: false,
            });
            self.records[i].prefill_ready = Some(self.now);
            self.on_embeddings(p, vec![id]);
            return;
        }
        let id = req.id;
        let w = self.encode_place.assign(req.encoder_tokens as f64);
        self.decide(|| Decision::PlaceEncode { id, worker: w });
        self.records[i].encode_worker = Some(w);
        self.encode[w].batcher.on_arrival(self.now, id);
        self.count_encode_queue(w);
        self.try_dispatch(w);
    }

    fn try_dispatch(&mut self, w: usize) {
        let now = self.now;
        let worker = &mut self.encode[w];
        // backpressure: no new pass while the worker's envelopes in flight are at the cap
        let free = worker.pass.is_none() && worker.inflight < self.sc.knobs.max_inflight_transfers;
        match worker.batcher.poll_dispatch(now, free) {
            Some(ids) => {
                self.start_pass(w, ids);
                self.count_encode_queue(w);
            }
            None => {
                if free {
                    if let Some(wake) = worker.batcher.poll_timeout() {
                        worker.wake_gen += 1;
                        let gen = worker.wake_gen;
                        self.events.push(
                            wake.max(now),
                            Priority::Timer,
                            Event::BatcherWake { worker: w, gen },
                        );
                    }
                }
            }
        }
    }

    /// Whether the local prefill worker sharing encode worker `w`'s GPU is running.
    fn local_busy(&self, w: usize) -> bool {
        self.encode[w]
            .local
            .is_some_and(|p| self.prefill[p].job.is_some())
    }

    /// Start an encode pass: first its CPU phase (the fixed per-pass overhead
    /// and preprocessing, `t_pass + Σ t_pre`), during which the GPU is free for
    /// local prefill; then its GPU phase ([`Event::EncodeGpuPhase`]).
    fn start_pass(&mut self, w: usize, ids: Vec<RequestId>) {
        let now = self.now;
        let items: Vec<ItemTokens> = ids
            .iter()
            .flat_map(|&id| self.tokens[id as usize].iter().copied())
            .collect();
        let t = self.cost.encode(&items, 1.0);
        if self.log.is_some() {
            let sm_share = self.pass_share(w, ids.len());
            let ids = ids.clone();
            self.decide(|| Decision::Dispatch {
                at: now,
                worker: w,
                ids,
                sm_share,
            });
        }
        for &id in &ids {
            let r = &mut self.records[id as usize];
            r.encode_start = Some(now);
            r.encode_batch = Some(ids.len());
        }
        self.passes += 1;
        self.passed_requests += ids.len();
        self.encode[w].pass = Some(Pass {
            ids,
            start: now,
            gpu_start: now,
            items,
            gpu_phase: false,
            t_gpu_work: 0.0,
            share: 1.0,
            slow: 1.0,
            done_frac: 0.0,
            last_update: now,
            gen: 0,
        });
        self.events.push(
            now + t.t_pass + t.t_pre,
            Priority::Completion,
            Event::EncodeGpuPhase { worker: w },
        );
    }

    /// The GPU phase of a pass starts: take the SM share the split gives this
    /// batch (the full GPU without a co-located prefill worker), slowed by
    /// bandwidth interference or time-slicing when local prefill is running.
    fn on_encode_gpu_phase(&mut self, w: usize) {
        let now = self.now;
        let Some(pass) = self.encode[w].pass.as_ref() else {
            return;
        };
        let share = self.pass_share(w, pass.ids.len());
        let t_gpu = self.cost.encode(&pass.items, share).t_gpu;
        let gpu = self.encode[w].gpu as usize;
        self.meters[gpu].begin(now);
        if let Some(pass) = self.encode[w].pass.as_mut() {
            pass.gpu_phase = true;
            pass.gpu_start = now;
            pass.share = share;
            pass.t_gpu_work = t_gpu;
            pass.last_update = now;
        }
        self.rerate_encode(w);
        self.rerate_local(w);
    }

    /// SM share of a pass of `batch` requests on encode worker `w`: the
    /// split's share next to a local prefill worker; alone on its GPU, or
    /// time-slicing, all SMs (slowed while shared).
    fn pass_share(&self, w: usize, batch: usize) -> f64 {
        match self.split.encode_share(batch) {
            Some(f) if self.encode[w].local.is_some() => f,
            _ => 1.0,
        }
    }

    /// Append a decision to the log, when one is kept.
    fn decide(&mut self, d: impl FnOnce() -> Decision) {
        if let Some(log) = self.log.as_mut() {
            log.push(d());
        }
    }

    /// Slowdown of encode worker `w`'s GPU phase given whether its co-located
    /// prefill is running: bandwidth interference under an SM partition,
    /// half the GPU's time (less the switching penalty) under time-slicing.
    fn encode_slowdown(&self, w: usize) -> f64 {
        if !self.local_busy(w) {
            return 1.0;
        }
        match self.split.encode_share(1) {
            Some(_) => 1.0 + self.cost.bandwidth_interference(),
            None => 2.0 * (1.0 + self.cost.time_slice_penalty()),
        }
    }

    /// (Re)schedule the end of encode worker `w`'s GPU phase at its current
    /// slowdown, keeping the work already done.
    fn rerate_encode(&mut self, w: usize) {
        let now = self.now;
        let slow = self.encode_slowdown(w);
        let worker = &mut self.encode[w];
        let Some(pass) = worker.pass.as_mut().filter(|p| p.gpu_phase) else {
            return;
        };
        if pass.gen > 0 && pass.t_gpu_work > 0.0 {
            pass.done_frac += (now - pass.last_update) / (pass.t_gpu_work * pass.slow);
            pass.done_frac = pass.done_frac.min(1.0);
        }
        pass.last_update = now;
        pass.slow = slow;
        worker.done_gen += 1;
        pass.gen = worker.done_gen;
        let end = now + (1.0 - pass.done_frac) * pass.t_gpu_work * slow;
        let gen = pass.gen;
        self.events.push(
            end,
            Priority::Completion,
            Event::EncodeDone { worker: w, gen },
        );
    }

    fn on_encode_done(&mut self, w: usize) {
        let now = self.now;
        let Some(pass) = self.encode[w].pass.take() else {
            return;
        };
        debug_assert!(
            pass.t_gpu_work <= 0.0
                || (pass.done_frac + (now - pass.last_update) / (pass.t_gpu_work * pass.slow)
                    - 1.0)
                    .abs()
                    < 1e-6,
            "encode pass of worker {w} ended before its GPU work was done"
        );
        let gpu = self.encode[w].gpu as usize;
        self.meters[gpu].end(now);
        // SM-time is the work done (unslowed GPU time at its share)
        self.meters[gpu].add_sm_time(pass.t_gpu_work * pass.share);
        if let Some(tl) = self.timeline.as_mut() {
            let args = json!({ "batch": pass.ids.len(), "sm_share": pass.share, "gpu_start_s": pass.gpu_start });
            tl.slice(
                &format!("E{w} encode"),
                "encode pass",
                pass.start,
                now,
                args,
            );
        }
        self.rerate_local(w);
        // route, then one transfer per destination
        let mut groups: Vec<(usize, Vec<RequestId>)> = Vec::new();
        for &id in &pass.ids {
            let i = id as usize;
            self.records[i].encode_end = Some(now);
            self.encode_place
                .complete(w, self.requests[i].encoder_tokens as f64);
            let route = match self.encode[w].local {
                Some(_) => self.router.route(),
                None => Route::Remote,
            };
            self.routed += 1;
            let dest = match route {
                Route::Remote => {
                    self.remote_routed += 1;
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
            match groups.iter_mut().find(|g| g.0 == dest) {
                Some(g) => g.1.push(id),
                None => groups.push((dest, vec![id])),
            }
        }
        let emb_per_token = self.sc.model.embedding_bytes_per_token();
        for (dest, ids) in groups {
            let remote = !self.prefill[dest].local;
            let (sent, land) = if !remote {
                (now, now) // embeddings stay in the encode GPU's memory
            } else {
                let bytes: f64 = ids
                    .iter()
                    .map(|&id| self.requests[id as usize].mm_tokens as f64)
                    .sum::<f64>()
                    * emb_per_token;
                let start = self.encode[w].link_free_at.max(now);
                let end = start + self.cost.transfer(bytes);
                self.encode[w].link_free_at = end;
                if let Some(tl) = self.timeline.as_mut() {
                    let args =
                        json!({ "requests": ids.len(), "bytes": bytes, "to": format!("P{dest}") });
                    tl.slice(&format!("E{w} link"), "embeddings", start, end, args);
                }
                (start, end)
            };
            for &id in &ids {
                self.records[id as usize].embedding_sent = Some(sent);
            }
            self.events.push(
                land,
                Priority::Transfer,
                Event::EmbeddingsLand {
                    prefill: dest,
                    ids,
                    from: remote.then_some(w),
                },
            );
            if remote {
                self.encode[w].inflight += 1;
            }
        }
        self.try_dispatch(w);
    }

    // --------------------------------------------------------------- prefill

    /// SM share available to local prefill worker `p` now: the least over its GPUs.
    fn local_share(&self, p: usize) -> f64 {
        self.prefill[p]
            .encode_workers
            .iter()
            .map(|&w| {
                let batch = self.encode[w]
                    .pass
                    .as_ref()
                    .filter(|x| x.gpu_phase)
                    .map(|x| x.ids.len());
                match self.split.prefill_share(batch) {
                    Some(f) => f,
                    None if batch.is_some() => 0.5 / (1.0 + self.cost.time_slice_penalty()),
                    None => 1.0,
                }
            })
            .fold(1.0, f64::min)
    }

    fn prefill_time(&self, p: usize, seq_lens: &[u64], share: f64) -> f64 {
        self.cost.prefill(seq_lens, self.prefill[p].tp, share)
    }

    /// Re-rate the local prefill job sharing encode worker `w`'s GPU after its
    /// SM share changed.
    fn rerate_local(&mut self, w: usize) {
        let Some(p) = self.encode[w].local else {
            return;
        };
        if self.prefill[p].job.is_none() {
            return;
        }
        let now = self.now;
        let new_share = self.local_share(p);
        let job = self.prefill[p].job.as_ref().expect("checked");
        let old_dur = if job.share >= MIN_PROGRESS_SHARE {
            self.prefill_time(p, &job.seq_lens, job.share)
        } else {
            f64::INFINITY
        };
        let progressed = (now - job.last_update) / old_dur;
        let old_share = job.share;
        let new_dur = if new_share >= MIN_PROGRESS_SHARE {
            self.prefill_time(p, &job.seq_lens, new_share)
        } else {
            f64::INFINITY
        };
        let gpus = self.prefill[p].gpus.clone();
        let worker = &mut self.prefill[p];
        let job = worker.job.as_mut().expect("checked");
        job.done_frac = (job.done_frac + progressed).min(1.0);
        for &g in &gpus {
            self.meters[g as usize].add_sm_time((now - job.last_update) * old_share);
        }
        job.last_update = now;
        job.share = new_share;
        worker.gen += 1;
        job.gen = worker.gen;
        self.note_sm_shares(p);
        let worker = &mut self.prefill[p];
        if new_dur.is_finite() {
            let job = worker.job.as_mut().expect("checked");
            let remaining = (1.0 - job.done_frac) * new_dur;
            self.events.push(
                now + remaining,
                Priority::Completion,
                Event::PrefillDone {
                    prefill: p,
                    gen: worker.gen,
                },
            );
        }
    }

    /// Record the SM shares in force on local prefill worker `p`'s GPUs: the
    /// encode pass's effective share (its share over its slowdown) plus local
    /// prefill's. The report carries the largest sum seen; it never exceeds 1.
    fn note_sm_shares(&mut self, p: usize) {
        let Some(job) = self.prefill[p].job.as_ref() else {
            return;
        };
        for &w in &self.prefill[p].encode_workers {
            let encode = self.encode[w]
                .pass
                .as_ref()
                .filter(|x| x.gpu_phase)
                .map_or(0.0, |x| x.share / x.slow);
            self.max_sm_share_sum = self.max_sm_share_sum.max(encode + job.share);
        }
    }

    fn on_embeddings(&mut self, p: usize, ids: Vec<RequestId>) {
        for id in ids {
            let i = id as usize;
            self.records[i].prefill_ready = Some(self.now);
            self.prefill[p].queue.push(PrefillItem {
                id,
                tokens: self.requests[i].prefill_tokens(),
            });
        }
        self.try_prefill(p);
        self.count_prefill_queue(p);
    }

    /// Worker label of prefill worker `p`: `P{i}` remote, `L{j}` local.
    fn prefill_label(&self, p: usize) -> &str {
        self.topology.label(WorkerRef::Prefill(p))
    }

    fn count_encode_queue(&mut self, w: usize) {
        if let Some(tl) = self.timeline.as_mut() {
            tl.counter(
                &format!("E{w} queue"),
                self.now,
                self.encode[w].batcher.len() as f64,
            );
        }
    }

    fn count_prefill_queue(&mut self, p: usize) {
        if self.timeline.is_some() {
            let name = format!("{} queue", self.prefill_label(p));
            let len = self.prefill[p].queue.len() as f64;
            if let Some(tl) = self.timeline.as_mut() {
                tl.counter(&name, self.now, len);
            }
        }
    }

    fn try_prefill(&mut self, p: usize) {
        if self.prefill[p].job.is_some() || self.prefill[p].queue.is_empty() {
            return;
        }
        let now = self.now;
        let items = self.prefill[p].queue.next_batch();
        for it in &items {
            self.records[it.id as usize].prefill_start = Some(now);
        }
        self.decide(|| Decision::Prefill {
            at: now,
            worker: p,
            ids: items.iter().map(|i| i.id).collect(),
        });
        let seq_lens: Vec<u64> = items.iter().map(|i| i.tokens).collect();
        let share = if self.prefill[p].local {
            self.local_share(p)
        } else {
            1.0
        };
        let dur = if share >= MIN_PROGRESS_SHARE {
            self.prefill_time(p, &seq_lens, share)
        } else {
            f64::INFINITY
        };
        for &g in &self.prefill[p].gpus {
            self.meters[g as usize].begin(now);
        }
        let worker = &mut self.prefill[p];
        worker.gen += 1;
        worker.job = Some(PrefillJob {
            items,
            start: now,
            seq_lens,
            done_frac: 0.0,
            last_update: now,
            share,
            gen: worker.gen,
        });
        if dur.is_finite() {
            self.events.push(
                now + dur,
                Priority::Completion,
                Event::PrefillDone {
                    prefill: p,
                    gen: worker.gen,
                },
            );
        }
        self.local_changed(p);
    }

    /// Local prefill worker `p` started or finished a batch: the encode passes
    /// sharing its GPUs change speed, and the shares in force are recorded.
    fn local_changed(&mut self, p: usize) {
        if !self.prefill[p].local {
            return;
        }
        for w in self.prefill[p].encode_workers.clone() {
            self.rerate_encode(w);
        }
        self.note_sm_shares(p);
    }

    fn on_prefill_done(&mut self, p: usize) {
        let now = self.now;
        let Some(job) = self.prefill[p].job.take() else {
            return;
        };
        debug_assert_eq!(job.gen, self.prefill[p].gen);
        for &g in &self.prefill[p].gpus {
            self.meters[g as usize].end(now);
            self.meters[g as usize].add_sm_time((now - job.last_update) * job.share);
        }
        if self.timeline.is_some() {
            let track = format!("{} prefill", self.prefill_label(p));
            let tokens: u64 = job.seq_lens.iter().sum();
            let args = json!({ "requests": job.items.len(), "tokens": tokens, "sm_share_at_end": job.share });
            let name = if self.prefill[p].local {
                "local prefill"
            } else {
                "prefill"
            };
            if let Some(tl) = self.timeline.as_mut() {
                tl.slice(&track, name, job.start, now, args);
            }
        }
        let kv_per_token = self.sc.model.kv_bytes_per_token();
        for it in &job.items {
            let i = it.id as usize;
            self.records[i].first_token = Some(now);
            if !self.prefill[p].local {
                self.remote_place.complete(p, it.tokens as f64);
            }
            let out = self.requests[i].output_tokens;
            if out <= 1 {
                self.records[i].finish = Some(now);
                self.in_system -= 1;
                continue;
            }
            let d = self.decode_place.assign((it.tokens + out as u64) as f64);
            self.decide(|| Decision::PlaceDecode {
                id: it.id,
                worker: d,
            });
            let start = self.prefill[p].link_free_at.max(now);
            let bytes = it.tokens as f64 * kv_per_token;
            let end = start + self.cost.transfer(bytes);
            self.prefill[p].link_free_at = end;
            if self.timeline.is_some() {
                let track = format!("{} link", self.prefill_label(p));
                let args = json!({ "request": it.id, "bytes": bytes, "to": format!("D{d}") });
                if let Some(tl) = self.timeline.as_mut() {
                    tl.slice(&track, "kv cache", start, end, args);
                }
            }
            self.records[i].kv_sent = Some(start);
            self.events.push(
                end,
                Priority::Transfer,
                Event::KvLands {
                    decode: d,
                    id: it.id,
                },
            );
        }
        self.try_prefill(p);
        if self.prefill[p].job.is_none() {
            self.local_changed(p);
        }
    }

    // ---------------------------------------------------------------- decode

    fn on_kv(&mut self, d: usize, id: RequestId) {
        let i = id as usize;
        self.records[i].decode_ready = Some(self.now);
        let seq = DecodeSeq {
            id,
            prompt_tokens: self.requests[i].prefill_tokens(),
            remaining: self.requests[i].output_tokens - 1,
        };
        if !self.decode[d].sched.can_ever_fit(&seq) {
            // validation sizes decode for the longest sequence, so this is a
            // guard: the request fails, as the controller fails it
            self.records[i].failure =
                Some(format!("its KV cache can never fit decode worker D{d}"));
            self.in_system -= 1;
            let work = (seq.prompt_tokens + self.requests[i].output_tokens as u64) as f64;
            self.decode_place.complete(d, work);
            return;
        }
        self.decode[d].sched.enqueue(seq);
        self.try_decode(d);
    }

    /// Start decode iterations on worker `d` if it is idle and has work.
    ///
    /// Iterations that end strictly before the next queued event of the whole
    /// simulation cannot be affected by anything (no KV cache can land first),
    /// so they are run inline without a round trip through the event queue;
    /// the outcome is the same as stepping one event at a time.
    fn try_decode(&mut self, d: usize) {
        if self.decode[d].stepping {
            return;
        }
        let mut t = self.now;
        loop {
            for id in self.decode[d].sched.admit() {
                self.records[id as usize].decode_start = Some(t);
            }
            let (batch, ctx) = self.decode[d].sched.step_shape();
            if batch == 0 {
                return;
            }
            self.decide(|| Decision::DecodeStep {
                at: t,
                worker: d,
                batch,
                context: ctx,
            });
            let dur = self.cost.decode_step(batch, ctx, self.decode[d].tp);
            self.decode[d].step_start = t;
            for &g in &self.decode[d].gpus {
                self.meters[g as usize].begin(t);
                self.meters[g as usize].add_sm_time(dur);
            }
            let end = t + dur;
            if self.events.peek_time().is_some_and(|next| next <= end) {
                self.decode[d].stepping = true;
                self.events.push(
                    end,
                    Priority::Completion,
                    Event::DecodeStepDone { decode: d },
                );
                return;
            }
            self.inline_steps += 1;
            self.complete_decode_step(d, end);
            t = end;
        }
    }

    fn on_decode_step(&mut self, d: usize) {
        self.decode[d].stepping = false;
        self.complete_decode_step(d, self.now);
        self.try_decode(d);
    }

    /// The iteration of decode worker `d` that started at `step_start` ends at `at`.
    fn complete_decode_step(&mut self, d: usize, at: f64) {
        for &g in &self.decode[d].gpus {
            self.meters[g as usize].end(at);
        }
        if let Some(tl) = self.timeline.as_mut() {
            let (batch, ctx) = self.decode[d].sched.step_shape();
            let args = json!({ "batch": batch, "context_tokens": ctx });
            tl.slice(
                &format!("D{d} decode"),
                "decode step",
                self.decode[d].step_start,
                at,
                args,
            );
            tl.counter(
                &format!("D{d} waiting for KV blocks"),
                at,
                self.decode[d].sched.waiting() as f64,
            );
        }
        for id in self.decode[d].sched.complete_step() {
            let i = id as usize;
            self.records[i].finish = Some(at);
            self.in_system -= 1;
            let work =
                (self.requests[i].prefill_tokens() + self.requests[i].output_tokens as u64) as f64;
            self.decode_place.complete(d, work);
        }
    }

    // ---------------------------------------------------------------- report

    fn finish(mut self) -> SimOutput {
        let decisions = self.log.take().unwrap_or_default();
        let roles = (0..self.sc.gpus).map(|g| self.gpu_role(g)).collect();
        let encode = EncodeSummary {
            passes: self.passes,
            mean_batch: if self.passes > 0 {
                self.passed_requests as f64 / self.passes as f64
            } else {
                0.0
            },
            batcher: self.encode.first().map(|w| w.batcher.params().clone()),
            remote_fraction: if self.routed > 0 {
                self.remote_routed as f64 / self.routed as f64
            } else {
                1.0
            },
        };
        let mut notes = self.cost.notes();
        if let SmSplit::Dynamic(t) = &self.split {
            let levels: Vec<String> = t
                .levels
                .iter()
                .map(|(f, b)| format!("{:.0}%→B≤{}", f * 100.0, b))
                .collect();
            notes.push(format!(
                "dynamic SM table (ε = {}): {}",
                t.epsilon,
                levels.join(", ")
            ));
        }
        let explanation_cost = &*self.cost;
        let sc = self.sc;
        let mut out = assemble(
            self.sc,
            RunParts {
                deployment: self.sc.deployment.to_string(),
                records: self.records,
                meters: self.meters,
                roles,
                encode,
                notes,
                events: self.processed + self.inline_steps,
                max_sm_share_sum: self.max_sm_share_sum,
                timeline: self.timeline,
            },
        );
        let x = crate::explain::explain(sc, explanation_cost, &out.report);
        // one verdict: the bottleneck is the stage with the highest load ratio
        if let Some(l) = x.loads.iter().find(|l| l.stage == x.most_loaded) {
            let q = out
                .report
                .stages
                .iter()
                .find(|st| st.stage == l.stage)
                .map_or(0.0, |st| st.queue.mean);
            out.report.bottleneck = l.stage.clone();
            out.report.bottleneck_reason = format!(
                "highest offered load / capacity: {:.2}{}; mean queueing there {:.1} ms",
                l.load,
                x.lead
                    .map_or(String::new(), |l| format!(" ({l:.1}× the next stage)")),
                q * 1e3
            );
        }
        out.report.explanation = x;
        out.decisions = decisions;
        out
    }

    fn gpu_role(&self, g: u32) -> (String, String) {
        self.topology
            .gpu_owner(g)
            .map_or(("idle".into(), "-".into()), |(stage, label)| {
                (stage.into(), label)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drift regression: a KV cache that can never fit its decode worker fails
    /// the request (counted in the report) and leaves the system, as the
    /// controller does; the simulator used to drop it silently, and
    /// `in_system` never went down.
    #[test]
    fn a_kv_cache_that_can_never_fit_fails_the_request() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/cpu-image.toml");
        let o = easerve_workload::scenario::Overrides {
            requests: Some(3),
            ..Default::default()
        };
        let sc = Scenario::load(&path, &o).expect("cpu-image.toml is valid");
        let mut sim = Sim::new(&sc, scenario_cost(&sc));
        for d in &mut sim.decode {
            // one block of 16 tokens: no request of the scenario fits
            d.sched = DecodeScheduler::new(easerve_sched::KvBlocks::new(1, 16), 8);
        }
        sim.run();
        assert_eq!(sim.in_system, 0);
        let out = sim.finish();
        assert_eq!(out.report.completed, 0);
        assert_eq!(out.report.failed, 3);
        assert!(out.report.failures[0]
            .reason
            .contains("can never fit decode worker D0"));
    }
}
