//! The all-reduce of a tensor-parallel worker's ranks on CUDA (feature
//! `cuda`): NCCL through `cudarc`'s bindings, one process per rank, one GPU
//! per rank.
//!
//! Rank 0 makes the group's NCCL unique id ([`unique_id`], 128 bytes) and
//! sends it to each follower over the loopback stream that already carries
//! the ranks' commands ([`crate::tp`]); every rank then joins the
//! communicator ([`NcclGroup::join`], `ncclCommInitRank`, which blocks until
//! all `world` ranks have joined).
//!
//! Data path: burn 0.21's CUDA backend gives no device pointer of a tensor
//! through its public API, so a sum goes through host memory:
//! [`easerve_model::nn::AllReduce::sum`] reads the tensor back (device to host),
//! [`NcclGroup::sum_host`] copies it to a `cudarc` buffer (host to device),
//! runs `ncclAllReduce` (sum, f32, in place), copies the sum back (device to
//! host), and `sum` makes the result tensor (host to device). Per all-reduce of
//! `n` values that is four PCIe copies (`n` × 4 bytes each as f32; the first
//! and last at the model's dtype) and two stream synchronisations on top of
//! NCCL's own transfer, where a device-pointer path would do none.
//!
//! Every rank gets the same sum (NCCL's ring or tree writes each reduced
//! chunk once and broadcasts it). Its summation order is NCCL's, not rank
//! order: at TP 2 the two orders are the same (`a + b = b + a` in IEEE
//! arithmetic); at TP 4 the sum may differ in the last bits from the CPU
//! path's ([`crate::tp::TcpGroup`]).
//!
//! `libnccl.so` is loaded at run time (`cudarc`'s dynamic loading), so the
//! build needs no NCCL or CUDA toolkit; a machine without it gets
//! [`NcclError::NoLibrary`].

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaStream, DriverError};
use cudarc::nccl::{Comm, Id, ReduceOp};

/// Bytes of an NCCL unique id (`ncclUniqueId`, `NCCL_UNIQUE_ID_BYTES`).
pub const ID_BYTES: usize = 128;

/// Why an NCCL group cannot be made or cannot sum.
#[derive(Debug, thiserror::Error)]
pub enum NcclError {
    /// `libnccl.so` is not on the loader path.
    #[error("libnccl.so could not be loaded: TP > 1 on --device cuda needs NCCL (e.g. the libnccl2 package) on the worker's machine; install it, or use TP1")]
    NoLibrary,
    /// An NCCL call failed (its `ncclResult_t`).
    #[error("NCCL {what} failed: {code}")]
    Nccl {
        /// The call.
        what: &'static str,
        /// Its result code.
        code: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA {what} failed: {error:?}")]
    Cuda {
        /// The call.
        what: &'static str,
        /// The driver's error.
        error: DriverError,
    },
}

fn nccl(what: &'static str) -> impl Fn(cudarc::nccl::result::NcclError) -> NcclError {
    move |e| NcclError::Nccl {
        what,
        code: format!("{:?}", e.0),
    }
}

fn cuda(what: &'static str) -> impl Fn(DriverError) -> NcclError {
    move |error| NcclError::Cuda { what, error }
}

fn check_library() -> Result<(), NcclError> {
    // SAFETY: only tries to open the library by its usual names.
    if unsafe { cudarc::nccl::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(NcclError::NoLibrary)
    }
}

/// A fresh NCCL unique id (rank 0), as the bytes to send to the other ranks.
///
/// # Errors
/// NCCL is not installed, or `ncclGetUniqueId` failed.
pub fn unique_id() -> Result<[u8; ID_BYTES], NcclError> {
    check_library()?;
    let id = Id::new().map_err(nccl("ncclGetUniqueId"))?;
    Ok(id.internal().map(|c| c as u8))
}

/// A communicator, movable to another thread.
struct SendComm(Comm);

// SAFETY: an NCCL communicator may be used from any thread, one call at a
// time (NCCL user guide, "Thread safety"); `NcclGroup` holds it behind a
// mutex, so no two threads call it at once.
unsafe impl Send for SendComm {}

/// One rank's end of a `world`-rank NCCL group on one GPU.
pub struct NcclGroup {
    comm: Mutex<SendComm>,
    stream: Arc<CudaStream>,
    rank: usize,
    world: usize,
}

impl std::fmt::Debug for NcclGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclGroup")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .finish()
    }
}

impl NcclGroup {
    /// Join the group of `world` ranks with unique id `id` as `rank`, on GPU
    /// `ordinal` (a stream of its own on the device's primary context, the
    /// one burn's CUDA backend uses). Blocks until every rank has joined.
    ///
    /// # Errors
    /// NCCL is not installed, the GPU cannot be opened, or
    /// `ncclCommInitRank` failed (e.g. two ranks on one GPU).
    pub fn join(
        ordinal: usize,
        rank: usize,
        world: usize,
        id: [u8; ID_BYTES],
    ) -> Result<NcclGroup, NcclError> {
        check_library()?;
        let ctx = CudaContext::new(ordinal).map_err(cuda("cuCtxRetain"))?;
        let stream = ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
        let id = Id::uninit(id.map(|b| b as std::ffi::c_char));
        let comm =
            Comm::from_rank(stream.clone(), rank, world, id).map_err(nccl("ncclCommInitRank"))?;
        Ok(NcclGroup {
            comm: Mutex::new(SendComm(comm)),
            stream,
            rank,
            world,
        })
    }

    /// Ranks in the group.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Sum `data` over the group in place (see the module doc for the copies).
    ///
    /// # Errors
    /// A copy or `ncclAllReduce` failed (a peer gone, a device fault).
    pub fn sum_host(&self, data: &mut [f32]) -> Result<(), NcclError> {
        if data.is_empty() {
            return Ok(());
        }
        let comm = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        let mut buf = self
            .stream
            .clone_htod(data)
            .map_err(cuda("cuMemcpyHtoDAsync"))?;
        comm.0
            .all_reduce_in_place(&mut buf, &ReduceOp::Sum)
            .map_err(nccl("ncclAllReduce"))?;
        self.stream
            .memcpy_dtoh(&buf, data)
            .map_err(cuda("cuMemcpyDtoHAsync"))?;
        self.stream
            .synchronize()
            .map_err(cuda("cuStreamSynchronize"))
    }
}
