//! Placement across the replicas of one stage.

use crate::mintree::MinTree;

/// Least-outstanding-work placement: each new piece of work goes to the replica
/// with the least work assigned and not yet completed (ties → lowest index).
/// The unit of work is the caller's (requests, tokens, estimated seconds).
/// A retired replica (one that died) gets no more work while any other is left.
/// A choice takes `O(log replicas)` (a tournament tree over the live
/// replicas' outstanding work), not a scan over them.
///
/// Built with [`LeastOutstanding::round_robin`] it places in turn instead,
/// ignoring the work outstanding (it still counts it).
#[derive(Clone, Debug)]
pub struct LeastOutstanding {
    outstanding: Vec<f64>,
    retired: Vec<bool>,
    /// Replicas not retired.
    live: usize,
    /// Each live replica's outstanding work; a retired one's is infinite.
    least: MinTree,
    /// Round robin: the replica whose turn is next.
    turn: Option<usize>,
}

impl LeastOutstanding {
    /// Placement over `replicas` replicas (≥ 1).
    pub fn new(replicas: usize) -> Self {
        let n = replicas.max(1);
        let mut least = MinTree::new(n);
        for i in 0..n {
            least.set(i, 0.0);
        }
        LeastOutstanding {
            outstanding: vec![0.0; n],
            retired: vec![false; n],
            live: n,
            least,
            turn: None,
        }
    }

    /// Placement in turn over `replicas` replicas (≥ 1), skipping retired
    /// ones while any other is live: EPD-Serve's encode `request_allocator`
    /// (`epdserve/engine_encoding.py`).
    pub fn round_robin(replicas: usize) -> Self {
        LeastOutstanding {
            turn: Some(0),
            ..LeastOutstanding::new(replicas)
        }
    }

    /// Choose a replica for `work` and add it to that replica's outstanding
    /// work: the live replica with the least, or, when every replica is
    /// retired, the one with the least (the caller then fails the work).
    pub fn assign(&mut self, work: f64) -> usize {
        let all_retired = self.live == 0;
        let pick = if let Some(turn) = self.turn {
            let n = self.outstanding.len();
            let pick = (0..n)
                .map(|k| (turn + k) % n)
                .find(|&r| all_retired || !self.retired[r])
                .unwrap_or(turn % n);
            self.turn = Some((pick + 1) % n);
            pick
        } else if all_retired {
            // rare (the caller fails the work): the least over all
            let mut best = 0;
            for (i, w) in self.outstanding.iter().enumerate() {
                if *w < self.outstanding[best] {
                    best = i;
                }
            }
            best
        } else {
            self.least.min().map_or(0, |(i, _)| i)
        };
        self.add(pick, work);
        pick
    }

    /// Replica `replica` died: no more work goes to it while another is live.
    pub fn retire(&mut self, replica: usize) {
        if let Some(r) = self.retired.get_mut(replica) {
            if !*r {
                *r = true;
                self.live -= 1;
                self.least.set(replica, f64::INFINITY);
            }
        }
    }

    /// Replica `replica` takes work again, with none outstanding: a dead
    /// worker restarted, or a standby or drained worker a planner started
    /// ([`crate::controller::Change`]).
    pub fn revive(&mut self, replica: usize) {
        if let Some(r) = self.retired.get_mut(replica) {
            if *r {
                *r = false;
                self.live += 1;
            }
            self.set(replica, 0.0);
        }
    }

    /// Whether replica `replica` takes no work (it died, stands by or drains).
    pub fn is_retired(&self, replica: usize) -> bool {
        self.retired.get(replica).copied().unwrap_or(true)
    }

    /// Whether some replica is not retired.
    pub fn has_live(&self) -> bool {
        self.live > 0
    }

    /// `work` assigned to `replica` has completed.
    pub fn complete(&mut self, replica: usize, work: f64) {
        let w = (self.outstanding[replica] - work).max(0.0);
        self.set(replica, w);
    }

    /// Add `work` to replica `replica`'s outstanding work (a placement
    /// decided elsewhere, e.g. by a cache-aware router).
    pub fn add(&mut self, replica: usize, work: f64) {
        let w = self.outstanding[replica] + work;
        self.set(replica, w);
    }

    /// Replica `replica`'s outstanding work is `w`.
    fn set(&mut self, replica: usize, w: f64) {
        self.outstanding[replica] = w;
        if !self.retired[replica] {
            self.least.set(replica, w);
        }
    }

    /// Whether work may go to `replica`: it is live, or every replica is
    /// retired (the caller then fails the work).
    pub fn is_open(&self, replica: usize) -> bool {
        !self.retired[replica] || self.live == 0
    }

    /// Outstanding work per replica.
    pub fn outstanding(&self) -> &[f64] {
        &self.outstanding
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retired_replica_gets_no_work_while_another_is_live() {
        let mut p = LeastOutstanding::new(2);
        assert_eq!(p.assign(5.0), 0);
        p.retire(1);
        // replica 1 has less outstanding work but is retired
        assert_eq!(p.assign(1.0), 0);
        p.retire(0);
        // all retired: the least loaded, for the caller to fail
        assert_eq!(p.assign(1.0), 1);
    }

    #[test]
    fn round_robin_takes_turns_and_skips_the_retired() {
        let mut p = LeastOutstanding::round_robin(3);
        let picks: Vec<usize> = (0..4).map(|_| p.assign(1.0)).collect();
        assert_eq!(picks, [0, 1, 2, 0]);
        p.retire(1);
        assert_eq!((p.assign(9.0), p.assign(1.0)), (2, 0));
    }

    #[test]
    fn balances_and_tracks_completion() {
        let mut p = LeastOutstanding::new(3);
        assert_eq!(p.assign(5.0), 0);
        assert_eq!(p.assign(1.0), 1);
        assert_eq!(p.assign(1.0), 2);
        assert_eq!(p.assign(1.0), 1);
        p.complete(0, 5.0);
        assert_eq!(p.assign(1.0), 0);
        assert_eq!(p.outstanding(), &[1.0, 2.0, 1.0]);
    }
}
