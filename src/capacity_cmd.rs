//! `easerve capacity`: the highest rate a cluster sustains under an SLO tier,
//! the fewest GPUs for a target rate, and GPU types compared at equal count or
//! equal cost (all on the simulator; `easerve_has::planning`).

use crate::BadInput;
use easerve_has::planning::{
    CapacityError, Comparison, FewestGpus, Goal, MaxRate, Planner, Probe, Tuning, MAX_GPUS,
    MIN_TOLERANCE,
};
use easerve_study::plot::{LineChart, Scale, Series, Style};
use easerve_workload::scenario::{num, Overrides, Scenario, MAX_RATE};
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `easerve capacity`.
#[derive(clap::Args, Debug)]
#[command(allow_negative_numbers = true)]
pub(crate) struct CapacityArgs {
    /// Scenario file (its model, cluster, workload shape and SLO tiers).
    scenario: PathBuf,
    /// The SLO tier that must hold (one of the scenario's `[[slo]]` names;
    /// required: without it the command lists them).
    #[arg(long, value_name = "TIER")]
    slo: Option<String>,
    /// Fraction of the offered rate the tier's goodput must reach, in (0, 1].
    #[arg(long, value_name = "FRACTION", default_value_t = 0.9)]
    attain: f64,
    /// Tune the deployment with HAS (30 trials) at every probed rate: the
    /// default (kept for scripts that pass it).
    #[arg(long, conflicts_with_all = ["target_rate", "as_is"])]
    tune: bool,
    /// Run the scenario's own deployment at every probed rate instead of the
    /// best deployment HAS finds for each.
    #[arg(long, conflicts_with_all = ["target_rate", "gpus"])]
    as_is: bool,
    /// What the HAS search at each probe ranks by: `goodput:TIER`,
    /// `goodput-per-dollar:TIER` (that goodput over the cost per hour of
    /// the node groups the allocation uses, each stage's group chosen too;
    /// every group needs `cost_per_gpu_hour`), `throughput` or `ttft`
    /// (default: goodput at the `--slo` tier); ties by throughput, then
    /// mean TTFT.
    #[arg(long, value_name = "OBJECTIVE", conflicts_with = "as_is")]
    objective: Option<String>,
    /// Instead: the fewest GPUs of the scenario's type (each size tuned by HAS)
    /// that meet the tier at this rate, requests/s, in (0, 1e6].
    #[arg(long, value_name = "RATE", conflicts_with = "gpus")]
    target_rate: Option<f64>,
    /// Largest cluster `--target-rate` tries, 1..=4096.
    #[arg(long, value_name = "N", default_value_t = 64)]
    max_gpus: u32,
    /// Instead: compare GPU types (e.g. `h100-sxm,a100-sxm4-80gb`; the
    /// scenario's own type is added as the baseline), each tuned by HAS, at the
    /// scenario's GPU count and, with `--cost-per-gpu-hour`, at the scenario
    /// cluster's hourly cost.
    #[arg(long, value_name = "TYPES", value_delimiter = ',')]
    gpus: Option<Vec<String>>,
    /// Prices for `--gpus`, `TYPE=PRICE,…` in any currency per GPU-hour; the
    /// scenario's own GPU type must be among them (its cluster sets the budget).
    #[arg(
        long,
        value_name = "TYPE=PRICE",
        value_delimiter = ',',
        requires = "gpus"
    )]
    cost_per_gpu_hour: Option<Vec<String>>,
    /// Relative width of the final bracket of the highest rate, in [1e-6, 1].
    #[arg(long, default_value_t = 0.02, conflicts_with = "target_rate")]
    tolerance: f64,
    /// Seed of every run.
    #[arg(long)]
    seed: Option<u64>,
    /// Requests per run (default: the scenario's `workload.requests`).
    #[arg(long)]
    requests: Option<i64>,
    /// Print the answer and every probe as JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Also write an SVG of the tier's goodput against the probed rates (or
    /// cluster sizes), the found point marked.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
}

fn bad(e: CapacityError) -> anyhow::Error {
    BadInput(e.to_string()).into()
}

fn probe_line(p: &Probe) -> String {
    format!(
        "probe  {:>3} × {:<16} {:>10} req/s  goodput {:>10} req/s ({:>5.1} % of offered)  {:<5}  {}",
        p.gpus,
        p.gpu,
        format!("{:.4}", p.rate),
        format!("{:.4}", p.goodput),
        p.ratio * 1e2,
        if p.meets { "meets" } else { "fails" },
        p.deployment
    )
}

/// The flags' own ranges, before any scenario is read.
fn check_flags(a: &CapacityArgs) -> Result<(), BadInput> {
    if !(a.attain > 0.0 && a.attain <= 1.0) {
        return Err(BadInput(format!(
            "--attain {}: the fraction of the offered rate must be in (0, 1]",
            a.attain
        )));
    }
    if !(a.tolerance >= MIN_TOLERANCE && a.tolerance <= 1.0) {
        return Err(BadInput(format!(
            "--tolerance {}: the bracket's relative width must be in [{MIN_TOLERANCE}, 1]",
            a.tolerance
        )));
    }
    if let Some(r) = a.target_rate {
        if !(r > 0.0 && r <= MAX_RATE) {
            return Err(BadInput(format!(
                "--target-rate {r}: a rate in (0, {}] requests/s (the bound of workload.rate)",
                num(MAX_RATE)
            )));
        }
    }
    if !(1..=MAX_GPUS).contains(&a.max_gpus) {
        return Err(BadInput(format!(
            "--max-gpus {}: allowed 1..=4096 (the bound of cluster.gpus)",
            a.max_gpus
        )));
    }
    if let Some(types) = &a.gpus {
        check_gpu_types(types)?;
    }
    Ok(())
}

/// `--target-rate` must validate with the scenario's workload (e.g. its
/// requests must span a time the simulator resolves): blame the flag, not
/// the file's own rate.
fn check_target_rate(a: &CapacityArgs, base: &Overrides) -> Result<(), BadInput> {
    if let Some(r) = a.target_rate {
        let o = Overrides {
            rate: Some(r),
            ..base.clone()
        };
        if let Err(e) = Scenario::load(&a.scenario, &o) {
            if e.field.ends_with("workload.rate") {
                return Err(BadInput(format!("--target-rate {}: {}", num(r), e.message)));
            }
        }
    }
    Ok(())
}

/// `--slo`, or bad input that lists the scenario's tiers.
fn required_tier(a: &CapacityArgs, base: &Overrides) -> Result<String, BadInput> {
    if let Some(tier) = &a.slo {
        return Ok(tier.clone());
    }
    let sc = Scenario::load(&a.scenario, base).map_err(|e| BadInput(e.to_string()))?;
    let names: Vec<&str> = sc.slo.iter().map(|t| t.name.as_str()).collect();
    let tiers = if names.is_empty() {
        "it has none: add [[slo]] tiers (scenarios/README.md)".to_string()
    } else {
        format!("its tiers are {}", names.join(", "))
    };
    Err(BadInput(format!(
        "--slo TIER is required: the SLO tier of {} that must hold; {tiers}",
        a.scenario.display()
    )))
}

pub(crate) fn run(a: CapacityArgs) -> anyhow::Result<ExitCode> {
    check_flags(&a)?;
    let base = Overrides {
        seed: a.seed,
        requests: a.requests,
        ..Default::default()
    };
    check_target_rate(&a, &base)?;
    let tuning = if a.as_is { Tuning::Fixed } else { Tuning::Has };
    let tier = required_tier(&a, &base)?;
    let goal = Goal {
        tier,
        attain: a.attain,
    };
    let mut planner =
        Planner::new(&a.scenario, Vec::new(), base.clone(), goal.clone(), tuning).map_err(bad)?;
    if let Some(t) = &a.objective {
        planner = planner.with_objective(t).map_err(bad)?;
    }
    let own = Scenario::load(&a.scenario, &base).map_err(|e| BadInput(e.to_string()))?;
    crate::preflight(&own)?;
    let quiet = a.json;
    let mut on_probe = |p: &Probe| {
        if !quiet {
            // a progress line; a failing standard output is reported by the
            // answer's own output below
            let _ = crate::emit(format_args!("{}\n", probe_line(p)));
        }
    };
    let what = format!(
        "tier `{}` at {} % of the offered rate",
        goal.tier,
        num(goal.attain * 1e2)
    );
    let asked = Asked {
        a: &a,
        goal: &goal,
        what: &what,
    };
    if let (Some(rate), Some(_)) = (a.target_rate, &own.cluster) {
        let ans = planner.cheapest_mix(rate, &mut on_probe).map_err(bad)?;
        return cheapest_mix(&asked, rate, &ans);
    }
    if let Some(rate) = a.target_rate {
        let ans = planner
            .fewest_gpus(rate, a.max_gpus, &mut on_probe)
            .map_err(bad)?;
        return fewest_gpus(&asked, rate, &ans);
    }
    let start = planner.scenario_rate();
    if let Some(types) = &a.gpus {
        let prices = parse_prices(a.cost_per_gpu_hour.as_deref().unwrap_or(&[]))?;
        let rows = planner
            .compare_gpus(types, &prices, start, a.tolerance, &mut on_probe)
            .map_err(bad)?;
        return comparison(&asked, &rows);
    }
    let ans = planner
        .max_rate(&[], start, a.tolerance, &mut on_probe)
        .map_err(bad)?;
    max_rate(&asked, tuning, start, &ans)
}

/// What was asked, for rendering an answer: the flags, the goal and the
/// goal in words.
struct Asked<'a> {
    a: &'a CapacityArgs,
    goal: &'a Goal,
    what: &'a str,
}

/// `--target-rate`'s answer on node groups: JSON or text.
fn cheapest_mix(
    q: &Asked<'_>,
    rate: f64,
    ans: &easerve_has::planning::CheapestMix,
) -> anyhow::Result<ExitCode> {
    if q.a.json {
        print_json(serde_json::json!({"goal": q.goal, "answer": ans}))?;
        return Ok(ExitCode::SUCCESS);
    }
    let nodes = |m: &easerve_has::planning::MixProbe| {
        m.nodes
            .iter()
            .map(|(g, n)| format!("{n} × {g}"))
            .collect::<Vec<_>>()
            .join(" + ")
    };
    match ans.found.as_ref().and_then(|m| Some((m, m.probe.as_ref()?))) {
        Some((m, p)) => sayln!(
            "cheapest mix meeting {} at {rate} req/s: {} nodes ({} per hour), encode on {}, prefill on {}, decode on {}, with {} (goodput {:.4} req/s; {} probes of {} mixes × {} stage assignments, cheapest first)",
            q.what,
            nodes(m),
            num(m.cost_per_hour),
            m.stages[0],
            m.stages[1],
            m.stages[2],
            p.deployment,
            p.goodput,
            ans.probes.len(),
            ans.mixes,
            ans.assignments
        ),
        None => sayln!(
            "not reachable: none of the {} mixes of node counts (up to the scenario's nodes of each group) meets {} at {rate} req/s",
            ans.mixes,
            q.what
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// `--target-rate`'s answer: the plot, then JSON or text.
fn fewest_gpus(q: &Asked<'_>, rate: f64, ans: &FewestGpus) -> anyhow::Result<ExitCode> {
    let (a, goal, what) = (q.a, q.goal, q.what);
    if let Some(path) = &a.plot {
        fewest_plot(q, path, rate, ans)?;
    }
    if a.json {
        print_json(serde_json::json!({"goal": goal, "answer": ans}))?;
        return Ok(ExitCode::SUCCESS);
    }
    if !ans.unfit.is_empty() {
        sayln!(
            "no allocation fits {} GPU(s) of this type (the model's weights, or no GPU left for an encode worker)",
            ans.unfit
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    match &ans.found {
        Some(f) => sayln!(
            "fewest GPUs meeting {what} at {rate} req/s: {} × {} with {} (goodput {:.4} req/s)",
            f.gpus,
            f.gpu,
            f.deployment,
            f.goodput
        ),
        None if ans.stalled => {
            let last: Vec<&easerve_has::planning::Probe> = {
                let mut by_size: Vec<_> = ans.probes.iter().collect();
                by_size.sort_by_key(|p| p.gpus);
                by_size.into_iter().rev().take(2).collect()
            };
            let (big, small) = (last[0], last.get(1).copied().unwrap_or(last[0]));
            sayln!(
                "not met up to {} GPUs: no cluster size probed meets {what} at {rate} req/s, and doubling from {} to {} GPUs raised neither goodput ({:.4} → {:.4} req/s) nor throughput ({:.4} → {:.4} req/s) by {} %, so larger clusters (up to --max-gpus {}) were not tried",
                ans.tried_up_to,
                small.gpus,
                big.gpus,
                small.goodput,
                big.goodput,
                small.throughput,
                big.throughput,
                num(easerve_has::planning::MIN_GAIN * 1e2),
                ans.max_gpus
            )
        }
        None => sayln!(
            "not reachable with up to {} GPUs: no cluster size probed from 1 to {} meets {what} at {rate} req/s",
            ans.max_gpus,
            ans.max_gpus
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// `--plot` of `--target-rate`: the tier's goodput by cluster size, the
/// goal's line and the fewest GPUs found.
fn fewest_plot(
    q: &Asked<'_>,
    path: &std::path::Path,
    rate: f64,
    ans: &FewestGpus,
) -> anyhow::Result<()> {
    let goal = q.goal;
    let mut pts: Vec<(f64, f64)> = ans
        .probes
        .iter()
        .map(|p| (f64::from(p.gpus), p.goodput))
        .collect();
    pts.sort_by(|x, y| x.0.total_cmp(&y.0));
    let lo = pts.first().map_or(1.0, |p| p.0);
    let hi = pts.last().map_or(1.0, |p| p.0);
    let mut series = vec![Series::new(format!("goodput ({})", goal.tier), pts)];
    series.push(Series::new(
        format!("{} × {rate} req/s", num(goal.attain)),
        vec![(lo, goal.attain * rate), (hi, goal.attain * rate)],
    ));
    if let Some(f) = &ans.found {
        series.push(Series::new(
            format!("fewest: {} GPUs", f.gpus),
            vec![(f64::from(f.gpus), f.goodput)],
        ));
    }
    plot(
        path,
        &format!(
            "{}: goodput at {rate} req/s by cluster size",
            planner_name(q.a)
        ),
        "GPUs",
        series,
    )
}

/// The `--plot` of a comparison: per GPU type its goodput curve and its
/// answer, in one colour and its own shape; then `attain × offered` over
/// every rate probed.
fn comparison_series(rows: &[Comparison], attain: f64) -> Vec<Series> {
    let mut series = Vec::new();
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for (i, r) in rows.iter().enumerate() {
        let Some(m) = &r.answer else { continue };
        let style = Style {
            colour: i,
            shape: i,
        };
        let pts = sorted_points(&m.probes);
        for p in &pts {
            (lo, hi) = (lo.min(p.0), hi.max(p.0));
        }
        let at = pts.iter().find(|p| p.0 == m.rate).map_or(0.0, |p| p.1);
        series.push(Series::new(format!("{} × {}", r.gpus, r.gpu), pts).styled(style));
        series.push(
            Series::new(
                format!("{} × {}: highest {:.3} req/s", r.gpus, r.gpu, m.rate),
                vec![(m.rate, at)],
            )
            .styled(Style {
                colour: i,
                shape: 5,
            }),
        );
    }
    if lo <= hi {
        series.push(
            Series::new(
                format!("{} × offered", num(attain)),
                vec![(lo, attain * lo), (hi, attain * hi)],
            )
            .styled(Style {
                colour: 6,
                shape: 3,
            }),
        );
    }
    series
}

/// `--gpus`'s answer: the plot, then JSON or a table.
fn comparison(q: &Asked<'_>, rows: &[Comparison]) -> anyhow::Result<ExitCode> {
    let (a, goal, what) = (q.a, q.goal, q.what);
    if let Some(path) = &a.plot {
        let series = comparison_series(rows, goal.attain);
        plot(
            path,
            &format!("{}: goodput ({}) by GPU type", planner_name(a), goal.tier),
            "offered rate (req/s)",
            series,
        )?;
    }
    if a.json {
        print_json(serde_json::json!({"goal": goal, "comparison": rows}))?;
        return Ok(ExitCode::SUCCESS);
    }
    sayln!("highest rate meeting {what}, each GPU type tuned by HAS:");
    sayln!(
        "{:<18}{:>6}  {:<12}{:>14}{:>16}{:>14}{:>16}",
        "gpu",
        "count",
        "basis",
        "rate (req/s)",
        "fails at",
        "cost/hour",
        "requests/cost"
    );
    for r in rows {
        let cost = r.price_per_gpu_hour.map(|p| p * f64::from(r.gpus));
        let Some(m) = &r.answer else {
            sayln!(
                "{:<18}{:>6}  {:<12}  {}",
                r.gpu,
                r.gpus,
                r.basis,
                r.note.as_deref().unwrap_or("no answer")
            );
            continue;
        };
        sayln!(
            "{:<18}{:>6}  {:<12}{:>14.4}{:>16}{:>14}{:>16}",
            r.gpu,
            r.gpus,
            r.basis,
            m.rate,
            m.fails_at.map_or("not found".into(), |f| format!("{f:.4}")),
            cost.map_or("-".into(), |c| format!("{c:.2}")),
            cost.map_or("-".into(), |c| format!("{:.0}", m.rate * 3600.0 / c))
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The highest rate's answer (`start` the scenario's rate, req/s): the
/// plot, then JSON or text.
fn max_rate(q: &Asked<'_>, tuning: Tuning, start: f64, ans: &MaxRate) -> anyhow::Result<ExitCode> {
    let (a, goal, what) = (q.a, q.goal, q.what);
    if let Some(path) = &a.plot {
        let pts = sorted_points(&ans.probes);
        let (lo, hi) = (
            pts.first().map_or(start, |p| p.0),
            pts.last().map_or(start, |p| p.0),
        );
        let series = vec![
            Series::new(format!("goodput ({})", goal.tier), pts),
            Series::new(
                format!("{} × offered", num(goal.attain)),
                vec![(lo, goal.attain * lo), (hi, goal.attain * hi)],
            ),
            Series::new(
                format!("highest: {:.3} req/s", ans.rate),
                vec![(
                    ans.rate,
                    ans.probes
                        .iter()
                        .find(|p| p.rate == ans.rate)
                        .map_or(0.0, |p| p.goodput),
                )],
            ),
        ];
        plot(
            path,
            &format!(
                "{}: goodput ({}) against offered rate",
                planner_name(a),
                goal.tier
            ),
            "offered rate (req/s)",
            series,
        )?;
    }
    if a.json {
        print_json(serde_json::json!({"goal": goal, "tuning": tuning, "answer": ans}))?;
        return Ok(ExitCode::SUCCESS);
    }
    let deployment = if tuning == Tuning::Has {
        "HAS-tuned at each rate"
    } else {
        "the scenario's deployment"
    };
    match ans.fails_at {
        Some(hi) => sayln!(
            "highest rate meeting {what} on {} × {} ({deployment}): {:.4} req/s (bracket [{:.4}, {:.4}] req/s: meets at the low end, fails at the high end; {} probes)",
            ans.gpus,
            ans.gpu,
            ans.rate,
            ans.rate,
            hi,
            ans.probes.len()
        ),
        None => sayln!(
            "{what} holds on {} × {} ({deployment}) up to {:.4} req/s, the highest rate probed (probes stop at {}× the cluster's estimated capacity, and at {} req/s): the cluster is not the limit there",
            ans.gpus,
            ans.gpu,
            ans.rate,
            num(easerve_has::planning::CAPACITY_MARGIN),
            num(MAX_RATE)
        ),
    }
    Ok(ExitCode::SUCCESS)
}

fn planner_name(a: &CapacityArgs) -> String {
    Scenario::default_name(&a.scenario)
}

/// `--json` output: `v` pretty-printed on standard output.
fn print_json(v: serde_json::Value) -> anyhow::Result<()> {
    sayln!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

fn sorted_points(probes: &[Probe]) -> Vec<(f64, f64)> {
    let mut pts: Vec<(f64, f64)> = probes.iter().map(|p| (p.rate, p.goodput)).collect();
    pts.sort_by(|x, y| x.0.total_cmp(&y.0));
    pts.dedup_by(|x, y| x.0 == y.0);
    pts
}

fn plot(path: &std::path::Path, title: &str, x: &str, series: Vec<Series>) -> anyhow::Result<()> {
    let chart = LineChart {
        title: title.into(),
        x_label: x.into(),
        y_label: "goodput (req/s)".into(),
        y_scale: Scale::Linear,
        series,
        step: false,
    };
    let svg = chart.to_svg()?;
    crate::write_output("--plot", path, |w| Ok(w.write_all(svg.as_bytes())?))?;
    Ok(())
}

/// `TYPE=PRICE` pairs, each price a number > 0.
fn parse_prices(items: &[String]) -> Result<Vec<(String, f64)>, BadInput> {
    items
        .iter()
        .map(|s| {
            let err = || {
                BadInput(format!(
                    "--cost-per-gpu-hour `{s}`: expected TYPE=PRICE with PRICE a number > 0 (per GPU-hour), e.g. h100-sxm=2.5"
                ))
            };
            let (t, p) = s.split_once('=').ok_or_else(err)?;
            let p: f64 = p.trim().parse().map_err(|_| err())?;
            if !(p > 0.0 && p.is_finite()) || t.trim().is_empty() {
                return Err(err());
            }
            Ok((t.trim().to_string(), p))
        })
        .collect()
}

/// `--gpus`: every entry a GPU preset (the names `cluster.gpu` takes), checked
/// before any run.
fn check_gpu_types(types: &[String]) -> Result<(), BadInput> {
    let known = easerve_calib::GpuSpec::preset_names();
    for t in types {
        if easerve_calib::GpuSpec::preset(t).is_none() {
            let hint = if t.is_empty() {
                "an empty name (a stray comma?)".to_string()
            } else {
                format!("unknown GPU type `{t}`")
            };
            return Err(BadInput(format!(
                "--gpus `{}`: {hint}; allowed GPU types (comma-separated): {}",
                types.join(","),
                known.join(", ")
            )));
        }
    }
    Ok(())
}
