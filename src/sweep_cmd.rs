//! `easerve sweep`: rate sweeps and what-ifs over scenario fields and serving
//! systems, with medians over seeds, CSV/JSON and SVG plots; sharding for
//! batch schedulers and `sweep merge` to combine the parts. The sweep itself
//! (points, shards, runs, charts) is `easerve_study::sweep`; this command
//! parses the flags and writes the files.

use crate::BadInput;
use easerve_study::sweep::{
    aggregate, charts, merge, table, to_csv, Shard, SweepError, SweepPart, SweepPlan, SweptSystem,
    UnknownSystem, Variant,
};
use easerve_workload::scenario::{Overrides, Scenario};
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
    /// Planners to compare, `static,load,twin` (short for `--set
    /// planner.policy=…`; each run's JSON then carries GPU-hours and goodput
    /// per GPU-hour).
    #[arg(long, value_name = "P1,P2")]
    planner: Option<String>,
    /// Systems: `passthrough`, `aggregated`, `easerve-s1` (the scenario's
    /// deployment with s = 1), `as-is` (the scenario's deployment as it
    /// is), `easerve` (tuned by HAS at each point),
    /// `epd-serve` and `hydrainfer` (each configured by its own rule at each
    /// point). Default: `passthrough,aggregated,easerve-s1,easerve`; on a
    /// cluster of node groups (`[[cluster.groups]]`) `aggregated` is left
    /// out, its layout being one node's.
    #[arg(long)]
    systems: Option<String>,
    /// Seeds per point: the scenario's `seed` and the N − 1 after it (so the
    /// first is the run `sim` and `search` make); the median is reported.
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    /// Write sweep.csv with every digit (default: rates to 3 decimals and
    /// times to 5, in seconds, as the report prints them).
    #[arg(long)]
    full_precision: bool,
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
        /// Write sweep.csv with every digit.
        #[arg(long)]
        full_precision: bool,
    },
}

/// `--systems` when not given.
const DEFAULT_SYSTEMS: &str = "passthrough,aggregated,easerve-s1,easerve";
/// `--systems` when not given, on a cluster of node groups: the aggregated
/// system is laid out on one node, so the scenario refuses it beside groups.
const DEFAULT_SYSTEMS_GROUPS: &str = "passthrough,easerve-s1,easerve";

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

/// All combinations of the `--set` values.
fn variants(sets: &[String]) -> Result<Vec<Variant>, String> {
    let mut out: Vec<Variant> = vec![Variant::default()];
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
            .flat_map(|v| {
                values.iter().map(move |x| {
                    let mut sets = v.sets.clone();
                    sets.push((key.trim().to_string(), x.to_string()));
                    let label = if v.label.is_empty() {
                        format!("{}={x}", key.trim())
                    } else {
                        format!("{}, {}={x}", v.label, key.trim())
                    };
                    Variant { label, sets }
                })
            })
            .collect();
    }
    Ok(out)
}

/// Fields the sweep itself sets would silently override a `--set` of them.
fn check_taken(vars: &[Variant]) -> Result<(), BadInput> {
    for v in vars.iter().take(1) {
        for (key, _) in &v.sets {
            let taken: &[(&str, &str)] = &[
                ("seed", "--seeds"),
                ("workload.rate", "--rates"),
                ("workload.requests", "--requests"),
                ("deployment.system", "--systems"),
            ];
            if let Some((_, flag)) = taken.iter().find(|(k, _)| k == key) {
                return Err(BadInput(format!(
                    "--set {key}: the sweep sets it itself (use {flag})"
                )));
            }
        }
    }
    Ok(())
}

/// `--systems`: a comma-separated list of [`SweptSystem`] names.
fn parse_systems(text: &str) -> Result<Vec<SweptSystem>, BadInput> {
    text.split(',')
        .map(|s| {
            s.trim()
                .parse()
                .map_err(|e: UnknownSystem| BadInput(format!("--systems: {e}")))
        })
        .collect()
}

/// `--shard I/N` (whole sweep without it).
fn parse_shard(shard: Option<&str>) -> Result<Shard, BadInput> {
    let Some(s) = shard else {
        return Ok(Shard::WHOLE);
    };
    let parsed = s
        .split_once('/')
        .and_then(|(i, n)| Some((i.parse::<usize>().ok()?, n.parse::<usize>().ok()?)));
    match parsed {
        Some((index, count)) if count >= 1 && index < count => Ok(Shard { index, count }),
        _ => Err(BadInput(format!(
            "--shard {s}: expected I/N with 0 ≤ I < N"
        ))),
    }
}

/// A sweep's error as the command reports it: a point that failed while
/// running is an internal error (exit 1), anything else bad input (exit 2).
pub(crate) fn sweep_err(e: SweepError) -> anyhow::Error {
    match e {
        SweepError::Point(_) => anyhow::anyhow!("{e}"),
        e => bad(e.to_string()),
    }
}

pub(crate) fn run(a: SweepArgs) -> anyhow::Result<ExitCode> {
    if let Some(SweepSub::Merge {
        parts,
        out,
        full_precision,
    }) = a.cmd
    {
        return merge_parts(&parts, &out, full_precision);
    }
    let path = a
        .scenario
        .clone()
        .ok_or_else(|| bad("sweep: give a scenario file (or `sweep merge`)".into()))?;
    let out = a.out.clone().ok_or_else(|| {
        bad("sweep: --out is required (a folder, or the part file with --shard)".into())
    })?;
    let plan = plan(&a, &path)?;
    let shard = parse_shard(a.shard.as_deref())?;
    let bar = std::io::stderr().is_terminal().then(|| {
        let pb = indicatif::ProgressBar::new(plan.shard_points(shard).len() as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} points  {elapsed}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    });
    let part = plan.run(shard, &|| {
        if let Some(pb) = &bar {
            pb.inc(1);
        }
    });
    if let Some(pb) = &bar {
        pb.finish_and_clear();
    }
    let part = part.map_err(sweep_err)?;
    let total = part.total;
    if a.shard.is_some() {
        let cannot = |e: std::io::Error| bad(format!("--out {}: cannot write: {e}", out.display()));
        if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(cannot)?;
        }
        let json = serde_json::to_string_pretty(&part)?;
        crate::write_output("--out", &out, |w| Ok(w.write_all(json.as_bytes())?))?;
        sayln!(
            "part {}/{}: {} of {total} points → {}",
            shard.index,
            shard.count,
            part.rows.len(),
            out.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    write_outputs(&part, &out, a.full_precision)?;
    say!(
        "{}",
        table(&aggregate(&part.rows), &part.tiers, &plan.seed_list())
    );
    sayln!(
        "{total} points (seeds {}) → {} (sweep.csv, sweep.json, *.svg)",
        plan.seed_list()
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// The sweep the flags describe, checked: every variant × system × rate is
/// a valid scenario before anything runs.
fn plan(a: &SweepArgs, path: &Path) -> anyhow::Result<SweepPlan> {
    let base = Scenario::load(
        path,
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
    let systems = parse_systems(a.systems.as_deref().unwrap_or(match base.cluster {
        None => DEFAULT_SYSTEMS,
        Some(_) => DEFAULT_SYSTEMS_GROUPS,
    }))?;
    if a.seeds < 1 || a.seeds > 1000 {
        return Err(bad(format!("--seeds {}: allowed 1 ..= 1000", a.seeds)));
    }
    let mut sets = a.sets.clone();
    if let Some(p) = &a.planner {
        if sets.iter().any(|s| s.starts_with("planner.policy=")) {
            return Err(bad(
                "--planner: give it or --set planner.policy=…, not both".into(),
            ));
        }
        sets.push(format!("planner.policy={p}"));
    }
    let vars = variants(&sets).map_err(bad)?;
    check_taken(&vars)?;
    let plan = SweepPlan::new(path, rates, &sets, vars, systems, a.seeds, a.requests)
        .with_first_seed(base.seed);
    plan.check().map_err(sweep_err)?;
    Ok(plan)
}

/// `sweep merge`: the parts read, merged and written as a whole sweep.
fn merge_parts(parts: &[PathBuf], out: &Path, full_precision: bool) -> anyhow::Result<ExitCode> {
    let mut loaded = Vec::new();
    for p in parts {
        let text = easerve_calib::input::read_text(p)
            .map_err(|e| bad(format!("{}: cannot read: {e}", p.display())))?;
        let part: SweepPart = serde_json::from_str(&text)
            .map_err(|e| bad(format!("{}: not a sweep part: {e}", p.display())))?;
        loaded.push(part);
    }
    let whole = merge(loaded).map_err(|e| bad(format!("sweep merge: {e}")))?;
    write_outputs(&whole, out, full_precision)?;
    let mut seeds: Vec<u64> = Vec::new();
    for r in &whole.rows {
        if !seeds.contains(&r.seed) {
            seeds.push(r.seed);
        }
    }
    say!("{}", table(&aggregate(&whole.rows), &whole.tiers, &seeds));
    sayln!(
        "merged {} parts: {} points → {}",
        parts.len(),
        whole.total,
        out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Write sweep.json, sweep.csv (rounded unless `full_precision`) and the
/// plots of a whole sweep.
pub(crate) fn write_outputs(
    whole: &SweepPart,
    dir: &Path,
    full_precision: bool,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| {
        bad(format!(
            "--out {}: cannot create the folder: {e}",
            dir.display()
        ))
    })?;
    let put = |name: &str, text: String| {
        crate::write_output("--out", &dir.join(name), |w| {
            Ok(w.write_all(text.as_bytes())?)
        })
    };
    put("sweep.json", serde_json::to_string_pretty(whole)?)?;
    put(
        "sweep.csv",
        to_csv(&aggregate(&whole.rows), &whole.tiers, full_precision)?,
    )?;
    if let Some(csv) = easerve_study::demand::windows_csv(whole) {
        put("windows.csv", csv)?;
    }
    if let Some(table) = easerve_study::demand::change_table(whole) {
        sayln!("{table}");
        put("changes.txt", table)?;
    }
    for c in charts(whole).map_err(sweep_err)? {
        c.figure.write(&dir.join(&c.file)).map_err(|e| {
            bad(format!(
                "--out {}: cannot write {}: {e}",
                dir.display(),
                c.file
            ))
        })?;
    }
    Ok(())
}
