//! easerve's digital twin: a deterministic discrete-event simulator of an
//! Encode → Prefill → Decode cluster. It is a driver of the one
//! `easerve_sched::Controller` the real executor also drives: every
//! scheduling decision is the controller's, and this crate adds the physics,
//! with stage costs from `easerve-calib`.
//!
//! # Reading guide
//! 1. `event.rs` — the event queue: `(time, named priority, sequence)` order.
//! 2. `engine.rs` — the driver (an `easerve_sched::Driver`: its loop is
//!    `easerve_sched::driver::run`, the call order every driver shares): what
//!    is due when, and what the hardware does with each of the controller's
//!    commands (the host and GPU phases of an encode pass, local
//!    prefill re-rated when its SM share changes, bandwidth interference and
//!    the time-slicing penalty, serialised links, decode runs priced ahead in
//!    chunks with only their ends queued, injected faults), GPU meters, the
//!    timeline; `engine/replica.rs` — the aggregated system's replicas (an
//!    iteration that encodes, prefills and decodes); `engine/cores.rs` — on
//!    the `cpu` device, the one host's cores shared by its busy workers.
//! 3. `capacity.rs` and `explain.rs` — per-stage capacities and the report's
//!    explanation (offered load against capacity).
//! 4. `easerve-workload`'s `report.rs` — how records become the report.
//!
//! # Example
//! ```
//! use easerve_workload::scenario::{Overrides, Scenario, ScenarioFile};
//! let text = r#"
//! [model]
//! preset = "tiny-vit-lm"
//! [cluster]
//! gpu = "h100-sxm"
//! gpus = 3
//! [deployment]
//! allocation = "1E(TP1)+1P(TP1)+1D(TP1)"
//! batch = 4
//! offload = 1.0
//! [workload]
//! requests = 50
//! rate = 2.0
//! modality = "image"
//! input_len = 32
//! output_len = 16
//! [workload.image]
//! buckets = [{ height = 224, width = 224, probability = 1.0 }]
//! "#;
//! let raw = ScenarioFile::parse(text, "inline.toml").unwrap();
//! let sc = Scenario::validate(raw, "inline.toml", "inline").unwrap();
//! let out = easerve_sim::simulate(&sc);
//! assert_eq!(out.report.completed, 50);
//! ```
//!
//! Same scenario and seed ⇒ identical report: one master seed, named RNG
//! streams (`easerve_workload::rng`), and FIFO tie-breaking of simultaneous events.
#![warn(missing_docs, unreachable_pub)]

pub mod capacity;
mod engine;
mod event;
mod explain;
mod meter;
mod output;
mod timeline;
mod verdict;

pub use engine::{
    reuse_report, scenario_cost, simulate, simulate_with, ServiceLog, SimOptions, SimOutput,
    SimTwin,
};
pub use verdict::{name_bottleneck, typical_of};

#[cfg(test)]
mod invariants;
