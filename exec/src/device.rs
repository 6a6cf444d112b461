//! Backend selection and per-process CPU thread bounds.
//!
//! On CPU, burn's NdArray backend computes with two thread pools: rayon's (burn-ndarray
//! runs its parallel loops in rayon's *current* pool) and matrixmultiply's GEMM threads
//! (`MATMUL_NUM_THREADS`, read once per process, capped at 4). A worker is therefore
//! bounded per **process**: [`bound_cpu_threads`] sizes both pools before the first
//! tensor op and, on Linux, pins the process to `threads` cores
//! (`sched_setaffinity`), because a batched matmul runs matrixmultiply's threads
//! inside rayon's and the pool sizes alone are a soft bound. The "SM level" of a CPU
//! worker is its thread share `threads / cores`; levels are measured in separate
//! processes (see the profiler, `easerve_worker::profiler`, and [`cpu_levels`]).

use std::str::FromStr;

/// The device a worker computes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// burn's NdArray backend on the host CPU.
    Cpu,
    /// burn's CUDA backend (cargo feature `cuda`), GPU 0.
    Cuda,
}

impl DeviceKind {
    /// `"cpu"` or `"cuda"`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        }
    }
}

impl FromStr for DeviceKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(DeviceKind::Cpu),
            "cuda" => Ok(DeviceKind::Cuda),
            _ => Err(format!("unknown device `{s}`: expected cpu or cuda")),
        }
    }
}

/// Why a device cannot be used (the CLI exits 2 with this message).
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("{0}")]
pub struct DeviceError(pub String);

/// Cores this process may use (`std::thread::available_parallelism`, at least 1).
pub fn cpu_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Thread counts of the CPU SM levels for `cores` cores: `round(cores * f)` for
/// `f` in 0.2, 0.4, 0.6, 0.8, 1.0 (the simulator's five levels), at least 1,
/// duplicates removed (2 cores -> 1, 2; 16 cores -> 3, 6, 10, 13, 16).
pub fn cpu_levels(cores: usize) -> Vec<usize> {
    let mut v: Vec<usize> = [0.2, 0.4, 0.6, 0.8, 1.0]
        .iter()
        .map(|f| ((cores.max(1) as f64 * f).round() as usize).max(1))
        .collect();
    v.dedup();
    v
}

/// Bound this process's compute to `threads` CPU threads: rayon's global pool,
/// matrixmultiply's GEMM threads and (Linux) the process's CPU affinity, to the
/// first `threads` cores it may run on. Call once, before any tensor operation and
/// before other threads start (it sets an environment variable).
///
/// Errors: `threads` 0, or the global pool already built with another size.
pub fn bound_cpu_threads(threads: usize) -> Result<(), DeviceError> {
    if threads == 0 {
        return Err(DeviceError("--threads must be at least 1".into()));
    }
    pin_to_cores(threads);
    limit_cpu_threads(threads)
}

/// Like [`bound_cpu_threads`] without pinning: the thread counts are bounded
/// and the OS places the threads (workers of one run share the host's cores).
///
/// Errors: `threads` 0, or the global pool already built with another size.
pub fn limit_cpu_threads(threads: usize) -> Result<(), DeviceError> {
    if threads == 0 {
        return Err(DeviceError("--threads must be at least 1".into()));
    }
    std::env::set_var("MATMUL_NUM_THREADS", threads.to_string());
    match rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
    {
        Ok(()) => Ok(()),
        Err(_) if rayon::current_num_threads() == threads => Ok(()),
        Err(e) => Err(DeviceError(format!(
            "cannot bound CPU threads to {threads}: {e} (rayon already runs {} threads)",
            rayon::current_num_threads()
        ))),
    }
}

/// Pin this process to the first `n` CPUs of its current affinity mask (best effort:
/// a failure leaves the pool-size bound only).
fn pin_to_cores(n: usize) {
    let _ = pin_process(&core_set(&allowed_cores(), n, CoreSide::Low));
}

/// Which cores of the host a CPU worker's passes run on. An encode worker and
/// the prefill worker co-located with it split one "GPU" (the host's cores) by
/// SM share: the encode worker's passes run on the lowest cores, the local
/// prefill worker's on the highest, the CPU analogue of an SM partition: the
/// sets are disjoint when the two rounded core counts sum to at most the
/// host's cores. Other workers leave
/// placement to the OS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CoreSide {
    /// No pinning per pass.
    #[default]
    Any,
    /// The lowest `n` allowed cores.
    Low,
    /// The highest `n` allowed cores.
    High,
}

impl CoreSide {
    /// `"any"`, `"low"` or `"high"` (the worker's `--cores` flag).
    pub fn as_str(self) -> &'static str {
        match self {
            CoreSide::Any => "any",
            CoreSide::Low => "low",
            CoreSide::High => "high",
        }
    }
}

impl FromStr for CoreSide {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "any" => Ok(CoreSide::Any),
            "low" => Ok(CoreSide::Low),
            "high" => Ok(CoreSide::High),
            _ => Err(format!(
                "unknown core side `{s}`: expected any, low or high"
            )),
        }
    }
}

/// The cores a pass on `n` threads runs on, out of `allowed` (ascending CPU
/// ids): the lowest `n` for [`CoreSide::Low`], the highest `n` for
/// [`CoreSide::High`], all of them for [`CoreSide::Any`]; `n` is clamped to
/// `1..=allowed.len()`.
pub fn core_set(allowed: &[usize], n: usize, side: CoreSide) -> Vec<usize> {
    let n = n.clamp(1, allowed.len().max(1)).min(allowed.len());
    match side {
        CoreSide::Any => allowed.to_vec(),
        CoreSide::Low => allowed[..n].to_vec(),
        CoreSide::High => allowed[allowed.len() - n..].to_vec(),
    }
}

/// The CPUs this process may run on (its affinity mask at the time of the
/// call), ascending; `0..cpu_cores()` where the mask cannot be read.
pub fn allowed_cores() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    // SAFETY: plain libc call on a zeroed cpu_set_t owned by this frame.
    unsafe {
        let mut cur: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut cur) == 0 {
            return (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &cur))
                .collect();
        }
    }
    (0..cpu_cores()).collect()
}

/// Pin every thread of this process (rayon's, matrixmultiply's GEMM threads,
/// the compute loop) to `cpus`: Linux applies an affinity mask per thread, so
/// each of `/proc/self/task` is set. Threads started later inherit the mask of
/// the thread that starts them. A no-op off Linux.
///
/// Errors: `cpus` empty, or the kernel refused a thread's mask (the message
/// names the thread and the errno).
pub fn pin_process(cpus: &[usize]) -> Result<(), DeviceError> {
    pin_process_except(cpus, &[])
}

/// This thread's kernel id (Linux; 0 elsewhere), as [`pin_process_except`]
/// takes it.
pub fn thread_id() -> i32 {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid(2) has no arguments and cannot fail.
    unsafe {
        libc::gettid()
    }
    #[cfg(not(target_os = "linux"))]
    0
}

/// [`pin_process`] for every thread but those in `keep` (ids from
/// [`thread_id`]), whose masks stay as they are.
///
/// Errors: as [`pin_process`].
pub fn pin_process_except(cpus: &[usize], keep: &[i32]) -> Result<(), DeviceError> {
    if cpus.is_empty() {
        return Err(DeviceError("cannot pin a worker to no cores".into()));
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain libc calls on a zeroed cpu_set_t owned by this frame.
        let set = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &c in cpus {
                libc::CPU_SET(c, &mut set);
            }
            set
        };
        let tasks = std::fs::read_dir("/proc/self/task")
            .map_err(|e| DeviceError(format!("/proc/self/task: {e}")))?;
        for t in tasks.flatten() {
            let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if keep.contains(&tid) {
                continue;
            }
            // SAFETY: sched_setaffinity on a thread id of this process.
            let rc = unsafe {
                libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set)
            };
            if rc != 0 {
                let err = std::io::Error::last_os_error();
                // a thread that ended since the listing is not an error
                if err.raw_os_error() != Some(libc::ESRCH) {
                    return Err(DeviceError(format!(
                        "cannot pin thread {tid} to cores {cpus:?}: {err}"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// The CPU model name from `/proc/cpuinfo` (or "unknown CPU").
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// Check that `kind` can run here.
///
/// Errors: `cuda` in a build without the `cuda` feature, or without an NVIDIA
/// driver (`libcuda.so`) on this machine; each a one-line message saying what to do.
pub fn check_device(kind: DeviceKind) -> Result<(), DeviceError> {
    match kind {
        DeviceKind::Cpu => Ok(()),
        DeviceKind::Cuda => cuda_ready(),
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda_ready() -> Result<(), DeviceError> {
    Err(DeviceError(
        "--device cuda needs a build with the `cuda` feature: cargo build --release --features cuda".into(),
    ))
}

#[cfg(feature = "cuda")]
fn cuda_ready() -> Result<(), DeviceError> {
    // SAFETY: probes for the driver library with dlopen; no CUDA call is made.
    let present = unsafe { cudarc::driver::sys::is_culib_present() };
    if !present {
        return Err(DeviceError(
            "--device cuda: no NVIDIA driver found (libcuda.so could not be loaded); install the NVIDIA driver or use --device cpu".into(),
        ));
    }
    let count =
        cudarc::driver::result::init().and_then(|_| cudarc::driver::result::device::get_count());
    match count {
        Ok(n) if n > 0 => Ok(()),
        Ok(_) => Err(DeviceError(
            "--device cuda: the NVIDIA driver sees no GPU; use --device cpu".into(),
        )),
        Err(e) => Err(DeviceError(format!(
            "--device cuda: the CUDA driver failed to start ({e}); use --device cpu"
        ))),
    }
}

/// GPUs the CUDA driver shows this process (`cuDeviceGetCount`, after
/// `CUDA_VISIBLE_DEVICES`); 0 without the driver or in a build without the
/// `cuda` feature.
pub fn cuda_gpus() -> usize {
    #[cfg(feature = "cuda")]
    {
        // SAFETY: probes for the driver library with dlopen; no CUDA call is made.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return 0;
        }
        cudarc::driver::result::init()
            .and_then(|_| cudarc::driver::result::device::get_count())
            .map_or(0, |n| n.max(0) as usize)
    }
    #[cfg(not(feature = "cuda"))]
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_levels_are_at_most_five_distinct_thread_counts() {
        assert_eq!(cpu_levels(1), vec![1]);
        assert_eq!(cpu_levels(2), vec![1, 2]);
        assert_eq!(cpu_levels(16), vec![3, 6, 10, 13, 16]);
    }

    #[test]
    fn encode_and_local_prefill_shares_run_on_disjoint_cores() {
        let allowed: Vec<usize> = vec![0, 1, 2, 3, 6, 7, 8, 9];
        // shares 0.4 and 0.6 of 8 cores: 3 + 5 threads, disjoint
        let enc = core_set(&allowed, 3, CoreSide::Low);
        let pre = core_set(&allowed, 5, CoreSide::High);
        assert_eq!(enc, vec![0, 1, 2]);
        assert_eq!(pre, vec![3, 6, 7, 8, 9]);
        assert!(enc.iter().all(|c| !pre.contains(c)));
        // the 2-core machine at shares 0.5 / 0.5
        assert_eq!(core_set(&[0, 1], 1, CoreSide::Low), vec![0]);
        assert_eq!(core_set(&[0, 1], 1, CoreSide::High), vec![1]);
        // clamped to what is allowed; Any takes everything
        assert_eq!(core_set(&[4, 5], 9, CoreSide::High), vec![4, 5]);
        assert_eq!(core_set(&[4, 5], 0, CoreSide::Low), vec![4]);
        assert_eq!(core_set(&[4, 5], 1, CoreSide::Any), vec![4, 5]);
        assert_eq!("high".parse::<CoreSide>(), Ok(CoreSide::High));
        assert!("middle"
            .parse::<CoreSide>()
            .unwrap_err()
            .contains("any, low or high"));
    }

    /// The pinning tests change the whole test process's mask: one at a time.
    #[cfg(target_os = "linux")]
    static PINNING: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[cfg(target_os = "linux")]
    #[test]
    fn pinning_the_process_sets_every_thread_and_can_be_undone() {
        let _one = PINNING.lock().unwrap_or_else(|p| p.into_inner());
        let before = allowed_cores();
        let first = before[..1].to_vec();
        let helper =
            std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_millis(200)));
        pin_process(&first).unwrap();
        assert_eq!(allowed_cores(), first);
        pin_process(&before).unwrap();
        assert_eq!(allowed_cores(), before);
        helper.join().unwrap();
        assert!(pin_process(&[]).is_err());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn pinning_the_process_leaves_the_kept_threads_alone() {
        let _one = PINNING.lock().unwrap_or_else(|p| p.into_inner());
        let before = allowed_cores();
        if before.len() < 2 {
            eprintln!("skipping: one core allowed");
            return;
        }
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let kept = std::thread::spawn(move || {
            tid_tx.send(thread_id()).unwrap();
            go_rx.recv().unwrap();
            allowed_cores()
        });
        let tid = tid_rx.recv().unwrap();
        pin_process_except(&before[..1], &[tid]).unwrap();
        assert_eq!(allowed_cores(), before[..1].to_vec());
        go_tx.send(()).unwrap();
        assert_eq!(kept.join().unwrap(), before);
        pin_process(&before).unwrap();
    }

    #[test]
    fn device_names_parse() {
        assert_eq!("cpu".parse::<DeviceKind>(), Ok(DeviceKind::Cpu));
        assert_eq!("cuda".parse::<DeviceKind>(), Ok(DeviceKind::Cuda));
        assert!("tpu"
            .parse::<DeviceKind>()
            .unwrap_err()
            .contains("cpu or cuda"));
    }

    #[test]
    fn cuda_without_a_driver_or_feature_is_a_clear_error() {
        if check_device(DeviceKind::Cuda).is_ok() {
            eprintln!("skipping: a CUDA driver is present");
            return;
        }
        let e = check_device(DeviceKind::Cuda).unwrap_err().0;
        assert!(e.starts_with("--device cuda"), "{e}");
        assert!(!e.contains('\n'));
    }
}
