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
//! processes (see [`crate::profile`] and [`cpu_levels`]).

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
#[cfg(target_os = "linux")]
fn pin_to_cores(n: usize) {
    // SAFETY: plain libc calls on a zeroed cpu_set_t owned by this frame.
    unsafe {
        let mut cur: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut cur) != 0 {
            return;
        }
        let mut want: libc::cpu_set_t = std::mem::zeroed();
        let mut taken = 0;
        for cpu in 0..libc::CPU_SETSIZE as usize {
            if taken == n {
                break;
            }
            if libc::CPU_ISSET(cpu, &cur) {
                libc::CPU_SET(cpu, &mut want);
                taken += 1;
            }
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &want);
    }
}

#[cfg(not(target_os = "linux"))]
fn pin_to_cores(_n: usize) {}

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
