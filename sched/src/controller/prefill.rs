//! Prefill: embeddings landing at a prefill worker, batching under the token
//! budget, and the end of a batch (the KV cache sent to a decode worker).

use super::{Command, Controller, Decision, EnvelopeId, Place, WorkerRef};
use crate::{PrefillItem, RequestId};

impl Controller {
    /// Request `id` is held by prefill worker `p` at `now` (queued, or failed
    /// when the worker is down).
    pub(super) fn arrive_at_prefill(&mut self, now: f64, p: usize, id: RequestId) {
        let i = id as usize;
        if self.place[i] == Place::Done {
            return;
        }
        self.place[i] = Place::Prefill(p);
        if !self.prefill[p].alive {
            let why = format!(
                "prefill worker {} is down",
                self.label(WorkerRef::Prefill(p))
            );
            self.fail(id, &why);
            return;
        }
        if self.mechanisms.split_items && !self.last_shard_landed(i) {
            // its other shards' embeddings are still on their way
            return;
        }
        self.records[i].prefill_ready = Some(now);
        self.prefill[p].queue.push(PrefillItem {
            id,
            tokens: self.requests[i].prefill_tokens(),
        });
    }

    pub(super) fn on_embeddings(&mut self, now: f64, e: EnvelopeId, sent_at: f64) {
        let Some(env) = self.live_envelope(e) else {
            return;
        };
        let slot = (e & 0xffff_ffff) as usize;
        let (from, to, local) = (env.from, env.to, env.local);
        let ids = std::mem::take(&mut self.envelopes[slot].ids);
        self.envelopes[slot].in_flight = false;
        self.free_envelopes.push(slot as u32);
        if !local {
            self.encode[from].inflight = self.encode[from].inflight.saturating_sub(1);
        }
        for &id in &ids {
            self.records[id as usize].embedding_sent = Some(sent_at);
            self.arrive_at_prefill(now, to, id);
        }
        // hand the vector back to the slot for reuse
        let mut ids = ids;
        ids.clear();
        self.envelopes[slot].ids = ids;
        self.try_prefill(now, to);
        if !local {
            self.try_dispatch(now, from);
        }
    }

    /// Prefill worker `p` may start a batch: at once, or with lockstep
    /// steps as part of its instance's next step.
    pub(super) fn try_prefill(&mut self, now: f64, p: usize) {
        if self.step_group_of_prefill(p) {
            self.try_step(now, p);
        } else {
            self.prefill_now(now, p);
        }
    }

    /// Start a batch on prefill worker `p` if it is idle and has work.
    pub(super) fn prefill_now(&mut self, now: f64, p: usize) {
        let slot = &self.prefill[p];
        if !slot.alive || slot.busy || slot.queue.is_empty() {
            return;
        }
        let items = self.prefill[p].queue.next_batch();
        for it in &items {
            // a chunked prompt starts with its first chunk
            self.records[it.id as usize]
                .prefill_start
                .get_or_insert(now);
        }
        self.note_chunk(now, p, &items);
        let sm_share = if self.prefill[p].local {
            self.local_prefill_share(p)
        } else {
            1.0
        };
        self.decide(|| Decision::Prefill {
            at: now,
            worker: p,
            ids: items.iter().map(|i| i.id).collect(),
            sm_share,
        });
        let slot = &mut self.prefill[p];
        slot.batch = items;
        slot.busy = true;
        slot.share = sm_share;
        self.commands.push_back(Command::Prefill {
            worker: p,
            sm_share,
        });
    }

    /// Prefill worker `p` finished its batch at `now` (first tokens emitted):
    /// place each KV cache on a decode worker.
    pub(super) fn on_prefill_done(&mut self, now: f64, p: usize) {
        if !self.prefill[p].busy || !self.prefill[p].alive {
            return;
        }
        self.worked(WorkerRef::Prefill(p));
        self.prefill[p].busy = false;
        let items = std::mem::take(&mut self.prefill[p].batch);
        for it in &items {
            let i = it.id as usize;
            if !self.prefill[p].local {
                self.remote_place.complete(p, it.tokens as f64);
            }
            if self.place[i] == Place::Done || self.is_chunk(p, it.id) {
                continue;
            }
            self.records[i].first_token = Some(now);
            let out = self.requests[i].output_tokens;
            if out <= 1 {
                self.done(it.id, now);
                continue;
            }
            let d = self.decode_place.assign((it.tokens + out as u64) as f64);
            self.decide(|| Decision::PlaceDecode {
                id: it.id,
                worker: d,
            });
            self.place[i] = Place::Decode(d);
            self.commands.push_back(Command::Kv {
                from: p,
                to: d,
                id: it.id,
            });
        }
        self.try_prefill(now, p);
    }
}
