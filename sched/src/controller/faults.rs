//! Faults: a worker's death (what becomes of its requests, per stage: see
//! `supervision.rs`), its rejoin after a restart, and the run's interruption.

use super::{Command, Controller, EnvelopeId, Place, WorkerRef};
use crate::{PrefillItem, RequestId, Stamp};

/// Why an injected kill at `at` seconds fails a worker's requests: one
/// wording for every driver that injects faults (the harness, the simulator).
pub fn kill_reason(at: f64) -> String {
    format!("killed {at:.3} s into the run (fault injection)")
}

impl Controller {
    fn alive(&self, w: WorkerRef) -> bool {
        match w {
            WorkerRef::Encode(i) => self.encode[i].alive,
            WorkerRef::Prefill(i) => self.prefill[i].alive,
            WorkerRef::Decode(i) => self.decode[i].alive,
            WorkerRef::Replica(i) => self.replicas[i].alive,
        }
    }

    pub(super) fn on_worker_failed(&mut self, now: f64, w: WorkerRef, reason: &str) {
        if self.load_failed(now, w, reason) {
            return;
        }
        if !self.alive(w) {
            // a restart that failed (the new process died before it was
            // ready); with no restarts, a second report of the same death
            if self.sup.policy.is_some() && !self.is_live(w) {
                self.note_death(now, w, reason, true);
            }
            return;
        }
        let label = self.label(w);
        let why = format!("{label} failed: {reason}");
        let victims: Vec<RequestId> = match w {
            WorkerRef::Encode(i) => self.encode_died(now, i),
            WorkerRef::Prefill(i) => self.prefill_died(now, i, &why),
            WorkerRef::Decode(i) => {
                self.decode[i].alive = false;
                self.decode[i].in_run = false;
                self.decode[i].sched.reset();
                self.decode_place.retire(i);
                self.place_ids(Place::Decode(i as u32))
            }
            WorkerRef::Replica(i) => self.replica_died(now, i),
        };
        for id in victims {
            self.fail(id, &why);
        }
        self.note_death(now, w, reason, false);
    }

    /// Encode worker `i` died: the requests of its pass (and, with
    /// intra-request parallelism, of its shards) are the victims; those
    /// queued at its batcher are placed again.
    fn encode_died(&mut self, now: f64, i: usize) -> Vec<RequestId> {
        // its shards are lost with it (intra-request parallelism)
        let split = self.mechanisms.split_items;
        let holders = if split {
            self.shard_holders(i)
        } else {
            Vec::new()
        };
        let e = &mut self.encode[i];
        e.alive = false;
        e.busy = false;
        e.gpu_phase = false;
        self.encode_timers.set(i, f64::INFINITY);
        let pass = std::mem::take(&mut e.pass);
        e.items.clear();
        let queued = if split {
            Vec::new()
        } else {
            e.batcher.drain_queued()
        };
        self.encode_place.retire(i);
        // its process's memory, the embeddings it held, is gone
        if let Some(c) = self.encoder_cache.as_mut() {
            c.clear(i);
        }
        // its GPU's SMs are the local prefill worker's again
        self.reshare_local(now, i);
        for &id in &queued {
            let enc = self.requests[id as usize].encoder_tokens as f64;
            self.encode_place.complete(i, enc);
            self.place_encode(now, id);
        }
        for &id in &pass {
            let enc = self.requests[id as usize].encoder_tokens as f64;
            self.encode_place.complete(i, enc);
        }
        let mut victims = if split {
            self.place_ids(Place::Encode(i as u32))
        } else {
            pass
        };
        victims.extend(holders);
        victims
    }

    /// Prefill worker `p` died: every request it held (queued, in its batch,
    /// or in an envelope on its way there) is re-run from its embeddings on a
    /// live prefill worker. With intra-request parallelism they fail instead
    /// (their shards' bookkeeping is per destination).
    fn prefill_died(&mut self, now: f64, p: usize, why: &str) -> Vec<RequestId> {
        let slot = &mut self.prefill[p];
        slot.alive = false;
        slot.busy = false;
        let batch = std::mem::take(&mut slot.batch);
        let queued = slot.queue.drain_all();
        if !self.prefill[p].local {
            for it in batch.iter().chain(&queued) {
                self.remote_place.complete(p, it.tokens as f64);
            }
            self.remote_place.retire(p);
        }
        // its process's memory, the KV blocks it kept, is gone
        if let Some(c) = self.prefix_cache.as_mut() {
            c.clear(p);
        }
        // envelopes in flight to it land nowhere: their senders get their
        // in-flight slots back now, and their landings will be no-ops
        let lost: Vec<EnvelopeId> = self
            .envelopes
            .iter()
            .enumerate()
            .filter(|(_, e)| e.in_flight && e.to == p)
            .map(|(s, e)| (e.gen as u64) << 32 | s as u64)
            .collect();
        if self.mechanisms.split_items {
            for id in self.place_ids(Place::Prefill(p as u32)) {
                self.fail(id, why);
            }
            for e in lost {
                self.on_embeddings(now, e, now);
            }
            return Vec::new();
        }
        for e in lost {
            self.drop_envelope(e);
        }
        let ids = self.place_ids(Place::Prefill(p as u32));
        self.reroute_prefill(now, p, &ids);
        Vec::new()
    }

    /// Free envelope `e` without delivering it (its destination died).
    fn drop_envelope(&mut self, e: EnvelopeId) {
        let slot = (e & 0xffff_ffff) as usize;
        let env = &mut self.envelopes[slot];
        env.in_flight = false;
        env.ids.clear();
        env.items.clear();
        let (from, local) = (env.from, env.local);
        self.free_envelopes.push(slot as u32);
        if !local {
            self.encode[from].inflight = self.encode[from].inflight.saturating_sub(1);
        }
    }

    /// Aggregated replica `r` died: the requests it admitted or runs are the
    /// victims; those still waiting for admission go to a live replica.
    fn replica_died(&mut self, now: f64, r: usize) -> Vec<RequestId> {
        let rep = &mut self.replicas[r];
        rep.alive = false;
        rep.stepping = false;
        rep.admitted.clear();
        rep.sched.reset();
        let waiting: Vec<PrefillItem> = rep.waiting.drain_all();
        self.replica_place.retire(r);
        for it in &waiting {
            let work = self.work(it.id);
            self.replica_place.complete(r, work);
            self.place[it.id as usize] = Place::FrontEnd;
            self.on_preprocessed(now, it.id);
        }
        self.place_ids(Place::Replica(r as u32))
    }

    /// Worker `w`, dead, is back (restarted, its model loaded): it starts
    /// empty and takes work again through placement and routing.
    pub(super) fn on_worker_restarted(&mut self, now: f64, w: WorkerRef) {
        if self.alive(w) || self.is_finished_interrupt() {
            return;
        }
        match w {
            WorkerRef::Encode(i) => {
                self.encode[i].alive = true;
                self.encode_place.revive(i);
            }
            WorkerRef::Prefill(i) => {
                self.prefill[i].alive = true;
                self.prefill[i].share = 1.0;
                if !self.prefill[i].local {
                    self.remote_place.revive(i);
                }
            }
            WorkerRef::Decode(i) => {
                self.decode[i].alive = true;
                self.decode[i].yielded = false;
                self.decode_place.revive(i);
            }
            WorkerRef::Replica(i) => {
                self.replicas[i].alive = true;
                self.replica_place.revive(i);
            }
        }
        self.note_rejoin(now, w);
        if let WorkerRef::Encode(i) = w {
            self.try_dispatch(now, i);
        }
    }

    /// Whether the run was interrupted (nothing rejoins after that).
    fn is_finished_interrupt(&self) -> bool {
        self.interrupted
    }

    pub(super) fn interrupt(&mut self, reason: &str) {
        // nothing more starts, not even what was asked for before
        self.interrupted = true;
        self.commands.clear();
        for i in 0..self.place.len() {
            self.fail(i as RequestId, reason);
        }
        for (w, e) in self.encode.iter_mut().enumerate() {
            e.alive = false;
            self.encode_timers.set(w, f64::INFINITY);
        }
        for p in &mut self.prefill {
            p.alive = false;
        }
        for d in &mut self.decode {
            d.alive = false;
            d.in_run = false;
        }
        for r in &mut self.replicas {
            r.alive = false;
            r.stepping = false;
        }
    }

    pub(super) fn place_ids(&self, place: Place) -> Vec<RequestId> {
        (0..self.place.len())
            .filter(|&i| self.place[i] == place)
            .map(|i| i as RequestId)
            .collect()
    }

    /// Requests `ids`, held by dead prefill worker `dead`, go to a live
    /// prefill worker: their embeddings again, one envelope per (encode
    /// worker, destination), from the encode worker that made them; a
    /// text-only request straight to the queue. They fail, naming `dead`,
    /// when no prefill worker is live.
    fn reroute_prefill(&mut self, now: f64, dead: usize, ids: &[RequestId]) {
        let mut groups: Vec<(usize, usize, Vec<RequestId>)> = Vec::new();
        for &id in ids {
            let i = id as usize;
            let from = self.records[i].encode_worker.map(|w| w as usize);
            let Some((dest, local)) = self.live_prefill(self.requests[i].prefill_tokens(), from)
            else {
                let why = format!(
                    "prefill worker {} is down and no other prefill worker is live",
                    self.label(WorkerRef::Prefill(dead))
                );
                self.fail(id, &why);
                continue;
            };
            self.decide(|| super::Decision::Route {
                id,
                worker: dest,
                local,
            });
            let rec = &mut self.records[i];
            rec.prefill_local = local;
            rec.prefill_ready = Stamp::NONE;
            rec.prefill_start = Stamp::NONE;
            self.place[i] = Place::Prefill(dest as u32);
            match from.filter(|_| self.requests[i].needs_encode()) {
                None => {
                    self.arrive_at_prefill(now, dest, id);
                    self.try_prefill(now, dest);
                }
                Some(w) => match groups.iter_mut().find(|g| g.0 == w && g.1 == dest) {
                    Some(g) => g.2.push(id),
                    None => groups.push((w, dest, vec![id])),
                },
            }
        }
        for (from, dest, ids) in groups {
            let local = self.prefill[dest].local;
            let (envelope, slot) = self.new_envelope(from, dest, local);
            self.envelopes[slot].ids = ids;
            if !local {
                self.encode[from].inflight += 1;
            }
            self.commands.push_back(Command::Embeddings {
                envelope,
                from,
                to: dest,
                local,
            });
        }
    }

    /// A live prefill worker for a request of `tokens` prompt tokens encoded
    /// on encode worker `near`: a live remote worker by placement; else the
    /// live local prefill worker on `near`'s GPU; else (a text-only request)
    /// any live local prefill worker. `(worker, local)`, or `None` when no
    /// prefill worker is live.
    pub(super) fn live_prefill(
        &mut self,
        tokens: u64,
        near: Option<usize>,
    ) -> Option<(usize, bool)> {
        if self.remote_place.has_live() && self.topology.remote_prefill() > 0 {
            return Some((self.remote_place.assign(tokens as f64), false));
        }
        let alive_local = |p: &usize| self.prefill[*p].alive && self.prefill[*p].local;
        let mine = near.and_then(|w| self.encode.get(w)?.local);
        let p = match near {
            Some(_) => mine.filter(alive_local),
            None => (0..self.prefill.len()).find(alive_local),
        }?;
        Some((p, true))
    }
}
