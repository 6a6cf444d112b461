//! Capacity planning on the simulator: the highest offered rate a cluster
//! sustains under an SLO tier, and the fewest GPUs that sustain a given rate.
//!
//! A rate *meets* the goal `(tier, attain)` when the tier's goodput (requests
//! meeting both its TTFT and TPOT bounds, per second of the run, t = 0 to the
//! last completion) is at least `attain ×` the offered rate. Dividing by the
//! run's duration is what makes this a sustained rate: a cluster that falls
//! behind drains its queue after the last arrival, and the drain lowers the
//! goodput even when every request met its bounds (counting good requests
//! alone would pass a short burst the cluster cannot sustain). The verdict of
//! one run carries its sampling noise (about `1/√requests` in the arrival
//! rate) and a drain of about one E2E latency even at light load, so runs need
//! the scenario's hundreds of requests, not tens. Each probe is one simulated
//! run of the
//! scenario (its seed, its request count) at that rate, on its deployment or,
//! with [`Tuning::Has`], on the deployment a HAS search at that rate chooses.
//!
//! * [`Planner::max_rate`]: from the scenario's rate, double (or halve) until
//!   the goal's verdict flips, then bisect geometrically until the bracket
//!   `[meets, fails]` is narrower than the tolerance. Each run's cost model
//!   also estimates the rate at which its busiest stage is fully loaded; the
//!   search jumps to that estimate when it is more than a doubling (or
//!   halving) away, and never probes above [`CAPACITY_MARGIN`] × it, so the
//!   cluster, not the scenario's rate, bounds the probes. Goodput need not be
//!   monotone in the rate (a run is one sample); the answer is the highest
//!   probed rate that met the goal below the lowest one that failed above it,
//!   and the probes are returned so the user can see the shape.
//! * [`Planner::fewest_gpus`]: the smallest cluster size that fits the model
//!   (doubling, then bisecting, on a fit check that runs nothing), then sizes
//!   doubling from it, each tuned by HAS at the target rate, until one meets
//!   the goal (then bisecting down to the fewest that met), `--max-gpus` is
//!   reached, or a doubling brings neither goodput nor throughput up by
//!   [`MIN_GAIN`]; "not met up to N GPUs" is an answer too.
//! * [`Planner::compare_gpus`]: GPU types side by side, each with the
//!   highest rate of [`Planner::max_rate`], at the scenario's GPU count and,
//!   given prices per GPU-hour, at the scenario cluster's hourly cost.

use crate::space::FeasibleAllocation;
use easerve_workload::scenario::{num, Overrides, Scenario, ScenarioError, ScenarioFile, MAX_RATE};
use easerve_workload::Report;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Rates probed at most, as a multiple of the highest capacity the probes'
/// cost model estimated for the cluster (the rate at which its busiest stage
/// is fully loaded), and never above the scenario bound [`MAX_RATE`] (the
/// only bound when no probe has an estimate): a cluster that meets the goal
/// there is reported as not the limit, not searched on.
pub const CAPACITY_MARGIN: f64 = 16.0;

/// Relative gain in goodput or in throughput that doubling the cluster must
/// bring for [`Planner::fewest_gpus`] to keep doubling: below it, more GPUs of
/// this type are not what the goal lacks (its bounds are below what the
/// deployments achieve, or the target is already served, just not in time).
pub const MIN_GAIN: f64 = 0.05;

/// Narrowest relative bracket [`Planner::max_rate`] bisects to (below it,
/// neighbouring rates round to the same float).
pub const MIN_TOLERANCE: f64 = 1e-6;

/// Halvings below the scenario's rate before the goal is declared unreachable
/// at any rate (2^-10 of it).
pub const MAX_HALVINGS: u32 = 10;

/// Most GPUs an equal-cost cluster may have (the bound of `cluster.gpus`).
pub const MAX_GPUS: u32 = 4096;

/// One GPU type's answer in [`Planner::compare_gpus`].
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    /// GPU type (a `cluster.gpu` preset).
    pub gpu: String,
    /// `equal count` or `equal cost`.
    pub basis: &'static str,
    /// GPUs of this type in the comparison.
    pub gpus: u32,
    /// Its price per GPU-hour (any currency), where prices were given.
    pub price_per_gpu_hour: Option<f64>,
    /// `None` with `note` when this type has no answer (the model does not
    /// fit, the tier is met at no rate, the budget buys no GPU).
    pub answer: Option<MaxRate>,
    /// Why there is no answer.
    pub note: Option<String>,
}

/// The price of `gpu` among `prices` (`(type, price per GPU-hour)`).
pub fn price_of(prices: &[(String, f64)], gpu: &str) -> Option<f64> {
    prices.iter().find(|(t, _)| t == gpu).map(|(_, p)| *p)
}

/// What a rate must achieve.
#[derive(Clone, Debug, Serialize)]
pub struct Goal {
    /// SLO tier name (one of the scenario's `[[slo]]` tiers).
    pub tier: String,
    /// Fraction of the offered rate the tier's goodput must reach, in (0, 1].
    pub attain: f64,
}

/// Which deployment a probe runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tuning {
    /// The scenario's own deployment at every rate.
    Fixed,
    /// The deployment a HAS search ([`crate::DEFAULT_BUDGET`] trials) picks at each rate.
    Has,
    /// As [`Tuning::Has`], on the stage groups the scenario (with the
    /// probe's settings) names, whatever the objective: how
    /// [`Planner::cheapest_mix`] tunes each of its assignments,
    /// which it enumerates itself.
    HasOnGroups,
}

/// One simulated run at one rate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Probe {
    /// GPU type of the cluster.
    pub gpu: String,
    /// GPUs in the cluster.
    pub gpus: u32,
    /// Offered rate, requests/s.
    pub rate: f64,
    /// The deployment that ran (allocation, B, s, policies).
    pub deployment: String,
    /// The tier's goodput, requests/s (good requests per second of the run).
    pub goodput: f64,
    /// Goodput / offered rate.
    pub ratio: f64,
    /// Whether `ratio ≥ attain`.
    pub meets: bool,
    /// Completed requests per second of the run (every request, in its
    /// bounds or not).
    pub throughput: f64,
    /// The rate at which this deployment's busiest stage is fully loaded,
    /// requests/s: the offered rate over that stage's load (the cost model's
    /// estimate, from the report's explanation); `None` when it has none.
    pub capacity: Option<f64>,
}

/// The answer of [`Planner::max_rate`].
#[derive(Clone, Debug, Serialize)]
pub struct MaxRate {
    /// GPU type of the cluster searched.
    pub gpu: String,
    /// GPUs in the cluster.
    pub gpus: u32,
    /// The highest rate that met the goal, requests/s.
    pub rate: f64,
    /// The lowest rate above it that failed (`None` when none failed up to
    /// `ceiling`: the cluster is not the limit).
    pub fails_at: Option<f64>,
    /// The highest rate the search would probe: [`CAPACITY_MARGIN`] × the
    /// highest capacity estimated (at least the start), at most [`MAX_RATE`].
    pub ceiling: f64,
    /// The probes, in the order they ran.
    pub probes: Vec<Probe>,
}

/// The answer of [`Planner::fewest_gpus`].
#[derive(Clone, Debug, Serialize)]
pub struct FewestGpus {
    /// Target rate, requests/s.
    pub rate: f64,
    /// The fewest GPUs that met the goal among the sizes probed, with the
    /// probe that did; `None` when no size probed did.
    pub found: Option<Probe>,
    /// Largest cluster the search may try (`--max-gpus`).
    pub max_gpus: u32,
    /// Largest cluster probed (0 when no size up to `max_gpus` fits).
    pub tried_up_to: u32,
    /// Whether the doubling stopped below `max_gpus` because the last
    /// doubling raised neither goodput nor throughput by [`MIN_GAIN`].
    pub stalled: bool,
    /// Cluster sizes checked that no allocation fits (the model's weights, or
    /// no GPU left for an encode worker), smallest first.
    pub unfit: Vec<u32>,
    /// The probes, in the order they ran.
    pub probes: Vec<Probe>,
}

/// Why planning could not answer.
#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    /// The scenario (with the planner's settings) does not validate.
    #[error("{0}")]
    Scenario(String),
    /// The tier is not one of the scenario's.
    #[error("--slo {tier}: the scenario has no such SLO tier (its tiers: {known})")]
    UnknownTier {
        /// The name given.
        tier: String,
        /// The scenario's tier names.
        known: String,
    },
    /// Not even a small fraction of the scenario's rate meets the goal.
    #[error("tier `{tier}` (TTFT ≤ {ttft_s} s, TPOT ≤ {tpot_ms} ms) is not met at {attain} of the offered rate even at {rate} req/s (goodput {goodput:.4} req/s): its bounds are below what this deployment achieves without queueing")]
    Unreachable {
        /// Tier name.
        tier: String,
        /// Its TTFT bound, seconds.
        ttft_s: f64,
        /// Its TPOT bound, milliseconds.
        tpot_ms: f64,
        /// The attainment asked for.
        attain: f64,
        /// The lowest rate probed.
        rate: f64,
        /// The tier's goodput there.
        goodput: f64,
    },
    /// `--objective` names no objective, or a tier the scenario lacks.
    #[error("--objective {0}")]
    Objective(String),
    /// `--cost-per-gpu-hour` lacks the scenario's own GPU type.
    #[error("--cost-per-gpu-hour: give a price for the scenario's own GPU `{gpu}` too: its {gpus} GPUs set the hourly budget")]
    NoOwnPrice {
        /// The scenario's GPU type.
        gpu: String,
        /// Its GPUs.
        gpus: u32,
    },
    /// `--cost-per-gpu-hour` lacks a compared GPU type.
    #[error("--cost-per-gpu-hour: no price for `{gpu}` (one of --gpus)")]
    NoPrice {
        /// The type without a price.
        gpu: String,
    },
    /// The scenario cluster's hourly cost buys more GPUs of a type than a cluster may have.
    #[error("--cost-per-gpu-hour: the budget of {own} buys {buys} × {gpu}, more than the {MAX_GPUS} GPUs a cluster may have")]
    OverBudget {
        /// The scenario's cluster, `N × TYPE`.
        own: String,
        /// GPUs of `gpu` the budget buys.
        buys: String,
        /// The GPU type.
        gpu: String,
    },
}

/// Capacity questions about one scenario file.
pub struct Planner {
    path: PathBuf,
    sets: Vec<(String, String)>,
    base: Overrides,
    goal: Goal,
    tuning: Tuning,
    /// The workload has no media (no encode stage).
    text_only: bool,
    /// The model's routed experts (an MoE model's workers may take EP).
    moe_experts: Option<u32>,
    /// The scenario's own rate, requests/s.
    rate: f64,
    /// The tier's TTFT (s) and TPOT (ms) bounds.
    bounds: (f64, f64),
    /// The scenario's SLO tiers.
    tiers: Vec<easerve_workload::SloTier>,
    /// What the HAS search at each probe ranks by (default: goodput at the
    /// goal's tier; [`Planner::with_objective`]).
    objective: crate::Objective,
}

impl Planner {
    /// A planner for the scenario at `path` with dotted-key `sets` (as
    /// `sweep --set`, e.g. `cluster.gpu`) and `base` overrides (seed,
    /// requests, system) applied to every probe.
    ///
    /// Errors: the scenario does not validate, or `goal.tier` is not one of its
    /// tiers.
    pub fn new(
        path: &Path,
        sets: Vec<(String, String)>,
        base: Overrides,
        goal: Goal,
        tuning: Tuning,
    ) -> Result<Planner, CapacityError> {
        let sc = Scenario::load_with(path, &sets, &base)
            .map_err(|e| CapacityError::Scenario(e.to_string()))?;
        let Some(t) = sc.slo.iter().find(|t| t.name == goal.tier) else {
            return Err(CapacityError::UnknownTier {
                tier: goal.tier.clone(),
                known: sc
                    .slo
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        Ok(Planner {
            path: path.to_path_buf(),
            sets,
            base,
            tuning,
            text_only: sc.workload.modality == easerve_sched::Modality::Text,
            moe_experts: sc.model.llm.moe.as_ref().map(|m| m.experts),
            rate: sc.workload.rate,
            bounds: (t.ttft_s, t.tpot_s * 1e3),
            objective: crate::Objective::Goodput {
                name: goal.tier.clone(),
                tier: sc.slo.iter().position(|x| x.name == goal.tier).unwrap_or(0),
            },
            tiers: sc.slo.clone(),
            goal,
        })
    }

    /// The same planner with its HAS searches ranking by `text`
    /// (`goodput:TIER`, `goodput-per-dollar:TIER`, `throughput` or `ttft`;
    /// [`crate::Objective::parse`]; goodput per dollar also chooses the
    /// group of each stage, [`crate::tune_for`]).
    ///
    /// Errors: an unknown objective or tier, or goodput per dollar without
    /// a cost on every node group ([`CapacityError::Objective`]).
    pub fn with_objective(mut self, text: &str) -> Result<Planner, CapacityError> {
        self.objective = crate::Objective::parse(text, &self.tiers)
            .map_err(|e| CapacityError::Objective(format!("{text}: {e}")))?;
        let raw = Scenario::raw_with(&self.path, &self.sets, &self.base).map_err(scenario_err)?;
        self.objective
            .check_costs(&raw)
            .map_err(|e| CapacityError::Objective(format!("{text}: {e}")))?;
        Ok(self)
    }

    /// What the HAS search at each probe ranks by.
    pub fn objective(&self) -> &crate::Objective {
        &self.objective
    }

    /// The scenario's own rate, requests/s.
    pub fn scenario_rate(&self) -> f64 {
        self.rate
    }

    fn load(&self, sets: &[(String, String)], o: &Overrides) -> Result<Scenario, CapacityError> {
        Scenario::load_with(&self.path, sets, o).map_err(|e| CapacityError::Scenario(e.to_string()))
    }

    /// One run at `rate` with `extra` sets on top of the planner's (a cluster
    /// size `cluster.gpus`, a GPU type `cluster.gpu`), on the deployment
    /// `tuning` says. With [`Tuning::Has`] the cluster need not fit the
    /// scenario's own deployment: HAS chooses among the allocations that fit.
    /// `Ok(None)` when no allocation of that cluster can serve the model.
    ///
    /// Errors: the scenario does not validate with these settings (with
    /// [`Tuning::Fixed`], also when its deployment does not fit the cluster).
    pub fn probe(
        &self,
        extra: &[(String, String)],
        rate: f64,
        tuning: Tuning,
    ) -> Result<Option<Probe>, CapacityError> {
        let mut sets = self.sets.clone();
        sets.extend_from_slice(extra);
        let mut o = self.base.clone();
        o.rate = Some(rate);
        let sc = match tuning {
            Tuning::Fixed => self.load(&sets, &o)?,
            Tuning::Has | Tuning::HasOnGroups => {
                let objective = match tuning {
                    Tuning::HasOnGroups => self.objective.on_fixed_groups(),
                    _ => self.objective.clone(),
                };
                let file = self.path.display().to_string();
                let name = Scenario::default_name(&self.path);
                let (raw, space) = self.feasible(&sets, &o)?;
                let Some(fit) = space.first() else {
                    return Ok(None);
                };
                // a deployment that fits (as the fit check ran it, B = 1), so
                // that the cluster validates; HAS then chooses the deployment
                let mut first = raw.clone();
                first.apply(&Overrides {
                    allocation: Some(fit.allocation.to_string()),
                    offload: Some(fit.offload_range.1),
                    batch: Some(1),
                    ..o.clone()
                });
                let sc = Scenario::validate(first, &file, &name).map_err(scenario_err)?;
                let Some(best) =
                    crate::tune_for(crate::Method::Has, &sc, &o, rate, sc.seed, &objective)
                else {
                    return Ok(None);
                };
                let mut chosen = raw;
                chosen.apply(&best.candidate.overrides(&o));
                Scenario::validate(chosen, &file, &name).map_err(scenario_err)?
            }
        };
        let out = easerve_sim::simulate(&sc);
        let goodput = out
            .report
            .goodput
            .iter()
            .find(|t| t.name == self.goal.tier)
            .map_or(0.0, |t| t.goodput);
        let ratio = goodput / rate;
        Ok(Some(Probe {
            gpu: sc.gpu_types(),
            gpus: sc.gpus,
            rate,
            deployment: out.report.meta.deployment.clone(),
            goodput,
            ratio,
            meets: ratio >= self.goal.attain,
            throughput: out.report.request_throughput,
            capacity: estimated_capacity(&out.report, rate),
        }))
    }

    /// The scenario file with `sets` and `o` applied, and every allocation
    /// of its cluster that can serve the model (empty when none can).
    ///
    /// Errors: the scenario does not validate for a reason other than its
    /// deployment or cluster size.
    fn feasible(
        &self,
        sets: &[(String, String)],
        o: &Overrides,
    ) -> Result<(ScenarioFile, Vec<FeasibleAllocation>), CapacityError> {
        let file = self.path.display().to_string();
        let raw = Scenario::raw_with(&self.path, sets, o).map_err(scenario_err)?;
        let gpus = u32::try_from(raw.cluster_gpus().clamp(1, i64::from(u32::MAX))).unwrap_or(1);
        let space = crate::space::feasible_allocations_in(
            &raw,
            &file,
            gpus,
            self.text_only,
            self.moe_experts,
        );
        if space.is_empty() {
            // no allocation validates: say why when it is not the cluster
            let name = Scenario::default_name(&self.path);
            if let Err(e) = Scenario::validate(raw.clone(), &file, &name) {
                if !e.field.starts_with("deployment") && e.field != "cluster.gpus" {
                    return Err(scenario_err(e));
                }
            }
        }
        Ok((raw, space))
    }

    /// Whether some allocation of `gpus` GPUs can serve the model at `rate`
    /// (nothing is run).
    fn fits(&self, gpus: u32, rate: f64) -> Result<bool, CapacityError> {
        let mut sets = self.sets.clone();
        sets.push(("cluster.gpus".to_string(), gpus.to_string()));
        let mut o = self.base.clone();
        o.rate = Some(rate);
        Ok(!self.feasible(&sets, &o)?.1.is_empty())
    }

    /// The highest rate that meets the goal on the cluster the planner's sets
    /// and `extra` describe, to a relative bracket width of `tolerance`
    /// (> 0), starting from `start` requests/s. `on_probe` sees every probe
    /// as it finishes.
    ///
    /// Errors: the scenario does not validate; no allocation fits the cluster
    /// ([`CapacityError::Scenario`]); the goal is not met even at
    /// `start / 2^MAX_HALVINGS` ([`CapacityError::Unreachable`]).
    pub fn max_rate(
        &self,
        extra: &[(String, String)],
        start: f64,
        tolerance: f64,
        on_probe: &mut dyn FnMut(&Probe),
    ) -> Result<MaxRate, CapacityError> {
        let mut probes = Vec::new();
        let mut run = |rate: f64, probes: &mut Vec<Probe>| -> Result<Probe, CapacityError> {
            let p = self.probe(extra, rate, self.tuning)?.ok_or_else(|| {
                CapacityError::Scenario(format!(
                    "{}: no allocation of this cluster can serve the model{}",
                    self.path.display(),
                    describe_sets(extra)
                ))
            })?;
            on_probe(&p);
            probes.push(p.clone());
            Ok(p)
        };
        let tolerance = tolerance.max(MIN_TOLERANCE);
        // the cluster bounds the probes: CAPACITY_MARGIN × the highest
        // capacity its runs estimated (MAX_RATE when none did)
        let ceiling_of = |estimate: Option<f64>| {
            estimate
                .map_or(MAX_RATE, |c| (c * CAPACITY_MARGIN).min(MAX_RATE))
                .max(start)
        };
        let first = run(start, &mut probes)?;
        let (gpu, gpus) = (first.gpu.clone(), first.gpus);
        let mut estimate = first.capacity;
        let (mut lo, mut hi) = if first.meets {
            let mut lo = start;
            let mut hi = None;
            while lo < ceiling_of(estimate) {
                // double, or jump to the estimate when it is further up
                let next = estimate
                    .map_or(lo * 2.0, |c| c.max(lo * 2.0))
                    .min(ceiling_of(estimate));
                let p = run(next, &mut probes)?;
                estimate = max_estimate(estimate, p.capacity);
                if p.meets {
                    lo = next;
                } else {
                    hi = Some(next);
                    break;
                }
            }
            match hi {
                Some(h) => (lo, h),
                None => {
                    return Ok(MaxRate {
                        gpu,
                        gpus,
                        rate: lo,
                        fails_at: None,
                        ceiling: ceiling_of(estimate),
                        probes,
                    })
                }
            }
        } else {
            let mut hi = start;
            let mut lo = None;
            let mut last = first;
            for _ in 0..MAX_HALVINGS {
                // halve, or jump to the estimate when it is further down
                let next = last.capacity.filter(|c| *c < hi / 2.0).unwrap_or(hi / 2.0);
                let p = run(next, &mut probes)?;
                estimate = max_estimate(estimate, p.capacity);
                if p.meets {
                    lo = Some(next);
                    break;
                }
                hi = next;
                last = p;
            }
            match lo {
                Some(l) => (l, hi),
                None => {
                    return Err(CapacityError::Unreachable {
                        tier: self.goal.tier.clone(),
                        ttft_s: self.bounds.0,
                        tpot_ms: self.bounds.1,
                        attain: self.goal.attain,
                        rate: last.rate,
                        goodput: last.goodput,
                    });
                }
            }
        };
        while hi / lo > 1.0 + tolerance {
            let mid = (lo * hi).sqrt();
            if !(mid > lo && mid < hi) {
                break; // neighbouring floats
            }
            if run(mid, &mut probes)?.meets {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(MaxRate {
            gpu,
            gpus,
            rate: lo,
            fails_at: Some(hi),
            ceiling: ceiling_of(estimate),
            probes,
        })
    }

    /// The fewest GPUs of the scenario's type (with HAS choosing the
    /// deployment of each size at `rate`) that meet the goal at `rate`, up to
    /// `max_gpus`: the smallest size that fits the model (found by doubling
    /// and bisecting on a fit check that runs nothing), then sizes doubling
    /// from it until one meets the goal, `max_gpus` is reached, or a doubling
    /// raises neither goodput nor throughput by [`MIN_GAIN`]; then a bisection
    /// between the largest size that failed and the smallest that met. Goodput
    /// need not be monotone in the size: the answer is the fewest GPUs among
    /// the sizes probed, every smaller size probed having failed.
    ///
    /// Errors: the scenario does not validate at some size.
    pub fn fewest_gpus(
        &self,
        rate: f64,
        max_gpus: u32,
        on_probe: &mut dyn FnMut(&Probe),
    ) -> Result<FewestGpus, CapacityError> {
        let max_gpus = max_gpus.max(1);
        let mut probes = Vec::new();
        let mut unfit = Vec::new();
        let answer = |found, tried_up_to, stalled, mut unfit: Vec<u32>, probes| {
            unfit.sort_unstable();
            unfit.dedup();
            FewestGpus {
                rate,
                found,
                max_gpus,
                tried_up_to,
                stalled,
                unfit,
                probes,
            }
        };
        // the smallest size that fits: double, then bisect (no runs)
        let mut below = 0; // the largest size known not to fit (0: none)
        let mut n = 1;
        let smallest = loop {
            if self.fits(n, rate)? {
                break n;
            }
            unfit.push(n);
            below = n;
            if n >= max_gpus {
                return Ok(answer(None, 0, false, unfit, probes));
            }
            n = n.saturating_mul(2).min(max_gpus);
        };
        let mut smallest = smallest;
        while smallest - below > 1 {
            let mid = below + (smallest - below) / 2;
            if self.fits(mid, rate)? {
                smallest = mid;
            } else {
                unfit.push(mid);
                below = mid;
            }
        }
        let mut run = |n: u32, probes: &mut Vec<Probe>, unfit: &mut Vec<u32>| {
            let extra = [("cluster.gpus".to_string(), n.to_string())];
            let p = self.probe(&extra, rate, Tuning::Has)?;
            match &p {
                Some(p) => {
                    on_probe(p);
                    probes.push(p.clone());
                }
                None => unfit.push(n),
            }
            Ok::<_, CapacityError>(p)
        };
        // double from it until a size meets the goal, gains stop, or max_gpus
        let mut failed = below; // the largest size that failed or does not fit
        let mut previous: Option<Probe> = None;
        let mut n = smallest;
        let mut met = None;
        let mut stalled = false;
        loop {
            if let Some(p) = run(n, &mut probes, &mut unfit)? {
                if p.meets {
                    met = Some(p);
                    break;
                }
                let gained = previous.as_ref().is_none_or(|q| gains(q, &p));
                previous = Some(p);
                if !gained {
                    failed = n;
                    stalled = n < max_gpus;
                    break;
                }
            }
            failed = n;
            if n >= max_gpus {
                break;
            }
            n = n.saturating_mul(2).min(max_gpus);
        }
        let tried_up_to = n;
        let Some(mut best) = met else {
            return Ok(answer(None, tried_up_to, stalled, unfit, probes));
        };
        // the fewest that meet: bisect between the largest failing size and it
        while best.gpus - failed > 1 {
            let mid = failed + (best.gpus - failed) / 2;
            match run(mid, &mut probes, &mut unfit)? {
                Some(p) if p.meets => best = p,
                _ => failed = mid,
            }
        }
        Ok(answer(Some(best), tried_up_to, false, unfit, probes))
    }

    /// GPU types compared, each tuned as the planner says: the highest rate
    /// meeting the goal (as [`Planner::max_rate`] from `start` requests/s to
    /// `tolerance`) on the scenario's GPU count of each of `types` (the
    /// scenario's own type first when `types` lacks it) and, with `prices`
    /// (`(type, price per GPU-hour)`, any currency), on as many GPUs of each
    /// type as the scenario cluster's hourly cost buys. A type without an
    /// answer (its scenario does not validate, the goal is unreachable) has
    /// a note instead. `on_probe` sees every probe as it finishes.
    ///
    /// Errors: the scenario does not validate; `prices` lacks the scenario's
    /// own type or one of `types`; the budget buys more than [`MAX_GPUS`] of
    /// a type (found when that type's turn comes).
    pub fn compare_gpus(
        &self,
        types: &[String],
        prices: &[(String, f64)],
        start: f64,
        tolerance: f64,
        on_probe: &mut dyn FnMut(&Probe),
    ) -> Result<Vec<Comparison>, CapacityError> {
        let own = Scenario::load(&self.path, &Overrides::default()).map_err(scenario_err)?;
        let budget = budget(prices, types, &own.gpu.name, own.gpus)?;
        let mut types = types.to_vec();
        if !types.contains(&own.gpu.name) {
            types.insert(0, own.gpu.name.clone());
        }
        let mut rows = Vec::new();
        let mut row =
            |gpu: &str, basis, gpus: u32, sets: &[(String, String)], on: &mut dyn FnMut(&Probe)| {
                let (answer, note) = match self.max_rate(sets, start, tolerance, on) {
                    Ok(m) => (Some(m), None),
                    Err(e @ (CapacityError::Scenario(_) | CapacityError::Unreachable { .. })) => {
                        (None, Some(e.to_string()))
                    }
                    Err(e) => return Err(e),
                };
                rows.push(Comparison {
                    gpu: gpu.to_string(),
                    basis,
                    gpus,
                    price_per_gpu_hour: price_of(prices, gpu),
                    answer,
                    note,
                });
                Ok(())
            };
        for t in &types {
            let gpu = ("cluster.gpu".to_string(), t.clone());
            row(
                t,
                "equal count",
                own.gpus,
                std::slice::from_ref(&gpu),
                on_probe,
            )?;
            if let (Some(budget), Some(price)) = (budget, price_of(prices, t)) {
                let n = (budget / price * (1.0 + 1e-12)).floor();
                if n > f64::from(MAX_GPUS) {
                    return Err(CapacityError::OverBudget {
                        own: format!("{} × {}", own.gpus, own.gpu.name),
                        buys: num(n),
                        gpu: t.clone(),
                    });
                }
                let n = n as u32;
                if n == own.gpus {
                    continue;
                }
                let sets = [gpu, ("cluster.gpus".to_string(), n.to_string())];
                row(t, "equal cost", n, &sets, on_probe)?;
            }
        }
        Ok(rows)
    }
}

/// Whether `p` (twice `q`'s GPUs) raised goodput or throughput by [`MIN_GAIN`].
/// Most node-count mixes [`Planner::cheapest_mix`] enumerates.
pub const MAX_MIXES: usize = 4096;

/// One mix of node counts probed by [`Planner::cheapest_mix`].
#[derive(Clone, Debug, Serialize)]
pub struct MixProbe {
    /// Nodes of each group, by name, in the file's order.
    pub nodes: Vec<(String, u32)>,
    /// The group of each stage: encode, prefill, decode.
    pub stages: [String; 3],
    /// Its cost per hour: `Σ nodes · gpus_per_node · cost_per_gpu_hour`.
    pub cost_per_hour: f64,
    /// The HAS-tuned run at the target rate; `None` when no allocation of
    /// the mix can serve the model.
    pub probe: Option<Probe>,
}

/// The answer of [`Planner::cheapest_mix`].
#[derive(Clone, Debug, Serialize)]
pub struct CheapestMix {
    /// Target rate, requests/s.
    pub rate: f64,
    /// Mixes in the space (1 ..= the file's nodes of each group).
    pub mixes: usize,
    /// Stage-to-group assignments tried on each mix.
    pub assignments: usize,
    /// The cheapest mix that met the goal, if any.
    pub found: Option<MixProbe>,
    /// The mixes probed, cheapest first (every one before `found` failed).
    pub probes: Vec<MixProbe>,
}

impl Planner {
    /// The cheapest mix of node groups meeting the goal at `rate`: every
    /// mix of 1 ..= the scenario's nodes of each group (`[[cluster.groups]]`),
    /// in order of cost per hour (then GPUs), each with every assignment of
    /// the stages to groups (the scenario's own first), probed HAS-tuned
    /// ([`Planner::probe`]: instance counts and TP that place on the
    /// groups), until a mix meets the goal; the first that does is the
    /// cheapest, with its assignment of the highest goodput. `on_probe` sees
    /// every probe as it finishes.
    ///
    /// Errors: the scenario has no groups, or a group without
    /// `cost_per_gpu_hour`; more than [`MAX_MIXES`] mixes; a mix does not
    /// validate.
    pub fn cheapest_mix(
        &self,
        rate: f64,
        on_probe: &mut dyn FnMut(&Probe),
    ) -> Result<CheapestMix, CapacityError> {
        let raw = Scenario::raw_with(&self.path, &self.sets, &self.base).map_err(scenario_err)?;
        let groups = &raw.cluster.groups;
        let (mixes, cost) = mix_space(groups)?;
        let assignments = crate::space::stage_assignments(&raw);
        let mut out = CheapestMix {
            rate,
            mixes: mixes.len(),
            assignments: assignments.len(),
            found: None,
            probes: Vec::new(),
        };
        for (m, &cost) in mixes.iter().zip(&cost) {
            for stages in &assignments {
                let mut sets: Vec<(String, String)> = m
                    .iter()
                    .enumerate()
                    .map(|(i, n)| (format!("cluster.groups.{i}.nodes"), n.to_string()))
                    .collect();
                for (stage, g) in ["encode", "prefill", "decode"].iter().zip(stages) {
                    sets.push((format!("deployment.groups.{stage}"), g.clone()));
                }
                // tuned on this assignment's groups (the loop chooses them)
                let probe = self.probe(&sets, rate, Tuning::HasOnGroups)?;
                if let Some(p) = &probe {
                    on_probe(p);
                }
                let mix = MixProbe {
                    nodes: groups
                        .iter()
                        .map(|g| g.name.clone())
                        .zip(m.iter().copied())
                        .collect(),
                    stages: stages.clone(),
                    cost_per_hour: cost,
                    probe,
                };
                let good = |x: &MixProbe| x.probe.as_ref().filter(|p| p.meets).map(|p| p.goodput);
                if let Some(g) = good(&mix) {
                    if out
                        .found
                        .as_ref()
                        .and_then(good)
                        .is_none_or(|best| g > best)
                    {
                        out.found = Some(mix.clone());
                    }
                }
                out.probes.push(mix);
            }
            if out.found.is_some() {
                break;
            }
        }
        Ok(out)
    }
}

/// Every mix of 1 ..= each group's nodes, cheapest per hour first (then
/// fewest GPUs), with the cost per hour of each, in the same order.
///
/// Errors: a group without `cost_per_gpu_hour`; no group; more than
/// [`MAX_MIXES`] mixes.
fn mix_space(
    groups: &[easerve_workload::scenario::GroupSection],
) -> Result<(Vec<Vec<u32>>, Vec<f64>), CapacityError> {
    let prices: Vec<f64> = groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            g.cost_per_gpu_hour.ok_or_else(|| {
                CapacityError::Scenario(format!(
                    "cluster.groups[{i}].cost_per_gpu_hour: --target-rate on node groups answers with the cheapest mix, which needs a cost on every group"
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    let space: f64 = groups.iter().map(|g| g.nodes.max(1) as f64).product();
    if groups.is_empty() || space > MAX_MIXES as f64 {
        return Err(CapacityError::Scenario(format!(
            "--target-rate on node groups: {space} mixes of node counts, allowed 1 ..= {MAX_MIXES}"
        )));
    }
    let mut mixes: Vec<Vec<u32>> = vec![Vec::new()];
    for g in groups {
        let nodes = u32::try_from(g.nodes.max(1)).unwrap_or(1);
        mixes = mixes
            .into_iter()
            .flat_map(|m| (1..=nodes).map(move |n| [m.clone(), vec![n]].concat()))
            .collect();
    }
    let per_node = |i: usize| groups[i].gpus_per_node.max(0) as f64;
    let cost = |m: &[u32]| -> f64 {
        m.iter()
            .enumerate()
            .map(|(i, &n)| f64::from(n) * per_node(i) * prices[i])
            .sum()
    };
    let gpus = |m: &[u32]| -> f64 {
        m.iter()
            .enumerate()
            .map(|(i, &n)| f64::from(n) * per_node(i))
            .sum()
    };
    mixes.sort_by(|a, b| {
        cost(a)
            .total_cmp(&cost(b))
            .then(gpus(a).total_cmp(&gpus(b)))
            .then(a.cmp(b))
    });
    let costs = mixes.iter().map(|m| cost(m)).collect();
    Ok((mixes, costs))
}

fn gains(q: &Probe, p: &Probe) -> bool {
    p.goodput > q.goodput * (1.0 + MIN_GAIN) || p.throughput > q.throughput * (1.0 + MIN_GAIN)
}

fn scenario_err(e: ScenarioError) -> CapacityError {
    CapacityError::Scenario(e.to_string())
}

/// The offered rate at which `report`'s busiest stage is fully loaded: the
/// run's `rate` over that stage's load ratio (`None` without a finite one).
fn estimated_capacity(report: &Report, rate: f64) -> Option<f64> {
    let busiest = report
        .explanation
        .loads
        .iter()
        .map(|l| l.load)
        .filter(|l| l.is_finite() && *l > 0.0)
        .fold(0.0, f64::max);
    Some(rate / busiest).filter(|c| busiest > 0.0 && c.is_finite() && *c > 0.0)
}

/// The higher of two capacity estimates.
fn max_estimate(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    }
}

/// The hourly budget of the scenario's cluster (`own_gpus` × `own_gpu`'s
/// price), `None` without prices; every type of `types` must have a price.
fn budget(
    prices: &[(String, f64)],
    types: &[String],
    own_gpu: &str,
    own_gpus: u32,
) -> Result<Option<f64>, CapacityError> {
    if prices.is_empty() {
        return Ok(None);
    }
    let p = price_of(prices, own_gpu).ok_or_else(|| CapacityError::NoOwnPrice {
        gpu: own_gpu.to_string(),
        gpus: own_gpus,
    })?;
    if let Some(t) = types.iter().find(|t| price_of(prices, t).is_none()) {
        return Err(CapacityError::NoPrice { gpu: t.clone() });
    }
    Ok(Some(p * f64::from(own_gpus)))
}

fn describe_sets(extra: &[(String, String)]) -> String {
    if extra.is_empty() {
        String::new()
    } else {
        format!(
            " ({})",
            extra
                .iter()
                .map(|(k, v)| format!("{k} = {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}
