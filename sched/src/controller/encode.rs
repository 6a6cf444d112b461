//! Encode: arrival and admission, placement on an encode worker, micro-batch
//! dispatch, the SM share a co-located prefill worker is left, and the end of
//! a pass (prefill routing and the embeddings envelopes it sends).

use super::{Command, Controller, Decision, Place};
use crate::{RequestId, Route};

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
            let p = self.remote_place.assign(req.prefill_tokens() as f64);
            self.decide(|| Decision::Route {
                id,
                worker: p,
                local: false,
            });
            self.arrive_at_prefill(now, p, id);
            self.try_prefill(now, p);
            return;
        }
        if self.mechanisms.split_items {
            self.arrive_in_shards(now, id);
            return;
        }
        let enc = req.encoder_tokens as f64;
        let w = self.encode_place.assign(enc);
        self.decide(|| Decision::PlaceEncode { id, worker: w });
        self.records[i].encode_worker = Some(w);
        self.place[i] = Place::Encode(w);
        if !self.encode[w].alive {
            self.fail(id, &format!("encode worker E{w} is down"));
            self.encode_place.complete(w, enc);
            return;
        }
        if self.preprocess_ahead {
            self.commands
                .push_back(Command::Preprocess { worker: w, id });
        }
        self.encode[w].batcher.on_arrival(now, id);
        self.try_dispatch(now, w);
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
        match worker.batcher.poll_dispatch(now, free) {
            Some(ids) => {
                worker.timer = None;
                let sm_share = match self.split.encode_share(ids.len()) {
                    Some(f) if colocated => f,
                    _ => 1.0,
                };
                for &id in &ids {
                    // a request split into shards starts with its first
                    let r = &mut self.records[id as usize];
                    r.encode_start.get_or_insert(now);
                    r.encode_batch.get_or_insert(ids.len());
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
                worker.items = items;
                worker.busy = true;
                worker.gpu_phase = false;
                self.commands.push_back(Command::Encode {
                    worker: w,
                    sm_share,
                });
            }
            None => {
                if free {
                    worker.timer = worker.batcher.poll_timeout().map(|at| at.max(now));
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
                let batch = (e.busy && e.gpu_phase).then_some(e.pass.len());
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
        self.encode[w].busy = false;
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
        let mut groups = std::mem::take(&mut self.groups);
        for &id in &ids {
            let i = id as usize;
            let enc = self.requests[i].encoder_tokens as f64;
            self.encode_place.complete(w, enc);
            if self.place[i] == Place::Done {
                continue;
            }
            self.records[i].encode_end = Some(now);
            let route = match self.encode[w].local {
                Some(_) => self.router.route(),
                None => Route::Remote,
            };
            self.counters.routed += 1;
            let dest = match route {
                Route::Remote => {
                    self.counters.remote_routed += 1;
                    self.remote_place
                        .assign(self.requests[i].prefill_tokens() as f64)
                }
                Route::Local => {
                    self.records[i].prefill_local = true;
                    self.encode[w]
                        .local
                        .expect("local route only with a local worker")
                }
            };
            self.decide(|| Decision::Route {
                id,
                worker: dest,
                local: route == Route::Local,
            });
            self.place[i] = Place::Prefill(dest);
            match groups.iter_mut().find(|g| g.0 == dest) {
                Some(g) => g.1.push(id),
                None => groups.push((dest, vec![id], Vec::new())),
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
            self.envelopes[slot].ids = ids;
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
