//! HydraInfer's stage-level batching (Dong et al., 2025): an instance's step
//! runs an image batch and a fill batch together, each under its budget
//! (`hydrainfer/engine/scheduler.py`; the budgets are the batch bound B and
//! the prefill token budget, [`crate::StepBudgets`]).
//!
//! * Lockstep ([`crate::Mechanisms::lockstep`]): on an EP instance the
//!   encode workers and the local prefill worker that share GPUs start their
//!   pass and their batch together, and the next step starts only when all
//!   of them are idle — the instance launches the image batch on its own
//!   CUDA stream beside the fill batch and waits for both
//!   (`hydrainfer/engine/executor.py`, `MultiStreamsDecorator`).
//! * Chunked prefill ([`crate::Mechanisms::chunked_prefill`]): a fill batch
//!   takes the part of the next prompt that fills its token budget
//!   ([`crate::PrefillQueue::chunked`]); the request's first token and KV
//!   cache come with its last chunk ([`Decision::PrefillChunk`] logs each
//!   partial one).
//!
//! HydraInfer orders a step decode first, then (chunked) prefill, then
//! encode under its own image budget. In the forms modelled here (E+P+D and
//! EP+D) no instance both decodes and prefills, so the order decides nothing
//! beyond the budgets.

use super::{Controller, Decision};
use crate::PrefillItem;

impl Controller {
    /// With lockstep steps: the local prefill worker whose instance encode
    /// worker `w` belongs to.
    pub(super) fn step_group_of_encode(&self, w: usize) -> Option<usize> {
        if self.mechanisms.lockstep {
            self.encode[w].local
        } else {
            None
        }
    }

    /// With lockstep steps: whether prefill worker `p` is a local one, whose
    /// batches start with its instance's steps.
    pub(super) fn step_group_of_prefill(&self, p: usize) -> bool {
        self.mechanisms.lockstep && self.prefill[p].local
    }

    /// Start the next step of the instance of local prefill worker `p` if
    /// every member is idle: each encode worker's pass (if its batcher says
    /// go) and the prefill worker's batch (if it has work), together.
    pub(super) fn try_step(&mut self, now: f64, p: usize) {
        let members = &self.prefill[p].encode_workers;
        let busy = self.prefill[p].busy || members.iter().any(|&w| self.encode[w].busy);
        if busy {
            return;
        }
        for k in 0..self.prefill[p].encode_workers.len() {
            let w = self.prefill[p].encode_workers[k];
            self.dispatch_now(now, w);
        }
        self.prefill_now(now, p);
    }

    /// Log the chunk a batch of prefill worker `p` ends with, if the rest of
    /// its prompt waits for the next batch.
    pub(super) fn note_chunk(&mut self, now: f64, p: usize, items: &[PrefillItem]) {
        let Some(last) = items.last().copied() else {
            return;
        };
        if self.is_chunk(p, last.id) {
            let rest = self.prefill[p].queue.queued_tokens();
            self.decide(|| Decision::PrefillChunk {
                at: now,
                worker: p,
                id: last.id,
                tokens: last.tokens,
                queued_tokens: rest,
            });
        }
    }

    /// Whether request `id`'s part in prefill worker `p`'s batch was a chunk:
    /// the rest of its prompt is first in line there.
    pub(super) fn is_chunk(&self, p: usize, id: crate::RequestId) -> bool {
        self.mechanisms.chunked_prefill && self.prefill[p].queue.holds_rest_of(id)
    }
}
