//! `easerve bench`: a load generator for any OpenAI-compatible chat endpoint,
//! after `vllm bench serve`, so that a deployment served by vLLM, SGLang,
//! Dynamo or easerve is measured the same way and the result calibrates the
//! twin.
//!
//! * [`workload`] — the requests: a scenario's (the simulator's own
//!   generator and seed) or `vllm bench serve`'s `random-mm` dataset, with
//!   Poisson or gamma send times.
//! * [`media`] — real PNG, JPEG and WAV files of the shapes asked for, as
//!   chat content parts.
//! * [`client`] — sending them (plain HTTP, streamed), timing every chunk.
//! * [`result`] — TTFT, TPOT, ITL, E2EL and goodput with vLLM's definitions
//!   and result keys, and easerve's report of the same requests.
#![warn(missing_docs, unreachable_pub)]

pub mod client;
pub mod media;
pub mod result;
pub mod workload;
