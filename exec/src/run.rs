//! `easerve exec`: one real run of a scenario. The controller (this process,
//! a single-threaded tokio runtime) starts one OS process per worker
//! (`easerve worker …`), offers the scenario's workload open-loop at its
//! arrival times, carries out the [`Controller`]'s commands over the
//! workers' sockets and hands what comes back to it as [`Event`]s: the
//! second driver of the one controller (the simulator is the first).
//!
//! Data path: encode workers return embeddings to the controller, which
//! forwards them to the chosen prefill worker as one envelope per destination
//! per micro-batch (in flight until that worker acknowledges it, which counts
//! against the encode worker's in-flight cap); prefill workers return each
//! request's first token and KV cache, which the controller forwards to the
//! chosen decode worker as one message per request. Every transfer therefore
//! takes two loopback hops through the controller.
//!
//! Faults: a worker whose socket closes or whose process exits is failed at
//! once ([`Event::WorkerFailed`]): its requests end as failed with
//! the reason, and the run goes on. Ctrl-C (or the time limit) interrupts the
//! run: what has not finished fails with the reason, and the report is
//! written from what was measured.

use crate::device::{cpu_cores, CoreSide, DeviceKind};
use crate::wire::{
    encode_frame, read_frame_async, write_bytes_async, EncodeRequest, FromWorker, KvData, Matrix,
    PrefillRequest, PromptPart, Role, ToWorker, WireMedia,
};
use easerve_calib::StageCost;
use easerve_sched::cpu::CpuSlot;
use easerve_sched::driver::{self, Driver, Liveness};
use easerve_sched::{
    Command, Controller, Decision, DecodeRunProgress, EnvelopeId, Event, RequestId, RequestRecord,
    SmPolicy, WorkerRef,
};
use easerve_workload::generate::generate_with_tokens;
use easerve_workload::report::{EncodeSummary, GpuReport, RunMeta};
use easerve_workload::{Report, Scenario};
use std::collections::HashMap;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::process::Child;
use tokio::sync::mpsc;

/// How to run.
#[derive(Clone, Debug)]
pub struct ExecOptions {
    /// Device of every worker.
    pub device: DeviceKind,
    /// The `easerve` binary (its hidden `worker` subcommand runs a worker).
    pub exe: PathBuf,
    /// CPU threads of every worker. Default: encode workers and their
    /// co-located prefill workers get all the host's cores (a CPU "device" as
    /// `easerve profile` measures it: SM level 1.0 = every core, and a pass at
    /// share `f` runs on `round(f × cores)` threads); remote prefill and
    /// decode workers share the cores among them, at least 1 thread each.
    pub threads: Option<usize>,
    /// Seconds to wait for every worker to connect and load its model.
    pub startup_timeout_s: f64,
    /// Interrupt the run after this many seconds (a partial report).
    pub time_limit_s: Option<f64>,
    /// Fault injection: kill this worker's process (SIGKILL) this many
    /// seconds into the run.
    pub kill: Option<(WorkerRef, f64)>,
    /// Supervision: a dead worker is restarted with this backoff and rejoins
    /// once its model is loaded ([`easerve_sched::Backoff`]); `None`: a dead
    /// worker stays dead.
    pub restart: Option<easerve_sched::Backoff>,
    /// CUDA under MPS: the SM share of each encode worker that has a
    /// co-located prefill worker (that worker gets the rest), set through
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` when the processes start; `None`
    /// leaves the GPU's sharing to the driver. With local prefill in the
    /// deployment, a share replaces the scenario's SM policy with
    /// `static:share`; without it, the share applies to no worker.
    pub mps_encode_share: Option<f64>,
}

/// A worker that died during the run.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Fault {
    /// Worker label (`E0`, `P0`, `L0`, `D0`).
    pub worker: String,
    /// Why (exit status, socket error, missed heartbeats, or the worker's own
    /// error message, with its last lines of stderr).
    pub reason: String,
    /// When the controller noticed, seconds since the run started.
    pub detected_at: f64,
    /// For an injected kill: seconds from the kill to its detection.
    pub detection_delay_s: Option<f64>,
    /// Its last lines of stderr (at most 20), oldest first.
    pub stderr: Vec<String>,
    /// A restart that died before it was ready (not a new outage).
    pub restart_failed: bool,
    /// When it rejoined, seconds since the run started, and the seconds its
    /// restart took (process start to `Ready`, the model load included).
    pub back: Option<(f64, f64)>,
}

/// What a run hands back.
#[derive(Clone, Debug)]
pub struct ExecOutput {
    /// The report, in the simulator's format (`measured = true`).
    pub report: Report,
    /// Per-request lifecycle records.
    pub records: Vec<RequestRecord>,
    /// Every scheduling decision, in order.
    pub decisions: Vec<Decision>,
    /// Workers that died.
    pub faults: Vec<Fault>,
    /// Whether the run was cut short (Ctrl-C or the time limit).
    pub interrupted: Option<String>,
}

/// Why a run could not start or went wrong outside any one request.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// Workers could not be started or did not become ready.
    #[error("workers did not start: {0}")]
    Startup(String),
    /// Local I/O of the controller failed.
    #[error("controller I/O failed: {0}")]
    Io(#[from] std::io::Error),
}

/// One worker process as the controller sees it.
pub(crate) struct WorkerProcess {
    pub(crate) wref: WorkerRef,
    label: String,
    role: Role,
    index: usize,
    /// Its device (a role change moves a new worker onto the device of the
    /// one stopped for it).
    pub(crate) gpu: usize,
    /// A local prefill worker, sharing an encode worker's device.
    local: bool,
    /// A spare slot a planner may start: no process until then.
    standby: bool,
    /// Told to stop by the controller (a planner's drain), if it was.
    pub(crate) stop: Option<crate::plan::Stop>,
    /// Its process is starting for a planner ([`Command::LoadWorker`]):
    /// its `Ready` goes to the planner's account, not to a fault's.
    pub(crate) planned: bool,
    /// Whether a planner started it (a spare slot's process ran).
    pub(crate) started: bool,
    /// Tensor-parallel degree: rank processes (one per device or core).
    tp: usize,
    pub(crate) tx: Option<mpsc::UnboundedSender<Vec<u8>>>,
    child: Option<Child>,
    pub(crate) pid: Option<u32>,
    /// Seconds of compute the worker reported, and SM-share-weighted seconds.
    busy_s: f64,
    sm_s: f64,
    /// Share of the pass or batch in flight.
    share: f64,
    /// The decode run in flight ([`Command::DecodeRun`]), iteration by
    /// iteration, and the ids of its batch.
    pub(crate) decode_run: Option<(DecodeRunProgress, Vec<RequestId>)>,
}

impl WorkerProcess {
    /// What the CPU thread rule needs of it ([`easerve_sched::cpu`]).
    fn cpu_slot(&self) -> CpuSlot {
        CpuSlot::new(self.wref, self.local, self.tp, self.standby)
    }
}

pub(crate) enum Incoming {
    Msg(usize, FromWorker),
    /// Incarnation `.1` of worker `.0` ended: its socket closed or its
    /// process exited (`.2` says which).
    Down(usize, u32, String),
    Stderr(usize, String),
    /// A restarted worker (incarnation `.1`) connected: its writer.
    Joined(usize, u32, mpsc::UnboundedSender<Vec<u8>>),
    /// The planner's `twin` simulations, run off the loop, are done
    /// ([`crate::plan`]).
    Planned(Box<crate::plan::TwinDone>),
}

pub(crate) fn role_ref(role: Role, index: usize) -> WorkerRef {
    match role {
        Role::Encode => WorkerRef::Encode(index),
        Role::Prefill => WorkerRef::Prefill(index),
        Role::Decode => WorkerRef::Decode(index),
        Role::Replica => WorkerRef::Replica(index),
    }
}

/// Run `sc` for real with policy costs (batcher `W(k)`, SM table) from `cost`.
pub fn execute(
    sc: &Scenario,
    cost: &dyn StageCost,
    opts: &ExecOptions,
) -> Result<ExecOutput, ExecError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(sc, cost, opts))
}

/// `sc` as the controller must see it under `opts`: with
/// `--mps-encode-share S` on CUDA, MPS fixes each encode worker's and its
/// local prefill worker's share when they start, so the controller's split is
/// `static:S` (a dynamic split's shares would be recorded but never applied).
pub(crate) fn as_applied<'a>(
    sc: &'a Scenario,
    opts: &ExecOptions,
) -> std::borrow::Cow<'a, Scenario> {
    match (opts.device, opts.mps_encode_share) {
        (DeviceKind::Cuda, Some(share)) if sc.deployment.has_local_prefill() => {
            let mut fixed = sc.clone();
            fixed.deployment.sm_policy = SmPolicy::Static(share);
            std::borrow::Cow::Owned(fixed)
        }
        _ => std::borrow::Cow::Borrowed(sc),
    }
}

async fn run(
    sc: &Scenario,
    cost: &dyn StageCost,
    opts: &ExecOptions,
) -> Result<ExecOutput, ExecError> {
    let sc = &*as_applied(sc, opts);
    let (requests, tokens) = generate_with_tokens(sc);
    let mut ctrl = sc.controller(requests, &tokens, cost, true);
    if let Some(b) = opts.restart {
        ctrl.supervise(b);
    }
    let mut pool = start_workers(sc, ctrl.topology(), opts).await?;
    let plan = crate::plan::ExecPlan::of(sc, ctrl.topology(), std::sync::Arc::from(sc.cost()));
    let Outcome {
        faults,
        interrupted,
        run_s,
        plan,
        nics,
    } = drive(&mut ctrl, &mut pool, opts, (plan, Nics::of(sc, &tokens))).await;
    shut_down(&mut pool).await;
    let mut report = build_report(
        sc,
        &ctrl,
        &pool,
        run_s,
        &faults,
        &interrupted,
        opts,
        "measured by easerve exec",
        sc.workload.rate,
    );
    crate::plan::account(plan, &ctrl, &mut report);
    if let Some(n) = nics {
        report.links = n.report(report.duration_s);
    }
    let decisions = ctrl.decisions().to_vec();
    Ok(ExecOutput {
        report,
        records: ctrl.into_records(),
        decisions,
        faults,
        interrupted,
    })
}

/// The worker processes of a run, connected and ready.
pub(crate) struct Pool {
    pub(crate) workers: Vec<WorkerProcess>,
    pub(crate) by_ref: HashMap<WorkerRef, usize>,
    pub(crate) rx: mpsc::UnboundedReceiver<Incoming>,
    /// The loop's inbox, for the tasks of restarted workers (and it keeps
    /// the channel open while every worker is gone).
    pub(crate) tx: mpsc::UnboundedSender<Incoming>,
    /// CPU threads of each worker.
    pub(crate) threads: Vec<usize>,
    /// Which workers died (their process exited or their socket closed) and
    /// are not back.
    pub(crate) live: Liveness,
    /// Restarts, heartbeats and stderr tails ([`crate::supervise`]).
    pub(crate) sup: crate::supervise::Supervisor,
}

#[cfg(feature = "agreement")]
impl Pool {
    /// The workers of `topology` with no processes behind them (for the
    /// tests' fake workers): the frames sent to worker `k` come out of the
    /// `k`-th receiver handed back, as the worker's writer task would take
    /// them, and nothing arrives on `rx` (the tests hand their messages to
    /// the loop themselves).
    pub(crate) fn detached(
        topology: &easerve_sched::Topology,
    ) -> (Pool, Vec<mpsc::UnboundedReceiver<Vec<u8>>>) {
        let mut workers = new_workers(topology);
        let mut frames = Vec::new();
        for w in &mut workers {
            let (tx, rx) = mpsc::unbounded_channel();
            w.tx = (!w.standby).then_some(tx);
            frames.push(rx);
        }
        let by_ref = workers
            .iter()
            .enumerate()
            .map(|(k, w)| (w.wref, k))
            .collect();
        let (tx, rx) = mpsc::unbounded_channel();
        let pool = Pool {
            threads: vec![1; workers.len()],
            sup: crate::supervise::Supervisor::new(workers.len(), None),
            workers,
            by_ref,
            rx,
            tx,
            live: Liveness::new(),
        };
        (pool, frames)
    }

    /// The worker of pool index `k`.
    pub(crate) fn worker_ref(&self, k: usize) -> WorkerRef {
        self.workers[k].wref
    }
}

/// How the run loop ended.
struct Outcome {
    faults: Vec<Fault>,
    /// The planner, if one ran, with its account.
    plan: Option<crate::plan::ExecPlan>,
    /// The NICs of a cluster of node groups, with their account.
    nics: Option<Nics>,
    interrupted: Option<String>,
    run_s: f64,
}

/// Start one process per worker of `topology`, and wait until every one has
/// connected, said hello and loaded its model.
pub(crate) async fn start_workers(
    sc: &Scenario,
    topology: &easerve_sched::Topology,
    opts: &ExecOptions,
) -> Result<Pool, ExecError> {
    // workers and their first device, in the simulator's GPU order
    let mut workers = new_workers(topology);
    let by_ref: HashMap<WorkerRef, usize> = workers
        .iter()
        .enumerate()
        .map(|(k, w)| (w.wref, k))
        .collect();
    // per worker (the topology's order): an encode worker with a local
    // prefill worker on its GPU
    let local_peer: Vec<bool> = topology
        .workers()
        .map(|t| t.local_prefill.is_some())
        .collect();
    let threads = worker_threads(&workers, opts);

    // start the processes
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (tx, mut rx) = mpsc::unbounded_channel::<Incoming>();
    for (k, w) in workers.iter_mut().enumerate().filter(|(_, w)| !w.standby) {
        let mut cmd = worker_command(sc, opts, w, threads[k], local_peer[k], addr);
        let mut child = cmd
            .spawn()
            .map_err(|e| ExecError::Startup(format!("cannot start {}: {e}", opts.exe.display())))?;
        w.pid = child.id();
        crate::supervise::watch_child(k, 0, &mut child, &tx);
        w.child = Some(child);
    }

    // accept and hear every worker's hello and ready
    let startup = Duration::from_secs_f64(opts.startup_timeout_s.max(1.0));
    let deadline = tokio::time::Instant::now() + startup;
    let mut waiting = Waiting {
        startup,
        deadline,
        ready: 0,
        early: Vec::new(),
        last_err: HashMap::new(),
    };
    waiting
        .accept(&listener, &mut workers, &by_ref, &mut rx, &tx)
        .await?;
    waiting.ready(&workers, &mut rx).await?;
    // child exits are watched from here on (a killed worker also closes its socket)
    for (k, w) in workers.iter_mut().enumerate() {
        if let Some(mut child) = w.child.take() {
            let tx = tx.clone();
            tokio::spawn(async move {
                let why = match child.wait().await {
                    Ok(status) => format!("process exited ({status})"),
                    Err(e) => format!("process lost: {e}"),
                };
                let _ = tx.send(Incoming::Down(k, 0, why));
            });
        }
    }
    let spec = crate::supervise::SpawnSpec {
        sc: sc.clone(),
        opts: opts.clone(),
        addr,
        local_peer,
    };
    let mut sup = crate::supervise::Supervisor::new(workers.len(), Some(spec));
    for (k, l) in waiting.last_err {
        sup.stderr_line(k, l);
    }
    crate::supervise::accept_restarts(listener, &workers, sup.gens.clone(), tx.clone());
    Ok(Pool {
        workers,
        by_ref,
        rx,
        tx,
        threads,
        live: Liveness::new(),
        sup,
    })
}

/// One [`WorkerProcess`] per worker of `topology`, not yet started.
fn new_workers(topology: &easerve_sched::Topology) -> Vec<WorkerProcess> {
    topology
        .workers()
        .map(|t| {
            let (role, index) = match t.wref {
                WorkerRef::Encode(i) => (Role::Encode, i),
                WorkerRef::Prefill(p) => (Role::Prefill, p),
                WorkerRef::Decode(d) => (Role::Decode, d),
                WorkerRef::Replica(r) => (Role::Replica, r),
            };
            WorkerProcess {
                wref: t.wref,
                label: t.label.clone(),
                role,
                index,
                gpu: t.gpu() as usize,
                local: t.local,
                standby: t.standby,
                stop: None,
                planned: false,
                started: false,
                tp: t.tp.max(1) as usize,
                tx: None,
                child: None,
                pid: None,
                busy_s: 0.0,
                sm_s: 0.0,
                share: 1.0,
                decode_run: None,
            }
        })
        .collect()
}

/// CPU threads of each worker's every rank: `opts.threads`, or the rule of
/// [`easerve_sched::cpu`] on this host's cores (all of them for an encode
/// or local prefill worker, split evenly among an encode worker's TP ranks;
/// an even share for the ranks of the others).
fn worker_threads(workers: &[WorkerProcess], opts: &ExecOptions) -> Vec<usize> {
    let slots: Vec<CpuSlot> = workers.iter().map(WorkerProcess::cpu_slot).collect();
    easerve_sched::cpu::worker_threads(&slots, cpu_cores(), opts.threads)
}

impl Pool {
    /// CPU threads of each rank of spare slot `k`, started now by a planner
    /// (not on a stopped worker's device, whose threads it takes over):
    /// `--threads` when given; all the cores for an encode worker, as the
    /// deployment's encode workers have them (a CPU "device" at SM level
    /// 1.0); else [`easerve_sched::cpu::start_threads`] over the remote
    /// prefill, decode and replica processes running now.
    pub(crate) fn spare_threads(&self, k: usize) -> usize {
        if let Some(t) = self.sup.fixed_threads() {
            return t;
        }
        let running = self.workers.iter().enumerate().filter(|(j, o)| {
            *j != k
                && o.pid.is_some()
                && !o.stop.is_some_and(|s| s.exited)
                && self.live.is_alive(o.wref)
        });
        let running = running.map(|(j, o)| (o.cpu_slot(), self.threads[j]));
        easerve_sched::cpu::start_threads(self.workers[k].cpu_slot(), running, cpu_cores())
    }
}

/// The command that starts worker `w` (with `threads` CPU threads; `peer`: an
/// encode worker with a local prefill worker on its GPU) connecting to `addr`.
pub(crate) fn worker_command(
    sc: &Scenario,
    opts: &ExecOptions,
    w: &WorkerProcess,
    threads: usize,
    peer: bool,
    addr: std::net::SocketAddr,
) -> tokio::process::Command {
    // an encode worker and its local prefill worker split the host's cores
    // at their SM shares, from opposite ends (CPU only; a GPU splits SMs)
    let core_side = match (opts.device, w.role) {
        (DeviceKind::Cpu, Role::Encode) if peer => CoreSide::Low,
        (DeviceKind::Cpu, Role::Prefill) if w.local => CoreSide::High,
        _ => CoreSide::Any,
    };
    // an encode worker's preprocessing threads when preprocessing is
    // pipelined (the controller then sends `Preprocess` frames); 0: each pass
    // preprocesses its own micro-batch
    let preprocess_threads: u32 = match (w.role, sc.knobs.preprocess_threads) {
        (Role::Encode, Some(n)) => n,
        _ => 0,
    };
    let mut cmd = tokio::process::Command::new(&opts.exe);
    cmd.arg("worker")
        .args(["--role", w.role.as_str()])
        .args(["--index", &w.index.to_string()])
        .args(["--connect", &addr.to_string()])
        .args(["--model", &sc.model.name])
        .args(["--threads", &threads.to_string()])
        .args(["--seed", &sc.seed.to_string()])
        .args(["--device", opts.device.as_str()])
        .args(["--gpu", &w.gpu.to_string()])
        .args(["--cores", core_side.as_str()])
        .args(["--preprocess-threads", &preprocess_threads.to_string()])
        .args(["--tp", &w.tp.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let (DeviceKind::Cuda, Some(share)) = (opts.device, opts.mps_encode_share) {
        let side = if w.role == Role::Encode && peer {
            Some(share)
        } else if w.role == Role::Prefill && w.local {
            Some(1.0 - share)
        } else {
            None
        };
        if let Some(s) = side {
            cmd.env(
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                crate::green::mps_thread_percentage(s).to_string(),
            );
        }
    }
    // its own process group: a terminal's Ctrl-C reaches the controller
    // only, which then shuts the workers down in order
    #[cfg(unix)]
    cmd.process_group(0);
    cmd
}

/// The startup of [`start_workers`] while it waits for the workers: its
/// timeout and deadline, the `Ready`s heard so far, the events heard before
/// every worker connected, and each worker's last stderr line.
struct Waiting {
    startup: Duration,
    deadline: tokio::time::Instant,
    ready: usize,
    early: Vec<Incoming>,
    last_err: HashMap<usize, String>,
}

impl Waiting {
    /// Accept every worker's connection and hello, giving each its writer
    /// task and reader; fails when a worker exits first or the deadline passes.
    async fn accept(
        &mut self,
        listener: &TcpListener,
        workers: &mut [WorkerProcess],
        by_ref: &HashMap<WorkerRef, usize>,
        rx: &mut mpsc::UnboundedReceiver<Incoming>,
        tx: &mpsc::UnboundedSender<Incoming>,
    ) -> Result<(), ExecError> {
        let (startup, deadline) = (self.startup, self.deadline);
        let mut connected = 0;
        let starting = workers.iter().filter(|w| !w.standby).count();
        while connected < starting {
            let accepted = tokio::select! {
                a = listener.accept() => a?,
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(ExecError::Startup(format!(
                        "{connected} of {starting} workers connected within {:.0} s",
                        startup.as_secs_f64()
                    )));
                }
                Some(ev) = rx.recv() => {
                    match ev {
                        Incoming::Stderr(k, l) => {
                            self.last_err.insert(k, l);
                        }
                        Incoming::Msg(_, FromWorker::Ready { .. }) => self.ready += 1,
                        other => self.early.push(other),
                    }
                    for w in workers.iter_mut() {
                        if let Some(Ok(Some(status))) = w.child.as_mut().map(|c| c.try_wait()) {
                            let k = by_ref[&w.wref];
                            return Err(ExecError::Startup(format!(
                                "worker {} exited ({status}) before connecting{}",
                                w.label,
                                self.last_err.get(&k).map_or(String::new(), |l| format!(": {l}"))
                            )));
                        }
                    }
                    continue;
                }
            };
            let (stream, _) = accepted;
            stream.set_nodelay(true)?;
            let (mut rd, mut wr) = stream.into_split();
            let hello =
                tokio::time::timeout_at(deadline, read_frame_async::<_, FromWorker>(&mut rd))
                    .await
                    .map_err(|_| {
                        ExecError::Startup("a worker connected but said nothing".into())
                    })??;
            let Some(FromWorker::Hello { role, index, .. }) = hello else {
                return Err(ExecError::Startup(
                    "a worker connected without saying hello".into(),
                ));
            };
            let Some(&k) = by_ref.get(&role_ref(role, index)) else {
                return Err(ExecError::Startup(format!(
                    "unexpected worker {} {index}",
                    role.as_str()
                )));
            };
            let (wtx, mut wrx) = mpsc::unbounded_channel::<Vec<u8>>();
            tokio::spawn(async move {
                while let Some(frame) = wrx.recv().await {
                    if write_bytes_async(&mut wr, &frame).await.is_err() {
                        break;
                    }
                }
            });
            workers[k].tx = Some(wtx);
            let tx = tx.clone();
            tokio::spawn(reader(k, 0, rd, tx));
            connected += 1;
        }
        Ok(())
    }

    /// Wait until every worker has loaded its model (said `Ready`), first
    /// replaying the events heard while accepting; fails on a worker's error
    /// or exit, or when the deadline passes.
    async fn ready(
        &mut self,
        workers: &[WorkerProcess],
        rx: &mut mpsc::UnboundedReceiver<Incoming>,
    ) -> Result<(), ExecError> {
        let (startup, deadline) = (self.startup, self.deadline);
        let mut ready = self.ready;
        let last_err = &mut self.last_err;
        let mut early = std::mem::take(&mut self.early).into_iter();
        let starting = workers.iter().filter(|w| !w.standby).count();
        while ready < starting {
            let ev = tokio::select! {
                ev = async { match early.next() { Some(e) => Some(e), None => rx.recv().await } } => ev,
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(ExecError::Startup(format!(
                        "{ready} of {starting} workers loaded their model within {:.0} s",
                        startup.as_secs_f64()
                    )));
                }
            };
            match ev {
                Some(Incoming::Msg(_, FromWorker::Ready { .. })) => ready += 1,
                Some(Incoming::Msg(k, FromWorker::Error { message })) => {
                    return Err(ExecError::Startup(format!(
                        "worker {}: {message}",
                        workers[k].label
                    )))
                }
                Some(Incoming::Down(k, _, why)) => {
                    return Err(ExecError::Startup(format!(
                        "worker {} went away while loading: {why}{}",
                        workers[k].label,
                        last_err
                            .get(&k)
                            .map_or(String::new(), |l| format!(" ({l})"))
                    )))
                }
                Some(Incoming::Stderr(k, l)) => {
                    last_err.insert(k, l);
                }
                Some(_) => {}
                None => return Err(ExecError::Startup("event channel closed".into())),
            }
        }
        self.ready = ready;
        Ok(())
    }
}

/// Offer the workload open-loop and carry out the controller's commands until
/// every request reached an end, the run is interrupted, or its time is up.
/// The wall clock and the waiting are here; what a wake-up means is
/// [`ExecLoop`]'s.
async fn drive(
    ctrl: &mut Controller,
    pool: &mut Pool,
    opts: &ExecOptions,
    (plan, nics): (Option<crate::plan::ExecPlan>, Option<Nics>),
) -> Outcome {
    let t0 = Instant::now();
    let now = || t0.elapsed().as_secs_f64();
    // the encode workers hold the embeddings the encoder cache keeps, the
    // prefill workers the KV caches the prefix cache keeps
    ctrl.keep_encoder_ops();
    ctrl.keep_prefix_ops();
    let mut run = ExecLoop::new(ctrl);
    run.relay.plan = plan;
    run.relay.links.nics = nics;
    let mut kill = KillPlan::new(opts.kill);
    let mut interrupted: Option<String> = None;
    let mut ctrl_c = Box::pin(tokio::signal::ctrl_c());
    let mut run_s = 0.0;

    while !ctrl.is_finished() {
        // the earliest timed thing: an arrival, a batcher timer, the kill, the limit
        let wake = [run.wake_at(ctrl), kill.due(), opts.time_limit_s]
            .into_iter()
            .flatten()
            .fold(pool.sup.wake_at(), f64::min);
        let sleep_for = (wake - now()).clamp(0.0, 3600.0);
        let mut heard = None;
        tokio::select! {
            ev = pool.rx.recv() => match ev {
                Some(ev) => heard = Some(ev),
                None => break,
            },
            _ = tokio::time::sleep(Duration::from_secs_f64(sleep_for)) => {}
            _ = &mut ctrl_c => {
                interrupted = Some("interrupted by Ctrl-C".into());
            }
        }
        if let Some(ev) = heard {
            let at = DetectAt {
                now: now(),
                killed_at: kill.killed_at,
            };
            run.hear(pool, ev, at, ctrl);
        }
        let t = now();
        if interrupted.is_none() && opts.time_limit_s.is_some_and(|lim| t >= lim) {
            interrupted = Some(format!(
                "run stopped at its time limit of {:.0} s",
                opts.time_limit_s.unwrap_or(0.0)
            ));
        }
        if let Some(why) = &interrupted {
            ctrl.handle(
                t,
                Event::Interrupt {
                    reason: why.clone(),
                },
            );
            run_s = t;
            break;
        }
        kill.inject(pool, t);
        for ev in pool.supervise(t) {
            let at = DetectAt {
                now: t,
                killed_at: kill.killed_at,
            };
            run.hear(pool, ev, at, ctrl);
        }
        run.wake(ctrl, pool, t);
        run_s = t;
    }

    Outcome {
        nics: run.relay.links.nics.take(),
        plan: run.relay.plan.take(),
        faults: run.relay.faults,
        interrupted,
        run_s,
    }
}

/// What `easerve exec`'s loop does when it wakes: the workload's requests
/// arrive at their times, and the controller hears them after what the
/// workers said ([`Relay`]). No clock: `now` (seconds since the run started)
/// comes from the caller, the wall clock in [`drive`] and a virtual one in
/// the tests, which run this against fake workers.
pub(crate) struct ExecLoop {
    pub(crate) relay: Relay,
    /// Arrival times of the requests, by id (ascending).
    arrivals: Vec<f64>,
    /// The next request to arrive.
    next_arrival: usize,
}

impl ExecLoop {
    /// The loop for `ctrl`'s requests, none arrived yet.
    pub(crate) fn new(ctrl: &Controller) -> ExecLoop {
        ExecLoop {
            relay: Relay::new(Links::default()),
            arrivals: ctrl.requests().iter().map(|r| r.arrival).collect(),
            next_arrival: 0,
        }
    }

    /// When the loop must wake next though no worker speaks (seconds): the
    /// next arrival or the controller's timer, whichever is first.
    pub(crate) fn wake_at(&self, ctrl: &Controller) -> Option<f64> {
        let arrival = self.arrivals.get(self.next_arrival).copied();
        [arrival, ctrl.poll_timeout(), self.relay.plan_wake()]
            .into_iter()
            .flatten()
            .reduce(f64::min)
    }

    /// A message from the workers, noticed at `at.now` (`ctrl`: the
    /// controller, for the planner's account).
    pub(crate) fn hear(&mut self, pool: &mut Pool, ev: Incoming, at: DetectAt, ctrl: &Controller) {
        self.relay.hear(pool, ev, at, None, ctrl);
    }

    /// Wake up at `now`: the requests whose time has come arrive after what
    /// was heard, and the controller hears it all ([`Relay::wake`]).
    pub(crate) fn wake(&mut self, ctrl: &mut Controller, pool: &mut Pool, now: f64) {
        while let Some(&a) = self.arrivals.get(self.next_arrival) {
            if a > now {
                break;
            }
            self.relay.arrive(self.next_arrival as RequestId);
            self.next_arrival += 1;
        }
        if let Some(p) = self.relay.plan.as_mut() {
            // windows end while requests are still to arrive
            p.open = self.next_arrival < self.arrivals.len();
        }
        self.relay.wake(ctrl, pool, now);
    }
}

/// The executor's side of the controller contract, for `easerve exec` and
/// `easerve serve` alike: what the workers said since the last wake-up, as
/// events, and the transfers relayed between them. At a wake-up
/// ([`Relay::wake`]) the controller hears those events in order, then its
/// timer ([`driver::instant`]); each command is carried out over the workers'
/// sockets ([`carry_out`]). No clock: `now` comes from the caller.
pub(crate) struct Relay {
    /// Embeddings and KV caches in flight through the controller.
    pub(crate) links: Links,
    /// Workers that died.
    pub(crate) faults: Vec<Fault>,
    /// Events due at the next wake-up, in order: those heard, then the
    /// landings a command makes due at once (a transfer to a dead worker).
    due: VecDeque<Event>,
    /// The planner, when the scenario has one ([`crate::plan`]).
    pub(crate) plan: Option<crate::plan::ExecPlan>,
}

impl Relay {
    /// A relay with `links`, nothing heard yet.
    pub(crate) fn new(links: Links) -> Relay {
        Relay {
            links,
            faults: Vec::new(),
            due: VecDeque::new(),
            plan: None,
        }
    }

    /// A message from the workers ([`on_incoming`]); tokens the workers
    /// emitted go to `tokens` when the driver streams them. Returns whether
    /// it was a worker's end.
    pub(crate) fn hear(
        &mut self,
        pool: &mut Pool,
        ev: Incoming,
        at: DetectAt,
        tokens: Option<&mut Vec<(RequestId, u32)>>,
        ctrl: &Controller,
    ) -> bool {
        let ev = match (ev, self.plan.as_mut()) {
            (Incoming::Planned(done), Some(plan)) => {
                // the twin decision takes effect now, after what was heard
                self.due.extend(plan.conclude(*done, ctrl, at.now));
                return false;
            }
            (Incoming::Planned(_), None) => return false,
            (ev, _) => ev,
        };
        if let (Incoming::Down(k, gen, _), Some(plan)) = (&ev, self.plan.as_mut()) {
            // a worker the planner stopped exits: no death
            if plan.exited(pool, *k, *gen, at.now) {
                return false;
            }
        }
        let planned =
            matches!(ev, Incoming::Msg(k, FromWorker::Ready { .. }) if pool.workers[k].planned);
        // a planner's load whose process ends before it is ready
        let loading = match ev {
            Incoming::Down(k, gen, _) if pool.workers[k].planned && pool.sup.current(k, gen) => {
                Some(k)
            }
            _ => None,
        };
        let event = on_incoming(ev, pool, &mut self.links, &mut self.faults, at, tokens);
        let failed = matches!(event, Some(Event::WorkerFailed { .. }));
        if let (Some(k), Some(Event::WorkerFailed { worker, reason }), Some(plan)) =
            (loading, &event, self.plan.as_mut())
        {
            // the change failed: the ledger says so, and the slot is free
            // (no restart: the controller stands it by again)
            pool.workers[k].planned = false;
            pool.sup.restart_failed(k);
            plan.load_failed(*worker, reason, at.now, ctrl);
        }
        let event = match (event, self.links.nics.as_mut()) {
            (Some(ev), Some(n)) => n.hold(ev, at.now),
            (ev, _) => ev,
        };
        if let (true, Some(Event::WorkerLoaded { worker }), Some(plan)) =
            (planned, &event, self.plan.as_mut())
        {
            plan.ready(*worker, at.now, ctrl);
        }
        self.due.extend(event);
        failed
    }

    /// Request `id` arrives at the next wake-up, after what was heard before.
    pub(crate) fn arrive(&mut self, id: RequestId) {
        self.due.push_back(Event::Arrival { id });
        if let Some(p) = self.plan.as_mut() {
            p.arrived();
        }
    }

    /// When the planner's window ends next, if a planner runs, or a
    /// cross-node landing held for its NIC time ([`Nics`]) is due, whichever
    /// is first.
    pub(crate) fn plan_wake(&self) -> Option<f64> {
        let nic = self.links.nics.as_ref().and_then(Nics::wake_at);
        [self.plan.as_ref().and_then(|p| p.wake_at()), nic]
            .into_iter()
            .flatten()
            .reduce(f64::min)
    }

    /// Request `id`'s client left: the controller hears it at the next
    /// wake-up, after what was heard before.
    pub(crate) fn abort(&mut self, id: RequestId) {
        self.due.push_back(Event::Abort {
            id,
            reason: easerve_sched::Abort::Disconnected,
        });
    }

    /// Wake up at `now` (seconds since the run started): the controller
    /// hears every event due, then its timer, and each command is carried
    /// out at once. Returns the controller's next timer.
    pub(crate) fn wake(&mut self, ctrl: &mut Controller, pool: &mut Pool, now: f64) -> Option<f64> {
        if let Some(n) = self.links.nics.as_mut() {
            // cross-node landings whose NIC time is over
            self.due.extend(n.due(now));
        }
        if let Some(plan) = self.plan.as_mut() {
            // a window ended: the planner's changes, after what was heard
            self.due.extend(plan.tick(ctrl, &pool.tx, now));
        }
        let timer = driver::instant(
            &mut Wake {
                ctrl,
                pool,
                relay: self,
            },
            now,
        );
        if ctrl.counters().aborted > 0 {
            self.links.forget_aborted(ctrl.records());
        }
        timer
    }
}

/// One wake-up of the executor, as a [`Driver`]: the events are those the
/// [`Relay`] holds; a command goes out over the workers' sockets.
struct Wake<'a> {
    ctrl: &'a mut Controller,
    pool: &'a mut Pool,
    relay: &'a mut Relay,
}

impl Driver for Wake<'_> {
    fn controller(&mut self) -> &mut Controller {
        self.ctrl
    }

    fn next_due(&mut self, _now: f64) -> Option<Event> {
        self.relay.due.pop_front()
    }

    fn carry_out(&mut self, now: f64, cmd: Command) {
        let pool = &mut *self.pool;
        match (cmd, self.relay.plan.as_mut()) {
            (Command::Restart { worker, delay_s }, _) => {
                // the process starts when the backoff is over ([`Pool::supervise`])
                pool.sup.restart_at(pool.by_ref[&worker], now + delay_s);
                return;
            }
            (Command::StopWorker { worker }, Some(plan)) => {
                plan.stop(pool, self.ctrl, worker, now);
                return;
            }
            (Command::LoadWorker { worker, on }, Some(plan)) => {
                plan.load(pool, worker, on, now);
                return;
            }
            _ => {}
        }
        let links = &mut self.relay.links;
        // the store copies a pass's outputs before its embeddings leave
        links.store.sync(self.ctrl, &links.embeddings);
        send_prefix_ops(self.ctrl, &mut pool.workers, &pool.by_ref);
        match &cmd {
            Command::Preprocess { id, .. } => links.pull_ops(self.ctrl, &[*id]),
            Command::Encode { worker, .. } => {
                let ids = self.ctrl.encode_batch(*worker).to_vec();
                links.pull_ops(self.ctrl, &ids);
            }
            _ => {}
        }
        // a transfer to a worker that is gone lands at once, so the
        // controller fails its requests and frees the sender's slot
        if let Some(ev) = carry_out(cmd, self.ctrl, &mut pool.workers, &pool.by_ref, links, now) {
            self.relay.due.push_back(ev);
        }
    }
}

/// When a worker's end is noticed, and the injected kill (worker, time) if
/// any, for the fault's detection delay.
#[derive(Clone, Copy)]
pub(crate) struct DetectAt {
    /// Seconds since the run started.
    pub(crate) now: f64,
    /// (worker index in the pool, seconds since the start) of an injected kill.
    pub(crate) killed_at: Option<(usize, f64)>,
}

/// What one message from the workers means to the controller: at most one
/// event. A worker's end becomes a [`Fault`] and [`Event::WorkerFailed`].
/// Tokens the workers emitted (a prefill's first token, each decode
/// iteration's) go to `tokens` when the driver streams them.
fn on_incoming(
    ev: Incoming,
    pool: &mut Pool,
    links: &mut Links,
    faults: &mut Vec<Fault>,
    at: DetectAt,
    tokens: Option<&mut Vec<(RequestId, u32)>>,
) -> Option<Event> {
    match ev {
        Incoming::Msg(k, msg) => {
            pool.sup.heard(k, at.now);
            let w = &mut pool.workers[k];
            match msg {
                FromWorker::EncodeDone {
                    embeddings: e,
                    compute_s,
                    item_rows,
                    ..
                } => {
                    w.busy_s += compute_s;
                    w.sm_s += compute_s * w.share;
                    if !item_rows.is_empty() {
                        links.store.ended(e.iter().map(|x| x.0).zip(item_rows));
                    }
                    links.embeddings.extend(e);
                    Some(Event::EncodeDone { worker: w.index })
                }
                FromWorker::EncodeGpuStarted => Some(Event::EncodeGpuStarted { worker: w.index }),
                FromWorker::EmbeddingsLanded { envelope } => links
                    .envelopes
                    .remove(&envelope)
                    .map(|sent_at| Event::EmbeddingsLanded { envelope, sent_at }),
                FromWorker::PrefillDone { outputs, compute_s } => {
                    w.busy_s += compute_s;
                    w.sm_s += compute_s * w.share;
                    if let Some(t) = tokens {
                        t.extend(outputs.iter().map(|(id, tok, _)| (*id, *tok)));
                    }
                    for (id, tok, cache) in outputs {
                        links.embeddings.remove(&id);
                        links.kv.insert(id, (tok, cache));
                    }
                    Some(Event::PrefillDone { worker: w.index })
                }
                FromWorker::KvLanded { id } => {
                    let sent_at = links.kv_sent.remove(&id).unwrap_or(at.now);
                    Some(Event::KvLanded { id, sent_at })
                }
                FromWorker::DecodeDone {
                    compute_s,
                    tokens: emitted,
                } => {
                    w.busy_s += compute_s;
                    w.sm_s += compute_s;
                    if let Some(t) = tokens {
                        t.extend(emitted);
                    }
                    next_decode_step(w).map(|steps| Event::DecodeRunDone {
                        worker: w.index,
                        steps,
                    })
                }
                FromWorker::ReplicaStepDone {
                    tokens: emitted,
                    encode_s,
                    compute_s,
                } => {
                    w.busy_s += compute_s;
                    w.sm_s += compute_s;
                    if let Some(t) = tokens {
                        t.extend(emitted);
                    }
                    Some(Event::ReplicaStepDone {
                        replica: w.index,
                        prefill_start: at.now - (compute_s - encode_s).max(0.0),
                    })
                }
                FromWorker::Error { message } => {
                    pool.sup.stderr_line(k, message);
                    None
                }
                FromWorker::Ready { .. } => rejoined(pool, k, faults, at.now),
                FromWorker::Hello { .. } | FromWorker::Pong => None,
            }
        }
        Incoming::Down(k, gen, why) => worker_down(pool, k, gen, why, faults, at),
        Incoming::Stderr(k, l) => {
            pool.sup.stderr_line(k, l);
            None
        }
        Incoming::Joined(k, gen, tx) => {
            if pool.sup.current(k, gen) {
                pool.sup.joined(k, tx);
            }
            None
        }
        // taken by [`Relay::hear`] first
        Incoming::Planned(_) => None,
    }
}

/// Incarnation `gen` of worker `k` ended, noticed at `at`: a live worker's
/// death ([`Fault`], [`Event::WorkerFailed`], its reason with its last lines
/// of stderr), a restart that died before it was ready (the event again, for
/// the controller's backoff), or nothing (a second report of one end, or an
/// earlier incarnation's).
fn worker_down(
    pool: &mut Pool,
    k: usize,
    gen: u32,
    why: String,
    faults: &mut Vec<Fault>,
    at: DetectAt,
) -> Option<Event> {
    if !pool.sup.current(k, gen) {
        return None;
    }
    let w = &mut pool.workers[k];
    let restart_failed = if pool.live.kill(w.wref) {
        false
    } else if pool.sup.restart_failed(k) {
        true
    } else {
        return None;
    };
    w.tx = None;
    w.decode_run = None;
    let stderr = pool.sup.tail(k);
    let reason = match stderr.len() {
        0 => why,
        n => format!(
            "{why}; its last {n} lines of stderr: {}",
            stderr.join(" | ")
        ),
    };
    faults.push(Fault {
        worker: w.label.clone(),
        reason: reason.clone(),
        detected_at: at.now,
        detection_delay_s: at
            .killed_at
            .filter(|(kk, _)| *kk == k)
            .map(|(_, t)| at.now - t),
        stderr,
        restart_failed,
        back: None,
    });
    // the controller fails what it holds and re-places the rest, frees the
    // in-flight slots of envelopes sent to it, and asks for a restart
    Some(Event::WorkerFailed {
        worker: w.wref,
        reason,
    })
}

/// Worker `k` said `Ready` at `now`: a restart's process has loaded its
/// model, so its connection goes live and it rejoins
/// ([`Event::WorkerLoaded`]).
fn rejoined(pool: &mut Pool, k: usize, faults: &mut [Fault], now: f64) -> Option<Event> {
    let (tx, took) = pool.sup.ready(k, now)?;
    let w = &mut pool.workers[k];
    w.tx = Some(tx);
    w.share = 1.0;
    pool.live.revive(w.wref);
    if std::mem::take(&mut w.planned) {
        // a planner's load ([`Command::LoadWorker`]): no fault to close
        w.stop = None;
        return Some(Event::WorkerLoaded { worker: w.wref });
    }
    if let Some(f) = faults
        .iter_mut()
        .rev()
        .find(|f| f.worker == w.label && !f.restart_failed)
    {
        f.back = Some((now, took));
    }
    Some(Event::WorkerLoaded { worker: w.wref })
}

/// Fault injection (`--kill-worker`): which worker dies when, and when the
/// kill was sent (for the fault's detection delay).
pub(crate) struct KillPlan {
    plan: Option<(WorkerRef, f64)>,
    /// (worker index in the pool, seconds since the start) of the kill sent.
    pub(crate) killed_at: Option<(usize, f64)>,
}

impl KillPlan {
    pub(crate) fn new(plan: Option<(WorkerRef, f64)>) -> KillPlan {
        KillPlan {
            plan,
            killed_at: None,
        }
    }

    /// When the kill is due, seconds since the start, if it is still to come.
    pub(crate) fn due(&self) -> Option<f64> {
        self.plan.map(|(_, t)| t)
    }

    /// Kill the worker if its time `t` has come.
    pub(crate) fn inject(&mut self, pool: &Pool, t: f64) {
        let Some((wref, at)) = self.plan.filter(|(_, at)| t >= *at) else {
            return;
        };
        self.plan = None;
        if let Some(&k) = pool.by_ref.get(&wref) {
            if let Some(pid) = pool.workers[k].pid {
                sigkill(pid);
                self.killed_at = Some((k, at.max(t)));
            }
        }
    }
}

/// Kill our own worker process `pid` (SIGKILL).
pub(crate) fn sigkill(pid: u32) {
    // SAFETY: plain kill(2) of a child's pid.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
}

/// Shut the workers down: a shutdown frame, then a kill after 3 s.
pub(crate) async fn shut_down(pool: &mut Pool) {
    for w in &mut pool.workers {
        if let Some(tx) = w.tx.take() {
            if let Ok(f) = encode_frame(&ToWorker::Shutdown) {
                let _ = tx.send(f);
            }
        }
    }
    // restarts still loading go at once
    for (k, w) in pool.workers.iter().enumerate() {
        if pool.sup.restart_failed(k) {
            if let Some(pid) = w.pid {
                sigkill(pid);
            }
        }
    }
    let stop_deadline =
        tokio::time::Instant::now() + Duration::from_secs_f64(crate::plan::STOP_GRACE_S);
    let live = &mut pool.live;
    // spare slots never started and stopped workers have no process
    let has_process = |w: &WorkerProcess| w.pid.is_some() && !w.stop.is_some_and(|s| s.exited);
    let mut alive: usize = pool
        .workers
        .iter()
        .filter(|w| live.is_alive(w.wref) && has_process(w))
        .count();
    while alive > 0 {
        tokio::select! {
            ev = pool.rx.recv() => match ev {
                Some(Incoming::Down(k, _, _))
                    if has_process(&pool.workers[k]) && live.kill(pool.workers[k].wref) =>
                {
                    alive -= 1;
                }
                Some(_) => {}
                None => break,
            },
            _ = tokio::time::sleep_until(stop_deadline) => {
                for w in pool.workers.iter().filter(|w| live.is_alive(w.wref) && has_process(w)) {
                    if let Some(pid) = w.pid {
                        sigkill(pid);
                    }
                }
                break;
            }
        }
    }
}

/// Read frames from worker `k` until its socket closes.
pub(crate) async fn reader(
    k: usize,
    gen: u32,
    mut rd: tokio::net::tcp::OwnedReadHalf,
    tx: mpsc::UnboundedSender<Incoming>,
) {
    loop {
        match read_frame_async::<_, FromWorker>(&mut rd).await {
            Ok(Some(m)) => {
                if tx.send(Incoming::Msg(k, m)).is_err() {
                    return;
                }
            }
            Ok(None) => {
                // a process that died closes its socket first: give its exit
                // status (the better reason) a moment to be reported first
                tokio::time::sleep(Duration::from_millis(50)).await;
                let _ = tx.send(Incoming::Down(k, gen, "connection closed".into()));
                return;
            }
            Err(e) => {
                let _ = tx.send(Incoming::Down(k, gen, format!("connection failed: {e}")));
                return;
            }
        }
    }
}

/// What moves between workers through the controller: embeddings and KV
/// caches held until their destination is chosen, and when each transfer left.
#[derive(Default)]
pub(crate) struct Links {
    /// Embeddings by request, from its encode pass until its prefill is
    /// done (a prefill worker's death re-runs the prefill from them).
    pub(crate) embeddings: HashMap<RequestId, Matrix>,
    kv: HashMap<RequestId, (u32, KvData)>,
    /// Envelopes in flight and when they left.
    envelopes: HashMap<EnvelopeId, f64>,
    /// KV caches in flight and when they left.
    kv_sent: HashMap<RequestId, f64>,
    /// Requests' own media until their encode pass goes out (`easerve serve`).
    pub(crate) media: HashMap<RequestId, Vec<WireMedia>>,
    /// Media sent ahead to an encode worker for preprocessing, kept until
    /// the request's pass goes out: if that worker dies, the request is
    /// placed again and its media go to the new one.
    ahead: HashMap<RequestId, Vec<WireMedia>>,
    /// Encode passes sent, as (requests, SM share), when the driver wants
    /// them (`easerve serve`'s metrics); `None` keeps nothing.
    pub(crate) passes: Option<Vec<(usize, f64)>>,
    /// Each placed request's encoder-cache operations
    /// ([`Controller::take_encoder_ops`]) until its pass goes out.
    ops: HashMap<RequestId, Vec<easerve_sched::ItemOp>>,
    /// The shared encoder-output store's embeddings (with it on).
    pub(crate) store: crate::store::SharedStore,
    /// The NICs of a cluster of node groups; `None` without groups.
    pub(crate) nics: Option<Nics>,
}

/// Cross-node transfers on a cluster of node groups: every worker runs on
/// this host (a node group is a label), so a transfer between workers the
/// placement put on different nodes goes over loopback, and the controller
/// hears it landed the modelled NIC time later (queueing on the shared
/// ports included): `end − now` of [`easerve_workload::fabric::Fabric::send`],
/// the simulator's figure for the same transfer.
pub(crate) struct Nics {
    fabric: easerve_workload::fabric::Fabric,
    /// Each request's items' tokens (an envelope's bytes).
    tokens: easerve_workload::generate::ItemTokenTable,
    /// The scenario's model: the tokens of a request known only when it
    /// comes (`easerve serve`, [`Nics::add_request`]).
    model: easerve_model::ModelArch,
    /// Bytes per embedding token and per KV token of the scenario's model.
    bytes_per_token: (f64, f64),
    /// Modelled NIC seconds of each cross-node envelope and KV cache in flight.
    envelopes: HashMap<EnvelopeId, f64>,
    kv: HashMap<RequestId, f64>,
    /// Landings heard from the workers, held until their NIC time is over:
    /// (due, event), in the order heard.
    held: Vec<(f64, Event)>,
}

impl Nics {
    /// The NICs of `sc`'s node groups, idle; `None` without groups.
    pub(crate) fn of(
        sc: &Scenario,
        tokens: &easerve_workload::generate::ItemTokenTable,
    ) -> Option<Nics> {
        let c = sc.cluster.as_ref()?;
        Some(Nics {
            fabric: easerve_workload::fabric::Fabric::new(c),
            tokens: tokens.clone(),
            model: sc.model.clone(),
            bytes_per_token: (
                sc.model.embedding_bytes_per_token(),
                sc.model.kv_bytes_per_token(),
            ),
            envelopes: HashMap::new(),
            kv: HashMap::new(),
            held: Vec::new(),
        })
    }

    /// A request came that was not known ahead (`easerve serve`): its
    /// items, decoded, give its envelope's bytes. Requests must come in id
    /// order ([`Controller::add_request`]'s), one call each.
    pub(crate) fn add_request(&mut self, items: &[easerve_sched::MmItem]) {
        let tokens: Vec<_> = items
            .iter()
            .map(|item| {
                // the request's own token count was taken from the same
                // items when it was decoded, so this does not fail
                easerve_workload::generate::item_tokens(&self.model, item).unwrap_or_default()
            })
            .collect();
        self.tokens.push(&tokens);
    }

    /// The NIC ports' account over a run of `duration_s` seconds.
    pub(crate) fn report(&self, duration_s: f64) -> Vec<easerve_workload::report::LinkReport> {
        self.fabric.report(duration_s)
    }

    /// Modelled seconds of a transfer of `bytes` from `a` to `b` asked for
    /// at `now`; `None` within a node.
    fn delay(
        &mut self,
        ctrl: &Controller,
        (a, b): (WorkerRef, WorkerRef),
        bytes: f64,
        now: f64,
    ) -> Option<f64> {
        let t = ctrl.topology();
        let (from, to) = (t.worker(a).place, t.worker(b).place);
        self.fabric
            .send(now, from, to, bytes)
            .map(|(_, end)| end - now)
    }

    /// Envelope `envelope` from encode worker `from` to prefill worker `to`
    /// left at `now`.
    fn envelope_sent(
        &mut self,
        ctrl: &Controller,
        (envelope, from, to): (EnvelopeId, usize, usize),
        now: f64,
    ) {
        let bytes = easerve_workload::fabric::envelope_bytes(
            ctrl,
            &self.tokens,
            envelope,
            self.bytes_per_token.0,
        );
        let path = (WorkerRef::Encode(from), WorkerRef::Prefill(to));
        if let Some(d) = self.delay(ctrl, path, bytes, now) {
            self.envelopes.insert(envelope, d);
        }
    }

    /// Request `id`'s KV cache from prefill worker `from` to decode worker
    /// `to` left at `now`.
    fn kv_sent(&mut self, ctrl: &Controller, (id, from, to): (RequestId, usize, usize), now: f64) {
        let bytes = easerve_workload::fabric::kv_bytes(ctrl, id, self.bytes_per_token.1);
        let path = (WorkerRef::Prefill(from), WorkerRef::Decode(to));
        if let Some(d) = self.delay(ctrl, path, bytes, now) {
            self.kv.insert(id, d);
        }
    }

    /// `ev`, heard at `now`: held until its NIC time is over when it is the
    /// landing of a cross-node transfer (returned `None`), else returned.
    fn hold(&mut self, ev: Event, now: f64) -> Option<Event> {
        let d = match &ev {
            Event::EmbeddingsLanded { envelope, .. } => self.envelopes.remove(envelope),
            Event::KvLanded { id, .. } => self.kv.remove(id),
            _ => None,
        };
        match d {
            Some(d) => {
                self.held.push((now + d, ev));
                None
            }
            None => Some(ev),
        }
    }

    /// When the next held landing is due.
    fn wake_at(&self) -> Option<f64> {
        self.held.iter().map(|h| h.0).reduce(f64::min)
    }

    /// The held landings due by `now`, earliest first (in the order heard
    /// at a tie).
    fn due(&mut self, now: f64) -> Vec<Event> {
        let mut due: Vec<(f64, Event)> = Vec::new();
        let mut k = 0;
        while k < self.held.len() {
            if self.held[k].0 <= now {
                due.push(self.held.remove(k));
            } else {
                k += 1;
            }
        }
        due.sort_by(|a, b| a.0.total_cmp(&b.0));
        due.into_iter().map(|h| h.1).collect()
    }
}

impl Links {
    /// Drop what the driver holds for aborted requests: embeddings of a pass
    /// and KV caches of a prefill batch that ran on for them, and their media.
    fn forget_aborted(&mut self, records: &[easerve_sched::RequestRecord]) {
        let wanted = |id: &RequestId| records[*id as usize].aborted.is_none();
        self.embeddings.retain(|id, _| wanted(id));
        self.kv.retain(|id, _| wanted(id));
        self.media.retain(|id, _| wanted(id));
        self.ops.retain(|id, _| wanted(id));
        self.store.forget(wanted);
    }

    /// Take the encoder-cache operations the controller decided for `ids`
    /// since they were last taken (a request placed again replaces those of
    /// its earlier placement).
    fn pull_ops(&mut self, ctrl: &mut Controller, ids: &[RequestId]) {
        self.store.sync(ctrl, &self.embeddings);
        for &id in ids {
            let ops = ctrl.take_encoder_ops(id);
            if !ops.is_empty() {
                self.store.fetch(id, &ops);
                self.ops.insert(id, ops);
            }
        }
        self.store.release(ctrl);
    }
}

/// Decode worker `w` finished an iteration of its run: the run ends (the
/// iterations it ran are returned) when it has run them all or was told to
/// yield; otherwise the next iteration goes out over the same batch. A worker
/// that can no longer be sent to keeps its run open: the end of its
/// connection fails it ([`Event::WorkerFailed`]).
fn next_decode_step(w: &mut WorkerProcess) -> Option<u64> {
    let (run, ids) = w.decode_run.as_mut()?;
    let Some(steps) = run.iteration_done() else {
        let frame = encode_frame(&ToWorker::DecodeStep { ids: ids.clone() });
        if let (Some(tx), Ok(frame)) = (&w.tx, frame) {
            let _ = tx.send(frame);
        }
        return None;
    };
    w.decode_run = None;
    Some(steps)
}

/// Carry out one command over the workers' sockets at `now`; an event comes
/// back when the command lands at once (a local envelope, or a transfer to a
/// worker that is gone).
fn carry_out(
    cmd: Command,
    ctrl: &Controller,
    workers: &mut [WorkerProcess],
    by_ref: &HashMap<WorkerRef, usize>,
    links: &mut Links,
    now: f64,
) -> Option<Event> {
    let send = |workers: &mut [WorkerProcess], wref: WorkerRef, msg: &ToWorker| {
        send_to(workers, by_ref, wref, msg)
    };
    match cmd {
        // the request and its media go to the worker now; its pass's
        // `Encode` names it again with no media, and the worker takes the
        // items it prepared
        Command::Preprocess { worker, id } => {
            let requests = vec![encode_request(ctrl, links, id, true)];
            if !requests[0].media.is_empty() {
                links.ahead.insert(id, requests[0].media.clone());
            }
            send(
                workers,
                WorkerRef::Encode(worker),
                &ToWorker::Preprocess { requests },
            );
        }
        Command::Encode { worker, sm_share } => {
            let requests = ctrl
                .encode_batch(worker)
                .iter()
                .map(|&id| {
                    // media sent ahead are with the worker already
                    links.ahead.remove(&id);
                    encode_request(ctrl, links, id, false)
                })
                .collect();
            workers[by_ref[&WorkerRef::Encode(worker)]].share = sm_share;
            if let Some(p) = links.passes.as_mut() {
                p.push((ctrl.encode_batch(worker).len(), sm_share));
            }
            send(
                workers,
                WorkerRef::Encode(worker),
                &ToWorker::Encode { requests, sm_share },
            );
        }
        Command::Embeddings {
            envelope, from, to, ..
        } => {
            let landed = send_embeddings(ctrl, workers, by_ref, links, (envelope, to), now);
            if let (None, Some(n)) = (&landed, links.nics.as_mut()) {
                n.envelope_sent(ctrl, (envelope, from, to), now);
            }
            return landed;
        }
        Command::Prefill { worker, sm_share } => {
            let requests = ctrl
                .prefill_batch(worker)
                .iter()
                .map(|it| prefill_request(ctrl, it.id))
                .collect();
            workers[by_ref[&WorkerRef::Prefill(worker)]].share = sm_share;
            send(
                workers,
                WorkerRef::Prefill(worker),
                &ToWorker::Prefill { requests, sm_share },
            );
        }
        // a worker's thread pool is sized per batch: the next batch carries
        // the new share
        Command::PrefillShare { .. } => {}
        Command::Kv { from, to, id } => {
            let sent = links.kv.remove(&id).is_some_and(|(last_token, cache)| {
                send(
                    workers,
                    WorkerRef::Decode(to),
                    &ToWorker::Kv {
                        id,
                        last_token,
                        kv: cache,
                    },
                )
            });
            if !sent {
                return Some(Event::KvLanded { id, sent_at: now });
            }
            links.kv_sent.insert(id, now);
            if let Some(n) = links.nics.as_mut() {
                n.kv_sent(ctrl, (id, from, to), now);
            }
        }
        Command::DecodeRun {
            worker,
            batch,
            context,
            steps,
        } => {
            let ids: Vec<RequestId> = ctrl.decode_batch(worker).collect();
            send(
                workers,
                WorkerRef::Decode(worker),
                &ToWorker::DecodeStep { ids: ids.clone() },
            );
            workers[by_ref[&WorkerRef::Decode(worker)]].decode_run =
                Some((DecodeRunProgress::new(batch, context, steps), ids));
        }
        Command::DecodeYield { worker } => {
            if let Some(run) = workers[by_ref[&WorkerRef::Decode(worker)]]
                .decode_run
                .as_mut()
            {
                run.0.yield_now();
            }
        }
        Command::Release { worker, id } => {
            send(
                workers,
                WorkerRef::Decode(worker),
                &ToWorker::Release { ids: vec![id] },
            );
        }
        Command::Discard { worker, id } => {
            send(workers, worker, &ToWorker::Release { ids: vec![id] });
        }
        // a replica preprocesses its requests' items inside its iteration
        // (its `encode_s` counts it): the front end hands them on at once
        Command::FrontEndPreprocess { id } => return Some(Event::Preprocessed { id }),
        Command::ReplicaStep { replica, .. } => {
            let step = replica_step(ctrl, links, replica);
            send(workers, WorkerRef::Replica(replica), &step);
        }
        // the executor runs no planner (a scenario whose planner moves
        // workers is refused before the run): no change reaches its
        // controller, which asks for no load or stop without one
        Command::LoadWorker { .. } | Command::StopWorker { .. } => {}
        // the driver's loop takes it ([`Wake`])
        Command::Restart { .. } => {}
    }
    None
}

/// Send each prefill worker the prefix-cache operations the controller
/// decided since the last call, before any later command reaches it, so it
/// keeps what the directory holds when a later prefill reuses it.
fn send_prefix_ops(
    ctrl: &mut Controller,
    workers: &mut [WorkerProcess],
    by_ref: &HashMap<WorkerRef, usize>,
) {
    if ctrl.prefix_block_size().is_none() {
        return;
    }
    for p in 0..ctrl.topology().prefill().len() {
        let ops = ctrl.take_prefix_ops(p);
        if !ops.is_empty() {
            send_to(
                workers,
                by_ref,
                WorkerRef::Prefill(p),
                &ToWorker::PrefixOps { ops },
            );
        }
    }
}

/// Request `id` as its prefill worker takes it: its prompt (its content's
/// pieces in order when it has content, else its text tokens after its
/// embeddings) and, with the prefix cache on, its cached head and the chain
/// link it is kept under.
fn prefill_request(ctrl: &Controller, id: RequestId) -> PrefillRequest {
    let req = &ctrl.requests()[id as usize];
    let keep = ctrl.prefix_block_size().is_some();
    let (cached, links) = ctrl.prefix_hit(id);
    let cached_key = match (links, &req.content) {
        (1.., Some(c)) => c.keys().get(links - 1).map_or(0, |k| k.key),
        _ => 0,
    };
    PrefillRequest {
        cached: cached as u32,
        cached_key,
        keep,
        ..whole_prefill(id, req)
    }
}

/// Request `id` (`req`) prefilled whole, nothing cached or kept; its prompt
/// its content's pieces in order, or (without content) its items and text
/// of its own.
fn whole_prefill(id: RequestId, req: &easerve_sched::Request) -> PrefillRequest {
    let prompt = req.content.as_ref().map_or_else(Vec::new, PromptPart::of);
    PrefillRequest {
        id,
        prompt_tokens: req.prompt_tokens,
        prompt,
        cached: 0,
        cached_key: 0,
        keep: false,
    }
}

/// Send `msg` to worker `wref` (`by_ref` maps it to its process); false
/// when its process is gone or the message cannot be framed.
fn send_to(
    workers: &mut [WorkerProcess],
    by_ref: &HashMap<WorkerRef, usize>,
    wref: WorkerRef,
    msg: &ToWorker,
) -> bool {
    let w = &mut workers[by_ref[&wref]];
    match (&w.tx, encode_frame(msg)) {
        (Some(tx), Ok(frame)) => tx.send(frame).is_ok(),
        _ => false,
    }
}

/// Send envelope `envelope`'s embeddings to prefill worker `to`; when it
/// cannot take them (its process is gone) they land at once, as the
/// simulator's transfer to a dead worker does.
fn send_embeddings(
    ctrl: &Controller,
    workers: &mut [WorkerProcess],
    by_ref: &HashMap<WorkerRef, usize>,
    links: &mut Links,
    (envelope, to): (EnvelopeId, usize),
    now: f64,
) -> Option<Event> {
    let e: Vec<(RequestId, Matrix)> = ctrl
        .envelope(envelope)
        .iter()
        // kept until the request's prefill is done: a prefill worker
        // that dies re-runs it elsewhere from them
        .filter_map(|id| links.embeddings.get(id).map(|m| (*id, m.clone())))
        .collect();
    let msg = ToWorker::Embeddings {
        envelope,
        embeddings: e,
    };
    if !send_to(workers, by_ref, WorkerRef::Prefill(to), &msg) {
        return Some(Event::EmbeddingsLanded {
            envelope,
            sent_at: now,
        });
    }
    links.envelopes.insert(envelope, now);
    None
}

/// Request `id` as an encode worker or a replica takes it: its items and its
/// own media (`easerve serve`; none for the synthetic workload), which leave
/// the links with it; a request placed again after its worker died takes the
/// media it had sent ahead there.
///
/// Its encoder-cache operations go with it: kept for its pass when it goes
/// ahead (`ahead`), else taken.
fn encode_request(
    ctrl: &Controller,
    links: &mut Links,
    id: RequestId,
    ahead: bool,
) -> EncodeRequest {
    let media = match links.media.remove(&id) {
        Some(m) => m,
        None => links.ahead.remove(&id).unwrap_or_default(),
    };
    let cache = match ahead {
        true => links.ops.get(&id).cloned(),
        false => links.ops.remove(&id),
    };
    // the store's copies go with the pass, not ahead
    let fetched = match ahead {
        true => Vec::new(),
        false => links.store.take_fetched(id),
    };
    let req = &ctrl.requests()[id as usize];
    EncodeRequest {
        id,
        items: req.items.to_vec(),
        media,
        keys: req
            .content
            .as_ref()
            .map_or_else(Vec::new, |c| c.items().map(|t| t.id).collect()),
        cache: cache.unwrap_or_default(),
        // without raw-byte keys (or with the store alone) a hit is prepared
        prepare_hits: ctrl.caches().encoder.is_none_or(|e| !e.hash_raw_bytes),
        fetched,
    }
}

/// The iteration [`Command::ReplicaStep`] starts on replica `r`: encode the
/// admitted requests that have items, prefill every admitted request, and
/// one decode step over the sequences that were running before it (the
/// replica frees every other sequence's cache: those have finished).
fn replica_step(ctrl: &Controller, links: &mut Links, r: usize) -> ToWorker {
    let admitted = ctrl.replica_admitted(r);
    let requests = ctrl.requests();
    let encode = admitted
        .iter()
        .filter(|&&id| requests[id as usize].needs_encode())
        .map(|&id| encode_request(ctrl, links, id, false))
        .collect();
    let prefill = admitted
        .iter()
        .map(|&id| whole_prefill(id, &requests[id as usize]))
        .collect();
    let decode = ctrl
        .replica_batch(r)
        .filter(|id| !admitted.contains(id))
        .collect();
    ToWorker::ReplicaStep {
        encode,
        prefill,
        decode,
    }
}

/// The supervision section of a run `ctrl` drove for `run_s` seconds, with
/// each death's stderr and its restart's measured time (process start to
/// `Ready`) from `faults`; `None` when no worker died.
fn supervision_of(
    ctrl: &Controller,
    faults: &[Fault],
    run_s: f64,
) -> Option<easerve_workload::report::SupervisionReport> {
    let mut sup = easerve_workload::report::SupervisionReport::of(ctrl, run_s)?;
    // the controller's outages are the faults that were not failed restarts,
    // in the same order
    let deaths = faults.iter().filter(|f| !f.restart_failed);
    for (o, f) in sup.outages.iter_mut().zip(deaths) {
        o.stderr.clone_from(&f.stderr);
        o.load_s = f.back.map(|b| b.1);
    }
    Some(sup)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn build_report(
    sc: &Scenario,
    ctrl: &Controller,
    pool: &Pool,
    run_s: f64,
    faults: &[Fault],
    interrupted: &Option<String>,
    opts: &ExecOptions,
    how: &str,
    offered_rate: f64,
) -> Report {
    let (workers, threads) = (&pool.workers, &pool.threads);
    let records = ctrl.records();
    let duration = records
        .iter()
        .filter_map(|r| r.finish.get())
        .fold(0.0, f64::max)
        .max(run_s.min(1e9))
        .max(1e-12);
    // one row per device of the allocation, as the simulator lays them out,
    // then one per device of each spare slot a planner started (numbered
    // after the allocation's, `Topology::with_spares`)
    let topology = ctrl.topology();
    let last = topology
        .workers()
        .flat_map(|w| w.gpus.iter().copied())
        .max();
    let gpus: Vec<GpuReport> = (0..last.map_or(0, |g| g + 1))
        .filter_map(|g| {
            let (stage, label) = topology.gpu_owner(g)?;
            let on: Vec<&WorkerProcess> = topology
                .on_gpu(g)
                .iter()
                .filter_map(|r| workers.iter().find(|w| w.wref == *r))
                .collect();
            if g >= topology.gpus() && !on.iter().any(|w| w.started) {
                return None;
            }
            let busy: f64 = on.iter().map(|w| w.busy_s).sum();
            let sm: f64 = on.iter().map(|w| w.sm_s).sum();
            Some(GpuReport {
                gpu: g,
                stage: stage.into(),
                worker: label,
                busy_fraction: (busy / duration).min(1.0),
                sm_utilization: (sm / duration).min(1.0),
            })
        })
        .collect();
    let encode = EncodeSummary::of(ctrl);
    let mut notes = vec![format!(
        "{how}: {} worker processes on {} (CPU threads {}{}), transfers relayed by the controller over loopback TCP",
        workers.len(),
        opts.device.as_str(),
        workers
            .iter()
            .zip(threads)
            .map(|(w, t)| format!("{} {t}", w.label))
            .collect::<Vec<_>>()
            .join(", "),
        if opts.device == DeviceKind::Cpu {
            ", sharing the host's cores"
        } else {
            ""
        }
    )];
    if let Some(c) = &sc.cluster {
        notes.push(groups_note(c, topology, workers));
    }
    if let Some(why) = interrupted {
        notes.push(format!("partial run: {why} after {run_s:.1} s"));
    }
    for f in faults {
        notes.push(format!(
            "worker {} failed at {:.2} s: {}{}",
            f.worker,
            f.detected_at,
            f.reason,
            f.detection_delay_s.map_or(String::new(), |d| format!(
                " (detected {:.0} ms after the kill)",
                d * 1e3
            ))
        ));
    }
    let meta = RunMeta {
        scenario: sc.name.clone(),
        deployment: sc.deployment.to_string(),
        model: sc.model.name.clone(),
        cluster: sc.cluster_label(),
        seed: sc.seed,
        offered_rate,
        requests: records.len(),
    };
    let mut report = Report::build(meta, records, &sc.slo, gpus, encode, notes);
    if let Some(w) = sc.workload.window_s {
        report.windows =
            easerve_workload::windows::windows(records, &sc.slo, w, sc.workload.schedule.as_ref());
    }
    report.measured = true;
    report.reuse = easerve_sim::reuse_report(sc, ctrl);
    report.supervision = supervision_of(ctrl, faults, run_s);
    // the simulator's rule (the cost model's load ratios at the rate offered
    // and the run's typical request), with the measured queueing
    let typical = easerve_sim::typical_of(sc, ctrl.requests());
    easerve_sim::name_bottleneck(sc, &*sc.cost(), Some(&typical), offered_rate, &mut report);
    report
}

/// Where each worker of a cluster of node groups runs: its group and node,
/// labels on this host, and how transfers between nodes are timed.
fn groups_note(
    c: &easerve_workload::scenario::Cluster,
    topology: &easerve_sched::Topology,
    workers: &[WorkerProcess],
) -> String {
    let placed: Vec<String> = workers
        .iter()
        .map(|w| {
            let p = topology.worker(w.wref).place;
            let group = &c.groups[usize::from(p.group)].node.name;
            format!("{} on {group}/node{}", w.label, p.node)
        })
        .collect();
    format!(
        "node groups (labels on this host): {}; a transfer between nodes goes over loopback and lands the modelled NIC time later (workload/src/fabric.rs, as the simulator prices it)",
        placed.join(", ")
    )
}
