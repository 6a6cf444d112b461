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
    /// Fraction of completed requests meeting every bound of the SLO tier
    /// the trial was asked about ([`Trial::run_at`]); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attainment: Option<f64>,
    /// Goodput by a baseline's own rule ([`crate::own`]): the highest rate,
    /// requests/s, its SLO attainment reaches the target at; absent for the
    /// searches that rank by throughput.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput: Option<f64>,
    /// Requests/s meeting both bounds of the tier the search ranks by
    /// ([`crate::Objective::Goodput`]); absent for other objectives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo_goodput: Option<f64>,
    /// On node groups whose every group has `cost_per_gpu_hour`: what the
    /// candidate's GPUs cost per hour ([`crate::space::hourly_cost`] of its
    /// stage groups), in the groups' currency; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_per_hour: Option<f64>,
}

impl Outcome {
    /// An undeployable candidate.
    pub fn infeasible() -> Self {
        Outcome {
            throughput: 0.0,
            mean_ttft: f64::INFINITY,
            mean_tpot: f64::INFINITY,
            feasible: false,
            attainment: None,
            goodput: None,
            slo_goodput: None,
            cost_per_hour: None,
        }
    }

    /// The paper's ranking (EAServe §3.1): throughput first (higher is better),
    /// then mean TTFT, then mean TPOT (lower is better). `Greater` = better.
    /// Outcomes that both carry a goodput ([`crate::own`]) rank by it first.
    pub fn rank(&self, other: &Outcome) -> Ordering {
        let goodput = match (self.goodput, other.goodput) {
            (Some(a), Some(b)) => a.total_cmp(&b),
            _ => Ordering::Equal,
        };
        goodput
            .then_with(|| self.throughput.total_cmp(&other.throughput))
            .then_with(|| other.mean_ttft.total_cmp(&self.mean_ttft))
            .then_with(|| other.mean_tpot.total_cmp(&self.mean_tpot))
    }
}

/// Runs candidates end to end at the search's target rate.
pub trait Trial: Sync {
    /// Deploy `c`, drive the workload, measure.
    fn run(&self, c: &Candidate) -> Outcome;
    /// The same at offered rate `rate` (requests/s) instead of the search's,
    /// with the attainment of SLO tier `tier` (an index into the scenario's
    /// tiers): for a rule that sweeps the rate ([`crate::own`]).
    fn run_at(&self, c: &Candidate, rate: f64, tier: usize) -> Outcome;
}

/// Trials on the simulator: the scenario with the candidate's allocation, B
/// and s (and the search's rate, seed and request count) applied.
pub struct SimTrial {
    raw: ScenarioFile,
    file: String,
    base: Overrides,
    /// The tier whose goodput each run reports ([`SimTrial::scoring`]).
    tier: Option<usize>,
}

impl SimTrial {
    /// Trials of the scenario `raw` (read from `file`) with `base` overrides
    /// (rate, seed, requests) applied to every run.
    pub fn new(raw: ScenarioFile, file: &str, base: Overrides) -> Self {
        SimTrial {
            raw,
            file: file.to_string(),
            base,
            tier: None,
        }
    }

    /// The same trials reporting the goodput of SLO tier `tier` (an index
    /// into the scenario's tiers; [`crate::Objective::tier`]) as
    /// [`Outcome::slo_goodput`].
    pub fn scoring(mut self, tier: Option<usize>) -> Self {
        self.tier = tier;
        self
    }

    /// Simulate `c` with `base` overrides, and its outcome, with the
    /// attainment of tier `tier` when given.
    fn simulate(&self, c: &Candidate, base: &Overrides, tier: Option<usize>) -> Outcome {
        let Some(sc) = validate(&self.raw, &self.file, &c.overrides(base)) else {
            return Outcome::infeasible();
        };
        let r = easerve_sim::simulate(&sc).report;
        Outcome {
            throughput: r.request_throughput,
            mean_ttft: r.ttft.mean,
            mean_tpot: r.tpot.mean,
            feasible: true,
            attainment: tier.map(|t| r.goodput.get(t).map_or(0.0, |g| g.attainment)),
            goodput: None,
            slo_goodput: self
                .tier
                .map(|t| r.goodput.get(t).map_or(0.0, |g| g.goodput)),
            cost_per_hour: crate::space::stage_assignments(&sc.raw)
                .first()
                .and_then(|g| crate::space::hourly_cost(&sc.raw, g)),
        }
    }
}

impl Trial for SimTrial {
    fn run(&self, c: &Candidate) -> Outcome {
        self.simulate(c, &self.base, None)
    }

    fn run_at(&self, c: &Candidate, rate: f64, tier: usize) -> Outcome {
        let base = Overrides {
            rate: Some(rate),
            ..self.base.clone()
        };
        self.simulate(c, &base, Some(tier))
    }
}
