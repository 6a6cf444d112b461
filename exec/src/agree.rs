//! The executor decides as the simulator does: `easerve exec`'s and
//! `easerve serve`'s own command handling ([`ExecLoop`], [`ServeLoop`]: the
//! [`Relay`](crate::run::Relay) that hears the workers, carries out the
//! controller's commands over their sockets and relays embeddings and KV
//! caches) run against fake workers on a virtual clock, and make the
//! simulator's decisions for the same arrivals and the same service times.
//!
//! The fake workers take the frames the executor writes to each worker (the
//! channel its writer task reads), decode them with the wire format, and
//! answer each as a worker would, through the wire format too, after the
//! time the simulated hardware took for that unit of work
//! ([`Replay`] of the simulator's [`ServiceLog`](easerve_sched::ServiceLog)):
//! an encode pass's host and GPU phases, a prefill batch, each decode
//! iteration, and a transfer's time on its sender's link (one transfer at a
//! time, [`SerialLink`]). Embeddings bound for a local prefill worker stay on
//! the encode GPU: its fake acknowledges them at once. Replies due at the
//! same instant go completions first, then transfers, as in the simulator.
//!
//! The clock is virtual: the loop wakes at the earliest of the next reply,
//! the next arrival and the controller's timer, as `drive` does with the
//! wall clock, and hands the loop everything heard by then.
//!
//! What is compared: the decision log, to the simulator's tolerance
//! ([`assert_same_log`]), and each request's outcome. The records' transfer
//! times are not: the executor stamps a transfer when it relays it, the
//! simulator when the sender's link takes it.
//!
//! Each check is a public function that panics where the two disagree; the
//! workspace's test suite runs them (`tests/exec_agree.rs`, in the README's
//! `cargo test`, which builds this crate without any model).

use crate::run::{DetectAt, ExecLoop, Incoming, Pool};
use crate::serve::{serving_controller, App, Out, ServeLoop};
use crate::wire::{encode_frame, read_frame, FromWorker, KvData, Matrix, ToWorker};
use easerve_sched::driver::SerialLink;
use easerve_sched::harness::{
    assert_same_log, assert_same_outcomes, decision_kinds, Replay, Schedule, Service,
};
use easerve_sched::{Controller, Decision, Request, RequestId, WorkerRef};
use easerve_sim::{simulate_with, SimOptions, SimOutput};
use easerve_workload::generate::generate_with_tokens;
use easerve_workload::scenario::{Overrides, Scenario};
use std::collections::{HashMap, VecDeque};
use tokio::sync::mpsc;

/// Tie classes of replies due at the same instant, as the simulator orders
/// its events: completions, then transfers.
const DONE: u8 = 0;
const LANDED: u8 = 1;

/// Every worker of a pool, faked: frames in, replies out after replayed times.
struct FakeWorkers {
    /// Frames the executor wrote to each worker, by pool index.
    frames: Vec<mpsc::UnboundedReceiver<Vec<u8>>>,
    /// Each pool index's worker.
    roles: Vec<WorkerRef>,
    /// Remote prefill workers (the rest are local).
    remote_prefill: usize,
    replay: Replay,
    /// Each encode worker's link (embeddings) and each prefill worker's (KV caches).
    encode_link: Vec<SerialLink>,
    /// Per encode worker: its pass's write to the shared store, (when the
    /// pass ends, seconds until the store's link is free for it, seconds on
    /// the link), until the link is next used.
    store_write: Vec<Option<(f64, f64, f64)>>,
    prefill_link: Vec<SerialLink>,
    /// Where each request was encoded and prefilled: the sender of its transfers.
    encoded_on: HashMap<RequestId, usize>,
    prefilled_on: HashMap<RequestId, usize>,
    /// What the workers will say, by pool index.
    replies: Schedule<(usize, Incoming)>,
    /// Workers killed: they answer nothing more.
    dead: Vec<usize>,
    /// Each worker's incarnation (a restart or a planner's load begins
    /// the next).
    gens: Vec<u32>,
    /// Planned loads still to die half-way through their model load.
    failing_loads: usize,
}

impl FakeWorkers {
    fn new(
        pool: &Pool,
        frames: Vec<mpsc::UnboundedReceiver<Vec<u8>>>,
        ctrl: &Controller,
        sim: &SimOutput,
    ) -> FakeWorkers {
        let t = ctrl.topology();
        FakeWorkers {
            roles: (0..frames.len()).map(|k| pool.worker_ref(k)).collect(),
            frames,
            remote_prefill: t.remote_prefill(),
            replay: Replay::new(sim.service.clone().expect("the simulator's service log")),
            encode_link: vec![SerialLink::default(); t.encode().len()],
            store_write: vec![None; t.encode().len()],
            prefill_link: vec![SerialLink::default(); t.prefill().len()],
            encoded_on: HashMap::new(),
            prefilled_on: HashMap::new(),
            replies: Schedule::new(),
            dead: Vec::new(),
            gens: vec![0; pool.workers.len()],
            failing_loads: 0,
        }
    }

    /// Worker `k` sends `msg` at `at`, through the wire format.
    fn send(&mut self, at: f64, class: u8, k: usize, msg: &FromWorker) {
        let frame = encode_frame(msg).expect("a frame");
        let msg = read_frame::<_, FromWorker>(&mut &frame[..])
            .expect("a well-formed frame")
            .expect("a whole frame");
        self.replies.push(at, class, (k, Incoming::Msg(k, msg)));
    }

    /// Worker `k` dies at `at`: its connection closes then (scheduled before
    /// the run, it goes first among the instant's replies, as the
    /// simulator's fault), and nothing it had still to say is said.
    fn kill_at(&mut self, k: usize, at: f64) {
        // in the simulator's words, which the failed requests carry
        let down = Incoming::Down(k, 0, easerve_sched::controller::kill_reason(at));
        self.replies.push(at, DONE, (k, down));
    }

    /// Take every frame the executor has written (at `now`) and schedule
    /// each worker's answer.
    fn read(&mut self, now: f64) {
        for k in 0..self.frames.len() {
            while let Ok(bytes) = self.frames[k].try_recv() {
                let msg = read_frame::<_, ToWorker>(&mut &bytes[..])
                    .expect("a well-formed frame")
                    .expect("a whole frame");
                self.answer(now, k, msg);
            }
        }
    }

    /// Put encode worker `w`'s pending store write on its link when its
    /// pass has ended by `now`.
    fn flush_write(&mut self, w: usize, now: f64) {
        if let Some((at, wait, dur)) = self.store_write[w].filter(|&(at, ..)| at <= now) {
            self.encode_link[w].send(at + wait, dur);
            self.store_write[w] = None;
        }
    }

    /// What worker `k` answers to `msg` received at `now`, and when.
    fn answer(&mut self, now: f64, k: usize, msg: ToWorker) {
        match (self.roles[k], msg) {
            (WorkerRef::Encode(w), ToWorker::Encode { requests, sm_share }) => {
                let ids: Vec<RequestId> = requests.iter().map(|r| r.id).collect();
                let (host, gpu) = self.replay.encode(w, &ids, sm_share);
                // its write to the shared store holds the link when it ends,
                // ahead of its embeddings (the simulator's order)
                let (wait, write) = self.replay.store_write(w);
                // (held until the link is next used: the pass's embeddings
                // may be sent after the next pass was)
                self.flush_write(w, now);
                if write > 0.0 {
                    self.store_write[w] = Some((now + host + gpu, wait, write));
                }
                self.encoded_on.extend(ids.iter().map(|&id| (id, w)));
                self.send(now + host, DONE, k, &FromWorker::EncodeGpuStarted);
                let one = Matrix {
                    rows: 1,
                    cols: 1,
                    data: vec![0.0],
                };
                let embeddings = ids.iter().map(|&id| (id, one.clone())).collect();
                let done = FromWorker::EncodeDone {
                    embeddings,
                    preprocess_s: 0.0,
                    compute_s: host + gpu,
                    item_rows: Vec::new(),
                };
                self.send(now + host + gpu, DONE, k, &done);
            }
            (
                WorkerRef::Prefill(p),
                ToWorker::Embeddings {
                    envelope,
                    embeddings,
                },
            ) => {
                let landed = if p >= self.remote_prefill {
                    now
                } else {
                    let ids: Vec<RequestId> = embeddings.iter().map(|e| e.0).collect();
                    let from = self.encoded_on[&ids[0]];
                    let dur = self.replay.embeddings(from, &ids);
                    self.flush_write(from, now);
                    self.encode_link[from].send(now, dur).1
                };
                self.send(
                    landed,
                    LANDED,
                    k,
                    &FromWorker::EmbeddingsLanded { envelope },
                );
            }
            (WorkerRef::Prefill(p), ToWorker::Prefill { requests, sm_share }) => {
                // a hit comes with the prompt it is the head of
                for r in requests.iter().filter(|r| r.cached > 0) {
                    let whole: u32 = r
                        .prompt
                        .iter()
                        .map(|x| match *x {
                            crate::wire::PromptPart::Item { tokens } => tokens,
                            crate::wire::PromptPart::Text { tokens, .. } => tokens,
                        })
                        .sum();
                    assert!(
                        r.cached < whole,
                        "request {}: {} cached of {whole}",
                        r.id,
                        r.cached
                    );
                }
                let dur = self.replay.prefill(p, &[], sm_share);
                self.prefilled_on.extend(requests.iter().map(|r| (r.id, p)));
                let kv = KvData {
                    layers: 1,
                    kv_heads: 1,
                    len: 1,
                    head_dim: 1,
                    k: vec![0.0],
                    v: vec![0.0],
                };
                let outputs = requests.iter().map(|r| (r.id, 1, kv.clone())).collect();
                let done = FromWorker::PrefillDone {
                    outputs,
                    compute_s: dur,
                };
                self.send(now + dur, DONE, k, &done);
            }
            (WorkerRef::Decode(_), ToWorker::Kv { id, .. }) => {
                let from = self.prefilled_on[&id];
                let dur = self.replay.kv(from, id);
                let landed = self.prefill_link[from].send(now, dur).1;
                self.send(landed, LANDED, k, &FromWorker::KvLanded { id });
            }
            (WorkerRef::Decode(d), ToWorker::DecodeStep { ids }) => {
                let dur = self.replay.decode(d, ids.len() as u64, 0);
                let tokens = ids.iter().map(|&id| (id, 2)).collect();
                let done = FromWorker::DecodeDone {
                    tokens,
                    compute_s: dur,
                };
                self.send(now + dur, DONE, k, &done);
            }
            (
                WorkerRef::Replica(r),
                ToWorker::ReplicaStep {
                    prefill, decode, ..
                },
            ) => {
                let (encode_s, compute_s) = self.replay.replica_step(r, &[], 0, 0);
                let tokens = prefill.iter().map(|p| p.id).chain(decode);
                let done = FromWorker::ReplicaStepDone {
                    tokens: tokens.map(|id| (id, 2)).collect(),
                    encode_s,
                    compute_s,
                };
                self.send(now + compute_s, DONE, k, &done);
            }
            (_, ToWorker::Shutdown) => {
                // a worker the planner stopped exits at once
                let down = Incoming::Down(k, self.gens[k], "process exited".into());
                self.replies.push(now, DONE, (k, down));
            }
            (
                _,
                ToWorker::Preprocess { .. } | ToWorker::Release { .. } | ToWorker::PrefixOps { .. },
            ) => {}
            (w, m) => panic!("worker {w:?} was sent {m:?}"),
        }
    }

    /// Worker `k` was restarted at `at`: its new process connects (a new
    /// frame channel, incarnation `gen`) and says `Ready` once its model is
    /// loaded, `load_s` later, as the simulator's restart takes.
    fn restart(&mut self, k: usize, gen: u32, at: f64, load_s: f64) {
        let (tx, rx) = mpsc::unbounded_channel();
        self.frames[k] = rx;
        self.gens[k] = gen;
        self.dead.retain(|d| *d != k);
        let ready = at + load_s;
        self.replies
            .push(ready, DONE, (k, Incoming::Joined(k, gen, tx)));
        self.send(ready, DONE, k, &FromWorker::Ready { load_s });
    }

    /// When the next reply comes, if one is coming.
    fn next_at(&self) -> Option<f64> {
        self.replies.next_time()
    }

    /// Every reply due by `now`, in order; a dead worker's are dropped.
    fn due(&mut self, now: f64) -> Vec<Incoming> {
        let mut out = Vec::new();
        while let Some((k, msg)) = self.replies.pop_due(now) {
            if self.dead.contains(&k) {
                continue;
            }
            if matches!(msg, Incoming::Down(..)) {
                self.dead.push(k);
                // the executor's writes to it fail from now on
                self.frames[k].close();
            }
            out.push(msg);
        }
        out
    }
}

/// The executor's loop under test, as its driver (`drive` in `run.rs` or
/// `serve.rs`) runs it, but on a virtual clock.
trait Face {
    /// When the loop must wake though no worker speaks (seconds).
    fn wake_at(&self, ctrl: &Controller) -> Option<f64>;
    /// It wakes at `now` having heard `heard`, as its `drive` does.
    fn wake(&mut self, ctrl: &mut Controller, pool: &mut Pool, now: f64, heard: Vec<Incoming>);
    /// Whether a `twin` decision's simulations are out on their thread.
    fn simulating(&self) -> bool;
    /// Whether the run is over: every request of the workload came and is
    /// done.
    fn ended(&self, ctrl: &Controller) -> bool;
}

impl Face for ExecLoop {
    fn wake_at(&self, ctrl: &Controller) -> Option<f64> {
        ExecLoop::wake_at(self, ctrl)
    }

    fn wake(&mut self, ctrl: &mut Controller, pool: &mut Pool, now: f64, heard: Vec<Incoming>) {
        for ev in heard {
            let at = DetectAt {
                now,
                killed_at: None,
            };
            self.hear(pool, ev, at, ctrl);
        }
        ExecLoop::wake(self, ctrl, pool, now);
    }

    fn simulating(&self) -> bool {
        self.relay.plan.as_ref().is_some_and(|p| p.simulating)
    }

    fn ended(&self, ctrl: &Controller) -> bool {
        ctrl.is_finished()
    }
}

/// `easerve serve`'s loop with the workload's requests submitted at their
/// arrival times, as HTTP handlers would submit them; each submission's
/// answers are kept.
struct ServeFace {
    serve: ServeLoop,
    app: App,
    to_submit: VecDeque<Request>,
    answers: Vec<mpsc::UnboundedReceiver<Out>>,
}

impl Face for ServeFace {
    fn wake_at(&self, ctrl: &Controller) -> Option<f64> {
        let submit = self.to_submit.front().map(|r| r.arrival);
        [submit, ctrl.poll_timeout(), self.serve.plan_wake()]
            .into_iter()
            .flatten()
            .reduce(f64::min)
    }

    fn wake(&mut self, ctrl: &mut Controller, pool: &mut Pool, now: f64, heard: Vec<Incoming>) {
        for ev in heard {
            let at = DetectAt {
                now,
                killed_at: None,
            };
            self.serve.hear(pool, ev, at, ctrl);
        }
        while self.to_submit.front().is_some_and(|r| r.arrival <= now) {
            let Some(request) = self.to_submit.pop_front() else {
                break;
            };
            let arrival = request.arrival;
            let chat = crate::openai::ChatRequest {
                request,
                media: Vec::new(),
                stream: false,
                include_usage: false,
                timeout_s: None,
            };
            let (tx, rx) = mpsc::unbounded_channel();
            self.answers.push(rx);
            let sub = crate::serve::Submission {
                chat,
                reply: tx,
                received: std::time::Instant::now(),
                ticket: self.answers.len() as u64,
            };
            self.serve.submit(ctrl, sub, arrival);
        }
        // windows end while requests are still to come, as in `exec`
        self.serve.set_plan_open(!self.to_submit.is_empty());
        self.serve.wake(ctrl, pool, &self.app, now);
    }

    fn simulating(&self) -> bool {
        self.serve.simulating()
    }

    /// A server runs on after its last request; the run compared ends
    /// there, when every request was submitted and answered.
    fn ended(&self, ctrl: &Controller) -> bool {
        self.to_submit.is_empty() && ctrl.is_finished()
    }
}

/// Run `face` against `fakes` on a virtual clock until every request is
/// done or nothing is left.
/// A `twin` decision's simulations (on their own thread, in real time) are
/// heard as soon as they went out, on the virtual clock.
fn run_virtual(
    face: &mut impl Face,
    ctrl: &mut Controller,
    pool: &mut Pool,
    fakes: &mut FakeWorkers,
    sc: &Scenario,
) {
    run_gated(face, ctrl, pool, fakes, sc, None);
}

/// A gate the tests' twin waits at ([`GatedTwin`]), and the virtual
/// seconds the loop runs on while a decision's simulations are out, before
/// it opens the gate.
type Gate<'a> = (&'a std::sync::mpsc::Sender<()>, f64);

/// [`run_virtual`], with the `twin` simulations held at `gate` (when
/// given) until the loop has run on for its seconds: then the gate opens
/// and the loop hears the results at once.
fn run_gated(
    face: &mut impl Face,
    ctrl: &mut Controller,
    pool: &mut Pool,
    fakes: &mut FakeWorkers,
    sc: &Scenario,
    gate: Option<Gate>,
) {
    let mut now = 0.0f64;
    let mut out_since: Option<f64> = None;
    for _ in 0..10_000_000 {
        // the run ends with its last request, as `exec`'s loop does (a
        // window timed after it is not decided: the simulator skips it too)
        if face.ended(ctrl) {
            return;
        }
        fakes.read(now);
        let next = [fakes.next_at(), face.wake_at(ctrl), pool.sup.next_restart()]
            .into_iter()
            .flatten()
            .reduce(f64::min);
        if face.simulating() {
            let since = *out_since.get_or_insert(now);
            let due = gate.map_or(since, |(_, s)| since + s);
            if next.is_none_or(|t| t > due) {
                now = now.max(due);
                if let Some((tx, _)) = gate {
                    tx.send(()).expect("the twin waits");
                }
                let done = pool.rx.blocking_recv().expect("the twin's results");
                out_since = None;
                face.wake(ctrl, pool, now, vec![done]);
                continue;
            }
        }
        let Some(t) = next else {
            return;
        };
        now = now.max(t);
        // restarts whose backoff is over and a planner's loads begin
        // (`drive` does this first too); each loads its model in the time
        // the simulator takes for it
        for k in pool.start_due_restarts(now).0 {
            let gen = pool.sup.gens[k].load(std::sync::atomic::Ordering::SeqCst);
            let w = pool.worker_ref(k);
            let load_s = match (&sc.planner, pool.workers[k].planned) {
                (Some(p), true) => p.config.load_s[stage_of(w)],
                _ => sc.restart_load_s(w),
            };
            if pool.workers[k].planned && fakes.failing_loads > 0 {
                // its process dies half-way through the load
                fakes.failing_loads -= 1;
                fakes.gens[k] = gen;
                let down = Incoming::Down(k, gen, "process exited (exit status: 1)".into());
                fakes.replies.push(now + load_s / 2.0, DONE, (k, down));
                continue;
            }
            fakes.restart(k, gen, now, load_s);
        }
        let heard = fakes.due(now);
        face.wake(ctrl, pool, now, heard);
    }
    panic!("the run did not end");
}

/// The planner of `sc` as `exec` and `serve` run it, if `sc` has one.
/// `sc`'s requests set up as `easerve exec` drives them against fake
/// workers that replay `sim`: the controller, a detached pool, the fakes,
/// and the executor's loop with `sc`'s planner.
fn planned_exec(sc: &Scenario, sim: &SimOutput) -> (Controller, Pool, FakeWorkers, ExecLoop) {
    let (requests, tokens) = generate_with_tokens(sc);
    let ctrl = sc.controller(requests, &tokens, &*sc.cost(), true);
    let (pool, frames) = Pool::detached(ctrl.topology());
    let fakes = FakeWorkers::new(&pool, frames, &ctrl, sim);
    let mut exec = ExecLoop::new(&ctrl);
    exec.relay.plan = plan_of(sc, &ctrl);
    (ctrl, pool, fakes, exec)
}

fn plan_of(sc: &Scenario, ctrl: &Controller) -> Option<crate::plan::ExecPlan> {
    crate::plan::ExecPlan::of(sc, ctrl.topology(), std::sync::Arc::from(sc.cost()))
}

/// The planner's index of worker `w`'s stage (encode, prefill, decode).
fn stage_of(w: WorkerRef) -> usize {
    match w {
        WorkerRef::Encode(_) => 0,
        WorkerRef::Prefill(_) => 1,
        _ => 2,
    }
}

/// The image scenario `tests/drivers_agree.rs` runs (local prefill at
/// offload 0.6, Poisson-gap dispatch, bursty arrivals), with `sets` applied.
fn image_scenario(sets: &[(&str, &str)]) -> Scenario {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/drivers_agree_image.toml");
    let sets: Vec<(String, String)> = sets
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Scenario::load_with(&path, &sets, &Overrides::default()).expect("a valid scenario")
}

/// The simulator's run of `sc`, with its decisions and service times, and
/// worker `kill` dying as the tests kill it.
fn simulate(sc: &Scenario, kill: Option<(WorkerRef, f64)>) -> SimOutput {
    simulate_restarting(sc, kill, None)
}

/// [`simulate`], the killed worker restarted `restart_after` seconds after
/// its death when given.
fn simulate_restarting(
    sc: &Scenario,
    kill: Option<(WorkerRef, f64)>,
    restart_after: Option<f64>,
) -> SimOutput {
    let opts = SimOptions {
        decisions: true,
        service_log: true,
        kill,
        restart_after,
        ..Default::default()
    };
    simulate_with(sc, sc.cost(), &opts)
}

/// `easerve exec`'s loop over `sc`'s workload against fake workers replaying
/// `sim`, with worker `kill` dying as in `sim`: the controller at the end.
fn execute(sc: &Scenario, sim: &SimOutput, kill: Option<(WorkerRef, f64)>) -> Controller {
    execute_restarting(sc, sim, kill, None)
}

/// [`execute`], the killed worker restarted `restart_after` seconds after its
/// death when given (`easerve exec --restart-after`).
fn execute_restarting(
    sc: &Scenario,
    sim: &SimOutput,
    kill: Option<(WorkerRef, f64)>,
    restart_after: Option<f64>,
) -> Controller {
    let (requests, tokens) = generate_with_tokens(sc);
    let mut ctrl = sc.controller(requests, &tokens, &*sc.cost(), true);
    if let Some(base) = restart_after {
        ctrl.supervise(easerve_sched::Backoff::starting_at(base));
    }
    let (mut pool, frames) = Pool::detached(ctrl.topology());
    let mut fakes = FakeWorkers::new(&pool, frames, &ctrl, sim);
    if let Some((w, at)) = kill {
        let k = (0..pool.workers.len())
            .find(|&k| pool.worker_ref(k) == w)
            .expect("the worker killed");
        fakes.kill_at(k, at);
    }
    let mut exec = ExecLoop::new(&ctrl);
    exec.relay.plan = plan_of(sc, &ctrl);
    run_virtual(&mut exec, &mut ctrl, &mut pool, &mut fakes, sc);
    ctrl
}

/// Whether every request ended and the executor's log and outcomes are the
/// simulator's; returns the log's kinds ([`decision_kinds`]).
fn assert_agree(sim: &SimOutput, ctrl: &Controller) -> [usize; 20] {
    assert!(ctrl.is_finished(), "requests left in the executor");
    let n = decision_kinds(&sim.decisions);
    assert!(
        n[2] > 10 && n[4] > 10 && n[7] > 100,
        "too few decisions to compare: {n:?}"
    );
    assert_same_log(&sim.decisions, ctrl.decisions());
    assert_same_outcomes(&sim.records, ctrl.records());
    n
}

/// Requests whose prefill stayed on the encode GPU.
fn local_routes(log: &[Decision]) -> usize {
    log.iter()
        .filter(|d| matches!(d, Decision::Route { local: true, .. }))
        .count()
}

/// `easerve exec`'s loop on the image scenario with `sets` applied and worker
/// `kill` dying, against the simulator: the log's kinds and the executor's
/// controller once they agree.
fn exec_agrees(sets: &[(&str, &str)], kill: Option<(WorkerRef, f64)>) -> ([usize; 20], Controller) {
    let sc = image_scenario(sets);
    let sim = simulate(&sc, kill);
    let ctrl = execute(&sc, &sim, kill);
    (assert_agree(&sim, &ctrl), ctrl)
}

/// `easerve exec` and the simulator with a client timeout at the median
/// E2E of a run without one: both abort the same requests at the same
/// deadlines (the controller's own timer), free the same KV blocks and
/// agree on everything else.
pub fn the_executor_aborts_what_the_simulator_aborts_at_deadlines() {
    let plain = simulate(&image_scenario(&[]), None);
    let mut e2e: Vec<f64> = plain.records.iter().filter_map(|r| r.e2e()).collect();
    e2e.sort_by(f64::total_cmp);
    let median = e2e[e2e.len() / 2].to_string();
    let (n, ctrl) = exec_agrees(&[("workload.timeout_s", &median)], None);
    let aborted = ctrl.counters().aborted;
    assert!(n[19] == aborted && aborted > 0, "{n:?}");
    assert!(ctrl.records().iter().filter(|r| r.finish.is_some()).count() > 0);
    assert!((0..ctrl.topology().decode().len()).all(|d| ctrl.decode_kv(d).used() == 0));
}

/// `easerve exec` on the image scenario (local prefill at offload 0.6): the
/// simulator's decisions and outcomes, with local routes and decode yields.
pub fn the_executor_decides_as_the_simulator_with_local_prefill() {
    let (n, ctrl) = exec_agrees(&[], None);
    assert!(local_routes(ctrl.decisions()) > 30, "{n:?}");
    // decode runs cut short for a KV cache that can join at once
    assert!(n[9] > 10, "too few decode yields: {n:?}");
}

/// Under time-slicing the local prefill share changes while batches run:
/// the executor applies a change at the next batch and still decides the same.
pub fn the_executor_decides_as_the_simulator_under_time_slicing() {
    let (n, _) = exec_agrees(&[("deployment.sm_policy", "none")], None);
    assert!(n[5] > 10, "too few share changes: {n:?}");
}

/// The only decode worker dies mid-run: the executor notices its connection
/// close, fails what it held, and lands the KV caches later sent to it at
/// once; the same requests fail as in the simulator.
pub fn the_executor_fails_what_the_simulator_fails_when_a_worker_dies() {
    let (n, _) = exec_agrees(&[], Some((WorkerRef::Decode(0), 40.0)));
    assert!(n[8] > 0, "nothing failed: {n:?}");
}

/// The only decode worker dies mid-run and is restarted 1 s later: the
/// executor fails what it held, starts the new incarnation when the backoff
/// is over, and rejoins it when it says `Ready`, after the load the
/// simulator derives; both drivers decide the same, the restart and the
/// rejoin included, and the requests after the rejoin finish.
pub fn the_executor_restarts_what_the_simulator_restarts() {
    let sc = image_scenario(&[]);
    let kill = Some((WorkerRef::Decode(0), 40.0));
    let sim = simulate_restarting(&sc, kill, Some(1.0));
    let ctrl = execute_restarting(&sc, &sim, kill, Some(1.0));
    let n = assert_agree(&sim, &ctrl);
    assert!(n[8] > 0, "nothing failed: {n:?}");
    assert_eq!((n[17], n[18]), (1, 1), "one restart, one rejoin: {n:?}");
    let back = ctrl.outages()[0].back_at.expect("back");
    let after = ctrl.records().iter().filter(|r| r.arrival > back);
    assert!(after.clone().count() > 10);
    assert!(after.into_iter().all(|r| r.finish.is_some()));
}

/// `easerve serve` takes its requests as they come (`add_request`) and
/// streams their tokens; fed the workload's requests at their arrival times,
/// it decides as the simulator does, and every request's handler hears it
/// accepted, all its tokens, then done.
pub fn the_server_decides_as_the_simulator_with_local_prefill() {
    let sc = image_scenario(&[]);
    let sim = simulate(&sc, None);
    let ctrl = serve_streams_every_token(&sc, &sim);
    let n = assert_agree(&sim, &ctrl);
    assert!(n[9] > 10, "too few decode yields: {n:?}");
}

/// `easerve serve`'s loop fed `sc`'s workload at its arrival times against
/// fake workers replaying `sim`: every request's handler hears it accepted,
/// all its tokens, then done. The controller at the end.
fn serve_streams_every_token(sc: &Scenario, sim: &SimOutput) -> Controller {
    let mut ctrl = serving_controller(sc, &*sc.cost(), true);
    let (mut pool, frames) = Pool::detached(ctrl.topology());
    let mut fakes = FakeWorkers::new(&pool, frames, &ctrl, sim);
    let (submit, _submissions) = mpsc::unbounded_channel();
    let (abandon, _abandoned) = mpsc::unbounded_channel();
    let (requests, _) = generate_with_tokens(sc);
    let outputs: Vec<u32> = requests.iter().map(|r| r.output_tokens).collect();
    let mut face = ServeFace {
        serve: ServeLoop::new(),
        app: App::new(sc, submit, abandon, std::time::Duration::from_secs(60)),
        to_submit: requests.into(),
        answers: Vec::new(),
    };
    face.serve.set_plan(plan_of(sc, &ctrl));
    run_virtual(&mut face, &mut ctrl, &mut pool, &mut fakes, sc);
    assert_eq!(face.answers.len(), outputs.len());
    for (id, (rx, want)) in face.answers.iter_mut().zip(outputs).enumerate() {
        let mut heard = Vec::new();
        while let Ok(out) = rx.try_recv() {
            heard.push(out);
        }
        let tokens = heard.iter().filter(|o| matches!(o, Out::Token(_))).count();
        assert!(
            matches!(heard.first(), Some(Out::Accepted))
                && matches!(heard.last(), Some(Out::Done))
                && tokens == want as usize,
            "request {id}: {heard:?}, {want} tokens wanted"
        );
    }
    ctrl
}

/// The image scenario's cluster and arrivals, its requests text only, run
/// as the aggregated system (4 replicas of TP2).
fn aggregated_text_scenario() -> Scenario {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests");
    let image = std::fs::read_to_string(dir.join("drivers_agree_image.toml")).expect("the file");
    let text = image
        .split("[workload.image]")
        .next()
        .expect("its head")
        .replace("modality = \"image\"", "modality = \"text\"");
    let path = std::env::temp_dir().join(format!("agree-aggregated-{}.toml", std::process::id()));
    std::fs::write(&path, text).expect("a temporary scenario");
    let sets = [
        ("deployment.system", "aggregated"),
        ("deployment.aggregated_tp", "2"),
        ("deployment.allocation", "1P(TP4)+1D(TP4)"),
        ("deployment.offload", "1"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()));
    let sc = Scenario::load_with(&path, &sets, &Overrides::default());
    let _ = std::fs::remove_file(&path);
    let sc = sc.expect("a valid scenario");
    assert_eq!(sc.aggregated(), Some((4, 2)));
    sc
}

/// The aggregated system: the executor's front end hands each request on at
/// once (its replica preprocesses inside the iteration), so the simulator
/// must charge no front-end time for the two to agree — text requests, which
/// have nothing to preprocess. Fake replicas answer each iteration after the
/// simulator's time for it; placements and iterations are the simulator's,
/// and a replica that dies fails what the simulator's fails.
pub fn the_executor_decides_as_the_simulator_for_the_aggregated_system() {
    let sc = aggregated_text_scenario();
    for kill in [None, Some((WorkerRef::Replica(1), 30.0))] {
        let sim = simulate(&sc, kill);
        let service = sim.service.as_ref().expect("a service log");
        assert!(service.front_end.iter().all(|&t| t == 0.0));
        let ctrl = execute(&sc, &sim, kill);
        assert!(ctrl.is_finished(), "requests left in the executor");
        let n = decision_kinds(&sim.decisions);
        assert!(n[10] > 100 && n[11] > 100, "too few decisions: {n:?}");
        assert_same_log(&sim.decisions, ctrl.decisions());
        assert_same_outcomes(&sim.records, ctrl.records());
        let failed = ctrl
            .records()
            .iter()
            .filter(|r| r.failure.is_some())
            .count();
        assert_eq!(failed > 0, kill.is_some(), "{failed} failed under {kill:?}");
    }
}

/// `easerve serve` runs the aggregated system as the simulator does, and
/// streams each request's tokens from the replica's iterations.
pub fn the_server_decides_as_the_simulator_for_the_aggregated_system() {
    let sc = aggregated_text_scenario();
    let sim = simulate(&sc, None);
    let ctrl = serve_streams_every_token(&sc, &sim);
    assert!(ctrl.is_finished(), "requests left in the server");
    assert_same_log(&sim.decisions, ctrl.decisions());
    assert_same_outcomes(&sim.records, ctrl.records());
}

/// The image scenario's cluster (8 GPUs) as `2E(TP1)+1P(TP2)+2D(TP2)`, no
/// local prefill (`s = 1`, so every worker can move), under three 40 s
/// phases of 1, 4 and 1 req/s and the `load` planner deciding every 10 s:
/// in the simulator it moves a decode worker's GPUs to prefill at 10 s (a
/// role change), then drains and restarts the prefill worker as the load
/// falls and rises.
fn planned_scenario() -> Scenario {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests");
    let image = std::fs::read_to_string(dir.join("drivers_agree_image.toml")).expect("the file");
    let text = image.replace("rate = 3.0\n", "window_s = 20\n")
        + r#"
[[workload.phases]]
kind = "constant"
duration_s = 40
rate = 1.0
[[workload.phases]]
kind = "constant"
duration_s = 40
rate = 4.0
[[workload.phases]]
kind = "constant"
duration_s = 40
rate = 1.0
[planner]
policy = "load"
window_s = 10
"#;
    let path = std::env::temp_dir().join(format!("agree-planned-{}.toml", std::process::id()));
    std::fs::write(&path, text).expect("a temporary scenario");
    let sets = [
        ("deployment.allocation", "2E(TP1)+1P(TP2)+2D(TP2)"),
        ("deployment.offload", "1"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()));
    let sc = Scenario::load_with(&path, &sets, &Overrides::default());
    let _ = std::fs::remove_file(&path);
    sc.expect("a valid scenario")
}

/// The planner's changes in a decision log, in order.
fn changes(log: &[Decision]) -> Vec<easerve_sched::Change> {
    log.iter()
        .filter_map(|d| match d {
            Decision::Reconfigure { change, .. } => Some(*change),
            _ => None,
        })
        .collect()
}

/// Role changes and restarts of a drained slot lose no request: `ctrl`
/// finished every request, and made the simulator's changes in the same
/// order — a role change (a worker drained with another started on its
/// GPUs) among them — with a stop and a ready for each. The whole logs are
/// not compared: with two decode workers the fake workers' replay of decode
/// iterations drifts from the simulator's by an iteration when a run yields
/// (before any change; the other tests here run one decode worker).
fn assert_moves_lose_nothing(sim: &SimOutput, ctrl: &Controller) {
    assert!(ctrl.is_finished(), "requests left");
    let done = ctrl.records().iter().filter(|r| r.finish.is_some()).count();
    assert_eq!(done, ctrl.records().len(), "a request did not finish");
    let ours = changes(ctrl.decisions());
    assert_eq!(
        ours,
        changes(&sim.decisions),
        "the planners' changes differ"
    );
    let role_change = ours
        .iter()
        .any(|c| matches!(c, easerve_sched::Change::Drain { then: Some(_), .. }));
    let count = |f: fn(&Decision) -> bool| ctrl.decisions().iter().filter(|d| f(d)).count();
    let stops = count(|d| matches!(d, Decision::WorkerStopped { .. }));
    let ready = count(|d| matches!(d, Decision::WorkerReady { .. }));
    let drains = ours
        .iter()
        .filter(|c| matches!(c, easerve_sched::Change::Drain { .. }))
        .count();
    let starts = ours
        .iter()
        .filter(|c| matches!(c, easerve_sched::Change::Start { .. }))
        .count();
    assert!(role_change, "no role change: {ours:?}");
    assert_eq!((stops, ready), (drains, starts + 1), "{ours:?}");
}

/// `easerve exec`'s loop runs the `load` planner over a three-phase
/// schedule ([`planned_scenario`]) as the simulator does: the same windows,
/// decisions and changes; a drained worker's process gets a shutdown frame,
/// and the worker started on its GPUs begins when that process has exited
/// and joins when it says `Ready` (after the simulator's load time). Every
/// request finishes, as in the simulator, and the account matches.
pub fn the_executor_moves_workers_as_the_simulator_plans() {
    let sc = planned_scenario();
    let sim = simulate(&sc, None);
    let (mut ctrl, mut pool, mut fakes, mut exec) = planned_exec(&sc, &sim);
    run_virtual(&mut exec, &mut ctrl, &mut pool, &mut fakes, &sc);
    assert_moves_lose_nothing(&sim, &ctrl);
    let plan = exec.relay.plan.take();
    let mut report = sim.report.clone();
    crate::plan::account(plan, &ctrl, &mut report);
    let (ours, theirs) = (
        report.planner.expect("an account"),
        sim.report.planner.clone(),
    );
    let theirs = theirs.expect("the simulator's account");
    assert_eq!(ours.changes.len(), theirs.changes.len());
    for (a, b) in ours.changes.iter().zip(&theirs.changes) {
        assert_eq!((a.change, &a.from, &a.to), (b.change, &b.from, &b.to));
        assert_eq!(a.stopped_at.is_some(), b.stopped_at.is_some(), "{a:?}");
        assert_eq!(a.ready_at.is_some(), b.ready_at.is_some(), "{a:?}");
    }
    // within the cluster's 8 GPUs over the run
    let end = ctrl.finished().1;
    assert!(ours.gpu_hours > 0.0 && ours.gpu_hours <= 8.0 * end / 3600.0 + 1e-9);
}

/// `easerve serve`'s loop runs the same planner over the same requests,
/// submitted at their arrival times, as the simulator does, and streams
/// every request's tokens.
pub fn the_server_moves_workers_as_the_simulator_plans() {
    let sc = planned_scenario();
    let sim = simulate(&sc, None);
    let ctrl = serve_streams_every_token(&sc, &sim);
    assert_moves_lose_nothing(&sim, &ctrl);
}

/// `easerve exec` on the image scenario with its images from a pool of 40
/// (Zipf 1.0), an encoder cache that holds a few of them on each encode
/// worker, a shared store that holds a dozen, the prefix cache and
/// cache-aware placement: the executor makes the simulator's cache lookups
/// (each request's encoder-cache, store and prefix-cache hits, in the log)
/// and ends with the same hits, queries and evictions in every cache.
pub fn the_executor_hits_and_evicts_as_the_simulator() {
    // 64 MiB per encode worker: one 672×672 image is 2,928 tokens × 7,168
    // × 2 bytes = 42 MB, one 336×336 about 8.3 MB, so a few fit and the
    // rest are evicted
    let sets = [
        ("workload.pool.size", "40"),
        ("workload.pool.alpha", "1.0"),
        ("deployment.encoder_cache.capacity_gib", "0.0625"),
        ("deployment.prefix_cache.block_size", "16"),
        ("deployment.cache_routing.overlap_weight", "1.0"),
        // a shared store of a dozen large images behind them
        ("deployment.encoder_store.capacity_gib", "0.5"),
    ];
    let (sim, ctrl, enc, pre) = caches_agree(&sets);
    let store = ctrl.store_counters().expect("store on");
    let reuse = sim.report.reuse.as_ref().expect("the reuse section");
    let sim_store = reuse.encoder_store.expect("store in the report");
    assert_eq!(
        (store.queries, store.hits, store.evictions, store.writes),
        (
            sim_store.queries,
            sim_store.hits,
            sim_store.evictions,
            sim_store.writes
        ),
        "encoder store"
    );
    // the workload repeats, and the caches both hit and evict
    assert!(enc.hits > 0 && enc.evictions > 0, "{enc:?}");
    assert!(store.hits > 0 && store.evictions > 0, "{store:?}");
    assert!(pre.hits > 0, "{pre:?}");
}

/// The image scenario with `sets` (both caches on) simulated and executed:
/// the executor makes the simulator's decisions, cache lookups included,
/// and ends with the same queries, hits and evictions in both caches,
/// whose counters it returns beside both runs.
fn caches_agree(
    sets: &[(&str, &str)],
) -> (
    SimOutput,
    Controller,
    easerve_sched::CacheCounters,
    easerve_sched::CacheCounters,
) {
    let sc = image_scenario(sets);
    let sim = simulate(&sc, None);
    let ctrl = execute(&sc, &sim, None);
    let n = assert_agree(&sim, &ctrl);
    assert!(n[15] > 100 && n[16] > 100, "too few cache lookups: {n:?}");
    let reuse = sim.report.reuse.as_ref().expect("the reuse section");
    let (enc, pre) = ctrl.cache_counters();
    let (enc, pre) = (
        enc.expect("encoder cache on"),
        pre.expect("prefix cache on"),
    );
    let (sim_enc, sim_pre) = (
        reuse.encoder_cache.expect("encoder cache in the report"),
        reuse.prefix_cache.expect("prefix cache in the report"),
    );
    assert_eq!(
        (enc.queries, enc.hits, enc.evictions),
        (sim_enc.queries, sim_enc.hits, sim_enc.evictions),
        "encoder cache"
    );
    assert_eq!(
        (pre.queries, pre.hits, pre.evictions),
        (sim_pre.queries, sim_pre.hits, sim_pre.evictions),
        "prefix cache"
    );
    (sim, ctrl, enc, pre)
}

/// [`the_executor_hits_and_evicts_as_the_simulator`] over prompts that
/// share text: three-turn conversations (each turn resends the earlier
/// turns' image, text and answer) opening with one of four system prompts,
/// images from a pool of 40, the encoder cache, the prefix cache and
/// cache-aware placement: the executor makes the simulator's lookups and
/// ends with the same queries, hits and evictions in both caches, and its
/// prefill workers are sent each hit with the prompt it is the head of.
pub fn the_executor_hits_and_evicts_as_the_simulator_over_shared_text() {
    let sets = [
        ("workload.pool.size", "40"),
        ("workload.pool.alpha", "1.0"),
        ("workload.conversation.turns", "3"),
        ("workload.conversation.think_time_s", "2.0"),
        ("workload.system_prompt.tokens", "500"),
        ("workload.system_prompt.count", "4"),
        ("deployment.encoder_cache.capacity_gib", "0.0625"),
        ("deployment.prefix_cache.block_size", "16"),
        ("deployment.cache_routing.overlap_weight", "1.0"),
    ];
    let (_, _, enc, pre) = caches_agree(&sets);
    // system prompts and earlier turns hit: more than the images alone could
    assert!(pre.hits > 0 && pre.evictions > 0, "{pre:?}");
    assert!(enc.hits > 0, "{enc:?}");
}

/// A twin for the tests: each decision's simulations wait at a gate (once
/// per decision: its queries share a seed) and find the deployment in force
/// (a decision's first candidate) the only one with good requests, so the
/// planner holds and the run is the static one's.
struct GatedTwin {
    gate: std::sync::mpsc::Receiver<()>,
    seed: Option<u64>,
}

impl easerve_sched::planner::Twin for GatedTwin {
    fn good_requests(&mut self, q: &easerve_sched::planner::TwinQuery) -> f64 {
        if self.seed == Some(q.seed) {
            return 0.0;
        }
        self.seed = Some(q.seed);
        // a loop that waited for the twin would never open the gate
        let wait = std::time::Duration::from_secs(60);
        self.gate
            .recv_timeout(wait)
            .expect("the loop opens the gate while the twin simulates");
        1.0
    }
}

/// `easerve exec`'s loop does not wait for the `twin` planner's
/// simulations: while a decision's are held (20 virtual seconds, two
/// windows, each time) the loop goes on placing, prefilling and finishing
/// requests; the decision takes effect when its results come, and the log
/// says for which window it was taken and when it was applied; the windows
/// that ended meanwhile held. Every request finishes.
pub fn the_executor_keeps_serving_while_the_twin_simulates() {
    let stat = planned_scenario();
    let mut sc = stat.clone();
    let planner = sc.planner.as_mut().expect("a planner");
    planner.config.policy = easerve_sched::planner::PlannerPolicy::Twin;
    let mut stat = stat;
    if let Some(p) = stat.planner.as_mut() {
        p.config.policy = easerve_sched::planner::PlannerPolicy::Static;
    }
    // the replayed service times: the run the gated twin leaves as it is
    let sim = simulate(&stat, None);
    let (mut ctrl, mut pool, mut fakes, mut exec) = planned_exec(&sc, &sim);
    let mut plan = exec.relay.plan.take().expect("a planner");
    let (tx, rx) = std::sync::mpsc::channel();
    plan.set_twin(Box::new(GatedTwin {
        gate: rx,
        seed: None,
    }));
    exec.relay.plan = Some(plan);
    run_gated(
        &mut exec,
        &mut ctrl,
        &mut pool,
        &mut fakes,
        &sc,
        Some((&tx, 20.0)),
    );
    assert!(ctrl.is_finished(), "requests left");
    let done = ctrl.records().iter().filter(|r| r.finish.is_some()).count();
    assert_eq!(done, ctrl.records().len(), "a request did not finish");
    let plan = exec.relay.plan.take().expect("the planner");
    let log = plan.book.planner.log();
    let taken: Vec<_> = log.iter().filter(|r| r.applied_at.is_some()).collect();
    assert!(!taken.is_empty(), "no twin decision: {log:?}");
    let mut out_while_busy = 0;
    for r in &taken {
        let (at, applied) = (r.at, r.applied_at.unwrap_or(r.at));
        assert!((applied - (at + 20.0)).abs() < 1e-9, "{at} → {applied}");
        assert_eq!(r.candidates.first().map(|c| c.0), Some([2, 1, 2]));
        // served while the decision was out: where requests were in the
        // system then, first tokens or completions in between
        let within = |t: Option<f64>| t.is_some_and(|t| t > at && t < applied);
        let records = ctrl.records();
        let busy = records
            .iter()
            .any(|q| q.arrival < applied && q.finish.get().is_none_or(|f| f > at));
        let served = records
            .iter()
            .filter(|q| within(q.first_token.get()) || within(q.finish.get()))
            .count();
        assert!(
            served > 0 || !busy,
            "nothing served between {at} s and {applied} s"
        );
        out_while_busy += usize::from(busy);
        let held = log.iter().filter(|h| h.at > at && h.at < applied).all(|h| {
            h.held
                .as_deref()
                .is_some_and(|m| m.contains("still being simulated"))
        });
        assert!(held, "{log:?}");
    }
    assert!(
        out_while_busy > 0,
        "no decision was out while requests were served"
    );
}

/// A planner's load whose process dies while it loads its model
/// ([`planned_scenario`]'s first change, `D1 → P1`, with `P1`'s new
/// process gone half-way through its load): the controller records a
/// failed planned load (`LoadFailed`, no restart asked for), the ledger's
/// change says when and why it failed (and no `ready_at`), the fault is
/// reported as well, and the planner counts the slot free again.
pub fn a_planned_load_that_dies_loading_is_a_failed_change() {
    let sc = planned_scenario();
    let sim = simulate(&sc, None);
    let (mut ctrl, mut pool, mut fakes, mut exec) = planned_exec(&sc, &sim);
    fakes.failing_loads = 1;
    // the service times replayed are the simulator's, where the load did
    // not fail: only what the failure changes is checked
    run_virtual(&mut exec, &mut ctrl, &mut pool, &mut fakes, &sc);
    let p1 = WorkerRef::Prefill(1);
    let failed: Vec<f64> = ctrl
        .decisions()
        .iter()
        .filter_map(|d| match d {
            Decision::LoadFailed { at, worker, .. } if *worker == p1 => Some(*at),
            _ => None,
        })
        .collect();
    assert_eq!(failed.len(), 1, "{:?}", changes(ctrl.decisions()));
    let restarts = ctrl
        .decisions()
        .iter()
        .filter(|d| matches!(d, Decision::Restart { .. }))
        .count();
    assert_eq!(restarts, 0, "a failed planned load is not restarted");
    assert!(exec.relay.faults.iter().any(|f| f.worker == "P1"));
    let plan = exec.relay.plan.take().expect("the planner");
    let mut report = sim.report.clone();
    crate::plan::account(Some(plan), &ctrl, &mut report);
    let ours = report.planner.expect("an account");
    let first = &ours.changes[0];
    assert_eq!(
        (first.from.as_deref(), first.to.as_deref()),
        (Some("D1"), Some("P1"))
    );
    assert_eq!(first.failed_at, Some(failed[0]));
    assert_eq!(first.ready_at, None);
    assert!(first
        .failure
        .as_deref()
        .is_some_and(|f| f.contains("exit status: 1")));
}
