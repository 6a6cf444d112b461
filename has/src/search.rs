//! The searches: HAS (Stage 1 + a TPE study), and the `random`, `coordinate`
//! and `exhaustive` baselines over the same space.

use crate::space::{feasible_allocations, Candidate, FeasibleAllocation};
use crate::stage1::{stage1_rows, Capacities, Stage1Row};
use crate::trial::{Outcome, Trial};
use crate::Objective;
use easerve_calib::StageCost;
use easerve_workload::Scenario;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Largest encode batch bound the baselines search (`B ∈ 1..=B_CAP`).
pub const B_CAP: u32 = 16;
/// The exhaustive grid of B.
pub const B_GRID: [u32; 8] = [1, 2, 3, 4, 6, 8, 12, 16];
/// The exhaustive grid of s (steps of 0.1), clipped to each allocation's range.
pub const S_STEPS: u32 = 10;
/// HAS stops when the best three throughputs are within this fraction of the best.
pub const SPREAD_STOP: f64 = 0.01;
/// HAS stops after this many trials in a row without a better throughput.
pub const PATIENCE: usize = 5;

/// A search method.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Hybrid Auto Selection: Stage 1 pruning, then a TPE study.
    Has,
    /// Uniform samples of the space.
    Random,
    /// Coordinate descent over allocation, B and s.
    Coordinate,
    /// Every allocation × B grid × s grid (simulator only: the ground truth).
    Exhaustive,
    /// EPD-Serve's own optimizer ([`crate::own`]; `search --system epd-serve`).
    #[serde(rename = "epd-serve")]
    EpdServe,
    /// HydraInfer's own selection of its form and instances ([`crate::own`];
    /// `search --system hydrainfer`).
    #[serde(rename = "hydrainfer")]
    HydraInfer,
}

/// A name that is not a [`Method`] (the message lists the methods).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown method `{0}`; allowed: has, random, coordinate, exhaustive")]
pub struct UnknownMethod(pub String);

impl FromStr for Method {
    type Err = UnknownMethod;
    fn from_str(s: &str) -> Result<Self, UnknownMethod> {
        match s {
            "has" => Ok(Method::Has),
            "random" => Ok(Method::Random),
            "coordinate" => Ok(Method::Coordinate),
            "exhaustive" => Ok(Method::Exhaustive),
            _ => Err(UnknownMethod(s.to_string())),
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Has => "has",
            Method::Random => "random",
            Method::Coordinate => "coordinate",
            Method::Exhaustive => "exhaustive",
            Method::EpdServe => "epd-serve",
            Method::HydraInfer => "hydrainfer",
        })
    }
}

/// Why a search stopped.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The trial budget was spent.
    Budget(usize),
    /// HAS: the best three throughputs lie within [`SPREAD_STOP`] of the best.
    TopThreeClose,
    /// HAS: [`PATIENCE`] trials in a row did not raise the best.
    NoImprovement,
    /// HAS: the TPE kept proposing points already tried.
    SpaceExhausted,
    /// HAS: Stage 1 kept no allocation.
    NoSurvivor,
    /// HAS: the TPE refused an observation (a non-finite ranking value or a
    /// parameter outside its range); the message says which.
    TpeRejected(String),
    /// Coordinate descent: a full round changed nothing.
    Converged,
    /// Exhaustive: every grid point ran.
    GridDone(usize),
    /// HAS Stage 2: its time budget, seconds, was spent
    /// ([`SearchConfig::time_budget_s`]).
    TimeBudget(f64),
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::Budget(n) => write!(f, "budget of {n} trials spent"),
            StopReason::TimeBudget(s) => write!(f, "time budget of {s} s spent"),
            StopReason::TopThreeClose => write!(
                f,
                "the best three throughputs are within {:.0} %",
                SPREAD_STOP * 100.0
            ),
            StopReason::NoImprovement => {
                write!(f, "{PATIENCE} trials in a row without a better throughput")
            }
            StopReason::SpaceExhausted => f.write_str(
                "TPE kept proposing points already tried (the survivors' space is nearly exhausted)",
            ),
            StopReason::NoSurvivor => f.write_str("Stage 1 kept no allocation"),
            StopReason::TpeRejected(why) => write!(f, "the TPE refused an observation: {why}"),
            StopReason::Converged => f.write_str("coordinate descent converged"),
            StopReason::GridDone(n) => write!(f, "all {n} grid points run"),
        }
    }
}

/// One trial of a study.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrialRecord {
    /// 1-based trial number.
    pub index: usize,
    /// What ran.
    pub candidate: Candidate,
    /// What it measured.
    pub outcome: Outcome,
    /// Best score of the study so far (this trial included) by its
    /// objective ([`Objective::score`]): goodput or throughput in requests/s,
    /// or minus the mean TTFT in seconds.
    pub best_so_far: f64,
}

/// A finished search.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Study {
    /// Method.
    pub method: Method,
    /// Target rate Λ, requests/s.
    pub rate: f64,
    /// Trial budget (the exhaustive search ignores it).
    pub budget: usize,
    /// Seed.
    pub seed: u64,
    /// Feasible allocations of the cluster.
    pub space: Vec<FeasibleAllocation>,
    /// Stage 1 capacities (HAS only).
    pub capacities: Option<Capacities>,
    /// Stage 1 table (HAS only).
    pub stage1: Vec<Stage1Row>,
    /// Every trial, in order.
    pub trials: Vec<TrialRecord>,
    /// What the trials were ranked by.
    #[serde(with = "objective_text")]
    pub objective: Objective,
    /// The chosen trial: best by the objective, then throughput, then mean
    /// TTFT, then mean TPOT ([`Objective::rank`]).
    pub best: Option<TrialRecord>,
    /// Why the search stopped.
    pub stopped: StopReason,
}

/// What to search.
#[derive(Clone, Debug)]
pub struct SearchConfig {
    /// Method.
    pub method: Method,
    /// Trials at most (≥ 1).
    pub budget: usize,
    /// Seed of the method's own randomness.
    pub seed: u64,
    /// Target rate Λ, requests/s.
    pub rate: f64,
    /// What trials are ranked by (the trial must measure its tier's goodput:
    /// [`crate::SimTrial::scoring`]).
    pub objective: Objective,
    /// HAS Stage 2 stops after this many seconds of trials (wall clock, so
    /// a run that hits it is no longer reproducible to the trial); `None`:
    /// the trial budget alone.
    pub time_budget_s: Option<f64>,
    /// HAS: a deployment run as one more trial once Stage 2 stops (beyond
    /// the budget; not when a trial ran it already, nor when its allocation
    /// is not feasible or its s outside the allocation's range): `easerve
    /// search` gives the scenario's own, so the search never chooses a
    /// deployment its trials rank below the one it was given. Stage 2 does
    /// not see it: its stopping rules and TPE run as without it.
    pub own: Option<Candidate>,
    /// HAS Stage 1: rows for the survivors and this many lowest scores
    /// only ([`crate::stage1::stage1_rows`]: the same survivors, and the
    /// same first rows); `None`: a row for every feasible allocation.
    pub stage1_rows: Option<usize>,
}

/// An [`Objective`] in a study's JSON: as `--objective` spells it.
mod objective_text {
    use super::Objective;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(o: &Objective, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&o.to_string())
    }

    /// The tier's index is not kept (its name is): a study read back ranks
    /// nothing.
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Objective, D::Error> {
        let text = String::deserialize(d)?;
        Ok(match text.as_str() {
            "throughput" => Objective::Throughput,
            "ttft" => Objective::Ttft,
            t => match t.strip_prefix("goodput-per-dollar:") {
                Some(name) => Objective::GoodputPerDollar {
                    name: name.to_string(),
                    tier: 0,
                },
                None => Objective::Goodput {
                    name: t.trim_start_matches("goodput:").to_string(),
                    tier: 0,
                },
            },
        })
    }
}

/// Records trials and keeps the best.
struct Recorder<'a> {
    trials: Vec<TrialRecord>,
    best: Option<TrialRecord>,
    objective: Objective,
    on_trial: &'a mut dyn FnMut(&TrialRecord),
}

impl Recorder<'_> {
    fn record(&mut self, candidate: Candidate, outcome: Outcome) -> &TrialRecord {
        let obj = &self.objective;
        let better = self
            .best
            .as_ref()
            .is_none_or(|b| obj.rank(&outcome, &b.outcome).is_gt());
        let best_so_far = if better {
            obj.score(&outcome)
        } else {
            self.best
                .as_ref()
                .map_or(f64::NEG_INFINITY, |b| obj.score(&b.outcome))
        };
        let rec = TrialRecord {
            index: self.trials.len() + 1,
            candidate,
            outcome,
            best_so_far,
        };
        if better {
            self.best = Some(rec.clone());
        }
        (self.on_trial)(&rec);
        self.trials.push(rec);
        self.trials.last().expect("just pushed")
    }

    fn seen(&self, c: &Candidate) -> Option<&Outcome> {
        self.trials
            .iter()
            .find(|t| t.candidate == *c)
            .map(|t| &t.outcome)
    }
}

/// Whether HAS should stop after `trials`: the best three scores by
/// `objective` lie within [`SPREAD_STOP`] of the best (relative to its
/// magnitude), or [`PATIENCE`] trials in a row did not raise the best
/// (EAServe §3.1, where the score is throughput).
pub fn should_stop(trials: &[TrialRecord], objective: &Objective) -> Option<StopReason> {
    if trials.len() < 3 {
        return None;
    }
    let mut thr: Vec<f64> = trials.iter().map(|t| objective.score(&t.outcome)).collect();
    thr.sort_by(|a, b| b.total_cmp(a));
    if thr[2].is_finite() && thr[0].abs() > 0.0 && (thr[0] - thr[2]) / thr[0].abs() < SPREAD_STOP {
        return Some(StopReason::TopThreeClose);
    }
    let last_gain = trials
        .windows(2)
        .rposition(|w| w[1].best_so_far > w[0].best_so_far)
        .map_or(0, |i| i + 1);
    if trials.len() - 1 - last_gain >= PATIENCE {
        return Some(StopReason::NoImprovement);
    }
    None
}

fn s_at(range: (f64, f64), u: f64) -> f64 {
    let s = range.0 + u.clamp(0.0, 1.0) * (range.1 - range.0);
    (s * 1000.0).round() / 1000.0
}

/// HAS trials at most per search where the caller does not choose (`easerve
/// search --budget`, each `sweep` point, each `capacity` probe, `reproduce`).
pub const DEFAULT_BUDGET: usize = 30;

/// The best deployable trial of a HAS search ([`DEFAULT_BUDGET`] trials, seed
/// `seed`) of `sc` at `rate`, each trial the scenario with `o` and the
/// candidate applied, on the simulator; `None` when no candidate could be
/// deployed.
pub fn tune(
    sc: &Scenario,
    o: &easerve_workload::scenario::Overrides,
    rate: f64,
    seed: u64,
) -> Option<TrialRecord> {
    tune_by(Method::Has, sc, o, rate, seed)
}

/// [`tune_by`] ranking by `objective` instead of the default
/// ([`Objective::default_for`] the scenario's tiers: goodput at `moderate`).
/// Ranked by goodput per dollar, the search on node groups also chooses
/// the group of each stage ([`crate::space::feasible_allocations_across_groups`]);
/// otherwise it keeps the scenario's.
pub fn tune_for(
    method: Method,
    sc: &Scenario,
    o: &easerve_workload::scenario::Overrides,
    rate: f64,
    seed: u64,
    objective: &Objective,
) -> Option<TrialRecord> {
    let cost = easerve_sim::scenario_cost(sc);
    let trial = crate::SimTrial::new(sc.raw.clone(), &sc.file, o.clone()).scoring(objective.tier());
    let cfg = SearchConfig {
        method,
        budget: DEFAULT_BUDGET,
        seed,
        rate,
        objective: objective.clone(),
        time_budget_s: None,
        own: None,
        stage1_rows: None,
    };
    let space = crate::space::search_space(sc, objective, false);
    search_in(sc, space, cost.as_ref(), &trial, &cfg, &mut |_| {})
        .best
        .filter(|b| b.outcome.feasible)
}

/// The configuration rule of serving system `system` ([`tune_by`]): HAS for `easerve`,
/// the baselines' own for `epd-serve` and `hydrainfer` ([`crate::own`]);
/// `None` for a system that runs the scenario's deployment as it is.
pub fn rule_of(system: easerve_workload::scenario::System) -> Option<Method> {
    use easerve_workload::scenario::System;
    match system {
        System::Easerve => Some(Method::Has),
        System::EpdServe => Some(Method::EpdServe),
        System::HydraInfer => Some(Method::HydraInfer),
        System::Passthrough | System::Aggregated => None,
    }
}

/// The best deployable trial of a search of `sc` at `rate` by `method`
/// (seed `seed`, [`DEFAULT_BUDGET`] trials where the method counts them),
/// each trial the scenario with `o` and the candidate applied, on the
/// simulator, ranked by the default objective ([`Objective::default_for`]:
/// goodput at the `moderate` tier): with [`rule_of`]`(sc.system)`, the
/// system's own choice. `None` when no candidate could be deployed.
pub fn tune_by(
    method: Method,
    sc: &Scenario,
    o: &easerve_workload::scenario::Overrides,
    rate: f64,
    seed: u64,
) -> Option<TrialRecord> {
    tune_for(method, sc, o, rate, seed, &Objective::default_for(&sc.slo))
}

/// Run a search of `sc` at `cfg.rate` with trials from `trial`; `on_trial` sees
/// each trial as it completes.
pub fn search(
    sc: &Scenario,
    cost: &dyn StageCost,
    trial: &dyn Trial,
    cfg: &SearchConfig,
    on_trial: &mut dyn FnMut(&TrialRecord),
) -> Study {
    search_in(sc, feasible_allocations(sc), cost, trial, cfg, on_trial)
}

/// [`search`] over `space`, the scenario's [`feasible_allocations`] a
/// caller already has (enumerating them is most of a large cluster's
/// Stage 1).
pub fn search_in(
    sc: &Scenario,
    space: Vec<FeasibleAllocation>,
    cost: &dyn StageCost,
    trial: &dyn Trial,
    cfg: &SearchConfig,
    on_trial: &mut dyn FnMut(&TrialRecord),
) -> Study {
    let mut rng = ChaCha8Rng::seed_from_u64(easerve_workload::rng::subseed(
        cfg.seed,
        &format!("search-{}", cfg.method),
    ));
    let mut rec = Recorder {
        trials: Vec::new(),
        best: None,
        objective: cfg.objective.clone(),
        on_trial,
    };
    let budget = cfg.budget.max(1);
    let mut capacities = None;
    let mut rows = Vec::new();
    let stopped = match cfg.method {
        Method::Has => {
            let (caps, table) = stage1_rows(sc, cost, &space, cfg.rate, cfg.stage1_rows);
            capacities = Some(caps);
            rows = table;
            let limits = Limits {
                trials: budget,
                seconds: cfg.time_budget_s,
            };
            let stopped = has(&rows, trial, limits, &mut rng, &mut rec, &cfg.objective);
            if let Some(own) = cfg.own.as_ref().filter(|c| admits(&space, c)) {
                if rec.seen(own).is_none() {
                    rec.record(own.clone(), trial.run(own));
                }
            }
            stopped
        }
        Method::Random => random(&space, trial, budget, &mut rng, &mut rec),
        Method::Coordinate => coordinate(&space, trial, budget, &mut rec),
        Method::Exhaustive => exhaustive(&space, trial, &mut rec),
        Method::EpdServe | Method::HydraInfer => {
            let runs = crate::own::evaluate(sc, &space, cfg, trial);
            for (c, o) in runs {
                rec.record(c, o);
            }
            StopReason::GridDone(rec.trials.len())
        }
    };
    Study {
        method: cfg.method,
        rate: cfg.rate,
        budget,
        seed: cfg.seed,
        space,
        capacities,
        stage1: rows,
        objective: cfg.objective.clone(),
        best: rec.best.clone(),
        trials: rec.trials,
        stopped,
    }
}

/// The three TPE optimisers of HAS's Stage 2 ([`crate::tpe`]): the
/// allocation (categorical over Stage 1's survivors), and `B` and `s` as
/// fractions of their ranges.
struct Tpe {
    alloc: crate::tpe::Tpe,
    b: crate::tpe::Tpe,
    s: crate::tpe::Tpe,
}

impl Tpe {
    fn new(survivors: usize) -> Tpe {
        use crate::tpe::Domain;
        let unit = || crate::tpe::Tpe::new(Domain::Range { lo: 0.0, hi: 1.0 });
        Tpe {
            alloc: crate::tpe::Tpe::new(Domain::Categorical(survivors)),
            b: unit(),
            s: unit(),
        }
    }

    /// Tell all three what `(i, ub, us)` scored.
    fn tell(&mut self, (i, ub, us): (usize, f64, f64), v: f64) -> Result<(), StopReason> {
        let refused = |what: &str, e: crate::tpe::TellError| {
            StopReason::TpeRejected(format!("{what}: {e} (ranking value {v})"))
        };
        self.alloc
            .tell(i as f64, v)
            .map_err(|e| refused("allocation", e))?;
        self.b.tell(ub, v).map_err(|e| refused("B", e))?;
        self.s.tell(us, v).map_err(|e| refused("s", e))
    }
}

/// HAS Stage 2: one TPE study over Stage 1's survivors, seeded with each
/// survivor's analytical optimum `(B_max, s*)`, stopped by [`should_stop`].
/// The seed trials run in parallel (rayon) unless a time budget is set; the
/// TPE's trials after them run in turn, each asked after the last is told.
fn has(
    rows: &[Stage1Row],
    trial: &dyn Trial,
    limits: Limits,
    rng: &mut ChaCha8Rng,
    rec: &mut Recorder<'_>,
    objective: &Objective,
) -> StopReason {
    let survivors: Vec<&Stage1Row> = rows.iter().filter(|r| r.kept).collect();
    if survivors.is_empty() {
        return StopReason::NoSurvivor;
    }
    let mut opt = Tpe::new(survivors.len());
    // value to minimise: the ranking, folded into one number
    let value = |o: &Outcome| objective.value(o);
    let candidate = |i: usize, ub: f64, us: f64| {
        let r = survivors[i];
        Candidate {
            allocation: r.allocation,
            batch: (1 + (ub.clamp(0.0, 0.999_999) * f64::from(r.b_max)) as u32).min(r.b_max),
            offload: s_at(r.s_range, us),
            groups: r.groups.clone(),
        }
    };
    let budget = limits.trials;
    let started = std::time::Instant::now();
    let seed = |i: usize| {
        let r = survivors[i];
        let us = if r.s_range.1 > r.s_range.0 {
            (r.s_star - r.s_range.0) / (r.s_range.1 - r.s_range.0)
        } else {
            0.5
        };
        (i, 0.999_999, us)
    };
    // the seeds depend on Stage 1 alone: without a time budget they run at
    // once on rayon's threads, and are recorded and told below in the serial
    // order, so the study is the serial one (a time budget runs them one at
    // a time, to stop between them)
    let mut seeded: Vec<Option<Outcome>> = match limits.seconds {
        Some(_) => Vec::new(),
        None => {
            use rayon::prelude::*;
            (0..survivors.len().min(budget))
                .into_par_iter()
                .map(|i| {
                    let (i, ub, us) = seed(i);
                    Some(trial.run(&candidate(i, ub, us)))
                })
                .collect()
        }
    };
    let mut asked = 0;
    // a repeated point is told again but costs no trial; bound the asking
    while rec.trials.len() < budget && asked < survivors.len() + 20 * budget {
        if let Some(s) = limits
            .seconds
            .filter(|&s| !rec.trials.is_empty() && started.elapsed().as_secs_f64() >= s)
        {
            return StopReason::TimeBudget(s);
        }
        // seeds first: each survivor's analytical optimum (B_max, s*)
        let point = if asked < survivors.len() {
            seed(asked)
        } else {
            let i = opt.alloc.ask(&mut *rng) as usize;
            (
                i.min(survivors.len() - 1),
                opt.b.ask(&mut *rng),
                opt.s.ask(&mut *rng),
            )
        };
        let ran = seeded.get_mut(asked).and_then(Option::take);
        asked += 1;
        let c = candidate(point.0, point.1, point.2);
        if let Some(o) = rec.seen(&c) {
            if let Err(stop) = opt.tell(point, value(o)) {
                return stop;
            }
            continue;
        }
        let outcome = ran.unwrap_or_else(|| trial.run(&c));
        let v = value(&outcome);
        rec.record(c, outcome);
        if let Err(stop) = opt.tell(point, v) {
            return stop;
        }
        if rec.trials.len() >= survivors.len() {
            if let Some(why) = should_stop(&rec.trials, objective) {
                return why;
            }
        }
    }
    if rec.trials.len() < budget {
        StopReason::SpaceExhausted
    } else {
        StopReason::Budget(budget)
    }
}

/// Whether `c` is a point of `space`: its allocation feasible, its s within
/// the allocation's range, B ≥ 1.
fn admits(space: &[FeasibleAllocation], c: &Candidate) -> bool {
    space.iter().any(|f| {
        let (lo, hi) = f.offload_range;
        f.is_of(c) && c.batch >= 1 && c.offload >= lo - 1e-12 && c.offload <= hi + 1e-12
    })
}

/// What bounds HAS Stage 2: trials, and seconds when given.
#[derive(Clone, Copy, Debug)]
struct Limits {
    trials: usize,
    seconds: Option<f64>,
}

/// Uniformly random points of the space, `budget` of them.
fn random(
    space: &[FeasibleAllocation],
    trial: &dyn Trial,
    budget: usize,
    rng: &mut ChaCha8Rng,
    rec: &mut Recorder<'_>,
) -> StopReason {
    while rec.trials.len() < budget && !space.is_empty() {
        let fa = &space[rng.gen_range(0..space.len())];
        let c = Candidate {
            allocation: fa.allocation,
            batch: rng.gen_range(1..=B_CAP),
            offload: s_at(fa.offload_range, rng.gen::<f64>()),
            groups: fa.groups.clone(),
        };
        let outcome = trial.run(&c);
        rec.record(c, outcome);
    }
    StopReason::Budget(budget)
}

/// Coordinate descent over (allocation, B, s), one dimension at a time,
/// until a full round changes nothing or the budget is spent.
fn coordinate(
    space: &[FeasibleAllocation],
    trial: &dyn Trial,
    budget: usize,
    rec: &mut Recorder<'_>,
) -> StopReason {
    let Some(first) = space.first() else {
        return StopReason::Budget(budget);
    };
    let mut cur = Candidate {
        allocation: first.allocation,
        batch: 4,
        offload: s_at(first.offload_range, 0.5),
        groups: first.groups.clone(),
    };
    let range_of = |c: &Candidate| {
        space
            .iter()
            .find(|f| f.is_of(c))
            .map_or((1.0, 1.0), |f| f.offload_range)
    };
    loop {
        let mut improved = false;
        for dim in 0..3 {
            let options: Vec<Candidate> = match dim {
                0 => space
                    .iter()
                    .map(|f| Candidate {
                        allocation: f.allocation,
                        batch: cur.batch,
                        offload: cur.offload.clamp(f.offload_range.0, f.offload_range.1),
                        groups: f.groups.clone(),
                    })
                    .collect(),
                1 => [1, 2, 4, 8, 16]
                    .iter()
                    .map(|&b| Candidate {
                        batch: b,
                        ..cur.clone()
                    })
                    .collect(),
                _ => (0..=4)
                    .map(|k| Candidate {
                        offload: s_at(range_of(&cur), f64::from(k) / 4.0),
                        ..cur.clone()
                    })
                    .collect(),
            };
            let mut best = (cur.clone(), rec.seen(&cur).cloned());
            for c in options {
                let o = match rec.seen(&c) {
                    Some(o) => o.clone(),
                    None => {
                        if rec.trials.len() >= budget {
                            return StopReason::Budget(budget);
                        }
                        let o = trial.run(&c);
                        rec.record(c.clone(), o.clone());
                        o
                    }
                };
                if best
                    .1
                    .as_ref()
                    .is_none_or(|b| rec.objective.rank(&o, b).is_gt())
                {
                    if best.1.is_some() && best.0 != c {
                        improved = true;
                    }
                    best = (c, Some(o));
                }
            }
            cur = best.0;
        }
        if !improved {
            return StopReason::Converged;
        }
    }
}

/// Every point of the grid `B_GRID × s in steps of 1/S_STEPS` on every
/// feasible allocation, in parallel.
fn exhaustive(
    space: &[FeasibleAllocation],
    trial: &dyn Trial,
    rec: &mut Recorder<'_>,
) -> StopReason {
    let grid: Vec<Candidate> = space
        .iter()
        .flat_map(|fa| {
            let (lo, hi) = fa.offload_range;
            let ss: Vec<f64> = (0..=S_STEPS)
                .map(|k| f64::from(k) / f64::from(S_STEPS))
                .filter(|s| *s >= lo - 1e-12 && *s <= hi + 1e-12)
                .collect();
            B_GRID.iter().flat_map(move |&b| {
                ss.clone().into_iter().map(move |s| Candidate {
                    allocation: fa.allocation,
                    batch: b,
                    offload: s,
                    groups: fa.groups.clone(),
                })
            })
        })
        .collect();
    let outcomes: Vec<Outcome> = grid.par_iter().map(|c| trial.run(c)).collect();
    for (c, o) in grid.into_iter().zip(outcomes) {
        rec.record(c, o);
    }
    StopReason::GridDone(rec.trials.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: usize, thr: f64, best: f64) -> TrialRecord {
        TrialRecord {
            index: i,
            candidate: Candidate {
                allocation: "1E(TP1)+1P(TP1)+1D(TP1)".parse().unwrap(),
                batch: 1,
                offload: 1.0,
                groups: None,
            },
            outcome: Outcome {
                throughput: thr,
                mean_ttft: 1.0,
                mean_tpot: 0.1,
                feasible: true,
                attainment: None,
                goodput: None,
                slo_goodput: None,
                cost_per_hour: None,
            },
            best_so_far: best,
        }
    }

    /// A trial that always measures the same.
    struct Same;

    impl Trial for Same {
        fn run(&self, _: &Candidate) -> Outcome {
            rec(0, 1.0, 1.0).outcome
        }
        fn run_at(&self, c: &Candidate, _: f64, _: usize) -> Outcome {
            self.run(c)
        }
    }

    /// A Stage 1 row kept with loads of 0.1, its offload `s_star` within
    /// `s_range`, B ≤ 4.
    fn kept_row(a: &str, s_star: f64, s_range: (f64, f64)) -> Stage1Row {
        Stage1Row {
            allocation: a.parse().unwrap(),
            encode_load: 0.1,
            prefill_load: 0.1,
            decode_load: 0.1,
            score: 0.1,
            c_remote: 1.0,
            c_local: 0.0,
            alpha: 0.0,
            s_star,
            s_range,
            b_max: 4,
            latency_s: 0.0,
            groups: None,
            kept: true,
            reason: String::new(),
        }
    }

    /// [`has`] over `rows` with `trial`, at most `trials` trials and
    /// `seconds`, ranked by throughput: why it stopped, the trials recorded
    /// and the indexes `on_trial` saw, in order.
    fn search_with(
        rows: &[Stage1Row],
        trial: &dyn Trial,
        seed: u64,
        trials: usize,
        seconds: Option<f64>,
    ) -> (StopReason, Vec<TrialRecord>, Vec<usize>) {
        let mut seen = Vec::new();
        let mut on = |t: &TrialRecord| seen.push(t.index);
        let mut r = Recorder {
            trials: Vec::new(),
            best: None,
            objective: Objective::Throughput,
            on_trial: &mut on,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let limits = Limits { trials, seconds };
        let why = has(
            rows,
            trial,
            limits,
            &mut rng,
            &mut r,
            &Objective::Throughput,
        );
        let recorded = r.trials;
        (why, recorded, seen)
    }

    /// Stage 2's time budget: at 0 s one trial runs, then the search stops
    /// saying why; without it the trial budget bounds it (microseconds).
    #[test]
    fn a_time_budget_stops_stage_2() {
        let rows = [
            kept_row("1E(TP1)+1P(TP1)+1D(TP1)", 1.0, (1.0, 1.0)),
            kept_row("1E(TP1)+2P(TP1)+1D(TP1)", 1.0, (1.0, 1.0)),
        ];
        let run = |seconds| {
            let (why, trials, _) = search_with(&rows, &Same, 1, 3, seconds);
            (why, trials.len())
        };
        assert_eq!(run(Some(0.0)), (StopReason::TimeBudget(0.0), 1));
        assert_ne!(run(None).0, StopReason::TimeBudget(0.0));
        assert!(run(None).1 > 1);
    }

    /// A trial whose throughput depends on the candidate (more prefill
    /// workers, larger B and s: more), slow enough that rayon's threads
    /// finish the seeds out of order.
    struct Shaped;

    impl Trial for Shaped {
        fn run(&self, c: &Candidate) -> Outcome {
            let p = f64::from(c.allocation.prefill.workers);
            std::thread::sleep(std::time::Duration::from_millis(5 * (4 - p as u64)));
            let mut o = rec(0, 1.0, 1.0).outcome;
            o.throughput = p + 0.1 * f64::from(c.batch) + c.offload;
            o
        }
        fn run_at(&self, c: &Candidate, _: f64, _: usize) -> Outcome {
            self.run(c)
        }
    }

    /// Stage 2's seeds run in parallel (no time budget) and the study is the
    /// serial one (a time budget too long to stop it runs them in turn):
    /// the same trials in the same order (about 50 ms).
    #[test]
    fn parallel_seed_trials_give_the_serial_study() {
        let rows = ["1", "2", "3"]
            .map(|p| kept_row(&format!("1E(TP1)+{p}P(TP1)+1D(TP1)"), 0.9, (0.8, 1.0)));
        let parallel = search_with(&rows, &Shaped, 7, 8, None);
        assert!(parallel.2.len() >= 3);
        assert_eq!(parallel, search_with(&rows, &Shaped, 7, 8, Some(1e9)));
    }

    /// A refused observation stops the search with the reason instead of
    /// being dropped (it used to be discarded, and the TPE learnt nothing).
    #[test]
    fn a_refused_tpe_observation_stops_the_search_with_its_reason() {
        let mut opt = Tpe::new(2);
        assert_eq!(opt.tell((1, 0.5, 0.5), -3.0), Ok(()));
        let stop = opt.tell((0, 1.5, 0.5), -3.0).unwrap_err();
        assert!(
            matches!(&stop, StopReason::TpeRejected(why) if why.starts_with("B: the parameter value 1.5")),
            "{stop}"
        );
    }

    /// Trials on two stage assignments of one allocation: on `l40s,h100,h100`
    /// (30 per hour) goodput 4.2 req/s, on `h100,h100,h100` (24 per hour)
    /// 4.1 req/s.
    struct Priced;

    impl Trial for Priced {
        fn run(&self, c: &Candidate) -> Outcome {
            let mixed = c.groups.as_ref().is_some_and(|g| g[0] == "l40s");
            let mut o = rec(0, 4.2, 1.0).outcome;
            (o.slo_goodput, o.cost_per_hour) = match mixed {
                true => (Some(4.2), Some(30.0)),
                false => (Some(4.1), Some(24.0)),
            };
            o.throughput = o.slo_goodput.unwrap_or(0.0);
            o
        }
        fn run_at(&self, c: &Candidate, _: f64, _: usize) -> Outcome {
            self.run(c)
        }
    }

    /// Goodput per dollar picks the cheaper allocation over a dearer one
    /// with slightly higher goodput (4.1 / 24 > 4.2 / 30); goodput picks
    /// the dearer (microseconds).
    #[test]
    fn goodput_per_dollar_picks_the_cheaper_of_two_close_goodputs() {
        let rows = ["l40s", "h100"].map(|e| Stage1Row {
            groups: Some([e, "h100", "h100"].map(String::from)),
            ..kept_row("2E(TP1)+1P(TP2)+1D(TP4)", 1.0, (1.0, 1.0))
        });
        let pick = |objective: Objective| {
            let mut on = |_: &TrialRecord| {};
            let mut r = Recorder {
                trials: Vec::new(),
                best: None,
                objective: objective.clone(),
                on_trial: &mut on,
            };
            let mut rng = ChaCha8Rng::seed_from_u64(1);
            let limits = Limits {
                trials: 4,
                seconds: None,
            };
            has(&rows, &Priced, limits, &mut rng, &mut r, &objective);
            r.best.unwrap().candidate.groups.unwrap()[0].clone()
        };
        let (name, tier) = ("moderate".to_string(), 0);
        let per_dollar = Objective::GoodputPerDollar {
            name: name.clone(),
            tier,
        };
        assert_eq!(pick(per_dollar), "h100");
        assert_eq!(pick(Objective::Goodput { name, tier }), "l40s");
    }

    #[test]
    fn stops_on_a_tight_top_three() {
        let t = vec![rec(1, 1.0, 1.0), rec(2, 2.0, 2.0), rec(3, 1.995, 2.0)];
        assert_eq!(should_stop(&t, &Objective::Throughput), None);
        let mut t2 = t.clone();
        t2.push(rec(4, 1.99, 2.0));
        assert_eq!(
            should_stop(&t2, &Objective::Throughput),
            Some(StopReason::TopThreeClose)
        );
    }

    #[test]
    fn stops_after_five_trials_without_improvement() {
        let mut t = vec![rec(1, 1.0, 1.0), rec(2, 2.0, 2.0)];
        for i in 0..4 {
            t.push(rec(3 + i, 0.5 + 0.1 * i as f64, 2.0));
        }
        assert_eq!(
            should_stop(&t, &Objective::Throughput),
            None,
            "4 without improvement"
        );
        t.push(rec(7, 0.3, 2.0));
        assert_eq!(
            should_stop(&t, &Objective::Throughput),
            Some(StopReason::NoImprovement)
        );
    }

    #[test]
    fn methods_parse_and_print() {
        for m in ["has", "random", "coordinate", "exhaustive"] {
            assert_eq!(m.parse::<Method>().unwrap().to_string(), m);
        }
        assert!("grid".parse::<Method>().is_err());
    }
}
