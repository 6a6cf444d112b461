//! `easerve calib …`: write, show and refine profiles; import Vidur's A100
//! timings and fit efficiencies; compare a simulated run with a measured one.
//!
//! Exit codes as for every subcommand (0 success, 1 internal error, 2 bad
//! input), plus: `calib validate` exits 1 when a `--max-error` is exceeded.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use easerve_calib::profile::today_utc;
use easerve_calib::refine::{
    refine_encode_against, refine_from_latencies, scale_stage, ClientLatencies, DecodeStep,
    EncodeSample, LatencyRefineError,
};
use easerve_calib::Stage;
use easerve_calib::{vidur, Efficiency, GpuSpec, GridSpec, Profile, Roofline};
use easerve_model::ModelArch;
use easerve_workload::agreement::{load_measured, load_report, Agreement};

use crate::BadInput;

/// Profiles, fitting and validation.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum CalibCommand {
    /// Write a profile computed from the roofline of a model on a GPU (five SM
    /// levels 0.2..1.0; grid in calib/README.md).
    Roofline {
        /// Model preset, e.g. `llava-v1.6-34b`.
        #[arg(long)]
        model: String,
        /// GPU preset, e.g. `rtx-6000-ada`.
        #[arg(long)]
        gpu: String,
        /// Serving system whose framework and preprocessing terms the encode table
        /// carries: easerve, passthrough or aggregated.
        #[arg(long, default_value = "easerve")]
        system: String,
        /// Output profile (TOML).
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: PathBuf,
        /// Date written into the provenance (default: today, UTC).
        #[arg(long, value_name = "YYYY-MM-DD")]
        date: Option<String>,
    },
    /// Write a profile of a model on a GPU composed from NVIDIA aiconfigurator's
    /// measured kernel tables (GEMM, attention, all-reduce), with the serving
    /// system's framework terms and the measured preprocessing (calib/README.md).
    ImportAiconfigurator {
        /// aiconfigurator systems folder (holding `data/` and the `<gpu>.yaml`
        /// files), e.g. `../shared/data/aiconfigurator`.
        dir: PathBuf,
        /// GPU preset with tables: h100-sxm, h200-sxm, b200-sxm, l40s,
        /// rtx-pro-6000, a100-sxm4-80gb (or rtx-6000-ada, priced from the L40S's).
        #[arg(long)]
        gpu: String,
        /// Model preset, e.g. `qwen2.5-vl-32b`.
        #[arg(long)]
        model: String,
        /// Framework whose kernels to read (only `vllm` is in the tables).
        #[arg(long, default_value = "vllm")]
        framework: String,
        /// Framework version directory (default: the newest in the tables).
        #[arg(long)]
        version: Option<String>,
        /// GEMM dtype (bfloat16, fp8, fp8_block where the tables have them).
        #[arg(long, default_value = "bfloat16")]
        dtype: String,
        /// Serving system whose framework and preprocessing terms the encode table
        /// carries: easerve, passthrough or aggregated.
        #[arg(long, default_value = "easerve")]
        system: String,
        /// Output profile (TOML).
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: PathBuf,
        /// Date written into the provenance (default: today, UTC).
        #[arg(long, value_name = "YYYY-MM-DD")]
        date: Option<String>,
    },
    /// Measure easerve's own CPU preprocessing per item on this host (JPEG and
    /// WAV decoding, resize, normalise, patchify, log-mel) and write the TOML that
    /// `calib/preprocess/measured-rust.toml` holds.
    #[cfg_attr(
        not(feature = "exec"),
        command(
            about = "Measure easerve's own CPU preprocessing per item on this host (not in this build: build with `--features exec`)"
        )
    )]
    MeasurePreprocess {
        /// Timed runs per size (median; one warm-up first).
        #[arg(long, default_value_t = 9)]
        reps: usize,
        /// Output TOML.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: PathBuf,
    },
    /// Print a profile's provenance and tables.
    Show {
        /// Profile file (TOML).
        profile: PathBuf,
        /// Print at most this many rows per table (0: all).
        #[arg(long, default_value_t = 12)]
        rows: usize,
    },
    /// Read Vidur's A100 per-operator CSVs, fit GEMM efficiency (per TP) and
    /// all-reduce latency/bandwidth (per TP), and print the constants and the
    /// error predicting another model's CSV.
    ImportVidur {
        /// Directory with a100_codellama34b_mlp.csv, a100_llama2_70b_mlp.csv
        /// and a100_dgx_all_reduce.csv (e.g. ../shared/data/vidur-a100).
        dir: PathBuf,
        /// Also write the fitted constants as Rust source (for calib/src/fitted.rs).
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Compare a simulated run with a measured one (both report JSONs as
    /// `easerve sim --json` writes them), per metric and per stage.
    #[command(
        after_help = "Exit codes: 0 success (and within --max-error); 1 a relative error exceeds --max-error, or internal error; 2 bad input."
    )]
    Validate {
        /// Simulated report JSON.
        #[arg(long, value_name = "SIM.json")]
        sim: PathBuf,
        /// Measured report JSON: `easerve exec --json`, an `easerve bench
        /// --json` result (its `easerve` member), or the result of `vllm bench
        /// serve --save-result --save-detailed` (its `duration`, `ttfts`,
        /// `itls`, `output_lens` and `errors`).
        #[arg(long, value_name = "RUN.json")]
        measured: PathBuf,
        /// Largest allowed |relative error| as a fraction (0.1 = 10 %); exit 1
        /// when any metric exceeds it.
        #[arg(long, value_name = "E")]
        max_error: Option<f64>,
        /// Print the comparison as JSON.
        #[arg(long)]
        json: bool,
        /// Compare window by window instead (the runs' `windows`, from a
        /// rate schedule's `workload.window_s`): each window's mean TTFT in
        /// both runs and its error, and each run's worker changes by kind
        /// (`D→P` a role change, `+E` a start, `−D` a drain); with
        /// `--max-error`, exit 1 when a window exceeds it or the changes
        /// differ.
        #[arg(long)]
        per_window: bool,
    },
    /// Fold a measured run into a profile (method in calib/src/refine.rs): its
    /// encode passes by batch size (from a per-request CSV as `sim` or `exec
    /// --requests-csv` writes it), and/or every stage's table scaled by the
    /// measured over the simulated mean service time (from the two reports).
    #[command(
        after_help = "Give --measured-csv with --encoder-tokens, or --sim with --measured, or both (then encode comes from the CSV and prefill and decode from the reports)."
    )]
    Refine {
        /// Profile to refine.
        #[arg(long)]
        profile: PathBuf,
        /// Per-request CSV with `encode_worker`, `encode_batch`, `encode_start`
        /// and `encode_end` columns (seconds).
        #[arg(long, value_name = "REQUESTS.csv", requires = "encoder_tokens")]
        measured_csv: Option<PathBuf>,
        /// Typical encoder tokens per item of the measured run.
        #[arg(long)]
        encoder_tokens: Option<f64>,
        /// The same scenario simulated with --profile, its per-request CSV
        /// (`easerve sim --requests-csv`): encode's factor per batch size is
        /// then the measured over the simulated passes, which carry what the
        /// simulator adds to the table (a CPU host's core sharing), so the
        /// refined profile does not count that twice; without it, measured
        /// over the table.
        #[arg(long, value_name = "SIM.csv", requires = "measured_csv")]
        sim_csv: Option<PathBuf>,
        /// Fit each stage (encode, prefill, decode) on the passes that ran
        /// alone in both --measured-csv and --sim-csv, with no other encode
        /// pass, prefill batch or decode run under way: one pass's cost
        /// without contention, which a CPU host's sharing term prices in
        /// the twin. A stage with fewer than 3 such passes is refined as
        /// without this flag.
        #[arg(long, requires = "sim_csv")]
        alone_passes: bool,
        /// With --alone-passes, for a deployment whose every pass runs on
        /// one thread (e.g. `sm_policy = "static:0.5"` on 2 cores): the
        /// `[host_sharing]` one-thread rows from the run itself, each
        /// demand level's encode passes and prefill batches measured over
        /// their simulated time at the fitted stage factors, without the
        /// simulation's own sharing (a level with at least 5 such passes
        /// replaces the profile's row; `easerve_calib::alone::shared_levels`).
        /// The profile must have one-thread rows.
        #[arg(long, requires = "alone_passes")]
        sharing_from_run: bool,
        /// Simulated report (JSON) of the scenario, simulated with --profile.
        #[arg(long, value_name = "SIM.json", requires = "measured")]
        sim: Option<PathBuf>,
        /// Measured report (JSON) of the same scenario: `easerve exec --json`,
        /// or an `easerve bench --json` result, from which only TTFT and TPOT
        /// are known (then decode is scaled by TPOT, encode and prefill by
        /// TTFT, and what that cannot identify is printed).
        #[arg(long, value_name = "RUN.json", requires = "sim")]
        measured: Option<PathBuf>,
        /// Items per request (a pass of `encode_batch` requests holds
        /// `encode_batch × items` items).
        #[arg(long, default_value_t = 1)]
        items_per_request: u64,
        /// Output profile.
        #[arg(short = 'o', long = "output", value_name = "FILE")]
        output: PathBuf,
    },
}

/// Run one `calib` subcommand.
pub(crate) fn run(cmd: CalibCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        CalibCommand::Roofline {
            model,
            gpu,
            system,
            output,
            date,
        } => roofline(&model, &gpu, &system, &output, date),
        CalibCommand::ImportAiconfigurator {
            dir,
            gpu,
            model,
            framework,
            version,
            dtype,
            system,
            output,
            date,
        } => import_aiconfigurator(
            &dir,
            &gpu,
            &model,
            &framework,
            version.as_deref(),
            &dtype,
            &system,
            &output,
            date,
        ),
        #[cfg(not(feature = "exec"))]
        CalibCommand::MeasurePreprocess { .. } => {
            Err(crate::without_executor("calib measure-preprocess"))
        }
        #[cfg(feature = "exec")]
        CalibCommand::MeasurePreprocess { reps, output } => {
            if reps == 0 {
                return Err(BadInput("--reps: must be ≥ 1".into()).into());
            }
            let text = easerve_exec::preprocess_cost::measure(reps, &today_utc())
                .map_err(|e| anyhow::anyhow!("measuring preprocessing: {e}"))?;
            std::fs::write(&output, &text)
                .map_err(|e| BadInput(format!("-o {}: cannot write: {e}", output.display())))?;
            say!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        CalibCommand::Show { profile, rows } => {
            let p = Profile::load(&profile).map_err(|e| BadInput(e.to_string()))?;
            say!("{}", render_profile(&p, rows));
            Ok(ExitCode::SUCCESS)
        }
        CalibCommand::ImportVidur { dir, output } => import_vidur(&dir, output.as_deref()),
        CalibCommand::Validate {
            sim,
            measured,
            max_error,
            json,
            per_window,
        } => validate(&sim, &measured, max_error, json, per_window),
        CalibCommand::Refine {
            profile,
            measured_csv,
            encoder_tokens,
            sim_csv,
            alone_passes,
            sharing_from_run,
            sim,
            measured,
            items_per_request,
            output,
        } => refine(
            &profile,
            measured_csv.as_deref().map(|m| (m, sim_csv.as_deref())),
            (encoder_tokens, alone_passes, sharing_from_run),
            sim.as_deref().zip(measured.as_deref()),
            items_per_request,
            &output,
        ),
    }
}

/// `easerve calib refine`: the flags checked, then encode from the CSV's
/// passes and/or the stages from the two reports (`runs`: `--sim`,
/// `--measured`), then the profile written.
fn refine(
    profile: &std::path::Path,
    measured_csv: Option<(&std::path::Path, Option<&std::path::Path>)>,
    (encoder_tokens, alone_passes, sharing_from_run): (Option<f64>, bool, bool),
    runs: Option<(&std::path::Path, &std::path::Path)>,
    items_per_request: u64,
    output: &std::path::Path,
) -> anyhow::Result<ExitCode> {
    let mut p = Profile::load(profile).map_err(|e| BadInput(e.to_string()))?;
    if items_per_request == 0 {
        return Err(BadInput("--items-per-request must be ≥ 1".into()).into());
    }
    if measured_csv.is_none() && runs.is_none() {
        return Err(BadInput(
            "nothing to refine from: give --measured-csv (with --encoder-tokens) and/or --sim with --measured".into(),
        )
        .into());
    }
    if let Some(t) = encoder_tokens {
        let max = easerve_calib::refine::MAX_ENCODER_TOKENS;
        if !(1.0..=max).contains(&t) {
            return Err(BadInput(format!(
                "--encoder-tokens {t}: expected the run's typical encoder tokens per item, 1 ..= {max:e}"
            ))
            .into());
        }
    }
    let runs = match runs {
        Some((sim, measured)) => Some((load_runs(sim, measured)?, sim, measured)),
        None => None,
    };
    // (a CSV alone does not say the encoders' TP: without the reports, its
    // passes are taken as the TP 1 table's)
    let tp_rows = (runs.as_ref()).and_then(|((s, _), _, _)| encode_from_tp_rows(&p, s));
    // the stages fitted on the passes alone in both runs
    let done = match measured_csv {
        Some((csv, Some(sim_csv))) if alone_passes => {
            refine_alone(&mut p, csv, sim_csv, tp_rows.is_none(), sharing_from_run)?
        }
        _ => Vec::new(),
    };
    if let (Some((csv, sim_csv)), Some(tokens)) = (measured_csv, encoder_tokens) {
        match tp_rows {
            _ if done.contains(&Stage::Encode) => {}
            None => refine_passes(&mut p, csv, sim_csv, tokens, items_per_request)?,
            Some(tp) => eprintln!("encode: the run's encode workers are at TP {tp}, priced from the profile's encode_tp rows, which are not refined; --measured-csv's passes left unused"),
        }
    }
    if let Some((reports, sim, measured)) = runs {
        let with_encode = measured_csv.is_none();
        refine_runs(
            &mut p,
            profile,
            reports,
            (sim, measured),
            (with_encode, &done),
        )?;
    }
    save_profile(&p, output)?;
    eprintln!("wrote {}", output.display());
    Ok(ExitCode::SUCCESS)
}

/// Encode from the measured passes of a per-request CSV, over the table or
/// over the simulated passes of `sim_csv` ([`refine_encode_against`]), with
/// what it did printed.
fn refine_passes(
    p: &mut Profile,
    csv: &std::path::Path,
    sim_csv: Option<&std::path::Path>,
    tokens: f64,
    items_per_request: u64,
) -> anyhow::Result<()> {
    let samples = read_encode_passes(csv, items_per_request)?;
    let simulated = match sim_csv {
        Some(s) => read_encode_passes(s, items_per_request)
            .map_err(|e| BadInput(format!("--sim-csv: {e}")))?,
        None => Vec::new(),
    };
    if !samples.iter().any(EncodeSample::is_timed) {
        return Err(BadInput(format!(
            "--measured-csv {}: no encode pass with items and a positive duration (a header alone, or no request with both encode times)",
            csv.display()
        ))
        .into());
    }
    let what = match sim_csv {
        Some(s) => format!(
            "{} over the simulated passes of {}",
            csv.display(),
            s.display()
        ),
        None => csv.display().to_string(),
    };
    let summary = refine_encode_against(p, &samples, &simulated, tokens, &what)
        .map_err(|e| BadInput(e.to_string()))?;
    for (b, n, med, before, f) in &summary.per_batch {
        sayln!(
            "batch {b:>4} items: {n:>5} passes, measured median {:.4} s, {} {:.4} s, factor {:.3}",
            med,
            if (simulated.iter()).any(|s| s.items == *b && s.is_timed()) {
                "simulated median"
            } else {
                "profile"
            },
            before,
            f
        );
    }
    if summary.raised > 0 {
        sayln!(
            "{} encode values raised to the next smaller batch's (the refined table is kept non-decreasing in batch; measured factors and the table's own steps both can make a larger batch faster)",
            summary.raised
        );
    }
    Ok(())
}

/// Passes alone in both runs needed to fit a stage on them
/// (`--alone-passes`); with fewer it is refined as without the flag.
const MIN_ALONE_PASSES: usize = 3;

/// `--alone-passes`: each stage's factor over the passes that ran alone in
/// both the measured and the simulated run ([`easerve_calib::alone`]), for
/// the stages with at least [`MIN_ALONE_PASSES`] of them (encode only where
/// `with_encode`: the run's encoders were priced from the TP 1 table);
/// what it did printed. Returns the stages it refined.
fn refine_alone(
    p: &mut Profile,
    csv: &std::path::Path,
    sim_csv: &std::path::Path,
    with_encode: bool,
    sharing_from_run: bool,
) -> anyhow::Result<Vec<Stage>> {
    use easerve_calib::alone::{alone_factors, ALONE_STAGES};
    let measured = read_spans(csv)?;
    let simulated = read_spans(sim_csv).map_err(|e| BadInput(format!("--sim-csv: {e}")))?;
    let what = format!(
        "passes alone in both {} and {}",
        csv.display(),
        sim_csv.display()
    );
    let has_rows = p
        .host_sharing()
        .is_some_and(|h| !h.one_thread_rows().is_empty());
    if sharing_from_run && !has_rows {
        return Err(BadInput(
            "--sharing-from-run: the profile's [host_sharing] table has no one-thread rows to refine (`easerve profile --device cpu` measures them)".into(),
        )
        .into());
    }
    let mut done = Vec::new();
    let mut factors = [None; 2];
    let stages = [Stage::Encode, Stage::Prefill, Stage::Decode];
    for ((fit, name), stage) in alone_factors(&measured, &simulated)
        .into_iter()
        .zip(ALONE_STAGES)
        .zip(stages)
    {
        let factor = fit.factor().filter(|_| fit.passes >= MIN_ALONE_PASSES);
        match factor {
            _ if stage == Stage::Encode && (!with_encode || p.encode_table().is_none()) => {
                sayln!("{name:<8} not fitted on passes alone (the profile has no encode table, or the run's encoders were priced from its encode_tp rows)");
            }
            Some(f) => {
                scale_stage(p, stage, f, &what).map_err(|e| BadInput(e.to_string()))?;
                sayln!(
                    "{name:<8} {} passes alone in both runs: measured {:.4} s, simulated {:.4} s, factor {f:.3}",
                    fit.passes,
                    fit.measured,
                    fit.simulated
                );
                if let Some(k) = [Stage::Encode, Stage::Prefill].iter().position(|s| *s == stage) {
                    factors[k] = Some(f);
                }
                done.push(stage);
            }
            None => sayln!(
                "{name:<8} {} passes alone in both runs (fewer than {MIN_ALONE_PASSES}): refined as without --alone-passes",
                fit.passes
            ),
        }
    }
    if refine_alone_transfers(p, &measured, &simulated, &what)? {
        done.push(Stage::Transfer);
    }
    if sharing_from_run {
        match factors {
            [Some(e), Some(f)] => refine_one_thread_sharing(p, &measured, &simulated, [e, f])?,
            _ => sayln!("host_sharing: one-thread rows kept as measured (encode and prefill must both be fitted on passes alone to price a pass uncontended)"),
        }
    }
    Ok(done)
}

/// Requests' passes at a demand level needed to refine its one-thread row
/// (`--sharing-from-run`; a micro-batch counts once per request, as the
/// stage factors' passes alone do).
const MIN_LEVEL_PASSES: usize = 5;

/// `--sharing-from-run`: the profile's one-thread rows from the run's
/// passes at each demand level ([`easerve_calib::alone::shared_levels`],
/// the uncontended time from the stage `factors` (encode, prefill) and the
/// profile's own curve as the simulation applied it); a level with at
/// least [`MIN_LEVEL_PASSES`] passes replaces or adds its row, the others
/// are kept; what it did printed.
fn refine_one_thread_sharing(
    p: &mut Profile,
    measured: &[easerve_calib::alone::Spans],
    simulated: &[easerve_calib::alone::Spans],
    factors: [f64; 2],
) -> anyhow::Result<()> {
    let Some(h) = p.host_sharing().cloned() else {
        return Ok(());
    };
    let levels = easerve_calib::alone::shared_levels(measured, simulated, factors, &|d| {
        h.slowdown_one_thread(d)
    });
    let mut refit = Vec::new();
    for l in &levels {
        let d = l.level as f64;
        let before = h.slowdown_one_thread(d);
        match l.slowdown().filter(|_| l.passes >= MIN_LEVEL_PASSES) {
            Some(s) => {
                refit.push((d, s));
                sayln!(
                    "host_sharing: demand {} one-thread row from {} requests' passes in the run: measured {:.4} s over {:.4} s uncontended, slowdown {s:.3} (profile {before:.3})",
                    l.level, l.passes, l.measured, l.expected
                );
            }
            None => sayln!(
                "host_sharing: demand {} kept at {before:.3} ({} requests' passes in the run, fewer than {MIN_LEVEL_PASSES})",
                l.level, l.passes
            ),
        }
    }
    match h.with_refit_one_thread(&refit) {
        Ok(curve) => *p = p.clone().with_host_sharing(Some(curve)),
        Err((_, m)) => sayln!("host_sharing: one-thread rows kept as measured ({m})"),
    }
    Ok(())
}

/// The link table from the transfers in flight while no pass ran in both
/// runs ([`easerve_calib::alone::alone_transfers`]; each kind with at least
/// [`MIN_ALONE_PASSES`]), through the same two-term fit as the reports'
/// means ([`easerve_calib::refine::fit_transfers`]). Whether it did.
fn refine_alone_transfers(
    p: &mut Profile,
    measured: &[easerve_calib::alone::Spans],
    simulated: &[easerve_calib::alone::Spans],
    what: &str,
) -> anyhow::Result<bool> {
    if p.transfer_tables().is_empty() {
        return Ok(false);
    }
    let fits = easerve_calib::alone::alone_transfers(measured, simulated);
    let kinds = ["embedding transfer", "kv transfer"];
    let each: Vec<(&str, f64, f64, usize)> = (kinds.iter().zip(fits))
        .filter(|(_, f)| f.passes >= MIN_ALONE_PASSES)
        .map(|(k, f)| {
            (
                *k,
                f.simulated / f.passes as f64,
                f.measured / f.passes as f64,
                f.passes,
            )
        })
        .collect();
    let pairs: Vec<(f64, f64)> = each.iter().map(|e| (e.1, e.2)).collect();
    let Some(fit) = easerve_calib::refine::fit_transfers(&pairs).map_err(BadInput)? else {
        sayln!("transfer: fewer than {MIN_ALONE_PASSES} transfers with a time in both runs while no pass ran; refined as without --alone-passes");
        return Ok(false);
    };
    easerve_calib::refine::refine_transfers(p, fit, what).map_err(|e| BadInput(e.to_string()))?;
    let said: Vec<String> = (each.iter())
        .map(|(k, s, m, n)| format!("{k} {:.3} ms against {:.3} ms over {n}", m * 1e3, s * 1e3))
        .collect();
    sayln!(
        "transfer measured = {:.3} ms + {:.3} x simulated ({}, means of the transfers in flight while no pass ran in both runs)",
        fit.fixed_s * 1e3,
        fit.factor,
        said.join(", ")
    );
    Ok(true)
}

/// Each request's stage spans from a per-request CSV (`--requests-csv` of
/// `easerve sim` or `easerve exec`).
fn read_spans(path: &std::path::Path) -> anyhow::Result<Vec<easerve_calib::alone::Spans>> {
    let file = path.display().to_string();
    easerve_calib::input::check_regular(path).map_err(|e| BadInput(format!("{file}: {e}")))?;
    let mut r = csv::Reader::from_path(path).map_err(|e| BadInput(format!("{file}: {e}")))?;
    let mut out = Vec::new();
    for (i, rec) in r.deserialize::<easerve_sched::RequestRecord>().enumerate() {
        let rec = rec.map_err(|e| {
            BadInput(format!(
                "{file}, row {}: {e} (expected the CSV of `easerve sim --requests-csv` or `easerve exec --requests-csv`)",
                i + 1
            ))
        })?;
        let both = |a: easerve_sched::Stamp, b: easerve_sched::Stamp| a.get().zip(b.get());
        out.push(easerve_calib::alone::Spans {
            id: rec.id,
            encode: (rec.encode_worker)
                .zip(both(rec.encode_start, rec.encode_end))
                .map(|(w, (s, e))| (w as usize, s, e)),
            prefill: both(rec.prefill_start, rec.first_token),
            decode: both(rec.decode_start, rec.finish),
            embedding: both(rec.embedding_sent, rec.prefill_ready),
            kv: both(rec.kv_sent, rec.decode_ready),
            output_tokens: rec.output_tokens,
        });
    }
    Ok(out)
}

/// The stages from a simulated and a measured report of one scenario: each
/// stage's table ([`scale_stage`]) by measured over simulated mean service
/// time (encode too when `with_encode` and the profile has its table), or,
/// from a client's measurement (no service times), by TTFT and TPOT
/// ([`refine_from_latencies`]); what it did printed.
fn refine_runs(
    p: &mut Profile,
    profile: &std::path::Path,
    (s, m): (easerve_workload::Report, easerve_workload::Report),
    (sim, measured): (&std::path::Path, &std::path::Path),
    (with_encode, done): (bool, &[Stage]),
) -> anyhow::Result<()> {
    if s.meta.model != p.provenance.model {
        return Err(BadInput(format!(
            "--sim {} is a run of `{}`, but {} profiles `{}`; refine a profile from runs of its own model",
            sim.display(),
            s.meta.model,
            profile.display(),
            p.provenance.model
        ))
        .into());
    }
    check_sharing_term(p, &s, profile, sim)?;
    let what = format!(
        "measured {} over simulated {}",
        measured.display(),
        sim.display()
    );
    if m.stages.iter().all(|st| st.service.mean <= 0.0) {
        // a client's measurement (easerve bench, vllm bench serve):
        // TTFT and TPOT only
        let with_encode = with_encode && encode_from_tp_rows(p, &s).is_none();
        return refine_latencies(p, &s, &m, with_encode, &what);
    }
    let mut stages = vec![(Stage::Prefill, "prefill"), (Stage::Decode, "decode")];
    match encode_from_tp_rows(p, &s) {
        None if with_encode && p.encode_table().is_some() => {
            stages.insert(0, (Stage::Encode, "encode"))
        }
        Some(tp) if with_encode => eprintln!("encode: the run's encode workers are at TP {tp}, priced from the profile's encode_tp rows, which are not refined; left as is"),
        _ => {}
    }
    for (stage, name) in stages.into_iter().filter(|(st, _)| !done.contains(st)) {
        let (ms, ss) = (service_mean(&m, name), service_mean(&s, name));
        if !(ms > 0.0 && ss > 0.0) {
            eprintln!("{name}: no service time in both reports; left as is");
            continue;
        }
        scale_stage(p, stage, ms / ss, &what).map_err(|e| BadInput(e.to_string()))?;
        sayln!(
            "{name:<8} measured mean service {ms:.4} s, simulated {ss:.4} s, factor {:.3}",
            ms / ss
        );
    }
    if done.contains(&Stage::Transfer) {
        return Ok(());
    }
    refine_link_tables(p, &s, &m, &what)
}

/// The TP of report `r`'s encode workers (from its deployment's
/// allocation, `2E(TP2)+…`) where it is above 1 and `p` has `encode_tp`
/// rows, which priced them: those rows are not refined, and scaling the
/// TP 1 table by the run's factor would move what the run did not measure.
/// `None` when the run's encoders were priced from the TP 1 table (TP 1,
/// or a profile without `encode_tp` rows).
fn encode_from_tp_rows(p: &Profile, r: &easerve_workload::Report) -> Option<u32> {
    let tp = (r.meta.deployment.split_whitespace().next())
        .and_then(|a| a.parse::<easerve_sched::Allocation>().ok())
        .map_or(1, |a| a.encode.tp);
    (tp > 1 && p.encode_tp_table().is_some()).then_some(tp)
}

/// Refuse stage factors that would count a CPU host's measured sharing
/// curve twice or not at all: the simulated run `s` must have priced core
/// sharing as the refined profile `p` will (its `[host_sharing]` curve, or
/// cores/demand without one), since each factor is measured over simulated
/// times that carry the term. A curve of another core count than the run's
/// host is not applied by the twin, so it does not matter here.
///
/// Errors (exit 2): the run's CPU host note names the other term.
fn check_sharing_term(
    p: &Profile,
    s: &easerve_workload::Report,
    profile: &std::path::Path,
    sim: &std::path::Path,
) -> Result<(), BadInput> {
    let Some(note) = s.notes.iter().find(|n| n.starts_with("CPU host: ")) else {
        return Ok(());
    };
    let run_cores = note["CPU host: ".len()..]
        .split(' ')
        .next()
        .and_then(|c| c.parse::<u32>().ok());
    let sim_curve = note.contains("[host_sharing] curve (");
    let applies = p.host_sharing().is_some_and(|h| Some(h.cores) == run_cores);
    if sim_curve == applies {
        if applies {
            eprintln!("host_sharing: kept as measured; the stage factors are over a simulation that applied it (not counted twice)");
        }
        return Ok(());
    }
    let (then, now) = match sim_curve {
        true => (
            "the measured [host_sharing] curve",
            "prices it at cores/demand (no curve for this host)",
        ),
        false => (
            "cores/demand",
            "has a measured [host_sharing] curve the twin applies",
        ),
    };
    Err(BadInput(format!(
        "--sim {} priced the CPU host's core sharing with {then}, but {} {now}: the stage factors would count the difference twice or leave it out; simulate the run again with this profile (--profile {}) and refine against that report",
        sim.display(),
        profile.display(),
        profile.display()
    )))
}

/// Mean service time (seconds) of stage `name` in report `r`; 0 when the
/// report has no such stage.
fn service_mean(r: &easerve_workload::Report, name: &str) -> f64 {
    (r.stages.iter())
        .find(|st| st.stage == name)
        .map_or(0.0, |st| st.service.mean)
}

/// The `[[transfer]]` tables from the two reports' embedding and KV
/// transfer stages ([`easerve_calib::refine::fit_transfers`]); what it did
/// printed.
fn refine_link_tables(
    p: &mut Profile,
    s: &easerve_workload::Report,
    m: &easerve_workload::Report,
    what: &str,
) -> anyhow::Result<()> {
    if p.transfer_tables().is_empty() {
        return Ok(());
    }
    let kinds = ["embedding transfer", "kv transfer"];
    let pairs: Vec<(f64, f64)> = (kinds.iter())
        .map(|k| (service_mean(s, k), service_mean(m, k)))
        .collect();
    let fit = easerve_calib::refine::fit_transfers(&pairs).map_err(BadInput)?;
    let Some(fit) = fit else {
        eprintln!("transfer: no transfer time in both reports; left as is");
        return Ok(());
    };
    easerve_calib::refine::refine_transfers(p, fit, what).map_err(|e| BadInput(e.to_string()))?;
    let each: Vec<String> = (kinds.iter().zip(&pairs))
        .filter(|(_, (s, m))| *s > 0.0 && *m > 0.0)
        .map(|(k, (s, m))| format!("{k} {:.3} ms against {:.3} ms", m * 1e3, s * 1e3))
        .collect();
    sayln!(
        "transfer measured = {:.3} ms + {:.3} x simulated ({}, measured against simulated means)",
        fit.fixed_s * 1e3,
        fit.factor,
        each.join(", ")
    );
    Ok(())
}

/// [`refine_from_latencies`] on the mean TTFT and TPOT of the simulated
/// report `s` and the measured `m`, with what it did and what it cannot
/// identify printed.
fn refine_latencies(
    p: &mut Profile,
    s: &easerve_workload::Report,
    m: &easerve_workload::Report,
    with_encode: bool,
    what: &str,
) -> anyhow::Result<()> {
    let lat = |r: &easerve_workload::Report| ClientLatencies {
        ttft_mean: r.ttft.mean,
        tpot_mean: r.tpot.mean,
    };
    let decode_line = |d: DecodeStep| match d {
        DecodeStep::Scaled(f) => format!(
            "decode   measured mean TPOT {:.4} s, simulated {:.4} s, factor {f:.3}",
            m.tpot.mean, s.tpot.mean
        ),
        DecodeStep::NoTpot => {
            "decode   no TPOT in both runs (one output token each?); left as is".to_string()
        }
    };
    let r = match refine_from_latencies(p, &lat(s), &lat(m), with_encode, what) {
        Ok(r) => r,
        Err(LatencyRefineError::Ttft { decode, source }) => {
            // decode was refined (and said so) before TTFT failed
            sayln!("{}", decode_line(decode));
            return Err(BadInput(source.to_string()).into());
        }
        Err(e) => return Err(BadInput(e.to_string()).into()),
    };
    sayln!("{}", decode_line(r.decode));
    let scaled: Vec<&str> = r.ttft_stages.iter().map(|st| st.name()).collect();
    sayln!(
        "{:<8} measured mean TTFT {:.4} s, simulated {:.4} s, factor {:.3}",
        scaled.join("+"),
        m.ttft.mean,
        s.ttft.mean,
        r.ttft_factor
    );
    sayln!(
        "not identified from TTFT and TPOT: a per-request front-end overhead apart from compute, encode apart from prefill, transfers, queueing apart from service (refine at a light rate; give --measured-csv for encode passes where the server reports them)"
    );
    if !with_encode {
        sayln!(
            "prefill's factor also carries the encode time in TTFT, which --measured-csv refined apart: it over-corrects prefill by that share"
        );
    }
    Ok(())
}

/// `easerve calib import-vidur`.
fn import_vidur(
    dir: &std::path::Path,
    output: Option<&std::path::Path>,
) -> anyhow::Result<ExitCode> {
    let imp = vidur::import_dir(dir).map_err(|e| BadInput(e.to_string()))?;
    say!("{}", render_import(&imp, dir));
    if let Some(out) = output {
        std::fs::write(out, rust_constants(&imp, dir))
            .map_err(|e| BadInput(format!("-o {}: cannot write: {e}", out.display())))?;
        eprintln!("wrote {}", out.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `easerve calib roofline`.
fn roofline(
    model: &str,
    gpu: &str,
    system: &str,
    output: &std::path::Path,
    date: Option<String>,
) -> anyhow::Result<ExitCode> {
    check_system(system)?;
    let (m, g) = presets(model, gpu)?;
    let date = checked_date(date)?;
    let eff = Efficiency::default();
    let terms =
        easerve_calib::preprocess::EncodeTerms::for_system(&m, system, eff.encode_pass_s, 1.0);
    let r = Roofline::new(m, g, eff).with_terms(terms);
    let p = Profile::from_roofline(&r, &GridSpec::default(), &date);
    save_profile(&p, output)?;
    // what was written must read back
    Profile::load(output).map_err(|e| anyhow::anyhow!("written profile invalid: {e}"))?;
    eprintln!(
        "wrote {} ({} of {} on {})",
        output.display(),
        p.provenance.source.as_str(),
        model,
        gpu
    );
    Ok(ExitCode::SUCCESS)
}

/// `easerve calib validate`.
fn validate(
    sim: &std::path::Path,
    measured: &std::path::Path,
    max_error: Option<f64>,
    json: bool,
    per_window: bool,
) -> anyhow::Result<ExitCode> {
    if let Some(e) = max_error {
        if !(e.is_finite() && e >= 0.0) {
            return Err(BadInput(format!(
                "--max-error: {e} must be a finite fraction ≥ 0 (0.1 = 10 %)"
            ))
            .into());
        }
    }
    let (s, m) = load_runs(sim, measured)?;
    if per_window {
        return validate_windows(&s, &m, max_error, json);
    }
    let v = Agreement::compare(&s, &m);
    if json {
        sayln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        say!("{}", v.render_text());
        if let Some(n) = s.notes.iter().find(|n| n.starts_with("CPU host: ")) {
            sayln!("sim core sharing: {n}");
        }
    }
    if let Some(e) = max_error {
        let over = v.exceeding(e);
        if !over.is_empty() {
            let names: Vec<&str> = over.iter().map(|r| r.metric.as_str()).collect();
            eprintln!(
                "{} of {} metrics exceed --max-error {:.1} %: {}",
                over.len(),
                v.rows.len(),
                e * 100.0,
                names.join(", ")
            );
            return Ok(ExitCode::from(1));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `calib validate --per-window`: the window-by-window comparison
/// (`easerve_workload::phase_agreement`); exit 1 when a window's mean TTFT
/// is off by more than `max_error` or the worker changes differ, exit 2
/// when the runs have no window in common.
fn validate_windows(
    s: &easerve_workload::Report,
    m: &easerve_workload::Report,
    max_error: Option<f64>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let v = easerve_workload::phase_agreement::compare_windows(s, m);
    if v.rows.is_empty() {
        return Err(BadInput(
            "--per-window: the runs have no window in common with arrivals in both (a run of a rate schedule has windows: `workload.phases` with `workload.window_s`)".into(),
        )
        .into());
    }
    if json {
        sayln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        say!("{}", v.render_text());
        if let Some(n) = s.notes.iter().find(|n| n.starts_with("CPU host: ")) {
            sayln!("sim core sharing: {n}");
        }
    }
    let Some(e) = max_error else {
        return Ok(ExitCode::SUCCESS);
    };
    let over = v.exceeding(e);
    if !over.is_empty() || !v.same_changes() {
        eprintln!(
            "{} of {} windows exceed --max-error {:.1} %; worker changes {}",
            over.len(),
            v.rows.len(),
            e * 100.0,
            if v.same_changes() { "agree" } else { "differ" }
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// One sample per encode pass (requests of one pass share worker and start).
fn read_encode_passes(
    path: &std::path::Path,
    items_per_request: u64,
) -> anyhow::Result<Vec<EncodeSample>> {
    let file = path.display().to_string();
    easerve_calib::input::check_regular(path).map_err(|e| BadInput(format!("{file}: {e}")))?;
    let mut r = csv::Reader::from_path(path).map_err(|e| BadInput(format!("{file}: {e}")))?;
    let header = r
        .headers()
        .map_err(|e| BadInput(format!("{file}: {e}")))?
        .clone();
    let col = |n: &str| {
        header.iter().position(|h| h == n).ok_or_else(|| {
            BadInput(format!(
                "{file}: missing column `{n}` (expected the CSV of `easerve sim --requests-csv`)"
            ))
        })
    };
    let (cw, cb, cs, ce) = (
        col("encode_worker")?,
        col("encode_batch")?,
        col("encode_start")?,
        col("encode_end")?,
    );
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (i, rec) in r.records().enumerate() {
        let rec = rec.map_err(|e| BadInput(format!("{file}, row {}: {e}", i + 1)))?;
        let field = |c: usize| rec.get(c).unwrap_or("").trim();
        if field(cs).is_empty() || field(ce).is_empty() || field(cb).is_empty() {
            continue; // a request without encode (text-only) or not finished
        }
        let num = |c: usize, n: &str| -> Result<f64, BadInput> {
            field(c)
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| {
                    BadInput(format!(
                        "{file}, row {}: `{n}` = {:?} must be a number ≥ 0",
                        i + 1,
                        field(c)
                    ))
                })
        };
        let (b, s, e) = (
            num(cb, "encode_batch")?,
            num(cs, "encode_start")?,
            num(ce, "encode_end")?,
        );
        if e < s {
            return Err(BadInput(format!(
                "{file}, row {}: encode_end {e} is before encode_start {s}",
                i + 1
            ))
            .into());
        }
        if seen.insert((field(cw).to_string(), s.to_bits())) {
            out.push(EncodeSample {
                items: b as u64 * items_per_request,
                seconds: e - s,
            });
        }
    }
    Ok(out)
}

fn render_profile(p: &Profile, max_rows: usize) -> String {
    let mut s = String::new();
    let v = &p.provenance;
    let _ = writeln!(s, "profile {}", p.origin);
    for (k, x) in [
        ("model", v.model.clone()),
        ("device", v.device.clone()),
        ("link", v.link.clone()),
        ("source", v.source.as_str().to_string()),
        ("backend", v.backend.clone()),
        ("driver", v.driver.clone()),
        ("libraries", v.libraries.join(", ")),
        ("date", v.date.clone()),
        ("method", v.method.clone()),
        ("repetitions", v.repetitions.to_string()),
        ("time_slice_penalty", p.time_slice_penalty.to_string()),
        (
            "bandwidth_interference",
            p.bandwidth_interference.to_string(),
        ),
        ("scalars note", p.scalars_note.clone()),
    ] {
        let _ = writeln!(s, "  {k:<24}{x}");
    }
    let mut tables: Vec<&easerve_calib::profile::Table> = Vec::new();
    tables.extend(p.encode_table());
    tables.extend(p.encode_tp_table());
    tables.push(p.prefill_table());
    tables.push(p.decode_table());
    tables.extend(p.transfer_tables());
    tables.extend(p.all_reduce_table());
    tables.extend(p.kv_land_table());
    for t in tables {
        let link = t.link().map(|l| format!(" link {l}")).unwrap_or_default();
        let axes: Vec<String> = t
            .columns()
            .iter()
            .zip(t.axes())
            .map(|(c, a)| format!("{c} {}..{} ({} values)", a[0], a[a.len() - 1], a.len()))
            .collect();
        let _ = writeln!(
            s,
            "\n[{}]{link}: {} rows, latencies in {}; axes {}",
            t.stage().name(),
            t.rows().len(),
            t.unit().as_str(),
            axes.join(", ")
        );
        let _ = writeln!(
            s,
            "  {}",
            t.columns()
                .iter()
                .map(|c| format!("{c:>15}"))
                .collect::<String>()
        );
        let n = if max_rows == 0 {
            t.rows().len()
        } else {
            max_rows.min(t.rows().len())
        };
        for r in &t.rows()[..n] {
            let _ = writeln!(
                s,
                "  {}",
                r.iter()
                    .map(|x| format!("{:>15}", cell(*x)))
                    .collect::<String>()
            );
        }
        if n < t.rows().len() {
            let _ = writeln!(
                s,
                "  … {} more rows (--rows 0 prints all)",
                t.rows().len() - n
            );
        }
    }
    s
}

fn render_import(imp: &vidur::Import, dir: &std::path::Path) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "Vidur A100 data: {}", dir.display());
    let _ = writeln!(
        s,
        "GEMM efficiency eff(n) = e_max * n / (n + k), fitted on {} (peak {:.0} TFLOPS):",
        vidur::FIT_FILE,
        imp.peak_flops / 1e12
    );
    let _ = writeln!(
        s,
        "{:>4}{:>10}{:>10}{:>22}{:>26}",
        "TP", "e_max", "k (tok)", "in-sample med |err|", "Llama-2-70B med |err|"
    );
    for ((c, ins), cm) in imp.gemm.iter().zip(&imp.in_sample).zip(&imp.cross_model) {
        let _ = writeln!(
            s,
            "{:>4}{:>10.4}{:>10.2}{:>21.2}%{:>25.2}%",
            c.tp,
            c.e_max,
            c.k_tokens,
            ins.1 * 100.0,
            cm.1 * 100.0
        );
    }
    let _ = writeln!(
        s,
        "(errors over the four GEMMs of each row with num_tokens >= {}; cross-model file {})",
        vidur::CHECK_MIN_TOKENS,
        vidur::CHECK_FILE
    );
    let _ = writeln!(
        s,
        "All-reduce on one node, t = latency + bytes / bandwidth ({}):",
        vidur::ALL_REDUCE_FILE
    );
    let _ = writeln!(
        s,
        "{:>4}{:>14}{:>18}{:>16}",
        "TP", "latency (us)", "bandwidth (GB/s)", "med |err|"
    );
    for (c, e) in imp.all_reduce.iter().zip(&imp.all_reduce_error) {
        let _ = writeln!(
            s,
            "{:>4}{:>14.2}{:>18.2}{:>15.2}%",
            c.tp,
            c.latency_s * 1e6,
            c.bandwidth_gbs,
            e.1 * 100.0
        );
    }
    s
}

fn rust_constants(imp: &vidur::Import, dir: &std::path::Path) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "// Generated by `easerve calib import-vidur {}` on {}.",
        dir.display(),
        today_utc()
    );
    let _ = writeln!(
        s,
        "pub const A100_GEMM_EFF: [GemmEffCurve; {}] = [",
        imp.gemm.len()
    );
    for c in &imp.gemm {
        let _ = writeln!(
            s,
            "    GemmEffCurve {{ tp: {}, e_max: {:.4}, k_tokens: {:.2} }},",
            c.tp, c.e_max, c.k_tokens
        );
    }
    let _ = writeln!(s, "];");
    let errs: Vec<String> = imp
        .cross_model
        .iter()
        .map(|(tp, e, _)| format!("({tp}, {e:.4})"))
        .collect();
    let _ = writeln!(
        s,
        "pub const A100_GEMM_CROSS_MODEL_ERROR: [(u32, f64); {}] = [{}];",
        errs.len(),
        errs.join(", ")
    );
    let _ = writeln!(
        s,
        "pub const A100_NVLINK_ALL_REDUCE: [AllReduceCurve; {}] = [",
        imp.all_reduce.len()
    );
    for c in &imp.all_reduce {
        let _ = writeln!(
            s,
            "    AllReduceCurve {{ tp: {}, latency_s: {:.2}e-6, bandwidth_gbs: {:.2} }},",
            c.tp,
            c.latency_s * 1e6,
            c.bandwidth_gbs
        );
    }
    let _ = writeln!(s, "];");
    s
}

/// A table cell: integers as integers, others with 6 significant digits.
/// A table cell in plain decimals with 7 significant digits (`0.5`,
/// `0.02685145`); scientific notation only below 1e-6 or from 1e15 on.
fn cell(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        return format!("{}", x as i64);
    }
    let a = x.abs();
    if !(1e-6..1e15).contains(&a) {
        return format!("{x:.6e}");
    }
    let decimals = (6 - a.log10().floor() as i32).max(0) as usize;
    let text = format!("{x:.decimals$}");
    let text = text.trim_end_matches('0');
    text.trim_end_matches('.').to_string()
}

/// The simulated report `--sim` and the measured run `--measured` of one
/// scenario, checked to be runs of the same model and cluster and to hold
/// something to compare (`calib validate` and `calib refine` alike).
fn load_runs(
    sim: &std::path::Path,
    measured: &std::path::Path,
) -> Result<(easerve_workload::Report, easerve_workload::Report), BadInput> {
    let s = load_report(sim).map_err(|e| BadInput(e.to_string()))?;
    let m = load_measured(measured, &s).map_err(|e| BadInput(e.to_string()))?;
    easerve_workload::agreement::comparable(&s, &m).map_err(|e| {
        BadInput(format!(
            "--sim {} vs --measured {}: {e}",
            sim.display(),
            measured.display()
        ))
    })?;
    easerve_workload::agreement::measurable(&m)
        .map_err(|e| BadInput(format!("--measured {}: {e}", measured.display())))?;
    Ok((s, m))
}

/// Write `p` to `-o PATH`, which must be (or become) a regular file: a
/// device or folder there is bad input, as is any failure to write.
fn save_profile(p: &Profile, path: &std::path::Path) -> Result<(), BadInput> {
    if path.exists() && !path.is_file() {
        return Err(BadInput(format!(
            "-o {}: not a regular file (a device, FIFO or folder); a profile is written to a file",
            path.display()
        )));
    }
    crate::write_output("-o", path, |w| {
        w.write_all(p.to_toml_string().as_bytes())?;
        Ok(())
    })
}

/// `--date`, or today (UTC): a real calendar date written `YYYY-MM-DD`
/// (years 1900 ..= 9999), as a profile's provenance holds it.
fn checked_date(date: Option<String>) -> Result<String, BadInput> {
    let date = date.unwrap_or_else(today_utc);
    let real = date.len() == 10
        && chrono::NaiveDate::parse_from_str(&date, "%Y-%m-%d")
            .is_ok_and(|d| (1900..=9999).contains(&chrono::Datelike::year(&d)));
    if real {
        Ok(date)
    } else {
        Err(BadInput(format!(
            "--date {date:?}: expected a calendar date YYYY-MM-DD (years 1900 ..= 9999), e.g. 2026-12-04"
        )))
    }
}

/// `easerve calib import-aiconfigurator`.
#[allow(clippy::too_many_arguments)]
fn import_aiconfigurator(
    dir: &std::path::Path,
    gpu: &str,
    model: &str,
    framework: &str,
    version: Option<&str>,
    dtype: &str,
    system: &str,
    output: &std::path::Path,
    date: Option<String>,
) -> anyhow::Result<ExitCode> {
    use easerve_calib::{Provenance, Source, StageCost};
    // checked before anything is read or written
    let date = checked_date(date)?;
    if version.is_some_and(|v| v.trim().is_empty()) {
        return Err(BadInput(
            "--version '': give a framework version directory of the tables (e.g. 0.24.0), or leave the flag out for the newest".into(),
        )
        .into());
    }
    if framework != "vllm" {
        return Err(BadInput(format!(
            "--framework {framework}: the tables hold vLLM kernels only (allowed: vllm)"
        ))
        .into());
    }
    check_system(system)?;
    let (m, g) = presets(model, gpu)?;
    let cost = kernel_cost(dir, (&m, &g, gpu), system, dtype, version)?;
    let tables = cost.tables();
    let describe = tables.describe();
    let provenance = Provenance {
        model: m.name.clone(),
        device: g.name.clone(),
        link: g.link.name.clone(),
        source: Source::Imported,
        backend: describe,
        driver: "as measured by aiconfigurator".into(),
        libraries: vec![format!("easerve-calib {}", env!("CARGO_PKG_VERSION"))],
        date,
        method: format!(
            "operator lists (easerve_model::ops) priced from measured kernels, interpolated on log axes; {}",
            cost.sources().join("; ")
        ),
        repetitions: 0,
        cores: None,
    };
    let note = "bandwidth_interference derived from HBM demand; time_slice_penalty assumed (calib/src/eff.rs)";
    let p = Profile::from_cost(
        &cost,
        &m,
        &g,
        provenance,
        &GridSpec::default(),
        (
            cost.time_slice_penalty(),
            cost.bandwidth_interference(),
            note,
        ),
    );
    save_profile(&p, output)?;
    Profile::load(output).map_err(|e| anyhow::anyhow!("written profile invalid: {e}"))?;
    eprintln!(
        "wrote {} (measured kernels of {model} on {gpu})",
        output.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// The measured kernels of `m` on `g` (named `gpu` on the command line) in
/// the tables at `dir` (the newest
/// framework version, which must end with `version` when one is given).
fn kernel_cost(
    dir: &std::path::Path,
    (m, g, gpu): (&ModelArch, &GpuSpec, &str),
    system: &str,
    dtype: &str,
    version: Option<&str>,
) -> anyhow::Result<easerve_calib::KernelCost> {
    use easerve_calib::KernelCost;
    let no_tables = || {
        BadInput(format!(
            "--gpu {gpu}: no measured kernel tables (GPUs with tables: {}, and rtx-6000-ada via the L40S)",
            easerve_calib::aic::AIC_GPUS
                .iter()
                .map(|(g, _)| *g)
                .collect::<Vec<_>>()
                .join(", ")
        ))
    };
    let cost = KernelCost::from_data(dir, m, g, system, dtype, 1.0, true)
        .map_err(|e| BadInput(e.to_string()))?
        .ok_or_else(no_tables)?;
    let tables = cost.tables();
    if let Some(v) = version {
        let have = tables
            .provenance
            .versions
            .get("gemm")
            .cloned()
            .unwrap_or_default();
        if !have.ends_with(v) {
            return Err(BadInput(format!(
                "--version {v}: the tables of {} are {have} (allowed: that version)",
                tables.provenance.system
            ))
            .into());
        }
    }
    Ok(cost)
}

/// The model and GPU presets `--model` and `--gpu` name.
fn presets(model: &str, gpu: &str) -> Result<(ModelArch, GpuSpec), BadInput> {
    let m = ModelArch::preset(model).ok_or_else(|| {
        BadInput(format!(
            "--model: unknown model `{model}` (known: {})",
            ModelArch::preset_names().join(", ")
        ))
    })?;
    let g = GpuSpec::preset(gpu).ok_or_else(|| {
        BadInput(format!(
            "--gpu: unknown GPU `{gpu}` (known: {})",
            GpuSpec::preset_names().join(", ")
        ))
    })?;
    Ok((m, g))
}

/// `--system` names a serving system with encode terms.
fn check_system(system: &str) -> Result<(), BadInput> {
    use easerve_calib::preprocess::FRAMEWORKS;
    if FRAMEWORKS.contains(&system) {
        Ok(())
    } else {
        Err(BadInput(format!(
            "--system {system}: allowed: {}",
            FRAMEWORKS.join(", ")
        )))
    }
}
