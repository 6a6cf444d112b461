//! Placement across the replicas of one stage.

/// Least-outstanding-work placement: each new piece of work goes to the replica
/// with the least work assigned and not yet completed (ties → lowest index).
/// The unit of work is the caller's (requests, tokens, estimated seconds).
#[derive(Clone, Debug)]
pub struct LeastOutstanding {
    outstanding: Vec<f64>,
}

impl LeastOutstanding {
    /// Placement over `replicas` replicas (≥ 1).
    pub fn new(replicas: usize) -> Self {
        LeastOutstanding {
            outstanding: vec![0.0; replicas.max(1)],
        }
    }

    /// Choose a replica for `work` and add it to that replica's outstanding work.
    pub fn assign(&mut self, work: f64) -> usize {
        let mut best = 0;
        for (i, w) in self.outstanding.iter().enumerate() {
            if *w < self.outstanding[best] {
                best = i;
            }
        }
        self.outstanding[best] += work;
        best
    }

    /// `work` assigned to `replica` has completed.
    pub fn complete(&mut self, replica: usize, work: f64) {
        let w = &mut self.outstanding[replica];
        *w = (*w - work).max(0.0);
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
