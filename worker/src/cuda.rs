//! CUDA profiling (feature `cuda`): burn's CUDA backend on GPU 0, SM levels through
//! libsmctrl's TPC mask when `libsmctrl.so` can be loaded. The partition CUDA
//! green contexts make at each level is reported beside it ([`easerve_exec::green`]
//! says why burn's kernels cannot run in them yet).
//!
//! libsmctrl (Bakita & Anderson, RTAS 2023; <https://www.cs.unc.edu/~jbakita/libsmctrl>)
//! masks TPCs for every kernel the process launches afterwards
//! (`libsmctrl_set_global_mask`, a set bit disables a TPC). It is loaded at run time
//! with `libloading`; without it only SM level 1.0 is measured and the profile's
//! method says so.
//!
//! Weights and activations are BF16 (`Cuda<bf16>`), as the real checkpoints are
//! served, so the real-size presets fit: LLaVA-v1.6-34B's LM is 68.8 GB.

use burn::backend::Cuda;
use burn::tensor::bf16;
use easerve_calib::{Efficiency, Profile, Provenance, Source};
use easerve_model::ModelArch;

use crate::profiler::{
    assemble, measure_level, measure_loopback, Plan, ProfileOptions, BURN_VERSION,
};

/// The GPU backend: burn CUDA in BF16.
pub type Gpu = Cuda<bf16>;

/// SM levels measured when libsmctrl is available.
pub const SM_LEVELS: [f64; 5] = [0.2, 0.4, 0.6, 0.8, 1.0];

/// Why libsmctrl cannot be used, or a CUDA profile not made.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// `libsmctrl.so` is not on the loader path.
    #[error(
        "libsmctrl.so not found ({0}): build libsmctrl (http://rtsrv.cs.unc.edu/cgit/cgit.cgi/libsmctrl.git) and put its folder on LD_LIBRARY_PATH"
    )]
    NoSmctrl(libloading::Error),
    /// A libsmctrl entry point cannot be found (the loader's message).
    #[error("{0}")]
    Symbol(libloading::Error),
    /// libsmctrl cannot read the GPU's TPC count.
    #[error("libsmctrl_get_tpc_info failed (rc {0})")]
    TpcInfo(i32),
    /// A measurement or the assembled profile failed.
    #[error(transparent)]
    Measure(#[from] crate::profiler::ProfilerError),
}

/// libsmctrl, loaded at run time.
pub struct SmCtrl {
    lib: libloading::Library,
    tpcs: u32,
}

impl SmCtrl {
    /// Load `libsmctrl.so` and read GPU 0's TPC count.
    ///
    /// Errors: the library is not on the loader path (build it from
    /// <http://rtsrv.cs.unc.edu/cgit/cgit.cgi/libsmctrl.git> and add its folder to
    /// `LD_LIBRARY_PATH`), or it cannot read the TPC count.
    pub fn load() -> Result<SmCtrl, CudaError> {
        // SAFETY: loading a C library whose initialisers only register CUDA callbacks.
        let lib =
            unsafe { libloading::Library::new("libsmctrl.so") }.map_err(CudaError::NoSmctrl)?;
        let mut tpcs = 0u32;
        // SAFETY: signature from libsmctrl.h: int libsmctrl_get_tpc_info(uint32_t*, int).
        let rc = unsafe {
            let f: libloading::Symbol<unsafe extern "C" fn(*mut u32, i32) -> i32> = lib
                .get(b"libsmctrl_get_tpc_info")
                .map_err(CudaError::Symbol)?;
            f(&mut tpcs, 0)
        };
        if rc != 0 || tpcs == 0 {
            return Err(CudaError::TpcInfo(rc));
        }
        Ok(SmCtrl { lib, tpcs })
    }

    /// Enable about `level * tpcs` TPCs for kernels launched from now on; returns
    /// the share actually enabled. The mask has 64 bits, so on GPUs with more TPCs
    /// (H100/H200: 66) the TPCs past 64 stay enabled and count in the share.
    pub fn set_level(&self, level: f64) -> Result<f64, CudaError> {
        let n = self.tpcs.min(64);
        let always = self.tpcs - n;
        let want = (level * f64::from(self.tpcs)).ceil() as u32;
        let on = want.saturating_sub(always).clamp(1, n);
        let all = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        let enabled = if on == 64 { u64::MAX } else { (1u64 << on) - 1 };
        let mask = all & !enabled;
        // SAFETY: signature from libsmctrl.h: void libsmctrl_set_global_mask(uint64_t).
        unsafe {
            let f: libloading::Symbol<unsafe extern "C" fn(u64)> = self
                .lib
                .get(b"libsmctrl_set_global_mask")
                .map_err(CudaError::Symbol)?;
            f(mask);
        }
        Ok(f64::from(on + always) / f64::from(self.tpcs))
    }
}

/// The GPU a worker of allocation GPU `gpu` runs on: `gpu` modulo the GPUs
/// the driver shows, so a deployment larger than the machine shares its GPUs
/// (`1E+1P+1D` on one GPU: all three workers on GPU 0), with a note on stderr
/// when it folds. GPU 0 when the count cannot be read.
pub fn visible_ordinal(gpu: usize) -> usize {
    let count = cudarc::driver::result::init()
        .and_then(|_| cudarc::driver::result::device::get_count())
        .unwrap_or(1)
        .max(1) as usize;
    if gpu >= count {
        eprintln!(
            "note: the allocation's GPU {gpu} runs on GPU {} (the driver shows {count}); workers share it",
            gpu % count
        );
    }
    gpu % count
}

/// The green-context partition of GPU 0 at [`SM_LEVELS`], as one line per
/// level (`level 0.20: 24 of 132 SMs (share 0.182), remainder 108`), or why
/// none could be made.
pub fn green_partition_report() -> Result<String, easerve_exec::green::GreenError> {
    let g = easerve_exec::green::GreenContexts::create(0, &SM_LEVELS)?;
    let mut out = format!(
        "green contexts on GPU 0: {} SMs, compute capability {}.x, groups of at least {} SMs in multiples of {}\n",
        g.total_sms, g.compute_major, g.granularity.min, g.granularity.align
    );
    for l in &g.levels {
        let p = l.partition;
        out.push_str(&format!(
            "level {:.2}: {} of {} SMs (share {:.3}), remainder {}\n",
            p.level, p.sms, g.total_sms, p.share, p.rest
        ));
    }
    Ok(out)
}

/// Profile `arch` on GPU 0, calling `progress` after each grid point.
pub fn profile_cuda(
    arch: &ModelArch,
    opts: &ProfileOptions,
    date: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<Profile, CudaError> {
    let plan = Plan::for_model(arch, opts.quick);
    let device = burn::backend::cuda::CudaDevice::default();
    // the partition green contexts give each level (burn's kernels cannot run
    // in them, see easerve_exec::green; the table says what a level would really get)
    let green = match green_partition_report() {
        Ok(table) => {
            eprint!("{table}");
            table.lines().skip(1).collect::<Vec<_>>().join("; ")
        }
        Err(e) => {
            eprintln!("note: no green contexts: {e}");
            format!("no green contexts: {e}")
        }
    };
    let smctrl = SmCtrl::load();
    let levels: Vec<f64> = match &smctrl {
        Ok(_) => SM_LEVELS.to_vec(),
        Err(e) => {
            eprintln!("note: measuring SM level 1.0 only: {e}");
            vec![1.0]
        }
    };
    let mut rows = Vec::new();
    for &level in &levels {
        let share = match &smctrl {
            Ok(s) => s.set_level(level)?,
            Err(_) => level,
        };
        rows.push(
            measure_level::<Gpu>(arch, &plan, opts, share, level == 1.0, &device, &mut |p| {
                progress(&format!("SM level {share:.2}: {p}"))
            })
            .map_err(CudaError::Measure)?,
        );
    }
    let transfer = measure_loopback(&plan, opts, progress).map_err(CudaError::Measure)?;
    let eff = Efficiency::default();
    let provenance = Provenance {
        model: arch.name.clone(),
        device: "cuda".into(),
        link: "loopback".into(),
        source: Source::Measured,
        backend: format!("burn {BURN_VERSION} cuda (bf16)"),
        driver: "CUDA driver (dynamically loaded by cudarc)".into(),
        libraries: vec![format!("burn {BURN_VERSION}"), format!("easerve-worker {}", env!("CARGO_PKG_VERSION"))],
        date: date.into(),
        method: format!(
            "easerve profile --device cuda: {} warm-up + {} timed runs per point, median and p90; SM levels {:?} ({}); green-context partition: {}",
            opts.warmup,
            opts.repetitions,
            levels,
            if smctrl.is_ok() { "libsmctrl TPC mask" } else { "libsmctrl absent: full GPU only" },
            green
        ),
        repetitions: opts.repetitions,
        cores: None,
    };
    assemble(
        arch,
        provenance,
        (eff.time_slice_penalty, eff.bandwidth_interference),
        rows,
        transfer,
    )
    .map_err(CudaError::Measure)
}
