//! Search quality of HAS against its baselines: over the image, video and audio
//! scenarios at Λ = 5 req/s and 5 seeds, per method, the median best throughput
//! as a percentage of the exhaustive best and the median number of trials to
//! reach 90 % and 99 % of it (budget 30; "-" = not reached by the median run).
//! Also the median wall time of one search.
//!
//! Run with `cargo bench --bench has`.

use easerve_has::{search, Method, SearchConfig, SimTrial, Study};
use easerve_workload::scenario::{Overrides, Scenario};
use std::path::Path;
use std::time::Instant;

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

fn main() {
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
