//! What the controller hears: the [`Event`]s a driver hands to
//! [`Controller::handle`](super::Controller::handle), and the names they use
//! for workers ([`WorkerRef`]) and embeddings envelopes ([`EnvelopeId`]).

use crate::{Abort, RequestId};
use serde::{Deserialize, Serialize};

/// A stage's worker, as the controller names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WorkerRef {
    /// Encode worker `i` (`E{i}`).
    Encode(usize),
    /// Prefill worker `i`: remote workers first (`P{i}`), then local ones
    /// co-located on encode GPUs (`L{i - remote}`).
    Prefill(usize),
    /// Decode worker `i` (`D{i}`).
    Decode(usize),
    /// Aggregated replica `i` (`R{i}`): one engine that runs every stage
    /// ([`ControllerConfig::replicas`](super::ControllerConfig::replicas)).
    Replica(usize),
}

/// One embeddings envelope in flight: a slot index in its low 32 bits and the
/// slot's generation in its high 32 bits, so a stale landing never matches a
/// later envelope in the same slot.
pub type EnvelopeId = u64;

/// Something that happened, reported by the driver with [`Controller::handle`](super::Controller::handle).
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Request `id` arrived (open loop, at its scheduled time).
    Arrival {
        /// Request.
        id: RequestId,
    },
    /// Encode worker `worker`'s pass finished its host phase (the fixed
    /// per-pass overhead and preprocessing) and now holds the GPU's SMs.
    EncodeGpuStarted {
        /// Encode worker.
        worker: usize,
    },
    /// Encode worker `worker` finished its pass.
    EncodeDone {
        /// Encode worker.
        worker: usize,
    },
    /// An embeddings envelope is held by its prefill worker.
    EmbeddingsLanded {
        /// The envelope ([`Command::Embeddings`](super::Command::Embeddings)).
        envelope: EnvelopeId,
        /// When it left the encode worker (after waiting for the link), seconds.
        sent_at: f64,
    },
    /// Prefill worker `worker` finished its batch (first tokens emitted).
    PrefillDone {
        /// Prefill worker.
        worker: usize,
    },
    /// Request `id`'s KV cache is held by the decode worker it was sent to.
    KvLanded {
        /// Request.
        id: RequestId,
        /// When it left the prefill worker (after waiting for the link), seconds.
        sent_at: f64,
    },
    /// Decode worker `worker` ended its run ([`Command::DecodeRun`](super::Command::DecodeRun)) after
    /// `steps` iterations: all of them, or fewer when it was told to yield
    /// ([`Command::DecodeYield`](super::Command::DecodeYield)). A driver may end a run earlier still (the
    /// controller then starts the next at once): `harness::Cluster` does, to
    /// check runs against one decision per iteration.
    DecodeRunDone {
        /// Decode worker.
        worker: usize,
        /// Iterations run, at least 1 and at most the run's `steps`.
        steps: u64,
    },
    /// Request `id`'s media were preprocessed in the server's front end
    /// ([`Command::FrontEndPreprocess`](super::Command::FrontEndPreprocess)):
    /// it can be scheduled on a replica.
    Preprocessed {
        /// Request.
        id: RequestId,
    },
    /// Replica `replica` ended its iteration
    /// ([`Command::ReplicaStep`](super::Command::ReplicaStep)): the requests
    /// it admitted have their first token, and every running sequence one
    /// more token.
    ReplicaStepDone {
        /// Replica.
        replica: usize,
        /// When the iteration's inline encode ended and its prefill began,
        /// seconds (the iteration's start when it encoded nothing).
        prefill_start: f64,
    },
    /// A worker died (it exited, was killed, stopped answering heartbeats,
    /// or its connection broke). It leaves placement and routing; the
    /// requests whose state died with it fail with `reason`, the others go to
    /// a live worker of its stage (per stage: `supervision.rs`). Under
    /// [`Controller::supervise`](super::Controller::supervise) a
    /// [`Command::Restart`](super::Command::Restart) follows. Reported again
    /// for a dead worker, it is a restart that failed (the new process died
    /// before it was ready): another restart, after a longer backoff.
    WorkerFailed {
        /// The worker.
        worker: WorkerRef,
        /// Why.
        reason: String,
    },
    /// A planner changes the deployment ([`Change`](super::Change)): start
    /// a worker, drain one (and start another on its GPUs), set `B` or `s`.
    Reconfigure {
        /// The change.
        change: super::Change,
    },
    /// Worker `worker`'s process has loaded its model and takes work: one
    /// a planner started ([`Command::LoadWorker`](super::Command::LoadWorker))
    /// or a dead worker restarted ([`Command::Restart`](super::Command::Restart),
    /// back empty). The controller knows which it asked for; a driver only
    /// says that the model is loaded.
    WorkerLoaded {
        /// The worker.
        worker: WorkerRef,
    },
    /// Request `id` is no longer wanted (its client left, or its deadline
    /// passed; the controller raises deadlines itself from its timer): what
    /// has not started is cancelled, what runs stops at its next step
    /// boundary (the end of the pass or prefill batch in flight, the decode
    /// iteration in progress), and its KV blocks are freed
    /// ([`Command::Release`](super::Command::Release)). A request already at
    /// an end is left as it is.
    Abort {
        /// Request.
        id: RequestId,
        /// Why.
        reason: Abort,
    },
    /// The run is cut short (Ctrl-C or a deadline): every request not at an
    /// end yet, arrived or not, fails with `reason`; nothing more starts.
    Interrupt {
        /// Why.
        reason: String,
    },
}
