//! The `load` policy: thresholds on each stage's load, after Dynamo's
//! load-based planner (docs.nvidia.com/dynamo, "Load-based Planner"): it
//! watches the requests pending in the prefill queue and the decode
//! workers' mean KV cache use, compares them once per adjustment interval
//! with scale-up and scale-down thresholds, changes a stage by one worker at
//! most, and does nothing while an adjustment is under way. Dynamo has no
//! encode stage; here the encode queue is watched as the prefill queue is.
//!
//! The rule, per window (the interval):
//! * a stage is *hot* when its queue per active worker is above
//!   `queue_up` (encode, prefill) or its KV use is above `kv_up` (decode);
//!   *cold* when its queue per worker is below `queue_down` and (decode)
//!   its KV use below `kv_down`;
//! * the hottest stage (largest ratio of signal to threshold) gains a
//!   worker: on spare GPUs if the cluster has them, else by a role change
//!   from a cold stage (the coldest); a cold stage with no hot one loses a
//!   worker when the cluster has more than one per stage;
//! * one worker moves per window at most; the gap between the up and down
//!   thresholds is the hysteresis, the dwell time the rest.
//!
//! With `busy` thresholds given ([`BusyRule`], `planner.busy_up` and
//! `planner.busy_down`), an encode or prefill stage is also hot when its
//! workers were busy more than `up` of the window, and cold only when they
//! were busy less than `down` as well: a stage is scaled on its load before
//! a queue forms, the way a Kubernetes HorizontalPodAutoscaler scales on a
//! target utilization. Decode keeps its KV signal (a decode run of one
//! request keeps its worker busy).
//!
//! The queue is the one at the window's end ([`QueueSignal::End`], the
//! default) or its mean over the window ([`QueueSignal::Mean`]: the
//! controller's integral of the queue over the window's length, so one
//! request caught waiting at the window's end does not make a stage hot).

use super::{Planner, StageView};
use serde::{Deserialize, Serialize};

/// Which queue the `load` rule compares with its thresholds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueSignal {
    /// The queue at the window's end (the default, the rule as the module
    /// doc gives it): at low load one request caught waiting at that
    /// instant makes a stage hot.
    #[default]
    End,
    /// The queue averaged over the window (its time integral over the
    /// window's length, [`crate::StageLoad::queued_s`]): a stage is hot
    /// when requests waited there through the window, not at one instant.
    Mean,
}

impl std::str::FromStr for QueueSignal {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "end" => Ok(QueueSignal::End),
            "mean" => Ok(QueueSignal::Mean),
            _ => Err(format!(
                "unknown queue signal `{s}`; allowed: end (the queue at the window's end), mean (averaged over the window)"
            )),
        }
    }
}

/// The `load` policy's thresholds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadRule {
    /// Requests queued per active worker above which an encode or prefill
    /// stage gains a worker.
    pub queue_up: f64,
    /// Requests queued per active worker below which it may lose one.
    pub queue_down: f64,
    /// Decode KV cache use above which decode gains a worker.
    pub kv_up: f64,
    /// Decode KV cache use below which it may lose one.
    pub kv_down: f64,
    /// The queue compared with `queue_up` and `queue_down`.
    #[serde(default)]
    pub signal: QueueSignal,
    /// Busy-fraction thresholds of the encode and prefill stages (absent:
    /// not watched).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy: Option<BusyRule>,
}

/// The `load` policy's busy-fraction thresholds: an encode or prefill
/// stage whose workers were busy more than `up` of the window (its busy
/// worker-seconds in the window over the window times the workers active
/// at its end, [`super::StageView::busy`], at most 1) is hot; one busy
/// less than `down` may shrink. `0 ≤ down < up < 1`
/// ([`super::PlannerConfig::check`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BusyRule {
    /// Busy fraction above which the stage gains a worker.
    pub up: f64,
    /// Busy fraction below which it may lose one.
    pub down: f64,
}

impl Default for LoadRule {
    /// Dynamo's load planner's documented defaults (its planner guide,
    /// `--prefill-queue-scale-up-threshold` 0.5 and
    /// `--prefill-queue-scale-down-threshold` 0.2 queued requests per
    /// prefill worker, `--decode-kv-scale-up-threshold` 0.9 and
    /// `--decode-kv-scale-down-threshold` 0.5 KV cache utilization).
    fn default() -> Self {
        LoadRule {
            queue_up: 0.5,
            queue_down: 0.2,
            kv_up: 0.9,
            kv_down: 0.5,
            signal: QueueSignal::End,
            busy: None,
        }
    }
}

impl LoadRule {
    /// How hot stage `k` is (its signal over its up threshold: > 1 hot), and
    /// whether it is cold.
    fn heat(&self, k: usize, v: &StageView) -> (f64, bool) {
        let queue = match (self.signal, v.queue_mean_per_worker) {
            (QueueSignal::Mean, Some(q)) => q,
            _ => v.queue_per_worker,
        };
        if k == 2 {
            (
                (v.kv_used / self.kv_up).max(queue / self.queue_up),
                v.kv_used < self.kv_down && queue < self.queue_down,
            )
        } else {
            let (heat, cold) = (queue / self.queue_up, queue < self.queue_down);
            match self.busy {
                Some(b) => (heat.max(v.busy / b.up), cold && v.busy < b.down),
                None => (heat, cold),
            }
        }
    }

    /// The workers per stage the rule asks for, `None` for no change.
    pub(super) fn target(&self, p: &Planner, views: &[StageView; 3]) -> Option<[u32; 3]> {
        let now = p.counts();
        let heat: Vec<(f64, bool)> = (0..3).map(|k| self.heat(k, &views[k])).collect();
        let hot = (0..3)
            .filter(|&k| heat[k].0 > 1.0)
            .max_by(|&a, &b| heat[a].0.total_cmp(&heat[b].0));
        let mut colds: Vec<usize> = (0..3).filter(|&k| heat[k].1).collect();
        colds.sort_by(|&a, &b| heat[a].0.total_cmp(&heat[b].0));
        if let Some(h) = hot {
            let mut add = now;
            add[h] += 1;
            if p.feasible(add) {
                return Some(add);
            }
            return colds.iter().find_map(|&c| {
                let mut t = add;
                t[c] = t[c].checked_sub(1)?;
                p.feasible(t).then_some(t)
            });
        }
        colds.iter().find_map(|&c| {
            let mut t = now;
            t[c] = t[c].checked_sub(1)?;
            p.feasible(t).then_some(t)
        })
    }
}
