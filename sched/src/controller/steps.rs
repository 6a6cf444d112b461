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

#[cfg(all(test, feature = "harness"))]
mod tests {
    use crate::harness::{config_for, test_request, Cluster, Service};
    use crate::{Decision, KvBlocks, Mechanisms, PrefillItem, RequestId, SmSplit};

    /// A decode iteration, seconds.
    const STEP_S: f64 = 0.005;
    /// A transfer, seconds a request.
    const LINK_S: f64 = 0.001;

    /// Fixed times: host 10 ms and GPU 30 ms per request of a pass, 10 µs
    /// a prefill token, [`STEP_S`] a decode iteration, [`LINK_S`] a
    /// transfer per request; each pass's and
    /// batch's time is kept, in the order they started.
    #[derive(Default)]
    struct Fixed {
        passes: Vec<f64>,
        batches: Vec<f64>,
    }
    impl Service for Fixed {
        fn encode(&mut self, _: usize, ids: &[RequestId], _: f64) -> (f64, f64) {
            self.passes.push(0.01 + 0.03 * ids.len() as f64);
            (0.01, 0.03 * ids.len() as f64)
        }
        fn prefill(&mut self, _: usize, items: &[PrefillItem], _: f64) -> f64 {
            let t = 1e-5 * items.iter().map(|i| i.tokens).sum::<u64>() as f64;
            self.batches.push(t);
            t
        }
        fn decode(&mut self, _: usize, _: u64, _: u64) -> f64 {
            STEP_S
        }
        fn embeddings(&mut self, _: usize, ids: &[RequestId]) -> f64 {
            LINK_S * ids.len() as f64
        }
        fn kv(&mut self, _: usize, _: RequestId) -> f64 {
            LINK_S
        }
        fn front_end(&mut self, id: RequestId) -> f64 {
            unreachable!("no front end in an EPD deployment (request {id})")
        }
        fn replica_step(&mut self, r: usize, _: &[RequestId], _: u64, _: u64) -> (f64, f64) {
            unreachable!("no replica {r} in an EPD deployment")
        }
    }

    /// An EP instance (one encode worker and its local prefill worker, all
    /// prefill local): with lockstep no pass or batch starts while another
    /// member of the instance is busy, and prompts larger than the 300-token
    /// budget go in chunks whose first token comes with the last.
    #[test]
    fn an_ep_instance_steps_in_lockstep_and_chunks_its_prompts() {
        let alloc: crate::Allocation = "1E(TP1)+1D(TP1)".parse().unwrap();
        let mut cfg = config_for(
            &alloc,
            Some(1),
            SmSplit::Static(1.0),
            KvBlocks::new(1 << 20, 16),
            None,
        );
        cfg.router.1 = 0.0;
        cfg.prefill_token_budget = 300;
        cfg.mechanisms = Mechanisms {
            chunked_prefill: true,
            lockstep: true,
            ..Mechanisms::default()
        };
        let requests = (0..30).map(|i| test_request(i, 0.02 * i as f64)).collect();
        let mut c = Cluster::new(crate::Controller::new(requests, cfg), Fixed::default());
        c.drive();
        assert!(c.ctrl.is_finished());
        let log = c.ctrl.decisions();
        // (start, end) of every pass and every batch, in the order they started
        let spans = |kind: usize, times: &[f64]| -> Vec<(f64, f64)> {
            log.iter()
                .filter_map(|d| match (d, kind) {
                    (Decision::Dispatch { at, .. }, 0) | (Decision::Prefill { at, .. }, 1) => {
                        Some(*at)
                    }
                    _ => None,
                })
                .zip(times)
                .map(|(at, t)| (at, at + t))
                .collect()
        };
        let passes = spans(0, &c.service.passes);
        let batches = spans(1, &c.service.batches);
        assert!(passes.len() >= 10 && batches.len() >= 30);
        // a pass and a batch that overlap started together, as one step
        for p in &passes {
            for b in batches
                .iter()
                .filter(|b| b.0 < p.1 - 1e-12 && p.0 < b.1 - 1e-12)
            {
                assert!((b.0 - p.0).abs() < 1e-12, "pass {p:?} overlaps batch {b:?}");
            }
        }
        // 704-token prompts in 300-token steps: three chunks each, the first
        // two logged, and the first token after the last
        let chunks = log
            .iter()
            .filter(|d| matches!(d, Decision::PrefillChunk { .. }))
            .count();
        assert!(chunks >= 30, "{chunks} chunks");
        for r in c.ctrl.records() {
            assert!(r.first_token.get().unwrap() > r.prefill_start.get().unwrap());
        }
    }

    /// Intra-request parallelism: three images on two encode workers go
    /// round robin, and the prefill starts only after the last shard landed.
    #[test]
    fn shards_go_round_robin_and_prefill_waits_for_the_last() {
        let alloc: crate::Allocation = "2E(TP1)+1P(TP1)+1D(TP1)".parse().unwrap();
        let mut cfg = config_for(
            &alloc,
            None,
            SmSplit::Static(1.0),
            KvBlocks::new(1 << 20, 16),
            None,
        );
        cfg.mechanisms = crate::System::EpdServe.mechanisms();
        let mut r = test_request(0, 0.0);
        r.items = vec![r.items[0]; 3].into();
        let mut c = Cluster::new(crate::Controller::new(vec![r], cfg), Fixed::default());
        c.drive();
        let placed = c.ctrl.decisions().iter().filter_map(|d| match d {
            Decision::PlaceShard { item, worker, .. } => Some((*item, *worker)),
            _ => None,
        });
        assert!(placed.eq([(0, 0), (1, 1), (2, 0)]));
        let rec = &c.ctrl.records()[0];
        // E0 encodes two shards (two passes of 40 ms, the second from 40 ms):
        // the last lands at 81 ms, when its prefill can start
        assert!(
            (rec.encode_end.get().unwrap() - 0.08).abs() < 1e-9,
            "{rec:?}"
        );
        assert!(rec.prefill_start.get().unwrap() >= 0.081 - 1e-9, "{rec:?}");
        assert!(rec.finish.is_some());
    }
}
