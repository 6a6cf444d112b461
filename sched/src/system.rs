//! The serving systems a deployment can run under, each a set of the
//! controller's policies: the knobs of the [`Deployment`] it replaces
//! ([`System::deployment`]) and the mechanisms it adds ([`System::mechanisms`]).

use crate::{Deployment, DispatchPolicy, SmPolicy};

/// Which serving system runs a deployment's allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
    /// EPD-Serve (Singh et al., 2025, arXiv 2501.05460; github.com/vbdi/epdserve
    /// at 9b111f7): separate encode, prefill and decode instances (s = 1); each
    /// encode instance takes every waiting request up to its batch size B as
    /// soon as it is free (`epdserve/scheduler_encoding.py`), requests go to
    /// the encode instances round robin, and intra-request parallelism splits
    /// a request's images over them, one shard per image, its prefill waiting
    /// for every shard (`epdserve/engine_encoding.py` `shard_requests`,
    /// `epdserve/scheduler_context.py`).
    EpdServe,
    /// HydraInfer (Dong et al., 2025, arXiv 2505.12658; github.com/dongxianzhe/hydrainfer):
    /// hybrid EPD in the form the allocation names, E+P+D (prefill workers:
    /// s = 1) or EP+D (no prefill workers: prefill on the encode GPUs, s = 0),
    /// with stage-level batching inside an instance under an image budget
    /// (B) and a token budget (chunked prefill) set by the TPOT SLO
    /// (`hydrainfer/engine/scheduler.py`, `hydrainfer/engine/profiler.py`), and
    /// an EP instance's encode on its own CUDA stream beside prefill
    /// (time-sliced sharing, no SM partition; both start each step together,
    /// `hydrainfer/engine/executor.py`).
    HydraInfer,
}

/// Where the controller places encode work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EncodePlacement {
    /// The encode worker with the least encoder tokens outstanding.
    #[default]
    LeastOutstanding,
    /// The next live encode worker in turn (EPD-Serve's `request_allocator`).
    RoundRobin,
}

/// The mechanisms a system adds to the controller beyond the deployment's
/// knobs ([`System::mechanisms`]); the default is easerve's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mechanisms {
    /// How arrivals (or their shards) are placed on encode workers.
    pub encode_placement: EncodePlacement,
    /// Intra-request parallelism: each multimodal item of a request is a
    /// shard of its own, placed, batched and encoded on its own; the
    /// request's prefill waits until every shard's embeddings have landed at
    /// its prefill worker.
    pub split_items: bool,
    /// Chunked prefill: a prefill batch fills its token budget, taking the
    /// part of the next prompt that fits; the rest of that prompt goes first
    /// in the worker's next batch, and its first token comes with its last
    /// chunk.
    pub chunked_prefill: bool,
    /// Stage-level steps on a shared GPU: the encode workers and the local
    /// prefill worker that share GPUs start their passes and batches
    /// together, and the next step starts only when all of them are idle
    /// (HydraInfer's instance step, which waits for the image batch and the
    /// fill batch of its two streams).
    pub lockstep: bool,
}

impl System {
    /// Every system, in the order the command line lists them.
    pub const ALL: [System; 5] = [
        System::Easerve,
        System::Passthrough,
        System::Aggregated,
        System::EpdServe,
        System::HydraInfer,
    ];

    /// The name used in scenarios and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            System::Easerve => "easerve",
            System::Passthrough => "passthrough",
            System::Aggregated => "aggregated",
            System::EpdServe => "epd-serve",
            System::HydraInfer => "hydrainfer",
        }
    }

    /// The deployment this system runs when given `d`: its policy set applied.
    /// `passthrough` replaces the batching and routing knobs (B = 1, the
    /// `immediate` dispatch, s = 1) and keeps the allocation, router and SM
    /// policy; `epd-serve` keeps the allocation and B, dispatches whatever
    /// waits up to B whenever the encoder is free (`queue-length:1`) and sends
    /// every prefill remote (s = 1); `hydrainfer` dispatches the same way,
    /// runs the form its allocation names (s = 1 with prefill workers, else
    /// s = 0 on the encode GPUs) and shares a GPU by time-slicing (`none`);
    /// its B and prefill token budget are its budgets, set from the cost
    /// model when the scenario is validated; `easerve` and `aggregated` keep
    /// `d` (the aggregated baseline reads only the cluster from it).
    pub fn deployment(self, d: Deployment) -> Deployment {
        let greedy = DispatchPolicy::QueueLength {
            k: 1,
            max_age_s: None,
        };
        match self {
            System::Passthrough => Deployment {
                max_batch: 1,
                dispatch: DispatchPolicy::Immediate,
                offload: 1.0,
                ..d
            },
            System::EpdServe => Deployment {
                dispatch: greedy,
                offload: 1.0,
                ..d
            },
            System::HydraInfer => Deployment {
                dispatch: greedy,
                offload: if d.allocation.prefill.workers > 0 {
                    1.0
                } else {
                    0.0
                },
                sm_policy: SmPolicy::None,
                ..d
            },
            System::Easerve | System::Aggregated => d,
        }
    }

    /// The mechanisms this system adds to the controller: EPD-Serve's round
    /// robin placement and intra-request parallelism, HydraInfer's chunked
    /// prefill and lockstep instance steps; none for the others.
    pub fn mechanisms(self) -> Mechanisms {
        match self {
            System::EpdServe => Mechanisms {
                encode_placement: EncodePlacement::RoundRobin,
                split_items: true,
                ..Mechanisms::default()
            },
            System::HydraInfer => Mechanisms {
                chunked_prefill: true,
                lockstep: true,
                ..Mechanisms::default()
            },
            System::Easerve | System::Passthrough | System::Aggregated => Mechanisms::default(),
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
#[error("unknown system `{0}`; allowed: easerve, passthrough, aggregated, epd-serve, hydrainfer")]
pub struct UnknownSystem(pub String);

impl std::str::FromStr for System {
    type Err = UnknownSystem;
    fn from_str(s: &str) -> Result<Self, UnknownSystem> {
        System::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| UnknownSystem(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment() -> Deployment {
        Deployment {
            allocation: "2E(TP1)+1P(TP2)+1D(TP4)".parse().unwrap(),
            max_batch: 8,
            offload: 0.6,
            dispatch: DispatchPolicy::poisson_gap(),
            router: crate::RouterPolicy::Deficit,
            sm_policy: crate::SmPolicy::Dynamic,
        }
    }

    #[test]
    fn passthrough_replaces_the_batching_knobs_and_keeps_the_rest() {
        let d = deployment();
        let p = System::Passthrough.deployment(d.clone());
        assert_eq!((p.max_batch, p.offload), (1, 1.0));
        assert_eq!(p.dispatch, DispatchPolicy::Immediate);
        assert_eq!(p.allocation, d.allocation);
        assert_eq!(System::Easerve.deployment(d.clone()), d);
        for s in System::ALL {
            assert_eq!(s.name().parse::<System>(), Ok(s));
        }
        assert!("vllm"
            .parse::<System>()
            .unwrap_err()
            .to_string()
            .contains("allowed"));
    }

    #[test]
    fn the_baselines_run_their_own_forms() {
        let d = deployment();
        let e = System::EpdServe.deployment(d.clone());
        assert_eq!((e.max_batch, e.offload), (8, 1.0));
        assert!(matches!(
            e.dispatch,
            DispatchPolicy::QueueLength { k: 1, .. }
        ));
        // with prefill workers HydraInfer is E+P+D, without them EP+D
        let h = System::HydraInfer.deployment(d.clone());
        assert_eq!((h.offload, h.sm_policy), (1.0, SmPolicy::None));
        let ep = System::HydraInfer.deployment(Deployment {
            allocation: "4E(TP1)+2D(TP2)".parse().unwrap(),
            ..d
        });
        assert_eq!(ep.offload, 0.0);
        assert!(System::EpdServe.mechanisms().split_items);
        assert!(System::HydraInfer.mechanisms().chunked_prefill);
        assert_eq!(System::Easerve.mechanisms(), Mechanisms::default());
    }
}
