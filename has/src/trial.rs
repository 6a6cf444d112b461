//! Trials: one end-to-end run of a candidate deployment. The simulator
//! implements [`Trial`] now; the real executor plugs in through the same trait.

use crate::space::{validate, Candidate};
use easerve_workload::scenario::{Overrides, ScenarioFile};
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;

/// What one trial measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// Completed requests per second.
    pub throughput: f64,
    /// Mean TTFT, seconds.
    pub mean_ttft: f64,
    /// Mean TPOT, seconds.
    pub mean_tpot: f64,
    /// False when the candidate could not be deployed (then throughput is 0).
    pub feasible: bool,
}

impl Outcome {
    /// An undeployable candidate.
    pub fn infeasible() -> Self {
        Outcome {
            throughput: 0.0,
            mean_ttft: f64::INFINITY,
            mean_tpot: f64::INFINITY,
            feasible: false,
        }
    }

    /// The paper's ranking (EAServe §3.1): throughput first (higher is better),
    /// then mean TTFT, then mean TPOT (lower is better). `Greater` = better.
    pub fn rank(&self, other: &Outcome) -> Ordering {
        self.throughput
            .total_cmp(&other.throughput)
            .then_with(|| other.mean_ttft.total_cmp(&self.mean_ttft))
            .then_with(|| other.mean_tpot.total_cmp(&self.mean_tpot))
    }
}

/// Runs candidates end to end at the search's target rate.
pub trait Trial: Sync {
    /// Deploy `c`, drive the workload, measure.
    fn run(&self, c: &Candidate) -> Outcome;
}

/// Trials on the simulator: the scenario with the candidate's allocation, B
/// and s (and the search's rate, seed and request count) applied.
pub struct SimTrial {
    raw: ScenarioFile,
    file: String,
    base: Overrides,
}

impl SimTrial {
    /// Trials of the scenario `raw` (read from `file`) with `base` overrides
    /// (rate, seed, requests) applied to every run.
    pub fn new(raw: ScenarioFile, file: &str, base: Overrides) -> Self {
        SimTrial {
            raw,
            file: file.to_string(),
            base,
        }
    }
}

impl Trial for SimTrial {
    fn run(&self, c: &Candidate) -> Outcome {
        let Some(sc) = validate(&self.raw, &self.file, &c.overrides(&self.base)) else {
            return Outcome::infeasible();
        };
        let r = easerve_sim::simulate(&sc).report;
        Outcome {
            throughput: r.request_throughput,
            mean_ttft: r.ttft.mean,
            mean_tpot: r.tpot.mean,
            feasible: true,
        }
    }
}
