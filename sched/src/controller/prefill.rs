//! Prefill: embeddings landing at a prefill worker, batching under the token
//! budget, and the end of a batch (the KV cache sent to a decode worker).

use super::{Command, Controller, Decision, EnvelopeId, Place, WorkerRef};
use crate::{PrefillItem, RequestId, Stamp};

impl Controller {
    /// Request `id` is held by prefill worker `p` at `now` (queued, or failed
    /// when the worker is down).
    pub(super) fn arrive_at_prefill(&mut self, now: f64, p: usize, id: RequestId) {
        let i = id as usize;
        if self.place[i] == Place::Done {
            return;
        }
        self.place[i] = Place::Prefill(p as u32);
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
        self.records[i].prefill_ready = Stamp::at(now);
        let tokens = self.requests[i].prefill_tokens();
        let cached = self.acquire_prefix(p, id);
        if cached > 0 && !self.prefill[p].local {
            // its placement counted the whole prompt; the cached part is no work
            self.remote_place.complete(p, cached as f64);
        }
        self.prefill[p].queue.push(PrefillItem {
            id,
            tokens: tokens - cached,
        });
    }

    /// Choose request `id`'s remote prefill worker and count its whole
    /// prompt there: least outstanding work, or with cache-aware routing
    /// and the prefix cache on, the worker of least
    /// `overlap_weight × uncached tokens + outstanding`
    /// ([`crate::CacheRouting`]).
    pub(super) fn place_prefill(&mut self, id: RequestId) -> usize {
        let tokens = self.requests[id as usize].prefill_tokens();
        let (Some(r), true) = (self.caches.routing, self.prefix_cache.is_some()) else {
            return self.remote_place.assign(tokens as f64);
        };
        let place = &self.remote_place;
        if let Some(p) = crate::cache::sole_open(place.outstanding().len(), |p| place.is_open(p)) {
            // one worker to choose: its cache need not be looked up
            self.remote_place.add(p, tokens as f64);
            return p;
        }
        let keys = prompt_keys(&self.requests[id as usize]);
        let cache = self.prefix_cache.as_ref().expect("on");
        let pick = crate::cache::cache_aware_pick(
            self.remote_place.outstanding(),
            |p| self.remote_place.is_open(p),
            |p| (tokens - cache.held(p, keys, tokens).1) as f64,
            r.overlap_weight,
        );
        match pick {
            Some(p) => {
                self.remote_place.add(p, tokens as f64);
                p
            }
            None => self.remote_place.assign(tokens as f64),
        }
    }

    /// Look request `id`'s prompt up in prefill worker `p`'s prefix cache
    /// (pinning its hits until its prefill ends): the cached tokens, 0 with
    /// the cache off.
    fn acquire_prefix(&mut self, p: usize, id: RequestId) -> u64 {
        if self.prefix_cache.is_none() {
            return 0;
        }
        let req = &self.requests[id as usize];
        let tokens = req.prefill_tokens();
        let cache = self.prefix_cache.as_mut().expect("on");
        let (links, hit_tokens) = cache.acquire(p, prompt_keys(req), tokens);
        self.prefix_hits[id as usize] = [hit_tokens as u32, links as u32];
        self.decide(|| Decision::PrefixCache {
            id,
            worker: p,
            tokens,
            hit_tokens,
        });
        hit_tokens
    }

    /// Request `id`'s prefill ended on worker `p`: its hits are released and
    /// its prompt's blocks stay cached there.
    fn release_prefix(&mut self, p: usize, id: RequestId) {
        if self.prefix_cache.is_none() {
            return;
        }
        let keys = prompt_keys(&self.requests[id as usize]);
        let links = self.prefix_hits[id as usize][1] as usize;
        if let Some(c) = self.prefix_cache.as_mut() {
            c.release_request(p, id, keys, links);
        }
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
            self.records[id as usize].embedding_sent = Stamp::at(sent_at);
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
        // an idle worker's batch vector is empty: the next batch fills it
        let mut items = std::mem::take(&mut self.prefill[p].batch);
        self.prefill[p].queue.next_batch_into(&mut items);
        for it in &items {
            // a chunked prompt starts with its first chunk
            self.records[it.id as usize]
                .prefill_start
                .get_or_insert(now);
        }
        self.note_chunk(now, p, &items);
        if let Some(c) = self.prefix_cache.as_mut() {
            let bs = c.block_size() as u64;
            c.make_room(p, items.iter().map(|it| it.tokens.div_ceil(bs)).sum());
        }
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
        slot.since = now;
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
        self.prefill[p].busy_s += now - self.prefill[p].since;
        let items = std::mem::take(&mut self.prefill[p].batch);
        for it in &items {
            let i = it.id as usize;
            if !self.prefill[p].local {
                self.remote_place.complete(p, it.tokens as f64);
            }
            if self.place[i] == Place::Done || self.is_chunk(p, it.id) {
                continue;
            }
            self.release_prefix(p, it.id);
            self.records[i].first_token = Stamp::at(now);
            let out = self.requests[i].output_tokens;
            if out <= 1 {
                self.done(it.id, now);
                continue;
            }
            // the KV cache holds the whole prompt, its cached part too
            let kv = it.tokens + self.prefix_hit_tokens(it.id);
            let d = self.decode_place.assign((kv + out as u64) as f64);
            self.counters.stage_arrivals[2] += 1;
            self.decide(|| Decision::PlaceDecode {
                id: it.id,
                worker: d,
            });
            self.place[i] = Place::Decode(d as u32);
            self.commands.push_back(Command::Kv {
                from: p,
                to: d,
                id: it.id,
            });
        }
        // keep the batch's vector for the worker's next batch
        let mut items = items;
        items.clear();
        let slot = &mut self.prefill[p];
        if !slot.busy && slot.batch.capacity() == 0 {
            slot.batch = items;
        }
        self.try_prefill(now, p);
    }
}

/// The hash chain of `req`'s prompt (empty for a request without content
/// ids: its prompt is unique).
fn prompt_keys(req: &crate::Request) -> &[crate::ChainKey] {
    req.content.as_ref().map_or(&[], |c| c.keys())
}
