//! Search quality of HAS against its baselines: over the image, video and audio
//! scenarios at Λ = 5 req/s and 5 seeds, per method, the median best throughput
//! as a percentage of the exhaustive best and the median number of trials to
//! reach 90 % and 99 % of it (budget 30; "-" = not reached by the median run).
//! Also the median wall time of one search.
//!
//! Group `search_scale` (criterion): the time of one HAS search on the
//! file's stage groups (Stage 1's enumeration of the allocations included;
//! not the other assignments of stages to groups `easerve search`
//! enumerates as well) on `dc-256.toml` scaled to 8,
//! 64, 256 and 1,024 GPUs ([`scaled`]: a quarter L40S encoders, three
//! quarters H100 for prefill and decode, the rate and the requests per trial
//! in proportion); each size first prints its feasible allocations, the
//! trials run and the chosen deployment against the file's own.
//!
//! Group `search_scale_all_groups` (criterion): the same search over every
//! assignment of the stages to the two groups (`easerve search
//! --all-groups`), ranked by goodput and by goodput per dollar, at 8, 64,
//! 256 and 1,024 GPUs; each size first prints its feasible allocations,
//! the rows Stage 1 kept, the trials and one search's time.
//!
//! Run with `cargo bench --bench has` (all), `cargo bench --bench has --
//! search_scale` (the two scale groups), `cargo bench --bench has --
//! search_scale_all_groups` (the second alone).

use criterion::{BenchmarkId, Criterion};
use easerve_has::{search, Method, SearchConfig, SimTrial, Study};
use easerve_workload::scenario::{Overrides, Scenario};
use std::path::Path;
use std::time::{Duration, Instant};

const RATE: f64 = 5.0;
const SEEDS: [u64; 5] = [1, 2, 3, 4, 5];
const BUDGET: usize = 30;

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn run(name: &str, method: Method, seed: u64) -> (Study, f64) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("scenarios/{name}.toml"));
    let base = Overrides {
        rate: Some(RATE),
        seed: Some(seed),
        ..Default::default()
    };
    let sc = Scenario::load(&path, &base).expect("shipped scenario");
    let cost = easerve_sim::scenario_cost(&sc);
    // search quality is measured against the exhaustive grid's best
    // throughput, as the paper measures it (EAServe §4.3)
    let objective = easerve_has::Objective::Throughput;
    let trial = SimTrial::new(sc.raw.clone(), &sc.file, base).scoring(objective.tier());
    let cfg = SearchConfig {
        method,
        budget: BUDGET,
        seed,
        rate: RATE,
        objective,
        time_budget_s: None,
        own: None,
        stage1_rows: None,
    };
    let t0 = Instant::now();
    let study = search(&sc, cost.as_ref(), &trial, &cfg, &mut |_| {});
    (study, t0.elapsed().as_secs_f64())
}

/// Trials needed to reach `frac` of `target` (`None` if never).
fn trials_to(study: &Study, target: f64, frac: f64) -> Option<usize> {
    study
        .trials
        .iter()
        .find(|t| t.best_so_far >= frac * target)
        .map(|t| t.index)
}

fn quality() {
    println!("| scenario | method | best / exhaustive (median) | trials to 90 % | trials to 99 % | wall time per search |");
    println!("|---|---|---|---|---|---|");
    for name in ["image", "video", "audio"] {
        let exhaustive: Vec<(Study, f64)> = SEEDS
            .iter()
            .map(|&s| run(name, Method::Exhaustive, s))
            .collect();
        let targets: Vec<f64> = exhaustive
            .iter()
            .map(|(s, _)| s.best.as_ref().map_or(0.0, |b| b.outcome.throughput))
            .collect();
        println!(
            "| {name} | exhaustive | 100 % ({} trials) | - | - | {:.2} s |",
            exhaustive[0].0.trials.len(),
            median(exhaustive.iter().map(|(_, t)| *t).collect())
        );
        for method in [Method::Has, Method::Random, Method::Coordinate] {
            let runs: Vec<(Study, f64)> = SEEDS.iter().map(|&s| run(name, method, s)).collect();
            let pct = median(
                runs.iter()
                    .zip(&targets)
                    .map(|((s, _), t)| {
                        100.0 * s.best.as_ref().map_or(0.0, |b| b.outcome.throughput) / t
                    })
                    .collect(),
            );
            let reach = |frac: f64| {
                let n: Vec<f64> = runs
                    .iter()
                    .zip(&targets)
                    .map(|((s, _), t)| trials_to(s, *t, frac).map_or(f64::INFINITY, |n| n as f64))
                    .collect();
                let m = median(n);
                if m.is_finite() {
                    format!("{m:.0}")
                } else {
                    "-".into()
                }
            };
            println!(
                "| {name} | {method} | {pct:.1} % | {} | {} | {:.3} s |",
                reach(0.90),
                reach(0.99),
                median(runs.iter().map(|(_, t)| *t).collect())
            );
        }
    }
}

/// `dc-256.toml` scaled to `gpus` GPUs (8, or a multiple of 32): a quarter
/// of them L40S encoders and three quarters H100 (8-GPU nodes from 32
/// GPUs up; at 8, one node of 2 L40S and one of 6 H100), the file's
/// deployment in proportion (`nE(TP1)+nP(TP4)+nD(TP4)`, at 8 GPUs
/// `2E(TP1)+1P(TP2)+1D(TP4)`), 150 req/s per 256 GPUs and 2,000
/// requests per 256 GPUs (13.3 s of arrivals; at least 200).
fn scaled(gpus: u32) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/dc-256.toml");
    let (per_node, enc_nodes, llm_nodes, llm_per_node, allocation) = if gpus < 32 {
        (2, 1, 1, 6, "2E(TP1)+1P(TP2)+1D(TP4)".to_string())
    } else {
        let (e, p) = (gpus / 4, gpus * 3 / 32);
        (
            8,
            gpus / 32,
            gpus * 3 / 32,
            8,
            format!("{e}E(TP1)+{p}P(TP4)+{p}D(TP4)"),
        )
    };
    let sets: Vec<(String, String)> = [
        ("cluster.groups.0.nodes", enc_nodes.to_string()),
        ("cluster.groups.0.gpus_per_node", per_node.to_string()),
        ("cluster.groups.1.nodes", llm_nodes.to_string()),
        ("cluster.groups.1.gpus_per_node", llm_per_node.to_string()),
        ("deployment.allocation", allocation),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let share = f64::from(gpus) / 256.0;
    let o = Overrides {
        rate: Some(150.0 * share),
        requests: Some(((2000.0 * share).round() as i64).max(200)),
        ..Default::default()
    };
    Scenario::load_with(&path, &sets, &o).expect("dc-256.toml scales")
}

/// One HAS search of `sc` as `easerve search` runs it on the scenario's
/// own stage groups (the scenario's own deployment seeded; default
/// budget), enumeration included; the command also enumerates the group of
/// each stage, which this leaves out.
fn has_search(sc: &Scenario) -> Study {
    has_search_by(sc, easerve_has::Objective::default_for(&sc.slo), false)
}

/// [`has_search`] ranked by `objective`, over every assignment of the
/// stages to the groups with `all_groups` (as `easerve search --all-groups`;
/// a cost objective implies it, [`easerve_has::space::search_space`]).
fn has_search_by(sc: &Scenario, objective: easerve_has::Objective, all_groups: bool) -> Study {
    let cost = easerve_sim::scenario_cost(sc);
    let o = Overrides {
        rate: Some(sc.workload.rate),
        requests: Some(sc.workload.requests as i64),
        ..Default::default()
    };
    let trial = SimTrial::new(sc.raw.clone(), &sc.file, o).scoring(objective.tier());
    let d = &sc.deployment;
    let cfg = SearchConfig {
        method: Method::Has,
        budget: easerve_has::DEFAULT_BUDGET,
        seed: sc.seed,
        rate: sc.workload.rate,
        objective,
        time_budget_s: None,
        own: Some(easerve_has::Candidate {
            allocation: d.allocation,
            batch: d.max_batch as u32,
            offload: d.offload,
            groups: easerve_has::space::stage_assignments(&sc.raw)
                .into_iter()
                .next(),
        }),
        // as `easerve search` prints its Stage 1 table by default
        stage1_rows: Some(easerve_has::stage1::TABLE_ROWS),
    };
    let space = easerve_has::space::search_space(sc, &cfg.objective, all_groups);
    easerve_has::search_in(sc, space, cost.as_ref(), &trial, &cfg, &mut |_| {})
}

fn search_scale_all_groups(c: &mut Criterion) {
    let mut g = c.benchmark_group("search_scale_all_groups");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    for gpus in [8u32, 64, 256, 1024] {
        let sc = scaled(gpus);
        let tier = easerve_has::Objective::default_for(&sc.slo);
        let per_dollar = easerve_has::Objective::parse("goodput-per-dollar:moderate", &sc.slo)
            .expect("dc-256.toml has the tier");
        for (name, objective) in [("goodput", tier), ("per-dollar", per_dollar)] {
            let t0 = Instant::now();
            let st = has_search_by(&sc, objective.clone(), true);
            println!(
                "search_scale_all_groups/{name}/{gpus}: {} feasible allocations, {} kept by Stage 1, {} trials, {:.2} s; chosen {}",
                st.space.len(),
                st.stage1.iter().filter(|r| r.kept).count(),
                st.trials.len(),
                t0.elapsed().as_secs_f64(),
                st.best.as_ref().map_or("nothing".into(), |b| b.candidate.to_string()),
            );
            g.bench_with_input(BenchmarkId::new(name, gpus), &sc, |b, sc| {
                b.iter(|| has_search_by(sc, objective.clone(), true))
            });
        }
    }
    g.finish();
}

fn search_scale(c: &mut Criterion) {
    let mut g = c.benchmark_group("search_scale");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    for gpus in [8u32, 64, 256, 1024] {
        let sc = scaled(gpus);
        let t0 = Instant::now();
        let st = has_search(&sc);
        let own = st.trials.iter().find(|t| {
            t.candidate.allocation == sc.deployment.allocation
                && t.candidate.batch as usize == sc.deployment.max_batch
        });
        let goodput = |t: Option<&easerve_has::TrialRecord>| {
            t.and_then(|t| t.outcome.slo_goodput).unwrap_or(0.0)
        };
        println!(
            "search_scale/{gpus}: {} feasible allocations, {} kept by Stage 1, {} trials ({}), {:.2} s; chosen {} at {:.2} req/s within `moderate` (the file's own {:.2}), Λ = {} req/s, {} requests a trial",
            st.space.len(),
            st.stage1.iter().filter(|r| r.kept).count(),
            st.trials.len(),
            st.stopped,
            t0.elapsed().as_secs_f64(),
            st.best.as_ref().map_or("nothing".into(), |b| b.candidate.to_string()),
            goodput(st.best.as_ref()),
            goodput(own),
            sc.workload.rate,
            sc.workload.requests
        );
        g.bench_with_input(BenchmarkId::from_parameter(gpus), &sc, |b, sc| {
            b.iter(|| has_search(sc))
        });
    }
    g.finish();
}

fn main() {
    // `cargo bench --bench has -- FILTER`: the search-quality table runs
    // unless a filter names something else
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    if filter.as_deref().is_none_or(|f| "quality".contains(f)) {
        quality();
    }
    let mut c = Criterion::default().configure_from_args();
    search_scale(&mut c);
    search_scale_all_groups(&mut c);
    c.final_summary();
}
