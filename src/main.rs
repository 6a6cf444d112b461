//! The `easerve` command line.
//!
//! Exit codes (one place): 0 success; 1 internal error, or `calib validate`
//! found an error above `--max-error`; 2 bad input (a scenario, profile or
//! argument that cannot be used — the message names the file, the field and
//! what is allowed).

/// `print!` through [`emit`]: returns the error from the enclosing function.
macro_rules! say {
    ($($t:tt)*) => {
        if let Err(e) = $crate::emit(format_args!($($t)*)) {
            return Err(e.into());
        }
    };
}

/// `println!` through [`emit`].
macro_rules! sayln {
    () => { say!("\n") };
    ($($t:tt)*) => { say!("{}\n", format_args!($($t)*)) };
}

mod bench_cmd;
mod calib_cmd;
mod capacity_cmd;
mod deploy_cmd;
mod exec_cmd;
mod huge_pages;
mod model_cmd;
mod profile_cmd;
mod reproduce_cmd;
mod search_cmd;
mod sweep_cmd;

use clap::{Parser, Subcommand};
use easerve_sched::WorkerRef;
use easerve_workload::scenario::{Overrides, Scenario, System};
use std::path::PathBuf;
use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: huge_pages::HugePageHint = huge_pages::HugePageHint;

/// Exit codes of a subcommand (`calib validate` states its own).
const EXIT_CODES: &str = "Exit codes: 0 success; 1 internal error; 2 bad input (scenario, profile or arguments: the message names the file, the field and what is allowed) or an output file that cannot be written.";

/// Exit codes of every subcommand, for the top-level help.
const EXIT_CODES_ALL: &str = "Exit codes: 0 success; 1 internal error, or `calib validate` found an error above --max-error; 2 bad input (scenario, profile or arguments: the message names the file, the field and what is allowed) or an output file that cannot be written.";

/// easerve: encode-aware disaggregated serving for multimodal LLMs.
#[derive(Parser, Debug)]
#[command(name = "easerve", version, about, after_help = EXIT_CODES_ALL)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Simulate one run of a scenario on the digital twin and print its report.
    #[command(after_help = EXIT_CODES)]
    Sim(SimArgs),
    /// Search (allocation, B, s) for a scenario: Hybrid Auto Selection or a baseline.
    #[command(after_help = EXIT_CODES)]
    Search(search_cmd::SearchArgs),
    /// Rate sweeps and what-ifs over scenario fields and serving systems, with SVG plots.
    #[command(after_help = EXIT_CODES)]
    Sweep(sweep_cmd::SweepArgs),
    /// Capacity planning: the highest rate the cluster sustains under an SLO tier,
    /// the fewest GPUs for a target rate, or GPU types compared at equal count or cost.
    #[command(after_help = EXIT_CODES)]
    Capacity(capacity_cmd::CapacityArgs),
    /// Load any OpenAI-compatible endpoint with a scenario's workload or a
    /// random multimodal dataset and report TTFT, TPOT, ITL, E2EL and goodput
    /// (`vllm bench serve`'s flags and JSON keys, easerve's report).
    #[command(after_help = EXIT_CODES)]
    #[cfg_attr(
        not(feature = "bench"),
        command(
            about = "Load any OpenAI-compatible endpoint and report TTFT, TPOT, ITL, E2EL and goodput (not in this build: build with `--features bench`)"
        )
    )]
    Bench(bench_cmd::BenchArgs),
    /// Write a deployment's launch files for vLLM, SGLang and NVIDIA Dynamo, the
    /// scenario that reproduces it, a benchmark script, and the simulator's
    /// prediction for each engine's way of running it.
    #[command(after_help = EXIT_CODES)]
    Deploy(deploy_cmd::DeployArgs),
    /// Re-run the EAServe paper's findings in simulation and write a Markdown report with plots.
    #[command(after_help = EXIT_CODES)]
    Reproduce(reproduce_cmd::ReproduceArgs),
    /// Model files: `easerve model import CONFIG.json -o MODEL.toml` writes one
    /// from a Hugging Face checkpoint's config.
    #[command(subcommand)]
    Model(model_cmd::ModelCommand),
    /// Calibration: write, show, import, validate and refine stage-cost profiles.
    #[command(subcommand)]
    Calib(calib_cmd::CalibCommand),
    /// Measure a model's stage-cost tables (encode, prefill, decode, transfer) on the
    /// real backend and write them as a profile.
    #[command(after_help = EXIT_CODES)]
    #[cfg_attr(
        not(feature = "exec"),
        command(
            about = "Measure a model's stage-cost tables on the real backend (not in this build: build with `--features exec`)"
        )
    )]
    Profile(profile_cmd::ProfileArgs),
    /// Run a scenario for real: one worker process per worker of the deployment,
    /// driven by the same scheduler as `sim`, and print the measured report.
    #[command(after_help = exec_cmd::EXEC_HELP)]
    #[cfg_attr(
        not(feature = "exec"),
        command(
            about = "Run a scenario for real on worker processes (not in this build: build with `--features exec`)"
        )
    )]
    Exec(exec_cmd::ExecArgs),
    /// Serve a scenario's deployment behind an OpenAI-compatible HTTP server
    /// (the executor's workers and scheduler; streaming chat completions with
    /// images, audio and video frames, /metrics) until SIGTERM, then report.
    #[command(after_help = exec_cmd::SERVE_HELP)]
    #[cfg_attr(
        not(feature = "exec"),
        command(
            about = "Serve a scenario behind an OpenAI-compatible HTTP server (not in this build: build with `--features exec`)"
        )
    )]
    Serve(exec_cmd::ServeArgs),
    /// Internal: one worker process of `easerve exec`.
    #[command(hide = true)]
    Worker(exec_cmd::WorkerArgs),
}

#[derive(clap::Args, Debug)]
#[command(allow_negative_numbers = true)]
struct SimArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Also write the run's timeline as Chrome trace-event JSON (open it in
    /// ui.perfetto.dev): one track per worker and link.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
}

/// The scenario and what to override in it, and where the run's outputs go:
/// shared by `sim` and `exec`, so one scenario runs the same way in both.
#[derive(clap::Args, Debug)]
pub(crate) struct RunArgs {
    /// Scenario file (TOML; fields documented in scenarios/README.md).
    pub(crate) scenario: PathBuf,
    /// Master seed of every RNG stream (overrides the scenario's `seed`).
    #[arg(long)]
    pub(crate) seed: Option<u64>,
    /// Arrival rate in requests/s (overrides `workload.rate`).
    #[arg(long)]
    pub(crate) rate: Option<f64>,
    /// Number of requests (overrides `workload.requests`).
    #[arg(long)]
    pub(crate) requests: Option<i64>,
    /// Allocation, e.g. `2E(TP1)+1P(TP2)+1D(TP4)` (overrides `deployment.allocation`).
    #[arg(long)]
    pub(crate) allocation: Option<String>,
    /// A whole deployment as `easerve search` prints it, e.g.
    /// `'2E(TP1)+1P(TP2)+1D(TP4) B=8 s=0.55'` (instead of --allocation, --batch, --offload).
    #[arg(long, conflicts_with_all = ["allocation", "batch", "offload"])]
    pub(crate) deployment: Option<String>,
    /// Encode micro-batch bound B (overrides `deployment.batch`).
    #[arg(long = "batch", short = 'B')]
    pub(crate) batch: Option<i64>,
    /// Offload ratio s in [0, 1] (overrides `deployment.offload`).
    #[arg(long = "offload", short = 's')]
    pub(crate) offload: Option<f64>,
    /// Serving system (overrides `deployment.system`): `easerve` (the scenario's
    /// deployment), `passthrough` (the same allocation with encode one request per
    /// pass and s = 1), `aggregated` (replicas running encode inline before
    /// prefill, as a single-engine server does), `epd-serve` (the allocation
    /// with intra-request parallelism over the encode workers, s = 1) or
    /// `hydrainfer` (E+P+D or EP+D as the allocation says, with step budgets
    /// from its TPOT SLO and chunked prefill); docs/sim.md describes each.
    #[arg(long)]
    pub(crate) system: Option<System>,
    /// Take stage costs from this profile (e.g. one measured by `easerve profile`)
    /// instead of the scenario's `profile` field; its model, device and link must
    /// match the scenario's.
    #[arg(long, value_name = "FILE")]
    pub(crate) profile: Option<PathBuf>,
    /// How the Poisson-gap rule estimates the arrival rate (overrides
    /// `deployment.rate_estimator`): `window` (the last 16 gaps, the
    /// default), `fixed` (the scenario's rate) or `ewma:TAU_S` (an EWMA of
    /// time constant TAU_S seconds; the offload router tracks it too).
    #[arg(long, value_name = "KIND")]
    pub(crate) rate_estimator: Option<String>,
    /// The planner that changes the deployment while it runs (overrides
    /// `planner.policy`): `static` (none; with it the report gains the
    /// planner's section: GPU-hours, goodput per GPU-hour), `load`
    /// (thresholds on per-stage queues and KV use) or `twin` (forecast and
    /// simulate candidates). See docs/demand.md.
    #[arg(long, value_name = "POLICY")]
    pub(crate) planner: Option<String>,
    /// Set a scenario field by its dotted path before the other flags apply,
    /// e.g. `--set planner.load_s=[0.4,0.4,0.4]` or `--set cluster.gpus=8`
    /// (a number, a boolean or a TOML inline array as written, anything else
    /// a string); repeatable. A field the scenario does not allow exits 2
    /// naming it.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub(crate) sets: Vec<String>,
    /// Also write one CSV row per request with every lifecycle timestamp (seconds).
    #[arg(long, value_name = "FILE")]
    pub(crate) requests_csv: Option<PathBuf>,
    /// Also write every scheduling decision of the controller, in order, as
    /// JSON Lines (one `Decision` per line: placements, micro-batches with
    /// their SM shares, routes, prefill batches, share changes, decode runs
    /// and yields, an aggregated replica's iterations, failures).
    #[arg(long, value_name = "FILE")]
    pub(crate) decisions: Option<PathBuf>,
    /// Fault injection: worker LABEL (E0, P0, L0, D0; R0 for an aggregated
    /// replica) dies SECONDS into the
    /// run (`sim`: its work in progress is lost; `exec`: its process is killed).
    #[arg(long, value_name = "LABEL@SECONDS")]
    pub(crate) kill_worker: Option<String>,
    /// Supervision: restart a dead worker SECONDS after its death, backing
    /// off ×2 per failed attempt up to max(8, SECONDS) s; it rejoins once its
    /// model is loaded (`sim`: a load derived from its weight bytes over the
    /// host link). `sim`: off unless given (a dead worker stays dead);
    /// `exec`, `serve`: always on, 0.5 s unless given.
    #[arg(long, value_name = "SECONDS")]
    pub(crate) restart_after: Option<f64>,
    /// Print the report as JSON instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) limits: LimitArgs,
}

/// What one request may ask for (each replaces the scenario's `[limits]`
/// field; a request over a limit is refused at arrival, by `sim` as by
/// `exec` and `serve`, whose 400 names the limit).
#[derive(clap::Args, Debug, Default)]
pub(crate) struct LimitArgs {
    /// Most tokens, prompt plus completion, of one request (vLLM's `--max-model-len`).
    #[arg(long, value_name = "TOKENS")]
    pub(crate) max_model_len: Option<i64>,
    /// Most prompt tokens (text and media) one prefill pass takes whole.
    #[arg(long, value_name = "TOKENS")]
    pub(crate) max_prefill_tokens: Option<i64>,
    /// Most items per request by modality, as vLLM takes it, e.g. `'{"image": 16, "video": 1}'` (999 for a modality not named).
    #[arg(long, value_name = "JSON")]
    pub(crate) limit_mm_per_prompt: Option<String>,
    /// Most pixels of one image, decoded, before resizing.
    #[arg(long, value_name = "PIXELS")]
    pub(crate) max_image_pixels: Option<i64>,
    /// Most frames of one video.
    #[arg(long, value_name = "FRAMES")]
    pub(crate) max_video_frames: Option<i64>,
    /// Most seconds of one audio clip.
    #[arg(long, value_name = "SECONDS")]
    pub(crate) max_audio_seconds: Option<f64>,
    /// Most bytes of decoded media per request (RGB8 pixels, f32 samples at 16 kHz).
    #[arg(long, value_name = "BYTES")]
    pub(crate) max_media_bytes: Option<i64>,
}

impl LimitArgs {
    /// The flags as the scenario's `[limits]` fields.
    ///
    /// Errors: `--limit-mm-per-prompt` that is not a JSON object of whole numbers.
    pub(crate) fn section(&self) -> Result<easerve_workload::scenario::LimitsSection, BadInput> {
        let limit_mm_per_prompt = self
            .limit_mm_per_prompt
            .as_deref()
            .map(|j| {
                serde_json::from_str(j).map_err(|e| {
                    BadInput(format!(
                        "--limit-mm-per-prompt `{j}`: not a JSON object of whole numbers by modality, e.g. '{{\"image\": 16}}' ({e})"
                    ))
                })
            })
            .transpose()?;
        Ok(easerve_workload::scenario::LimitsSection {
            max_model_len: self.max_model_len,
            max_prefill_tokens: self.max_prefill_tokens,
            limit_mm_per_prompt,
            max_image_pixels: self.max_image_pixels,
            max_video_frames: self.max_video_frames,
            max_audio_seconds: self.max_audio_seconds,
            max_media_bytes: self.max_media_bytes,
        })
    }
}

impl RunArgs {
    /// Load the scenario with the overrides applied.
    pub(crate) fn scenario(&self) -> anyhow::Result<Scenario> {
        let mut overrides = Overrides {
            seed: self.seed,
            rate: self.rate,
            requests: self.requests,
            allocation: self.allocation.clone(),
            batch: self.batch,
            offload: self.offload,
            system: self.system,
            profile: self.profile.clone(),
            limits: self
                .limits
                .section()
                .map_err(|e| BadInput(format!("{}: {}", self.scenario.display(), e.0)))?,
            rate_estimator: self.rate_estimator.clone(),
            planner: self.planner.clone(),
            groups: None,
        };
        overrides = with_deployment(overrides, self.deployment.as_deref())?;
        let sets = self
            .sets
            .iter()
            .map(|s| match s.split_once('=') {
                Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
                _ => Err(BadInput(format!("--set {s}: expected KEY=VALUE"))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let sc = Scenario::load_with(&self.scenario, &sets, &overrides)
            .map_err(|e| BadInput(e.to_string()))?;
        preflight(&sc)?;
        Ok(sc)
    }

    /// The worker `--kill-worker` names in `sc`'s deployment, and when.
    pub(crate) fn kill(&self, sc: &Scenario) -> anyhow::Result<Option<(WorkerRef, f64)>> {
        let Some(k) = &self.kill_worker else {
            return Ok(None);
        };
        Ok(Some(parse_kill(k, &sc.topology()).map_err(BadInput)?))
    }

    /// `--restart-after`, checked: seconds in (0, 3600] (a zero first delay
    /// would never grow: a crash-looping worker would restart at once, forever).
    pub(crate) fn restart_after(&self) -> Result<Option<f64>, BadInput> {
        match self.restart_after {
            Some(s) if !(s > 0.0 && s <= 3600.0) => Err(BadInput(format!(
                "--restart-after {s}: expected seconds in (0, 3600], e.g. 0.5"
            ))),
            other => Ok(other),
        }
    }

    /// Write the per-request CSV and the decision log (if asked) and print
    /// the report.
    pub(crate) fn output(
        &self,
        report: &easerve_workload::Report,
        records: &[easerve_sched::RequestRecord],
        decisions: &[easerve_sched::Decision],
    ) -> anyhow::Result<()> {
        if let Some(path) = &self.decisions {
            write_output("--decisions", path, |w| {
                for d in decisions {
                    serde_json::to_writer(&mut *w, d)?;
                    w.write_all(b"\n")?;
                }
                Ok(())
            })?;
        }
        if let Some(path) = &self.requests_csv {
            write_output("--requests-csv", path, |w| {
                let mut csv = csv::Writer::from_writer(w);
                for r in records {
                    csv.serialize(r)?;
                }
                csv.flush()?;
                Ok(())
            })?;
        }
        if self.json {
            sayln!("{}", serde_json::to_string_pretty(report)?);
        } else {
            say!("{}", report.render_text());
        }
        Ok(())
    }
}

/// Warn on stderr when the host is already busy (1-minute load average, from
/// `/proc/loadavg`, above its cores): `what` measures real runs, and they are
/// only meaningful on a quiet host. Silent where the load is unknown.
#[cfg(feature = "exec")]
pub(crate) fn warn_if_host_busy(what: &str) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok());
    if let Some(load) = load.filter(|&l| l > cores as f64) {
        eprintln!(
            "warning: the host's load average is {load:.2} on {cores} cores: {what} measures real runs, which other work on the host slows; its timings will be high"
        );
    }
}

/// Write to standard output; a failure (a full disk, say) is an error that
/// names standard output (exit 2), a closed pipe ends the output quietly.
pub(crate) fn emit(args: std::fmt::Arguments<'_>) -> Result<(), BadInput> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_fmt(args).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(BadInput(format!("standard output: cannot write: {e}")))
        }
        _ => Ok(()),
    }
}

/// Print the scenario's [`Scenario::size_warnings`] on stderr.
/// Before a run: warn of sizes that will be slow, and refuse (exit 2) a
/// scenario whose measured kernel tables are there but unreadable
/// ([`Scenario::check_kernel_tables`]).
pub(crate) fn preflight(sc: &Scenario) -> Result<(), BadInput> {
    for w in sc.size_warnings() {
        eprintln!("warning: {}: {w}", sc.name);
    }
    sc.check_kernel_tables()
        .map_err(|e| BadInput(e.to_string()))
}

/// Write an output file named by `flag`: every failure (creating, writing,
/// flushing) is bad input (exit 2) that names the flag and the path.
pub(crate) fn write_output(
    flag: &str,
    path: &std::path::Path,
    write: impl FnOnce(&mut dyn std::io::Write) -> anyhow::Result<()>,
) -> Result<(), BadInput> {
    use std::io::Write as _;
    let cannot = |e: &dyn std::fmt::Display| {
        BadInput(format!("{flag} {}: cannot write: {e}", path.display()))
    };
    let file = std::fs::File::create(path).map_err(|e| cannot(&e))?;
    let mut w = std::io::BufWriter::new(file);
    write(&mut w).map_err(|e| cannot(&e))?;
    w.flush().map_err(|e| cannot(&e))
}

/// `LABEL@SECONDS` of a worker that exists in the deployment `t` (`E0`,
/// `P0`, `L0`, `D0`; `R0` for an aggregated replica).
fn parse_kill(s: &str, t: &easerve_sched::Topology) -> Result<(WorkerRef, f64), String> {
    let bad = || {
        let labels: Vec<&str> = t.workers().map(|w| w.label.as_str()).collect();
        format!(
            "--kill-worker `{s}`: expected LABEL@SECONDS with LABEL one of {} and SECONDS ≥ 0, e.g. {}@2.5",
            labels.join(", "),
            labels.first().unwrap_or(&"E0")
        )
    };
    let (label, at) = s.split_once('@').ok_or_else(bad)?;
    let at: f64 = at.parse().map_err(|_| bad())?;
    if !(at >= 0.0 && at.is_finite()) {
        return Err(bad());
    }
    let w = t.workers().find(|w| w.label == label).ok_or_else(bad)?;
    Ok((w.wref, at))
}

/// `overrides` with the whole deployment of `--deployment` applied (as
/// `easerve search` prints it: allocation, B and s, and on node groups the
/// group of each stage); unchanged without one.
///
/// # Errors
/// A deployment that does not parse, naming `--deployment`.
pub(crate) fn with_deployment(
    overrides: Overrides,
    deployment: Option<&str>,
) -> Result<Overrides, BadInput> {
    match deployment {
        Some(d) => {
            let c: easerve_has::Candidate = d
                .parse()
                .map_err(|e: easerve_has::CandidateError| BadInput(format!("--deployment: {e}")))?;
            Ok(c.overrides(&overrides))
        }
        None => Ok(overrides),
    }
}

/// Bad input: exit code 2. Subcommands wrap a user-facing message in it.
#[derive(Debug)]
pub(crate) struct BadInput(pub(crate) String);

impl std::fmt::Display for BadInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for BadInput {}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Calib(cmd) => calib_cmd::run(cmd),
        Command::Model(cmd) => model_cmd::run(cmd),
        Command::Search(a) => search_cmd::run(a),
        Command::Sweep(a) => sweep_cmd::run(a),
        Command::Reproduce(a) => reproduce_cmd::run(a),
        Command::Capacity(a) => capacity_cmd::run(a),
        Command::Deploy(a) => deploy_cmd::run(a),
        Command::Bench(a) => bench_cmd::run(a),
        #[cfg(feature = "exec")]
        Command::Profile(a) => profile_cmd::run(a),
        Command::Sim(a) => {
            let sc = a.run.scenario()?;
            let opts = easerve_sim::SimOptions {
                timeline: a.trace.is_some(),
                decisions: a.run.decisions.is_some(),
                kill: a.run.kill(&sc)?,
                restart_after: a.run.restart_after()?,
                ..Default::default()
            };
            let out = easerve_sim::simulate_with(&sc, easerve_sim::scenario_cost(&sc), &opts);
            if let (Some(path), Some(timeline)) = (&a.trace, &out.timeline) {
                write_output("--trace", path, |w| Ok(serde_json::to_writer(w, timeline)?))?;
            }
            a.run.output(&out.report, &out.records, &out.decisions)?;
            Ok(ExitCode::SUCCESS)
        }
        #[cfg(feature = "exec")]
        Command::Exec(a) => exec_cmd::run(a),
        #[cfg(feature = "exec")]
        Command::Serve(a) => exec_cmd::serve(a),
        #[cfg(feature = "exec")]
        Command::Worker(a) => exec_cmd::worker(a),
        #[cfg(not(feature = "exec"))]
        Command::Profile(_) => Err(without_executor("profile")),
        #[cfg(not(feature = "exec"))]
        Command::Exec(_) | Command::Worker(_) => Err(without_executor("exec")),
        #[cfg(not(feature = "exec"))]
        Command::Serve(_) => Err(without_executor("serve")),
    }
}

/// The error of a subcommand that runs real models (`exec`, `profile`, `calib
/// measure-preprocess`) in a build without the `exec` feature: what to build
/// instead (exit 2, like any input this build cannot use).
#[cfg(not(feature = "exec"))]
pub(crate) fn without_executor(cmd: &str) -> anyhow::Error {
    BadInput(format!(
        "`easerve {cmd}` runs real models, and this easerve was built without the executor (burn); \
         build it with `cargo build --release --features exec` (`--features cuda` for NVIDIA GPUs; \
         see docs/build.md) and run `target/release/easerve {cmd} …`, or \
         `cargo run --release --features exec -- {cmd} …`"
    ))
    .into()
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    ExitCode::SUCCESS
                }
                _ => ExitCode::from(2),
            };
        }
    };
    match run(cli) {
        Ok(code) => code,
        Err(e) if e.is::<BadInput>() => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
