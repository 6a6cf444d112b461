//! `easerve exec`: run a scenario for real (worker processes driven by the
//! shared scheduler) and print the measured report; and the hidden
//! `easerve worker` each of those processes runs.

#[cfg(feature = "exec")]
use std::process::ExitCode;

#[cfg(feature = "exec")]
use easerve_exec::device::{check_device, CoreSide, DeviceKind};
#[cfg(feature = "exec")]
use easerve_exec::limits::{available_memory, cpu_limits, f32_weight_bytes, worker_processes};
#[cfg(feature = "exec")]
use easerve_exec::run::{execute, ExecOptions};
#[cfg(feature = "exec")]
use easerve_exec::wire::Role;
#[cfg(feature = "exec")]
use easerve_worker::process::{run_worker, WorkerOptions};

#[cfg(feature = "exec")]
use crate::BadInput;
use crate::RunArgs;

pub(crate) const EXEC_HELP: &str = "Each worker runs on one device, or at TP k on k devices: an encode (LLaVA-NeXT CLIP encoder), prefill or decode worker at TP k is k rank processes (rank 0 speaks to the controller); on --device cpu the ranks all-reduce over loopback TCP, each with its share of the host's threads, and on --device cuda through NCCL, one GPU per rank (the worker's consecutive GPUs of the allocation); local prefill and aggregated workers run TP1 only (simulate the rest with `easerve sim`). On CPU every worker is a process bounded to its share of the host's threads; the scenario's `cluster.gpu` should be `cpu` so that its costs (profile) describe the host.

Exit codes: 0 the run finished (failed or rejected requests are in the report); 1 the workers could not start, or an internal error; 2 bad input (scenario, profile or arguments: the message names the file, the field and what is allowed).";

#[derive(clap::Args, Debug)]
#[command(allow_negative_numbers = true)]
#[cfg_attr(not(feature = "exec"), allow(dead_code))]
pub(crate) struct ExecArgs {
    #[command(flatten)]
    run: RunArgs,
    /// cpu (burn NdArray) or cuda (a build with `--features cuda`, one GPU per worker).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// CPU threads of every worker process. Default: encode workers and their
    /// co-located prefill workers get all cores (as `profile` measures a CPU
    /// device; a pass at SM share f runs on round(f × cores) threads); remote
    /// prefill and decode workers share the cores, at least 1 thread each.
    #[arg(long)]
    threads: Option<usize>,
    /// Admission control: requests in the system (admitted, not finished) beyond
    /// which arrivals are rejected (overrides `deployment.admission_limit`).
    #[arg(long, value_name = "N")]
    admission_limit: Option<usize>,
    /// Stop the run after this many seconds and report what finished.
    #[arg(long, value_name = "SECONDS")]
    time_limit: Option<f64>,
    /// Seconds to wait for the workers to start and load their models.
    #[arg(long, value_name = "SECONDS", default_value_t = 120.0)]
    startup_timeout: f64,
    /// cuda with an MPS daemon running: start each encode worker that has a
    /// co-located prefill worker with `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` of
    /// this share (0, 1) and that prefill worker with the rest: a fixed SM
    /// split, the fallback for green contexts (see `exec/src/green.rs`); the
    /// scenario's SM policy becomes `static:SHARE` (each percentage rounded
    /// up, so the two may sum to 101). Needs a deployment with local
    /// prefill (s < 1).
    #[arg(long, value_name = "SHARE")]
    mps_encode_share: Option<f64>,
}

#[cfg(feature = "exec")]
pub(crate) fn run(a: ExecArgs) -> anyhow::Result<ExitCode> {
    let (sc, opts) = setup(&a)?;
    let cost = sc.cost();
    crate::warn_if_host_busy("exec");
    let out = execute(&sc, &*cost, &opts)?;
    a.run.output(&out.report, &out.records, &out.decisions)?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) const SERVE_HELP: &str = "Endpoints: POST /v1/chat/completions (text, image_url and input_audio parts as base64 data URLs, video as frames; stream or not; max_tokens fixes the output length), GET /v1/models, GET /health, GET /metrics (Prometheus text, vLLM's metric names). Remote http(s) media URLs are refused: the server fetches nothing. The models carry seeded random weights and no tokenizer: a text prompt counts one token per word, and a completion's text is its token ids.

SIGTERM or Ctrl-C (or --time-limit SECONDS after the workers are up) stops accepting (503), lets the requests in flight finish, stops the workers and prints the report of what was served, as `exec` does. A client that disconnects aborts its request, and so does one whose deadline passes (the body's `timeout` in seconds, or the scenario's `workload.timeout_s`; 408): its queued work is cancelled, its running work stops at the next step and its KV blocks are freed (`easerve:request_aborted_total`).

Admission: without --admission-limit or `deployment.admission_limit`, the server admits at most twice the requests its deployment holds in work at once (encode passes and envelopes in flight, prefill batches, decode batches within their KV blocks); more get 429.

The scenario gives the deployment, the model, the costs and the knobs; its workload (and --rate, --requests) only sets the typical request the policies' costs assume and the batcher's first rate estimate: the requests are the ones that come.

Exit codes: 0 served and drained; 1 the address could not be bound, the workers could not start, or an internal error; 2 bad input (scenario, profile or arguments).";

#[derive(clap::Args, Debug)]
#[cfg_attr(not(feature = "exec"), allow(dead_code))]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    exec: ExecArgs,
    /// Address to listen on (port 0: a free port; the address taken is
    /// printed on stdout as `listening on http://ADDR`).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8000")]
    listen: std::net::SocketAddr,
    /// A connection whose request headers have not all come within this
    /// many seconds is closed (hyper's default).
    #[arg(long, value_name = "SECONDS", default_value_t = easerve_exec_defaults::HEADER_TIMEOUT_S)]
    header_read_timeout: f64,
    /// A request body not received whole within this many seconds of its
    /// headers gets a 408 (nginx's `client_body_timeout` default).
    #[arg(long, value_name = "SECONDS", default_value_t = easerve_exec_defaults::BODY_TIMEOUT_S)]
    body_read_timeout: f64,
    /// Connections open at once; one more gets a 503 and is closed. Default:
    /// what the process's open-file limit (`ulimit -n`) leaves after the
    /// server's own descriptors.
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
}

/// The socket's defaults, as `easerve_exec::socket` states them (repeated
/// here so the CLI builds without the executor).
mod easerve_exec_defaults {
    /// hyper's header read timeout, seconds.
    pub(super) const HEADER_TIMEOUT_S: f64 = 30.0;
    /// nginx's `client_body_timeout`, seconds.
    pub(super) const BODY_TIMEOUT_S: f64 = 60.0;
}

#[cfg(feature = "exec")]
pub(crate) fn serve(a: ServeArgs) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let (mut sc, exec) = setup(&a.exec)?;
    let socket = socket_limits(&a, &sc)?;
    if sc.knobs.admission_limit.is_none() {
        let n = sc.default_admission_limit();
        eprintln!("admission limit: {n} requests in the system (twice what the deployment holds in work; --admission-limit sets another)");
        sc.knobs.admission_limit = Some(n);
    }
    let cost = sc.cost();
    crate::warn_if_host_busy("serve");
    let opts = easerve_exec::serve::ServeOptions {
        exec,
        listen: a.listen,
        log_decisions: a.exec.run.decisions.is_some(),
        socket,
    };
    let out = easerve_exec::serve::serve(&sc, &*cost, &opts, |addr| {
        let mut o = std::io::stdout();
        let _ = writeln!(o, "listening on http://{addr} (model `{}`)", sc.model.name);
        let _ = o.flush();
    })?;
    a.exec
        .run
        .output(&out.report, &out.records, &out.decisions)?;
    Ok(ExitCode::SUCCESS)
}

/// The socket's limits from the flags, checked; the connection cap's
/// default from the open-file limit.
#[cfg(feature = "exec")]
fn socket_limits(
    a: &ServeArgs,
    sc: &easerve_workload::Scenario,
) -> Result<easerve_exec::socket::SocketLimits, BadInput> {
    use std::time::Duration;
    let secs = |flag: &str, v: f64| {
        if v > 0.0 && v <= 86_400.0 {
            Ok(Duration::from_secs_f64(v))
        } else {
            Err(BadInput(format!(
                "{flag} {v}: must be in (0, 86400] seconds"
            )))
        }
    };
    if a.max_connections == Some(0) {
        return Err(BadInput("--max-connections must be at least 1".into()));
    }
    Ok(easerve_exec::socket::SocketLimits {
        header_timeout: secs("--header-read-timeout", a.header_read_timeout)?,
        body_timeout: secs("--body-read-timeout", a.body_read_timeout)?,
        max_connections: a
            .max_connections
            .or_else(|| easerve_exec::socket::default_max_connections(worker_processes(sc))),
    })
}

/// The scenario of an `exec` or `serve`, with the flags applied and checked
/// against what the executor can run, and how to run it.
#[cfg(feature = "exec")]
fn setup(a: &ExecArgs) -> anyhow::Result<(easerve_workload::Scenario, ExecOptions)> {
    let mut sc = a.run.scenario()?;
    let device: DeviceKind = a
        .device
        .parse()
        .map_err(|e: String| BadInput(format!("--device: {e}")))?;
    check_device(device).map_err(|e| BadInput(e.0))?;
    check_runnable(a, &sc, device)?;
    if let Some(n) = a.admission_limit {
        if n == 0 {
            return Err(BadInput("--admission-limit must be at least 1".into()).into());
        }
        sc.knobs.admission_limit = Some(n);
    }
    if a.threads == Some(0) {
        return Err(BadInput("--threads must be at least 1".into()).into());
    }
    if let Some(t) = a.time_limit {
        if !(t > 0.0 && t.is_finite()) {
            return Err(
                BadInput("--time-limit must be a positive number of seconds".into()).into(),
            );
        }
    }
    if device == DeviceKind::Cpu {
        check_cpu_workers(a, &sc)?;
        // what one prefill pass can take in this host's memory binds the
        // controller and the server alike
        if let Some(avail) = available_memory() {
            sc.limits = sc.limits.tightened(&cpu_limits(&sc, avail));
        }
    }
    if !(a.startup_timeout > 0.0 && a.startup_timeout <= 86_400.0) {
        return Err(BadInput(format!(
            "--startup-timeout {}: must be in (0, 86400] seconds",
            a.startup_timeout
        ))
        .into());
    }
    // an unwritable CSV is found before the run, not after it
    if let Some(path) = &a.run.requests_csv {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| {
                BadInput(format!(
                    "--requests-csv {}: cannot write: {e}",
                    path.display()
                ))
            })?;
    }
    let kill = a.run.kill(&sc)?;
    if let Some(share) = a.mps_encode_share {
        check_mps_share(&sc, device, share)?;
    }
    let opts = ExecOptions {
        device,
        exe: std::env::current_exe()?,
        threads: a.threads,
        startup_timeout_s: a.startup_timeout,
        time_limit_s: a.time_limit,
        kill,
        restart: Some(match a.run.restart_after()? {
            Some(base) => easerve_sched::Backoff::starting_at(base),
            None => easerve_sched::Backoff::DEFAULT,
        }),
        mps_encode_share: a.mps_encode_share,
    };
    Ok((sc, opts))
}

/// Refuse what the executor cannot run yet: TP > 1 on local prefill and
/// aggregated workers, on a mixture-of-experts LLM, on an encoder other than
/// the LLaVA-NeXT CLIP tower, or on encode workers beside local prefill
/// workers (`deployment.offload` < 1); a TP that does not split the LLM's or
/// the encoder's heads; a TP worker with more ranks than the host has cores
/// (`--device cpu`) or the driver shows GPUs (`--device cuda`); and the
/// systems `unsupported` names.
#[cfg(feature = "exec")]
fn check_runnable(
    a: &ExecArgs,
    sc: &easerve_workload::Scenario,
    device: DeviceKind,
) -> Result<(), BadInput> {
    let alloc = sc.deployment.allocation;
    let file = a.run.scenario.display();
    let local_tp = sc.knobs.local_prefill_tp.unwrap_or(1);
    if let Some((_, tp)) = sc.aggregated() {
        if tp > 1 {
            return Err(BadInput(format!(
                "{file}: deployment.aggregated_tp {tp}: the executor runs each aggregated replica on one device (TP1); set deployment.aggregated_tp = 1, or simulate it with `easerve sim`"
            )));
        }
    } else {
        if alloc.encode.tp > 1 || alloc.prefill.tp > 1 || alloc.decode.tp > 1 {
            check_tp(&file.to_string(), sc, device)?;
        }
        if local_tp > 1 || (alloc.encode.tp > 1 && sc.knobs.local_prefill_tp.is_some()) {
            return Err(BadInput(format!(
                "{file}: deployment.allocation `{alloc}` with deployment.offload {} < 1 (local prefill at TP {local_tp} on the encode workers' devices): the executor runs local prefill workers at TP1 beside encode workers at TP1; set deployment.offload = 1 (or --offload 1) to run encode at TP > 1, or simulate it with `easerve sim`",
                sc.deployment.offload
            )));
        }
    }
    if let Some(why) = unsupported(sc.system) {
        return Err(BadInput(format!(
            "system `{}`: {why}; the executor runs easerve, passthrough and aggregated (simulate it with `easerve sim`)",
            sc.system
        )));
    }
    Ok(())
}

/// The encode, prefill and decode TP degrees of `sc` on `device`: a model
/// they split ([`easerve_model::LlmArch::executor_tp`],
/// [`easerve_model::EncoderArch::executor_tp`]), and no more ranks per worker
/// than the host's cores (`--device cpu`, one rank per core) or the GPUs the
/// driver shows (`--device cuda`, one rank per GPU: NCCL takes no two ranks on
/// one GPU).
#[cfg(feature = "exec")]
fn check_tp(
    file: &str,
    sc: &easerve_workload::Scenario,
    device: DeviceKind,
) -> Result<(), BadInput> {
    let alloc = sc.deployment.allocation;
    let (slots, per) = match device {
        DeviceKind::Cpu => (easerve_exec::device::cpu_cores(), "core"),
        DeviceKind::Cuda => (easerve_exec::device::cuda_gpus(), "GPU"),
    };
    let stages = [
        ("encode", alloc.encode.tp, encoder_tp(sc)),
        ("prefill", alloc.prefill.tp, sc.model.llm.executor_tp()),
        ("decode", alloc.decode.tp, sc.model.llm.executor_tp()),
    ];
    for (stage, tp, allowed) in stages {
        let tp = tp as usize;
        if !allowed.contains(&tp) {
            return Err(BadInput(format!(
                "{file}: deployment.allocation `{alloc}`: {stage} TP {tp} does not split model `{}` ({}); allowed TP: {allowed:?}",
                sc.model.name,
                split_widths(sc, stage)
            )));
        }
        if tp > slots {
            return Err(BadInput(format!(
                "{file}: deployment.allocation `{alloc}`: a{} {stage} worker at TP {tp} runs {tp} rank processes, one per {per}, and this host has {slots} {per}(s); use TP ≤ {slots}",
                if stage == "encode" { "n" } else { "" }
            )));
        }
    }
    Ok(())
}

/// The TP degrees the executor splits `sc`'s encoder into (1 without one).
#[cfg(feature = "exec")]
fn encoder_tp(sc: &easerve_workload::Scenario) -> Vec<usize> {
    sc.model
        .encoder
        .as_ref()
        .map_or_else(|| vec![1], |e| e.executor_tp())
}

/// The widths a `stage` TP must divide, for the refusal's message.
#[cfg(feature = "exec")]
fn split_widths(sc: &easerve_workload::Scenario, stage: &str) -> String {
    match (&sc.model.encoder, stage) {
        (Some(e), "encode") if e.executor_tp().len() > 1 => {
            format!("encoder: {} attention heads, MLP width {}", e.heads, e.ffn)
        }
        (Some(_), "encode") => {
            "its encoder family has no tensor-parallel split in the executor; only the LLaVA-NeXT CLIP tower has".into()
        }
        _ => {
            let l = &sc.model.llm;
            format!(
                "{} attention heads, {} KV heads, MLP width {}{}",
                l.heads,
                l.kv_heads,
                l.ffn,
                if l.moe.is_some() { ", mixture of experts" } else { "" }
            )
        }
    }
}

/// On `--device cpu`: warn when preprocessing is pipelined, and refuse a model
/// whose f32 weights on every CPU worker exceed 80 % of the available memory.
#[cfg(feature = "exec")]
fn check_cpu_workers(a: &ExecArgs, sc: &easerve_workload::Scenario) -> Result<(), BadInput> {
    if let (Some(n), false) = (sc.knobs.preprocess_threads, sc.gpu.name == "cpu") {
        eprintln!(
            "warning: {}: preprocessing is pipelined on {n} thread(s) per encode worker (the default on a GPU); on --device cpu those threads share the host's cores with the passes; set deployment.preprocess = \"serial\" to preprocess within each pass",
            a.run.scenario.display()
        );
    }
    // every rank of a TP worker builds the whole model before keeping its shard
    let alloc = sc.deployment.allocation;
    let extra_ranks = match sc.aggregated() {
        Some(_) => 0,
        None => {
            alloc.prefill.workers * (alloc.prefill.tp - 1)
                + alloc.decode.workers * (alloc.decode.tp - 1)
        }
    };
    let workers = f64::from(worker_processes(sc) + extra_ranks);
    let need = f32_weight_bytes(&sc.model) * workers;
    if let Some(avail) = available_memory() {
        if need > 0.8 * avail {
            return Err(BadInput(format!(
                "{}: model `{}` in f32 on {workers} CPU workers needs {:.1} GB, more than the {:.1} GB available; use a tiny-* preset on CPU (scenarios/cpu-*.toml) or --device cuda",
                a.run.scenario.display(),
                sc.model.name,
                need / 1e9,
                avail / 1e9
            )));
        }
    }
    Ok(())
}

/// `--mps-encode-share` `share`: a share in (0, 1), of a deployment with local
/// prefill workers, on `--device cuda`.
#[cfg(feature = "exec")]
fn check_mps_share(
    sc: &easerve_workload::Scenario,
    device: DeviceKind,
    share: f64,
) -> Result<(), BadInput> {
    if !(share > 0.0 && share < 1.0) {
        return Err(BadInput(format!(
            "--mps-encode-share: {share} is not a share in (0, 1)"
        )));
    }
    if !sc.deployment.has_local_prefill() {
        return Err(BadInput(format!(
            "--mps-encode-share splits a GPU between an encode worker and its local prefill worker; {}'s deployment has none (offload s = 1)",
            sc.file
        )));
    }
    if device != DeviceKind::Cuda {
        return Err(BadInput(
            "--mps-encode-share applies to --device cuda only".into(),
        ));
    }
    Ok(())
}

#[derive(clap::Args, Debug)]
#[cfg_attr(not(feature = "exec"), allow(dead_code))]
pub(crate) struct WorkerArgs {
    /// encode, prefill or decode.
    #[arg(long)]
    role: String,
    /// Index within the stage.
    #[arg(long)]
    index: usize,
    /// Controller address (host:port).
    #[arg(long)]
    connect: std::net::SocketAddr,
    /// Model preset.
    #[arg(long)]
    model: String,
    /// CPU threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Run seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// cpu or cuda.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Device ordinal (cuda).
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// Cores its passes run on (cpu): any, low (an encode worker sharing its
    /// cores with a local prefill worker) or high (that prefill worker).
    #[arg(long, default_value = "any")]
    cores: String,
    /// Preprocessing threads of an encode worker whose requests are sent
    /// ahead of their passes (pipelined preprocessing); 0: serial.
    #[arg(long, default_value_t = 0)]
    preprocess_threads: usize,
    /// Tensor-parallel degree (cpu): this worker's ranks, one process each.
    #[arg(long, default_value_t = 1)]
    tp: usize,
    /// This process's rank (0: the one the controller starts; it starts the others).
    #[arg(long, default_value_t = 0)]
    tp_rank: usize,
    /// Rank 0's loopback address (ranks ≥ 1).
    #[arg(long)]
    tp_root: Option<std::net::SocketAddr>,
}

#[cfg(feature = "exec")]
pub(crate) fn worker(a: WorkerArgs) -> anyhow::Result<ExitCode> {
    let role = match a.role.as_str() {
        "encode" => Role::Encode,
        "prefill" => Role::Prefill,
        "decode" => Role::Decode,
        "replica" => Role::Replica,
        r => {
            return Err(BadInput(format!(
                "--role: unknown role `{r}` (encode, prefill, decode or replica)"
            ))
            .into())
        }
    };
    let device: DeviceKind = a
        .device
        .parse()
        .map_err(|e: String| BadInput(format!("--device: {e}")))?;
    let cores: CoreSide = a
        .cores
        .parse()
        .map_err(|e: String| BadInput(format!("--cores: {e}")))?;
    let opts = WorkerOptions {
        role,
        index: a.index,
        connect: a.connect,
        model: a.model,
        threads: a.threads,
        seed: a.seed,
        device,
        gpu: a.gpu,
        cores,
        preprocess_threads: a.preprocess_threads,
        tp: a.tp,
        tp_rank: a.tp_rank,
        tp_root: a.tp_root,
    };
    if a.tp > 1 && device != DeviceKind::Cpu {
        return Err(BadInput(format!(
            "--tp {}: tensor-parallel ranks run on --device cpu only (a GPU's all-reduce needs NCCL, not in this build)",
            a.tp
        ))
        .into());
    }
    if a.tp == 0 || a.tp_rank >= a.tp {
        return Err(BadInput(format!(
            "--tp {} --tp-rank {}: need TP ≥ 1 and 0 ≤ rank < TP",
            a.tp, a.tp_rank
        ))
        .into());
    }
    run_worker(&opts).map_err(anyhow::Error::msg)?;
    Ok(ExitCode::SUCCESS)
}

/// Why the executor cannot run `system`, if it cannot.
#[cfg(feature = "exec")]
fn unsupported(system: easerve_workload::scenario::System) -> Option<&'static str> {
    use easerve_workload::scenario::System;
    match system {
        System::Easerve | System::Passthrough | System::Aggregated => None,
        System::EpdServe => Some("its workers encode whole requests, not the per-image shards of intra-request parallelism"),
        System::HydraInfer => Some("its prefill workers run whole prompts, not chunks under a token budget, and do not step in lockstep with the encoder on a shared device"),
    }
}

// the CLI's copies of the socket's defaults are the executor's
#[cfg(feature = "exec")]
const _: () = assert!(
    easerve_exec_defaults::HEADER_TIMEOUT_S == easerve_exec::socket::DEFAULT_HEADER_TIMEOUT_S
        && easerve_exec_defaults::BODY_TIMEOUT_S == easerve_exec::socket::DEFAULT_BODY_TIMEOUT_S
);
