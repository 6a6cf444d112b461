//! The executor's compute side: the worker process (`easerve worker`) that
//! runs one stage's real burn model on the CPU (NdArray) or CUDA (feature
//! `cuda`), and the profiler that measures calibration tables on the same
//! models.
//!
//! Reading guide:
//! 1. [`process`]: the worker process, serving its controller's frames
//!    (`easerve_exec::wire`) with the model.
//! 2. [`items`]: host-preprocessed items (`easerve_exec::input`) into device
//!    tensors.
//! 3. [`tp`]: a tensor-parallel worker's ranks as processes, and their
//!    loopback all-reduce; [`nccl`] (feature `cuda`): their all-reduce on GPUs.
//! 4. [`profiler`]: timing encode, prefill, decode and transfers into a
//!    profile; [`cuda`] (feature `cuda`): the same on a GPU, at SM levels.
#![warn(missing_docs)]

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod items;
#[cfg(feature = "cuda")]
pub mod nccl;
pub mod process;
pub mod profiler;
pub mod sharing;
pub mod tp;
