//! SM partitions through CUDA green contexts (driver API, CUDA 12.4 or newer).
//!
//! A green context owns a fixed group of SMs: kernels launched on its streams
//! run only there. [`partitions`] turns the simulator's SM levels into the SM
//! counts the driver can actually split off, which depend on the device's SM
//! count and its split granularity ([`SmGranularity`]); with the `cuda`
//! feature, `GreenContexts::create` (in this module) asks the driver
//! for one green context per level (and one for the remainder, the co-located
//! worker's side) up front and records each level's effective SM count.
//!
//! burn's CUDA backend (cubecl-cuda 0.10) retains the device's *primary*
//! context, makes it current before every operation and creates its streams
//! there, so its kernels cannot be sent to a green context's stream without
//! changing cubecl. The executor's and profiler's burn kernels therefore use
//! the fallback below; the green contexts are created, sized and reported (by
//! `scripts/gpu-check`) so a backend that accepts an external stream can use
//! them as they are.
//!
//! Fallback, MPS: with an MPS control daemon running, a worker process started
//! with `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=p` gets at most `p` % of the SMs
//! ([`mps_thread_percentage`]). What it loses against green contexts: the
//! percentage is a cap on how many SMs the process's kernels may occupy, not a
//! set of SMs of its own (two processes at 50 % can still land on the same
//! SMs), and it is fixed when the process creates its context, so a worker's
//! share cannot change from one micro-batch to the next.

/// How finely the driver splits a device's SMs: a group has at least `min` SMs
/// and a multiple of `align`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmGranularity {
    /// Smallest group, SMs.
    pub min: u32,
    /// Group sizes are multiples of this many SMs.
    pub align: u32,
}

impl SmGranularity {
    /// The granularity of `cuDevSmResourceSplitByCount` by compute capability
    /// (CUDA Driver API reference, "Green Contexts", 12.4–13.0): 6.x groups of
    /// 1 SM; 7.x at least 2, multiples of 2; 8.x at least 4, multiples of 2;
    /// 9.0 and newer (Hopper, Blackwell) at least 8, multiples of 8.
    pub fn for_compute_capability(major: u32) -> SmGranularity {
        match major {
            0..=6 => SmGranularity { min: 1, align: 1 },
            7 => SmGranularity { min: 2, align: 2 },
            8 => SmGranularity { min: 4, align: 2 },
            _ => SmGranularity { min: 8, align: 8 },
        }
    }
}

/// One SM level split off a device.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Partition {
    /// The level asked for, a share of the device's SMs in (0, 1].
    pub level: f64,
    /// SMs of the level's group.
    pub sms: u32,
    /// SMs left for the other side (the co-located worker); 0 at level 1.
    pub rest: u32,
    /// `sms / total`: the share the level really gets (what a profile records).
    pub share: f64,
}

/// The SMs a group at `level` gets on a device of `total` SMs: `level × total`
/// rounded to the nearest multiple of `g.align`, at least `g.min`, and at most
/// the largest aligned group that leaves `g.min` SMs for the remainder; level
/// 1.0 (or a device too small to split) is the whole device.
pub fn level_sm_count(total: u32, level: f64, g: SmGranularity) -> u32 {
    let align = g.align.max(1);
    let largest_split = (total.saturating_sub(g.min) / align) * align;
    if level >= 1.0 || largest_split < g.min {
        return total;
    }
    let want = (level.max(0.0) * f64::from(total) / f64::from(align)).round() as u32 * align;
    want.clamp(g.min, largest_split)
}

/// The partition of each level in `levels` on a device of `total` SMs.
pub fn partitions(total: u32, levels: &[f64], g: SmGranularity) -> Vec<Partition> {
    levels
        .iter()
        .map(|&level| {
            let sms = level_sm_count(total, level, g);
            Partition {
                level,
                sms,
                rest: total - sms,
                share: f64::from(sms) / f64::from(total.max(1)),
            }
        })
        .collect()
}

/// The `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` of a worker at SM share `share`:
/// the share in percent, rounded up so that a share never gets fewer SMs than
/// asked, 1 to 100.
pub fn mps_thread_percentage(share: f64) -> u32 {
    ((share * 100.0 - 1e-9).ceil() as u32).clamp(1, 100)
}

#[cfg(feature = "cuda")]
pub use driver::{GreenContexts, GreenError, GreenLevel};

#[cfg(feature = "cuda")]
mod driver {
    //! The driver calls, declared here and loaded from `libcuda.so.1` at run
    //! time, so the build needs no CUDA toolkit and works whichever toolkit
    //! version cudarc's bindings were generated for.

    use super::{partitions, Partition, SmGranularity};
    use std::ffi::{c_int, c_uint, c_void};

    type CuResult = c_int;
    type CuDevice = c_int;
    type Handle = *mut c_void;

    /// `CUdevResource`: its type (offset 0) and, for SM resources, `smCount`
    /// (offset 96, after 92 bytes of padding; the same in CUDA 12.4–13.x).
    /// Later versions append fields; the buffer leaves room for them.
    #[repr(C, align(8))]
    #[derive(Clone, Copy)]
    struct DevResource {
        bytes: [u8; 256],
    }

    impl DevResource {
        fn zeroed() -> DevResource {
            DevResource { bytes: [0; 256] }
        }
        fn sm_count(&self) -> u32 {
            u32::from_ne_bytes(self.bytes[96..100].try_into().expect("4 bytes"))
        }
    }

    /// Why green contexts could not be made ([`GreenContexts::create`]).
    #[derive(Debug, thiserror::Error)]
    pub enum GreenError {
        /// No NVIDIA driver library on the loader path.
        #[error("libcuda.so.1 not found ({0}): install the NVIDIA driver")]
        NoDriver(libloading::Error),
        /// A driver without a green-context entry point (older than CUDA 12.4).
        #[error(
            "the NVIDIA driver lacks {symbol} ({error}): green contexts need a CUDA 12.4 or newer driver"
        )]
        OldDriver {
            /// The missing entry point, e.g. `cuGreenCtxCreate`.
            symbol: String,
            /// The loader's message.
            error: libloading::Error,
        },
        /// A driver call that returned an error code.
        #[error("{call} failed (CUresult {rc}, {name})")]
        Call {
            /// The call, e.g. `cuGreenCtxCreate`.
            call: &'static str,
            /// Its `CUresult`.
            rc: CuResult,
            /// The code's name (`cuGetErrorName`), or `unknown`.
            name: String,
        },
        /// A split that did not make exactly one group.
        #[error("cuDevSmResourceSplitByCount made {groups} groups of {sms} SMs out of {total}")]
        Split {
            /// Groups made.
            groups: c_uint,
            /// SMs asked per group.
            sms: u32,
            /// The device's SMs.
            total: u32,
        },
    }

    const CU_DEV_RESOURCE_TYPE_SM: c_int = 1;
    const CU_GREEN_CTX_DEFAULT_STREAM: c_uint = 1;
    const CU_STREAM_NON_BLOCKING: c_uint = 1;
    const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;

    struct Api {
        _lib: libloading::Library,
        init: unsafe extern "C" fn(c_uint) -> CuResult,
        device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
        attribute: unsafe extern "C" fn(*mut c_int, c_int, CuDevice) -> CuResult,
        get_resource: unsafe extern "C" fn(CuDevice, *mut DevResource, c_int) -> CuResult,
        split: unsafe extern "C" fn(
            *mut DevResource,
            *mut c_uint,
            *const DevResource,
            *mut DevResource,
            c_uint,
            c_uint,
        ) -> CuResult,
        desc: unsafe extern "C" fn(*mut Handle, *mut DevResource, c_uint) -> CuResult,
        create: unsafe extern "C" fn(*mut Handle, Handle, CuDevice, c_uint) -> CuResult,
        stream: unsafe extern "C" fn(*mut Handle, Handle, c_uint, c_int) -> CuResult,
        destroy: unsafe extern "C" fn(Handle) -> CuResult,
        stream_destroy: unsafe extern "C" fn(Handle) -> CuResult,
        error_name: unsafe extern "C" fn(CuResult, *mut *const std::ffi::c_char) -> CuResult,
    }

    impl Api {
        fn load() -> Result<Api, GreenError> {
            // SAFETY: loading the NVIDIA driver library, whose initialisers
            // have no preconditions.
            let lib = unsafe { libloading::Library::new("libcuda.so.1") }
                .map_err(GreenError::NoDriver)?;
            macro_rules! sym {
                ($name:literal) => {
                    // SAFETY: the declared signature is the driver API's
                    // (cuda.h, CUDA 12.4), and the library outlives the
                    // pointer (kept in `_lib`).
                    unsafe {
                        *lib.get($name).map_err(|error| GreenError::OldDriver {
                            symbol: String::from_utf8_lossy($name).into_owned(),
                            error,
                        })?
                    }
                };
            }
            Ok(Api {
                init: sym!(b"cuInit"),
                device_get: sym!(b"cuDeviceGet"),
                attribute: sym!(b"cuDeviceGetAttribute"),
                get_resource: sym!(b"cuDeviceGetDevResource"),
                split: sym!(b"cuDevSmResourceSplitByCount"),
                desc: sym!(b"cuDevResourceGenerateDesc"),
                create: sym!(b"cuGreenCtxCreate"),
                stream: sym!(b"cuGreenCtxStreamCreate"),
                destroy: sym!(b"cuGreenCtxDestroy"),
                stream_destroy: sym!(b"cuStreamDestroy_v2"),
                error_name: sym!(b"cuGetErrorName"),
                _lib: lib,
            })
        }
    }

    impl Api {
        /// `Err` naming the call, the `CUresult` and its name
        /// (`cuGetErrorName`, e.g. `CUDA_ERROR_INVALID_VALUE`) unless `rc` is 0.
        fn check(&self, call: &'static str, rc: CuResult) -> Result<(), GreenError> {
            if rc == 0 {
                return Ok(());
            }
            let mut name: *const std::ffi::c_char = std::ptr::null();
            // SAFETY: the driver points `name` at a static string, or leaves
            // it null for an unknown code.
            let known = unsafe { (self.error_name)(rc, &mut name) } == 0 && !name.is_null();
            let name = if known {
                // SAFETY: a NUL-terminated static string from the driver.
                unsafe { std::ffi::CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned()
            } else {
                "unknown".to_string()
            };
            Err(GreenError::Call { call, rc, name })
        }

        /// Destroy a stream, then its green context (each once).
        fn release(&self, (ctx, stream): (Handle, Handle)) {
            // SAFETY: handles this module created; the stream goes before
            // the context it belongs to.
            unsafe {
                if !stream.is_null() {
                    (self.stream_destroy)(stream);
                }
                if !ctx.is_null() {
                    (self.destroy)(ctx);
                }
            }
        }
    }

    /// The green contexts of one SM level: the level's group and the remainder.
    pub struct GreenLevel {
        /// What the driver split off (its effective SM count).
        pub partition: Partition,
        /// Green context of the level's SMs (`CUgreenCtx`).
        pub context: *mut c_void,
        /// A non-blocking stream of that context (`CUstream`).
        pub stream: *mut c_void,
        /// Green context of the remaining SMs, with its stream; `None` at level 1.
        pub rest: Option<(*mut c_void, *mut c_void)>,
    }

    /// One green context per SM level of a GPU, created up front.
    pub struct GreenContexts {
        api: Api,
        /// The device's SMs.
        pub total_sms: u32,
        /// Its compute capability's major number.
        pub compute_major: u32,
        /// The split granularity used.
        pub granularity: SmGranularity,
        /// Per level, in the order asked.
        pub levels: Vec<GreenLevel>,
    }

    impl GreenContexts {
        /// Split GPU `ordinal` at each of `levels` and create the contexts.
        ///
        /// Errors: no driver, a driver older than CUDA 12.4, no such GPU, or a
        /// driver call failing (the message names it and its `CUresult`).
        pub fn create(ordinal: usize, levels: &[f64]) -> Result<GreenContexts, GreenError> {
            let api = Api::load()?;
            let mut out = GreenContexts {
                total_sms: 0,
                compute_major: 0,
                granularity: SmGranularity { min: 1, align: 1 },
                levels: Vec::new(),
                api,
            };
            let a = &out.api;
            let mut dev: CuDevice = 0;
            let mut major: c_int = 0;
            let mut whole = DevResource::zeroed();
            // SAFETY: driver calls with out-pointers to live locals.
            unsafe {
                a.check("cuInit", (a.init)(0))?;
                a.check("cuDeviceGet", (a.device_get)(&mut dev, ordinal as c_int))?;
                a.check(
                    "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)",
                    (a.attribute)(
                        &mut major,
                        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                        dev,
                    ),
                )?;
                a.check(
                    "cuDeviceGetDevResource(SM)",
                    (a.get_resource)(dev, &mut whole, CU_DEV_RESOURCE_TYPE_SM),
                )?;
            }
            out.total_sms = whole.sm_count();
            out.compute_major = major.max(0) as u32;
            out.granularity = SmGranularity::for_compute_capability(out.compute_major);
            for plan in partitions(out.total_sms, levels, out.granularity) {
                let level = out.make_level(dev, &whole, plan)?;
                out.levels.push(level);
            }
            Ok(out)
        }

        fn context(
            &self,
            dev: CuDevice,
            res: &mut DevResource,
        ) -> Result<(Handle, Handle), GreenError> {
            let a = &self.api;
            let (mut desc, mut ctx, mut stream): (Handle, Handle, Handle) = (
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
            // SAFETY: driver calls with out-pointers to live locals; `res` is
            // an SM resource the driver filled.
            unsafe {
                a.check("cuDevResourceGenerateDesc", (a.desc)(&mut desc, res, 1))?;
                a.check(
                    "cuGreenCtxCreate",
                    (a.create)(&mut ctx, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM),
                )?;
                let made = a.check(
                    "cuGreenCtxStreamCreate",
                    (a.stream)(&mut stream, ctx, CU_STREAM_NON_BLOCKING, 0),
                );
                if let Err(e) = made {
                    a.release((ctx, std::ptr::null_mut()));
                    return Err(e);
                }
            }
            Ok((ctx, stream))
        }

        fn make_level(
            &self,
            dev: CuDevice,
            whole: &DevResource,
            plan: Partition,
        ) -> Result<GreenLevel, GreenError> {
            if plan.rest == 0 {
                let mut all = *whole;
                let (context, stream) = self.context(dev, &mut all)?;
                return Ok(GreenLevel {
                    partition: plan,
                    context,
                    stream,
                    rest: None,
                });
            }
            let (mut group, mut rest) = (DevResource::zeroed(), DevResource::zeroed());
            let mut groups: c_uint = 1;
            // SAFETY: one result slot, as `groups` says; `whole` came from
            // cuDeviceGetDevResource.
            unsafe {
                self.api.check(
                    "cuDevSmResourceSplitByCount",
                    (self.api.split)(&mut group, &mut groups, whole, &mut rest, 0, plan.sms),
                )?;
            }
            if groups != 1 {
                return Err(GreenError::Split {
                    groups,
                    sms: plan.sms,
                    total: self.total_sms,
                });
            }
            let sms = group.sm_count();
            let partition = Partition {
                sms,
                rest: rest.sm_count(),
                share: f64::from(sms) / f64::from(self.total_sms.max(1)),
                ..plan
            };
            let (context, stream) = self.context(dev, &mut group)?;
            let rest = self.context(dev, &mut rest).inspect_err(|_| {
                self.api.release((context, stream));
            })?;
            Ok(GreenLevel {
                partition,
                context,
                stream,
                rest: Some(rest),
            })
        }
    }

    impl Drop for GreenContexts {
        fn drop(&mut self) {
            // levels made before a failed one are in `levels` and go here
            for l in &self.levels {
                self.api.release((l.context, l.stream));
                if let Some(rest) = l.rest {
                    self.api.release(rest);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEVELS: [f64; 5] = [0.2, 0.4, 0.6, 0.8, 1.0];

    #[test]
    fn hopper_levels_are_multiples_of_eight_sms() {
        // H100 SXM / H200: 132 SMs, compute capability 9.0
        let g = SmGranularity::for_compute_capability(9);
        assert_eq!(g, SmGranularity { min: 8, align: 8 });
        let p = partitions(132, &LEVELS, g);
        let sms: Vec<u32> = p.iter().map(|p| p.sms).collect();
        // 26.4 -> 24, 52.8 -> 56, 79.2 -> 80, 105.6 -> 104, all
        assert_eq!(sms, vec![24, 56, 80, 104, 132]);
        assert_eq!(p[0].rest, 108);
        assert_eq!(p[4].rest, 0);
        assert!((p[0].share - 24.0 / 132.0).abs() < 1e-12);
        for q in &p[..4] {
            assert_eq!(q.sms % 8, 0);
            assert!(q.rest >= 8, "the remainder is a group too");
        }
    }

    #[test]
    fn other_architectures_and_edges() {
        // A100: 108 SMs, 8.x: at least 4, multiples of 2
        let g = SmGranularity::for_compute_capability(8);
        let sms: Vec<u32> = partitions(108, &LEVELS, g).iter().map(|p| p.sms).collect();
        assert_eq!(sms, vec![22, 44, 64, 86, 108]);
        // V100: 80 SMs, 7.x: multiples of 2
        assert_eq!(
            level_sm_count(80, 0.25, SmGranularity::for_compute_capability(7)),
            20
        );
        // tiny levels are raised to the minimum group
        assert_eq!(
            level_sm_count(132, 0.01, SmGranularity::for_compute_capability(9)),
            8
        );
        // a level near 1 leaves at least one minimum group for the remainder
        assert_eq!(
            level_sm_count(132, 0.99, SmGranularity::for_compute_capability(9)),
            120
        );
        // a device too small to split runs every level on all its SMs
        assert_eq!(
            level_sm_count(12, 0.5, SmGranularity::for_compute_capability(9)),
            12
        );
        // RTX 6000 Ada: 142 SMs (8.9)
        assert_eq!(
            level_sm_count(142, 0.5, SmGranularity::for_compute_capability(8)),
            72
        );
    }

    #[test]
    fn mps_percentages_never_give_less_than_the_share() {
        assert_eq!(mps_thread_percentage(0.5), 50);
        assert_eq!(mps_thread_percentage(0.333), 34);
        assert_eq!(mps_thread_percentage(0.0), 1);
        assert_eq!(mps_thread_percentage(1.0), 100);
        assert_eq!(mps_thread_percentage(1.5), 100);
    }
}
