//! easerve's scheduler core: every scheduling decision of an Encode → Prefill →
//! Decode (EPD) serving deployment, shared by the simulator (`easerve-sim`) and
//! the real executor.
//!
//! This crate does **not** do I/O, has **no clock** of its own, starts **no
//! threads** and runs **no async** code. Callers pass the current time `now`
//! (seconds since the start of the run, `f64`, the one time unit of easerve) and
//! get back decisions and, where a policy wants to be woken, the time to wake it
//! (`poll_timeout`). The simulator turns a wake-up into an event; the executor
//! into a timer. A spurious wake-up is always a no-op.
//!
//! Pieces, in the order a request meets them:
//!
//! * [`Request`] — one multimodal request and its [`RequestRecord`] (lifecycle times).
//! * [`cache`] — content-keyed reuse: a request's [`Content`], the KV
//!   blocks' hash chain and the encoder cache's LRU directory.
//! * [`Allocation`] / [`Deployment`] — the paper's `2E(TP1)+1P(TP2)+1D(TP4)` plus
//!   the runtime knobs `B` (encode batch bound) and `s` (offload ratio).
//! * [`System`] — the serving systems (`easerve`, `passthrough`,
//!   `aggregated`, `epd-serve`, `hydrainfer`), each a policy set applied to a
//!   [`Deployment`] plus the [`Mechanisms`] it adds to the controller.
//! * [`LeastOutstanding`] — placement across replicas of one stage.
//! * [`Batcher`] — when an encode worker dispatches a micro-batch
//!   (`Immediate`, `FixedTimeout`, `QueueLength`, `PoissonGap`).
//! * [`Router`] — where each request's prefill runs (deficit counter, plus the
//!   `Random` and `Windowed` ablation baselines).
//! * [`SmSplit`] — how an encode GPU's SMs are shared with a co-located prefill worker.
//! * [`PrefillQueue`] — prefill batching under a token budget (chunked or not).
//! * [`StepBudgets`] — HydraInfer's image and token budgets from a TPOT SLO.
//! * [`DecodeScheduler`] / [`KvBlocks`] — continuous batching with paged KV-block accounting.
//! * [`Topology`] — where each worker runs: GPUs, labels, local-prefill groups,
//!   built once from the allocation for the controller, both drivers and the report.
//! * [`Resolution`] — a deployment resolved into its controller's
//!   configuration: what each system means (its workers — EPD stages or
//!   aggregated replicas — its encode policies and mechanisms), from the
//!   numbers a scenario's cost model supplies.
//! * [`Controller`] — the orchestration of one run as a state machine in the
//!   shape of quinn-proto's `Connection`: [`Event`]s in (`handle`,
//!   `handle_timeout`), [`Command`]s and an optional [`Decision`] log out
//!   (`poll_command`, `poll_timeout`); the simulator, `harness::Cluster`,
//!   `exec` and `serve` are its drivers. Its module doc gives the call order.
//! * [`driver`] — that call order in one place, for every driver: the
//!   [`Driver`] trait (what is due, what a command does) and [`driver::instant`]
//!   (one instant in the contract's order), [`driver::step`] for a driver on
//!   a virtual clock; the bookkeeping drivers share beside it: [`Liveness`]
//!   (which workers died), [`SerialLink`] (one transfer at a time) and the
//!   [`ServiceLog`] one driver's workers took, for another to replay.
//! * [`planner`] — changes of the deployment while it runs (a worker
//!   started, drained, moved to another stage; `B` and `s` set), decided
//!   each window by the `static`, `load` or `twin` policy from the
//!   controller's per-stage load, and handed to the controller as
//!   [`Event::Reconfigure`].
//! * `harness` (cargo feature `harness`, off by default; tests turn it on) —
//!   virtual-clock drivers for tests: `harness::Cluster` runs the controller
//!   against fake workers (faults, interruption, share changes), and
//!   `harness::EncodeHarness` the encode policies alone.
//!
//! Where a policy needs a cost (the batcher needs `T_enc(k)`, the SM split needs
//! encode latency per SM level) it takes a closure or a table; this crate never
//! depends on a cost model.
#![warn(missing_docs, unreachable_pub)]

mod allocation;
pub mod cache;
pub mod cluster;
pub mod controller;
pub mod cpu;
mod deployment;
pub mod driver;
#[cfg(feature = "harness")]
pub mod harness;
pub mod limits;
mod mintree;
mod placement;
pub mod planner;
mod policy;
mod prefill;
mod request;
mod resolve;
mod system;
mod topology;

pub use allocation::{Allocation, AllocationError, StagePool, MAX_TERM};
pub use cache::{
    CacheConfig, CacheCounters, CacheRouting, ChainKey, Content, ContentItem, ContentParts,
    EncoderCache, EncoderCacheConfig, EncoderStoreConfig, ItemOp, Lru, Piece, PrefixCache,
    PrefixCacheConfig, PrefixOp, Segment, StoreCounters, StoreLink,
};
pub use cluster::{NodeGroup, Place, PlacementError};
pub use controller::{
    Backoff, Change, Command, Controller, ControllerConfig, ControllerCounters, Decision,
    EnvelopeId, Event, Outage, StageLoad, SupervisionCounters, WorkerRef, TIME_SLICE_SHARE,
};
pub use deployment::{Deployment, DispatchPolicy, RouterPolicy, SmPolicy};
pub use driver::{Driver, Liveness, SerialLink, ServiceLog, VirtualClock};
pub use limits::{LimitExceeded, LimitKind, Limits};
pub use placement::LeastOutstanding;
pub use policy::budget;
pub use policy::{
    largest_within, Batcher, BatcherParams, DecodeRunProgress, DecodeScheduler, DecodeSeq,
    KvBlocks, RateEstimate, RateEstimator, Route, Router, SmSplit, SmTable, StepBudgets,
    DEFAULT_SM_EPSILON, DEFAULT_SM_LEVELS, MIN_SM_SHARE, RATE_WINDOW,
};
pub use prefill::{PrefillItem, PrefillQueue};
pub use request::{Abort, Items, MmItem, Modality, Request, RequestId, RequestRecord, Stamp};
pub use resolve::Resolution;
pub use system::{EncodePlacement, Mechanisms, System, UnknownSystem};
pub use topology::{Topology, Worker};
