//! `easerve profile`'s `[host_sharing]` table: how much slower the
//! executor's passes run on a CPU host while more threads are busy than it
//! has cores ([`easerve_calib::HostSharing`]).
//!
//! The representative pass: one prefill of the plan's
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
//!
//! **One-thread rows** (the table's `one_thread_rows`): at each demand `D`
//! of [`one_thread_demands`], `D` processes on one thread started together;
//! the row's slowdown is the mean over them of their median pass time over
//! the pass alone on one thread (at least 1). They hold what a deployment
//! whose passes all run on one thread meets, interference below the core
//! count included.
//!
//! **Rank groups** (the table's `tp_rows`): for each TP degree `k` > 1 of
//! the profile's `--tp` that fits beside a whole-host process within the
//! highest demand ([`sharing_groups`]), a TP `k` worker's group — this
//! process rank 0, ranks `1..k` as `easerve worker` processes, one thread
//! each, the executor's loopback all-reduce — loops the pass through its
//! ranks: one decode step of the plan's smallest batch at its middle
//! context, the shortest step, whose all-reduces weigh the most. Alone, then at each demand `D` ≥ `C + k`: the group, one
//! `C`-thread process and `D − C − k` one-thread processes
//! ([`group_windows`]). The row's slowdown is the group's median pass time
//! over its time alone (at least 1). The ranks meet at every all-reduce, so
//! a step goes at the pace of the rank the OS left waiting, which the
//! independent processes of the main rows do not show.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Instant;

use burn::tensor::{Distribution, Tensor};
use easerve_calib::HostSharing;
use easerve_model::nn::MultimodalModel;
use easerve_model::ModelArch;

use crate::profiler::{random_caches, LevelMessage, Plan, ProfileOptions, ProfilerError};

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

/// The demands of the one-thread rows on a host of `cores` cores: every
/// count from 2 up to the cores, then those of [`sharing_demands`] above
/// (2..7 on 2 cores).
pub fn one_thread_demands(cores: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (2..=cores.max(1)).collect();
    v.extend(
        sharing_demands(cores)
            .into_iter()
            .filter(|&d| d > cores.max(1)),
    );
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

/// The entry point of a host-sharing process on `threads` threads, a TP
/// `tp` rank group when `tp` > 1 (this process rank 0 of `tp` rank
/// processes on `threads / tp` threads each, at least 1, started as the
/// executor starts them): build the model, run the pass once, print
/// `Point("ready")`, wait for a line on stdin, loop the pass for `window_s`
/// seconds and print `Passes` with its pass times in seconds (first and
/// last dropped when there are more than two).
///
/// Errors: threads that cannot be bounded, a model that cannot be built or
/// split, ranks that cannot start or exchange.
pub fn run_sharing_process(
    arch: &ModelArch,
    opts: &ProfileOptions,
    threads: usize,
    tp: usize,
    window_s: f64,
) -> Result<(), ProfilerError> {
    easerve_exec::device::limit_cpu_threads((threads / tp.max(1)).max(1))?;
    let plan = Plan::for_model(arch, opts.quick);
    let device = Default::default();
    <B as burn::tensor::backend::Backend>::seed(&device, opts.seed);
    let model = MultimodalModel::<B>::from_arch(arch, &device)?;
    let res = match tp {
        0 | 1 => time_window(&mut independent_pass(arch, &plan, &model), window_s),
        _ => group_window(arch, &plan, opts, model, tp, threads, window_s),
    };
    let mut out = std::io::stdout().lock();
    let msg = match &res {
        Ok(times) => LevelMessage::Passes(times.clone()),
        Err(e) => LevelMessage::Failed(e.to_string()),
    };
    let _ = writeln!(out, "{}", serde_json::to_string(&msg).unwrap_or_default());
    let _ = out.flush();
    res.map(|_| ())
}

/// The representative pass of a one-rank process: its time in seconds.
fn independent_pass<'a>(
    arch: &ModelArch,
    plan: &Plan,
    model: &'a MultimodalModel<B>,
) -> impl FnMut() -> Result<f64, ProfilerError> + 'a {
    let (tokens, b, context) = pass_shape(plan);
    let device = Default::default();
    let d = model.lm.d_model();
    let per = (context / b).max(1);
    let mut caches = random_caches::<B>(arch, b, per, 1, &device);
    let prompt: Tensor<B, 2> = Tensor::random([tokens, d], Distribution::Normal(0.0, 1.0), &device);
    let step: Tensor<B, 2> = Tensor::random([b, d], Distribution::Normal(0.0, 1.0), &device);
    move || {
        let t0 = Instant::now();
        drop(model.lm.prefill(std::slice::from_ref(&prompt)));
        for c in caches.iter_mut() {
            c.len = per;
        }
        drop(model.lm.decode(step.clone(), &mut caches));
        Ok(t0.elapsed().as_secs_f64())
    }
}

/// The shape of a rank group's step, from the plan: `(decode batch,
/// context tokens)`, the smallest batch at the middle context, where a step
/// is the shortest and its all-reduces weigh the most.
fn group_shape(plan: &Plan) -> (usize, usize) {
    let b = *plan.decode_batch.first().unwrap_or(&1);
    (b, plan.decode_context[plan.decode_context.len() / 2])
}

/// The window of a TP `tp` rank group: the pass is one decode step of the
/// group's shape through the ranks, on caches landed on the ranks before
/// it (untimed, with one untimed step that waits for the ranks to have
/// read them).
fn group_window(
    arch: &ModelArch,
    plan: &Plan,
    opts: &ProfileOptions,
    model: MultimodalModel<B>,
    tp: usize,
    threads: usize,
    window_s: f64,
) -> Result<Vec<f64>, ProfilerError> {
    let rank_err = |e: crate::process::WorkerError| ProfilerError::Level(e.to_string());
    let rank_threads = (threads / tp).max(1);
    let wopts = crate::profiler::rank0_options(
        arch,
        opts,
        easerve_exec::wire::Role::Prefill,
        tp,
        rank_threads,
    );
    let lm = (model.lm.shard(0, tp)).map_err(|e| ProfilerError::Level(e.to_string()))?;
    drop(model);
    let ranks = crate::tp::Ranks::start(&wopts, arch.llm.kv_heads as usize).map_err(rank_err)?;
    let (b, context) = group_shape(plan);
    let device = Default::default();
    let per = (context / b).max(1);
    let whole = random_caches::<B>(arch, b, per.saturating_sub(1).max(1), 1, &device);
    let ids: Vec<easerve_sched::RequestId> = (0..b as u64).collect();
    let step: Tensor<B, 2> =
        Tensor::random([b, lm.d_model()], Distribution::Normal(0.0, 1.0), &device);
    let mut pass = || -> Result<f64, ProfilerError> {
        let mut caches = (ids.iter().zip(&whole))
            .map(|(&id, w)| ranks.land_kv(id, w.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(rank_err)?;
        (ranks.decode(&lm, &ids, step.clone(), &mut caches)).map_err(rank_err)?;
        let t0 = Instant::now();
        (ranks.decode(&lm, &ids, step.clone(), &mut caches)).map_err(rank_err)?;
        Ok(t0.elapsed().as_secs_f64())
    };
    time_window(&mut pass, window_s)
}

/// Run `pass` once, print `Point("ready")`, wait for a line on stdin, then
/// loop it for `window_s` seconds (at least 3 passes): the pass times, the
/// first and last dropped when there are more than two.
fn time_window(
    pass: &mut dyn FnMut() -> Result<f64, ProfilerError>,
    window_s: f64,
) -> Result<Vec<f64>, ProfilerError> {
    pass()?;
    {
        let mut out = std::io::stdout().lock();
        let ready = LevelMessage::Point("ready".into());
        let _ = writeln!(out, "{}", serde_json::to_string(&ready).unwrap_or_default());
        let _ = out.flush();
    }
    let mut go = String::new();
    let _ = std::io::stdin().lock().read_line(&mut go);
    let start = Instant::now();
    let mut times = Vec::new();
    while start.elapsed().as_secs_f64() < window_s || times.len() < 3 {
        times.push(pass()?);
    }
    if times.len() > 2 {
        times.pop();
        times.remove(0);
    }
    Ok(times)
}

/// Run the processes of one window, one per entry `(threads, tp)` of
/// `procs` (started by `spawn(threads, tp)`, each running
/// [`run_sharing_process`]), together: their pass times, in the order of
/// `procs`.
///
/// Errors: a process that cannot start, fails, or prints no pass times.
fn run_window(
    procs: &[(usize, usize)],
    spawn: &dyn Fn(usize, usize) -> Command,
) -> Result<Vec<Vec<f64>>, ProfilerError> {
    let fail = |m: String| ProfilerError::Level(format!("host sharing: {m}"));
    let mut children = Vec::new();
    for &(t, tp) in procs {
        let mut cmd = spawn(t, tp);
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

/// The rank-group degrees measured beside the main curve: the profile's
/// TP degrees above 1 whose group fits a row, `cores + tp` ≤ the highest
/// demand (module doc).
pub fn sharing_groups(cores: usize, tps: &[usize]) -> Vec<usize> {
    let top = sharing_demands(cores).last().copied().unwrap_or(cores);
    (tps.iter().copied())
        .filter(|&t| t > 1 && cores + t <= top)
        .collect()
}

/// The windows of the rank-group rows of TP `tp` on `cores` cores: the
/// demands `D` ≥ `cores + tp` of [`sharing_demands`], each one
/// `cores`-thread process, the group (`tp` ranks of one thread) and
/// `D − cores − tp` one-thread processes, as `(threads, tp)` entries with
/// the group first.
pub fn group_windows(cores: usize, tp: usize) -> Vec<(usize, Vec<(usize, usize)>)> {
    (sharing_demands(cores).into_iter())
        .filter(|&d| d >= cores + tp)
        .map(|d| {
            let procs = [(tp, tp), (cores, 1)]
                .into_iter()
                .chain(std::iter::repeat_n((1, 1), d - cores - tp))
                .collect();
            (d, procs)
        })
        .collect()
}

/// Measure the host-sharing curve of a host of `cores` cores with windows
/// of `window_s` seconds (module doc), and the rank-group rows of each
/// degree of [`sharing_groups`], the processes started by
/// `spawn(threads, tp)`; `progress` after each window.
///
/// Errors: a process that fails; a curve [`HostSharing::new`] refuses.
pub fn measure_host_sharing(
    arch: &ModelArch,
    opts: &ProfileOptions,
    cores: usize,
    window_s: f64,
    spawn: &dyn Fn(usize, usize) -> Command,
    progress: &mut dyn FnMut(&str),
) -> Result<HostSharing, ProfilerError> {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load1 = load.split_whitespace().next().unwrap_or("?").to_string();
    let med = |ts: &[f64]| easerve_calib::refine::median(&mut ts.to_vec());
    let alone_full = med(&run_window(&[(cores, 1)], spawn)?[0]);
    progress(&format!("host sharing: alone on {cores} threads"));
    let alone_one = med(&run_window(&[(1, 1)], spawn)?[0]);
    progress("host sharing: alone on 1 thread");
    let mut rows = Vec::new();
    for d in sharing_demands(cores) {
        let procs: Vec<(usize, usize)> = std::iter::once((cores, 1))
            .chain(std::iter::repeat_n((1, 1), d - cores))
            .collect();
        let passes = run_window(&procs, spawn)?;
        let weighted: f64 = (procs.iter().zip(&passes))
            .map(|(&(t, _), ts)| {
                let alone = if t == cores { alone_full } else { alone_one };
                t as f64 * med(ts) / alone
            })
            .sum();
        rows.push((d as f64, (weighted / d as f64).max(1.0)));
        progress(&format!("host sharing: {d} threads busy"));
    }
    let mut one_thread_rows = Vec::new();
    for d in one_thread_demands(cores) {
        let passes = run_window(&vec![(1, 1); d], spawn)?;
        let mean = passes.iter().map(|ts| med(ts) / alone_one).sum::<f64>() / d as f64;
        one_thread_rows.push((d as f64, mean.max(1.0)));
        progress(&format!("host sharing: {d} one-thread processes busy"));
    }
    let mut tp_rows = Vec::new();
    let mut alone_groups = Vec::new();
    for tp in sharing_groups(cores, &opts.tp) {
        let alone = med(&run_window(&[(tp, tp)], spawn)?[0]);
        progress(&format!("host sharing: a TP {tp} rank group alone"));
        alone_groups.push(format!("{alone:.4} s at TP {tp}"));
        for (d, procs) in group_windows(cores, tp) {
            let passes = run_window(&procs, spawn)?;
            tp_rows.push((tp as u32, d as f64, (med(&passes[0]) / alone).max(1.0)));
            progress(&format!(
                "host sharing: a TP {tp} rank group, {d} threads busy"
            ));
        }
    }
    let plan = Plan::for_model(arch, opts.quick);
    let (tokens, b, context) = pass_shape(&plan);
    let (gb, gc) = group_shape(&plan);
    let groups = match alone_groups.is_empty() {
        true => String::new(),
        false => format!(
            "; rank-group rows (tp_rows): a TP k decode worker's k rank processes of one thread each (the executor's rank processes and loopback all-reduce) among one {cores}-thread process and D − {cores} − k 1-thread processes, its pass one decode step of {gb} sequence(s) at {gc} context tokens, slowdown = the group's median step time over the group alone ({})",
            alone_groups.join(", ")
        ),
    };
    let method = format!(
        "easerve profile: pass = one prefill of {tokens} tokens + one decode step of {b} sequences at {context} context tokens (the LM's executor path, threads bounded, not pinned); a row at demand D = one {cores}-thread process and D − {cores} 1-thread processes started together, each timing its passes for {window_s} s (first and last dropped); slowdown = thread-weighted mean over the processes of median pass time / the pass alone on as many threads ({alone_full:.4} s on {cores}, {alone_one:.4} s on 1), at least 1; one-thread rows (one_thread_rows): D 1-thread processes, slowdown = their mean median pass time / the pass alone on 1 thread, at least 1{groups}; host load average (1 min) at the start {load1}"
    );
    let curve = HostSharing::new(u32::try_from(cores).unwrap_or(u32::MAX), method, rows)
        .map_err(|(_, m)| ProfilerError::Level(format!("host sharing: {m}")))?;
    curve
        .with_tp_rows(&tp_rows)
        .and_then(|c| c.with_one_thread_rows(one_thread_rows))
        .map_err(|(_, m)| ProfilerError::Level(format!("host sharing: {m}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_thread_demands_start_at_two_processes() {
        assert_eq!(one_thread_demands(2), vec![2, 3, 4, 5, 6, 7]);
        assert_eq!(one_thread_demands(1), vec![2, 3, 4]);
        assert_eq!(one_thread_demands(4), vec![2, 3, 4, 6, 8, 10, 12, 14]);
    }

    #[test]
    fn demands_go_from_the_cores_to_three_and_a_half_times_them() {
        assert_eq!(sharing_demands(2), vec![2, 3, 4, 5, 6, 7]);
        assert_eq!(sharing_demands(1), vec![1, 2, 3, 4]);
        assert_eq!(sharing_demands(4), vec![4, 6, 8, 10, 12, 14]);
    }

    #[test]
    fn rank_groups_are_measured_where_they_fit_beside_a_whole_host_process() {
        assert_eq!(sharing_groups(2, &[1, 2, 4]), vec![2, 4]);
        assert_eq!(sharing_groups(2, &[1]), Vec::<usize>::new());
        assert_eq!(sharing_groups(1, &[1, 2, 4]), vec![2]);
        let w = group_windows(2, 2);
        assert_eq!(w.iter().map(|x| x.0).collect::<Vec<_>>(), vec![4, 5, 6, 7]);
        assert_eq!(w[0].1, vec![(2, 2), (2, 1)]);
        assert_eq!(w[2].1, vec![(2, 2), (2, 1), (1, 1), (1, 1)]);
        // every window's threads add up to its demand
        for (d, procs) in group_windows(2, 4).into_iter().chain(w) {
            assert_eq!(procs.iter().map(|p| p.0).sum::<usize>(), d);
        }
    }
}
