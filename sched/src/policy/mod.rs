//! The per-stage policies the [`Controller`](crate::Controller) consults, each
//! a small state machine of its own that takes `now` and, where it needs a
//! cost, a closure or a table:
//!
//! * `batcher.rs` — encode micro-batching: when an encode worker turns its
//!   queue into a micro-batch ([`Batcher`]: `Immediate`, `FixedTimeout`,
//!   `QueueLength`, and `PoissonGap` with its arrival-rate estimate,
//!   [`RateEstimator`]).
//! * `router.rs` — remote/local prefill routing: the deficit counter that
//!   keeps the remote share at the offload ratio `s`, and the `Random` and
//!   `Windowed` ablation baselines ([`Router`], [`Route`]).
//! * `smsplit.rs` — SM partitioning between an encode pass and its co-located
//!   prefill worker: static shares or the dynamic level table ([`SmSplit`],
//!   [`SmTable`]).
//! * `decode.rs` — decode scheduling: continuous batching with paged KV-block
//!   accounting, run by run ([`DecodeScheduler`], [`KvBlocks`]).
//! * `budget.rs` — HydraInfer's step budgets: the most images and tokens one
//!   step takes, the largest whose step fits a TPOT SLO ([`StepBudgets`]).

mod batcher;
pub mod budget;
mod decode;
mod router;
mod smsplit;

pub use batcher::{Batcher, BatcherParams, RateEstimate, RateEstimator, RATE_WINDOW};
pub use budget::{largest_within, StepBudgets};
pub use decode::{DecodeRunProgress, DecodeScheduler, DecodeSeq, KvBlocks};
pub use router::{Route, Router};
pub use smsplit::{SmSplit, SmTable, DEFAULT_SM_EPSILON, DEFAULT_SM_LEVELS, MIN_SM_SHARE};
