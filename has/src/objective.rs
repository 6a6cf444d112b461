//! What a search ranks its trials by ([`Objective`]): goodput at an SLO
//! tier (the default, `goodput:moderate`: the paper's baselines are tuned to
//! the highest goodput at the target rate, EAServe §4.1), goodput per
//! dollar (on node groups with `cost_per_gpu_hour`), throughput (the
//! paper's HAS ranking, §3.1), or mean TTFT. Ties are broken by throughput,
//! then mean TTFT, then mean TPOT.

use crate::Outcome;
use easerve_workload::scenario::ScenarioFile;
use easerve_workload::SloTier;
use std::cmp::Ordering;
use std::fmt;

/// The objectives `--objective` accepts, as the error lists them.
pub const OBJECTIVES: &str = "goodput:TIER (a tier of the scenario's [[slo]]), goodput-per-dollar:TIER (on node groups with cost_per_gpu_hour), throughput, ttft";

/// The tier `goodput` ranks by when none is named.
pub const DEFAULT_TIER: &str = "moderate";

/// What a search ranks by, resolved against a scenario's SLO tiers.
#[derive(Clone, Debug, PartialEq)]
pub enum Objective {
    /// Requests/s meeting both bounds of tier `name` (index `tier` into the
    /// scenario's tiers), higher is better.
    Goodput {
        /// The tier's name.
        name: String,
        /// Its index into the scenario's tiers.
        tier: usize,
    },
    /// Requests/s meeting both bounds of tier `name` per unit of the
    /// hourly cost of the GPUs the allocation uses
    /// ([`crate::space::hourly_cost`]: the node groups its stages name),
    /// higher is better: (req/s) / (cost/hour).
    GoodputPerDollar {
        /// The tier's name.
        name: String,
        /// Its index into the scenario's tiers.
        tier: usize,
    },
    /// Completed requests/s, higher is better (the paper's HAS).
    Throughput,
    /// Mean TTFT, lower is better.
    Ttft,
}

impl Objective {
    /// `text` (`goodput:TIER`, `goodput-per-dollar:TIER`, `throughput` or
    /// `ttft`) against `tiers`.
    ///
    /// # Errors
    /// An unknown objective, or a tier that is not one of `tiers` (the
    /// message lists what is allowed).
    pub fn parse(text: &str, tiers: &[SloTier]) -> Result<Objective, String> {
        match text.trim() {
            "throughput" => Ok(Objective::Throughput),
            "ttft" => Ok(Objective::Ttft),
            t => {
                let (per_dollar, name) = match t.strip_prefix("goodput-per-dollar:") {
                    Some(name) => (true, name),
                    None => (
                        false,
                        t.strip_prefix("goodput:").ok_or_else(|| {
                            format!("unknown objective `{t}`; allowed: {OBJECTIVES}")
                        })?,
                    ),
                };
                let tier = tiers.iter().position(|x| x.name == name).ok_or_else(|| {
                    format!(
                        "objective `{t}`: no SLO tier `{name}`; the scenario's tiers: {}",
                        tiers
                            .iter()
                            .map(|x| x.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })?;
                let name = name.to_string();
                Ok(match per_dollar {
                    true => Objective::GoodputPerDollar { name, tier },
                    false => Objective::Goodput { name, tier },
                })
            }
        }
    }

    /// Whether ranking needs each allocation's cost per hour.
    pub fn needs_costs(&self) -> bool {
        matches!(self, Objective::GoodputPerDollar { .. })
    }

    /// The objective that ranks as this one among allocations on fixed
    /// stage groups: there every allocation pays for the same groups, so
    /// goodput per dollar ranks as goodput (ties alike); the others as
    /// they are.
    pub fn on_fixed_groups(&self) -> Objective {
        match self {
            Objective::GoodputPerDollar { name, tier } => Objective::Goodput {
                name: name.clone(),
                tier: *tier,
            },
            o => o.clone(),
        }
    }

    /// Whether `raw`'s cluster gives what this objective needs: for
    /// goodput per dollar, node groups each with `cost_per_gpu_hour`.
    ///
    /// # Errors
    /// The field missing, named (`cluster.groups[i].cost_per_gpu_hour`,
    /// the first group without one), and why it is needed.
    pub fn check_costs(&self, raw: &ScenarioFile) -> Result<(), String> {
        if !self.needs_costs() {
            return Ok(());
        }
        if raw.cluster.groups.is_empty() {
            return Err(format!(
                "objective `{self}` ranks by goodput over the hourly cost of the GPUs an allocation uses, which needs node groups (`[[cluster.groups]]`) each with `cluster.groups[i].cost_per_gpu_hour`; this cluster is one node (`cluster.gpu`): use `goodput:TIER`"
            ));
        }
        match raw
            .cluster
            .groups
            .iter()
            .position(|g| g.cost_per_gpu_hour.is_none())
        {
            Some(i) => Err(format!(
                "cluster.groups[{i}].cost_per_gpu_hour: missing; objective `{self}` ranks by goodput over the hourly cost of the GPUs an allocation uses, which needs a cost on every group"
            )),
            None => Ok(()),
        }
    }

    /// The default for a scenario of `tiers`: goodput at [`DEFAULT_TIER`],
    /// else at the middle tier (strict → relaxed), else throughput when the
    /// scenario has no tier.
    pub fn default_for(tiers: &[SloTier]) -> Objective {
        let tier = tiers
            .iter()
            .position(|t| t.name == DEFAULT_TIER)
            .or((!tiers.is_empty()).then_some(tiers.len() / 2));
        match tier {
            Some(tier) => Objective::Goodput {
                name: tiers[tier].name.clone(),
                tier,
            },
            None => Objective::Throughput,
        }
    }

    /// The tier whose goodput a trial must measure, if any.
    pub fn tier(&self) -> Option<usize> {
        match self {
            Objective::Goodput { tier, .. } | Objective::GoodputPerDollar { tier, .. } => {
                Some(*tier)
            }
            _ => None,
        }
    }

    /// One number per outcome, higher is better: the goodput (req/s), the
    /// goodput per cost per hour ((req/s) / (cost/hour); 0 without a
    /// positive cost), the throughput (req/s), or minus the mean TTFT (s).
    /// An undeployable candidate scores −∞.
    pub fn score(&self, o: &Outcome) -> f64 {
        if !o.feasible {
            return f64::NEG_INFINITY;
        }
        match self {
            Objective::Goodput { .. } => o.slo_goodput.unwrap_or(0.0),
            Objective::GoodputPerDollar { .. } => match o.cost_per_hour {
                Some(c) if c > 0.0 => o.slo_goodput.unwrap_or(0.0) / c,
                _ => 0.0,
            },
            Objective::Throughput => o.throughput,
            Objective::Ttft => -o.mean_ttft,
        }
    }

    /// `a` against `b` (`Greater`: `a` is better): a baseline rule's own
    /// goodput when both carry one ([`crate::own`]: those rules rank by
    /// nothing else first), then the score, then [`Outcome::rank`]
    /// (throughput, mean TTFT, mean TPOT).
    pub fn rank(&self, a: &Outcome, b: &Outcome) -> Ordering {
        let own = match (a.goodput, b.goodput) {
            (Some(x), Some(y)) => x.total_cmp(&y),
            _ => Ordering::Equal,
        };
        own.then_with(|| self.score(a).total_cmp(&self.score(b)))
            .then_with(|| a.rank(b))
    }

    /// The value TPE minimises: minus the score, with the tie-breakers
    /// folded in at weights far below one unit of it (1e-3 × throughput,
    /// per unit of cost for goodput per dollar; 1e-6 × mean TTFT, 1e-9 ×
    /// mean TPOT).
    pub fn value(&self, o: &Outcome) -> f64 {
        let score = self.score(o).max(-1e9);
        let tie = match self {
            Objective::Throughput => 0.0,
            Objective::GoodputPerDollar { .. } => {
                -1e-3 * o.throughput / o.cost_per_hour.filter(|c| *c > 0.0).unwrap_or(1.0)
            }
            _ => -1e-3 * o.throughput,
        };
        let ttft = match self {
            Objective::Ttft => 0.0,
            _ => 1e-6 * o.mean_ttft.min(1e6),
        };
        -score + tie + ttft + 1e-9 * o.mean_tpot.min(1e6)
    }
}

impl fmt::Display for Objective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Objective::Goodput { name, .. } => write!(f, "goodput:{name}"),
            Objective::GoodputPerDollar { name, .. } => write!(f, "goodput-per-dollar:{name}"),
            Objective::Throughput => write!(f, "throughput"),
            Objective::Ttft => write!(f, "ttft"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiers() -> Vec<SloTier> {
        ["strict", "moderate", "relaxed"]
            .iter()
            .map(|n| SloTier {
                name: n.to_string(),
                ttft_s: 1.0,
                tpot_s: 0.1,
            })
            .collect()
    }

    fn out(thr: f64, good: f64, ttft: f64) -> Outcome {
        Outcome {
            throughput: thr,
            mean_ttft: ttft,
            mean_tpot: 0.05,
            feasible: true,
            attainment: None,
            goodput: None,
            slo_goodput: Some(good),
            cost_per_hour: None,
        }
    }

    #[test]
    fn parses_and_rejects_with_the_allowed_values() {
        let t = tiers();
        assert_eq!(
            Objective::parse("goodput:relaxed", &t),
            Ok(Objective::Goodput {
                name: "relaxed".into(),
                tier: 2
            })
        );
        assert_eq!(
            Objective::parse("throughput", &t),
            Ok(Objective::Throughput)
        );
        assert_eq!(Objective::parse("ttft", &t), Ok(Objective::Ttft));
        let e = Objective::parse("latency", &t).unwrap_err();
        assert!(
            e.contains("unknown objective `latency`") && e.contains("goodput:TIER"),
            "{e}"
        );
        let e = Objective::parse("goodput:loose", &t).unwrap_err();
        assert!(e.contains("strict, moderate, relaxed"), "{e}");
        assert_eq!(Objective::default_for(&t).to_string(), "goodput:moderate");
        assert_eq!(
            Objective::default_for(&t[..1]).to_string(),
            "goodput:strict"
        );
        assert_eq!(Objective::default_for(&[]), Objective::Throughput);
    }

    #[test]
    fn ranks_by_the_objective_then_throughput_then_ttft() {
        let g = Objective::default_for(&tiers());
        // more goodput wins over more throughput
        let (a, b) = (out(2.0, 1.5, 3.0), out(3.0, 1.0, 3.0));
        assert!(g.rank(&a, &b).is_gt());
        assert!(Objective::Throughput.rank(&a, &b).is_lt());
        // equal goodput: throughput, then mean TTFT
        assert!(g.rank(&out(2.0, 1.5, 3.0), &out(1.9, 1.5, 1.0)).is_gt());
        assert!(g.rank(&out(2.0, 1.5, 3.0), &out(2.0, 1.5, 1.0)).is_lt());
        // ttft: lower mean TTFT wins
        assert!(Objective::Ttft
            .rank(&out(1.0, 0.0, 1.0), &out(3.0, 3.0, 2.0))
            .is_gt());
        // TPE's value orders as the ranking does
        for (x, y) in [
            (a.clone(), b.clone()),
            (out(2.0, 1.5, 3.0), out(2.0, 1.5, 1.0)),
        ] {
            for o in [g.clone(), Objective::Throughput, Objective::Ttft] {
                let by_rank = o.rank(&x, &y);
                let by_value = o.value(&y).total_cmp(&o.value(&x));
                assert_eq!(by_rank, by_value, "{o}");
            }
        }
        assert_eq!(g.score(&Outcome::infeasible()), f64::NEG_INFINITY);
    }
}
