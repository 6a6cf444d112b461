//! The baselines' own configuration rules, run over the allocations HAS sees
//! ([`crate::feasible_allocations`]), so each system is compared at its own
//! best configuration (`easerve search --system epd-serve|hydrainfer`).
//!
//! Both repositories pick a configuration the same way: run each candidate
//! over a ladder of offered rates, measure the share of requests meeting the
//! SLO at each, and keep the candidate whose attainment stays at 90 % up to
//! the highest rate (its goodput):
//!
//! * EPD-Serve's optimizer (github.com/vbdi/epdserve 9b111f7,
//!   `epdserve/resource_allocation.py`, `ResourceAllocatorSimulator`)
//!   enumerates every split of the GPUs into encode, prefill and decode
//!   instances, simulates each at rates 0.25–3 req/s and interpolates the
//!   rate of 90 % attainment. Its batch sizes are launch flags
//!   (`--encoding-max-batch-size`, default 2), not searched there; the rule
//!   here also tries B ∈ [`EPD_SERVE_BATCHES`], as the EAServe paper takes
//!   each system at its best configuration. Candidates: every allocation
//!   with prefill workers, s = 1.
//! * HydraInfer (github.com/dongxianzhe/hydrainfer,
//!   `evaluation/slo_attainment/generate_methods.py` and `evaluation.sh`,
//!   `benchmark/performance_analyzer.py` `select_best_method`) enumerates
//!   every disaggregation method and instance count, benchmarks each at 1–12
//!   req/s and keeps the highest goodput at 90 % attainment. Candidates: the
//!   E+P+D form (allocations with prefill workers, s = 1) and the EP+D form
//!   (none, s = 0, where prefill fits beside the encoder); its budgets, not
//!   B, bound its batches. ED+P is not modelled (README).
//!
//! One rule serves both here: the ladder is EPD-Serve's rates scaled so its
//! top is the target rate Λ ([`LADDER`]), the tier is the scenario's
//! `moderate` one (its middle tier without one, [`rule_tier`]), and goodput
//! is the highest rung still at [`ATTAINMENT_TARGET`], interpolated linearly
//! to where the attainment crosses it on the way to the next rung (0 when no
//! rung reaches it). Ties go by the outcome at Λ ([`Outcome::rank`]).

use crate::space::{Candidate, FeasibleAllocation};
use crate::trial::{Outcome, Trial};
use crate::{Method, SearchConfig};
use easerve_workload::Scenario;
use rayon::prelude::*;

/// SLO attainment both rules hold a candidate to.
pub const ATTAINMENT_TARGET: f64 = 0.9;

/// The rates of the ladder as fractions of the target rate: EPD-Serve's
/// optimizer's 0.25, 0.5, 1, 1.5, 2, 2.25, 2.5 and 3 req/s over 3 req/s.
pub const LADDER: [f64; 8] = [
    0.25 / 3.0,
    0.5 / 3.0,
    1.0 / 3.0,
    1.5 / 3.0,
    2.0 / 3.0,
    2.25 / 3.0,
    2.5 / 3.0,
    1.0,
];

/// Encode batch bounds the EPD-Serve rule tries (its repository's default
/// `--encoding-max-batch-size` is 2).
pub const EPD_SERVE_BATCHES: [u32; 4] = [1, 2, 4, 8];

/// The SLO tier both rules count attainment in: `moderate`, else the
/// scenario's middle tier.
pub fn rule_tier(sc: &Scenario) -> usize {
    sc.slo
        .iter()
        .position(|t| t.name == "moderate")
        .unwrap_or(sc.slo.len() / 2)
}

/// The candidates of `method`'s rule over `space`.
pub fn candidates(space: &[FeasibleAllocation], method: Method) -> Vec<Candidate> {
    let with_remote = space
        .iter()
        .filter(|f| f.allocation.prefill.workers > 0 && f.offload_range.1 >= 1.0);
    match method {
        Method::EpdServe => with_remote
            .flat_map(|f| {
                EPD_SERVE_BATCHES.iter().map(|&batch| Candidate {
                    allocation: f.allocation,
                    batch,
                    offload: 1.0,
                    groups: f.groups.clone(),
                })
            })
            .collect(),
        Method::HydraInfer => {
            let e_p_d = with_remote.map(|f| (f, 1.0));
            let ep_d = space
                .iter()
                .filter(|f| f.allocation.prefill.workers == 0 && f.local_workers > 0)
                .map(|f| (f, 0.0));
            e_p_d
                .chain(ep_d)
                .map(|(f, offload)| Candidate {
                    allocation: f.allocation,
                    batch: 1,
                    offload,
                    groups: f.groups.clone(),
                })
                .collect()
        }
        _ => Vec::new(),
    }
}

/// Goodput of an attainment curve over ascending `rates`: the highest rate
/// whose attainment is at least [`ATTAINMENT_TARGET`], moved toward the next
/// rate to where the curve crosses the target; 0 when no rate reaches it.
pub fn goodput(rates: &[f64], attainment: &[f64]) -> f64 {
    let mut g = 0.0;
    for (k, (&r, &a)) in rates.iter().zip(attainment).enumerate() {
        if a < ATTAINMENT_TARGET {
            continue;
        }
        g = r;
        if let (Some(&r2), Some(&a2)) = (rates.get(k + 1), attainment.get(k + 1)) {
            if a2 < ATTAINMENT_TARGET {
                g = r + (r2 - r) * (a - ATTAINMENT_TARGET) / (a - a2);
            }
        }
    }
    g
}

/// Run `cfg.method`'s rule: every candidate at every rung of the ladder up
/// to `cfg.rate`, in parallel; each candidate's outcome at the target rate
/// with its goodput, in candidate order.
pub fn evaluate(
    sc: &Scenario,
    space: &[FeasibleAllocation],
    cfg: &SearchConfig,
    trial: &dyn Trial,
) -> Vec<(Candidate, Outcome)> {
    let tier = rule_tier(sc);
    let rates: Vec<f64> = LADDER.iter().map(|f| f * cfg.rate).collect();
    candidates(space, cfg.method)
        .into_par_iter()
        .map(|c| {
            let runs: Vec<Outcome> = rates.iter().map(|&r| trial.run_at(&c, r, tier)).collect();
            let att: Vec<f64> = runs.iter().map(|o| o.attainment.unwrap_or(0.0)).collect();
            let mut at_target = runs.last().cloned().unwrap_or_else(Outcome::infeasible);
            at_target.goodput = at_target.feasible.then(|| goodput(&rates, &att));
            (c, at_target)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goodput_is_the_last_rate_at_the_target_interpolated_to_its_crossing() {
        let rates = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(goodput(&rates, &[1.0, 1.0, 1.0, 0.95]), 4.0);
        // 0.95 at 2, 0.85 at 3: crosses 0.9 half way
        assert!((goodput(&rates, &[1.0, 0.95, 0.85, 0.2]) - 2.5).abs() < 1e-12);
        assert_eq!(goodput(&rates, &[0.5, 0.4, 0.1, 0.0]), 0.0);
    }
}
