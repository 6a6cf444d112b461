//! The planner in `easerve exec` and `easerve serve`: what the controller's
//! reconfiguration commands mean for worker processes. At the end of each
//! window the planner (`easerve_sched::planner`) decides from the
//! controller's stage loads, as in the simulator, and its changes reach the
//! controller as [`Event::Reconfigure`]. The controller drains a worker (the
//! requests it holds or has coming finish there: nothing is re-queued or
//! lost) and, once it holds none, says [`Command::StopWorker`]: the worker
//! gets a shutdown frame, and is killed if it has not exited within
//! [`STOP_GRACE_S`]. [`Command::LoadWorker`] starts a process with the new
//! role and model through the supervision spawn path (`supervise.rs`); for a
//! role change (`on`: the worker stopped before it), on the stopped worker's
//! device, once that worker's process has exited (its device memory is
//! free). When the new process says `Ready` (its model loaded) the
//! controller hears [`Event::WorkerLoaded`] at that measured time, and the
//! report's `planner` section ([`PlanLedger`]) carries each change with when
//! the controller got it, when the drained worker was stopped (its drain
//! over) and when the new one was ready (its process started after the old
//! one exited, and loaded). No clock: `now` (seconds since the run started) comes from the
//! driver loop.
//!
//! The `twin` policy's simulations do not hold the loop: at a window's end
//! the planner hands back a snapshot of its candidates ([`TwinJob`]), which
//! a thread of its own runs in the twin while the loop keeps serving; the
//! thread posts the results to the loop's inbox ([`Incoming::Planned`]),
//! and the planner concludes when the loop hears them, its changes reaching
//! the controller then (the decision log has the window it was taken for,
//! `at`, and when it took effect, `applied_at`). Windows that end
//! meanwhile are observed and hold.

use crate::run::{Incoming, Pool};
use crate::wire::{encode_frame, ToWorker};
use easerve_calib::StageCost;
use easerve_sched::planner::{PlannerPolicy, Twin, TwinJob};
use easerve_sched::{Controller, Event, WorkerRef};
use easerve_sim::SimTwin;
use easerve_workload::plan::PlanLedger;
use easerve_workload::{Report, Scenario};
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;

/// Seconds a stopped worker has to exit after its shutdown frame before it
/// is killed: as long as the end of a run gives every worker (`shut_down`
/// in `run.rs`). A worker exits at once on the frame unless it hangs.
pub const STOP_GRACE_S: f64 = 3.0;

/// A worker told to stop ([`ExecPlan::stop`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stop {
    /// Its incarnation told to stop.
    pub(crate) gen: u32,
    /// When, seconds.
    pub(crate) at: f64,
    /// Whether its process has exited.
    pub(crate) exited: bool,
    /// Whether it was killed for overstaying [`STOP_GRACE_S`].
    pub(crate) killed: bool,
}

/// A twin the executor's planner can send to a thread of its own.
pub(crate) type SendTwin = Box<dyn Twin + Send>;

/// A `twin` decision's simulations, done off the loop ([`ExecPlan::tick`]):
/// the twin back, the job and the good requests of each candidate.
pub(crate) struct TwinDone {
    twin: SendTwin,
    job: TwinJob,
    good: Vec<f64>,
}

/// The planner of one executor run (module doc).
pub(crate) struct ExecPlan {
    /// Decisions, changes and GPU-hours.
    pub(crate) book: PlanLedger,
    /// The twin the `twin` policy tries candidates in (the simulator over
    /// the scenario's cost model); away while a decision's simulations run.
    twin: Option<SendTwin>,
    /// Whether a `twin` decision's simulations are running.
    pub(crate) simulating: bool,
    /// When the next window ends, seconds; `None` once requests stopped
    /// arriving.
    next_tick: Option<f64>,
    /// Requests that arrived so far.
    arrived: u64,
    /// Whether requests may still arrive: another window is timed only
    /// while they may, as in the simulator.
    pub(crate) open: bool,
    /// Loads waiting for a stopped worker's process to exit: (pool index
    /// of the stopped worker, pool index of the new one).
    after_stop: Vec<(usize, usize)>,
}

impl ExecPlan {
    /// The planner of `sc` over `topology` (with its spare slots), if `sc`
    /// has one; the `twin` policy prices its candidates with `cost`.
    pub(crate) fn of(
        sc: &Scenario,
        topology: &easerve_sched::Topology,
        cost: Arc<dyn StageCost>,
    ) -> Option<ExecPlan> {
        let book = PlanLedger::of(sc, topology)?;
        let twin = (book.planner.config().policy == PlannerPolicy::Twin)
            .then(|| Box::new(SimTwin::new(sc, cost)) as SendTwin);
        Some(ExecPlan {
            next_tick: Some(book.window_s()),
            book,
            twin,
            simulating: false,
            arrived: 0,
            open: true,
            after_stop: Vec::new(),
        })
    }

    /// When the next window ends, if another is timed.
    pub(crate) fn wake_at(&self) -> Option<f64> {
        self.next_tick
    }

    /// A request arrived.
    pub(crate) fn arrived(&mut self) {
        self.arrived += 1;
    }

    /// The `twin` policy tries its candidates in `twin` (the tests' stand-in
    /// for the simulator).
    #[cfg(feature = "agreement")]
    pub(crate) fn set_twin(&mut self, twin: SendTwin) {
        self.twin = Some(twin);
    }

    /// At `now`: if a window ended, the planner decides from `ctrl`'s stage
    /// loads, and its changes are returned as events for the controller. A
    /// `twin` decision's simulations go to a thread of their own, which
    /// posts them to `inbox` when done ([`ExecPlan::conclude`]).
    pub(crate) fn tick(
        &mut self,
        ctrl: &Controller,
        inbox: &UnboundedSender<Incoming>,
        now: f64,
    ) -> Vec<Event> {
        if self.next_tick.is_none_or(|t| now < t) {
            return Vec::new();
        }
        let loads = ctrl.stage_loads(now);
        self.next_tick = self.open.then(|| now + self.book.window_s());
        let decided = match self.book.observe(now, loads, self.arrived) {
            Ok(decided) => decided,
            Err(job) => {
                match self.twin.take() {
                    Some(twin) => self.simulate(twin, job, inbox.clone()),
                    None => {
                        // no twin: as [`PlanLedger::decide`] without one
                        self.book.conclude(now, &job, &[]);
                    }
                }
                return Vec::new();
            }
        };
        self.events(decided, ctrl, now)
    }

    /// Run `job` in `twin` on a thread of its own; the results go to `inbox`.
    fn simulate(&mut self, mut twin: SendTwin, job: TwinJob, inbox: UnboundedSender<Incoming>) {
        self.simulating = true;
        let spawned = std::thread::Builder::new()
            .name("twin-planner".into())
            .spawn(move || {
                let good = job.run(&mut *twin);
                // a run that ended meanwhile no longer listens
                let _ = inbox.send(Incoming::Planned(Box::new(TwinDone { twin, job, good })));
            });
        if let Err(e) = spawned {
            // the planner holds; the run goes on as it is
            eprintln!("warning: the twin planner's thread did not start ({e}); the deployment stays as it is");
        }
    }

    /// A `twin` decision's simulations are done, heard at `now`: its
    /// changes, as events for the controller.
    pub(crate) fn conclude(&mut self, done: TwinDone, ctrl: &Controller, now: f64) -> Vec<Event> {
        let TwinDone { twin, job, good } = done;
        self.twin = Some(twin);
        self.simulating = false;
        let decided = self.book.conclude(now, &job, &good);
        self.events(decided, ctrl, now)
    }

    /// The changes `decided` in the ledger, applied at `now`, as events.
    fn events(
        &mut self,
        decided: std::ops::Range<usize>,
        ctrl: &Controller,
        now: f64,
    ) -> Vec<Event> {
        decided
            .map(|i| Event::Reconfigure {
                change: self.book.applied(now, i, ctrl.topology()),
            })
            .collect()
    }

    /// [`Command::StopWorker`](easerve_sched::Command::StopWorker) at `now`
    /// (its drain is over): worker `w` gets a shutdown frame and takes
    /// nothing more; its GPU time ends here, as in the simulator, and its
    /// process's exit ([`ExecPlan::exited`]) frees its device.
    pub(crate) fn stop(&mut self, pool: &mut Pool, ctrl: &Controller, w: WorkerRef, now: f64) {
        self.book.stopped(now, w, ctrl.topology());
        let k = pool.by_ref[&w];
        let gen = pool.sup.gen(k);
        let p = &mut pool.workers[k];
        if let (Some(tx), Ok(frame)) = (p.tx.take(), encode_frame(&ToWorker::Shutdown)) {
            let _ = tx.send(frame);
        }
        p.stop = Some(Stop {
            gen,
            at: now,
            exited: false,
            killed: false,
        });
    }

    /// [`Command::LoadWorker`](easerve_sched::Command::LoadWorker) at `now`:
    /// worker `w`'s process starts; for a role change, on the device of
    /// `on` (the worker stopped for it), once `on`'s process has exited.
    pub(crate) fn load(&mut self, pool: &mut Pool, w: WorkerRef, on: Option<WorkerRef>, now: f64) {
        let k = pool.by_ref[&w];
        pool.workers[k].planned = true;
        pool.workers[k].started = true;
        if let Some(old) = on {
            let o = pool.by_ref[&old];
            pool.workers[k].gpu = pool.workers[o].gpu;
            pool.threads[k] = pool.threads[o];
            if pool.workers[o].stop.is_some_and(|s| !s.exited) {
                self.after_stop.push((o, k));
                return;
            }
        } else {
            pool.threads[k] = pool.spare_threads(k);
        }
        self.book.loading(now, w);
        pool.sup.restart_at(k, now);
    }

    /// Whether the end of incarnation `gen` of worker `k` is a stopped
    /// worker's exit (then taken here: a load waiting for its device starts
    /// at `now`), not a death.
    pub(crate) fn exited(&mut self, pool: &mut Pool, k: usize, gen: u32, now: f64) -> bool {
        let p = &mut pool.workers[k];
        let Some(stop) = p.stop.as_mut().filter(|s| s.gen == gen) else {
            return false;
        };
        if stop.exited {
            // its socket's close and its exit both say so
            return true;
        }
        stop.exited = true;
        p.pid = None;
        p.decode_run = None;
        let (go, wait): (Vec<_>, Vec<_>) = self.after_stop.iter().partition(|(o, _)| *o == k);
        self.after_stop = wait;
        for (_, new) in go {
            self.book.loading(now, pool.workers[new].wref);
            pool.sup.restart_at(new, now);
        }
        true
    }

    /// Worker `w`, which a change started, died loading its model at
    /// `now` (`reason`): a failed planned load in the ledger.
    pub(crate) fn load_failed(&mut self, w: WorkerRef, reason: &str, now: f64, ctrl: &Controller) {
        self.book.load_failed(now, w, ctrl.topology(), reason);
    }

    /// Worker `w` said `Ready` at `now`: its model is loaded.
    pub(crate) fn ready(&mut self, w: WorkerRef, now: f64, ctrl: &Controller) {
        self.book.ready(now, w, ctrl.topology());
    }
}

/// The report's `planner` section of a run `ctrl` drove under `plan`
/// (nothing without a planner): GPU-hours to the last request's finish, as
/// the simulator counts them, and good requests per GPU-hour per tier from
/// `report`'s goodput.
pub(crate) fn account(plan: Option<ExecPlan>, ctrl: &Controller, report: &mut Report) {
    let Some(plan) = plan else {
        return;
    };
    let good: Vec<(String, usize)> = report
        .goodput
        .iter()
        .map(|t| (t.name.clone(), t.good))
        .collect();
    let end = ctrl.finished().1;
    report.planner = Some(plan.book.report(end, ctrl.topology(), &good));
}
