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
//!   `[meets, fails]` is narrower than the tolerance. Goodput need not be
//!   monotone in the rate (a run is one sample); the answer is the highest
//!   probed rate that met the goal below the lowest one that failed above it,
//!   and the probes are returned so the user can see the shape.
//! * [`Planner::fewest_gpus`]: cluster sizes from the smallest that fits the
//!   model upward, each tuned by HAS at the target rate; the first that meets
//!   the goal is the answer, and "none up to N" is an answer too.

use easerve_workload::scenario::{Overrides, Scenario, MAX_RATE};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Rates probed at most above the scenario's rate, as a factor (2^20), and
/// never above the scenario bound [`MAX_RATE`]: a cluster that meets the goal
/// there is reported as not the limit, not searched on.
pub const MAX_GROWTH: f64 = 1_048_576.0;

/// Narrowest relative bracket [`Planner::max_rate`] bisects to (below it,
/// neighbouring rates round to the same float).
pub const MIN_TOLERANCE: f64 = 1e-6;

/// Halvings below the scenario's rate before the goal is declared unreachable
/// at any rate (2^-10 of it).
pub const MAX_HALVINGS: u32 = 10;

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
    /// [`MAX_GROWTH`] × the start: the cluster is not the limit).
    pub fails_at: Option<f64>,
    /// The probes, in the order they ran.
    pub probes: Vec<Probe>,
}

/// The answer of [`Planner::fewest_gpus`].
#[derive(Clone, Debug, Serialize)]
pub struct FewestGpus {
    /// Target rate, requests/s.
    pub rate: f64,
    /// The fewest GPUs that met the goal, with the probe that did; `None`
    /// when no cluster size up to `max_gpus` did.
    pub found: Option<Probe>,
    /// Largest cluster tried.
    pub max_gpus: u32,
    /// Cluster sizes no allocation fits (the model's weights, or no GPU left
    /// for an encode worker), skipped.
    pub unfit: Vec<u32>,
    /// One probe per cluster size that fits the model, smallest first.
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
            goal,
        })
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
        let scenario_err =
            |e: easerve_workload::scenario::ScenarioError| CapacityError::Scenario(e.to_string());
        let mut sets = self.sets.clone();
        sets.extend_from_slice(extra);
        let mut o = self.base.clone();
        o.rate = Some(rate);
        let sc = match tuning {
            Tuning::Fixed => self.load(&sets, &o)?,
            Tuning::Has => {
                let file = self.path.display().to_string();
                let name = Scenario::default_name(&self.path);
                let raw = Scenario::raw_with(&self.path, &sets, &o).map_err(scenario_err)?;
                let gpus =
                    u32::try_from(raw.cluster.gpus.clamp(1, i64::from(u32::MAX))).unwrap_or(1);
                let space = crate::space::feasible_allocations_in(
                    &raw,
                    &file,
                    gpus,
                    self.text_only,
                    self.moe_experts,
                );
                let Some(fit) = space.first() else {
                    // no allocation validates: say why when it is not the cluster
                    return match Scenario::validate(raw, &file, &name) {
                        Err(e)
                            if !e.field.starts_with("deployment") && e.field != "cluster.gpus" =>
                        {
                            Err(scenario_err(e))
                        }
                        _ => Ok(None),
                    };
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
                let Some(best) = crate::tune(&sc, &o, rate, sc.seed) else {
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
            gpu: sc.gpu.name.clone(),
            gpus: sc.gpus,
            rate,
            deployment: out.report.meta.deployment.clone(),
            goodput,
            ratio,
            meets: ratio >= self.goal.attain,
        }))
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
        let ceiling = (start * MAX_GROWTH).min(MAX_RATE);
        let first = run(start, &mut probes)?;
        let (gpu, gpus) = (first.gpu.clone(), first.gpus);
        let (mut lo, mut hi) = if first.meets {
            let mut lo = start;
            let mut hi = None;
            while lo < ceiling {
                let next = (lo * 2.0).min(ceiling);
                let p = run(next, &mut probes)?;
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
                        probes,
                    })
                }
            }
        } else {
            let mut hi = start;
            let mut lo = None;
            let mut last = first;
            for _ in 0..MAX_HALVINGS {
                let p = run(hi / 2.0, &mut probes)?;
                if p.meets {
                    lo = Some(hi / 2.0);
                    break;
                }
                hi /= 2.0;
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
            probes,
        })
    }

    /// The fewest GPUs of the scenario's type (with HAS choosing the
    /// deployment of each size at `rate`) that meet the goal at `rate`, trying
    /// every size from 1 to `max_gpus`; sizes no allocation fits are skipped.
    ///
    /// Errors: the scenario does not validate at some size.
    pub fn fewest_gpus(
        &self,
        rate: f64,
        max_gpus: u32,
        on_probe: &mut dyn FnMut(&Probe),
    ) -> Result<FewestGpus, CapacityError> {
        let mut probes = Vec::new();
        let mut unfit = Vec::new();
        for n in 1..=max_gpus {
            let extra = [("cluster.gpus".to_string(), n.to_string())];
            let Some(p) = self.probe(&extra, rate, Tuning::Has)? else {
                unfit.push(n);
                continue;
            };
            on_probe(&p);
            probes.push(p.clone());
            if p.meets {
                return Ok(FewestGpus {
                    rate,
                    found: Some(p),
                    max_gpus,
                    unfit,
                    probes,
                });
            }
        }
        Ok(FewestGpus {
            rate,
            found: None,
            max_gpus,
            unfit,
            probes,
        })
    }
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
