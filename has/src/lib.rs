//! Hybrid Auto Selection (HAS): the offline search of the deployment
//! `PC = (allocation, B, s)` (EAServe §3.1, Algorithm 1).
//!
//! * [`space`] — every feasible allocation of the cluster's GPUs.
//! * [`stage1`] — per-stage capacities, load ratios at the target rate Λ, the
//!   bottleneck-balance score, pruning to the top K, `B_max = ⌈Λ/nE⌉` and
//!   `s* = C_remote/(C_remote + C_local)` with a ±0.2 window.
//! * [`search`] — Stage 2, one TPE study ([`tpe`]) over (survivor, B,
//!   s) seeded with each survivor's analytical optimum and stopped when the
//!   best three are within 1 % or five trials bring no gain, then, where
//!   given, the scenario's own deployment ([`SearchConfig::own`]); plus the
//!   `random`, `coordinate` and `exhaustive` baselines.
//! * [`objective`] — what a search ranks by: goodput at an SLO tier (the
//!   default), throughput or mean TTFT, ties by throughput then mean TTFT.
//! * [`own`] — the baselines' own configuration rules (EPD-Serve's
//!   optimizer, HydraInfer's selection of its form and instances): goodput
//!   at 90 % SLO attainment over a ladder of rates, over the same space.
//! * [`planning`] — capacity planning: the highest rate a cluster sustains
//!   under an SLO tier (bisection on the simulator), the fewest GPUs for a rate.
//! * [`tpe`] — the Tree-structured Parzen Estimator Stage 2 asks (Bergstra
//!   et al., 2011), one univariate optimiser per dimension.
//! * [`trial`] — the [`Trial`] trait: one end-to-end run of a candidate. The
//!   simulator implements it ([`SimTrial`]).
#![warn(missing_docs, unreachable_pub)]

pub mod objective;
pub mod own;
pub mod planning;
pub mod search;
pub mod space;
pub mod stage1;
pub mod tpe;
pub mod trial;

pub use objective::Objective;
pub use search::{
    rule_of, search, search_in, tune, tune_by, tune_for, Method, SearchConfig, StopReason, Study,
    TrialRecord, UnknownMethod, DEFAULT_BUDGET,
};
pub use space::{feasible_allocations, Candidate, CandidateError, FeasibleAllocation};
pub use trial::{Outcome, SimTrial, Trial};
