//! SM sharing between an encode worker and a co-located local prefill worker
//! (EAServe §3.4).

use crate::SmPolicy;
use serde::{Deserialize, Serialize};

/// Default SM levels profiled for the dynamic split: five shares of the GPU's
/// SMs (EAServe §3.4 profiles "5 in our deployment").
pub const DEFAULT_SM_LEVELS: [f64; 5] = [0.2, 0.4, 0.6, 0.8, 1.0];

/// The smallest SM share either side of a split may hold: below it a pass
/// makes no progress that a run can wait for (the simulator stalls work
/// there), so `static:F` must leave both the encode pass and its co-located
/// prefill worker at least this much (F ∈ [0.001, 0.999]).
pub const MIN_SM_SHARE: f64 = 1e-3;

/// Default tolerance ε: a level is safe for a batch when encode latency there is
/// within `(1+ε)` of exclusive access. 10 % keeps encode near its exclusive
/// latency (the paper's "close to the exclusive-access baseline") while letting
/// small batches release most SMs.
pub const DEFAULT_SM_EPSILON: f64 = 0.10;

/// For each SM level (a share of the GPU's SMs, ascending), the largest encode
/// micro-batch whose latency at that level stays within `(1+ε)` of exclusive
/// access (0 = none).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SmTable {
    /// `(SM share, largest safe batch)`, ascending by share.
    pub levels: Vec<(f64, usize)>,
    /// The tolerance ε used to build it.
    pub epsilon: f64,
}

impl SmTable {
    /// Build the table from `latency(batch, share)` (seconds) for batches
    /// `1..=max_batch` at each of `levels` (shares in (0, 1]).
    pub fn build(
        levels: &[f64],
        max_batch: usize,
        epsilon: f64,
        latency: impl Fn(usize, f64) -> f64,
    ) -> Self {
        let mut lv: Vec<f64> = levels
            .iter()
            .copied()
            .filter(|f| *f > 0.0 && *f <= 1.0)
            .collect();
        lv.sort_by(f64::total_cmp);
        lv.dedup();
        if lv.last() != Some(&1.0) {
            lv.push(1.0);
        }
        let exclusive: Vec<f64> = (1..=max_batch).map(|b| latency(b, 1.0)).collect();
        let levels = lv
            .into_iter()
            .map(|share| {
                let safe = (1..=max_batch)
                    .take_while(|&b| latency(b, share) <= (1.0 + epsilon) * exclusive[b - 1])
                    .last()
                    .unwrap_or(0);
                (share, if share >= 1.0 { max_batch } else { safe })
            })
            .collect();
        SmTable { levels, epsilon }
    }

    /// The smallest SM share whose safe batch covers `batch`; the full GPU when
    /// none does.
    pub fn share_for(&self, batch: usize) -> f64 {
        self.levels
            .iter()
            .find(|(_, safe)| *safe >= batch)
            .map(|(share, _)| *share)
            .unwrap_or(1.0)
    }
}

/// The SM split in force on one encode GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum SmSplit {
    /// Time-slicing, no partition: both workers run on all SMs and slow each other.
    None,
    /// Encode always gets share `f`, local prefill `1 − f`.
    Static(f64),
    /// Encode gets the table's smallest safe share for each micro-batch; local
    /// prefill the rest, and every SM while encode is idle.
    Dynamic(SmTable),
}

impl SmSplit {
    /// Build the split for `policy`; `Dynamic` builds its table with
    /// [`DEFAULT_SM_LEVELS`] and [`DEFAULT_SM_EPSILON`].
    pub fn new(policy: &SmPolicy, max_batch: usize, latency: impl Fn(usize, f64) -> f64) -> Self {
        match *policy {
            SmPolicy::None => SmSplit::None,
            SmPolicy::Static(f) => SmSplit::Static(f),
            SmPolicy::Dynamic => SmSplit::Dynamic(SmTable::build(
                &DEFAULT_SM_LEVELS,
                max_batch,
                DEFAULT_SM_EPSILON,
                latency,
            )),
        }
    }

    /// SM share the encode pass of `batch` requests runs with; `None` under
    /// time-slicing (no partition: the pass competes for the whole GPU).
    pub fn encode_share(&self, batch: usize) -> Option<f64> {
        match self {
            SmSplit::None => None,
            SmSplit::Static(f) => Some(*f),
            SmSplit::Dynamic(t) => Some(t.share_for(batch)),
        }
    }

    /// A line for a report's notes naming a dynamic split's table
    /// (`20%→B≤1, …`); `None` for the other splits.
    pub fn table_note(&self) -> Option<String> {
        let SmSplit::Dynamic(t) = self else {
            return None;
        };
        let levels: Vec<String> = t
            .levels
            .iter()
            .map(|&(f, b)| {
                if b == 0 {
                    format!("{:.0}%→none", f * 100.0)
                } else {
                    format!("{:.0}%→B≤{b}", f * 100.0)
                }
            })
            .collect();
        Some(format!(
            "dynamic SM split: an encode pass of B requests takes the smallest share of the encode GPU's SMs at which it runs within {:.0} % of its time on all of them, the rest going to the co-located prefill worker (share → the largest B that runs there within that margin; `none`: not even one request, so that share is never used): {}",
            t.epsilon * 100.0,
            levels.join(", ")
        ))
    }

    /// SM share left to the local prefill worker while an encode pass of
    /// `encode_batch` runs (`None` = encode idle); `None` under time-slicing.
    pub fn prefill_share(&self, encode_batch: Option<usize>) -> Option<f64> {
        match (self, encode_batch) {
            (SmSplit::None, _) => None,
            (SmSplit::Static(f), _) => Some(1.0 - f),
            (SmSplit::Dynamic(_), None) => Some(1.0),
            (SmSplit::Dynamic(t), Some(b)) => Some(1.0 - t.share_for(b)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A knee-shaped latency: the batch needs `b/8` of the GPU.
    fn knee(b: usize, share: f64) -> f64 {
        let need = (b as f64 / 8.0).min(1.0);
        0.1 + 0.05 * b as f64 / share.min(need).max(1e-3) * need
    }

    #[test]
    fn table_levels_grow_with_share_and_cover_small_batches_with_few_sms() {
        let t = SmTable::build(&DEFAULT_SM_LEVELS, 8, 0.1, knee);
        assert_eq!(t.levels.len(), 5);
        let safes: Vec<usize> = t.levels.iter().map(|l| l.1).collect();
        assert!(safes.windows(2).all(|w| w[0] <= w[1]), "{safes:?}");
        assert_eq!(t.share_for(1), 0.2);
        assert_eq!(t.share_for(8), 1.0);
        assert!(t.share_for(3) <= t.share_for(6));
        let split = SmSplit::Dynamic(t);
        assert_eq!(split.prefill_share(None), Some(1.0));
        assert!((split.prefill_share(Some(1)).unwrap() - 0.8).abs() < 1e-12);
    }

    #[test]
    fn static_and_none() {
        let s = SmSplit::new(&SmPolicy::Static(0.5), 8, knee);
        assert_eq!(s.encode_share(1), Some(0.5));
        assert_eq!(s.prefill_share(None), Some(0.5));
        let n = SmSplit::new(&SmPolicy::None, 8, knee);
        assert_eq!(n.encode_share(4), None);
    }
}
