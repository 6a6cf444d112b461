//! Reconfiguration: what a planner ([`crate::planner`]) changes while the run
//! goes on — a worker started from standby, a worker drained and stopped
//! (and, for a role change, another started on its GPUs once it stopped),
//! the encode batch bound `B` and the offload ratio `s` — and the per-stage
//! load it observes ([`Controller::stage_loads`]).
//!
//! A worker takes work while it is *active*. A standby slot
//! ([`crate::Topology::with_spares`]) is not; [`Change::Start`] asks the
//! driver to load its model ([`Command::LoadWorker`]) and it becomes active
//! when the driver reports [`Event::WorkerLoaded`](super::Event::WorkerLoaded).
//! [`Change::Drain`] stops placing work on a worker at once; the work it
//! holds or has coming (queued, running, in flight to it) finishes there —
//! nothing is re-queued or lost — and when none is left the controller
//! tells the driver to stop it ([`Command::StopWorker`]) and, for a role
//! change, to load the next role's model ([`Command::LoadWorker`]).

use super::{Command, Controller, Decision, WorkerRef};
use serde::{Deserialize, Serialize};

/// A change of the deployment while it runs, handed to the controller with
/// [`Event::Reconfigure`](super::Event::Reconfigure).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Change {
    /// Start standby (or stopped) worker `worker`: load its model
    /// ([`Command::LoadWorker`]); it takes work once ready.
    Start {
        /// The worker.
        worker: WorkerRef,
    },
    /// Take no more work on `worker`; once it holds none, stop it
    /// ([`Command::StopWorker`]) and then, when `then` is given (a role
    /// change: the same GPUs, another stage's model), start `then`.
    Drain {
        /// The worker drained.
        worker: WorkerRef,
        /// The worker started on its GPUs once it stopped.
        then: Option<WorkerRef>,
    },
    /// Set every encode worker's batch bound `B` (within the bound the
    /// deployment was built with).
    SetBatch {
        /// The new `B`, ≥ 1.
        max_batch: usize,
    },
    /// Set the offload ratio `s` of the prefill router, in `[0, 1]`.
    SetOffload {
        /// The new `s`.
        s: f64,
    },
}

/// One stage's load as a planner observes it ([`Controller::stage_loads`]):
/// counters since the start of the run (a planner takes differences over a
/// window) and the queues now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageLoad {
    /// Workers taking work now.
    pub active: usize,
    /// Workers started and not yet ready (loading a model), or draining.
    pub changing: usize,
    /// Requests that reached the stage so far (placed on one of its workers).
    pub arrived: u64,
    /// Worker-seconds its workers were busy so far (running a pass, a batch
    /// or a decode run), the work in progress up to now included.
    pub busy_s: f64,
    /// Requests waiting at its workers now (queued, not running).
    pub queued: usize,
    /// Decode only: the fraction of its active workers' KV blocks in use now.
    pub kv_used: f64,
    /// Request-seconds spent queued at its workers so far (the time
    /// integral of `queued`), when the controller keeps it
    /// ([`crate::ControllerConfig::queue_area`]); `None` otherwise.
    pub queued_s: Option<f64>,
}

impl Controller {
    /// Hand a change to the controller: a reconfiguration at `now`.
    pub(super) fn on_reconfigure(&mut self, now: f64, change: Change) {
        self.decide(|| Decision::Reconfigure { at: now, change });
        match change {
            Change::Start { worker } => self.start_worker(worker, None),
            Change::Drain { worker, then } => {
                self.placement(worker).retire(index(worker));
                self.draining.push((worker, then));
                self.check_drained(now);
            }
            Change::SetBatch { max_batch } => {
                for w in 0..self.encode.len() {
                    self.encode[w].batcher.set_max_batch(max_batch);
                    self.try_dispatch(now, w);
                }
            }
            Change::SetOffload { s } => self.router.set_offload(s),
        }
    }

    fn start_worker(&mut self, worker: WorkerRef, on: Option<WorkerRef>) {
        self.loading.push(worker);
        self.commands.push_back(Command::LoadWorker { worker, on });
    }

    /// Worker `w`'s model is loaded: a planner's start (it was loading) or
    /// a restart after its death.
    pub(super) fn on_worker_loaded(&mut self, now: f64, w: WorkerRef) {
        if self.loading.contains(&w) {
            self.on_worker_ready(now, w);
        } else {
            self.on_worker_restarted(now, w);
        }
    }

    /// Worker `w` a planner started loaded its model: it takes work from
    /// now on.
    fn on_worker_ready(&mut self, now: f64, w: WorkerRef) {
        let Some(k) = self.loading.iter().position(|x| *x == w) else {
            return;
        };
        self.loading.swap_remove(k);
        self.decide(|| Decision::WorkerReady { at: now, worker: w });
        self.placement(w).revive(index(w));
    }

    /// Worker `w` died at `now`: if a planner started it and it was still
    /// loading its model, the change failed ([`Decision::LoadFailed`]): it
    /// held no work (none goes to a loading worker), so nothing is failed
    /// or re-placed, and its slot stands by again, alive for a later start
    /// and not restarted. Returns whether it was such a load.
    pub(super) fn load_failed(&mut self, now: f64, w: WorkerRef, reason: &str) -> bool {
        let Some(k) = self.loading.iter().position(|x| *x == w) else {
            return false;
        };
        self.loading.swap_remove(k);
        self.decide(|| Decision::LoadFailed {
            at: now,
            worker: w,
            reason: reason.to_string(),
        });
        true
    }

    /// Stop every draining worker that holds no work any more (called after
    /// each input while any drains).
    pub(super) fn check_drained(&mut self, now: f64) {
        let mut k = 0;
        while k < self.draining.len() {
            let (w, then) = self.draining[k];
            if !self.holds_work(w) {
                self.draining.swap_remove(k);
                self.decide(|| Decision::WorkerStopped { at: now, worker: w });
                self.commands.push_back(Command::StopWorker { worker: w });
                if let Some(next) = then {
                    self.start_worker(next, Some(w));
                }
            } else {
                k += 1;
            }
        }
    }

    /// Whether worker `w` holds work or has some coming: placed on it and
    /// not completed there (its placement's outstanding work), or running.
    fn holds_work(&self, w: WorkerRef) -> bool {
        let i = index(w);
        let busy = match w {
            WorkerRef::Encode(_) => self.encode[i].busy || self.encode[i].inflight > 0,
            WorkerRef::Prefill(_) => self.prefill[i].busy || !self.prefill[i].queue.is_empty(),
            WorkerRef::Decode(_) => self.decode[i].in_run || self.decode[i].sched.waiting() > 0,
            WorkerRef::Replica(_) => self.replicas[i].stepping,
        };
        let outstanding = match w {
            WorkerRef::Encode(_) => self.encode_place.outstanding()[i],
            WorkerRef::Prefill(_) => self.remote_place.outstanding()[i],
            WorkerRef::Decode(_) => self.decode_place.outstanding()[i],
            WorkerRef::Replica(_) => self.replica_place.outstanding()[i],
        };
        busy || outstanding > 0.0
    }

    /// Spare slots ([`crate::Topology::with_spares`]) stand by, taking no
    /// work, until a planner starts them.
    pub(super) fn retire_standby(&mut self) {
        let standby: Vec<WorkerRef> = self
            .topology
            .workers()
            .filter(|w| w.standby)
            .map(|w| w.wref)
            .collect();
        for w in standby {
            self.placement(w).retire(index(w));
        }
    }

    fn placement(&mut self, w: WorkerRef) -> &mut crate::LeastOutstanding {
        match w {
            WorkerRef::Encode(_) => &mut self.encode_place,
            WorkerRef::Prefill(_) => &mut self.remote_place,
            WorkerRef::Decode(_) => &mut self.decode_place,
            WorkerRef::Replica(_) => &mut self.replica_place,
        }
    }

    /// Whether worker `w` takes new work now (not standing by, loading,
    /// draining, stopped or dead). A local prefill worker is active while
    /// it lives.
    pub fn is_active(&self, w: WorkerRef) -> bool {
        let i = index(w);
        match w {
            WorkerRef::Encode(_) => self.encode[i].alive && !self.encode_place.is_retired(i),
            WorkerRef::Prefill(_) if self.prefill[i].local => self.prefill[i].alive,
            WorkerRef::Prefill(_) => self.prefill[i].alive && !self.remote_place.is_retired(i),
            WorkerRef::Decode(_) => self.decode[i].alive && !self.decode_place.is_retired(i),
            WorkerRef::Replica(_) => self.replicas[i].alive && !self.replica_place.is_retired(i),
        }
    }

    /// The encode batch bound `B` in force (encode worker 0's; every worker
    /// has the same), `None` without encode workers.
    pub fn max_batch(&self) -> Option<usize> {
        self.encode.first().map(|e| e.batcher.max_batch())
    }

    /// The offload ratio `s` in force (before any rate tracking).
    pub fn offload(&self) -> f64 {
        self.router.offload()
    }

    /// Encode, prefill (remote workers; a local worker's queue counts with
    /// prefill) and decode load at `now` ([`StageLoad`]).
    pub fn stage_loads(&self, now: f64) -> [StageLoad; 3] {
        let mut out = [StageLoad::default(); 3];
        let changing =
            |w: WorkerRef| self.loading.contains(&w) || self.draining.iter().any(|(d, _)| *d == w);
        for (i, e) in self.encode.iter().enumerate() {
            let w = WorkerRef::Encode(i);
            out[0].active += usize::from(self.is_active(w));
            out[0].changing += usize::from(changing(w));
            out[0].busy_s += e.busy_s + if e.busy { now - e.since } else { 0.0 };
        }
        for (i, p) in self.prefill.iter().enumerate() {
            let w = WorkerRef::Prefill(i);
            if !p.local {
                out[1].active += usize::from(self.is_active(w));
                out[1].changing += usize::from(changing(w));
                out[1].busy_s += p.busy_s + if p.busy { now - p.since } else { 0.0 };
            }
        }
        let (mut used, mut total) = (0u64, 0u64);
        for (i, d) in self.decode.iter().enumerate() {
            let w = WorkerRef::Decode(i);
            let active = self.is_active(w);
            out[2].active += usize::from(active);
            out[2].changing += usize::from(changing(w));
            out[2].busy_s += d.busy_s + if d.in_run { now - d.since } else { 0.0 };
            if active {
                used += d.sched.kv().used();
                total += d.sched.kv().total();
            }
        }
        out[2].kv_used = if total > 0 {
            used as f64 / total as f64
        } else {
            0.0
        };
        let queued = self.queued_now();
        for (k, (s, n)) in out.iter_mut().zip(self.counters.stage_arrivals).enumerate() {
            s.arrived = n;
            s.queued = queued[k];
            s.queued_s = self
                .queue_area
                .map(|(area, at)| area[k] + queued[k] as f64 * (now - at).max(0.0));
        }
        out
    }

    /// Requests waiting at each stage's workers now (encode, prefill,
    /// decode): queued, not running.
    fn queued_now(&self) -> [usize; 3] {
        [
            self.encode.iter().map(|e| e.batcher.len()).sum(),
            self.prefill.iter().map(|p| p.queue.len()).sum(),
            self.decode.iter().map(|d| d.sched.waiting()).sum(),
        ]
    }

    /// With [`crate::ControllerConfig::queue_area`]: add each stage's queue
    /// since the last event, constant in between, to its integral.
    pub(super) fn integrate_queues(&mut self, now: f64) {
        let Some((area, at)) = self.queue_area else {
            return;
        };
        let queued = self.queued_now();
        let dt = (now - at).max(0.0);
        let area: [f64; 3] = std::array::from_fn(|k| area[k] + queued[k] as f64 * dt);
        self.queue_area = Some((area, now.max(at)));
    }
}

/// The index of worker `w` within its stage.
fn index(w: WorkerRef) -> usize {
    match w {
        WorkerRef::Encode(i)
        | WorkerRef::Prefill(i)
        | WorkerRef::Decode(i)
        | WorkerRef::Replica(i) => i,
    }
}
