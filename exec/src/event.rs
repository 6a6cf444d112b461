//! The executor's events and the one place they reach the [`Controller`];
//! the real event loop ([`crate::run`]) and the virtual-clock one
//! ([`crate::virtual_clock`]) both go through [`apply`].

use easerve_sched::{Controller, RequestId, WorkerRef};

/// Something that happened during a run.
#[derive(Clone, Debug, PartialEq)]
pub enum ExecEvent {
    /// Request arrives (open loop, at its scheduled time).
    Arrival(RequestId),
    /// The batcher timer of an encode worker fired.
    Timer(usize),
    /// An encode worker finished its pass.
    EncodeDone(usize),
    /// An embeddings envelope is held by prefill worker `to`; `from` is the
    /// sending encode worker for a remote envelope.
    EmbeddingsLanded {
        /// Prefill worker.
        to: usize,
        /// Requests.
        ids: Vec<RequestId>,
        /// Encode worker, for a remote envelope.
        from: Option<usize>,
    },
    /// A prefill worker finished its batch.
    PrefillDone(usize),
    /// A KV cache is held by decode worker `to`.
    KvLanded {
        /// Decode worker.
        to: usize,
        /// Request.
        id: RequestId,
    },
    /// A decode worker finished an iteration.
    DecodeStepDone(usize),
    /// A worker died.
    WorkerFailed(WorkerRef, String),
}

/// Hand `ev`, which happened at `now` (seconds since the run started), to the
/// controller. Its commands are then in [`Controller::take_commands`].
pub fn apply(ctrl: &mut Controller, now: f64, ev: ExecEvent) {
    match ev {
        ExecEvent::Arrival(id) => ctrl.on_arrival(now, id),
        ExecEvent::Timer(w) => ctrl.on_timer(now, w),
        ExecEvent::EncodeDone(w) => ctrl.on_encode_done(now, w),
        ExecEvent::EmbeddingsLanded { to, ids, from } => ctrl.on_embeddings(now, to, ids, from),
        ExecEvent::PrefillDone(p) => ctrl.on_prefill_done(now, p),
        ExecEvent::KvLanded { to, id } => ctrl.on_kv(now, to, id),
        ExecEvent::DecodeStepDone(d) => ctrl.on_decode_step(now, d),
        ExecEvent::WorkerFailed(w, reason) => ctrl.on_worker_failed(w, &reason),
    }
}
