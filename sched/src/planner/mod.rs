//! The planner: at the end of each window it observes every stage's load
//! (the [`Controller`](crate::Controller)'s counters, [`StageLoad`]) and
//! decides changes of the deployment ([`Change`]), which the driver hands
//! to the controller ([`Event::Reconfigure`](crate::Event::Reconfigure)).
//! Sans-IO like the controller: no clock, no threads; the driver calls
//! [`Planner::on_window`] with the time.
//!
//! Policies ([`PlannerPolicy`]):
//! * `static` — no change (the deployment as given; every earlier run);
//! * `load` — thresholds on per-stage queues and KV use ([`LoadRule`]);
//! * `twin` — forecast the next windows' rates and simulate each candidate
//!   deployment over them with a [`Twin`] the driver supplies (`sched`
//!   cannot depend on the simulator; `easerve-sim` implements the trait),
//!   taking the best by goodput per GPU-hour net of the change's cost
//!   (`twin.rs`).
//!
//! What it may change: start a standby slot where the cluster has GPUs to
//! spare (add), drain a worker (remove), move a worker's GPUs to another
//! stage (a role change: drain, stop, load the other stage's model), and set
//! `B` and `s` ([`Change::SetBatch`], [`Change::SetOffload`]). A change costs
//! the drain of the worker's work and a model load (`load_s`, from the
//! model's weight bytes over the load bandwidth the scenario states).
//!
//! Against oscillation: no change while one is under way (a worker loading
//! or draining, as Dynamo's planner blocks while it adjusts), none within
//! `dwell_s` of the last, and at most one worker moved per window; the load
//! rule has separate up and down thresholds (hysteresis). A dwell shorter
//! than a model load is refused ([`PlannerError`]).

mod load;
mod twin;

pub use load::{BusyRule, LoadRule, QueueSignal};
pub use twin::{forecast, Twin, TwinJob, TwinQuery};

use crate::controller::{Change, StageLoad};
use crate::{Topology, WorkerRef};
use serde::{Deserialize, Serialize};

/// Stage names, by the index the planner uses (encode, prefill, decode).
pub const STAGE_NAMES: [&str; 3] = ["encode", "prefill", "decode"];

/// Which planner runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlannerPolicy {
    /// No change: the deployment as given.
    #[default]
    Static,
    /// Thresholds on per-stage load ([`LoadRule`]).
    Load,
    /// Forecast and simulate candidates in the twin ([`Twin`]).
    Twin,
}

impl std::str::FromStr for PlannerPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "static" => Ok(PlannerPolicy::Static),
            "load" => Ok(PlannerPolicy::Load),
            "twin" => Ok(PlannerPolicy::Twin),
            _ => Err(format!(
                "unknown planner `{s}`; allowed: static, load, twin"
            )),
        }
    }
}

impl std::fmt::Display for PlannerPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PlannerPolicy::Static => "static",
            PlannerPolicy::Load => "load",
            PlannerPolicy::Twin => "twin",
        })
    }
}

/// How a planner is set up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlannerConfig {
    /// The policy.
    pub policy: PlannerPolicy,
    /// Seconds between decisions (the observation window).
    pub window_s: f64,
    /// Least seconds between two changes.
    pub dwell_s: f64,
    /// Seconds to load each stage's model on a worker's GPUs (encode,
    /// prefill, decode): weight bytes per GPU over the load bandwidth.
    pub load_s: [f64; 3],
    /// GPUs of the cluster: the workers in use never hold more.
    pub cluster_gpus: u32,
    /// Seconds the `twin` policy looks ahead.
    pub horizon_s: f64,
    /// Thresholds of the `load` policy.
    pub rule: LoadRule,
    /// The deployment's offload ratio `s` (HAS sized the remote prefill
    /// pool for it): when the remote pool changes from `n₀` workers to `n`,
    /// the planner sets `s' = min(1, s·n/n₀)`, so each remote worker keeps
    /// the share of arrivals it was sized for and the local workers the
    /// rest ([`Planner::offload_for`]).
    pub offload: f64,
}

/// A planner set up with values it cannot run with.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct PlannerError {
    /// The scenario field (`planner.dwell_s`, …).
    pub field: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl PlannerConfig {
    /// Check the values: a positive window and horizon, and a dwell no
    /// shorter than the longest model load (a change would otherwise be
    /// decided again before the last one took effect).
    ///
    /// # Errors
    /// The first field out of range, named.
    pub fn check(&self) -> Result<(), PlannerError> {
        let err = |field: &str, message: String| {
            Err(PlannerError {
                field: field.into(),
                message,
            })
        };
        if !(self.window_s > 0.0 && self.window_s.is_finite()) {
            return err(
                "planner.window_s",
                format!("{} is not a positive number of seconds", self.window_s),
            );
        }
        if !(self.horizon_s > 0.0 && self.horizon_s.is_finite()) {
            return err(
                "planner.horizon_s",
                format!("{} is not a positive number of seconds", self.horizon_s),
            );
        }
        if let Some(b) = self.rule.busy {
            if !(b.up > 0.0 && b.up < 1.0) {
                return err(
                    "planner.busy_up",
                    format!("{} is not a fraction in (0, 1) (a stage is hot when busy more than this share of the window, which it cannot exceed)", b.up),
                );
            }
            if !(b.down >= 0.0 && b.down < b.up) {
                return err(
                    "planner.busy_down",
                    format!("{} is not in [0, busy_up = {}): the gap between the two is the rule's hysteresis", b.down, b.up),
                );
            }
        }
        let load = self.load_s.iter().copied().fold(0.0, f64::max);
        if self.dwell_s.is_nan() || self.dwell_s < load || !self.dwell_s.is_finite() {
            return err(
                "planner.dwell_s",
                format!(
                    "{} s is shorter than a model load ({load:.2} s, the longest of encode {:.2} s, prefill {:.2} s, decode {:.2} s); allowed: at least {load:.2} s",
                    self.dwell_s, self.load_s[0], self.load_s[1], self.load_s[2]
                ),
            );
        }
        Ok(())
    }
}

/// One planning decision and what it was decided from (the report's
/// decision log).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanRecord {
    /// Time, seconds.
    pub at: f64,
    /// Requests that arrived in the window, per second.
    pub rate: f64,
    /// Per stage (encode, prefill, decode): active workers, busy fraction
    /// of the window, requests queued per active worker, KV use (decode).
    pub stages: [StageView; 3],
    /// The `twin` policy's forecast rates for the next windows, requests/s.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forecast: Vec<f64>,
    /// The `twin` policy's candidates: workers per stage and score (good
    /// requests per GPU-hour, net of the change's cost).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<([u32; 3], f64)>,
    /// What was decided: the changes (empty: none).
    pub changes: Vec<Change>,
    /// Why nothing changed, when nothing did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    /// When the decision took effect, seconds, where that is after the
    /// window it was taken for (`at`): a `twin` decision a driver ran off
    /// its loop ([`Planner::observe`], [`Planner::conclude`]). Absent: at
    /// `at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_at: Option<f64>,
}

/// What a window's end asks of the driver ([`Planner::observe`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// The changes decided now, in order (empty: none).
    Changes(Vec<Change>),
    /// A `twin` decision: run the job's simulations ([`TwinJob::run`],
    /// where the driver likes, e.g. off its loop) and hand the results to
    /// [`Planner::conclude`].
    Twin(TwinJob),
}

/// One stage as a decision saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageView {
    /// Active workers.
    pub active: usize,
    /// Busy worker-seconds over active worker-seconds in the window.
    pub busy: f64,
    /// Requests queued per active worker at the window's end.
    pub queue_per_worker: f64,
    /// Requests queued per active worker on average over the window (the
    /// controller's queue integral, [`crate::StageLoad::queued_s`]), when
    /// the controller keeps it (`planner.queue_signal = "mean"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_mean_per_worker: Option<f64>,
    /// KV blocks in use (decode; 0 elsewhere).
    pub kv_used: f64,
}

/// A worker slot the planner can use.
#[derive(Clone, Debug, PartialEq)]
struct Slot {
    wref: WorkerRef,
    stage: usize,
    gpus: u32,
    active: bool,
    /// An encode worker sharing its GPU with a local prefill worker: never
    /// moved (its GPU holds two roles).
    pinned: bool,
}

/// The planner (module doc).
#[derive(Clone, Debug)]
pub struct Planner {
    cfg: PlannerConfig,
    /// Remote prefill workers of the deployment as given.
    remote0: u32,
    slots: Vec<Slot>,
    prev: Option<([StageLoad; 3], u64)>,
    last_change: f64,
    rates: Vec<f64>,
    log: Vec<PlanRecord>,
    /// The log index of a `twin` decision whose simulations are still out
    /// ([`Planner::observe`]).
    pending: Option<usize>,
}

impl Planner {
    /// A planner over `topology`'s slots (its standby slots are the spares).
    ///
    /// # Errors
    /// [`PlannerConfig::check`].
    pub fn new(cfg: PlannerConfig, topology: &Topology) -> Result<Planner, PlannerError> {
        cfg.check()?;
        let mut slots = Vec::new();
        let stages: [(usize, &[crate::Worker]); 3] = [
            (0, topology.encode()),
            (1, &topology.prefill()[..topology.remote_prefill()]),
            (2, topology.decode()),
        ];
        for (stage, workers) in stages {
            for w in workers {
                slots.push(Slot {
                    wref: w.wref,
                    stage,
                    gpus: w.gpus.len() as u32,
                    active: !w.standby,
                    pinned: w.local_prefill.is_some(),
                });
            }
        }
        let remote0 = slots.iter().filter(|s| s.stage == 1 && s.active).count() as u32;
        Ok(Planner {
            remote0,
            cfg,
            slots,
            prev: None,
            last_change: f64::NEG_INFINITY,
            rates: Vec::new(),
            log: Vec::new(),
            pending: None,
        })
    }

    /// The offload ratio for `remote` remote prefill workers: `min(1,
    /// s·remote/n₀)` ([`PlannerConfig::offload`]); `s` itself without remote
    /// workers in the deployment as given.
    pub fn offload_for(&self, remote: u32) -> f64 {
        if self.remote0 == 0 {
            return self.cfg.offload;
        }
        (self.cfg.offload * f64::from(remote) / f64::from(self.remote0)).min(1.0)
    }

    /// The configuration.
    pub fn config(&self) -> &PlannerConfig {
        &self.cfg
    }

    /// Worker `w`, which a change started, died loading its model
    /// ([`crate::Decision::LoadFailed`]): its slot is free again, and a later
    /// decision may start it (the counts it decides from are the workers
    /// that run).
    pub fn load_failed(&mut self, w: WorkerRef) {
        if let Some(s) = self.slots.iter_mut().find(|s| s.wref == w) {
            s.active = false;
        }
    }

    /// Every decision so far.
    pub fn log(&self) -> &[PlanRecord] {
        &self.log
    }

    /// Active workers per stage, as the planner last decided.
    pub fn counts(&self) -> [u32; 3] {
        let mut c = [0; 3];
        for s in self.slots.iter().filter(|s| s.active) {
            c[s.stage] += 1;
        }
        c
    }

    /// GPUs of one worker of each stage (0 for a stage without slots).
    pub fn gpus_per_worker(&self) -> [u32; 3] {
        let mut g = [0; 3];
        for s in &self.slots {
            g[s.stage] = s.gpus;
        }
        g
    }

    /// GPUs that `counts` workers per stage hold.
    pub fn gpus_of(&self, counts: [u32; 3]) -> u32 {
        let g = self.gpus_per_worker();
        (0..3).map(|k| counts[k] * g[k]).sum()
    }

    /// Whether `counts` workers per stage can run: within the cluster's
    /// GPUs and the slots there are, with at least one worker per stage that
    /// has any and the pinned encode workers kept.
    pub fn feasible(&self, counts: [u32; 3]) -> bool {
        (0..3).all(|k| {
            let slots = self.slots.iter().filter(|s| s.stage == k);
            let total = slots.clone().count() as u32;
            let pinned = slots.filter(|s| s.pinned).count() as u32;
            counts[k] <= total && counts[k] >= pinned && (total == 0 || counts[k] >= 1)
        }) && self.gpus_of(counts) <= self.cfg.cluster_gpus
    }

    /// The window that ends at `now`: `loads` are the controller's
    /// [`StageLoad`]s now and `arrived` the requests that arrived since the
    /// start of the run. Returns the changes to hand to the controller, in
    /// order; `twin` must be given for the `twin` policy (without one it
    /// changes nothing and says so), and its simulations run here, before
    /// this returns (the simulator's way: [`Planner::observe`] and
    /// [`Planner::conclude`] split it for a driver that keeps serving).
    pub fn on_window(
        &mut self,
        now: f64,
        loads: [StageLoad; 3],
        arrived: u64,
        twin: Option<&mut dyn Twin>,
    ) -> Vec<Change> {
        let Some(twin) = twin else {
            return match self.observe(now, loads, arrived) {
                Step::Changes(c) => c,
                Step::Twin(job) => {
                    let k = self.pending.take().expect("the job's record");
                    self.log[k].held = Some("no twin to simulate candidates in".into());
                    self.log[k].forecast.clear();
                    drop(job);
                    Vec::new()
                }
            };
        };
        match self.observe(now, loads, arrived) {
            Step::Changes(c) => c,
            Step::Twin(job) => {
                let good = job.run(twin);
                let out = self.conclude(now, &job, &good);
                if let Some(rec) = self.log.last_mut() {
                    // taken and applied at the window's end
                    rec.applied_at = None;
                }
                out
            }
        }
    }

    /// The window that ends at `now` (as [`Planner::on_window`]), its
    /// `twin` simulations left to the caller: either the changes decided
    /// now, or a [`TwinJob`] (a snapshot of the candidates and the
    /// forecast) whose results go to [`Planner::conclude`]. While a job is
    /// out, later windows are observed (their rates feed the forecast) and
    /// hold.
    pub fn observe(&mut self, now: f64, loads: [StageLoad; 3], arrived: u64) -> Step {
        let (prev, prev_arrived) = self.prev.unwrap_or(([StageLoad::default(); 3], 0));
        self.prev = Some((loads, arrived));
        let w = self.cfg.window_s;
        let rate = (arrived - prev_arrived) as f64 / w;
        self.rates.push(rate);
        let mut stages = [StageView::default(); 3];
        for k in 0..3 {
            let n = loads[k].active.max(1) as f64;
            stages[k] = StageView {
                active: loads[k].active,
                busy: ((loads[k].busy_s - prev[k].busy_s) / (n * w)).clamp(0.0, 1.0),
                queue_per_worker: loads[k].queued as f64 / n,
                queue_mean_per_worker: loads[k]
                    .queued_s
                    .map(|q| (q - prev[k].queued_s.unwrap_or(0.0)).max(0.0) / (n * w)),
                kv_used: loads[k].kv_used,
            };
        }
        let mut rec = PlanRecord {
            at: now,
            rate,
            stages,
            forecast: Vec::new(),
            candidates: Vec::new(),
            changes: Vec::new(),
            held: None,
            applied_at: None,
        };
        let queued: usize = loads.iter().map(|l| l.queued).sum();
        let target = if self.cfg.policy == PlannerPolicy::Static {
            None
        } else if let Some(k) = self.pending {
            rec.held = Some(format!(
                "the twin decision for the window at {:.0} s is still being simulated",
                self.log[k].at
            ));
            None
        } else if loads.iter().any(|l| l.changing > 0) {
            rec.held = Some("a change is under way".into());
            None
        } else if now - self.last_change < self.cfg.dwell_s {
            rec.held = Some(format!(
                "within the dwell time ({} s) of the change at {:.0} s",
                self.cfg.dwell_s, self.last_change
            ));
            None
        } else {
            match self.cfg.policy {
                PlannerPolicy::Static => None,
                PlannerPolicy::Load => self.cfg.rule.target(self, &stages),
                PlannerPolicy::Twin => {
                    let job = self.twin_job(now, queued);
                    rec.forecast = job.rates().to_vec();
                    rec.held = Some("the twin decision was still being simulated".into());
                    self.pending = Some(self.log.len());
                    self.log.push(rec);
                    return Step::Twin(job);
                }
            }
        };
        Step::Changes(self.settle(now, target, rec))
    }

    /// The changes to `target` (none: hold), recorded in the log with `rec`.
    fn settle(&mut self, now: f64, target: Option<[u32; 3]>, mut rec: PlanRecord) -> Vec<Change> {
        if let Some(t) = target.filter(|t| *t != self.counts()) {
            rec.changes = self.changes_to(t);
            if !rec.changes.is_empty() {
                self.last_change = now;
            }
        } else if rec.held.is_none() && self.cfg.policy != PlannerPolicy::Static {
            rec.held = Some("the deployment in force is the best".into());
        }
        let out = rec.changes.clone();
        self.log.push(rec);
        out
    }

    /// The `twin` decision `job` (from [`Planner::observe`]) concludes at
    /// `now` with `good` (the twin's answer to each of `job.queries`, in
    /// order): the best candidate ([`TwinJob`]), its changes returned for
    /// the controller, and the decision's log entry completed, with
    /// `applied_at = now`. A job that is not the one out changes nothing.
    pub fn conclude(&mut self, now: f64, job: &TwinJob, good: &[f64]) -> Vec<Change> {
        let Some(k) = self.pending.filter(|&k| self.log[k].at == job.at) else {
            return Vec::new();
        };
        self.pending = None;
        let mut rec = self.log.remove(k);
        rec.held = None;
        rec.applied_at = Some(now);
        let target = self.twin_pick(job, good, &mut rec);
        let out = self.settle(now, target, rec);
        // back in its window's place
        let rec = self.log.pop().expect("the record settled");
        self.log.insert(k, rec);
        out
    }

    /// The changes that take the active workers to `target` (one worker
    /// moved per window, so at most one stage down and one up): a role
    /// change where a stage loses a worker and another gains one, else a
    /// start or a drain.
    fn changes_to(&mut self, target: [u32; 3]) -> Vec<Change> {
        let now = self.counts();
        let down = (0..3).find(|&k| target[k] < now[k]);
        let up = (0..3).find(|&k| target[k] > now[k]);
        let from = down.and_then(|k| {
            self.slots
                .iter()
                .rposition(|s| s.stage == k && s.active && !s.pinned)
        });
        let to = up.and_then(|k| self.slots.iter().position(|s| s.stage == k && !s.active));
        let mut out = Vec::new();
        match (from, to) {
            (Some(f), Some(t)) => {
                self.slots[f].active = false;
                self.slots[t].active = true;
                out.push(Change::Drain {
                    worker: self.slots[f].wref,
                    then: Some(self.slots[t].wref),
                });
            }
            (Some(f), None) if up.is_none() => {
                self.slots[f].active = false;
                out.push(Change::Drain {
                    worker: self.slots[f].wref,
                    then: None,
                });
            }
            (None, Some(t)) if down.is_none() => {
                self.slots[t].active = true;
                out.push(Change::Start {
                    worker: self.slots[t].wref,
                });
            }
            _ => {}
        }
        let (before, after) = (now[1], self.counts()[1]);
        if before != after && self.offload_for(after) != self.offload_for(before) {
            out.push(Change::SetOffload {
                s: self.offload_for(after),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests;
