//! easerve's digital twin: a deterministic discrete-event simulator of an
//! Encode → Prefill → Decode cluster, driven by the same scheduler core
//! (`easerve-sched`) the real executor uses, with stage costs from
//! `easerve-calib`.
//!
//! # Reading guide
//! 1. `event.rs` — the event queue: `(time, named priority, sequence)` order.
//! 2. `engine.rs` — the cluster: encode workers with their batchers, the
//!    router, local and remote prefill workers (local prefill shares the encode
//!    GPU's SMs and is re-rated whenever the split changes), decode workers
//!    with continuous batching, transfers over the GPU link.
//! 3. `easerve-workload`'s `report.rs` — how records become the report.
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

mod aggregated;
pub mod capacity;
mod engine;
mod event;
mod explain;
mod meter;
mod output;
mod timeline;

pub use engine::{scenario_cost, simulate, simulate_with, ServiceLog, SimOptions, SimOutput};

#[cfg(test)]
mod invariants;
