//! The real executor's orchestration: `easerve exec` and `easerve serve` drive
//! `easerve_sched::Controller` over worker processes. This crate holds no
//! model; the worker processes run `easerve_worker`'s burn models.
//!
//! Reading guide:
//! 1. [`run`]: `easerve exec`, a driver of the controller (the simulator is
//!    another): worker processes over sockets, the controller's commands
//!    carried out for real.
//! 2. [`serve`] and [`openai`]: `easerve serve`, the same controller and
//!    workers behind an OpenAI-compatible HTTP server; [`socket`]: its
//!    accept loop and the limits at the socket.
//! 3. [`wire`]: the frames between the controller and a worker.
//! 4. [`input`] and [`mel`]: images / video / audio decoded and preprocessed
//!    on the host into the arrays each encoder takes (Whisper's log-mel
//!    spectrogram); [`preprocess_cost`] times that work.
//! 5. [`limits`]: what one request may ask of a CPU run, from its host's
//!    memory (the tokens one prefill pass can take).
//! 6. [`device`]: the backend a worker computes on and its CPU thread bounds;
//!    [`green`]: SM partitions (CUDA green contexts, the MPS fallback).
//! 7. `plan`: a planner's changes for real — a drained worker's process
//!    stopped, another started with the new role on its device.
//! 8. `agree` (feature `agreement`, run by the workspace's `cargo test`): the
//!    command handling of `exec` and `serve` against fake workers, checked
//!    to decide as the simulator does.
#![warn(missing_docs)]

#[cfg(feature = "agreement")]
pub mod agree;

pub mod device;
pub mod green;
pub mod input;
pub mod limits;
pub mod mel;
pub mod openai;
mod plan;
pub mod preprocess_cost;
pub mod run;
pub mod serve;
pub mod socket;
pub mod store;
mod supervise;
pub mod wire;
