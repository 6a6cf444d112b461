//! Intra-request parallelism (EPD-Serve, Singh et al., 2025): a request's
//! multimodal items are encoded as shards, one per item, each placed on an
//! encode worker of its own in turn (`epdserve/engine_encoding.py`,
//! `shard_requests` and `add_request`); the request's prefill waits at one
//! prefill worker until every shard's embeddings have landed
//! (`epdserve/scheduler_context.py`, which merges the shards once all of
//! them have migrated).
//!
//! The decisions here: where each shard goes ([`Decision::PlaceShard`]), the
//! one prefill worker all shards of a request go to (chosen when its first
//! shard is routed), and when the request joins that worker's queue.

use super::{Command, Controller, Decision, Place};
use crate::{RequestId, Stamp};

/// Sentinel for "no prefill worker chosen yet".
const NO_DEST: u32 = u32::MAX;

/// Per request, with intra-request parallelism on.
#[derive(Clone, Copy, Debug)]
pub(super) struct ShardState {
    /// Shards whose embeddings have not landed at the prefill worker yet.
    pub(super) left: u32,
    /// The prefill worker every shard goes to, once the first was routed.
    pub(super) dest: u32,
}

impl Default for ShardState {
    fn default() -> Self {
        ShardState {
            left: 0,
            dest: NO_DEST,
        }
    }
}

impl Controller {
    /// An admitted multimodal request arrives and intra-request parallelism
    /// is on: each item is a shard placed on the next encode worker in turn
    /// and queued at its batcher.
    pub(super) fn arrive_in_shards(&mut self, now: f64, id: RequestId) {
        let i = id as usize;
        let n = self.requests[i].items.len().max(1);
        let work = self.requests[i].encoder_tokens as f64 / n as f64;
        self.shards[i] = ShardState {
            left: n as u32,
            dest: NO_DEST,
        };
        for item in 0..n as u32 {
            let w = self.encode_place.assign(work);
            self.decide(|| Decision::PlaceShard {
                id,
                item,
                worker: w,
            });
            if item == 0 {
                let w32 = super::index_u32(w);
                self.records[i].encode_worker = Some(w32);
                self.place[i] = Place::Encode(w32);
            }
            if !self.encode[w].alive {
                self.encode_place.complete(w, work);
                self.fail(id, &format!("encode worker E{w} is down"));
                return;
            }
            self.encode[w].queued.push_back((id, item));
            self.encode[w].batcher.on_arrival(now, id);
            self.try_dispatch(now, w);
        }
    }

    /// The items of a micro-batch of `n` shards encode worker `w` dispatches:
    /// the first `n` it queued, in the batcher's order.
    pub(super) fn take_shards(&mut self, w: usize, ids: &[RequestId]) -> Vec<u32> {
        let e = &mut self.encode[w];
        let n = ids.len().min(e.queued.len());
        e.queued
            .drain(..n)
            .zip(ids)
            .map(|((queued, item), id)| {
                debug_assert_eq!(queued, *id, "shard queue out of step with the batcher");
                item
            })
            .collect()
    }

    /// Encode worker `w` finished its pass of shards at `now`: each goes to its
    /// request's prefill worker (chosen, and the route logged, for the first
    /// shard routed), one envelope per prefill worker.
    pub(super) fn route_shards(&mut self, now: f64, w: usize, ids: &[RequestId], items: &[u32]) {
        let mut groups = std::mem::take(&mut self.groups);
        for (&id, &item) in ids.iter().zip(items) {
            let i = id as usize;
            let work =
                self.requests[i].encoder_tokens as f64 / self.requests[i].items.len().max(1) as f64;
            self.encode_place.complete(w, work);
            if self.place[i] == Place::Done {
                continue;
            }
            // the last shard's end is the request's
            self.records[i].encode_end = Stamp::at(now);
            let dest = match self.shards[i].dest {
                NO_DEST => {
                    let p = self
                        .remote_place
                        .assign(self.requests[i].prefill_tokens() as f64);
                    self.counters.routed += 1;
                    self.counters.remote_routed += 1;
                    self.counters.stage_arrivals[1] += 1;
                    self.decide(|| Decision::Route {
                        id,
                        worker: p,
                        local: false,
                    });
                    self.shards[i].dest = p as u32;
                    self.place[i] = Place::Prefill(p as u32);
                    p
                }
                p => p as usize,
            };
            match groups.iter_mut().find(|g| g.0 == dest) {
                Some(g) => {
                    g.1.push(id);
                    g.2.push(item);
                }
                None => groups.push((dest, vec![id], vec![item])),
            }
        }
        for (dest, ids, items) in groups.drain(..) {
            let (envelope, slot) = self.new_envelope(w, dest, false);
            self.envelopes[slot].ids = ids;
            self.envelopes[slot].items = items;
            self.encode[w].inflight += 1;
            self.commands.push_back(Command::Embeddings {
                envelope,
                from: w,
                to: dest,
                local: false,
            });
        }
        self.groups = groups;
    }

    /// A shard of request `i` landed at its prefill worker: whether it was
    /// the last, so the request can queue for prefill.
    pub(super) fn last_shard_landed(&mut self, i: usize) -> bool {
        let s = &mut self.shards[i];
        s.left = s.left.saturating_sub(1);
        s.left == 0
    }

    /// The requests with a shard queued at, or in the pass of, encode
    /// worker `w` (a worker that died takes them with it).
    pub(super) fn shard_holders(&mut self, w: usize) -> Vec<RequestId> {
        let e = &mut self.encode[w];
        let mut ids: Vec<RequestId> = e.queued.drain(..).map(|(id, _)| id).collect();
        ids.extend(e.pass.iter().copied());
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}
