//! `easerve search`: Hybrid Auto Selection (or a baseline) over
//! (allocation, B, s) on the simulator.

use crate::BadInput;
use easerve_has::{search_in, Method, SearchConfig, SimTrial, Study, TrialRecord};
use easerve_workload::scenario::{Overrides, Scenario};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `easerve search`.
#[derive(clap::Args, Debug)]
#[command(allow_negative_numbers = true)]
pub(crate) struct SearchArgs {
    /// Scenario file (its model, cluster and workload; the search picks the deployment).
    scenario: PathBuf,
    /// `has` (Stage 1 pruning + TPE), `random`, `coordinate` or `exhaustive`
    /// (default `has`; easerve's search only).
    #[arg(long)]
    method: Option<Method>,
    /// Whose configuration to choose: `easerve` (default; by `--method`),
    /// or `epd-serve` / `hydrainfer` by that system's own rule (goodput at
    /// 90 % SLO attainment over a ladder of rates; README).
    #[arg(long)]
    system: Option<easerve_workload::scenario::System>,
    /// What trials are ranked by: `goodput:TIER` (requests/s meeting both
    /// bounds of that `[[slo]]` tier; default `goodput:moderate`),
    /// `goodput-per-dollar:TIER` (that goodput over the cost per hour of
    /// the node groups the allocation uses; every group needs
    /// `cost_per_gpu_hour`), `throughput` (the paper's HAS ranking) or
    /// `ttft` (mean TTFT); ties by throughput, then mean TTFT.
    #[arg(long, value_name = "OBJECTIVE")]
    objective: Option<String>,
    /// On node groups, search every assignment of the stages to the groups
    /// (which group each stage's instances use), not only the stage groups
    /// `[deployment.groups]` names; `--objective goodput-per-dollar:TIER`
    /// implies it. Where two stages share a group the counts of both vary
    /// over its GPUs: 68,247 allocations on `dc-256.toml` against 876
    /// (docs/datacenter.md).
    #[arg(long)]
    all_groups: bool,
    /// HAS: Stage 1 rows to print, `N` or `all` (default 100): the `N`
    /// lowest scores and every row kept for Stage 2, then a line saying
    /// how many were left out. Every feasible allocation is scored either
    /// way, and the survivors are the same; below `all`, rows (and their
    /// reasons, in `--json` too) are built only for what is printed and
    /// the lowest few of each prefill and decode layout (docs/datacenter.md).
    #[arg(long, value_name = "N|all")]
    stage1_rows: Option<String>,
    /// Trials at most (the exhaustive search runs its whole grid).
    #[arg(long, default_value_t = easerve_has::DEFAULT_BUDGET as i64)]
    budget: i64,
    /// HAS Stage 2 stops after this many seconds of trials as well (wall
    /// clock: a search that hits it is not reproducible to the trial).
    #[arg(long, value_name = "SECONDS")]
    time_budget: Option<f64>,
    /// Target rate Λ in requests/s (default: the scenario's `workload.rate`).
    #[arg(long)]
    rate: Option<f64>,
    /// Seed of the workload and of the search.
    #[arg(long)]
    seed: Option<u64>,
    /// Requests per trial (default: the scenario's `workload.requests`).
    #[arg(long)]
    requests: Option<i64>,
    /// Write the whole study as JSON instead of text.
    #[arg(long)]
    json: bool,
    /// `--emit DIR`: also write the chosen deployment's launch files (see
    /// `easerve deploy`).
    #[command(flatten)]
    out: crate::deploy_cmd::EmitArgs,
}

fn trial_line(t: &TrialRecord) -> String {
    let o = &t.outcome;
    if o.feasible {
        format!(
            "trial {:>3}  {:<40} throughput {:>7.3} req/s  TTFT {:>8.2} s  TPOT {:>6.1} ms  best {:.3}{}",
            t.index,
            t.candidate.to_string(),
            o.throughput,
            o.mean_ttft,
            o.mean_tpot * 1e3,
            t.best_so_far,
            goodput_note(o)
        )
    } else {
        format!(
            "trial {:>3}  {:<40} not deployable",
            t.index,
            t.candidate.to_string()
        )
    }
}

/// `  goodput G req/s` for an outcome ranked by a baseline's own rule, or
/// `  SLO goodput G req/s` at the objective's tier.
fn goodput_note(o: &easerve_has::Outcome) -> String {
    match (o.goodput, o.slo_goodput) {
        (Some(g), _) => format!("  goodput {g:.3} req/s"),
        (None, Some(g)) => format!("  SLO goodput {g:.3} req/s"),
        _ => String::new(),
    }
}

/// `--stage1-rows`: `Some(N)` (default [`easerve_has::stage1::TABLE_ROWS`])
/// or `None` for `all`.
///
/// # Errors
/// Neither a whole number nor `all` (exit 2).
fn stage1_rows(a: &SearchArgs) -> Result<Option<usize>, BadInput> {
    match a.stage1_rows.as_deref() {
        None => Ok(Some(easerve_has::stage1::TABLE_ROWS)),
        Some("all") => Ok(None),
        Some(t) => t.parse::<usize>().map(Some).map_err(|_| {
            BadInput(format!(
                "--stage1-rows {t}: expected a whole number of rows ≥ 0 or `all`"
            ))
        }),
    }
}

/// The lines of Stage 1's table above its rows: the capacities `c`, what
/// the columns mean (`on_groups`: with the groups column) and their heads.
fn stage1_header(c: &easerve_has::stage1::Capacities, on_groups: bool) -> String {
    let tps = |v: &[(easerve_model::Parallel, f64)]| {
        v.iter()
            .map(|(p, x)| format!("{p} {x:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut s = format!(
        "Stage 1 capacities per worker (req/s): encode {:.2} at B={} (where B/T_enc(B) saturates; \
         each allocation is scored at its B_max) | prefill {} | decode {}\n\
         local = local prefill workers co-located on the encode GPUs when s < 1, each holding \
         the LLM at that TP next to the encoder\n",
        c.encode,
        c.encode_batch,
        tps(&c.prefill),
        tps(&c.decode)
    );
    if on_groups {
        s += "groups = the node group of encode, prefill and decode (each stage priced on its group's GPU)\n";
        s += &format!("{:<24}", "groups");
    }
    s += &format!(
        "{:<28}{:>9}{:>7}{:>9}{:>8}{:>8}{:>6}{:>7}{:>14}  {}\n",
        "allocation",
        "local",
        "E load",
        "P load",
        "D load",
        "score",
        "B_max",
        "s*",
        "s window",
        "verdict"
    );
    s
}

/// Stage 1's table: the capacities, then its rows, the first `shown` (all
/// with `None`) and every kept row after them, then how many were left out.
fn stage1_table(study: &Study, shown: Option<usize>) -> String {
    let Some(c) = &study.capacities else {
        return String::new();
    };
    let on_groups = study.stage1.iter().any(|r| r.groups.is_some());
    let mut s = stage1_header(c, on_groups);
    let groups_of = |g: &Option<easerve_has::space::StageGroups>| match (on_groups, g) {
        (true, Some(g)) => format!("{:<24}", g.join(",")),
        (true, None) => format!("{:<24}", "-"),
        (false, _) => String::new(),
    };
    // each row's feasible allocation by lookup (a scan per row was
    // quadratic: 68,247 rows with `--all-groups` at 256 GPUs); the first of
    // equal keys, as the scan found
    let mut of: std::collections::HashMap<_, &easerve_has::FeasibleAllocation> =
        std::collections::HashMap::with_capacity(study.space.len());
    for f in &study.space {
        of.entry((f.allocation, f.groups.as_ref())).or_insert(f);
    }
    let mut printed = 0;
    for (i, r) in study.stage1.iter().enumerate() {
        if shown.is_some_and(|n| i >= n) && !r.kept {
            continue;
        }
        printed += 1;
        let local = of
            .get(&(r.allocation, r.groups.as_ref()))
            .and_then(|f| f.local_tp.map(|tp| format!("{}L(TP{tp})", f.local_workers)))
            .unwrap_or_else(|| "-".into());
        s += &groups_of(&r.groups);
        s += &format!(
            "{:<28}{:>9}{:>7.2}{:>9.2}{:>8.2}{:>8.2}{:>6}{:>7.2}   [{:.2}, {:.2}]  {}\n",
            r.allocation.to_string(),
            local,
            r.encode_load,
            r.prefill_load,
            r.decode_load,
            r.score,
            r.b_max,
            r.s_star,
            r.s_range.0,
            r.s_range.1,
            r.reason
        );
    }
    let left = study.space.len().saturating_sub(printed);
    if left > 0 {
        s += &format!(
            "… {left} more feasible allocations scored and left out (the table shows the {} lowest scores and every row kept; --stage1-rows all prints all {})\n",
            shown.unwrap_or(printed),
            study.space.len()
        );
    }
    s
}

pub(crate) fn run(a: SearchArgs) -> anyhow::Result<ExitCode> {
    let method = check_flags(&a)?;
    let base = Overrides {
        seed: a.seed,
        rate: a.rate,
        requests: a.requests,
        system: a.system,
        ..Default::default()
    };
    let sc = Scenario::load(&a.scenario, &base).map_err(|e| BadInput(e.to_string()))?;
    crate::preflight(&sc)?;
    a.out.check(&sc)?;
    let objective = match &a.objective {
        Some(t) => easerve_has::Objective::parse(t, &sc.slo)
            .map_err(|e| BadInput(format!("--objective {t}: {e}")))?,
        None => easerve_has::Objective::default_for(&sc.slo),
    };
    objective
        .check_costs(&sc.raw)
        .map_err(|e| BadInput(format!("--objective {objective}: {e}")))?;
    let space = search_space(&a, &sc, &objective)?;
    let trial = SimTrial::new(sc.raw.clone(), &sc.file, base.clone()).scoring(objective.tier());
    let cfg = SearchConfig {
        method,
        budget: a.budget as usize,
        time_budget_s: a.time_budget,
        seed: sc.seed,
        rate: sc.workload.rate,
        objective,
        own: Some(own_deployment(&sc)),
        stage1_rows: stage1_rows(&a)?,
    };
    let cost = easerve_sim::scenario_cost(&sc);
    let bar = (!a.json && std::io::stderr().is_terminal() && method == Method::Has).then(|| {
        let pb = indicatif::ProgressBar::new(cfg.budget as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:30} {pos}/{len} trials  best {msg} req/s",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    });
    let quiet = a.json;
    let mut on_trial = |t: &TrialRecord| {
        if let Some(pb) = &bar {
            pb.set_message(format!("{:.3}", t.best_so_far));
            pb.println(trial_line(t));
            pb.inc(1);
        } else if !quiet && method != Method::Exhaustive {
            // a progress line; a failing standard output is reported by the
            // study's own output below
            let _ = crate::emit(format_args!("{}\n", trial_line(t)));
        }
    };
    let started = std::time::Instant::now();
    let study = search_in(&sc, space, cost.as_ref(), &trial, &cfg, &mut on_trial);
    if let Some(pb) = &bar {
        pb.finish_and_clear();
    }
    if a.json {
        sayln!("{}", serde_json::to_string_pretty(&study)?);
        if let (Some(dir), Some(_)) = (&a.out.emit, &study.best) {
            emit_chosen(&a, &base, &study, dir, true)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    render(&a, &sc, &base, &study, started.elapsed().as_secs_f64())
}

/// The scenario's own deployment, which HAS seeds beside Stage 1's
/// survivors (a search never chooses worse than what it was given).
fn own_deployment(sc: &Scenario) -> easerve_has::Candidate {
    let d = &sc.deployment;
    easerve_has::Candidate {
        allocation: d.allocation,
        batch: u32::try_from(d.max_batch).unwrap_or(u32::MAX),
        offload: d.offload,
        groups: easerve_has::space::stage_assignments(&sc.raw)
            .into_iter()
            .next(),
    }
}

/// The flags' own ranges, before the scenario is read; the method the
/// search runs (`--method`, or the system's own rule).
fn check_flags(a: &SearchArgs) -> Result<Method, BadInput> {
    use easerve_workload::scenario::System;
    let system = a.system.unwrap_or(System::Easerve);
    let Some(rule) = easerve_has::rule_of(system) else {
        return Err(BadInput(format!(
            "--system {system}: has no configuration to search (it runs the scenario's deployment as it is: `easerve sim --system {system}`); allowed: easerve, epd-serve, hydrainfer"
        )));
    };
    let method = match (a.method, system) {
        (Some(m), System::Easerve) => m,
        (Some(m), _) => {
            return Err(BadInput(format!(
                "--method {m}: applies to easerve's search; --system {system} is chosen by its own rule"
            )))
        }
        (None, _) => rule,
    };
    stage1_rows(a)?;
    if a.budget < 1 {
        return Err(BadInput(format!(
            "--budget {}: a search needs at least 1 trial",
            a.budget
        )));
    }
    if let Some(t) = a.time_budget.filter(|t| !(t.is_finite() && *t >= 0.0)) {
        return Err(BadInput(format!(
            "--time-budget {t}: seconds must be a finite number ≥ 0"
        )));
    }
    if let Some(r) = a.rate {
        if !(r.is_finite() && r > 0.0) {
            return Err(BadInput(format!(
                "--rate {r}: the target rate must be a number > 0 (requests/s)"
            )));
        }
    }
    Ok(method)
}

/// The study as text: the stage-1 table, a summary (`elapsed_s` the
/// search's wall time, seconds), the chosen deployment and how to run it;
/// with `--emit`, its launch files.
/// The cluster searched: `8× h100-sxm` (as before), or the node groups.
fn search_cluster(sc: &Scenario) -> String {
    match sc.cluster {
        None => format!("{}× {}", sc.gpus, sc.gpu.name),
        Some(_) => sc.cluster_label(),
    }
}

fn render(
    a: &SearchArgs,
    sc: &Scenario,
    base: &Overrides,
    study: &easerve_has::Study,
    elapsed_s: f64,
) -> anyhow::Result<ExitCode> {
    say!("{}", stage1_table(study, stage1_rows(a)?));
    sayln!(
        "{} feasible allocations of {}{}; method {}, Λ = {} req/s, ranked by {}; {} trials in {:.2} s ({})",
        study.space.len(),
        search_cluster(sc),
        assignments_note(study, a.all_groups || study.objective.needs_costs()),
        study.method,
        study.rate,
        study.objective,
        study.trials.len(),
        elapsed_s,
        study.stopped
    );
    match &study.best {
        Some(b) => {
            sayln!(
                "chosen: {}  (throughput {:.3} req/s, mean TTFT {:.2} s, mean TPOT {:.1} ms{})",
                b.candidate,
                b.outcome.throughput,
                b.outcome.mean_ttft,
                b.outcome.mean_tpot * 1e3,
                goodput_note(&b.outcome)
            );
            if let Some(line) = placement_line(sc, b) {
                sayln!("{line}");
            }
            sayln!(
                "run it: easerve sim {}{} --rate {}{}{} --deployment '{}'",
                a.scenario.display(),
                a.system.map_or(String::new(), |s| format!(" --system {s}")),
                study.rate,
                a.seed.map_or(String::new(), |x| format!(" --seed {x}")),
                a.requests
                    .map_or(String::new(), |n| format!(" --requests {n}")),
                b.candidate
            );
            if let Some(dir) = &a.out.emit {
                emit_chosen(a, base, study, dir, false)?;
            }
        }
        None => sayln!("no trial ran"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `, over N stage-to-group assignments` where the space spans several;
/// where `all_groups` asked for every assignment and the cluster has one
/// (one node, or one node group), a note saying that the search is the one
/// on the fixed groups (the same space by construction,
/// [`easerve_has::space::feasible_allocations_across_groups`]).
fn assignments_note(study: &Study, all_groups: bool) -> String {
    let mut seen: Vec<&easerve_has::space::StageGroups> = Vec::new();
    for g in study.space.iter().filter_map(|f| f.groups.as_ref()) {
        if !seen.contains(&g) {
            seen.push(g);
        }
    }
    match seen.len() {
        0 | 1 if all_groups => {
            ", one stage-to-group assignment (the cluster has one node group or is one node: --all-groups searches the same space as without it)".to_string()
        }
        0 | 1 => String::new(),
        n => format!(", over {n} stage-to-group assignments"),
    }
}

/// On node groups: the group each stage of the chosen trial is on and what
/// the GPUs of those groups cost per hour (`None` on one node).
fn placement_line(sc: &Scenario, b: &TrialRecord) -> Option<String> {
    let [e, p, d] = b.candidate.groups.as_ref()?;
    let cost = match b.outcome.cost_per_hour {
        Some(c) => {
            let per = b
                .outcome
                .slo_goodput
                .filter(|_| c > 0.0)
                .map_or(String::new(), |g| {
                    format!(", {:.4} good req/s per unit of cost per hour", g / c)
                });
            format!("; the groups it uses cost {c} per hour{per}")
        }
        None => "; no cost per hour (the groups give no cost_per_gpu_hour)".into(),
    };
    let gpus = |name: &str| {
        sc.raw
            .cluster
            .groups
            .iter()
            .find(|g| g.name == name)
            .map_or(String::new(), |g| {
                format!(
                    " ({} × {})",
                    g.nodes * g.gpus_per_node,
                    g.gpu.as_deref().unwrap_or("custom GPU")
                )
            })
    };
    Some(format!(
        "on groups: encode {e}{}, prefill {p}{}, decode {d}{}{cost}",
        gpus(e),
        gpus(p),
        gpus(d)
    ))
}

/// The best trial that has P workers, by the study's own order
/// ([`Outcome::rank`](easerve_has::Outcome::rank)): what the engines can run
/// when the chosen one has none. `None` when no trial has P workers.
fn best_with_p_workers(study: &easerve_has::Study) -> Option<&TrialRecord> {
    study
        .trials
        .iter()
        .filter(|t| t.candidate.allocation.prefill.workers > 0)
        .max_by(|x, y| {
            study
                .objective
                .rank(&x.outcome, &y.outcome)
                .then(y.index.cmp(&x.index))
        })
}

/// Write the deployment files (`--emit`) of the chosen trial. When it has no
/// P workers (all prefill on local workers beside the encoders), no engine
/// can run it: its engine folders are not written (README.md says why), and
/// the best trial with P workers is named with the command that deploys it.
/// With `--json` the summary goes to standard error, so standard output stays
/// one JSON document.
///
/// # Errors
/// The deploy command's errors.
/// The `deploy` flags of `out` other than `--emit`, as a command line
/// repeats them (values quoted).
fn emit_flags(out: &crate::deploy_cmd::EmitArgs) -> String {
    let mut s = String::new();
    if let Some(p) = &out.model_path {
        s += &format!(" --model-path '{p}'");
    }
    if out.gpus_per_node != 8 {
        s += &format!(" --gpus-per-node {}", out.gpus_per_node);
    }
    if let Some(tp) = out.aggregated_tp {
        s += &format!(" --aggregated-tp {tp}");
    }
    s
}

fn emit_chosen(
    a: &SearchArgs,
    base: &Overrides,
    study: &easerve_has::Study,
    dir: &std::path::Path,
    quiet: bool,
) -> anyhow::Result<()> {
    let Some(pick) = study.best.as_ref() else {
        return Ok(());
    };
    if pick.candidate.allocation.prefill.workers == 0 {
        let alternative = match best_with_p_workers(study) {
            Some(t) => format!(
                "; the best trial with P workers is {} (throughput {:.3} req/s against {:.3}, mean TTFT {:.2} s): `easerve deploy '{}' --rate {}{}{}{} --deployment '{}' --emit DIR` writes it for them",
                t.candidate,
                t.outcome.throughput,
                pick.outcome.throughput,
                t.outcome.mean_ttft,
                a.scenario.display(),
                study.rate,
                a.seed.map_or(String::new(), |x| format!(" --seed {x}")),
                a.requests
                    .map_or(String::new(), |n| format!(" --requests {n}")),
                emit_flags(&a.out),
                t.candidate
            ),
            None => "; no trial of this search had P workers (raise --budget, or deploy an allocation with nP(TPk) via `easerve deploy --deployment`)".into(),
        };
        let line = format!(
            "--emit: the chosen {} has no P workers, which vLLM, SGLang and Dynamo cannot run: their folders are not written (README.md says why){alternative}",
            pick.candidate
        );
        if quiet {
            eprintln!("{line}");
        } else {
            sayln!("{line}");
        }
    }
    let sc = Scenario::load(&a.scenario, &pick.candidate.overrides(base))
        .map_err(|e| BadInput(e.to_string()))?;
    if quiet {
        crate::deploy_cmd::write_quiet(&sc, dir, &a.out)
    } else {
        crate::deploy_cmd::write(&sc, dir, &a.out)
    }
}

/// The allocations `search` chooses among: on node groups every assignment
/// of the stages to them with `--all-groups` or a cost objective, else the
/// groups the scenario names.
///
/// # Errors
/// No allocation fits (exit 2).
fn search_space(
    a: &SearchArgs,
    sc: &Scenario,
    objective: &easerve_has::Objective,
) -> anyhow::Result<Vec<easerve_has::FeasibleAllocation>> {
    let space = easerve_has::space::search_space(sc, objective, a.all_groups);
    if space.is_empty() {
        return Err(BadInput(format!(
            "{}: no allocation of the cluster's {} × {} can serve {} (no TP degree fits its weights, or no GPU is left for an encode worker); use more or larger GPUs (cluster.gpus, cluster.gpu)",
            a.scenario.display(),
            sc.gpus,
            sc.gpu.name,
            sc.model.name
        ))
        .into());
    }
    Ok(space)
}
