//! A deployment: the allocation plus the runtime knobs of EAServe.

use crate::Allocation;
use serde::{Deserialize, Serialize};
use std::fmt;

/// When an encode worker dispatches a micro-batch (EAServe §3.2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum DispatchPolicy {
    /// One request per pass, dispatched as soon as the encoder is free: the
    /// pass-through baseline of EPD frameworks such as Dynamo.
    Immediate,
    /// Dispatch when `B` requests are queued or the oldest has waited `timeout_s`.
    FixedTimeout {
        /// Seconds the oldest queued request may wait.
        timeout_s: f64,
    },
    /// Dispatch when `k` requests are queued (or `B`, whichever is smaller), with
    /// a max-age safety valve so a partial batch at the end of a burst is not
    /// held for ever.
    QueueLength {
        /// Queue length that triggers a dispatch.
        k: usize,
        /// Oldest-request age that forces a dispatch; `None` = `T_enc(B)`.
        max_age_s: Option<f64>,
    },
    /// The load-adaptive Poisson-gap rule (see [`crate::Batcher`]).
    PoissonGap {
        /// Quantile of the exponential gap used as the threshold (default 0.9).
        q: f64,
        /// Oldest-request age that forces a dispatch; `None` = `T_enc(B)`.
        max_age_s: Option<f64>,
        /// Initial arrival-rate estimate (requests/s) for this worker before
        /// enough gaps have been seen; `None` = dispatch at once until then.
        rate_hint: Option<f64>,
    },
}

impl DispatchPolicy {
    /// The Poisson-gap rule with its defaults (`q = 0.9`, `max_age = T_enc(B)`).
    pub fn poisson_gap() -> Self {
        DispatchPolicy::PoissonGap {
            q: 0.9,
            max_age_s: None,
            rate_hint: None,
        }
    }
}

impl fmt::Display for DispatchPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DispatchPolicy::Immediate => write!(f, "immediate"),
            DispatchPolicy::FixedTimeout { timeout_s } => write!(f, "fixed-timeout:{timeout_s}"),
            DispatchPolicy::QueueLength { k, .. } => write!(f, "queue-length:{k}"),
            DispatchPolicy::PoissonGap { q, .. } => write!(f, "poisson-gap(q={q})"),
        }
    }
}

/// How requests are split between remote and local prefill (EAServe §3.3).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum RouterPolicy {
    /// The deficit counter: exact long-run ratio, bounded runs.
    Deficit,
    /// Each request goes remote with probability `s` (ablation baseline).
    Random {
        /// Seed of this router's RNG stream.
        seed: u64,
    },
    /// The first `⌊s·W⌋` of every `W` requests go remote (ablation baseline).
    Windowed {
        /// Window length `W` in requests.
        window: u32,
    },
}

impl fmt::Display for RouterPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouterPolicy::Deficit => write!(f, "deficit"),
            RouterPolicy::Random { .. } => write!(f, "random"),
            RouterPolicy::Windowed { window } => write!(f, "windowed:{window}"),
        }
    }
}

/// How an encode GPU's SMs are shared with a co-located local prefill worker
/// (EAServe §3.4).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum SmPolicy {
    /// No partitioning: the default CUDA time-slicing; both workers slow down.
    None,
    /// A fixed share `f` of the SMs for encode, `1 − f` for local prefill.
    Static(f64),
    /// Per micro-batch, the smallest profiled SM level that keeps encode latency
    /// within `(1+ε)` of exclusive access; local prefill takes the rest.
    Dynamic,
}

impl fmt::Display for SmPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SmPolicy::None => write!(f, "none"),
            SmPolicy::Static(x) => write!(f, "static:{x}"),
            SmPolicy::Dynamic => write!(f, "dynamic"),
        }
    }
}

/// `Deployment = (Allocation, B, s, dispatch policy, SM policy)`, plus the router
/// that realises `s`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Deployment {
    /// GPUs per stage.
    pub allocation: Allocation,
    /// Encode micro-batch bound `B` (≥ 1).
    pub max_batch: usize,
    /// Offload ratio `s ∈ [0, 1]`: the fraction of requests whose prefill runs on
    /// a remote prefill worker; the rest run on local prefill workers co-located
    /// on the encode GPUs.
    pub offload: f64,
    /// Encode dispatch rule.
    pub dispatch: DispatchPolicy,
    /// Remote/local routing rule.
    pub router: RouterPolicy,
    /// SM sharing on encode GPUs hosting a local prefill worker.
    pub sm_policy: SmPolicy,
}

impl Deployment {
    /// Whether local prefill workers are co-located on the encode GPUs (`s < 1`).
    pub fn has_local_prefill(&self) -> bool {
        self.offload < 1.0 && self.allocation.encode.workers > 0
    }
}

impl fmt::Display for Deployment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} B={} s={} dispatch={} router={} sm={}",
            self.allocation,
            self.max_batch,
            self.offload,
            self.dispatch,
            self.router,
            self.sm_policy
        )
    }
}
