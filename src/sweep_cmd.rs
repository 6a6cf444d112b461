//! `easerve sweep`: rate sweeps and what-ifs over scenario fields and serving
//! systems, with medians over seeds, CSV/JSON and SVG plots; sharding for
//! batch schedulers and `sweep merge` to combine the parts.

use crate::BadInput;
use easerve_has::{search, Method, SearchConfig, SimTrial};
use easerve_study::plot::{LineChart, Scale, Series};
use easerve_study::sweep::{
    aggregate, merge, to_csv, SweepPart, SweepPoint, SweepRow, TTFT_QUANTILES,
};
use easerve_workload::scenario::{Overrides, Scenario, System};
use rayon::prelude::*;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `easerve sweep`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, allow_negative_numbers = true)]
pub(crate) struct SweepArgs {
    #[command(subcommand)]
    cmd: Option<SweepSub>,
    /// Scenario file.
    scenario: Option<PathBuf>,
    /// Rates in requests/s: `FROM:TO:STEP` (inclusive) or a list `1,2,4` (default: the scenario's).
    #[arg(long)]
    rates: Option<String>,
    /// Set a scenario field to each of several values, `KEY=V1,V2,…` with KEY a
    /// dotted path (`cluster.gpu=h100-sxm,a100-sxm4-80gb`, `deployment.batch=4,8`);
    /// repeat for a grid.
    #[arg(long = "set", value_name = "KEY=V1,V2")]
    sets: Vec<String>,
    /// Systems: `passthrough`, `aggregated`, `easerve-s1` (the scenario's
    /// deployment with s = 1), `easerve` (tuned by HAS at each point).
    #[arg(long, default_value = "passthrough,aggregated,easerve-s1,easerve")]
    systems: String,
    /// Seeds per point (1..=N); the median is reported.
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    /// Requests per run (default: the scenario's).
    #[arg(long)]
    requests: Option<i64>,
    /// Run only the `I`-th of `N` disjoint parts (`I/N`, 0-based) and write
    /// that part to `--out` (a file); combine parts with `easerve sweep merge`.
    #[arg(long, value_name = "I/N")]
    shard: Option<String>,
    /// Output folder (whole sweep: sweep.json, sweep.csv, *.svg) or, with
    /// --shard, the part file. Required.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(clap::Subcommand, Debug)]
enum SweepSub {
    /// Combine the part files of a sharded sweep and write its outputs.
    Merge {
        /// Part files written by `easerve sweep … --shard I/N --out FILE`.
        #[arg(required = true)]
        parts: Vec<PathBuf>,
        /// Output folder.
        #[arg(long)]
        out: PathBuf,
    },
}

fn bad(msg: String) -> anyhow::Error {
    BadInput(msg).into()
}

fn parse_rates(text: &str) -> Result<Vec<f64>, String> {
    let num = |s: &str| {
        s.trim()
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite() && *x > 0.0 && *x <= 1e6)
    };
    let rates: Vec<f64> = if let Some((a, rest)) = text.split_once(':') {
        let (b, step) = rest.split_once(':').ok_or("expected FROM:TO:STEP")?;
        let (a, b, step) = (
            num(a).ok_or("FROM")?,
            num(b).ok_or("TO")?,
            num(step).ok_or("STEP")?,
        );
        if b < a {
            return Err("TO is below FROM".into());
        }
        let n = ((b - a) / step + 1e-9).floor() as usize;
        if n > 10_000 {
            return Err("more than 10,000 rates".into());
        }
        (0..=n)
            .map(|k| ((a + k as f64 * step) * 1e9).round() / 1e9)
            .collect()
    } else {
        text.split(',')
            .map(|s| num(s).ok_or_else(|| format!("`{s}`")))
            .collect::<Result<_, _>>()?
    };
    if rates.is_empty() {
        return Err("no rate".into());
    }
    Ok(rates)
}

/// A scenario variant: its label and the `(key, value)` fields it sets.
type Variant = (String, Vec<(String, String)>);

/// All combinations of the `--set` values.
fn variants(sets: &[String]) -> Result<Vec<Variant>, String> {
    let mut out: Vec<Variant> = vec![(String::new(), Vec::new())];
    for s in sets {
        let (key, values) = s
            .split_once('=')
            .ok_or_else(|| format!("--set {s}: expected KEY=V1,V2"))?;
        let values: Vec<&str> = values.split(',').map(str::trim).collect();
        if key.trim().is_empty() {
            return Err(format!("--set {s}: expected KEY=V1,V2"));
        }
        if let Some(i) = values.iter().position(|v| v.is_empty()) {
            return Err(format!(
                "--set {s}: value {} of {} is empty; expected KEY=V1,V2 with a value between every two commas",
                i + 1,
                values.len()
            ));
        }
        out = out
            .into_iter()
            .flat_map(|(label, kv)| {
                values.iter().map(move |v| {
                    let mut kv = kv.clone();
                    kv.push((key.trim().to_string(), v.to_string()));
                    let label = if label.is_empty() {
                        format!("{}={v}", key.trim())
                    } else {
                        format!("{label}, {}={v}", key.trim())
                    };
                    (label, kv)
                })
            })
            .collect();
    }
    Ok(out)
}

struct Point {
    variant: usize,
    system: String,
    rate: f64,
    seed: u64,
}

fn overrides_for(system: &str, rate: f64, seed: u64, requests: Option<i64>) -> Overrides {
    let mut o = Overrides {
        rate: Some(rate),
        seed: Some(seed),
        requests,
        ..Default::default()
    };
    match system {
        "passthrough" => o.system = Some(System::Passthrough),
        "aggregated" => o.system = Some(System::Aggregated),
        "easerve-s1" => {
            o.system = Some(System::Easerve);
            o.offload = Some(1.0);
        }
        _ => o.system = Some(System::Easerve),
    }
    o
}

/// Run one point: simulate (for `easerve`, after a HAS search at that point).
fn run_point(
    path: &Path,
    sets: &[(String, String)],
    p: &Point,
    requests: Option<i64>,
) -> Result<(easerve_workload::Report, Vec<f64>), String> {
    let sc = point_scenario(path, sets, p, requests)?;
    let out = easerve_sim::simulate(&sc);
    let ttfts = out.records.iter().filter_map(|r| r.ttft()).collect();
    Ok((out.report, ttfts))
}

/// The scenario one point runs: the system's overrides, and for `easerve`
/// the deployment a HAS search at that point chose.
fn point_scenario(
    path: &Path,
    sets: &[(String, String)],
    p: &Point,
    requests: Option<i64>,
) -> Result<Scenario, String> {
    let mut o = overrides_for(&p.system, p.rate, p.seed, requests);
    if p.system == "easerve" {
        let sc = Scenario::load_with(path, sets, &o).map_err(|e| e.to_string())?;
        if let Some(best) = easerve_has::tune(&sc, &o, p.rate, p.seed) {
            o = best.candidate.overrides(&o);
        }
    }
    Scenario::load_with(path, sets, &o).map_err(|e| e.to_string())
}

pub(crate) fn run(a: SweepArgs) -> anyhow::Result<ExitCode> {
    if let Some(SweepSub::Merge { parts, out }) = a.cmd {
        let mut loaded = Vec::new();
        for p in &parts {
            let text = easerve_calib::input::read_text(p)
                .map_err(|e| bad(format!("{}: cannot read: {e}", p.display())))?;
            let part: SweepPart = serde_json::from_str(&text)
                .map_err(|e| bad(format!("{}: not a sweep part: {e}", p.display())))?;
            loaded.push(part);
        }
        let whole = merge(loaded).map_err(|e| bad(format!("sweep merge: {e}")))?;
        write_outputs(&whole, &out)?;
        sayln!(
            "merged {} parts: {} points → {}",
            parts.len(),
            whole.total,
            out.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let path = a
        .scenario
        .clone()
        .ok_or_else(|| bad("sweep: give a scenario file (or `sweep merge`)".into()))?;
    let out = a.out.clone().ok_or_else(|| {
        bad("sweep: --out is required (a folder, or the part file with --shard)".into())
    })?;
    let base = Scenario::load(
        &path,
        &Overrides {
            requests: a.requests,
            ..Default::default()
        },
    )
    .map_err(|e| bad(e.to_string()))?;
    crate::preflight(&base)?;
    let rates = match &a.rates {
        Some(r) => parse_rates(r).map_err(|e| {
            bad(format!(
                "--rates {r}: {e}; expected FROM:TO:STEP or a list like 1,2,4 (requests/s in (0, 1e6])"
            ))
        })?,
        None => vec![base.workload.rate],
    };
    let systems: Vec<String> = a.systems.split(',').map(|s| s.trim().to_string()).collect();
    for s in &systems {
        if !["passthrough", "aggregated", "easerve-s1", "easerve"].contains(&s.as_str()) {
            return Err(bad(format!("--systems: unknown system `{s}`; allowed: passthrough, aggregated, easerve-s1, easerve")));
        }
    }
    if a.seeds < 1 || a.seeds > 1000 {
        return Err(bad(format!("--seeds {}: allowed 1 ..= 1000", a.seeds)));
    }
    let vars = variants(&a.sets).map_err(bad)?;
    // fields the sweep itself sets would silently override a --set of them
    for (_, kv) in vars.iter().take(1) {
        for (key, _) in kv {
            let taken: &[(&str, &str)] = &[
                ("seed", "--seeds"),
                ("workload.rate", "--rates"),
                ("workload.requests", "--requests"),
                ("deployment.system", "--systems"),
            ];
            if let Some((_, flag)) = taken.iter().find(|(k, _)| k == key) {
                return Err(bad(format!(
                    "--set {key}: the sweep sets it itself (use {flag})"
                )));
            }
        }
    }
    // every variant × system must be a valid scenario before anything runs
    // (at every rate: a rate can be out of range for the workload's size)
    for (label, kv) in &vars {
        for s in &systems {
            for &rate in &rates {
                Scenario::load_with(&path, kv, &overrides_for(s, rate, 1, a.requests)).map_err(
                    |e| {
                        // the sweep's rate comes from --rates
                        let e = e.to_string().replace("--rate /", "--rates /");
                        bad(format!(
                            "{e} (rate {}{})",
                            easerve_workload::scenario::num(rate),
                            if label.is_empty() {
                                String::new()
                            } else {
                                format!(", variant {label}, system {s}")
                            }
                        ))
                    },
                )?;
            }
        }
    }
    let mut points = Vec::new();
    for (vi, _) in vars.iter().enumerate() {
        for s in &systems {
            for &rate in &rates {
                for seed in 1..=a.seeds {
                    points.push(Point {
                        variant: vi,
                        system: s.clone(),
                        rate,
                        seed,
                    });
                }
            }
        }
    }
    let total = points.len();
    let (shard_i, shard_n) = match &a.shard {
        Some(s) => {
            let parsed = s
                .split_once('/')
                .and_then(|(i, n)| Some((i.parse::<usize>().ok()?, n.parse::<usize>().ok()?)));
            match parsed {
                Some((i, n)) if n >= 1 && i < n => (i, n),
                _ => return Err(bad(format!("--shard {s}: expected I/N with 0 ≤ I < N"))),
            }
        }
        None => (0, 1),
    };
    let mine: Vec<(usize, &Point)> = points
        .iter()
        .enumerate()
        .filter(|(i, _)| i % shard_n == shard_i)
        .collect();
    let bar = std::io::stderr().is_terminal().then(|| {
        let pb = indicatif::ProgressBar::new(mine.len() as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} points  {elapsed}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    });
    let rows: Vec<Result<SweepRow, String>> = mine
        .par_iter()
        .map(|&(i, p)| {
            let r = run_point(&path, &vars[p.variant].1, p, a.requests).map(|(report, ttfts)| {
                let mut row = SweepRow::new(
                    i,
                    &vars[p.variant].0,
                    &p.system,
                    p.rate,
                    p.seed,
                    &report,
                    ttfts,
                );
                // the system chose these itself: the variant's values were ignored
                let fixed = easerve_study::sweep::fixed_by(&p.system);
                row.ignored = vars[p.variant]
                    .1
                    .iter()
                    .filter(|(k, _)| fixed.contains(&k.as_str()))
                    .map(|(k, _)| k.clone())
                    .collect();
                row
            });
            if let Some(pb) = &bar {
                pb.inc(1);
            }
            r
        })
        .collect();
    if let Some(pb) = &bar {
        pb.finish_and_clear();
    }
    let rows: Vec<SweepRow> = rows
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("a sweep point failed: {e}"))?;
    let fingerprint = format!(
        "rates={:?} sets={:?} systems={:?} seeds={}",
        rates, a.sets, systems, a.seeds
    );
    let part = SweepPart {
        scenario: std::fs::canonicalize(&path)
            .unwrap_or(path.clone())
            .display()
            .to_string(),
        fingerprint,
        tiers: base.slo.iter().map(|t| t.name.clone()).collect(),
        total,
        requests: a.requests,
        shard: (shard_i, shard_n),
        rows,
    };
    if a.shard.is_some() {
        let cannot = |e: std::io::Error| bad(format!("--out {}: cannot write: {e}", out.display()));
        if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(cannot)?;
        }
        let json = serde_json::to_string_pretty(&part)?;
        crate::write_output("--out", &out, |w| Ok(w.write_all(json.as_bytes())?))?;
        sayln!(
            "part {shard_i}/{shard_n}: {} of {total} points → {}",
            part.rows.len(),
            out.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    write_outputs(&part, &out)?;
    sayln!("{total} points → {}", out.display());
    Ok(ExitCode::SUCCESS)
}

fn series_name(p: &SweepPoint) -> String {
    if p.variant.is_empty() {
        p.system.clone()
    } else {
        format!("{} [{}]", p.system, p.variant)
    }
}

/// Group points into series by (variant, system), x from `x`, y from `y`.
fn series_of(
    points: &[SweepPoint],
    x: impl Fn(&SweepPoint) -> f64,
    y: impl Fn(&SweepPoint) -> f64,
) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for p in points {
        let name = series_name(p);
        match out.iter_mut().find(|s| s.name == name) {
            Some(s) => s.points.push((x(p), y(p))),
            None => out.push(Series {
                name,
                points: vec![(x(p), y(p))],
            }),
        }
    }
    out
}

fn chart(
    title: &str,
    x: &str,
    y: &str,
    scale: Scale,
    series: Vec<Series>,
    step: bool,
) -> LineChart {
    LineChart {
        title: title.into(),
        x_label: x.into(),
        y_label: y.into(),
        y_scale: scale,
        series,
        step,
    }
}

/// A whole sweep of `path` over rates × systems × seeds 1..=`seeds`, without
/// variants (for `easerve reproduce`).
pub(crate) fn sweep_whole(
    path: &Path,
    rates: &[f64],
    systems: &[&str],
    seeds: u64,
    requests: Option<i64>,
) -> anyhow::Result<SweepPart> {
    let base = Scenario::load(
        path,
        &Overrides {
            requests,
            ..Default::default()
        },
    )
    .map_err(|e| bad(e.to_string()))?;
    let mut points = Vec::new();
    for s in systems {
        for &rate in rates {
            for seed in 1..=seeds {
                points.push(Point {
                    variant: 0,
                    system: s.to_string(),
                    rate,
                    seed,
                });
            }
        }
    }
    let rows: Vec<SweepRow> = points
        .par_iter()
        .enumerate()
        .map(|(i, p)| {
            run_point(path, &[], p, requests).map(|(report, ttfts)| {
                SweepRow::new(i, "", &p.system, p.rate, p.seed, &report, ttfts)
            })
        })
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("a sweep point failed: {e}"))?;
    Ok(SweepPart {
        scenario: std::fs::canonicalize(path)
            .unwrap_or(path.to_path_buf())
            .display()
            .to_string(),
        fingerprint: format!("rates={rates:?} systems={systems:?} seeds={seeds}"),
        tiers: base.slo.iter().map(|t| t.name.clone()).collect(),
        total: rows.len(),
        requests,
        shard: (0, 1),
        rows,
    })
}

/// Write sweep.json, sweep.csv and the plots of a whole sweep.
pub(crate) fn write_outputs(whole: &SweepPart, dir: &Path) -> anyhow::Result<()> {
    let requests = whole.requests;
    std::fs::create_dir_all(dir).map_err(|e| {
        bad(format!(
            "--out {}: cannot create the folder: {e}",
            dir.display()
        ))
    })?;
    let cannot = |name: &str, e: &dyn std::fmt::Display| {
        bad(format!("--out {}: cannot write {name}: {e}", dir.display()))
    };
    let put = |name: &str, text: String| {
        crate::write_output("--out", &dir.join(name), |w| {
            Ok(w.write_all(text.as_bytes())?)
        })
    };
    put("sweep.json", serde_json::to_string_pretty(whole)?)?;
    let points = aggregate(&whole.rows);
    put("sweep.csv", to_csv(&points, &whole.tiers)?)?;
    for (t, tier) in whole.tiers.iter().enumerate() {
        chart(
            &format!("Goodput at the {tier} SLO tier"),
            "offered rate (req/s)",
            "goodput (req/s)",
            Scale::Linear,
            series_of(
                &points,
                |p| p.rate,
                |p| p.median.goodput.get(t).copied().unwrap_or(0.0),
            ),
            false,
        )
        .write(&dir.join(format!("goodput-{tier}.svg")))
        .map_err(|e| cannot(&format!("goodput-{tier}.svg"), &e))?;
    }
    chart(
        "Throughput",
        "offered rate (req/s)",
        "throughput (req/s)",
        Scale::Linear,
        series_of(&points, |p| p.rate, |p| p.median.throughput),
        false,
    )
    .write(&dir.join("throughput.svg"))
    .map_err(|e| cannot("throughput.svg", &e))?;
    chart(
        "P99 time to first token",
        "offered rate (req/s)",
        "P99 TTFT (s)",
        Scale::Log,
        series_of(&points, |p| p.rate, |p| p.median.ttft_p99),
        false,
    )
    .write(&dir.join("p99-ttft.svg"))
    .map_err(|e| cannot("p99-ttft.svg", &e))?;
    chart(
        "P99 time per output token",
        "offered rate (req/s)",
        "P99 TPOT (ms)",
        Scale::Linear,
        series_of(&points, |p| p.rate, |p| p.median.tpot_p99 * 1e3),
        false,
    )
    .write(&dir.join("p99-tpot.svg"))
    .map_err(|e| cannot("p99-tpot.svg", &e))?;
    // TTFT CDF at the highest rate
    let top = points
        .iter()
        .map(|p| p.rate)
        .fold(f64::NEG_INFINITY, f64::max);
    let cdf: Vec<Series> = points
        .iter()
        .filter(|p| p.rate == top)
        .map(|p| Series {
            name: series_name(p),
            points: p
                .median
                .ttft_quantiles
                .iter()
                .zip(TTFT_QUANTILES)
                .map(|(t, q)| (*t, q / 100.0))
                .collect(),
        })
        .collect();
    chart(
        &format!("TTFT distribution at {top} req/s"),
        "TTFT (s)",
        "fraction of requests",
        Scale::Linear,
        cdf,
        true,
    )
    .write(&dir.join("ttft-cdf.svg"))
    .map_err(|e| cannot("ttft-cdf.svg", &e))?;
    // per system, one run's per-worker busy timeline, and the HAS progress:
    // the base scenario at the top rate, seed 1
    let path = Path::new(&whole.scenario);
    let mut systems: Vec<&str> = Vec::new();
    for r in &whole.rows {
        if !systems.contains(&r.system.as_str()) {
            systems.push(&r.system);
        }
    }
    for system in systems {
        let point = Point {
            variant: 0,
            system: system.to_string(),
            rate: top,
            seed: 1,
        };
        let sc = point_scenario(path, &[], &point, requests).map_err(bad)?;
        let run = easerve_sim::simulate_with(
            &sc,
            easerve_sim::scenario_cost(&sc),
            &easerve_sim::SimOptions {
                timeline: true,
                ..Default::default()
            },
        );
        let Some(tl) = &run.timeline else {
            continue;
        };
        let deployment = if sc.system == System::Aggregated {
            run.report.meta.deployment.clone()
        } else {
            format!(
                "{} B={} s={}",
                sc.deployment.allocation, sc.deployment.max_batch, sc.deployment.offload
            )
        };
        let file = format!("busy-timeline-{system}.svg");
        chart(
            &format!("Worker occupancy, {system}: {deployment} at {top} req/s"),
            "time (s)",
            "fraction of time busy (encode: whole pass incl. CPU phase)",
            Scale::Linear,
            busy_series(tl, run.report.duration_s, 40),
            true,
        )
        .write(&dir.join(&file))
        .map_err(|e| cannot(&file, &e))?;
    }
    let o = Overrides {
        rate: Some(top),
        seed: Some(1),
        requests,
        ..Default::default()
    };
    let sc = Scenario::load(path, &o).map_err(|e| bad(e.to_string()))?;
    let cost = easerve_sim::scenario_cost(&sc);
    let trial = SimTrial::new(sc.raw.clone(), &sc.file, o.clone());
    let progress: Vec<Series> = [Method::Has, Method::Random, Method::Coordinate]
        .iter()
        .map(|&m| {
            let st = search(
                &sc,
                cost.as_ref(),
                &trial,
                &SearchConfig {
                    method: m,
                    budget: easerve_has::DEFAULT_BUDGET,
                    seed: 1,
                    rate: top,
                },
                &mut |_| {},
            );
            Series {
                name: m.to_string(),
                points: st
                    .trials
                    .iter()
                    .map(|t| (t.index as f64, t.best_so_far))
                    .collect(),
            }
        })
        .collect();
    chart(
        &format!("Search progress at {top} req/s"),
        "trial",
        "best throughput so far (req/s)",
        Scale::Linear,
        progress,
        true,
    )
    .write(&dir.join("has-progress.svg"))
    .map_err(|e| cannot("has-progress.svg", &e))?;
    Ok(())
}

/// Per compute-worker track, the busy fraction in each of `windows` equal
/// windows of `[0, duration]`, from the timeline's slices.
fn busy_series(timeline: &serde_json::Value, duration: f64, windows: usize) -> Vec<Series> {
    let events = timeline["traceEvents"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut names: Vec<(u64, String)> = events
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .filter_map(|e| Some((e["tid"].as_u64()?, e["args"]["name"].as_str()?.to_string())))
        .filter(|(_, n)| !n.ends_with("link"))
        .collect();
    names.sort();
    let w = (duration / windows as f64).max(1e-9);
    names
        .into_iter()
        .map(|(tid, name)| {
            let mut busy = vec![0.0; windows];
            for e in events
                .iter()
                .filter(|e| e["ph"] == "X" && e["tid"].as_u64() == Some(tid))
            {
                let (ts, dur) = (
                    e["ts"].as_f64().unwrap_or(0.0) / 1e6,
                    e["dur"].as_f64().unwrap_or(0.0) / 1e6,
                );
                let (start, end) = (ts, ts + dur);
                let first = ((start / w).floor() as usize).min(windows - 1);
                let last = ((end / w).floor() as usize).min(windows - 1);
                for (k, b) in busy.iter_mut().enumerate().take(last + 1).skip(first) {
                    let (lo, hi) = (k as f64 * w, (k + 1) as f64 * w);
                    *b += (end.min(hi) - start.max(lo)).max(0.0);
                }
            }
            Series {
                name,
                points: busy
                    .iter()
                    .enumerate()
                    .map(|(k, b)| (k as f64 * w, (b / w).min(1.0)))
                    .collect(),
            }
        })
        .collect()
}
