//! Time `easerve_sim::simulate` on a scenario, for profiling outside criterion:
//! `cargo run --release -p easerve-sim --example speed -- scenarios/image.toml 100000 [auto|roofline] [runs]`
//! (prints seconds per run, queue events and decode iterations run inline;
//! `EASERVE_SPEED_REPORT=FILE` also writes the last run's report as JSON).

use easerve_workload::scenario::{Overrides, Scenario};
use std::path::Path;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).map_or("scenarios/image.toml", String::as_str);
    let requests: i64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let kernels = args.get(3).map_or("auto", String::as_str);
    let runs: usize = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(1);
    let o = Overrides {
        requests: Some(requests),
        ..Default::default()
    };
    let sets = [("cluster.kernels".to_string(), kernels.to_string())];
    let sc = match Scenario::load_with(Path::new(path), &sets, &o) {
        Ok(sc) => sc,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let mut last = None;
    for _ in 0..runs {
        let t = Instant::now();
        let out = easerve_sim::simulate(&sc);
        println!(
            "{:.3} s  {} queue events  {} decode iterations inline  {} completed",
            t.elapsed().as_secs_f64(),
            out.queue_events,
            out.inline_steps,
            out.report.completed
        );
        last = Some(out.report);
    }
    if let (Ok(file), Some(report)) = (std::env::var("EASERVE_SPEED_REPORT"), last) {
        let json = serde_json::to_string_pretty(&report).expect("a report serialises");
        if let Err(e) = std::fs::write(&file, json) {
            eprintln!("{file}: {e}");
            std::process::exit(2);
        }
    }
}
