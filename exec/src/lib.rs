//! The real executor's compute side: burn models on CPU (NdArray) or CUDA (feature
//! `cuda`), real input decoding, and the profiler that measures calibration tables.
//!
//! Reading guide:
//! 1. [`input`]: images / video / audio into the tensors each encoder takes.
//! 2. [`mel`]: Whisper's log-mel spectrogram.
//! 3. [`device`]: choosing the backend and bounding a worker's CPU threads.
//!    [`green`]: SM partitions (CUDA green contexts, the MPS fallback).
//! 4. [`profiler`]: timing encode, prefill, decode and transfers into a profile.
//! 5. [`run`]: `easerve exec`, the second driver of `easerve_sched::Controller`
//!    (the simulator is the first): worker processes over sockets, the
//!    controller's commands carried out for real.
//! 6. [`serve`] and [`openai`]: `easerve serve`, the same controller and
//!    workers behind an OpenAI-compatible HTTP server.
//! 7. [`wire`] and [`worker`]: the frames between the controller and a worker,
//!    and the worker process itself.
#![warn(missing_docs)]

#[cfg(test)]
mod agree;

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;
pub mod green;
pub mod input;
pub mod mel;
pub mod openai;
pub mod preprocess_cost;
pub mod profiler;
pub mod run;
pub mod serve;
pub mod wire;
pub mod worker;
