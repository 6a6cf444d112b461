//! Encode: arrival and admission, placement on an encode worker, micro-batch
//! dispatch, the SM share a co-located prefill worker is left, and the end of
//! a pass (prefill routing and the embeddings envelopes it sends).

use super::{index_u32, Command, Controller, Decision, Place};
use crate::{RequestId, Route, Stamp};

/// Under time-slicing (no SM partition) an encode pass in its GPU phase and
/// the co-located prefill batch each get this share of the GPU's time.
pub const TIME_SLICE_SHARE: f64 = 0.5;

impl Controller {
    pub(super) fn on_arrival(&mut self, now: f64, id: RequestId) {
        let i = id as usize;
        if self.place[i] != Place::NotArrived {
            return;
        }
        let own_timeout = if self.timeouts.is_empty() {
            None
        } else {
            self.timeouts.remove(&id)
        };
        if let Err(e) = self.limits.check(&self.requests[i]) {
            let reason = e.to_string();
            self.place[i] = Place::Done;
            self.records[i].refused = Some(e.kind());
            self.counters.refused += 1;
            self.decide(|| Decision::Reject {
                id,
                refused: Some(reason),
            });
            return;
        }
        if self
            .admission_limit
            .is_some_and(|cap| self.in_system >= cap)
        {
            self.place[i] = Place::Done;
            self.records[i].rejected = true;
            self.counters.rejected += 1;
            self.decide(|| Decision::Reject { id, refused: None });
            return;
        }
        self.in_system += 1;
        self.arm_deadline(id, own_timeout);
        self.router.observe(now);
        if !self.replicas.is_empty() {
            self.arrive_at_front_end(id);
            return;
        }
        let req = &self.requests[i];
        if !req.needs_encode() || self.encode.is_empty() {
            let tokens = req.prefill_tokens();
            // a live remote worker (cache-aware with the prefix cache on);
            // with none, a live local one
            let (p, local) = if self.topology.remote_prefill() > 0 && self.remote_place.has_live() {
                (self.place_prefill(id), false)
            } else {
                self.live_prefill(tokens, None)
                    .unwrap_or_else(|| (self.remote_place.assign(tokens as f64), false))
            };
            self.counters.stage_arrivals[1] += 1;
            self.decide(|| Decision::Route {
                id,
                worker: p,
                local,
            });
            self.arrive_at_prefill(now, p, id);
            self.try_prefill(now, p);
            return;
        }
        if self.mechanisms.split_items {
            self.arrive_in_shards(now, id);
            return;
        }
        self.place_encode(now, id);
    }

    /// Place admitted request `id` on an encode worker (least outstanding
    /// encode work among the live ones, cache-aware with the encoder cache
    /// on: [`Self::choose_encode`]) and queue it at its batcher; it fails
    /// when no encode worker is live.
    pub(super) fn place_encode(&mut self, now: f64, id: RequestId) {
        let i = id as usize;
        let (w, enc) = self.choose_encode(id);
        self.counters.stage_arrivals[0] += 1;
        self.decide(|| Decision::PlaceEncode { id, worker: w });
        let w32 = index_u32(w);
        self.records[i].encode_worker = Some(w32);
        self.place[i] = Place::Encode(w32);
        if !self.encode[w].alive {
            self.fail(id, &format!("encode worker E{w} is down"));
            self.encode_place.complete(w, enc);
            return;
        }
        if self.preprocess_ahead {
            self.commands
                .push_back(Command::Preprocess { worker: w, id });
        }
        let encodes = enc > 0.0 || self.encoder_cache.is_none();
        self.encode[w].batcher.on_arrival_with(now, id, encodes);
        self.try_dispatch(now, w);
    }

    /// Requests of `ids` with items to encode: all of them without the
    /// encoder cache; with it, those not every item of which hit. What the
    /// SM split sizes a pass by.
    fn encoding(&self, ids: &[RequestId]) -> usize {
        if self.encoder_cache.is_none() {
            return ids.len();
        }
        ids.iter().filter(|&&id| self.encode_work(id) > 0.0).count()
    }

    /// Choose request `id`'s encode worker (least outstanding work), look
    /// its items up in that worker's encoder cache when it is on, and count
    /// the encode work it really brings there (encoder tokens of the items
    /// that missed): the worker and that work.
    fn choose_encode(&mut self, id: RequestId) -> (usize, f64) {
        let i = id as usize;
        let all = self.requests[i].encoder_tokens as f64;
        let routed = match (
            &self.caches.routing,
            &self.encoder_cache,
            &self.requests[i].content,
        ) {
            (Some(r), Some(cache), Some(c)) => crate::cache::cache_aware_pick(
                self.encode_place.outstanding(),
                |w| self.encode_place.is_open(w),
                |w| cache.missed_tokens(w, c.items()) as f64,
                r.overlap_weight,
            ),
            _ => None,
        };
        let w = match routed {
            Some(w) => {
                self.encode_place.add(w, all);
                w
            }
            None => self.encode_place.assign(all),
        };
        if self.encoder_cache.is_none() {
            return (w, all);
        }
        if self.records[i].encode_worker.is_some() {
            self.withdraw_lookup(id);
        }
        let Some(cache) = self.encoder_cache.as_mut() else {
            return (w, all);
        };
        let req = &self.requests[i];
        let mut ops = self.encoder_ops.as_ref().map(|_| Vec::new());
        let ((mask, fetched), items) = match &req.content {
            Some(c) => (
                cache.lookup_store(
                    w,
                    c.items().map(|t| (t.id, t.llm_tokens as u64)),
                    ops.as_mut(),
                ),
                c.items().len(),
            ),
            // no content ids: every item is unique, a miss
            None => ((cache.miss(req.items.len()), 0), req.items.len()),
        };
        let per_worker = cache.per_worker();
        self.encoder_hits[i] = mask;
        if let (Some(m), Some(ops)) = (self.encoder_ops.as_mut(), ops) {
            m.put(id, ops);
        }
        if per_worker {
            self.decide(|| Decision::EncoderCache {
                id,
                worker: w,
                items,
                hits: (mask & !fetched).count_ones() as usize,
            });
        }
        if let Some(s) = self.store_hits.get_mut(i) {
            *s = fetched;
            let queried = items - (mask & !fetched).count_ones() as usize;
            self.decide(|| Decision::EncoderStore {
                id,
                worker: w,
                items: queried,
                hits: fetched.count_ones() as usize,
            });
        }
        let work = self.encode_work(id);
        self.encode_place.complete(w, all - work);
        (w, work)
    }

    /// Request `id` is placed again (its encode worker died while it
    /// waited there): its earlier lookup is taken back from the caches'
    /// counters, so each of its items counts once, in the lookup its pass
    /// runs with (the decision log keeps both).
    fn withdraw_lookup(&mut self, id: RequestId) {
        let i = id as usize;
        let (mask, fetched) = (self.encoder_hits(id), self.store_hits(id));
        let bytes = self.store_fetch_bytes(id);
        let req = &self.requests[i];
        let items = req
            .content
            .as_ref()
            .map_or(req.items.len(), |c| c.items().len());
        let own = (mask & !fetched).count_ones();
        if let Some(c) = self.encoder_cache.as_mut() {
            c.withdraw(items, own, fetched.count_ones(), bytes);
        }
    }

    /// Request `id`'s encode work, encoder tokens: those of its items that
    /// missed the encoder cache (all of them with the cache off).
    pub(super) fn encode_work(&self, id: RequestId) -> f64 {
        let i = id as usize;
        let req = &self.requests[i];
        let mask = self.encoder_hits.get(i).copied().unwrap_or(0);
        match (&req.content, mask) {
            (Some(c), m) if m != 0 => c
                .items()
                .enumerate()
                .filter(|&(k, _)| k >= 64 || m & (1 << k) == 0)
                .map(|(_, t)| t.encoder_tokens as f64)
                .sum(),
            _ => req.encoder_tokens as f64,
        }
    }

    /// With the store on, a pass of `ids` ended: its encoded items (those
    /// that hit neither the worker's cache nor the store) are written to
    /// the store, which may evict; logged per request that wrote.
    fn write_back(&mut self, ids: &[RequestId]) {
        if self.caches.store.is_none() {
            return;
        }
        for &id in ids {
            let items: Vec<(u64, u64)> = self.items_of(id, self.encoder_hits(id), false).collect();
            let Some(cache) = self.encoder_cache.as_mut() else {
                return;
            };
            let written = cache.write_back(items.into_iter()).len();
            if written > 0 {
                self.decide(|| Decision::StoreWrite { id, items: written });
            }
        }
    }

    /// Whether the deployment has remote prefill workers and none is live.
    fn remote_all_dead(&self) -> bool {
        self.topology.remote_prefill() > 0 && !self.remote_place.has_live()
    }

    /// Encode worker `w` may start a pass: at once, or with lockstep steps
    /// as part of its instance's next step.
    pub(super) fn try_dispatch(&mut self, now: f64, w: usize) {
        match self.step_group_of_encode(w) {
            Some(p) => self.try_step(now, p),
            None => self.dispatch_now(now, w),
        }
    }

    /// Start a pass on encode worker `w` if its batcher says go.
    pub(super) fn dispatch_now(&mut self, now: f64, w: usize) {
        let colocated = self.encode[w].local.is_some();
        let worker = &mut self.encode[w];
        if !worker.alive {
            return;
        }
        // backpressure: no new pass while the worker's envelopes in flight are at the cap
        let free = !worker.busy && worker.inflight < self.max_inflight;
        // a free worker runs no pass, and its pass vector (emptied when the
        // last pass ended) takes the next one
        let batch = if free {
            let mut ids = std::mem::take(&mut worker.pass);
            if worker.batcher.poll_dispatch_into(now, true, &mut ids) {
                Some(ids)
            } else {
                worker.pass = ids;
                None
            }
        } else {
            None
        };
        match batch {
            Some(ids) => {
                self.encode_timers.set(w, f64::INFINITY);
                let encoding = self.encoding(&ids);
                let sm_share = match self.split.encode_share(encoding.max(1)) {
                    Some(f) if colocated => f,
                    _ => 1.0,
                };
                for &id in &ids {
                    // a request split into shards starts with its first
                    let r = &mut self.records[id as usize];
                    r.encode_start.get_or_insert(now);
                    r.encode_batch.get_or_insert(
                        u32::try_from(ids.len()).expect("a pass holds under 2^32 requests"),
                    );
                }
                let items = if self.mechanisms.split_items {
                    self.take_shards(w, &ids)
                } else {
                    Vec::new()
                };
                self.counters.passes += 1;
                self.counters.passed_requests += ids.len();
                self.decide(|| Decision::Dispatch {
                    at: now,
                    worker: w,
                    ids: ids.clone(),
                    sm_share,
                });
                let worker = &mut self.encode[w];
                worker.pass = ids;
                worker.pass_encoding = encoding;
                worker.items = items;
                worker.busy = true;
                worker.since = now;
                worker.gpu_phase = false;
                self.commands.push_back(Command::Encode {
                    worker: w,
                    sm_share,
                });
            }
            None => {
                if free {
                    let at = worker.batcher.poll_timeout().map(|at| at.max(now));
                    self.encode_timers.set(w, at.unwrap_or(f64::INFINITY));
                }
            }
        }
    }

    /// SM share of local prefill worker `p` now: the least over its GPUs of
    /// what the encode pass there leaves while it holds the SMs (its GPU
    /// phase); under time-slicing, half the time.
    pub fn local_prefill_share(&self, p: usize) -> f64 {
        self.prefill[p]
            .encode_workers
            .iter()
            .map(|&w| {
                let e = &self.encode[w];
                let batch = (e.busy && e.gpu_phase).then_some(e.pass_encoding.max(1));
                match self.split.prefill_share(batch) {
                    Some(f) => f,
                    None if batch.is_some() => TIME_SLICE_SHARE,
                    None => 1.0,
                }
            })
            .fold(1.0, f64::min)
    }

    /// The SM share of encode worker `w`'s local prefill batch may have
    /// changed: tell the driver and log it.
    pub(super) fn reshare_local(&mut self, now: f64, w: usize) {
        let Some(p) = self.encode[w].local else {
            return;
        };
        if !self.prefill[p].busy || !self.prefill[p].alive {
            return;
        }
        let share = self.local_prefill_share(p);
        if share == self.prefill[p].share {
            return;
        }
        self.prefill[p].share = share;
        self.decide(|| Decision::Share {
            at: now,
            worker: p,
            sm_share: share,
        });
        self.commands.push_back(Command::PrefillShare {
            worker: p,
            sm_share: share,
        });
    }

    pub(super) fn on_encode_gpu(&mut self, now: f64, w: usize) {
        let e = &mut self.encode[w];
        if !e.busy || e.gpu_phase || !e.alive {
            return;
        }
        e.gpu_phase = true;
        self.reshare_local(now, w);
    }

    /// Encode worker `w` finished its pass at `now`: route each request's
    /// prefill (deficit router, then placement), then one embedding envelope
    /// per destination.
    pub(super) fn on_encode_done(&mut self, now: f64, w: usize) {
        if !self.encode[w].busy || !self.encode[w].alive {
            return;
        }
        self.worked(super::WorkerRef::Encode(w));
        self.encode[w].busy = false;
        self.encode[w].busy_s += now - self.encode[w].since;
        self.encode[w].gpu_phase = false;
        self.reshare_local(now, w);
        let ids = std::mem::take(&mut self.encode[w].pass);
        if self.mechanisms.split_items {
            let items = std::mem::take(&mut self.encode[w].items);
            self.route_shards(now, w, &ids, &items);
            let mut ids = ids;
            ids.clear();
            self.encode[w].pass = ids;
            self.try_dispatch(now, w);
            return;
        }
        self.write_back(&ids);
        let mut groups = std::mem::take(&mut self.groups);
        for &id in &ids {
            let i = id as usize;
            let enc = self.encode_work(id);
            self.encode_place.complete(w, enc);
            if self.place[i] == Place::Done {
                continue;
            }
            self.records[i].encode_end = Stamp::at(now);
            // the deficit counter decides while both sides are live; a dead
            // side leaves it (and the counter is not consulted)
            let route = match self.encode[w].local {
                Some(l) if !self.prefill[l].alive => Route::Remote,
                Some(_) if self.remote_all_dead() => Route::Local,
                Some(_) => self.router.route(),
                None => Route::Remote,
            };
            self.counters.routed += 1;
            let dest = match route {
                Route::Remote => {
                    self.counters.remote_routed += 1;
                    self.place_prefill(id)
                }
                Route::Local => {
                    self.records[i].prefill_local = true;
                    self.encode[w]
                        .local
                        .expect("local route only with a local worker")
                }
            };
            self.counters.stage_arrivals[1] += 1;
            self.decide(|| Decision::Route {
                id,
                worker: dest,
                local: route == Route::Local,
            });
            self.place[i] = Place::Prefill(dest as u32);
            match groups.iter_mut().find(|g| g.0 == dest) {
                Some(g) => g.1.push(id),
                None => {
                    let mut first = self.spare_ids.pop().unwrap_or_default();
                    first.push(id);
                    groups.push((dest, first, Vec::new()));
                }
            }
        }
        // keep the pass's vector for the next pass
        let mut ids = ids;
        ids.clear();
        self.encode[w].pass = ids;
        let mut sent_local = false;
        for (dest, ids, _) in groups.drain(..) {
            let local = self.prefill[dest].local;
            sent_local |= local;
            let (envelope, slot) = self.new_envelope(w, dest, local);
            // the slot's emptied vector serves a later group
            let spare = std::mem::replace(&mut self.envelopes[slot].ids, ids);
            if spare.capacity() > 0 {
                self.spare_ids.push(spare);
            }
            if !local {
                self.encode[w].inflight += 1;
            }
            self.commands.push_back(Command::Embeddings {
                envelope,
                from: w,
                to: dest,
                local,
            });
        }
        self.groups = groups;
        // in lockstep, the local embeddings landing start the next step, so
        // that it prefills what this pass encoded
        if !(sent_local && self.mechanisms.lockstep) {
            self.try_dispatch(now, w);
        }
    }
}
