//! A planner's run as every driver accounts for it ([`PlanLedger`]): the
//! decisions at the end of each window, each change with when the
//! controller got it, when the drained worker stopped and when the new one
//! was ready, and the GPU-hours the run held, for the report's `planner`
//! section ([`PlannerReport`]). The simulator times a model load from the
//! scenario's load times; `easerve exec` and `serve` measure it (the new
//! worker process's `Ready`). No clock: `now` comes from the driver.

use crate::report::{ChangeRecord, PlannerReport, TierValue};
use crate::Scenario;
use easerve_sched::planner::{Planner, Step, Twin, TwinJob};
use easerve_sched::{Change, StageLoad, Topology, WorkerRef};

/// The planner of one run and what the report says of it (module doc).
#[derive(Clone, Debug)]
pub struct PlanLedger {
    /// The planner.
    pub planner: Planner,
    /// Changes decided, in order; a driver hands change `i` to the
    /// controller ([`easerve_sched::Event::Reconfigure`]) and says so
    /// ([`PlanLedger::applied`]).
    pub pending: Vec<Change>,
    /// Workers holding GPUs and since when (seconds).
    held: Vec<(WorkerRef, f64)>,
    /// GPU-seconds of the workers that stopped.
    gpu_s: f64,
    changes: Vec<ChangeRecord>,
    load_source: String,
}

impl PlanLedger {
    /// The planner of `sc` over `topology` (with its spare slots,
    /// [`Scenario::planner_spares`]), if `sc` has one; every active worker
    /// holds its GPUs from time 0.
    pub fn of(sc: &Scenario, topology: &Topology) -> Option<PlanLedger> {
        let setup = sc.planner.as_ref()?;
        let planner = Planner::new(setup.config.clone(), topology).ok()?;
        let held = topology
            .encode()
            .iter()
            .chain(&topology.prefill()[..topology.remote_prefill()])
            .chain(topology.decode())
            .filter(|w| !w.standby)
            .map(|w| (w.wref, 0.0))
            .collect();
        Some(PlanLedger {
            planner,
            pending: Vec::new(),
            held,
            gpu_s: 0.0,
            changes: Vec::new(),
            load_source: setup.load_source.clone(),
        })
    }

    /// Seconds between decisions.
    pub fn window_s(&self) -> f64 {
        self.planner.config().window_s
    }

    /// Decide at the end of a window at `now` from the controller's stage
    /// loads and the requests `arrived` so far (`twin` for the `twin`
    /// policy): the indices of the changes decided, in
    /// [`PlanLedger::pending`].
    pub fn decide(
        &mut self,
        now: f64,
        loads: [StageLoad; 3],
        arrived: u64,
        twin: Option<&mut dyn Twin>,
    ) -> std::ops::Range<usize> {
        let changes = self.planner.on_window(now, loads, arrived, twin);
        self.queue(changes)
    }

    /// Decide at the end of a window at `now` as [`PlanLedger::decide`],
    /// the `twin` policy's simulations left to the caller
    /// ([`Planner::observe`]): `Ok` the indices of the changes decided, in
    /// [`PlanLedger::pending`], or `Err` the simulations to run, whose
    /// results go to [`PlanLedger::conclude`].
    pub fn observe(
        &mut self,
        now: f64,
        loads: [StageLoad; 3],
        arrived: u64,
    ) -> Result<std::ops::Range<usize>, TwinJob> {
        match self.planner.observe(now, loads, arrived) {
            Step::Changes(changes) => Ok(self.queue(changes)),
            Step::Twin(job) => Err(job),
        }
    }

    /// The `twin` decision `job` concludes at `now` with `good` per
    /// candidate ([`Planner::conclude`]): the indices of its changes, in
    /// [`PlanLedger::pending`].
    pub fn conclude(&mut self, now: f64, job: &TwinJob, good: &[f64]) -> std::ops::Range<usize> {
        let changes = self.planner.conclude(now, job, good);
        self.queue(changes)
    }

    fn queue(&mut self, changes: Vec<Change>) -> std::ops::Range<usize> {
        let start = self.pending.len();
        self.pending.extend(changes);
        start..self.pending.len()
    }

    /// Change `i` reaches the controller at `now`: the change, recorded.
    pub fn applied(&mut self, now: f64, i: usize, topology: &Topology) -> Change {
        let change = self.pending[i];
        let label = |w: WorkerRef| topology.label(w).to_string();
        let (from, to) = match change {
            Change::Start { worker } => (None, Some(label(worker))),
            Change::Drain { worker, then } => (Some(label(worker)), then.map(label)),
            _ => (None, None),
        };
        self.changes.push(ChangeRecord {
            at: now,
            change,
            from,
            to,
            stopped_at: None,
            ready_at: None,
            failed_at: None,
            failure: None,
        });
        change
    }

    /// Worker `w` starts loading its model at `now`: its GPUs are held.
    pub fn loading(&mut self, now: f64, w: WorkerRef) {
        self.held.push((w, now));
    }

    /// Worker `w` is ready at `now`.
    pub fn ready(&mut self, now: f64, w: WorkerRef, topology: &Topology) {
        if let Some(c) = self.loading_change(topology.label(w)) {
            c.ready_at = Some(now);
        }
    }

    /// The change that started worker `label` and is still loading it.
    fn loading_change(&mut self, label: &str) -> Option<&mut ChangeRecord> {
        self.changes.iter_mut().find(|c| {
            c.ready_at.is_none() && c.failed_at.is_none() && c.to.as_deref() == Some(label)
        })
    }

    /// Worker `w`'s GPUs, held since it started loading, are free at `now`.
    fn release(&mut self, now: f64, w: WorkerRef, topology: &Topology) {
        if let Some(k) = self.held.iter().position(|(x, _)| *x == w) {
            let (_, since) = self.held.swap_remove(k);
            self.gpu_s += (now - since) * topology.worker(w).gpus.len() as f64;
        }
    }

    /// Worker `w`, started by a change, died at `now` while loading its
    /// model ([`easerve_sched::Decision::LoadFailed`]): the change is
    /// recorded as failed with `reason`, its GPUs are free from `now`, and
    /// the planner counts its slot free again.
    pub fn load_failed(&mut self, now: f64, w: WorkerRef, topology: &Topology, reason: &str) {
        self.release(now, w, topology);
        if let Some(c) = self.loading_change(topology.label(w)) {
            c.failed_at = Some(now);
            c.failure = Some(reason.to_string());
        }
        self.planner.load_failed(w);
    }

    /// Worker `w` stopped at `now`: its GPUs are free.
    pub fn stopped(&mut self, now: f64, w: WorkerRef, topology: &Topology) {
        self.release(now, w, topology);
        let l = topology.label(w);
        if let Some(c) = self
            .changes
            .iter_mut()
            .find(|c| c.stopped_at.is_none() && c.from.as_deref() == Some(l))
        {
            c.stopped_at = Some(now);
        }
    }

    /// The report's planner section for a run that ended at `end` seconds
    /// with `good` requests meeting each tier (`(name, good)`).
    pub fn report(self, end: f64, topology: &Topology, good: &[(String, usize)]) -> PlannerReport {
        let held: f64 = self
            .held
            .iter()
            .map(|(w, since)| (end - since).max(0.0) * topology.worker(*w).gpus.len() as f64)
            .sum();
        let gpu_hours = (self.gpu_s + held) / 3600.0;
        let cfg = self.planner.config().clone();
        PlannerReport {
            policy: cfg.policy.to_string(),
            window_s: cfg.window_s,
            dwell_s: cfg.dwell_s,
            load_s: cfg.load_s,
            load_source: self.load_source,
            gpu_hours,
            goodput_per_gpu_hour: good
                .iter()
                .map(|(name, g)| TierValue {
                    tier: name.clone(),
                    value: if gpu_hours > 0.0 {
                        *g as f64 / gpu_hours
                    } else {
                        0.0
                    },
                })
                .collect(),
            changes: self.changes,
            decisions: self.planner.log().to_vec(),
        }
    }
}
