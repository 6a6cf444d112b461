//! The charts of a whole sweep: goodput per SLO tier, throughput, P99 TTFT
//! and TPOT against the offered rate, the TTFT distribution at the highest
//! rate, one run's per-worker busy timeline per system, and the progress of
//! HAS against the random and coordinate searches.

use super::plan::{point_scenario, Point, SweepError, SweptSystem, UnknownSystem};
use super::{aggregate, SweepPart, SweepPoint, TTFT_QUANTILES};
use crate::plot::{Figure, LineChart, Scale, Series, Style};
use easerve_has::{search, Method, SearchConfig, SimTrial};
use easerve_workload::scenario::{Overrides, Scenario, System};
use std::path::Path;

/// A chart and the file name it is written under (`goodput-TIER.svg`, …).
#[derive(Clone, Debug)]
pub struct NamedChart {
    /// File name, e.g. `throughput.svg`.
    pub file: String,
    /// The chart: one panel, or one per system when a panel would hold more
    /// than [`MAX_SERIES_PER_PANEL`] series.
    pub figure: Figure,
}

/// Series in one panel at most; a chart with more gets a panel per system.
pub const MAX_SERIES_PER_PANEL: usize = 8;

fn series_name(p: &SweepPoint) -> String {
    if p.variant.is_empty() {
        p.system.clone()
    } else {
        format!("{} [{}]", p.system, p.variant)
    }
}

/// A series and the system it belongs to (for panels).
struct SystemSeries {
    system: String,
    series: Series,
}

/// The style of (variant, system) among `points`: a shape per system and a
/// colour per variant (a colour per system too when there is one variant).
fn style_of(points: &[SweepPoint], p: &SweepPoint) -> Style {
    let mut variants: Vec<&str> = Vec::new();
    let mut systems: Vec<&str> = Vec::new();
    for q in points {
        if !variants.contains(&q.variant.as_str()) {
            variants.push(&q.variant);
        }
        if !systems.contains(&q.system.as_str()) {
            systems.push(&q.system);
        }
    }
    let v = variants.iter().position(|v| *v == p.variant).unwrap_or(0);
    let s = systems.iter().position(|s| *s == p.system).unwrap_or(0);
    Style {
        colour: if variants.len() == 1 { s } else { v },
        shape: s,
    }
}

/// Group points into series by (variant, system), x from `x`, y from `y`.
fn series_of(
    points: &[SweepPoint],
    x: impl Fn(&SweepPoint) -> f64,
    y: impl Fn(&SweepPoint) -> f64,
) -> Vec<SystemSeries> {
    let mut out: Vec<SystemSeries> = Vec::new();
    for p in points {
        let name = series_name(p);
        match out.iter_mut().find(|s| s.series.name == name) {
            Some(s) => s.series.points.push((x(p), y(p))),
            None => out.push(SystemSeries {
                system: p.system.clone(),
                series: Series::new(name, vec![(x(p), y(p))]).styled(style_of(points, p)),
            }),
        }
    }
    out
}

fn chart(
    file: String,
    (title, x, y): (&str, &str, &str),
    scale: Scale,
    series: Vec<SystemSeries>,
    step: bool,
) -> NamedChart {
    let panel = |title: String, series: Vec<Series>| LineChart {
        title,
        x_label: x.into(),
        y_label: y.into(),
        y_scale: scale,
        series,
        step,
    };
    let figure = if series.len() > MAX_SERIES_PER_PANEL {
        let mut systems: Vec<String> = Vec::new();
        for s in &series {
            if !systems.contains(&s.system) {
                systems.push(s.system.clone());
            }
        }
        Figure {
            panels: systems
                .iter()
                .map(|sys| {
                    panel(
                        format!("{title}: {sys}"),
                        series
                            .iter()
                            .filter(|s| &s.system == sys)
                            .map(|s| s.series.clone())
                            .collect(),
                    )
                })
                .collect(),
        }
    } else {
        Figure::one(panel(
            title.into(),
            series.into_iter().map(|s| s.series).collect(),
        ))
    };
    NamedChart { file, figure }
}

/// One panel of series that belong to no system (timelines, search progress).
fn plain(series: Vec<Series>) -> Vec<SystemSeries> {
    series
        .into_iter()
        .map(|series| SystemSeries {
            system: String::new(),
            series,
        })
        .collect()
}

/// Every chart of `whole`, in the order they are written: the rate charts
/// ([`rate_charts`]), the busy timelines ([`busy_charts`]) and the search
/// progress ([`progress_chart`]). The last two run the simulator (and the
/// searches) again on the base scenario at the highest rate, the sweep's first seed.
pub fn charts(whole: &SweepPart) -> Result<Vec<NamedChart>, SweepError> {
    let points = aggregate(&whole.rows);
    let top = points
        .iter()
        .map(|p| p.rate)
        .fold(f64::NEG_INFINITY, f64::max);
    let mut out = rate_charts(&points, &whole.tiers, top);
    out.extend(busy_charts(whole, top)?);
    out.push(progress_chart(whole, top)?);
    out.extend(crate::demand::timeline_charts(whole));
    Ok(out)
}

/// Goodput per tier, throughput, P99 TTFT and P99 TPOT against the offered
/// rate, and the TTFT CDF at the highest rate `top` (requests/s).
pub fn rate_charts(points: &[SweepPoint], tiers: &[String], top: f64) -> Vec<NamedChart> {
    let rate = "offered rate (req/s)";
    let mut out = Vec::new();
    for (t, tier) in tiers.iter().enumerate() {
        out.push(chart(
            format!("goodput-{tier}.svg"),
            (
                &format!("Goodput at the {tier} SLO tier"),
                rate,
                "goodput (req/s)",
            ),
            Scale::Linear,
            series_of(
                points,
                |p| p.rate,
                |p| p.median.goodput.get(t).copied().unwrap_or(0.0),
            ),
            false,
        ));
    }
    out.push(chart(
        "throughput.svg".into(),
        ("Throughput", rate, "throughput (req/s)"),
        Scale::Linear,
        series_of(points, |p| p.rate, |p| p.median.throughput),
        false,
    ));
    out.push(chart(
        "p99-ttft.svg".into(),
        ("P99 time to first token", rate, "P99 TTFT (s)"),
        Scale::Log,
        series_of(points, |p| p.rate, |p| p.median.ttft_p99),
        false,
    ));
    out.push(chart(
        "p99-tpot.svg".into(),
        ("P99 time per output token", rate, "P99 TPOT (ms)"),
        Scale::Linear,
        series_of(points, |p| p.rate, |p| p.median.tpot_p99 * 1e3),
        false,
    ));
    // TTFT CDF at the highest rate
    let cdf: Vec<SystemSeries> = points
        .iter()
        .filter(|p| p.rate == top)
        .map(|p| SystemSeries {
            system: p.system.clone(),
            series: Series::new(
                series_name(p),
                p.median
                    .ttft_quantiles
                    .iter()
                    .zip(TTFT_QUANTILES)
                    .map(|(t, q)| (*t, q / 100.0))
                    .collect(),
            )
            .styled(style_of(points, p)),
        })
        .collect();
    out.push(chart(
        "ttft-cdf.svg".into(),
        (
            &format!("TTFT distribution at {top} req/s"),
            "TTFT (s)",
            "fraction of requests",
        ),
        Scale::Linear,
        cdf,
        true,
    ));
    out
}

/// Per system of `whole`, one run's per-worker busy timeline: the base
/// scenario at rate `top` (requests/s), the sweep's first seed.
pub fn busy_charts(whole: &SweepPart, top: f64) -> Result<Vec<NamedChart>, SweepError> {
    let path = Path::new(&whole.scenario);
    let mut systems: Vec<&str> = Vec::new();
    for r in &whole.rows {
        if !systems.contains(&r.system.as_str()) {
            systems.push(&r.system);
        }
    }
    let mut out = Vec::new();
    for name in systems {
        let system: SweptSystem = name
            .parse()
            .map_err(|e: UnknownSystem| SweepError::Invalid {
                message: format!("{}: {e}", whole.scenario),
            })?;
        let point = Point {
            variant: 0,
            system,
            rate: top,
            seed: first_seed(whole),
        };
        let sc = point_scenario(path, &[], &point, whole.requests)?;
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
        out.push(chart(
            format!("busy-timeline-{system}.svg"),
            (
                &format!("Worker occupancy, {system}: {deployment} at {top} req/s"),
                "time (s)",
                "busy fraction (encode: incl. CPU phase)",
            ),
            Scale::Linear,
            plain(busy_series(tl, run.report.duration_s, 40)),
            true,
        ));
    }
    Ok(out)
}

/// The best throughput so far against the trial, for HAS, random and
/// coordinate searches ([`easerve_has::DEFAULT_BUDGET`] trials, the sweep's first seed) of
/// the base scenario at rate `top` (requests/s).
pub fn progress_chart(whole: &SweepPart, top: f64) -> Result<NamedChart, SweepError> {
    let seed = first_seed(whole);
    let o = Overrides {
        rate: Some(top),
        seed: Some(seed),
        requests: whole.requests,
        ..Default::default()
    };
    let sc = Scenario::load(Path::new(&whole.scenario), &o)?;
    let cost = easerve_sim::scenario_cost(&sc);
    let objective = easerve_has::Objective::default_for(&sc.slo);
    let trial = SimTrial::new(sc.raw.clone(), &sc.file, o.clone()).scoring(objective.tier());
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
                    seed,
                    rate: top,
                    objective: objective.clone(),
                    time_budget_s: None,
                    own: None,
                    stage1_rows: None,
                },
                &mut |_| {},
            );
            Series::new(
                m.to_string(),
                st.trials
                    .iter()
                    .map(|t| (t.index as f64, t.best_so_far))
                    .collect(),
            )
        })
        .collect();
    Ok(chart(
        "has-progress.svg".into(),
        (
            &format!("Search progress at {top} req/s"),
            "trial",
            &format!("best {objective} so far (req/s)"),
        ),
        Scale::Linear,
        plain(progress),
        true,
    ))
}

/// The sweep's first seed (that of its first point; 1 without points).
fn first_seed(whole: &SweepPart) -> u64 {
    whole.rows.first().map_or(1, |r| r.seed)
}

/// Per compute-worker track, the busy fraction in each of `windows` equal
/// windows of `[0, duration]` (seconds), from the timeline's slices (Chrome
/// trace-event JSON, timestamps in µs).
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
            Series::new(
                name,
                busy.iter()
                    .enumerate()
                    .map(|(k, b)| (k as f64 * w, (b / w).min(1.0)))
                    .collect(),
            )
        })
        .collect()
}
