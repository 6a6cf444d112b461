//! Planning and running a sweep: the serving systems it compares, the
//! scenario variants of `--set`, the points (variant × system × rate × seed)
//! in their fixed order, a shard of them, and the runs (in parallel, rayon),
//! `easerve` tuned by a HAS search at each point.

use super::{SweepPart, SweepRow};
use easerve_workload::scenario::{num, Overrides, Scenario, ScenarioError, System};
use easerve_workload::Report;
use rayon::prelude::*;
use std::path::{Path, PathBuf};

/// A serving system a sweep compares (`--systems`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SweptSystem {
    /// The scenario's allocation run as a pass-through EPD framework does
    /// ([`System::Passthrough`]).
    Passthrough,
    /// Replicas running encode inline ([`System::Aggregated`]).
    Aggregated,
    /// The scenario's own deployment with s = 1 (every prefill remote).
    EaserveS1,
    /// The scenario's own deployment as it is (allocation, B, s, policies):
    /// for comparing runtime knobs (`--set deployment.rate_estimator=…`).
    AsIs,
    /// easerve with its allocation, B and s chosen by a HAS search at each
    /// point ([`easerve_has::tune`]).
    Easerve,
    /// EPD-Serve ([`System::EpdServe`]) at the configuration its own
    /// optimizer chooses at each point ([`easerve_has::own`]).
    EpdServe,
    /// HydraInfer ([`System::HydraInfer`]) in the form and instances its own
    /// selection chooses at each point ([`easerve_has::own`]).
    HydraInfer,
}

impl SweptSystem {
    /// The systems `--systems` runs by default, in order (and `easerve
    /// reproduce`'s rate sweeps).
    pub const DEFAULT: [SweptSystem; 4] = [
        SweptSystem::Passthrough,
        SweptSystem::Aggregated,
        SweptSystem::EaserveS1,
        SweptSystem::Easerve,
    ];

    /// Every system a sweep can compare.
    pub const ALL: [SweptSystem; 7] = [
        SweptSystem::Passthrough,
        SweptSystem::Aggregated,
        SweptSystem::EaserveS1,
        SweptSystem::AsIs,
        SweptSystem::Easerve,
        SweptSystem::EpdServe,
        SweptSystem::HydraInfer,
    ];

    /// The name on the command line and in the sweep's rows.
    pub fn name(self) -> &'static str {
        match self {
            SweptSystem::Passthrough => "passthrough",
            SweptSystem::Aggregated => "aggregated",
            SweptSystem::EaserveS1 => "easerve-s1",
            SweptSystem::AsIs => "as-is",
            SweptSystem::Easerve => "easerve",
            SweptSystem::EpdServe => "epd-serve",
            SweptSystem::HydraInfer => "hydrainfer",
        }
    }

    /// The serving system its runs name.
    pub fn system(self) -> System {
        match self {
            SweptSystem::Passthrough => System::Passthrough,
            SweptSystem::Aggregated => System::Aggregated,
            SweptSystem::EaserveS1 | SweptSystem::AsIs | SweptSystem::Easerve => System::Easerve,
            SweptSystem::EpdServe => System::EpdServe,
            SweptSystem::HydraInfer => System::HydraInfer,
        }
    }

    /// Whether its deployment is chosen by a search at each point (the
    /// system's own rule, [`easerve_has::rule_of`]).
    pub fn searched(self) -> bool {
        matches!(
            self,
            SweptSystem::Easerve | SweptSystem::EpdServe | SweptSystem::HydraInfer
        )
    }

    /// The scenario fields this system chooses itself: `passthrough` runs
    /// B = 1, `immediate` dispatch and s = 1; `easerve-s1` runs s = 1;
    /// `easerve` takes its allocation, B and s from a search at each point;
    /// `epd-serve` its allocation and B from its optimizer, with greedy
    /// dispatch and s = 1; `hydrainfer` its allocation (form) from its
    /// selection, B and the prefill token budget from its TPOT SLO, greedy
    /// dispatch and time-sliced sharing; `aggregated` runs whole replicas
    /// with encode inline, so no EPD knob applies.
    pub fn fixed_fields(self) -> &'static [&'static str] {
        match self {
            SweptSystem::Passthrough => &[
                "deployment.batch",
                "deployment.offload",
                "deployment.dispatch",
            ],
            SweptSystem::EaserveS1 => &["deployment.offload"],
            SweptSystem::AsIs => &[],
            SweptSystem::Easerve => &[
                "deployment.allocation",
                "deployment.batch",
                "deployment.offload",
            ],
            SweptSystem::EpdServe => &[
                "deployment.allocation",
                "deployment.batch",
                "deployment.offload",
                "deployment.dispatch",
            ],
            SweptSystem::HydraInfer => &[
                "deployment.allocation",
                "deployment.batch",
                "deployment.offload",
                "deployment.dispatch",
                "deployment.sm_policy",
                "deployment.prefill_token_budget",
            ],
            SweptSystem::Aggregated => &[
                "deployment.allocation",
                "deployment.batch",
                "deployment.offload",
                "deployment.dispatch",
                "deployment.sm_policy",
                "deployment.router",
            ],
        }
    }

    /// The overrides of one run of this system: `rate` (requests/s), `seed`,
    /// `requests` (`None`: the scenario's), the system, and s = 1 for
    /// `easerve-s1`.
    pub fn overrides(self, rate: f64, seed: u64, requests: Option<i64>) -> Overrides {
        let mut o = Overrides {
            rate: Some(rate),
            seed: Some(seed),
            requests,
            ..Default::default()
        };
        o.system = Some(self.system());
        if self == SweptSystem::EaserveS1 {
            o.offload = Some(1.0);
        }
        o
    }
}

impl std::fmt::Display for SweptSystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A system name that is none of [`SweptSystem::ALL`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "unknown system `{0}`; allowed: passthrough, aggregated, easerve-s1, as-is, easerve, epd-serve, hydrainfer"
)]
pub struct UnknownSystem(pub String);

impl std::str::FromStr for SweptSystem {
    type Err = UnknownSystem;
    fn from_str(s: &str) -> Result<Self, UnknownSystem> {
        SweptSystem::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| UnknownSystem(s.to_string()))
    }
}

/// A scenario variant: its label (`key=value` joined by `, `; empty for the
/// scenario as it is) and the dotted-path fields it sets.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Variant {
    /// `key=value` of each field it sets, joined by `, `.
    pub label: String,
    /// `(dotted key, value)` of each field it sets, as [`Scenario::load_with`] takes them.
    pub sets: Vec<(String, String)>,
}

/// One run of a sweep.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    /// Index of its variant in [`SweepPlan::variants`].
    pub variant: usize,
    /// Serving system.
    pub system: SweptSystem,
    /// Offered rate, requests/s.
    pub rate: f64,
    /// Master seed.
    pub seed: u64,
}

/// The `index`-th of `count` disjoint parts of a sweep (0-based): the points
/// whose position modulo `count` is `index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// Which part, `0 ..count`.
    pub index: usize,
    /// Parts in all, ≥ 1.
    pub count: usize,
}

impl Shard {
    /// The whole sweep as one part (`0/1`).
    pub const WHOLE: Shard = Shard { index: 0, count: 1 };
}

/// Why a sweep cannot run, or a point of it failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SweepError {
    /// The scenario (with the sweep's requests) does not load.
    #[error("{0}")]
    Scenario(#[from] ScenarioError),
    /// A variant × system × rate is not a valid scenario (checked before any
    /// run); the message names the rate, and the variant and system where
    /// the sweep has variants.
    #[error("{message}")]
    Invalid {
        /// The scenario error with the rate (and variant, system) appended.
        message: String,
    },
    /// A point failed while the sweep ran.
    #[error("a sweep point failed: {0}")]
    Point(ScenarioError),
}

/// A sweep: a scenario file over rates × variants × systems × `seeds` seeds,
/// `first_seed, first_seed + 1, …` (the `sweep` command starts at the
/// scenario's own seed, so its first seed runs what `sim` and `search` run).
#[derive(Clone, Debug, PartialEq)]
pub struct SweepPlan {
    /// The scenario file.
    pub scenario: PathBuf,
    /// Offered rates, requests/s.
    pub rates: Vec<f64>,
    /// The scenario variants (one, empty, without `--set`).
    pub variants: Vec<Variant>,
    /// Systems compared.
    pub systems: Vec<SweptSystem>,
    /// Seeds per point.
    pub seeds: u64,
    /// The first seed; the others follow it (1 unless [`with_first_seed`](Self::with_first_seed)).
    pub first_seed: u64,
    /// Requests per run (`None`: the scenario's).
    pub requests: Option<i64>,
    /// What parts must agree on to merge ([`SweepPart::fingerprint`]).
    pub fingerprint: String,
}

impl SweepPlan {
    /// A sweep over the variants of `--set` (`sets` as given, for the
    /// fingerprint; `variants` the grid they make).
    pub fn new(
        scenario: &Path,
        rates: Vec<f64>,
        sets: &[String],
        variants: Vec<Variant>,
        systems: Vec<SweptSystem>,
        seeds: u64,
        requests: Option<i64>,
    ) -> Self {
        let fingerprint = format!(
            "rates={:?} sets={:?} systems={:?} seeds={}",
            rates,
            sets,
            names(&systems),
            seeds
        );
        SweepPlan {
            scenario: scenario.to_path_buf(),
            rates,
            variants,
            systems,
            seeds,
            first_seed: 1,
            requests,
            fingerprint,
        }
    }

    /// A sweep of the scenario as it is, without variants (`easerve reproduce`).
    pub fn whole(
        scenario: &Path,
        rates: &[f64],
        systems: &[SweptSystem],
        seeds: u64,
        requests: Option<i64>,
    ) -> Self {
        let fingerprint = format!("rates={rates:?} systems={:?} seeds={seeds}", names(systems));
        SweepPlan {
            scenario: scenario.to_path_buf(),
            rates: rates.to_vec(),
            variants: vec![Variant::default()],
            systems: systems.to_vec(),
            seeds,
            first_seed: 1,
            requests,
            fingerprint,
        }
    }

    /// The same sweep with seeds `first, first + 1, …` (each wrapping past `u64::MAX`).
    #[must_use]
    pub fn with_first_seed(mut self, first: u64) -> Self {
        self.first_seed = first;
        self.fingerprint = format!("{} first_seed={first}", self.fingerprint);
        self
    }

    /// The seeds each (variant, system, rate) runs, in order.
    pub fn seed_list(&self) -> Vec<u64> {
        (0..self.seeds)
            .map(|k| self.first_seed.wrapping_add(k))
            .collect()
    }

    /// Every variant × system must be a valid scenario before anything runs
    /// (at every rate: a rate can be out of range for the workload's size).
    pub fn check(&self) -> Result<(), SweepError> {
        for v in &self.variants {
            for &s in &self.systems {
                for &rate in &self.rates {
                    let o = s.overrides(rate, self.first_seed, self.requests);
                    Scenario::load_with(&self.scenario, &v.sets, &o).map_err(|e| {
                        // the sweep's rate comes from --rates
                        let e = e.to_string().replace("--rate /", "--rates /");
                        SweepError::Invalid {
                            message: format!(
                                "{e} (rate {}{})",
                                num(rate),
                                if v.label.is_empty() {
                                    String::new()
                                } else {
                                    format!(", variant {}, system {s}", v.label)
                                }
                            ),
                        }
                    })?;
                }
            }
        }
        Ok(())
    }

    /// Every point of the whole sweep, in order: variant, then system, then
    /// rate, then seed.
    pub fn points(&self) -> Vec<Point> {
        let mut points = Vec::new();
        let seeds = self.seed_list();
        for variant in 0..self.variants.len() {
            for &system in &self.systems {
                for &rate in &self.rates {
                    for &seed in &seeds {
                        points.push(Point {
                            variant,
                            system,
                            rate,
                            seed,
                        });
                    }
                }
            }
        }
        points
    }

    /// The points of `shard`, with their positions in the whole sweep.
    pub fn shard_points(&self, shard: Shard) -> Vec<(usize, Point)> {
        self.points()
            .into_iter()
            .enumerate()
            .filter(|(i, _)| i % shard.count == shard.index)
            .collect()
    }

    /// Run the points of `shard` in parallel (rayon) and return its part;
    /// `on_point` is called as each point ends (from any thread).
    pub fn run(&self, shard: Shard, on_point: &(dyn Fn() + Sync)) -> Result<SweepPart, SweepError> {
        let base = Scenario::load(
            &self.scenario,
            &Overrides {
                requests: self.requests,
                ..Default::default()
            },
        )?;
        let total = self.points().len();
        let mine = self.shard_points(shard);
        let rows: Vec<Result<SweepRow, SweepError>> = mine
            .par_iter()
            .map(|&(i, p)| {
                let r = self.row(i, &p);
                on_point();
                r
            })
            .collect();
        let rows = rows.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok(SweepPart {
            scenario: std::fs::canonicalize(&self.scenario)
                .unwrap_or(self.scenario.clone())
                .display()
                .to_string(),
            fingerprint: self.fingerprint.clone(),
            tiers: base.slo.iter().map(|t| t.name.clone()).collect(),
            total,
            requests: self.requests,
            shard: (shard.index, shard.count),
            rows,
        })
    }

    /// The row of point `p`, at position `index` of the whole sweep.
    fn row(&self, index: usize, p: &Point) -> Result<SweepRow, SweepError> {
        let variant = &self.variants[p.variant];
        let (report, ttfts) = run_point(&self.scenario, &variant.sets, p, self.requests)
            .map_err(SweepError::Point)?;
        let mut row = SweepRow::new(
            index,
            &variant.label,
            p.system,
            p.rate,
            p.seed,
            &report,
            ttfts,
        );
        // the system chose these itself: the variant's values were ignored
        let fixed = p.system.fixed_fields();
        row.ignored = variant
            .sets
            .iter()
            .filter(|(k, _)| fixed.contains(&k.as_str()))
            .map(|(k, _)| k.clone())
            .collect();
        Ok(row)
    }
}

fn names(systems: &[SweptSystem]) -> Vec<&'static str> {
    systems.iter().map(|s| s.name()).collect()
}

/// Run one point: simulate (for `easerve`, after a HAS search at that
/// point); its report and its requests' TTFTs, seconds.
fn run_point(
    path: &Path,
    sets: &[(String, String)],
    p: &Point,
    requests: Option<i64>,
) -> Result<(Report, Vec<f64>), ScenarioError> {
    let sc = point_scenario(path, sets, p, requests)?;
    let out = easerve_sim::simulate(&sc);
    let ttfts = out.records.iter().filter_map(|r| r.ttft()).collect();
    Ok((out.report, ttfts))
}

/// The scenario one point runs: the system's overrides, and for `easerve`,
/// `epd-serve` and `hydrainfer` the deployment the system's own rule chose
/// at that point (HAS for easerve).
pub fn point_scenario(
    path: &Path,
    sets: &[(String, String)],
    p: &Point,
    requests: Option<i64>,
) -> Result<Scenario, ScenarioError> {
    let mut o = p.system.overrides(p.rate, p.seed, requests);
    if p.system.searched() {
        let sc = Scenario::load_with(path, sets, &o)?;
        let rule = easerve_has::rule_of(sc.system);
        if let Some(best) = rule.and_then(|m| easerve_has::tune_by(m, &sc, &o, p.rate, p.seed)) {
            o = best.candidate.overrides(&o);
        }
    }
    Scenario::load_with(path, sets, &o)
}
