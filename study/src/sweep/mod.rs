//! Sweeps: the plan (scenario variants × systems × rates × seeds, in a fixed
//! order, and shards of it), its runs (in parallel; `easerve` tuned by HAS at
//! each point), one row per simulated point, medians over seeds, CSV, merging
//! of shard files, and the charts of a whole sweep.
//!
//! * [`plan`] — [`SweptSystem`], [`Variant`], [`SweepPlan`]: what runs, and running it.
//! * [`charts`] — the plots of a whole sweep ([`charts()`]).

pub mod charts;
pub mod plan;

pub use charts::{charts, NamedChart, MAX_SERIES_PER_PANEL};
pub use plan::{Point, Shard, SweepError, SweepPlan, SweptSystem, UnknownSystem, Variant};

use easerve_workload::Report;
use serde::{Deserialize, Serialize};

/// Quantile levels (percent) kept of each run's TTFT distribution, for CDFs.
pub const TTFT_QUANTILES: [f64; 21] = [
    0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0, 45.0, 50.0, 55.0, 60.0, 65.0, 70.0, 75.0,
    80.0, 85.0, 90.0, 95.0, 100.0,
];

/// One simulated point of a sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepRow {
    /// Position in the full (unsharded) sweep.
    pub index: usize,
    /// The `--set` values of this variant, `key=value` joined by `, ` (empty without `--set`).
    pub variant: String,
    /// Serving system ([`SweptSystem::name`]).
    pub system: String,
    /// Offered rate, requests/s.
    pub rate: f64,
    /// Seed.
    pub seed: u64,
    /// The deployment that ran.
    pub deployment: String,
    /// Completed requests/s.
    pub throughput: f64,
    /// Goodput per SLO tier, requests/s, in the scenario's tier order.
    pub goodput: Vec<f64>,
    /// Mean TTFT, s.
    pub ttft_mean: f64,
    /// P99 TTFT, s.
    pub ttft_p99: f64,
    /// Mean TPOT, s.
    pub tpot_mean: f64,
    /// P99 TPOT, s.
    pub tpot_p99: f64,
    /// Mean E2E, s.
    pub e2e_mean: f64,
    /// TTFT at each level of [`TTFT_QUANTILES`], s.
    pub ttft_quantiles: Vec<f64>,
    /// Bottleneck stage.
    pub bottleneck: String,
    /// `--set` fields of the variant that the system chooses itself, so their
    /// values did not change this run ([`SweptSystem::fixed_fields`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignored: Vec<String>,
    /// The run's windows (a scenario with a rate schedule; [`Report::windows`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<easerve_workload::windows::WindowReport>,
}

impl SweepRow {
    /// A row from a run's report and its per-request TTFTs (seconds).
    pub fn new(
        index: usize,
        variant: &str,
        system: SweptSystem,
        rate: f64,
        seed: u64,
        report: &Report,
        mut ttfts: Vec<f64>,
    ) -> Self {
        ttfts.sort_by(f64::total_cmp);
        let q = |p: f64| {
            if ttfts.is_empty() {
                0.0
            } else {
                let pos = p / 100.0 * (ttfts.len() - 1) as f64;
                let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
                ttfts[lo] + (ttfts[hi] - ttfts[lo]) * (pos - lo as f64)
            }
        };
        SweepRow {
            index,
            variant: variant.to_string(),
            system: system.name().to_string(),
            rate,
            seed,
            deployment: report.meta.deployment.clone(),
            throughput: report.request_throughput,
            goodput: report.goodput.iter().map(|t| t.goodput).collect(),
            ttft_mean: report.ttft.mean,
            ttft_p99: report.ttft.p99,
            tpot_mean: report.tpot.mean,
            tpot_p99: report.tpot.p99,
            e2e_mean: report.e2e.mean,
            ttft_quantiles: TTFT_QUANTILES.iter().map(|&p| q(p)).collect(),
            bottleneck: report.bottleneck.clone(),
            ignored: Vec::new(),
            windows: report.windows.clone(),
        }
    }
}

/// A shard's (or a whole sweep's) output file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepPart {
    /// Scenario file (absolute path).
    pub scenario: String,
    /// The sweep's rates, `--set` values, systems and seeds: parts merge only
    /// when these agree.
    pub fingerprint: String,
    /// SLO tier names, in order.
    pub tiers: Vec<String>,
    /// Points in the whole sweep.
    pub total: usize,
    /// Requests per run (`None` = the scenario's).
    pub requests: Option<i64>,
    /// `i/n` of this part (`0/1` for a whole sweep).
    pub shard: (usize, usize),
    /// Its rows, by index.
    pub rows: Vec<SweepRow>,
}

/// Why parts cannot be merged.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct MergeError(pub String);

/// Merge shard parts into the whole sweep: same scenario, tiers and total, no
/// index twice, every index present.
pub fn merge(parts: Vec<SweepPart>) -> Result<SweepPart, MergeError> {
    let first = parts
        .first()
        .ok_or_else(|| MergeError("no parts given".into()))?
        .clone();
    let mut rows = Vec::new();
    for p in parts {
        if p.scenario != first.scenario
            || p.tiers != first.tiers
            || p.total != first.total
            || p.requests != first.requests
            || p.fingerprint != first.fingerprint
        {
            return Err(MergeError(format!(
                "part {}/{} is of another sweep ({} with {} points, not {} with {})",
                p.shard.0, p.shard.1, p.scenario, p.total, first.scenario, first.total
            )));
        }
        if let Some(r) = p.rows.iter().find(|r| r.goodput.len() != p.tiers.len()) {
            return Err(MergeError(format!(
                "point {} has {} goodput values for {} tiers",
                r.index,
                r.goodput.len(),
                p.tiers.len()
            )));
        }
        rows.extend(p.rows);
    }
    rows.sort_by_key(|r| r.index);
    for (i, r) in rows.iter().enumerate() {
        if r.index != i {
            return Err(MergeError(format!(
                "point {i} is {}: parts are missing or overlap (have {} of {} points)",
                if r.index > i {
                    "missing"
                } else {
                    "given twice"
                },
                rows.len(),
                first.total
            )));
        }
    }
    if rows.len() != first.total {
        return Err(MergeError(format!(
            "have {} of {} points: a part is missing",
            rows.len(),
            first.total
        )));
    }
    Ok(SweepPart {
        scenario: first.scenario,
        fingerprint: first.fingerprint,
        tiers: first.tiers,
        total: first.total,
        requests: first.requests,
        shard: (0, 1),
        rows,
    })
}

/// The median over seeds of one (variant, system, rate).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    /// Variant.
    pub variant: String,
    /// System.
    pub system: String,
    /// Rate, requests/s.
    pub rate: f64,
    /// Seeds aggregated.
    pub seeds: usize,
    /// Median of each field over the seeds (the row of the median-throughput
    /// seed for `deployment`, `bottleneck` and the TTFT quantiles).
    pub median: SweepRow,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// Medians over seeds, in the order the points first appear.
pub fn aggregate(rows: &[SweepRow]) -> Vec<SweepPoint> {
    let mut keys: Vec<(String, String, f64)> = Vec::new();
    for r in rows {
        let k = (r.variant.clone(), r.system.clone(), r.rate);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .map(|(variant, system, rate)| {
            let group: Vec<&SweepRow> = rows
                .iter()
                .filter(|r| r.variant == variant && r.system == system && r.rate == rate)
                .collect();
            let m = |f: fn(&SweepRow) -> f64| median(group.iter().map(|r| f(r)).collect());
            let mut by_thr = group.clone();
            by_thr.sort_by(|a, b| {
                a.throughput
                    .total_cmp(&b.throughput)
                    .then(a.seed.cmp(&b.seed))
            });
            let mid = by_thr[by_thr.len() / 2];
            let tiers = mid.goodput.len();
            let median_row = SweepRow {
                throughput: m(|r| r.throughput),
                goodput: (0..tiers)
                    .map(|t| median(group.iter().map(|r| r.goodput[t]).collect()))
                    .collect(),
                ttft_mean: m(|r| r.ttft_mean),
                ttft_p99: m(|r| r.ttft_p99),
                tpot_mean: m(|r| r.tpot_mean),
                tpot_p99: m(|r| r.tpot_p99),
                e2e_mean: m(|r| r.e2e_mean),
                ..mid.clone()
            };
            SweepPoint {
                variant,
                system,
                rate,
                seeds: group.len(),
                median: median_row,
            }
        })
        .collect()
}

/// Decimals of rates (requests/s) in the CSV, as the report prints goodput.
pub const CSV_RATE_DECIMALS: usize = 3;
/// Decimals of times (seconds) in the CSV: 10 µs, the report's 0.01 ms.
pub const CSV_TIME_DECIMALS: usize = 5;

/// The medians as CSV (RFC 4180: one line per point; every text field quoted,
/// so the commas of a variant's label stay inside their field; times in
/// seconds, rates in req/s). Rates are rounded to [`CSV_RATE_DECIMALS`] and
/// times to [`CSV_TIME_DECIMALS`] decimals, as the report prints them, unless
/// `full_precision` (every digit that round-trips).
pub fn to_csv(
    points: &[SweepPoint],
    tiers: &[String],
    full_precision: bool,
) -> Result<String, csv::Error> {
    let mut w = csv::WriterBuilder::new()
        .quote_style(csv::QuoteStyle::NonNumeric)
        .from_writer(Vec::new());
    let fmt = |x: f64, decimals: usize| {
        if full_precision {
            x.to_string()
        } else {
            format!("{x:.decimals$}")
        }
    };
    let rate = |x: f64| fmt(x, CSV_RATE_DECIMALS);
    let time = |x: f64| fmt(x, CSV_TIME_DECIMALS);
    let mut header: Vec<String> = ["variant", "system", "rate", "seeds", "throughput"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    header.extend(tiers.iter().map(|t| format!("goodput_{t}")));
    header.extend(
        [
            "ttft_mean_s",
            "ttft_p99_s",
            "tpot_mean_s",
            "tpot_p99_s",
            "e2e_mean_s",
            "bottleneck",
            "deployment",
            "ignored",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    w.write_record(&header)?;
    for p in points {
        let r = &p.median;
        let mut rec = vec![
            p.variant.clone(),
            p.system.clone(),
            p.rate.to_string(),
            p.seeds.to_string(),
            rate(r.throughput),
        ];
        rec.extend(r.goodput.iter().map(|&g| rate(g)));
        rec.extend([
            time(r.ttft_mean),
            time(r.ttft_p99),
            time(r.tpot_mean),
            time(r.tpot_p99),
            time(r.e2e_mean),
            r.bottleneck.clone(),
            r.deployment.clone(),
            r.ignored.join(" "),
        ]);
        w.write_record(&rec)?;
    }
    let bytes = w.into_inner().map_err(|e| e.into_error())?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The medians as a text table, as `sweep` prints it: per rate, one row per
/// system and variant (systems in the sweep's order, each system's variants
/// together) with throughput, goodput at each tier and P99 TTFT and TPOT;
/// where there are variants, `*` marks each system's best variant at that
/// rate: the highest goodput at the ranking tier (`moderate`, else the
/// middle tier: the one the baselines' rules and `bench.sh` use), then
/// throughput, the first such on a tie. `seeds` are the seeds each row's
/// medians are over.
pub fn table(points: &[SweepPoint], tiers: &[String], seeds: &[u64]) -> String {
    use std::fmt::Write;
    let has_variants = points.iter().any(|p| !p.variant.is_empty());
    let vw = points
        .iter()
        .map(|p| p.variant.chars().count())
        .max()
        .unwrap_or(0)
        .max("variant".len());
    let sw = points
        .iter()
        .map(|p| p.system.len())
        .max()
        .unwrap_or(0)
        .max("system".len());
    let tw: Vec<usize> = tiers.iter().map(|t| t.len().max(8)).collect();
    let mut out = String::new();
    let mut rates: Vec<f64> = Vec::new();
    for p in points {
        if !rates.contains(&p.rate) {
            rates.push(p.rate);
        }
    }
    let rank = tiers
        .iter()
        .position(|t| t == "moderate")
        .unwrap_or(tiers.len() / 2);
    let key = |p: &SweepPoint| {
        (
            p.median.goodput.get(rank).copied().unwrap_or(0.0),
            p.median.throughput,
        )
    };
    let mut systems: Vec<&str> = Vec::new();
    for p in points {
        if !systems.contains(&p.system.as_str()) {
            systems.push(&p.system);
        }
    }
    for rate in rates {
        let _ = writeln!(
            out,
            "offered {rate} req/s; rates in req/s; goodput per SLO tier; medians over seeds {}",
            seed_list(seeds)
        );
        let mut head = String::from("  ");
        if has_variants {
            let _ = write!(head, "{:<vw$}  ", "variant");
        }
        let _ = write!(head, "{:<sw$}  {:>10}", "system", "throughput");
        for (t, w) in tiers.iter().zip(&tw) {
            let _ = write!(head, "  {t:>w$}");
        }
        let _ = write!(head, "  {:>11}  {:>12}", "P99 TTFT s", "P99 TPOT ms");
        let _ = writeln!(out, "{}", head.trim_end());
        let mut at: Vec<&SweepPoint> = points.iter().filter(|p| p.rate == rate).collect();
        at.sort_by_key(|p| systems.iter().position(|s| *s == p.system));
        for (i, p) in at.iter().enumerate() {
            let mine = || at.iter().enumerate().filter(|(_, q)| q.system == p.system);
            // the first of the system's variants with the highest key
            let best = has_variants
                && mine().all(|(j, q)| key(q) < key(p) || (key(q) == key(p) && j >= i));
            let mut line = String::from(if best { "* " } else { "  " });
            if has_variants {
                let label = if p.variant.is_empty() {
                    "-"
                } else {
                    &p.variant
                };
                let pad = vw - label.chars().count();
                let _ = write!(line, "{label}{}  ", " ".repeat(pad));
            }
            let _ = write!(line, "{:<sw$}  {:>10.3}", p.system, p.median.throughput);
            for (g, w) in p.median.goodput.iter().zip(&tw) {
                let _ = write!(line, "  {g:>w$.3}");
            }
            let _ = write!(
                line,
                "  {:>11.3}  {:>12.2}",
                p.median.ttft_p99,
                p.median.tpot_p99 * 1e3
            );
            let _ = writeln!(out, "{}", line.trim_end());
        }
    }
    if has_variants {
        let _ = writeln!(
            out,
            "rows marked * are each system's best variant at that rate (goodput at {}, then throughput)",
            tiers.get(rank).map_or("no tier", String::as_str)
        );
    }
    if seeds.len() > 1 && points.iter().any(|p| p.system == "easerve") {
        let _ = writeln!(
            out,
            "easerve is tuned by HAS at each seed, so its medians can mix deployments \
             (sweep.json has each seed's)"
        );
    }
    out
}

/// `1, 2, 3` (or `1..=10` for a longer run of consecutive seeds).
fn seed_list(seeds: &[u64]) -> String {
    match seeds {
        [first, .., last] if seeds.len() > 4 && seeds.windows(2).all(|w| w[1] == w[0] + 1) => {
            format!("{first}..={last}")
        }
        _ => seeds
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(index: usize, system: &str, rate: f64, seed: u64, thr: f64) -> SweepRow {
        SweepRow {
            index,
            variant: String::new(),
            system: system.into(),
            rate,
            seed,
            deployment: "d".into(),
            throughput: thr,
            goodput: vec![thr / 2.0],
            ttft_mean: 1.0,
            ttft_p99: 2.0,
            tpot_mean: 0.1,
            tpot_p99: 0.2,
            e2e_mean: 3.0,
            ttft_quantiles: vec![0.0; TTFT_QUANTILES.len()],
            bottleneck: "encode".into(),
            ignored: Vec::new(),
            windows: Vec::new(),
        }
    }

    fn part(rows: Vec<SweepRow>, shard: (usize, usize)) -> SweepPart {
        SweepPart {
            scenario: "s.toml".into(),
            fingerprint: String::new(),
            tiers: vec!["t".into()],
            total: 4,
            requests: None,
            shard,
            rows,
        }
    }

    #[test]
    fn merge_restores_order_and_refuses_gaps_and_overlaps() {
        let all: Vec<SweepRow> = (0..4)
            .map(|i| row(i, "a", 1.0 + i as f64, 1, 1.0))
            .collect();
        let merged = merge(vec![
            part(vec![all[1].clone(), all[3].clone()], (1, 2)),
            part(vec![all[0].clone(), all[2].clone()], (0, 2)),
        ])
        .unwrap();
        assert_eq!(merged.rows, all);
        assert!(merge(vec![part(vec![all[0].clone(), all[2].clone()], (0, 2))]).is_err());
        assert!(merge(vec![
            part(all.clone(), (0, 1)),
            part(vec![all[0].clone()], (0, 2))
        ])
        .is_err());
    }

    #[test]
    fn medians_over_seeds() {
        let rows = vec![
            row(0, "a", 1.0, 1, 1.0),
            row(1, "a", 1.0, 2, 3.0),
            row(2, "a", 1.0, 3, 2.0),
            row(3, "b", 1.0, 1, 5.0),
        ];
        let pts = aggregate(&rows);
        assert_eq!(pts.len(), 2);
        assert_eq!(pts[0].seeds, 3);
        assert_eq!(pts[0].median.throughput, 2.0);
        assert_eq!(pts[0].median.goodput, vec![1.0]);
        let csv = to_csv(&pts, &["t".into()], false).unwrap();
        assert!(csv.starts_with(
            "\"variant\",\"system\",\"rate\",\"seeds\",\"throughput\",\"goodput_t\","
        ));
        assert_eq!(csv.lines().count(), 3);
    }

    #[test]
    fn csv_quotes_text_and_rounds_unless_full_precision() {
        let mut a = row(0, "easerve", 3.0, 42, 1.234_567_89);
        a.variant = "cluster.link=nvlink, deployment.batch=8".into();
        a.ttft_p99 = 0.123_456_789;
        let pts = aggregate(&[a]);
        let rounded = to_csv(&pts, &["t".into()], false).unwrap();
        let mut rd = csv::Reader::from_reader(rounded.as_bytes());
        let rec = rd.records().next().unwrap().unwrap();
        assert_eq!(&rec[0], "cluster.link=nvlink, deployment.batch=8");
        assert_eq!(&rec[4], "1.235");
        assert_eq!(&rec[5], "0.617");
        assert_eq!(&rec[7], "0.12346");
        assert!(
            rounded.contains("\"cluster.link=nvlink, deployment.batch=8\",\"easerve\",3,1,1.235,")
        );
        let full = to_csv(&pts, &["t".into()], true).unwrap();
        let mut rd = csv::Reader::from_reader(full.as_bytes());
        let rec = rd.records().next().unwrap().unwrap();
        assert_eq!(rec[4].parse::<f64>().unwrap(), 1.234_567_89);
        assert_eq!(rec[7].parse::<f64>().unwrap(), 0.123_456_789);
    }

    #[test]
    fn table_marks_each_systems_best_variant_and_names_the_seeds() {
        let mut rows = Vec::new();
        for (i, (v, sys, thr)) in [
            ("b=4", "easerve", 2.0),
            ("b=8", "easerve", 3.0),
            ("b=4", "aggregated", 1.5),
            ("b=8", "aggregated", 1.0),
        ]
        .into_iter()
        .enumerate()
        {
            let mut r = row(i, sys, 2.0, 42, thr);
            r.variant = v.into();
            rows.push(r);
        }
        let text = table(&aggregate(&rows), &["t".into()], &[42, 43, 44]);
        let marked: Vec<&str> = text.lines().filter(|l| l.starts_with("* ")).collect();
        assert_eq!(marked.len(), 2, "{text}");
        assert!(
            marked[0].contains("b=8") && marked[0].contains("easerve"),
            "{text}"
        );
        assert!(
            marked[1].contains("b=4") && marked[1].contains("aggregated"),
            "{text}"
        );
        assert!(text.contains("medians over seeds 42, 43, 44"), "{text}");
        assert!(text.contains("HAS at each seed"), "{text}");
        let one = table(&aggregate(&rows[..1]), &["t".into()], &[1]);
        assert!(!one.contains("HAS at each seed"), "{one}");
    }
}
