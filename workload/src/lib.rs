//! What goes into an easerve run and what comes out, one implementation for
//! both faces (simulator and executor):
//!
//! * [`scenario`] — the scenario file: parsed into plain data, validated with
//!   errors that name the file, the field and what is allowed, then resolved
//!   against the model and GPU presets ([`Scenario`]).
//! * [`generate`] — seeded arrivals (Poisson, Gamma) and request shapes
//!   (image buckets, video, audio durations, text lengths) as
//!   `vllm bench serve`'s random multimodal workload draws them.
//! * [`report`] — the [`Report`]: throughput, goodput per SLO tier, TTFT, TPOT,
//!   E2E, per-stage queueing and service, per-GPU busy fraction, bottleneck.
//! * [`reuse`] — workloads that repeat (a media pool, conversations,
//!   system prompts) and the reuse they offer.
//! * [`schedule`] — time-varying rates (phases, ramps, diurnal, bursts,
//!   ServeGen replay) and non-homogeneous arrivals by time rescaling.
//! * [`windows`] — a run cut into windows of time (goodput, TTFT, queues).
//! * [`plan`] — a planner's run as every driver accounts for it (changes,
//!   GPU-hours).
//! * [`rng`] — one master seed, named RNG streams.
//! * [`trace`] and [`agreement`] — trace replay, and how far a report agrees with
//!   another (`calib validate`).
//!
//! What is made of many runs (sweeps and their plots) lives in `easerve-study`.
#![warn(missing_docs, unreachable_pub)]

pub mod agreement;
pub mod fabric;
pub mod generate;
pub mod phase_agreement;
pub mod plan;
pub mod report;
pub mod reuse;
pub mod rng;
pub mod scenario;
pub mod schedule;
pub mod trace;
pub mod windows;

pub use generate::generate_requests;
pub use report::{Report, SloTier, Stats};
pub use scenario::{Scenario, ScenarioError};
