//! The serving systems a deployment can run under, each a set of the
//! controller's policies.

use crate::{Deployment, DispatchPolicy};

/// Which serving system runs a deployment's allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum System {
    /// The deployment as given: adaptive micro-batching with its B, its s,
    /// its dispatch, router and SM policies.
    Easerve,
    /// How a pass-through EPD framework (e.g. Dynamo) runs the same allocation:
    /// encode one request per pass (B = 1, `immediate`), every prefill remote (s = 1).
    Passthrough,
    /// How a single-engine server (e.g. vLLM) runs the cluster: replicas of TP
    /// GPUs (`GPUs / TP` of them, TP the smallest degree at which the LLM, its
    /// encoder and one longest sequence fit), each running encode inline before
    /// prefill, with continuous batching. The allocation is ignored.
    Aggregated,
}

impl System {
    /// The name used in scenarios and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            System::Easerve => "easerve",
            System::Passthrough => "passthrough",
            System::Aggregated => "aggregated",
        }
    }

    /// The deployment this system runs when given `d`: its policy set applied.
    /// `passthrough` replaces the batching and routing knobs (B = 1, the
    /// `immediate` dispatch, s = 1) and keeps the allocation, router and SM
    /// policy; `easerve` and `aggregated` keep `d` (the aggregated baseline
    /// reads only the cluster from it).
    pub fn deployment(self, d: Deployment) -> Deployment {
        match self {
            System::Passthrough => Deployment {
                max_batch: 1,
                dispatch: DispatchPolicy::Immediate,
                offload: 1.0,
                ..d
            },
            System::Easerve | System::Aggregated => d,
        }
    }
}

impl std::fmt::Display for System {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A system name that is none of [`System`]'s.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown system `{0}`; allowed: easerve, passthrough, aggregated")]
pub struct UnknownSystem(pub String);

impl std::str::FromStr for System {
    type Err = UnknownSystem;
    fn from_str(s: &str) -> Result<Self, UnknownSystem> {
        match s {
            "easerve" => Ok(System::Easerve),
            "passthrough" => Ok(System::Passthrough),
            "aggregated" => Ok(System::Aggregated),
            _ => Err(UnknownSystem(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passthrough_replaces_the_batching_knobs_and_keeps_the_rest() {
        let d = Deployment {
            allocation: "2E(TP1)+1P(TP2)+1D(TP4)".parse().unwrap(),
            max_batch: 8,
            offload: 0.6,
            dispatch: DispatchPolicy::poisson_gap(),
            router: crate::RouterPolicy::Deficit,
            sm_policy: crate::SmPolicy::Dynamic,
        };
        let p = System::Passthrough.deployment(d.clone());
        assert_eq!((p.max_batch, p.offload), (1, 1.0));
        assert_eq!(p.dispatch, DispatchPolicy::Immediate);
        assert_eq!(p.allocation, d.allocation);
        assert_eq!(System::Easerve.deployment(d.clone()), d);
        for s in [System::Easerve, System::Passthrough, System::Aggregated] {
            assert_eq!(s.name().parse::<System>(), Ok(s));
        }
        assert!("vllm"
            .parse::<System>()
            .unwrap_err()
            .to_string()
            .contains("allowed"));
    }
}
