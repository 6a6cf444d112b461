//! `easerve profile`: measure a model's stage-cost tables on the real backend.

use std::path::PathBuf;
#[cfg(feature = "exec")]
use std::{
    io::IsTerminal,
    process::{Command, ExitCode},
};

#[cfg(feature = "exec")]
use easerve_calib::profile::today_utc;
#[cfg(feature = "exec")]
use easerve_exec::device::{check_device, cpu_cores, cpu_levels, DeviceKind};
#[cfg(feature = "exec")]
use easerve_exec::limits::{available_memory, f32_weight_bytes};
#[cfg(feature = "exec")]
use easerve_model::ModelArch;
#[cfg(feature = "exec")]
use easerve_worker::profiler::{profile_cpu, run_level_cpu, Plan, ProfileOptions};
#[cfg(feature = "exec")]
use easerve_worker::sharing::{
    group_windows, one_thread_demands, run_sharing_process, sharing_demands, sharing_groups,
};
#[cfg(feature = "exec")]
use indicatif::{ProgressBar, ProgressStyle};

#[cfg(feature = "exec")]
use crate::BadInput;

#[derive(clap::Args, Debug)]
#[cfg_attr(not(feature = "exec"), allow(dead_code))]
pub(crate) struct ProfileArgs {
    /// Model preset to build and time (e.g. tiny-image, tiny-video, tiny-audio; the
    /// real-size presets need a GPU).
    #[arg(long)]
    model: String,
    /// cpu (burn NdArray; SM level = share of CPU threads) or cuda (needs a build
    /// with `--features cuda` and an NVIDIA driver; SM levels 0.2..1.0 through
    /// libsmctrl when libsmctrl.so is on the loader path, else level 1.0 only).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Write the profile here (TOML, see calib/README.md); without it the profile
    /// goes to stdout.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    output: Option<PathBuf>,
    /// Timed runs per grid point.
    #[arg(long, default_value_t = 5)]
    repetitions: u32,
    /// Untimed warm-up runs per grid point.
    #[arg(long, default_value_t = 2)]
    warmup: u32,
    /// Seed of the random weights and synthetic inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// A reduced grid (for smoke tests): 2 encode sizes x 2 batches, 4 prefill sizes,
    /// 2 x 2 decode points.
    #[arg(long)]
    quick: bool,
    /// Tensor-parallel degrees of the prefill and decode tables (cpu; comma
    /// separated, e.g. `1,2,4`; 1 is always measured): each TP k > 1 times a
    /// TP k worker's rank processes and the all-reduce among k ranks, and,
    /// where the encoder splits at k (LLaVA-NeXT's CLIP tower), an encode
    /// worker's (the `encode_tp` table). Each degree must split the model's
    /// heads.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    tp: Vec<usize>,
    /// Seconds of each window of the host-sharing measurement (cpu): the
    /// profile's `[host_sharing]` table, the executor's passes timed alone
    /// and with 1 to 2.5× the cores' threads of other busy worker processes
    /// (8 windows), from 2 one-thread processes busy together up to 3.5×
    /// the cores' (its `one_thread_rows`: 6 more windows on 2 cores), and
    /// with `--tp` degrees above 1 a TP k rank group's
    /// (its `tp_rows`: 5 more windows at TP 2 on 2 cores; worker/src/sharing.rs). Default 3 for the full grid, 0
    /// (left out) with --quick.
    #[arg(long, value_name = "SECONDS")]
    host_sharing_secs: Option<f64>,
    /// Leave the `[host_sharing]` table out (as --host-sharing-secs 0).
    #[arg(long)]
    no_host_sharing: bool,
    /// Internal: run one process of the host-sharing measurement.
    #[arg(long, hide = true)]
    level_sharing: bool,
    /// Internal: measure one CPU thread level in this process.
    #[arg(long, hide = true)]
    level_threads: Option<usize>,
    /// Internal: cores the levels divide (set by the parent process).
    #[arg(long, hide = true)]
    cores: Option<usize>,
    /// Internal: the TP degree of the level this process measures.
    #[arg(long, hide = true, default_value_t = 1)]
    level_tp: usize,
}

#[cfg(feature = "exec")]
pub(crate) fn run(a: ProfileArgs) -> anyhow::Result<ExitCode> {
    let arch = ModelArch::preset(&a.model).ok_or_else(|| {
        BadInput(format!(
            "--model: unknown model `{}` (known: {})",
            a.model,
            ModelArch::preset_names().join(", ")
        ))
    })?;
    let kind: DeviceKind = a
        .device
        .parse()
        .map_err(|e: String| BadInput(format!("--device: {e}")))?;
    if a.repetitions == 0 {
        return Err(BadInput("--repetitions must be at least 1".into()).into());
    }
    check_device(kind).map_err(|e| BadInput(e.0))?;
    let tp = check_tp(&a.tp, &arch, kind)?;
    let opts = ProfileOptions {
        repetitions: a.repetitions,
        warmup: a.warmup,
        seed: a.seed,
        quick: a.quick,
        tp,
        host_sharing_s: host_sharing_secs(&a, kind)?,
    };
    let cores = a.cores.unwrap_or_else(cpu_cores);
    if let Some(threads) = a.level_threads {
        match a.level_sharing {
            true => run_sharing_process(&arch, &opts, threads, a.level_tp, opts.host_sharing_s)?,
            false => run_level_cpu(&arch, &opts, threads, cores, a.level_tp)?,
        }
        return Ok(ExitCode::SUCCESS);
    }
    // Fail on an unwritable output before minutes of measuring (without truncating
    // an existing file).
    if let Some(out) = &a.output {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(out)
            .map_err(|e| BadInput(format!("-o {}: cannot write: {e}", out.display())))?;
    }
    if kind == DeviceKind::Cuda {
        return cuda_profile(&arch, &opts, &a);
    }
    check_cpu_memory(&arch)?;
    crate::warn_if_host_busy("profile");
    let total = progress_points(&arch, &opts, cores);
    let bar = progress_bar(total as u64);
    let exe = std::env::current_exe()?;
    let spawn = |threads: usize, tp: usize| level_command(&a, &exe, threads, cores, tp);
    let secs = opts.host_sharing_s;
    let spawn_sharing =
        |threads: usize, tp: usize| sharing_command(&a, &exe, threads, tp, cores, secs);
    let profile = profile_cpu(
        &arch,
        &opts,
        cores,
        &spawn,
        &spawn_sharing,
        &mut |msg| {
            bar.inc(1);
            bar.set_message(msg.to_string());
        },
        &today_utc(),
    )?;
    bar.finish_and_clear();
    let text = profile.to_toml_string();
    write_profile(&a, &arch, cores, text)?;
    Ok(ExitCode::SUCCESS)
}

/// The points a CPU profile of `arch` with `opts` on `cores` cores measures,
/// for its progress bar: every level's grid at each TP degree, the
/// transfers, the all-reduces, and the host-sharing windows (with the rank
/// groups').
#[cfg(feature = "exec")]
fn progress_points(arch: &ModelArch, opts: &ProfileOptions, cores: usize) -> usize {
    let plan = Plan::for_model(arch, opts.quick);
    let levels: usize = (cpu_levels(cores).into_iter())
        .map(|t| plan.points_per_level(t == cores))
        .sum();
    let sharing = 2
        + sharing_demands(cores).len()
        + one_thread_demands(cores).len()
        + (sharing_groups(cores, &opts.tp).into_iter())
            .map(|t| 1 + group_windows(cores, t).len())
            .sum::<usize>();
    opts.tp.len() * levels
        + plan.transfer_bytes.len()
        + (opts.tp.len() - 1) * plan.all_reduce_bytes.len()
        + usize::from(opts.host_sharing_s > 0.0) * sharing
}

/// The TP degrees of `--tp`, ascending and with 1 (TP 1 rows are the
/// tables' base), each one the model's LLM splits into on `kind`.
///
/// Errors (exit 2): a degree 0, one that does not split the heads, or TP > 1
/// on a device other than cpu.
#[cfg(feature = "exec")]
fn check_tp(tp: &[usize], arch: &ModelArch, kind: DeviceKind) -> Result<Vec<usize>, BadInput> {
    let allowed = arch.llm.executor_tp();
    let mut out: Vec<usize> = tp.iter().copied().chain([1]).collect();
    out.sort_unstable();
    out.dedup();
    if let Some(bad) = out.iter().find(|t| !allowed.contains(t)) {
        return Err(BadInput(format!(
            "--tp {bad}: model {} splits into TP {allowed:?} only (its LLM's heads, KV heads and MLP width)",
            arch.name
        )));
    }
    if out.len() > 1 && kind != DeviceKind::Cpu {
        return Err(BadInput(
            "--tp: degrees above 1 are measured on --device cpu only (rank processes with a loopback all-reduce)".into(),
        ));
    }
    Ok(out)
}

/// Seconds of each host-sharing window: `--host-sharing-secs`, 0 with
/// `--no-host-sharing` or on cuda, else 3 (0 with `--quick`).
///
/// Errors (exit 2): a value that is not finite or not in 0 ..= 600.
#[cfg(feature = "exec")]
fn host_sharing_secs(a: &ProfileArgs, kind: DeviceKind) -> Result<f64, BadInput> {
    if let Some(s) = a.host_sharing_secs {
        if !(s.is_finite() && (0.0..=600.0).contains(&s)) {
            return Err(BadInput(format!(
                "--host-sharing-secs {s}: must be a number of seconds in 0 ..= 600 (0 leaves the table out)"
            )));
        }
    }
    if a.no_host_sharing || kind != DeviceKind::Cpu {
        return Ok(0.0);
    }
    Ok(a.host_sharing_secs
        .unwrap_or(if a.quick { 0.0 } else { 3.0 }))
}

/// Refuse a model whose f32 weights exceed 80 % of the available memory.
#[cfg(feature = "exec")]
fn check_cpu_memory(arch: &ModelArch) -> Result<(), BadInput> {
    let need = f32_weight_bytes(arch);
    if let Some(avail) = available_memory() {
        if need > 0.8 * avail {
            return Err(BadInput(format!(
                "--model {}: its f32 weights need {:.1} GB, more than this machine's {:.1} GB available; use a tiny-* preset on CPU or --device cuda",
                arch.name,
                need / 1e9,
                avail / 1e9
            )));
        }
    }
    Ok(())
}

/// The progress bar of `total` points (hidden when stderr is not a terminal).
#[cfg(feature = "exec")]
fn progress_bar(total: u64) -> ProgressBar {
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::new(total)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar
}

/// The command measuring one level of `threads` CPU threads (a child `easerve profile`).
#[cfg(feature = "exec")]
fn level_command(
    a: &ProfileArgs,
    exe: &std::path::Path,
    threads: usize,
    cores: usize,
    tp: usize,
) -> Command {
    let mut c = Command::new(exe);
    c.args(["profile", "--model", &a.model, "--device", "cpu"])
        .args(["--repetitions", &a.repetitions.to_string()])
        .args(["--warmup", &a.warmup.to_string()])
        .args(["--seed", &a.seed.to_string()])
        .args(["--level-threads", &threads.to_string()])
        .args(["--cores", &cores.to_string()])
        .args(["--level-tp", &tp.to_string()]);
    if a.quick {
        c.arg("--quick");
    }
    let per_rank = (threads / tp.max(1)).max(1);
    c.env("MATMUL_NUM_THREADS", per_rank.to_string())
        .env("RAYON_NUM_THREADS", per_rank.to_string());
    c
}

/// The command of one host-sharing process on `threads` threads (a TP
/// `tp` rank group's rank 0 when `tp` > 1) timing its passes for `secs`
/// seconds (a child `easerve profile`).
#[cfg(feature = "exec")]
fn sharing_command(
    a: &ProfileArgs,
    exe: &std::path::Path,
    threads: usize,
    tp: usize,
    cores: usize,
    secs: f64,
) -> Command {
    let mut c = level_command(a, exe, threads, cores, tp);
    c.arg("--level-sharing")
        .args(["--host-sharing-secs", &secs.to_string()]);
    c
}

/// Write the profile to `-o`, or print it.
#[cfg(feature = "exec")]
fn write_profile(
    a: &ProfileArgs,
    arch: &ModelArch,
    cores: usize,
    text: String,
) -> anyhow::Result<()> {
    match &a.output {
        Some(out) => {
            std::fs::write(out, text)
                .map_err(|e| BadInput(format!("-o {}: cannot write: {e}", out.display())))?;
            eprintln!(
                "wrote {} ({} on {} cores, {} timed runs per point)",
                out.display(),
                arch.name,
                cores,
                a.repetitions
            );
        }
        None => say!("{text}"),
    }
    Ok(())
}

#[cfg(all(feature = "exec", not(feature = "cuda")))]
fn cuda_profile(_: &ModelArch, _: &ProfileOptions, _: &ProfileArgs) -> anyhow::Result<ExitCode> {
    unreachable!("check_device rejects cuda in builds without the feature")
}

#[cfg(feature = "cuda")]
fn cuda_profile(
    arch: &ModelArch,
    opts: &ProfileOptions,
    a: &ProfileArgs,
) -> anyhow::Result<ExitCode> {
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::new_spinner()
    } else {
        ProgressBar::hidden()
    };
    let text = easerve_worker::cuda::profile_cuda(arch, opts, &today_utc(), &mut |msg| {
        bar.inc(1);
        bar.set_message(msg.to_string());
    })
    .map_err(anyhow::Error::msg)?
    .to_toml_string();
    bar.finish_and_clear();
    match &a.output {
        Some(out) => std::fs::write(out, text)
            .map_err(|e| BadInput(format!("-o {}: cannot write: {e}", out.display())))?,
        None => say!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}
