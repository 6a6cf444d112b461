//! Supervision: a dead worker is restarted with exponential backoff
//! ([`Backoff`], [`Command::Restart`]) and rejoins placement and routing when
//! its driver reports it loaded ([`Event::WorkerLoaded`](super::Event::WorkerLoaded));
//! the deaths, restarts, degraded time and stage-down time of a run
//! ([`SupervisionCounters`], [`Outage`]).
//!
//! What happens to a dead worker's requests, per stage (`faults.rs`):
//! * **encode**: requests queued at its batcher go to a live encode worker
//!   (placement again); the micro-batch in its pass fails (its preprocessed
//!   items and partial embeddings died with it);
//! * **prefill** (remote or local): every request held there — queued, in the
//!   batch, or in an envelope on its way — is re-run from its last completed
//!   stage, encode: its embeddings are kept by the driver until its prefill
//!   ends, and go to a live prefill worker (a remote one by placement, else
//!   the local prefill worker on the request's encode GPU). Nothing fails
//!   while a prefill worker is live;
//! * **decode** and **aggregated replicas**: requests whose KV cache lived
//!   there fail (their tokens already went to the client, so a re-run would
//!   send them twice); a replica's requests still waiting for admission go to
//!   a live replica.
//!
//! A stage with no live worker fails what would go to it, naming the dead
//! worker, until one rejoins.

use super::{Command, Controller, Decision, WorkerRef};
use serde::{Deserialize, Serialize};

/// Exponential backoff of a dead worker's restarts: attempt `n` (1 for the
/// first after a death) waits `min(base_s · factorⁿ⁻¹, cap_s)` seconds before
/// the worker's process is started again. The count of attempts restarts
/// from 1 once the worker completes a unit of work (a pass, a batch, a decode
/// run, an iteration) after rejoining, so a worker that crashes while loading
/// or on its first work backs off, and one that served comes back fast.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Backoff {
    /// Delay before the first restart, seconds.
    pub base_s: f64,
    /// Growth per failed attempt.
    pub factor: f64,
    /// Longest delay, seconds.
    pub cap_s: f64,
}

impl Backoff {
    /// `base 0.5 s, factor 2, cap 8 s`. The base is short beside a model
    /// load (the executor's `tiny-*` workers load in about 1 s on a 2-core
    /// host, a real model in tens of seconds), so a single crash costs about
    /// one load; factor 2 is the usual doubling (Kubernetes' CrashLoopBackOff,
    /// gRPC's reconnect backoff use it); the cap of 8 s bounds a crash-looping
    /// worker to one start every 8 s plus its load, and keeps a worker that
    /// stops crashing back within 30 s of its last crash while its load takes
    /// under 22 s.
    pub const DEFAULT: Backoff = Backoff {
        base_s: 0.5,
        factor: 2.0,
        cap_s: 8.0,
    };

    /// Backoff starting at `base_s` with the default factor and cap (the cap
    /// raised to `base_s` when it is longer).
    pub fn starting_at(base_s: f64) -> Backoff {
        Backoff {
            base_s,
            cap_s: Backoff::DEFAULT.cap_s.max(base_s),
            ..Backoff::DEFAULT
        }
    }

    /// Seconds to wait before restart attempt `attempt` (1-based).
    pub fn delay(&self, attempt: u32) -> f64 {
        let n = attempt.max(1) - 1;
        (self.base_s * self.factor.powi(n.min(64) as i32)).min(self.cap_s)
    }
}

/// One death of a worker and, when it came back, its rejoin.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outage {
    /// Worker label (`E0`, `P0`, `L0`, `D0`, `R0`).
    pub worker: String,
    /// When it died, seconds since the start of the run.
    pub died_at: f64,
    /// Why (the driver's words: exit status, signal, missed heartbeats,
    /// stderr).
    pub reason: String,
    /// Restart attempts made for this death.
    pub attempts: u32,
    /// When it rejoined (its model loaded), seconds; `None` if it did not.
    pub back_at: Option<f64>,
}

/// What supervision saw in a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SupervisionCounters {
    /// Worker deaths (a failed restart counts as another death).
    pub deaths: usize,
    /// Restarts that brought a worker back (it rejoined).
    pub restarts: usize,
    /// Seconds with at least one worker dead (capacity below the deployment's).
    pub degraded_s: f64,
    /// Seconds with some stage having no live worker (`/health` says 503).
    pub down_s: f64,
}

/// The controller's supervision state.
#[derive(Default)]
pub(super) struct Supervision {
    /// Restart policy; `None`: a dead worker stays dead.
    pub(super) policy: Option<Backoff>,
    /// Per worker that died: restart attempts since it last completed work.
    attempts: Vec<(WorkerRef, u32)>,
    /// Workers dead now, and the index of their open outage.
    dead: Vec<(WorkerRef, usize)>,
    outages: Vec<Outage>,
    counters: SupervisionCounters,
    degraded_since: Option<f64>,
    down_since: Option<f64>,
}

impl Supervision {
    fn attempt(&mut self, w: WorkerRef) -> u32 {
        match self.attempts.iter_mut().find(|(x, _)| *x == w) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                self.attempts.push((w, 1));
                1
            }
        }
    }

    /// Close or open the degraded and down intervals at `now`.
    fn account(&mut self, now: f64, stage_down: bool) {
        let c = &mut self.counters;
        match (self.dead.is_empty(), self.degraded_since) {
            (false, None) => self.degraded_since = Some(now),
            (true, Some(t)) => {
                c.degraded_s += now - t;
                self.degraded_since = None;
            }
            _ => {}
        }
        match (stage_down, self.down_since) {
            (true, None) => self.down_since = Some(now),
            (false, Some(t)) => {
                c.down_s += now - t;
                self.down_since = None;
            }
            _ => {}
        }
    }
}

impl Controller {
    /// Restart dead workers with `policy` ([`Command::Restart`]); without
    /// this (the default) a dead worker stays dead, as the simulator's fault
    /// injection has it unless asked for restarts.
    pub fn supervise(&mut self, policy: Backoff) {
        self.sup.policy = Some(policy);
    }

    /// The restart policy in force, if any.
    pub fn restart_policy(&self) -> Option<Backoff> {
        self.sup.policy
    }

    /// Deaths, restarts, and the degraded and down time up to `now` (an
    /// interval still open counts until `now`), seconds.
    pub fn supervision(&self, now: f64) -> SupervisionCounters {
        let mut c = self.sup.counters;
        if let Some(t) = self.sup.degraded_since {
            c.degraded_s += (now - t).max(0.0);
        }
        if let Some(t) = self.sup.down_since {
            c.down_s += (now - t).max(0.0);
        }
        c
    }

    /// Every death so far, in order, with its rejoin if it came back.
    pub fn outages(&self) -> &[Outage] {
        &self.sup.outages
    }

    /// Workers dead now (restarting or not).
    pub fn dead_workers(&self) -> usize {
        self.sup.dead.len()
    }

    /// Whether worker `w` is live (not dead, not restarting).
    pub fn is_live(&self, w: WorkerRef) -> bool {
        !self.sup.dead.iter().any(|(x, _)| *x == w)
    }

    /// Whether some stage (encode, prefill, decode, or the aggregated
    /// replicas) has workers and none of them live: a server's `/health`
    /// says 503 while this holds.
    pub fn stage_down(&self) -> bool {
        let none_live = |n: usize, alive: &dyn Fn(usize) -> bool| n > 0 && !(0..n).any(alive);
        none_live(self.encode.len(), &|i| self.encode[i].alive)
            || none_live(self.prefill.len(), &|i| self.prefill[i].alive)
            || none_live(self.decode.len(), &|i| self.decode[i].alive)
            || none_live(self.replicas.len(), &|i| self.replicas[i].alive)
    }

    /// Worker `w` died at `now` for `reason` (its state is already torn
    /// down): count it, open its outage, and ask for a restart when a policy
    /// is set. `again`: it was dead already (a restart that failed).
    pub(super) fn note_death(&mut self, now: f64, w: WorkerRef, reason: &str, again: bool) {
        self.sup.counters.deaths += 1;
        if !again {
            self.sup.outages.push(Outage {
                worker: self.label(w).to_string(),
                died_at: now,
                reason: reason.to_string(),
                attempts: 0,
                back_at: None,
            });
            let k = self.sup.outages.len() - 1;
            self.sup.dead.push((w, k));
        }
        let down = self.stage_down();
        self.sup.account(now, down);
        let Some(policy) = self.sup.policy else {
            return;
        };
        let attempt = self.sup.attempt(w);
        if let Some(&(_, k)) = self.sup.dead.iter().find(|(x, _)| *x == w) {
            self.sup.outages[k].attempts += 1;
        }
        let delay_s = policy.delay(attempt);
        self.decide(|| Decision::Restart {
            at: now,
            worker: w,
            attempt,
            delay_s,
        });
        self.commands
            .push_back(Command::Restart { worker: w, delay_s });
    }

    /// Worker `w` rejoined at `now` (its state is already reset): close its
    /// outage.
    pub(super) fn note_rejoin(&mut self, now: f64, w: WorkerRef) {
        if let Some(pos) = self.sup.dead.iter().position(|(x, _)| *x == w) {
            let (_, k) = self.sup.dead.swap_remove(pos);
            self.sup.outages[k].back_at = Some(now);
        }
        self.sup.counters.restarts += 1;
        let down = self.stage_down();
        self.sup.account(now, down);
        self.decide(|| Decision::Rejoin { at: now, worker: w });
    }

    /// Worker `w` completed a unit of work: its next death starts the
    /// backoff over.
    #[inline]
    pub(super) fn worked(&mut self, w: WorkerRef) {
        if !self.sup.attempts.is_empty() {
            self.sup.attempts.retain(|(x, _)| *x != w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let b = Backoff::DEFAULT;
        let d: Vec<f64> = (1..=6).map(|n| b.delay(n)).collect();
        assert_eq!(d, [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]);
        assert_eq!(Backoff::starting_at(20.0).delay(3), 20.0);
    }
}
