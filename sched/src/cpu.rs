//! How the cores of one CPU host are given to the workers of a run on the
//! `cpu` device, where every "GPU" is the same host: the rule `easerve exec`
//! starts its worker processes by, and the simulator prices core sharing
//! with (`easerve-sim`'s host-cores term), so the two cannot drift.
//!
//! * An encode worker and a local prefill worker **own the host**: each of
//!   their ranks gets `cores / tp` threads (a CPU "device" as `easerve
//!   profile` measures it, SM level 1.0 = every core), and a pass at SM
//!   share `f` runs on [`pass_threads`] of them.
//! * The others (remote prefill, decode, aggregated replicas) **share** it:
//!   every rank gets `cores / ranks` threads, `ranks` the ranks of all such
//!   workers of the deployment (a TP k worker counts k), at least 1.
//! * A spare a planner starts later ([`start_threads`]) gets the same share
//!   counting itself, but no more than the cores the running ranks leave
//!   free; a worker started by a role change takes the stopped one's threads.
//!
//! Nothing here is a scheduling decision: it sizes processes.

use crate::{Worker, WorkerRef};

/// What the thread rule needs of one worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuSlot {
    /// An encode worker or a local prefill worker (it owns the host's cores).
    pub owns_host: bool,
    /// Rank processes (its TP degree, at least 1).
    pub ranks: usize,
    /// A spare slot not started at first.
    pub standby: bool,
}

impl CpuSlot {
    /// The slot of worker `wref` (`local`: a prefill worker co-located on an
    /// encode device) of TP `tp`.
    pub fn new(wref: WorkerRef, local: bool, tp: usize, standby: bool) -> CpuSlot {
        CpuSlot {
            owns_host: matches!(wref, WorkerRef::Encode(_)) || local,
            ranks: tp.max(1),
            standby,
        }
    }

    /// The slot of a worker of the topology.
    pub fn of(w: &Worker) -> CpuSlot {
        CpuSlot::new(w.wref, w.local, w.tp as usize, w.standby)
    }
}

/// CPU threads of each rank of every worker at the run's start, in the order
/// of `slots`, on a host of `cores` cores: `fixed` when given (`--threads`),
/// else the rule of the module doc. Standby slots get the figure they would
/// have, but do not count among the sharing ranks.
pub fn worker_threads(slots: &[CpuSlot], cores: usize, fixed: Option<usize>) -> Vec<usize> {
    let sharing: usize = slots
        .iter()
        .filter(|s| !s.standby && !s.owns_host)
        .map(|s| s.ranks)
        .sum();
    slots
        .iter()
        .map(|s| match fixed {
            Some(t) => t,
            None if s.owns_host => (cores / s.ranks).max(1),
            None => (cores / sharing.max(1)).max(1),
        })
        .collect()
}

/// CPU threads of each rank of a spare slot of TP `tp` started while the run
/// goes on, on a host of `cores` cores where the sharing ranks running now
/// hold `held` threads among `ranks` ranks: the even share counting itself,
/// `cores / (ranks + tp)`, but no more than the cores they leave free,
/// `(cores − held) / tp` (running processes keep the threads they started
/// with), and at least 1 (a process needs one).
pub fn spare_threads(cores: usize, held: usize, ranks: usize, tp: usize) -> usize {
    let tp = tp.max(1);
    let share = cores / (ranks + tp);
    let free = cores.saturating_sub(held) / tp;
    share.min(free).max(1)
}

/// CPU threads of each rank of `slot`, started while the workers of
/// `running` (each with its threads per rank) run: every core for a slot
/// that owns the host, else [`spare_threads`] over the running sharing ranks.
pub fn start_threads(
    slot: CpuSlot,
    running: impl IntoIterator<Item = (CpuSlot, usize)>,
    cores: usize,
) -> usize {
    if slot.owns_host {
        return cores;
    }
    let (held, ranks) = running
        .into_iter()
        .filter(|(s, _)| !s.owns_host)
        .fold((0, 0), |(h, r), (s, t)| (h + t * s.ranks, r + s.ranks));
    spare_threads(cores, held, ranks, slot.ranks)
}

/// Threads a pass at SM share `share` runs on, of a worker rank's `threads`:
/// `round(threads · share)`, within `1..=threads`.
pub fn pass_threads(threads: usize, share: f64) -> usize {
    ((threads as f64 * share).round() as usize).clamp(1, threads.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_take_the_host_and_the_others_share_it() {
        let e = CpuSlot::new(WorkerRef::Encode(0), false, 1, false);
        let l = CpuSlot::new(WorkerRef::Prefill(1), true, 1, false);
        let p = CpuSlot::new(WorkerRef::Prefill(0), false, 2, false);
        let d = CpuSlot::new(WorkerRef::Decode(0), false, 1, false);
        let spare = CpuSlot::new(WorkerRef::Decode(1), false, 1, true);
        // 16 cores: the owners 16 each; P (2 ranks) and D share 16 / 3
        let t = worker_threads(&[e, l, p, d, spare], 16, None);
        assert_eq!(t, vec![16, 16, 5, 5, 5]);
        // 2 cores, three sharing ranks: at least one thread each
        assert_eq!(worker_threads(&[e, p, d], 2, None), vec![2, 1, 1]);
        assert_eq!(worker_threads(&[e, p], 2, Some(3)), vec![3, 3]);
        // a spare decode worker started beside E and P (2 ranks holding 10
        // of 16 cores): its share 16 / 3; beside P and D, the one core free
        assert_eq!(start_threads(d, [(e, 16), (p, 5)], 16), 5);
        assert_eq!(start_threads(d, [(e, 16), (p, 5), (d, 5)], 16), 1);
        assert_eq!(start_threads(e, [(p, 5)], 16), 16);
    }

    #[test]
    fn a_started_spare_takes_the_free_cores_at_most_its_share() {
        // 16 cores, two running ranks of 4 threads: its share 16/3 = 5,
        // 8 free
        assert_eq!(spare_threads(16, 8, 2, 1), 5);
        // the running ranks hold 15 of 16: the one free core
        assert_eq!(spare_threads(16, 15, 3, 1), 1);
        // a TP2 spare: per rank, its share 16/(2+2) = 4, 8 free over 2
        assert_eq!(spare_threads(16, 8, 2, 2), 4);
        // no core free: one thread (a process needs one)
        assert_eq!(spare_threads(2, 2, 2, 1), 1);
        // never more than the cores left free, where a core is free
        for cores in 1..=32 {
            for ranks in 0..8 {
                for held in ranks..=cores {
                    let t = spare_threads(cores, held, ranks, 1);
                    assert!(held + t <= cores || (held == cores && t == 1));
                }
            }
        }
    }

    #[test]
    fn a_pass_runs_on_its_share_of_the_threads() {
        assert_eq!(pass_threads(2, 0.5), 1);
        assert_eq!(pass_threads(2, 1.0), 2);
        assert_eq!(pass_threads(2, 0.1), 1);
        assert_eq!(pass_threads(16, 0.6), 10);
        assert_eq!(pass_threads(0, 1.0), 1);
    }
}
