//! `easerve profile`'s `[host_sharing]` table: how much slower the
//! executor's passes run on a CPU host while more threads are busy than it
//! has cores ([`easerve_calib::HostSharing`]).
//!
//! The representative pass ([`SharingPass`]): one prefill of the plan's
//! middle prompt length, then one decode step of its largest batch at its
//! second-smallest context, through the model's LM as the executor's
//! prefill and decode workers run them. Every process is a level process
//! of the profile (the caller's `spawn`, as [`crate::profiler::profile_cpu`]
//! starts its levels) with its threads bounded and not pinned (the OS
//! places them, as for the executor's sharing workers).
//!
//! A row at demand `D`: one process on `C` threads (the whole host, the
//! profile's level 1.0) and `D − C` processes on one thread, started
//! together; each loops the pass for `window_s` seconds of wall time and
//! reports its pass times, the first and last dropped (the others may not
//! have been busy then). Alone: one `C`-thread process, and one 1-thread
//! process. The row's slowdown is the thread-weighted mean over the
//! processes of their median pass time over the same pass alone on as
//! many threads (at least 1: a value below is noise and is set to 1).
//! Demands: `C · {1, 1.5, 2, 2.5, 3, 3.5}`, rounded and deduplicated
//! (2..7 threads on 2 cores).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Instant;

use burn::tensor::{Distribution, Tensor};
use easerve_calib::HostSharing;
use easerve_model::nn::{KvCache, MultimodalModel};
use easerve_model::ModelArch;

use crate::profiler::{LevelMessage, Plan, ProfileOptions, ProfilerError};

type B = burn::backend::NdArray;

/// The demands of the rows on a host of `cores` cores (module doc).
pub fn sharing_demands(cores: usize) -> Vec<usize> {
    let mut v: Vec<usize> = [1.0, 1.5, 2.0, 2.5, 3.0, 3.5]
        .iter()
        .map(|m| ((cores.max(1) as f64) * m).round() as usize)
        .collect();
    v.dedup();
    v
}

/// The representative pass's shape, from the plan: `(prompt tokens,
/// decode batch, decode context tokens)`.
fn pass_shape(plan: &Plan) -> (usize, usize, usize) {
    let tokens = plan.prefill_tokens[plan.prefill_tokens.len() / 2];
    let batch = *plan.decode_batch.last().unwrap_or(&1);
    let context = plan.decode_context[1.min(plan.decode_context.len() - 1)];
    (tokens, batch, context)
}

/// The entry point of a host-sharing process on `threads` threads: build
/// the model, run the pass once, print `Point("ready")`, wait for a line on
/// stdin, loop the pass for `window_s` seconds and print `Passes` with its
/// pass times in seconds (first and last dropped when there are more than
/// two).
///
/// Errors: threads that cannot be bounded, a model that cannot be built.
pub fn run_sharing_process(
    arch: &ModelArch,
    opts: &ProfileOptions,
    threads: usize,
    window_s: f64,
) -> Result<(), ProfilerError> {
    easerve_exec::device::limit_cpu_threads(threads)?;
    let plan = Plan::for_model(arch, opts.quick);
    let (tokens, b, context) = pass_shape(&plan);
    let device = Default::default();
    <B as burn::tensor::backend::Backend>::seed(&device, opts.seed);
    let model = MultimodalModel::<B>::from_arch(arch, &device)?;
    let l = &arch.llm;
    let d = model.lm.d_model();
    let per = (context / b).max(1);
    let kv = || -> Tensor<B, 3> {
        Tensor::random(
            [l.kv_heads as usize, per, l.head_dim as usize],
            Distribution::Normal(0.0, 1.0),
            &device,
        )
    };
    let mut caches: Vec<KvCache<B>> = (0..b)
        .map(|_| {
            let k = (0..l.layers).map(|_| kv()).collect();
            let v = (0..l.layers).map(|_| kv()).collect();
            KvCache::from_positions(k, v, 1)
        })
        .collect();
    let prompt: Tensor<B, 2> = Tensor::random([tokens, d], Distribution::Normal(0.0, 1.0), &device);
    let step: Tensor<B, 2> = Tensor::random([b, d], Distribution::Normal(0.0, 1.0), &device);
    let mut pass = || {
        let t0 = Instant::now();
        drop(model.lm.prefill(std::slice::from_ref(&prompt)));
        for c in caches.iter_mut() {
            c.len = per;
        }
        drop(model.lm.decode(step.clone(), &mut caches));
        t0.elapsed().as_secs_f64()
    };
    pass();
    let mut out = std::io::stdout().lock();
    let mut emit = |m: &LevelMessage| {
        let _ = writeln!(out, "{}", serde_json::to_string(m).unwrap_or_default());
        let _ = out.flush();
    };
    emit(&LevelMessage::Point("ready".into()));
    let mut go = String::new();
    let _ = std::io::stdin().lock().read_line(&mut go);
    let start = Instant::now();
    let mut times = Vec::new();
    while start.elapsed().as_secs_f64() < window_s || times.len() < 3 {
        times.push(pass());
    }
    if times.len() > 2 {
        times.pop();
        times.remove(0);
    }
    emit(&LevelMessage::Passes(times));
    Ok(())
}

/// Run the processes of one window, one per entry of `threads` (started by
/// `spawn(threads)`, each running [`run_sharing_process`]), together: their
/// pass times, in the order of `threads`.
///
/// Errors: a process that cannot start, fails, or prints no pass times.
fn run_window(
    threads: &[usize],
    spawn: &dyn Fn(usize) -> Command,
) -> Result<Vec<Vec<f64>>, ProfilerError> {
    let fail = |m: String| ProfilerError::Level(format!("host sharing: {m}"));
    let mut children = Vec::new();
    for &t in threads {
        let mut cmd = spawn(t);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd
            .spawn()
            .map_err(|e| fail(format!("cannot start a {t}-thread process: {e}")))?;
        let out = child
            .stdout
            .take()
            .ok_or_else(|| fail("no stdout".into()))?;
        children.push((child, BufReader::new(out).lines()));
    }
    let read = |lines: &mut std::io::Lines<BufReader<std::process::ChildStdout>>| loop {
        match lines.next() {
            None => return Err(fail("a process exited before its results".into())),
            Some(Err(e)) => return Err(fail(format!("reading its output: {e}"))),
            Some(Ok(l)) => match serde_json::from_str::<LevelMessage>(&l) {
                Ok(LevelMessage::Failed(e)) => return Err(fail(e)),
                Ok(m) => return Ok(m),
                Err(_) => {}
            },
        }
    };
    for (_, lines) in children.iter_mut() {
        read(lines)?;
    }
    for (child, _) in children.iter_mut() {
        if let Some(stdin) = child.stdin.as_mut() {
            writeln!(stdin, "go").map_err(|e| fail(format!("starting a process: {e}")))?;
        }
    }
    let mut passes = Vec::new();
    for (mut child, mut lines) in children {
        let m = read(&mut lines)?;
        let _ = child.wait();
        match m {
            LevelMessage::Passes(ts) if !ts.is_empty() => passes.push(ts),
            _ => return Err(fail("a process printed no pass times".into())),
        }
    }
    Ok(passes)
}

/// Measure the host-sharing curve of a host of `cores` cores with windows
/// of `window_s` seconds (module doc), the processes started by
/// `spawn(threads)`; `progress` after each window.
///
/// Errors: a process that fails; a curve [`HostSharing::new`] refuses.
pub fn measure_host_sharing(
    arch: &ModelArch,
    opts: &ProfileOptions,
    cores: usize,
    window_s: f64,
    spawn: &dyn Fn(usize) -> Command,
    progress: &mut dyn FnMut(&str),
) -> Result<HostSharing, ProfilerError> {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load1 = load.split_whitespace().next().unwrap_or("?").to_string();
    let med = |ts: &[f64]| easerve_calib::refine::median(&mut ts.to_vec());
    let alone_full = med(&run_window(&[cores], spawn)?[0]);
    progress(&format!("host sharing: alone on {cores} threads"));
    let alone_one = med(&run_window(&[1], spawn)?[0]);
    progress("host sharing: alone on 1 thread");
    let mut rows = Vec::new();
    for d in sharing_demands(cores) {
        let threads: Vec<usize> = std::iter::once(cores)
            .chain(std::iter::repeat_n(1, d - cores))
            .collect();
        let passes = run_window(&threads, spawn)?;
        let weighted: f64 = (threads.iter().zip(&passes))
            .map(|(&t, ts)| {
                let alone = if t == cores { alone_full } else { alone_one };
                t as f64 * med(ts) / alone
            })
            .sum();
        rows.push((d as f64, (weighted / d as f64).max(1.0)));
        progress(&format!("host sharing: {d} threads busy"));
    }
    let plan = Plan::for_model(arch, opts.quick);
    let (tokens, b, context) = pass_shape(&plan);
    let method = format!(
        "easerve profile: pass = one prefill of {tokens} tokens + one decode step of {b} sequences at {context} context tokens (the LM's executor path, threads bounded, not pinned); a row at demand D = one {cores}-thread process and D − {cores} 1-thread processes started together, each timing its passes for {window_s} s (first and last dropped); slowdown = thread-weighted mean over the processes of median pass time / the pass alone on as many threads ({alone_full:.4} s on {cores}, {alone_one:.4} s on 1), at least 1; host load average (1 min) at the start {load1}"
    );
    HostSharing::new(u32::try_from(cores).unwrap_or(u32::MAX), method, rows)
        .map_err(|(_, m)| ProfilerError::Level(format!("host sharing: {m}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demands_go_from_the_cores_to_three_and_a_half_times_them() {
        assert_eq!(sharing_demands(2), vec![2, 3, 4, 5, 6, 7]);
        assert_eq!(sharing_demands(1), vec![1, 2, 3, 4]);
        assert_eq!(sharing_demands(4), vec![4, 6, 8, 10, 12, 14]);
    }
}
