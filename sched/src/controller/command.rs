//! What the controller says: the [`Command`]s its driver drains with
//! [`Controller::poll_command`](super::Controller::poll_command), and the
//! [`Decision`] log ([`Controller::decisions`](super::Controller::decisions)).

use super::{EnvelopeId, WorkerRef};
use crate::{Abort, RequestId};
use serde::{Deserialize, Serialize};

/// One scheduling decision, in the order it was taken. Two drivers that feed
/// the same events at the same times get the same log (the simulator and
/// `harness::Cluster` are checked to, `tests/drivers_agree.rs`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Decision {
    /// Arrival `id` was turned away: the admission queue was full, or (with
    /// a reason) it asks for more than the limits allow.
    Reject {
        /// Request.
        id: RequestId,
        /// The limit it is over ([`crate::LimitExceeded`]'s message); absent
        /// for a full admission queue.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        refused: Option<String>,
    },
    /// Arrival `id` goes to encode worker `worker` (placement).
    PlaceEncode {
        /// Request.
        id: RequestId,
        /// Encode worker.
        worker: usize,
    },
    /// Request `id`'s items were looked up in encode worker `worker`'s
    /// encoder cache when it was placed there: `hits` of its `items` are
    /// held (their encode is skipped). Only with the encoder cache on.
    EncoderCache {
        /// Request.
        id: RequestId,
        /// Encode worker.
        worker: usize,
        /// Items of the request.
        items: usize,
        /// Of which held by the worker's cache.
        hits: usize,
    },
    /// Request `id`'s items that its encode worker's own cache missed
    /// (`items`; all of them with that cache off) were looked up in the
    /// shared encoder-output store when it was placed on encode worker
    /// `worker`: `hits` are fetched from it, not encoded. Only with the
    /// store on.
    EncoderStore {
        /// Request.
        id: RequestId,
        /// Encode worker.
        worker: usize,
        /// Items looked up in the store.
        items: usize,
        /// Of which held there.
        hits: usize,
    },
    /// Request `id`'s pass ended and `items` of its encoded items were
    /// written to the shared store (those it did not hold yet). Only with
    /// the store on.
    StoreWrite {
        /// Request.
        id: RequestId,
        /// Items written.
        items: usize,
    },
    /// Request `id`'s prompt was looked up in prefill worker `worker`'s
    /// prefix cache when it was queued there: its first `hit_tokens` of
    /// `tokens` are cached KV blocks (their prefill is skipped). Only with
    /// the prefix cache on.
    PrefixCache {
        /// Request.
        id: RequestId,
        /// Prefill worker.
        worker: usize,
        /// Prompt tokens.
        tokens: u64,
        /// Of which cached.
        hit_tokens: u64,
    },
    /// Encode worker `worker` starts a micro-batch of `ids` at SM share `sm_share`.
    Dispatch {
        /// Time of the decision.
        at: f64,
        /// Encode worker.
        worker: usize,
        /// Requests, FCFS.
        ids: Vec<RequestId>,
        /// SM share of the pass (1 without a co-located prefill worker).
        sm_share: f64,
    },
    /// Request `id`'s prefill goes to prefill worker `worker` (deficit router
    /// and placement).
    Route {
        /// Request.
        id: RequestId,
        /// Prefill worker (remote first, then local).
        worker: usize,
        /// Whether it stays on the encode GPU's local prefill worker.
        local: bool,
    },
    /// Prefill worker `worker` starts a batch of `ids` at SM share `sm_share`.
    Prefill {
        /// Time of the decision.
        at: f64,
        /// Prefill worker.
        worker: usize,
        /// Requests in the batch.
        ids: Vec<RequestId>,
        /// SM share (1 for a remote worker; for a local one, what the encode
        /// pass on its GPU leaves).
        sm_share: f64,
    },
    /// Prefill worker `worker`'s batch ends with a chunk of request `id`'s
    /// prompt, `tokens` of it (chunked prefill); the rest waits first in
    /// line, with `queued_tokens` tokens queued there in all.
    PrefillChunk {
        /// Time of the decision.
        at: f64,
        /// Prefill worker.
        worker: usize,
        /// Request.
        id: RequestId,
        /// Tokens of its prompt in this batch.
        tokens: u64,
        /// Tokens queued at the worker after this batch (the rest included).
        queued_tokens: u64,
    },
    /// The running batch of local prefill worker `worker` changes SM share
    /// because an encode pass on its GPU entered or left its GPU phase.
    Share {
        /// Time of the decision.
        at: f64,
        /// Prefill worker.
        worker: usize,
        /// The new share.
        sm_share: f64,
    },
    /// Item `item` of request `id` (intra-request parallelism: one shard
    /// per item) goes to encode worker `worker`.
    PlaceShard {
        /// Request.
        id: RequestId,
        /// Index of the item in the request's items.
        item: u32,
        /// Encode worker.
        worker: usize,
    },
    /// Request `id`'s KV cache goes to decode worker `worker`.
    PlaceDecode {
        /// Request.
        id: RequestId,
        /// Decode worker.
        worker: usize,
    },
    /// Decode worker `worker` runs up to `steps` iterations over `batch`
    /// sequences holding `context` tokens at the first (`context + i · batch`
    /// at the `i`-th): the iterations until a sequence finishes.
    DecodeRun {
        /// Time of the decision.
        at: f64,
        /// Decode worker.
        worker: usize,
        /// Running sequences.
        batch: u64,
        /// Total context tokens at the first iteration.
        context: u64,
        /// Iterations until the first sequence generates its last token.
        steps: u64,
    },
    /// Decode worker `worker`'s run ends after the iteration in progress: a
    /// KV cache landed that can join the batch now.
    DecodeYield {
        /// Time of the decision.
        at: f64,
        /// Decode worker.
        worker: usize,
    },
    /// Preprocessed request `id` waits at aggregated replica `replica`
    /// (least outstanding work: prompt plus output tokens).
    PlaceReplica {
        /// Request.
        id: RequestId,
        /// Replica.
        replica: usize,
    },
    /// Replica `replica` starts an iteration: it encodes and prefills the
    /// requests `ids` it admits now and advances `batch` running sequences
    /// (those admitted included) holding `context` tokens by one token.
    ReplicaStep {
        /// Time of the decision.
        at: f64,
        /// Replica.
        replica: usize,
        /// Requests admitted in this iteration, in admission order.
        ids: Vec<RequestId>,
        /// Running sequences.
        batch: u64,
        /// Their total context tokens.
        context: u64,
    },
    /// A planner's change reached the controller ([`super::Change`]).
    Reconfigure {
        /// Time of the decision.
        at: f64,
        /// The change.
        change: super::Change,
    },
    /// Worker `worker` loaded its model and takes work from now on.
    WorkerReady {
        /// Time of the decision.
        at: f64,
        /// The worker.
        worker: super::WorkerRef,
    },
    /// Worker `worker`, which a planner started, died while it was loading
    /// its model: the change failed. The slot stands by again (no work goes
    /// to it, none is lost: it held none), no restart is asked for, and a
    /// planner may start it again.
    LoadFailed {
        /// Time of the decision.
        at: f64,
        /// The worker.
        worker: super::WorkerRef,
        /// Why it died, as the driver said.
        reason: String,
    },
    /// Draining worker `worker` holds no more work: it is stopped.
    WorkerStopped {
        /// Time of the decision.
        at: f64,
        /// The worker.
        worker: super::WorkerRef,
    },
    /// Dead worker `worker` is to be restarted in `delay_s` seconds, its
    /// `attempt`-th restart since it last completed work (backoff).
    Restart {
        /// Time of the decision.
        at: f64,
        /// The worker.
        worker: WorkerRef,
        /// Restart attempt, from 1.
        attempt: u32,
        /// Seconds until its process starts again.
        delay_s: f64,
    },
    /// Worker `worker` rejoined placement and routing (restarted, its model
    /// loaded).
    Rejoin {
        /// Time of the decision.
        at: f64,
        /// The worker.
        worker: WorkerRef,
    },
    /// Request `id` was aborted ([`crate::Event::Abort`], or its deadline
    /// passed): it leaves every queue, and a decode run holding it yields.
    Abort {
        /// Time of the decision.
        at: f64,
        /// Request.
        id: RequestId,
        /// Why.
        reason: Abort,
    },
    /// Request `id` failed (a worker died, its KV cache can never fit, the run
    /// was interrupted).
    Fail {
        /// Request.
        id: RequestId,
        /// Why.
        reason: String,
    },
}

/// What the controller asks its driver to do. No command owns a vector; see
/// the accessors named on each variant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Command {
    /// Request `id` was placed on encode worker `worker`: start preprocessing
    /// its media on the worker's host threads now, ahead of the pass that will
    /// encode it, while earlier passes hold the GPU (only when
    /// [`ControllerConfig::preprocess_ahead`](super::ControllerConfig::preprocess_ahead) is set). The pass that takes the
    /// request ([`Command::Encode`]) enters its GPU phase once the request's
    /// preprocessing is done; nothing is reported back for this command.
    Preprocess {
        /// Encode worker.
        worker: usize,
        /// Request placed there.
        id: RequestId,
    },
    /// Run an encode pass on encode worker `worker` with SM share `sm_share`
    /// over [`Controller::encode_batch`](super::Controller::encode_batch)`(worker)`; report its GPU phase with
    /// [`Event::EncodeGpuStarted`](super::Event::EncodeGpuStarted) and its end with [`Event::EncodeDone`](super::Event::EncodeDone).
    Encode {
        /// Encode worker.
        worker: usize,
        /// SM (or thread) share for the pass: a fraction in (0, 1].
        sm_share: f64,
    },
    /// Move the embeddings of [`Controller::envelope`](super::Controller::envelope)`(envelope)` from encode
    /// worker `from` to prefill worker `to`; report the landing with
    /// [`Event::EmbeddingsLanded`](super::Event::EmbeddingsLanded). `local` envelopes stay on the encode GPU
    /// (they land at once).
    Embeddings {
        /// The envelope.
        envelope: EnvelopeId,
        /// Encode worker.
        from: usize,
        /// Prefill worker.
        to: usize,
        /// Whether the destination is the co-located local prefill worker.
        local: bool,
    },
    /// Run a prefill batch, [`Controller::prefill_batch`](super::Controller::prefill_batch)`(worker)`, on prefill
    /// worker `worker` at SM share `sm_share`; report [`Event::PrefillDone`](super::Event::PrefillDone).
    Prefill {
        /// Prefill worker.
        worker: usize,
        /// SM share, a fraction in [0, 1] (1 for a remote prefill worker;
        /// under time-slicing ([`Controller::time_sliced`](super::Controller::time_sliced)) a share of time).
        sm_share: f64,
    },
    /// The batch running on local prefill worker `worker` now has SM share
    /// `sm_share` (an encode pass on its GPU entered or left its GPU phase).
    /// The simulator re-rates the batch; the executor applies it at the next
    /// batch.
    PrefillShare {
        /// Prefill worker.
        worker: usize,
        /// The new share.
        sm_share: f64,
    },
    /// Move request `id`'s KV cache from prefill worker `from` to decode
    /// worker `to`; report [`Event::KvLanded`](super::Event::KvLanded).
    Kv {
        /// Prefill worker.
        from: usize,
        /// Decode worker.
        to: usize,
        /// Request.
        id: RequestId,
    },
    /// Run up to `steps` decode iterations on `worker` over its running
    /// sequences ([`Controller::decode_batch`](super::Controller::decode_batch), unchanged through the run),
    /// the `i`-th (from 0) over `context + i · batch` context tokens; report
    /// the end with [`Event::DecodeRunDone`](super::Event::DecodeRunDone). No sequence finishes before the
    /// last iteration, so nothing the controller decides depends on the
    /// iterations in between; a driver may time them one by one (the
    /// executor) or all at once (the simulator).
    DecodeRun {
        /// Decode worker.
        worker: usize,
        /// Running sequences.
        batch: u64,
        /// Their total context tokens at the first iteration.
        context: u64,
        /// Iterations in the run, at least 1.
        steps: u64,
    },
    /// End decode worker `worker`'s run after the iteration in progress (the
    /// first whose end is strictly after now) and report the iterations run
    /// with [`Event::DecodeRunDone`](super::Event::DecodeRunDone): a sequence that can join the batch has
    /// arrived. A run that ends there anyway is unaffected.
    DecodeYield {
        /// Decode worker.
        worker: usize,
    },
    /// Preprocess request `id`'s media in the server's front end, before any
    /// replica can schedule it (the aggregated system); report
    /// [`Event::Preprocessed`](super::Event::Preprocessed).
    FrontEndPreprocess {
        /// Request.
        id: RequestId,
    },
    /// Run one iteration on aggregated replica `replica`: encode the items of
    /// the requests it admits now ([`Controller::replica_admitted`](super::Controller::replica_admitted)),
    /// prefill them (their first tokens), and advance its running sequences
    /// ([`Controller::replica_batch`](super::Controller::replica_batch),
    /// `batch` of them over `context` tokens, the admitted ones included) by
    /// one token; report [`Event::ReplicaStepDone`](super::Event::ReplicaStepDone).
    ReplicaStep {
        /// Replica.
        replica: usize,
        /// Running sequences, those admitted now included.
        batch: u64,
        /// Their total context tokens.
        context: u64,
    },
    /// Load the model of worker `worker`'s stage on its GPUs (a planner
    /// started it, or it takes the GPUs of a worker stopped for a role
    /// change); report [`Event::WorkerLoaded`](super::Event::WorkerLoaded)
    /// once it can take work.
    LoadWorker {
        /// The worker.
        worker: super::WorkerRef,
        /// For a role change, the worker stopped just before
        /// ([`Command::StopWorker`]) whose GPUs it takes: a driver starts it
        /// on that worker's devices once that worker's process has exited.
        /// `None` for a standby slot started on GPUs of its own.
        on: Option<super::WorkerRef>,
    },
    /// Worker `worker` was drained and holds no work: stop it and free its
    /// GPUs. Nothing is reported back.
    StopWorker {
        /// The worker.
        worker: super::WorkerRef,
    },
    /// Start dead worker `worker` again (a new process, its model loaded)
    /// after `delay_s` seconds; report [`Event::WorkerLoaded`](super::Event::WorkerLoaded)
    /// once it is ready, or [`Event::WorkerFailed`](super::Event::WorkerFailed)
    /// again if the new process dies first. Only under
    /// [`Controller::supervise`](super::Controller::supervise).
    Restart {
        /// The worker.
        worker: WorkerRef,
        /// Backoff before the start, seconds ([`Backoff`](super::Backoff)).
        delay_s: f64,
    },
    /// Request `id` was aborted: worker `worker` may drop what it holds for
    /// it (media handed to an encode worker ahead of its pass, embeddings
    /// at a prefill worker). Nothing is reported back.
    Discard {
        /// The worker.
        worker: WorkerRef,
        /// Aborted request.
        id: RequestId,
    },
    /// Request `id` generated its last token, or was aborted: decode worker
    /// `worker` may free its KV cache (an aborted request's cache may still
    /// be on its way there: it is freed when it lands).
    Release {
        /// Decode worker.
        worker: usize,
        /// Finished request.
        id: RequestId,
    },
}
