//! The cluster's physics around one [`Controller`]: the simulator is a driver
//! of the scheduler, as `easerve exec` is, and makes no scheduling decision of
//! its own.
//!
//! The controller decides (admission, placement, micro-batches and their SM
//! shares, routes, prefill batches, KV placement, decode runs); this
//! module keeps the event queue and what the hardware does with each
//! [`Command`]: the host and GPU phases of an encode pass, the re-rating of a
//! pass or a local prefill batch when what shares its GPU changes (bandwidth
//! interference under an SM partition, the switching penalty under
//! time-slicing), the serialised links, the GPU meters and the timeline. Costs
//! come from a [`StageCost`]. On the `cpu` device every worker shares one
//! host's cores, and passes slow down while the busy ones ask more cores than
//! it has (`cores.rs`). The loop and the order in which the controller
//! hears inputs and gives commands are the ones every driver shares
//! ([`driver::run`]); the engine says what is due ([`Driver::next_due`]) and
//! what a command does ([`Driver::carry_out`]).
//!
//! Decode goes in the controller's runs ([`Command::DecodeRun`]): the
//! iterations up to the first finishing sequence are priced ahead in doubling
//! chunks and only the end of each chunk enters the event queue; a yield
//! ([`Command::DecodeYield`]) moves the run's end to the end of the iteration
//! in progress. The outcome is the same as queueing every iteration's end.
//!
//! The aggregated system's replicas, whose iterations run every stage, have
//! their physics in `replica.rs`.

use easerve_workload::fabric;
mod cores;
mod plan;
pub use plan::SimTwin;
mod replica;
mod store;

use crate::event::{EventQueue, Priority};
use crate::meter::GpuMeter;
use crate::output::{assemble, RunParts};
use crate::timeline::Timeline;
use easerve_calib::StageCost;
use easerve_model::{ItemTokens, Parallel};
use easerve_sched::driver::{self, Driver, Liveness, SerialLink, VirtualClock};
use easerve_sched::{
    Command, Controller, Decision, EnvelopeId, Event, RequestId, RequestRecord, Topology,
    WorkerRef, TIME_SLICE_SHARE,
};
use easerve_workload::generate::{generate_with_tokens, ItemTokenTable};
use easerve_workload::report::{EncodeSummary, ReuseReport};
use easerve_workload::{Report, Scenario};
use serde_json::json;

/// Progress below this SM share counts as stalled (no completion scheduled).
const MIN_PROGRESS_SHARE: f64 = easerve_sched::MIN_SM_SHARE;

/// Iterations of a decode run priced at its start; each later chunk doubles
/// what is priced (see `Sim::price_decode_chunk`).
const FIRST_DECODE_CHUNK: u64 = 16;

/// What the queue holds: the end of something the hardware was doing. Each
/// carries the generation of the work it ends, so an end left over from work
/// that was re-rated or lost to a fault is ignored.
#[derive(Debug)]
enum Ev {
    EncodeGpuPhase {
        worker: usize,
        gen: u64,
    },
    EncodeDone {
        worker: usize,
        gen: u64,
    },
    EmbeddingsLand {
        envelope: EnvelopeId,
        sent_at: f64,
        to: usize,
    },
    PrefillDone {
        prefill: usize,
        gen: u64,
    },
    KvLands {
        id: RequestId,
        sent_at: f64,
    },
    /// The last priced iteration of a decode run ends (the run's last, or
    /// that of a chunk priced ahead).
    DecodeEnd {
        decode: usize,
        gen: u64,
    },
    /// A request's front-end preprocessing ends (the aggregated system).
    Preprocessed {
        id: RequestId,
    },
    /// An aggregated replica's iteration ends.
    ReplicaDone {
        replica: usize,
        gen: u64,
    },
    Fault(WorkerRef),
    /// A planner's window ends: it decides.
    PlanTick,
    /// The planner's change of this index reaches the controller.
    Reconfigure(u32),
    /// A worker's model is loaded.
    WorkerReady(WorkerRef),
    /// A restarted worker has loaded its model ([`Command::Restart`]).
    Restarted(WorkerRef),
}

/// An encode pass on the hardware.
struct Pass {
    batch: usize,
    start: f64,
    gpu_start: f64,
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
    /// Whether the end of the GPU phase has been scheduled yet.
    scheduled: bool,
    /// Seconds of serial host work (per-pass overhead and preprocessing)
    /// left at `last_update`, unslowed, while in the host phase.
    host_left: f64,
    /// The host-core slowdown the host phase runs at since `last_update`.
    host_slow: f64,
    /// When the shared store's fetch of the pass's held items ends (the
    /// host phase ends no earlier); 0 without a fetch.
    fetch_end: f64,
}

/// An encode worker's hardware state (the controller keeps its scheduling
/// state; [`Topology`] says where it runs).
struct EncodePhysics {
    gpu: u32,
    /// Its TP degree (its pass priced by [`StageCost::encode_tp`]).
    tp: u32,
    /// Local prefill worker co-located on this GPU.
    local: Option<usize>,
    pass: Option<Pass>,
    /// The worker's link, for its embedding transfers.
    link: SerialLink,
    /// Generation of the pending phase or completion event, never reset.
    gen: u64,
    /// When each of the worker's preprocessing threads is free, when
    /// preprocessing is a pipelined host stage (empty when each pass
    /// preprocesses its own micro-batch).
    pre_free: Vec<f64>,
}

/// A prefill batch in flight; its progress is tracked as the fraction done so
/// a change of SM share mid-flight changes its rate, not its past.
struct PrefillJob {
    requests: usize,
    start: f64,
    done_frac: f64,
    last_update: f64,
    /// Effective SM share: the controller's, less the switching penalty
    /// under time-slicing.
    share: f64,
    /// Seconds the whole batch takes at `share` (infinite below
    /// [`MIN_PROGRESS_SHARE`]).
    dur: f64,
}

/// A prefill worker's hardware state.
struct PrefillPhysics {
    gpus: Vec<u32>,
    /// TP and EP of the worker (its cost's layout).
    par: Parallel,
    local: bool,
    /// Encode workers whose GPUs this local worker shares.
    encode_workers: Vec<usize>,
    job: Option<PrefillJob>,
    /// Prompt lengths of the batch in flight (reused): the tokens it
    /// computes, after the cached ones.
    seq_lens: Vec<u64>,
    /// With the prefix cache: the cached tokens before each of `seq_lens`
    /// (reused); empty when nothing in the batch hit.
    cached: Vec<u64>,
    gen: u64,
    /// The worker's link, for its KV cache transfers.
    link: SerialLink,
}

/// A decode worker's hardware state.
struct DecodePhysics {
    gpus: Vec<u32>,
    /// TP and EP of the worker.
    par: Parallel,
    /// The run in flight.
    run: Option<RunInFlight>,
    /// Seconds and end times of the run's iterations priced so far (reused
    /// from run to run).
    durs: Vec<f64>,
    ends: Vec<f64>,
    gen: u64,
    /// On a CPU host, the sequences whose caches landed here and that no
    /// run has held yet, with the seconds landing each takes (read from the
    /// wire and, at TP > 1, sent to the follower ranks;
    /// [`StageCost::kv_land`]): the first run that holds one pays it in its
    /// first iteration.
    landing: Vec<(RequestId, f64)>,
}

/// A decode run on the hardware: when it started and its shape.
#[derive(Clone, Copy)]
struct RunInFlight {
    start: f64,
    batch: u64,
    context: u64,
    /// Iterations the run ends after (fewer than priced once it yielded).
    steps: u64,
}

/// Everything a finished run hands back.
#[derive(Debug, Clone)]
pub struct SimOutput {
    /// The report.
    pub report: Report,
    /// Per-request lifecycle records, by request id.
    pub records: Vec<RequestRecord>,
    /// Events the engine processed: queue events plus decode iterations run
    /// inline (`queue_events + inline_steps`).
    pub events: u64,
    /// Events taken in time order: those of the event queue, arrivals and
    /// controller timeouts.
    pub queue_events: u64,
    /// Decode iterations whose end was not a queue event: those inside a
    /// decode run, before its last.
    pub inline_steps: u64,
    /// The Chrome/Perfetto trace-event JSON, when asked for.
    pub timeline: Option<serde_json::Value>,
    /// Largest sum of the SM shares of an encode pass and a co-located local
    /// prefill on one GPU during the run (0 without local prefill); at most 1.
    pub max_sm_share_sum: f64,
    /// Every scheduling decision in order, when asked for (the controller's
    /// log, as the executor writes it).
    pub decisions: Vec<Decision>,
    /// What each unit of work took, when asked for.
    pub service: Option<ServiceLog>,
}

/// What the simulated hardware took for each unit of work, seconds, per
/// worker in the order the worker started it (the log of
/// [`SimOptions::service_log`]): what a replay (a driver with fake workers,
/// `easerve_sched::harness::Replay`) hands back to make the same run.
pub use easerve_sched::ServiceLog;

/// What a run records beyond the report.
#[derive(Clone, Debug, Default)]
pub struct SimOptions {
    /// Record a Chrome/Perfetto timeline (one track per worker and link).
    pub timeline: bool,
    /// Record every scheduling decision ([`SimOutput::decisions`]).
    pub decisions: bool,
    /// Fault injection: worker `.0` dies `.1` seconds into the run, as
    /// `easerve exec --kill-worker` kills a worker process.
    pub kill: Option<(WorkerRef, f64)>,
    /// Supervision: a dead worker is restarted after this many seconds (the
    /// first delay of [`easerve_sched::Backoff::starting_at`]) and rejoins
    /// once its model is loaded ([`Scenario::restart_load_s`]); `None`: a dead
    /// worker stays dead.
    pub restart_after: Option<f64>,
    /// Record what each unit of work took ([`SimOutput::service`]).
    pub service_log: bool,
}

struct Sim<'a> {
    sc: &'a Scenario,
    cost: Box<dyn StageCost>,
    ctrl: Controller,
    now: f64,
    events: EventQueue<Ev>,
    tokens: ItemTokenTable,
    /// The next request to arrive (requests are in arrival order): arrivals
    /// stay out of the event queue, which holds only what busy workers and
    /// links will end.
    next_arrival: usize,
    /// Its arrival time (infinite when every request has arrived).
    next_arrival_at: f64,
    encode: Vec<EncodePhysics>,
    /// Remote prefill workers first, then local ones.
    prefill: Vec<PrefillPhysics>,
    decode: Vec<DecodePhysics>,
    /// Aggregated replicas (the aggregated system only).
    replicas: Vec<replica::ReplicaEngine>,
    /// Where every worker runs.
    topology: Topology,
    time_sliced: bool,
    meters: Vec<GpuMeter>,
    processed: u64,
    /// Largest sum of SM shares seen on one encode GPU (see `note_sm_shares`).
    max_sm_share_sum: f64,
    /// Decode iterations run inline.
    inline_steps: u64,
    timeline: Option<Timeline>,
    /// Scratch: the items of a pass being priced.
    items: Vec<ItemTokens>,
    /// Scratch: the items of a pass that hit the encoder cache.
    hit_items: Vec<ItemTokens>,
    service: Option<ServiceLog>,
    /// Workers that died (fault injection): transfers to them land at once,
    /// as the executor's do.
    live: Liveness,
    /// What to do once the controller heard the input handed to it last
    /// ([`Driver::heard`], [`Driver::settled`]).
    after: After,
    /// When each request's preprocessing ends, by request id, when
    /// preprocessing is pipelined ([`Command::Preprocess`]; empty otherwise).
    pre_ready: Vec<f64>,
    /// The scenario's planner (`[planner]`), if any.
    plan: Option<plan::PlanRun>,
    /// The nodes' NICs, on a cluster of node groups (`[[cluster.groups]]`).
    fabric: Option<fabric::Fabric>,
    /// The shared encoder store's host link (`store.rs`).
    store_link: store::StoreLink,
    /// The local prefill workers' cost when their (encode) GPU type is not
    /// the remote prefill workers' ([`Scenario::local_prefill_cost`]).
    local_cost: Option<Box<dyn StageCost>>,
    /// The one CPU host a `cpu` scenario's workers share (`cores.rs`);
    /// `None` on GPUs.
    host: Option<cores::HostCores>,
}

/// The report's reuse section: what the workload offers (in blocks of the
/// prefix cache's size, vLLM's 16 when it is off) and each cache's hits
/// (the controller's, so the executor's report has them too); `None` for a
/// workload that repeats nothing with every cache off.
pub fn reuse_report(sc: &Scenario, ctrl: &Controller) -> Option<ReuseReport> {
    let caches = ctrl.cache_counters();
    if !sc.workload.repeats() && caches == (None, None) && ctrl.store_counters().is_none() {
        return None;
    }
    Some(ReuseReport {
        offered: easerve_workload::reuse::offered_reuse(
            ctrl.requests(),
            crate::capacity::block_size(sc),
        ),
        encoder_cache: caches.0.map(Into::into),
        prefix_cache: caches.1.map(Into::into),
        encoder_store: ctrl.store_counters().map(Into::into),
    })
}

/// How the run charges an encode pass's host preprocessing, for the notes.
fn preprocess_note(sc: &Scenario) -> String {
    match sc.knobs.preprocess_threads {
        Some(n) => format!(
            "encode preprocessing: a pipelined host stage, {n} thread(s) per encode worker (deployment.preprocess_threads, else cluster.host_cores / cluster.gpus); requests are preprocessed as they are placed, and a pass's GPU phase starts once its requests' preprocessing and the per-pass overhead are done"
        ),
        None => "encode preprocessing: in series within each pass, on one thread, before its GPU phase (deployment.preprocess = \"serial\")".into(),
    }
}

/// The notes of an EPD system's run beyond its cost source's: how encode
/// preprocessing was charged, the transfers' link, the SM split.
fn epd_notes(sc: &Scenario, ctrl: &Controller) -> Vec<String> {
    let mut notes: Vec<String> = sc.system_note().into_iter().collect();
    if sc.workload.modality != easerve_sched::Modality::Text {
        notes.push(preprocess_note(sc));
    }
    if let Some(c) = &sc.cluster {
        for g in &c.groups {
            notes.push(format!(
                "node group `{}`: transfers within a node on `{}` ({} GB/s per direction, {:.0} µs a transfer; calib/src/gpu.rs or the group's own link); across nodes on the NICs, {} GB/s per direction and {:.0} µs a transfer (cluster.groups[].nic_bandwidth_gbs, nic_latency_s; the aiconfigurator NCCL tables measure collectives within one node only), each NIC port a shared FIFO queue",
                g.node.name,
                g.gpu.link.name,
                g.gpu.link.bandwidth_gbs,
                g.gpu.link.latency_s * 1e6,
                g.nic.bandwidth_gbs,
                g.nic.latency_s * 1e6
            ));
        }
    } else if sc.profile.is_none() {
        // a profile prices transfers from its own measured table
        let l = &sc.gpu.link;
        notes.push(format!(
            "transfers (embeddings, KV caches): link `{}`, {} GB/s per direction and {:.0} µs a transfer (calib/src/gpu.rs, or the scenario's own link)",
            l.name,
            l.bandwidth_gbs,
            l.latency_s * 1e6
        ));
    }
    notes.extend(ctrl.split().table_note());
    notes
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
///
/// With a planner (`[planner]`) the cost source is shared with the twin its
/// `twin` policy tries candidates in, and a decision ends each window.
pub fn simulate_with(sc: &Scenario, cost: Box<dyn StageCost>, opts: &SimOptions) -> SimOutput {
    let mut sim = match sc.planner {
        None => Sim::new(sc, cost, opts.decisions),
        Some(_) => {
            let cost: std::sync::Arc<dyn StageCost> = std::sync::Arc::from(cost);
            let mut sim = Sim::new(sc, Box::new(plan::Shared(cost.clone())), opts.decisions);
            sim.plan = plan::PlanRun::of(sc, &sim.topology, &cost);
            if let Some(p) = &sim.plan {
                let w = p.book.window_s();
                sim.events.push(w, Priority::Completion, Ev::PlanTick);
            }
            sim
        }
    };
    if opts.timeline {
        sim.timeline = Some(Timeline::default());
    }
    if opts.service_log {
        sim.service = Some(ServiceLog::new(&sim.topology));
    }
    if let Some((w, at)) = opts.kill {
        sim.events.push(at, Priority::Completion, Ev::Fault(w));
    }
    if let Some(base) = opts.restart_after {
        sim.ctrl
            .supervise(easerve_sched::Backoff::starting_at(base));
    }
    sim.run();
    sim.finish()
}

impl<'a> Sim<'a> {
    fn new(sc: &'a Scenario, cost: Box<dyn StageCost>, log_decisions: bool) -> Self {
        let (requests, tokens) = generate_with_tokens(sc);
        let ctrl = sc.controller(requests, &tokens, &*cost, log_decisions);
        let topology = ctrl.topology().clone();
        // spare slots a planner may start have GPU numbers past the
        // deployment's (`Topology::with_spares`)
        let gpu_slots = topology
            .workers()
            .flat_map(|w| w.gpus.iter().copied())
            .max()
            .map_or(0, |g| g + 1)
            .max(sc.gpus);
        let encode = topology
            .encode()
            .iter()
            .map(|t| EncodePhysics {
                gpu: t.gpu(),
                tp: t.tp,
                local: t.local_prefill,
                pass: None,
                link: SerialLink::default(),
                gen: 0,
                pre_free: vec![0.0; sc.knobs.preprocess_threads.unwrap_or(0) as usize],
            })
            .collect();
        let prefill = topology
            .prefill()
            .iter()
            .map(|t| PrefillPhysics {
                gpus: t.gpus.clone(),
                par: Parallel::new(t.tp, t.ep),
                local: t.local,
                encode_workers: t.encode_workers.clone(),
                job: None,
                seq_lens: Vec::new(),
                cached: Vec::new(),
                gen: 0,
                link: SerialLink::default(),
            })
            .collect();
        let decode = topology
            .decode()
            .iter()
            .map(|t| DecodePhysics {
                gpus: t.gpus.clone(),
                par: Parallel::new(t.tp, t.ep),
                run: None,
                durs: Vec::new(),
                ends: Vec::new(),
                gen: 0,
                landing: Vec::new(),
            })
            .collect();
        let replicas = topology
            .replica()
            .iter()
            .map(|t| replica::ReplicaEngine {
                gpus: t.gpus.clone(),
                tp: t.tp,
                gen: 0,
                step: None,
            })
            .collect();
        let events = EventQueue::new();
        let host = cores::HostCores::of(sc, &topology);
        let mut sim = Sim {
            fabric: sc.cluster.as_ref().map(fabric::Fabric::new),
            store_link: store::StoreLink::default(),
            local_cost: sc.local_prefill_cost(),
            sc,
            time_sliced: ctrl.time_sliced(),
            ctrl,
            cost,
            now: 0.0,
            events,
            tokens,
            next_arrival: 0,
            next_arrival_at: f64::INFINITY,
            encode,
            prefill,
            decode,
            replicas,
            topology,
            meters: (0..gpu_slots).map(|_| GpuMeter::default()).collect(),
            processed: 0,
            max_sm_share_sum: 0.0,
            inline_steps: 0,
            timeline: None,
            items: Vec::new(),
            hit_items: Vec::new(),
            service: None,
            live: Liveness::new(),
            after: After::Nothing,
            pre_ready: Vec::new(),
            plan: None,
            host,
        };
        sim.set_next_arrival(0);
        sim
    }

    /// Run the workload to its end: the event loop is the one every driver
    /// shares ([`driver::run`]); the engine says what is due and what each
    /// command does to the hardware.
    fn run(&mut self) {
        driver::run(self);
    }

    /// The time of the next request to arrive, if any.
    /// Request `i` is the next to arrive.
    fn set_next_arrival(&mut self, i: usize) {
        self.next_arrival = i;
        self.next_arrival_at = self
            .ctrl
            .requests()
            .get(i)
            .map_or(f64::INFINITY, |r| r.arrival);
    }

    /// What the hardware does when `ev` comes due, and what the controller
    /// must hear of it, if anything (nothing for the end of work left stale
    /// by a re-rating or a fault, or for a decode chunk before its run's end).
    #[inline]
    fn on_event(&mut self, ev: Ev) -> Option<Event> {
        let now = self.now;
        match ev {
            Ev::EncodeGpuPhase { worker, gen } => {
                if self.encode[worker].gen != gen {
                    return None;
                }
                self.on_encode_gpu_phase(worker);
                Some(Event::EncodeGpuStarted { worker })
            }
            Ev::EncodeDone { worker, gen } => {
                let live = self.encode[worker].gen == gen
                    && self.encode[worker]
                        .pass
                        .as_ref()
                        .is_some_and(|p| p.gpu_phase);
                if !live {
                    return None;
                }
                self.on_encode_done(worker);
                self.after = After::EncodeQueue(worker);
                Some(Event::EncodeDone { worker })
            }
            Ev::EmbeddingsLand {
                envelope,
                sent_at,
                to,
            } => {
                self.after = After::PrefillQueue(to);
                Some(Event::EmbeddingsLanded { envelope, sent_at })
            }
            Ev::PrefillDone { prefill, gen } => {
                if self.prefill[prefill].gen != gen || self.prefill[prefill].job.is_none() {
                    return None;
                }
                self.on_prefill_done(prefill);
                self.after = After::PrefillDone(prefill);
                Some(Event::PrefillDone { worker: prefill })
            }
            Ev::KvLands { id, sent_at } => {
                if self.host.is_some() {
                    self.land_kv(id);
                }
                Some(Event::KvLanded { id, sent_at })
            }
            Ev::DecodeEnd { decode, gen } => {
                if self.decode[decode].gen != gen {
                    return None;
                }
                self.on_decode_end(decode)
            }
            Ev::Preprocessed { id } => Some(Event::Preprocessed { id }),
            Ev::ReplicaDone { replica, gen } => {
                if self.replicas[replica].gen != gen {
                    return None;
                }
                self.on_replica_done(replica)
            }
            Ev::PlanTick => {
                self.plan_tick();
                None
            }
            Ev::Reconfigure(i) => {
                let plan = self.plan.as_mut()?;
                let change = plan.book.applied(now, i as usize, &self.topology);
                Some(Event::Reconfigure { change })
            }
            Ev::WorkerReady(worker) => {
                if let Some(p) = self.plan.as_mut() {
                    p.book.ready(now, worker, &self.topology);
                }
                Some(Event::WorkerLoaded { worker })
            }
            Ev::Fault(w) => {
                self.lose_work(w);
                let reason = easerve_sched::controller::kill_reason(now);
                Some(Event::WorkerFailed { worker: w, reason })
            }
            Ev::Restarted(w) => {
                self.live.revive(w);
                if let Some(h) = self.host.as_mut() {
                    h.started(w, Some(w));
                }
                Some(Event::WorkerLoaded { worker: w })
            }
        }
    }

    /// What command `cmd` does to the hardware.
    #[inline]
    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Preprocess { worker, id } => self.preprocess(worker, id),
            Command::Encode { worker, sm_share } => self.start_pass(worker, sm_share),
            Command::Embeddings {
                envelope,
                from,
                to,
                local,
            } => self.send_embeddings(envelope, from, to, local),
            Command::Prefill { worker, sm_share } => self.start_prefill(worker, sm_share),
            Command::PrefillShare { worker, sm_share } => {
                let share = self.effective_share(sm_share);
                self.rerate_prefill(worker, share);
                if self.prefill[worker].job.is_some() {
                    self.ask_cores_at(WorkerRef::Prefill(worker), Some(share));
                }
            }
            Command::Kv { from, to, id } => self.send_kv(from, to, id),
            Command::DecodeRun {
                worker,
                batch,
                context,
                steps,
            } => self.start_decode_run(worker, batch, context, steps),
            Command::DecodeYield { worker } => self.yield_decode_run(worker),
            Command::Release { .. } | Command::Discard { .. } => {}
            Command::LoadWorker { worker, on } => {
                if let Some(h) = self.host.as_mut() {
                    h.started(worker, on);
                }
                self.load_worker(worker);
            }
            Command::StopWorker { worker } => {
                if let Some(h) = self.host.as_mut() {
                    h.stopped(worker);
                }
                let now = self.now;
                if let Some(p) = self.plan.as_mut() {
                    p.book.stopped(now, worker, &self.topology);
                }
            }
            Command::Restart { worker, delay_s } => {
                // the new process starts after the backoff and loads its model
                let at = self.now + delay_s + self.sc.restart_load_s(worker);
                self.events
                    .push(at, Priority::Completion, Ev::Restarted(worker));
            }
            Command::FrontEndPreprocess { id } => self.front_end(id),
            Command::ReplicaStep {
                replica,
                batch,
                context,
            } => self.start_replica_step(replica, batch, context),
        }
    }

    // ------------------------------------------------------------- encode

    /// Request `id` was placed on encode worker `w` and preprocessing is a
    /// pipelined host stage: each of its items goes, in order, to the
    /// worker's thread that is free first (items of one request spread over
    /// threads, as rayon's map over them does), and the request is ready when
    /// its last item is.
    fn preprocess(&mut self, w: usize, id: RequestId) {
        let now = self.now;
        let i = id as usize;
        if self.pre_ready.len() <= i {
            self.pre_ready
                .resize(self.ctrl.requests().len().max(i + 1), 0.0);
        }
        let mut ready = now;
        let skip = self.skipped_preprocessing(id);
        for (k, item) in self.tokens[i].iter().enumerate() {
            if k < 64 && skip & (1 << k) != 0 {
                continue;
            }
            let t = self.cost.preprocess(std::slice::from_ref(item));
            let threads = &mut self.encode[w].pre_free;
            let Some((thread, free)) = threads
                .iter_mut()
                .enumerate()
                .min_by(|a, b| a.1.total_cmp(b.1))
            else {
                return;
            };
            let start = free.max(now);
            *free = start + t;
            ready = ready.max(start + t);
            if let Some(tl) = self.timeline.as_mut() {
                let args = json!({ "request": id, "item": k });
                tl.slice(
                    &format!("E{w} preprocess {thread}"),
                    "preprocess",
                    start,
                    start + t,
                    args,
                );
            }
        }
        self.pre_ready[i] = ready;
    }

    /// The items of request `id` whose preprocessing is skipped: those that
    /// hit the encoder cache when the front end hashes raw bytes (a hash of
    /// the processed item needs the item processed first).
    fn skipped_preprocessing(&self, id: RequestId) -> u64 {
        match self.ctrl.caches().encoder {
            Some(c) if c.hash_raw_bytes => self.ctrl.encoder_hits(id),
            _ => 0,
        }
    }

    /// A pass starts: first its host phase, during which the GPU is free for
    /// local prefill: the fixed per-pass overhead and preprocessing — of its
    /// own micro-batch, `t_pass + Σ t_pre` on one thread, or with
    /// preprocessing pipelined ([`Sim::preprocess`]) what is left of its
    /// requests' preprocessing, then `t_pass`; then its GPU phase
    /// ([`Ev::EncodeGpuPhase`]).
    fn start_pass(&mut self, w: usize, share: f64) {
        let now = self.now;
        self.items.clear();
        let mut pre_done = now;
        let shards = self.ctrl.encode_items(w);
        // with the encoder cache: the items that hit, which are not encoded
        // but (unless the front end hashes raw bytes) still preprocessed
        let mut hit_items = std::mem::take(&mut self.hit_items);
        hit_items.clear();
        for (k, &id) in self.ctrl.encode_batch(w).iter().enumerate() {
            let items = &self.tokens[id as usize];
            let hits = self.ctrl.encoder_hits(id);
            match shards.get(k) {
                // one shard: one item of the request (intra-request parallelism)
                Some(&item) => self.items.extend(items.get(item as usize).copied()),
                None if hits == 0 => self.items.extend_from_slice(items),
                None => {
                    for (j, t) in items.iter().enumerate() {
                        if j < 64 && hits & (1 << j) != 0 {
                            hit_items.push(*t);
                        } else {
                            self.items.push(*t);
                        }
                    }
                }
            }
            if let Some(&r) = self.pre_ready.get(id as usize) {
                pre_done = pre_done.max(r);
            }
        }
        let tp = self.encode[w].tp;
        let mut t = self.cost.encode_tp(&self.items, 1.0, tp);
        if !hit_items.is_empty() {
            // the framework's per-pass and per-request terms (scheduling,
            // messages) are the same whether an item hit: taken over all
            let n = self.items.len();
            self.items.extend_from_slice(&hit_items);
            t.t_pass = self.cost.encode_tp(&self.items, 1.0, tp).t_pass;
            self.items.truncate(n);
            if !self.ctrl.caches().encoder.is_some_and(|c| c.hash_raw_bytes) {
                t.t_pre += self.cost.preprocess(&hit_items);
            }
        }
        self.hit_items = hit_items;
        let serial = self.encode[w].pre_free.is_empty();
        // serial preprocessing asks one core of a CPU host
        self.ask_cores(WorkerRef::Encode(w), usize::from(serial));
        let host_slow = self.host_slowdown();
        let mut host_end = if serial {
            now + t.t_pass * host_slow + t.t_pre * host_slow
        } else {
            pre_done + t.t_pass
        };
        // items the shared store held are fetched beside the host phase
        let fetch: u64 = (self.ctrl.encode_batch(w).iter())
            .map(|&id| self.ctrl.store_fetch_bytes(id))
            .sum();
        let mut fetch_end = 0.0;
        if fetch > 0 {
            // queued on the store's link behind other workers' fetches
            fetch_end = self.store_transfer(w, fetch as f64, false).end;
            host_end = host_end.max(fetch_end);
        }
        let t_gpu = if share == 1.0 {
            t.t_gpu
        } else {
            self.cost.encode_tp(&self.items, share, tp).t_gpu
        };
        let worker = &mut self.encode[w];
        worker.gen += 1;
        worker.pass = Some(Pass {
            batch: self.ctrl.encode_batch(w).len(),
            start: now,
            gpu_start: now,
            gpu_phase: false,
            t_gpu_work: t_gpu,
            share,
            slow: 1.0,
            done_frac: 0.0,
            last_update: now,
            scheduled: false,
            host_left: t.t_pass + t.t_pre,
            host_slow,
            fetch_end,
        });
        let gen = worker.gen;
        self.events.push(
            host_end,
            Priority::Completion,
            Ev::EncodeGpuPhase { worker: w, gen },
        );
    }

    /// The GPU phase of a pass starts at the share the controller gave it,
    /// slowed by bandwidth interference or time-slicing while local prefill
    /// runs on its GPU.
    fn on_encode_gpu_phase(&mut self, w: usize) {
        let now = self.now;
        let gpu = self.encode[w].gpu as usize;
        self.meters[gpu].begin(now);
        let mut share = None;
        if let Some(pass) = self.encode[w].pass.as_mut() {
            pass.gpu_phase = true;
            pass.gpu_start = now;
            pass.last_update = now;
            share = Some(pass.share);
        }
        self.ask_cores_at(WorkerRef::Encode(w), share);
        self.rerate_encode(w);
    }

    /// Slowdown of encode worker `w`'s GPU phase given whether its co-located
    /// prefill is running: bandwidth interference under an SM partition,
    /// half the GPU's time (less the switching penalty) under time-slicing;
    /// on a CPU host, times the host-core slowdown (`cores.rs`).
    fn encode_slowdown(&self, w: usize) -> f64 {
        match self.host {
            None => self.device_slowdown(w),
            Some(_) => self.device_slowdown(w) * self.host_slowdown_of(WorkerRef::Encode(w)),
        }
    }

    /// [`Sim::encode_slowdown`] on the device alone.
    fn device_slowdown(&self, w: usize) -> f64 {
        let local_busy = self.encode[w]
            .local
            .is_some_and(|p| self.prefill[p].job.is_some());
        if !local_busy {
            1.0
        } else if self.time_sliced {
            // the pass gets its share of the GPU's time, less the switching penalty
            (1.0 + self.cost.time_slice_penalty()) / TIME_SLICE_SHARE
        } else {
            1.0 + self.cost.bandwidth_interference()
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
        if pass.scheduled && pass.t_gpu_work > 0.0 {
            pass.done_frac += (now - pass.last_update) / (pass.t_gpu_work * pass.slow);
            pass.done_frac = pass.done_frac.min(1.0);
        }
        pass.scheduled = true;
        pass.last_update = now;
        pass.slow = slow;
        worker.gen += 1;
        let end = now + (1.0 - pass.done_frac) * pass.t_gpu_work * slow;
        let gen = worker.gen;
        self.events
            .push(end, Priority::Completion, Ev::EncodeDone { worker: w, gen });
    }

    fn on_encode_done(&mut self, w: usize) {
        let now = self.now;
        let Some(pass) = self.encode[w].pass.take() else {
            return;
        };
        self.ask_cores(WorkerRef::Encode(w), 0);
        // the pass's new outputs go to the shared store ahead of its embeddings
        let written = self.ctrl.store_write_bytes(self.ctrl.encode_batch(w));
        // (how long after now the store's link took it, and how long it
        // held the worker's link: none over the NICs)
        let held = match written {
            0 => (0.0, 0.0),
            b => {
                let t = self.store_transfer(w, b as f64, true);
                t.link_wait
                    .map_or((0.0, 0.0), |wait| (wait, t.end - t.start))
            }
        };
        if let Some(log) = self
            .service
            .as_mut()
            .filter(|_| self.sc.knobs.caches.store.is_some())
        {
            log.store_writes[w].push(held);
        }
        // within the clock's resolution at `now`: far into a run (a slow
        // arrival rate puts passes at 1e8 s and beyond) an f64 second resolves
        // only ~1e-8 s, a visible fraction of a short pass
        debug_assert!(
            pass.t_gpu_work <= 0.0
                || (pass.done_frac + (now - pass.last_update) / (pass.t_gpu_work * pass.slow)
                    - 1.0)
                    .abs()
                    < 1e-6 + 8.0 * f64::EPSILON * now / (pass.t_gpu_work * pass.slow),
            "encode pass of worker {w} ended before its GPU work was done"
        );
        if let Some(log) = self.service.as_mut() {
            log.encode[w].push((pass.gpu_start - pass.start, now - pass.gpu_start));
        }
        let gpu = self.encode[w].gpu as usize;
        self.meters[gpu].end(now);
        // SM-time is the work done (unslowed GPU time at its share)
        self.meters[gpu].add_sm_time(pass.t_gpu_work * pass.share);
        if let Some(tl) = self.timeline.as_mut() {
            let args = json!({ "batch": pass.batch, "sm_share": pass.share, "gpu_start_s": pass.gpu_start });
            tl.slice(
                &format!("E{w} encode"),
                "encode pass",
                pass.start,
                now,
                args,
            );
        }
    }

    /// An envelope leaves encode worker `from`: local ones stay in the encode
    /// GPU's memory and land at once; remote ones wait for the worker's link.
    fn send_embeddings(&mut self, envelope: EnvelopeId, from: usize, to: usize, local: bool) {
        let now = self.now;
        let cmd = Command::Embeddings {
            envelope,
            from,
            to,
            local,
        };
        let (sent, land) = if self.live.lands_at_once(&cmd) {
            (now, now)
        } else {
            let ids = self.ctrl.envelope(envelope);
            let bytes = fabric::envelope_bytes(
                &self.ctrl,
                &self.tokens,
                envelope,
                self.sc.model.embedding_bytes_per_token(),
            );
            let path = (WorkerRef::Encode(from), WorkerRef::Prefill(to));
            let (start, end) =
                match Self::over_nics(&mut self.fabric, &self.topology, now, path, bytes) {
                    Some(se) => se,
                    None => {
                        let dur = self.intra_node(WorkerRef::Encode(from), bytes);
                        self.encode[from].link.send(now, dur)
                    }
                };
            let dur = end - start;
            if let Some(log) = self.service.as_mut() {
                log.embeddings[from].push(dur);
            }
            if let Some(tl) = self.timeline.as_mut() {
                let args = json!({ "requests": ids.len(), "bytes": bytes, "to": format!("P{to}") });
                tl.slice(&format!("E{from} link"), "embeddings", start, end, args);
            }
            (start, end)
        };
        self.events.push(
            land,
            Priority::Transfer,
            Ev::EmbeddingsLand {
                envelope,
                sent_at: sent,
                to,
            },
        );
    }

    // ------------------------------------------------------------ prefill

    /// The share a local prefill batch effectively runs at: the controller's
    /// share, and under time-slicing (a share of time, not of SMs) less the
    /// switching penalty.
    fn effective_share(&self, sm_share: f64) -> f64 {
        if self.time_sliced && sm_share < 1.0 {
            sm_share / (1.0 + self.cost.time_slice_penalty())
        } else {
            sm_share
        }
    }

    /// Seconds of prefill worker `p`'s batch at `share`: prefill of its
    /// new tokens, attending over the cached ones too when the prefix
    /// cache hit ([`StageCost::prefill_cached`]).
    fn prefill_time(&self, p: usize, share: f64) -> f64 {
        let w = &self.prefill[p];
        let cost = match &self.local_cost {
            Some(c) if w.local => &**c,
            _ => &*self.cost,
        };
        if share < MIN_PROGRESS_SHARE {
            f64::INFINITY
        } else if w.cached.is_empty() {
            cost.prefill(&w.seq_lens, w.par, share)
        } else {
            cost.prefill_cached(&w.seq_lens, &w.cached, w.par, share)
        }
    }

    fn start_prefill(&mut self, p: usize, sm_share: f64) {
        let now = self.now;
        let share = if self.prefill[p].local {
            self.effective_share(sm_share)
        } else {
            sm_share
        };
        let mut lens = std::mem::take(&mut self.prefill[p].seq_lens);
        lens.clear();
        lens.extend(self.ctrl.prefill_batch(p).iter().map(|i| i.tokens));
        let requests = lens.len();
        self.prefill[p].seq_lens = lens;
        let mut cached = std::mem::take(&mut self.prefill[p].cached);
        cached.clear();
        if self.ctrl.caches().prefix.is_some() {
            let batch = self.ctrl.prefill_batch(p);
            if batch.iter().any(|i| self.ctrl.prefix_hit_tokens(i.id) > 0) {
                cached.extend(batch.iter().map(|i| self.ctrl.prefix_hit_tokens(i.id)));
            }
        }
        self.prefill[p].cached = cached;
        self.ask_cores_at(WorkerRef::Prefill(p), Some(share));
        let dur = self.prefill_time(p, share) * self.host_slowdown_of(WorkerRef::Prefill(p));
        for &g in &self.prefill[p].gpus {
            self.meters[g as usize].begin(now);
        }
        let worker = &mut self.prefill[p];
        worker.gen += 1;
        worker.job = Some(PrefillJob {
            requests,
            start: now,
            done_frac: 0.0,
            last_update: now,
            share,
            dur,
        });
        if dur.is_finite() {
            let gen = worker.gen;
            self.events.push(
                now + dur,
                Priority::Completion,
                Ev::PrefillDone { prefill: p, gen },
            );
        }
        self.local_changed(p);
    }

    /// Re-rate prefill worker `p`'s batch to effective share `new_share` (a
    /// local worker's new SM share) at the host-core slowdown in force.
    fn rerate_prefill(&mut self, p: usize, new_share: f64) {
        let Some(job) = self.prefill[p].job.as_ref() else {
            return;
        };
        let now = self.now;
        let old_share = job.share;
        let progressed = (now - job.last_update) / job.dur;
        let new_dur =
            self.prefill_time(p, new_share) * self.host_slowdown_of(WorkerRef::Prefill(p));
        for &g in &self.prefill[p].gpus {
            self.meters[g as usize].add_sm_time((now - job.last_update) * old_share);
        }
        let worker = &mut self.prefill[p];
        let job = worker.job.as_mut().expect("checked");
        job.done_frac = (job.done_frac + progressed).min(1.0);
        job.last_update = now;
        job.share = new_share;
        job.dur = new_dur;
        worker.gen += 1;
        let remaining = (1.0 - job.done_frac) * new_dur;
        let gen = worker.gen;
        self.note_sm_shares(p);
        if new_dur.is_finite() {
            self.events.push(
                now + remaining,
                Priority::Completion,
                Ev::PrefillDone { prefill: p, gen },
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

    /// Local prefill worker `p` started or finished a batch: the encode passes
    /// sharing its GPUs change speed, and the shares in force are recorded.
    fn local_changed(&mut self, p: usize) {
        if !self.prefill[p].local {
            return;
        }
        for k in 0..self.prefill[p].encode_workers.len() {
            let w = self.prefill[p].encode_workers[k];
            self.rerate_encode(w);
        }
        self.note_sm_shares(p);
    }

    fn on_prefill_done(&mut self, p: usize) {
        let now = self.now;
        let Some(job) = self.prefill[p].job.take() else {
            return;
        };
        self.ask_cores(WorkerRef::Prefill(p), 0);
        if let Some(log) = self.service.as_mut() {
            log.prefill[p].push(now - job.start);
        }
        for &g in &self.prefill[p].gpus {
            self.meters[g as usize].end(now);
            self.meters[g as usize].add_sm_time((now - job.last_update) * job.share);
        }
        if self.timeline.is_some() {
            let track = format!("{} prefill", self.prefill_label(p));
            let tokens: u64 = self.prefill[p].seq_lens.iter().sum();
            let args =
                json!({ "requests": job.requests, "tokens": tokens, "sm_share_at_end": job.share });
            let name = if self.prefill[p].local {
                "local prefill"
            } else {
                "prefill"
            };
            if let Some(tl) = self.timeline.as_mut() {
                tl.slice(&track, name, job.start, now, args);
            }
        }
    }

    /// After the controller heard of a finished batch and its KV transfers
    /// and next batch were carried out: a local worker left idle speeds its
    /// encode passes back up.
    fn after_prefill_done(&mut self, p: usize) {
        if self.prefill[p].job.is_none() {
            self.local_changed(p);
        }
    }

    /// `(start, end)` of a transfer of `bytes` between the two workers of
    /// `path` when they run on different nodes (the NICs carry it,
    /// `fabric.rs`); `None` within a node or without node groups.
    fn over_nics(
        fabric: &mut Option<fabric::Fabric>,
        topology: &Topology,
        now: f64,
        path: (WorkerRef, WorkerRef),
        bytes: f64,
    ) -> Option<(f64, f64)> {
        let (a, b) = (topology.worker(path.0), topology.worker(path.1));
        fabric.as_mut()?.send(now, a.place, b.place, bytes)
    }

    /// Seconds to move `bytes` on worker `w`'s intra-node link: its node
    /// group's link on a cluster of node groups, else the cost source's.
    fn intra_node(&self, w: WorkerRef, bytes: f64) -> f64 {
        match &self.sc.cluster {
            Some(c) => {
                let g = self.topology.worker(w).place.group as usize;
                c.groups[g].gpu.link.transfer_time(bytes)
            }
            None => self.cost.transfer(bytes),
        }
    }

    fn send_kv(&mut self, from: usize, to: usize, id: RequestId) {
        let now = self.now;
        if self.live.lands_at_once(&Command::Kv { from, to, id }) {
            self.events
                .push(now, Priority::Transfer, Ev::KvLands { id, sent_at: now });
            return;
        }
        let bytes = fabric::kv_bytes(&self.ctrl, id, self.sc.model.kv_bytes_per_token());
        let path = (WorkerRef::Prefill(from), WorkerRef::Decode(to));
        let (start, end) = match Self::over_nics(&mut self.fabric, &self.topology, now, path, bytes)
        {
            Some(se) => se,
            None => {
                let dur = self.intra_node(WorkerRef::Prefill(from), bytes);
                self.prefill[from].link.send(now, dur)
            }
        };
        if let Some(log) = self.service.as_mut() {
            log.kv[from].push(end - start);
        }
        if self.timeline.is_some() {
            let track = format!("{} link", self.prefill_label(from));
            let args = json!({ "request": id, "bytes": bytes, "to": format!("D{to}") });
            if let Some(tl) = self.timeline.as_mut() {
                tl.slice(&track, "kv cache", start, end, args);
            }
        }
        self.events
            .push(end, Priority::Transfer, Ev::KvLands { id, sent_at: start });
    }

    // ------------------------------------------------------------- decode

    /// A decode run starts on worker `d`: its iterations (the `i`-th over
    /// `context + i · batch` tokens) are priced ahead in chunks, and the end
    /// of the last one priced is queued.
    fn start_decode_run(&mut self, d: usize, batch: u64, context: u64, steps: u64) {
        let now = self.now;
        self.ask_cores_at(WorkerRef::Decode(d), Some(1.0));
        let worker = &mut self.decode[d];
        worker.durs.clear();
        worker.ends.clear();
        worker.run = Some(RunInFlight {
            start: now,
            batch,
            context,
            steps,
        });
        worker.gen += 1;
        self.price_decode_chunk(d);
        self.queue_decode_end(d);
    }

    /// Price the next chunk of decode worker `d`'s run: as many iterations as
    /// are priced already (at least [`FIRST_DECODE_CHUNK`]), so a run cut
    /// short has at most about as many priced in vain as it ran.
    fn price_decode_chunk(&mut self, d: usize) {
        let slow = self.host_slowdown_of(WorkerRef::Decode(d));
        let worker = &mut self.decode[d];
        let Some(run) = worker.run else {
            return;
        };
        let priced = worker.ends.len() as u64;
        let chunk = priced
            .max(FIRST_DECODE_CHUNK)
            .min(run.steps.saturating_sub(priced));
        self.cost.decode_steps(
            run.batch,
            run.context + priced * run.batch,
            worker.par,
            chunk,
            &mut worker.durs,
        );
        if priced == 0 && !worker.landing.is_empty() {
            let land = Self::take_landings(&self.ctrl, d, &mut worker.landing);
            if let Some(first) = worker.durs.first_mut() {
                *first += land;
            }
        }
        let mut t = worker.ends.last().copied().unwrap_or(run.start);
        let new = &worker.durs[priced as usize..];
        worker.ends.extend(new.iter().map(|&dur| {
            t += dur * slow;
            t
        }));
    }

    /// Request `id`'s KV cache lands on its decode worker (a CPU host), the
    /// controller not yet told: the first run that holds the sequence starts
    /// with landing it, as the executor's decode worker does at the first
    /// step that holds it. A second landing of the same cache, or one on a
    /// worker that is down, lands nothing (the controller drops or fails it).
    fn land_kv(&mut self, id: RequestId) {
        let Some(d) = self.ctrl.decode_worker_of(id) else {
            return;
        };
        if self.ctrl.records()[id as usize].decode_ready.is_some()
            || !self.live.is_alive(WorkerRef::Decode(d))
        {
            return;
        }
        let tokens = self.ctrl.requests()[id as usize].prefill_tokens();
        let worker = &mut self.decode[d];
        let secs = self.cost.kv_land(worker.par.tp, tokens);
        if secs > 0.0 {
            worker.landing.push((id, secs));
        }
    }

    /// The seconds of landing a run of decode worker `d` starts with: those
    /// of the sequences in `landing` the controller has admitted (their
    /// decode start stamped), which leave the list; a sequence no longer on
    /// `d` (failed, or moved) leaves it unpaid; the rest wait.
    fn take_landings(ctrl: &Controller, d: usize, landing: &mut Vec<(RequestId, f64)>) -> f64 {
        let mut land = 0.0;
        landing.retain(|&(id, secs)| {
            if ctrl.decode_worker_of(id) != Some(d) {
                return false;
            }
            if ctrl.records()[id as usize].decode_start.is_some() {
                land += secs;
                return false;
            }
            true
        });
        land
    }

    /// Queue the end of decode worker `d`'s run if it is priced, else of the
    /// last iteration priced.
    fn queue_decode_end(&mut self, d: usize) {
        let worker = &self.decode[d];
        let Some(run) = worker.run else {
            return;
        };
        let last = (run.steps as usize).min(worker.ends.len());
        let Some(&at) = last.checked_sub(1).and_then(|i| worker.ends.get(i)) else {
            return;
        };
        let gen = worker.gen;
        self.events
            .push(at, Priority::Completion, Ev::DecodeEnd { decode: d, gen });
    }

    /// The iteration decode worker `d` queued the end of has ended: the run
    /// ends there (the controller hears of it), or its next chunk is priced.
    fn on_decode_end(&mut self, d: usize) -> Option<Event> {
        let run = self.decode[d].run?;
        if (self.decode[d].ends.len() as u64) < run.steps {
            self.price_decode_chunk(d);
            self.queue_decode_end(d);
            return None;
        }
        self.end_decode_run(d, run.steps);
        Some(Event::DecodeRunDone {
            worker: d,
            steps: run.steps,
        })
    }

    /// The controller cut decode worker `d`'s run short: it ends with the
    /// first iteration that ends strictly after now.
    fn yield_decode_run(&mut self, d: usize) {
        let now = self.now;
        let Some(run) = self.decode[d].run else {
            return;
        };
        let cut = loop {
            let worker = &self.decode[d];
            let cut = worker.ends.partition_point(|&e| e <= now) + 1;
            if cut <= worker.ends.len() || worker.ends.len() as u64 >= run.steps {
                break cut as u64;
            }
            self.price_decode_chunk(d);
        };
        if cut >= run.steps {
            return;
        }
        let worker = &mut self.decode[d];
        if let Some(r) = worker.run.as_mut() {
            r.steps = cut;
        }
        worker.gen += 1;
        self.queue_decode_end(d);
    }

    /// Decode worker `d`'s run ends now after its first `steps` iterations:
    /// they are metered as one busy interval, and logged and drawn one by one.
    fn end_decode_run(&mut self, d: usize, steps: u64) {
        let Some(run) = self.decode[d].run.take() else {
            return;
        };
        self.ask_cores(WorkerRef::Decode(d), 0);
        self.meter_decode(d, run, steps as usize, None);
        self.inline_steps += steps.saturating_sub(1);
    }

    /// Meter the first `n` iterations of decode worker `d`'s run, and the one
    /// after them up to `cut` when it was cut off there (a fault).
    fn meter_decode(&mut self, d: usize, run: RunInFlight, n: usize, cut: Option<f64>) {
        let worker = &self.decode[d];
        // the iterations ran back to back: one busy interval, and the SM-time
        // of each iteration begun (the one cut off counts whole, as its work
        // was issued)
        let begun = if cut.is_some() { n + 1 } else { n }.min(worker.durs.len());
        let end = match cut {
            Some(at) => at,
            None => n.checked_sub(1).map_or(run.start, |i| worker.ends[i]),
        };
        let sm: f64 = worker.durs[..begun].iter().map(|d| d.max(0.0)).sum();
        for &g in &worker.gpus {
            let m = &mut self.meters[g as usize];
            m.begin(run.start);
            m.add_sm_time(sm);
            m.end(end);
        }
        if let Some(log) = self.service.as_mut() {
            // the one cut off too: a driver replaying the log took its time
            // when it began, and its later iterations (after a restart)
            // follow it
            match self.host {
                None => log.decode[d].extend_from_slice(&worker.durs[..begun]),
                // on a shared CPU host: what each iteration took, slowed
                // (the one cut off as it was priced when it began)
                Some(_) => {
                    let mut start = run.start;
                    for &e in &worker.ends[..begun] {
                        log.decode[d].push(e - start);
                        start = e;
                    }
                }
            }
        }
        if let Some(tl) = self.timeline.as_mut() {
            let mut start = run.start;
            for i in 0..n.min(worker.ends.len()) {
                let args = json!({ "batch": run.batch, "context_tokens": run.context + i as u64 * run.batch });
                tl.slice(
                    &format!("D{d} decode"),
                    "decode step",
                    start,
                    worker.ends[i],
                    args,
                );
                start = worker.ends[i];
            }
            tl.counter(
                &format!("D{d} waiting for KV blocks"),
                start,
                self.ctrl.decode_waiting(d) as f64,
            );
        }
    }

    // ------------------------------------------------------------- faults

    /// Worker `w` dies: whatever it was doing stops (its pending ends become
    /// stale) and its GPUs go idle.
    fn lose_work(&mut self, w: WorkerRef) {
        let now = self.now;
        self.live.kill(w);
        match w {
            WorkerRef::Encode(i) => {
                let worker = &mut self.encode[i];
                worker.gen += 1;
                if let Some(pass) = worker.pass.take() {
                    if pass.gpu_phase {
                        self.meters[worker.gpu as usize].end(now);
                    }
                }
            }
            WorkerRef::Prefill(p) => {
                self.prefill[p].gen += 1;
                if self.prefill[p].job.take().is_some() {
                    for &g in &self.prefill[p].gpus {
                        self.meters[g as usize].end(now);
                    }
                    self.local_changed(p);
                }
            }
            WorkerRef::Decode(d) => {
                self.decode[d].gen += 1;
                // the caches it held are lost with it
                self.decode[d].landing.clear();
                if let Some(run) = self.decode[d].run.take() {
                    // the iterations done are metered, the one in progress up
                    // to now; one ending now has not been reported ended (the
                    // fault goes first), as in the other drivers
                    let steps = run.steps as usize;
                    let done = self.decode[d].ends.partition_point(|&e| e < now).min(steps);
                    let cut = (done < steps).then_some(now);
                    self.meter_decode(d, run, done, cut);
                    self.inline_steps += done as u64;
                }
            }
            WorkerRef::Replica(r) => self.lose_replica_step(r),
        }
        self.ask_cores(w, 0);
        if let Some(h) = self.host.as_mut() {
            h.stopped(w);
        }
    }

    // ----------------------------------------------------------- timeline

    /// Worker label of prefill worker `p`: `P{i}` remote, `L{j}` local.
    fn prefill_label(&self, p: usize) -> &str {
        self.topology.label(WorkerRef::Prefill(p))
    }

    fn count_encode_queue(&mut self, w: usize) {
        if let Some(tl) = self.timeline.as_mut() {
            tl.counter(
                &format!("E{w} queue"),
                self.now,
                self.ctrl.encode_queue_len(w) as f64,
            );
        }
    }

    fn count_prefill_queue(&mut self, p: usize) {
        if self.timeline.is_some() {
            let name = format!("{} queue", self.prefill_label(p));
            let len = self.ctrl.prefill_queue_len(p) as f64;
            if let Some(tl) = self.timeline.as_mut() {
                tl.counter(&name, self.now, len);
            }
        }
    }

    // ------------------------------------------------------------ planner

    /// A planner's window ended: it decides from the controller's stage
    /// loads, its changes reach the controller now, and the next window is
    /// timed while requests are still to arrive.
    fn plan_tick(&mut self) {
        // the run is over (every request arrived and none is left in the
        // system): no window to decide on, as the executor, which stops
        // when its last request ends, takes none
        if !self.next_arrival_at.is_finite() && self.ctrl.in_system() == 0 {
            return;
        }
        let now = self.now;
        let loads = self.ctrl.stage_loads(now);
        let arrived = self.next_arrival as u64;
        let Some(plan) = self.plan.as_mut() else {
            return;
        };
        for i in plan.decide(now, loads, arrived) {
            self.events
                .push(now, Priority::Completion, Ev::Reconfigure(i as u32));
        }
        if self.next_arrival_at.is_finite() {
            let w = plan.book.window_s();
            self.events
                .push(now + w, Priority::Completion, Ev::PlanTick);
        }
    }

    /// Worker `w` loads its model: ready after the stage's load time.
    fn load_worker(&mut self, w: WorkerRef) {
        let now = self.now;
        let Some(plan) = self.plan.as_mut() else {
            return;
        };
        plan.book.loading(now, w);
        let stage = match w {
            WorkerRef::Encode(_) => 0,
            WorkerRef::Prefill(_) => 1,
            _ => 2,
        };
        let at = now + plan.book.planner.config().load_s[stage];
        self.events
            .push(at, Priority::Completion, Ev::WorkerReady(w));
    }

    // ------------------------------------------------------------- report

    fn finish(self) -> SimOutput {
        let Sim {
            sc,
            cost,
            mut ctrl,
            meters,
            processed,
            inline_steps,
            max_sm_share_sum,
            timeline,
            topology,
            service,
            tokens,
            plan,
            fabric,
            store_link,
            host,
            events: queue,
            pre_ready,
            ..
        } = self;
        // what only the run needed goes before the report gathers its samples
        // (at 10,000,000 requests the preprocessing times alone are 80 MB)
        drop((queue, pre_ready));
        // GPUs are held until the last request finished
        let end = ctrl.finished().1;
        let mut meters = meters;
        meters.truncate(sc.gpus as usize);
        let decisions = ctrl.take_decisions();
        let supervision = supervision_of(sc, &ctrl);
        let reuse = reuse_report(sc, &ctrl);
        let mut typical = crate::capacity::Typical::of(ctrl.requests(), &tokens);
        if let Some(r) = reuse.as_ref().filter(|_| !sc.knobs.caches.is_off()) {
            typical = typical.with_offered(sc, &r.offered);
        }
        // the items' tokens (32 bytes a request of one item) are not needed
        // past here
        drop(tokens);
        let encode = EncodeSummary::of(&ctrl);
        let mut notes = cost.notes();
        let deployment = match sc.aggregated() {
            Some((n, tp)) => {
                notes.push(format!(
                    "aggregated baseline: {n} replicas at TP{tp}, encode inline before prefill in each iteration (no separate per-pass encode overhead)"
                ));
                format!("aggregated {n}×(TP{tp})")
            }
            None => {
                notes.extend(epd_notes(sc, &ctrl));
                sc.deployment.to_string()
            }
        };
        notes.extend(host.as_ref().map(cores::HostCores::note));
        let roles = (0..sc.gpus)
            .map(|g| {
                topology
                    .gpu_owner(g)
                    .map_or(("idle".into(), "-".into()), |(stage, label)| {
                        (stage.into(), label)
                    })
            })
            .collect();
        let mut out = assemble(
            sc,
            RunParts {
                deployment,
                finished: Some(ctrl.finished()),
                records: ctrl.into_records(),
                meters,
                roles,
                encode,
                notes,
                events: processed + inline_steps,
                max_sm_share_sum,
                timeline,
            },
        );
        out.report.reuse = reuse;
        out.queue_events = processed;
        out.inline_steps = inline_steps;
        crate::verdict::name_bottleneck(
            sc,
            &*cost,
            Some(&typical),
            sc.workload.rate,
            &mut out.report,
        );
        out.report.supervision = supervision;
        if let Some(f) = &fabric {
            out.report.links = f.report(out.report.duration_s);
        }
        out.report
            .links
            .extend(store_link.report(out.report.duration_s));
        out.decisions = decisions;
        out.service = service;
        if let Some(p) = plan {
            let good: Vec<(String, usize)> = out
                .report
                .goodput
                .iter()
                .map(|t| (t.name.clone(), t.good))
                .collect();
            out.report.planner = Some(p.book.report(end, &topology, &good));
        }
        out
    }
}

/// The supervision section of a run of `sc` (`None` when no worker died):
/// each restart's load time is the derived one the run used
/// ([`Scenario::restart_load_s`]); degraded and down time run to the last
/// request's end.
fn supervision_of(
    sc: &Scenario,
    ctrl: &Controller,
) -> Option<easerve_workload::report::SupervisionReport> {
    let mut sup = easerve_workload::report::SupervisionReport::of(ctrl, ctrl.finished().1)?;
    let topology = ctrl.topology();
    for o in &mut sup.outages {
        let w = topology.workers().find(|t| t.label == o.worker);
        o.load_s = w
            .filter(|_| o.back_at.is_some())
            .map(|t| sc.restart_load_s(t.wref));
    }
    Some(sup)
}

/// What the engine does once the controller heard an input: count a queue
/// on the timeline, or re-rate the encode passes beside a local prefill
/// worker left idle.
#[derive(Clone, Copy, Debug)]
enum After {
    Nothing,
    /// Request `.0` arrived: its encode worker's queue (timeline).
    Arrival(usize),
    /// Encode worker `.0`'s queue (timeline).
    EncodeQueue(usize),
    /// Prefill worker `.0`'s queue (timeline).
    PrefillQueue(usize),
    /// Prefill worker `.0` finished a batch: once its next is carried out,
    /// an idle local worker speeds its encode passes back up.
    PrefillDone(usize),
}

/// The engine as a driver of the controller: its inputs are the requests'
/// arrivals and the ends of what the hardware does (the event queue);
/// [`driver::run`] keeps the contract's order. At one instant, completions
/// go first, then transfers, then arrivals (arrivals stay out of the event
/// queue), then the controller's timeout.
impl Driver for Sim<'_> {
    fn controller(&mut self) -> &mut Controller {
        &mut self.ctrl
    }

    #[inline]
    fn next_due(&mut self, now: f64) -> Option<Event> {
        loop {
            // an arrival goes after same-instant completions and transfers
            let a = self.next_arrival_at;
            let Some((t, ev)) = self.events.pop_until(now.min(a)) else {
                if a > now {
                    return None;
                }
                self.processed += 1;
                let i = self.next_arrival;
                self.set_next_arrival(i + 1);
                self.after = After::Arrival(i);
                return Some(Event::Arrival { id: i as RequestId });
            };
            self.processed += 1;
            debug_assert!(t >= now - 1e-9, "time went back: {t} < {now}");
            self.after = After::Nothing;
            if let Some(event) = self.on_event(ev) {
                return Some(event);
            }
        }
    }

    #[inline]
    fn carry_out(&mut self, _now: f64, cmd: Command) {
        self.command(cmd);
    }

    #[inline]
    fn heard(&mut self, _now: f64) {
        // queue lengths are counted for the timeline only
        if self.timeline.is_none() {
            return;
        }
        match self.after {
            After::Arrival(i) => {
                if let Some(w) = self.ctrl.records()[i].encode_worker {
                    self.count_encode_queue(w as usize);
                }
            }
            After::EncodeQueue(w) => self.count_encode_queue(w),
            After::PrefillQueue(p) => self.count_prefill_queue(p),
            _ => {}
        }
    }

    #[inline]
    fn settled(&mut self, _now: f64) {
        if let After::PrefillDone(p) = self.after {
            self.after_prefill_done(p);
        }
    }

    #[inline]
    fn timing_out(&mut self, _now: f64) {
        self.processed += 1;
    }
}

impl VirtualClock for Sim<'_> {
    fn now(&self) -> f64 {
        self.now
    }

    fn set_now(&mut self, t: f64) {
        self.now = t;
    }

    fn next_input(&self) -> Option<f64> {
        let a = self.next_arrival_at;
        match self.events.peek_time() {
            Some(q) => Some(q.min(a)),
            None => a.is_finite().then_some(a),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu_image(requests: i64) -> Scenario {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/cpu-image.toml");
        let o = easerve_workload::scenario::Overrides {
            requests: Some(requests),
            ..Default::default()
        };
        Scenario::load(&path, &o).expect("cpu-image.toml is valid")
    }

    pub(super) fn image_with(sets: &[(&str, &str)]) -> Scenario {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/image.toml");
        let sets: Vec<(String, String)> = [("workload.requests", "300")]
            .iter()
            .chain(sets)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Scenario::load_with(&path, &sets, &Default::default()).expect("valid")
    }

    /// The encoder cache skips the encode of items its worker holds: with a
    /// popular pool, encode passes get shorter and the report counts the
    /// hits the decision log records; hashing raw bytes also skips the
    /// hits' preprocessing. (≈ 1 s in a debug build.)
    #[test]
    fn encoder_cache_hits_skip_encode_work() {
        let pool = [("workload.pool.size", "50"), ("workload.pool.alpha", "1.2")];
        let cached = |raw: &str| {
            let mut sets = pool.to_vec();
            sets.push(("deployment.encoder_cache.capacity_gib", "1"));
            sets.push(("deployment.encoder_cache.hash_raw_bytes", raw));
            image_with(&sets)
        };
        let opts = SimOptions {
            decisions: true,
            ..Default::default()
        };
        let off = simulate(&image_with(&pool));
        let on = simulate_with(&cached("false"), scenario_cost(&cached("false")), &opts);
        let raw = simulate(&cached("true"));
        let enc = |o: &SimOutput| o.report.stages[0].service.mean;
        // an image's preprocessing is most of its encode here (≈ 65 of
        // 85 ms): a hit saves its GPU time, or both with raw-byte hashing
        assert!(enc(&on) < 0.9 * enc(&off), "{} {}", enc(&on), enc(&off));
        assert!(enc(&raw) < 0.5 * enc(&on), "{} {}", enc(&raw), enc(&on));
        let reuse = on.report.reuse.as_ref().expect("reuse section");
        let cache = reuse.encoder_cache.expect("encoder cache on");
        let logged: usize = on
            .decisions
            .iter()
            .map(|d| match d {
                Decision::EncoderCache { hits, .. } => *hits,
                _ => 0,
            })
            .sum();
        assert_eq!(cache.hits, logged as u64);
        // two workers each see every item once at least: hits stay below
        // the offered reuse, and above half of it with 50 items in 1 GiB
        let offered = reuse.offered.items_seen_before;
        assert!(cache.hit_rate <= offered && cache.hit_rate > 0.5 * offered);
        assert!(off.report.reuse.as_ref().unwrap().encoder_cache.is_none());
    }

    /// The shared store serves, on four encode workers with small caches of
    /// their own, items another worker encoded: more items skip their encode
    /// than with the caches alone, the report's store hits are the decision
    /// log's, each hit fetches its bytes and each write is an item the
    /// store did not hold; off, the report has no store. (≈ 1 s in a debug
    /// build.)
    #[test]
    fn the_shared_store_hits_where_the_workers_caches_miss() {
        let base = [
            ("deployment.allocation", "4E(TP1)+1P(TP2)+1D(TP2)"),
            ("workload.pool.size", "200"),
            ("workload.pool.alpha", "0.8"),
            ("deployment.encoder_cache.capacity_gib", "0.2"),
        ];
        let mut sets = base.to_vec();
        sets.push(("deployment.encoder_store.capacity_gib", "4"));
        let opts = SimOptions {
            decisions: true,
            ..Default::default()
        };
        let off = simulate(&image_with(&base));
        let on = simulate_with(&image_with(&sets), scenario_cost(&image_with(&sets)), &opts);
        let reuse = |o: &SimOutput| o.report.reuse.clone().expect("reuse section");
        let (r_off, r_on) = (reuse(&off), reuse(&on));
        assert!(r_off.encoder_store.is_none());
        let store = r_on.encoder_store.expect("store on");
        let cache = r_on.encoder_cache.expect("cache on");
        // the store is asked exactly what the workers' caches missed
        assert_eq!(store.queries, cache.queries - cache.hits);
        let skipped = |c: u64, s: u64| (c + s) as f64 / cache.queries as f64;
        let with_store = skipped(cache.hits, store.hits);
        let alone = r_off.encoder_cache.expect("cache on").hit_rate;
        assert!(with_store > alone + 0.1, "{with_store} vs {alone}");
        assert!(with_store <= r_on.offered.items_seen_before + 1e-9);
        let logged: usize = (on.decisions.iter())
            .map(|d| match d {
                Decision::EncoderStore { hits, .. } => *hits,
                _ => 0,
            })
            .sum();
        assert_eq!(store.hits, logged as u64);
        // every miss of both is written once: the items the store holds
        // plus those it evicted, no more than the misses
        assert!(store.writes <= store.queries - store.hits && store.writes > 0);
        let enc = |o: &SimOutput| o.report.stages[0].service.mean;
        assert!(enc(&on) < enc(&off), "{} {}", enc(&on), enc(&off));
    }

    /// Cache-aware routing sends a request to the encode worker that holds
    /// its items when load allows: with two encode workers and a small
    /// cache, more items hit than under least-outstanding placement, which
    /// spreads each item over both caches; a weight of 0 is that placement.
    /// (≈ 1 s in a debug build.)
    #[test]
    fn cache_aware_routing_raises_encoder_hits() {
        let base = [
            ("workload.pool.size", "400"),
            ("workload.pool.alpha", "0.8"),
            ("deployment.encoder_cache.capacity_gib", "0.3"),
        ];
        let hit_rate = |weight: Option<&str>| {
            let mut sets = base.to_vec();
            if let Some(w) = weight {
                sets.push(("deployment.cache_routing.overlap_weight", w));
            }
            let out = simulate(&image_with(&sets));
            let r = out.report.reuse.expect("reuse");
            (r.encoder_cache.expect("on").hit_rate, out.report.ttft.mean)
        };
        let (plain, _) = hit_rate(None);
        let (routed, _) = hit_rate(Some("1"));
        let (zero, _) = hit_rate(Some("0"));
        assert!(routed > plain + 0.05, "{routed} {plain}");
        assert_eq!(zero, plain);
    }

    /// The prefix cache shortens prefill to the uncached suffix: with
    /// three-turn conversations and shared system prompts, prefill service
    /// drops, the hits are those the decision log records, and they stay
    /// within what the workload offers. (≈ 1 s in a debug build.)
    #[test]
    fn prefix_cache_hits_shorten_prefill() {
        let reuse = [
            ("workload.conversation.turns", "3"),
            ("workload.conversation.think_time_s", "10"),
            ("workload.system_prompt.tokens", "512"),
            ("workload.system_prompt.count", "2"),
            ("workload.rate", "0.5"),
        ];
        let mut with = reuse.to_vec();
        with.push(("deployment.prefix_cache.block_size", "16"));
        let opts = SimOptions {
            decisions: true,
            ..Default::default()
        };
        let off = simulate(&image_with(&reuse));
        let on = simulate_with(&image_with(&with), scenario_cost(&image_with(&with)), &opts);
        let prefill = |o: &SimOutput| o.report.stages[2].service.mean;
        assert!(
            prefill(&on) < 0.8 * prefill(&off),
            "{} {}",
            prefill(&on),
            prefill(&off)
        );
        let reuse = on.report.reuse.as_ref().expect("reuse section");
        let cache = reuse.prefix_cache.expect("prefix cache on");
        let logged: u64 = on
            .decisions
            .iter()
            .map(|d| match d {
                Decision::PrefixCache { hit_tokens, .. } => *hit_tokens,
                _ => 0,
            })
            .sum();
        assert_eq!(cache.hits, logged);
        let offered = reuse.offered.prompt_tokens_seen_before;
        assert!(
            cache.hit_rate <= offered && cache.hit_rate > 0.3,
            "{cache:?} {offered}"
        );
    }

    /// Drift regression: a request whose KV cache can never fit its decode
    /// worker leaves the system (the simulator used to drop it silently, and
    /// `in_system` never went down). It is now refused at arrival, over
    /// `max_model_len`, which the controller bounds by one sequence's KV
    /// cache (`Resolution::limits`), as the server's 400 does, rather than
    /// failing once its KV cache reached decode.
    #[test]
    fn a_kv_cache_that_can_never_fit_is_refused_at_arrival() {
        let mut sc = cpu_image(3);
        // one block of 16 tokens: no request of the scenario fits
        sc.knobs.gpu_memory_utilization = 1e-9;
        let mut sim = Sim::new(&sc, scenario_cost(&sc), true);
        sim.run();
        assert_eq!(sim.ctrl.in_system(), 0);
        let out = sim.finish();
        assert_eq!(out.report.completed, 0);
        assert_eq!((out.report.refused, out.report.failed), (3, 0));
        assert!(out.decisions.iter().all(|d| matches!(
            d,
            Decision::Reject {
                refused: Some(_),
                ..
            }
        )));
    }

    /// Drift regression: faults exist in the simulator too. A decode worker
    /// killed mid-run fails what it holds and what is later sent to it; every
    /// request ends (finished or failed) and the run terminates.
    #[test]
    fn a_worker_killed_mid_decode_fails_its_requests_in_the_simulator_too() {
        let sc = cpu_image(40);
        let full = simulate(&sc);
        let kill_at = full.report.duration_s * 0.5;
        let out = simulate_with(
            &sc,
            scenario_cost(&sc),
            &SimOptions {
                kill: Some((WorkerRef::Decode(0), kill_at)),
                decisions: true,
                ..Default::default()
            },
        );
        assert!(out.report.failed > 0, "nothing failed");
        assert_eq!(out.report.completed + out.report.failed, 40);
        assert!(
            out.report.failures.iter().all(|f| f.reason.contains("D0")),
            "{:?}",
            out.report.failures
        );
        assert!(out
            .records
            .iter()
            .filter(|r| r.failure.is_none())
            .all(|r| r.finish.get().is_some_and(|f| f <= kill_at + 1e-9)));
    }
}
