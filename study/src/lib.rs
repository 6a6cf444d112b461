//! Studies over many easerve runs, above the simulator: what a sweep's points
//! become (one row per scenario variant × system × rate × seed, medians over
//! seeds, CSV, merging of shard files) and the SVG plots drawn from them.
//!
//! * [`sweep`] — sweep plans and runs (systems, `--set` variants, shards, in
//!   parallel), rows and points, medians, CSV, shard merging, and the charts.
//! * [`demand`] — runs under a changing load: per-window timelines of a
//!   sweep, and how each variant rides a change (P99 TTFT, time to settle).
//! * [`reproduce`] — the EAServe paper's findings re-run in simulation: the
//!   report of `easerve reproduce` and the rate sweeps behind its plots.
//! * [`plot`] — line charts (throughput, goodput, TTFT CDF, busy timeline) as SVG.
//! * [`deploy`] — a chosen deployment as launch files for vLLM, SGLang and
//!   NVIDIA Dynamo, with a benchmark script and the simulator's prediction
//!   for each engine's approximation of it.
//!
//! `easerve-workload` holds what goes into one run and what comes out of it;
//! this crate holds what is made of many.
#![warn(missing_docs, unreachable_pub)]

pub mod demand;
pub mod deploy;
pub mod plot;
pub mod reproduce;
pub mod sweep;
