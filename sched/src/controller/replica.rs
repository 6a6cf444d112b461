//! The aggregated system: replicas that each run every stage, as a
//! single-engine server (vLLM-style) runs a cluster. A request is
//! preprocessed in the server's front end, waits at the replica with the
//! least outstanding work, and is admitted FCFS within the prefill token
//! budget while KV blocks are free; each iteration of a replica encodes the
//! items of the requests it admits, prefills them (their first tokens) and
//! advances every running sequence by one token.
//!
//! The order within one iteration (encode inline, then prefill, then one
//! decode step over the running batch) and the admission rule (a new
//! budget's worth of waiting requests is taken only once the previous one
//! was admitted, so an iteration never prefills more than the token budget)
//! are the decisions here; what an iteration costs is the driver's.

use super::{Command, Controller, Decision, Place};
use crate::{DecodeScheduler, DecodeSeq, PrefillItem, PrefillQueue, RequestId, Stamp};

/// One aggregated replica, as the controller keeps it.
pub(super) struct ReplicaSlot {
    /// Preprocessed requests waiting to be admitted, FCFS.
    pub(super) waiting: PrefillQueue,
    /// Running sequences and their KV blocks.
    pub(super) sched: DecodeScheduler,
    /// An iteration is in flight.
    pub(super) stepping: bool,
    /// The requests the iteration in flight admitted (and prefills).
    pub(super) admitted: Vec<RequestId>,
    /// Requests aborted during the iteration in flight: they leave at its end.
    pub(super) leaving: Vec<RequestId>,
    pub(super) alive: bool,
}

impl ReplicaSlot {
    pub(super) fn new(waiting: PrefillQueue, sched: DecodeScheduler) -> ReplicaSlot {
        ReplicaSlot {
            waiting,
            sched,
            stepping: false,
            admitted: Vec::new(),
            leaving: Vec::new(),
            alive: true,
        }
    }
}

impl Controller {
    /// An admitted arrival goes to the front end for preprocessing.
    pub(super) fn arrive_at_front_end(&mut self, id: RequestId) {
        self.place[id as usize] = Place::FrontEnd;
        self.commands.push_back(Command::FrontEndPreprocess { id });
    }

    /// Request `id` is preprocessed: it waits at the least-loaded replica, or
    /// fails when its KV cache can never fit one.
    pub(super) fn on_preprocessed(&mut self, now: f64, id: RequestId) {
        let i = id as usize;
        if self.place[i] != Place::FrontEnd {
            return;
        }
        let req = &self.requests[i];
        let (prompt, output) = (req.prefill_tokens(), req.output_tokens);
        let seq = DecodeSeq {
            id,
            prompt_tokens: prompt,
            remaining: output,
        };
        if !self.replicas[0].sched.can_ever_fit(&seq) {
            // it would wait forever
            self.fail(id, "its KV cache can never fit one aggregated replica");
            return;
        }
        let work = self.work(id);
        let r = self.replica_place.assign(work);
        self.decide(|| Decision::PlaceReplica { id, replica: r });
        self.place[i] = Place::Replica(r as u32);
        if !self.replicas[r].alive {
            let label = self
                .topology
                .label(crate::WorkerRef::Replica(r))
                .to_string();
            self.fail(id, &format!("replica {label} is down"));
            self.replica_place.complete(r, work);
            return;
        }
        if !self.requests[i].needs_encode() {
            // text-only: ready for prefill once preprocessed
            self.records[i].prefill_ready = Stamp::at(now);
        }
        self.replicas[r]
            .waiting
            .push(PrefillItem { id, tokens: prompt });
        self.try_replica_step(now, r);
    }

    /// Start replica `r`'s next iteration if it is idle and has work.
    pub(super) fn try_replica_step(&mut self, now: f64, r: usize) {
        let rep = &mut self.replicas[r];
        if rep.stepping || !rep.alive {
            return;
        }
        let batch_in = if rep.sched.waiting() == 0 {
            rep.waiting.next_batch()
        } else {
            Vec::new()
        };
        for item in batch_in {
            // the whole output is generated here: the first token by the
            // prefill iteration, the rest by the iterations after it
            rep.sched.enqueue(DecodeSeq {
                id: item.id,
                prompt_tokens: item.tokens,
                remaining: self.requests[item.id as usize].output_tokens,
            });
        }
        let admitted = rep.sched.admit();
        let (batch, context) = rep.sched.step_shape();
        if batch == 0 {
            return;
        }
        rep.stepping = true;
        let mut encoded = 0;
        for &id in &admitted {
            let i = id as usize;
            if self.requests[i].needs_encode() {
                encoded += 1;
                let rec = &mut self.records[i];
                rec.encode_start = Stamp::at(now);
                rec.encode_batch =
                    Some(u32::try_from(admitted.len()).expect("a batch holds under 2^32 requests"));
            }
        }
        if encoded > 0 {
            self.counters.passes += 1;
            self.counters.passed_requests += encoded;
        }
        self.decide(|| Decision::ReplicaStep {
            at: now,
            replica: r,
            ids: admitted.clone(),
            batch,
            context,
        });
        self.replicas[r].admitted = admitted;
        self.commands.push_back(Command::ReplicaStep {
            replica: r,
            batch,
            context,
        });
    }

    /// Replica `r`'s iteration ended at `now`, its prefill having begun at
    /// `prefill_start`: first tokens of what it admitted, one token for every
    /// running sequence, finished sequences leave; then the next iteration.
    pub(super) fn on_replica_step_done(&mut self, now: f64, r: usize, prefill_start: f64) {
        if !self.replicas[r].stepping || !self.replicas[r].alive {
            return;
        }
        self.worked(crate::WorkerRef::Replica(r));
        self.replicas[r].stepping = false;
        let admitted = std::mem::take(&mut self.replicas[r].admitted);
        for &id in &admitted {
            let i = id as usize;
            if self.place[i] == Place::Done {
                continue;
            }
            let encoded = self.requests[i].needs_encode();
            let rec = &mut self.records[i];
            if encoded {
                // its embeddings are ready when the inline encode ends
                rec.encode_end = Stamp::at(prefill_start);
                rec.prefill_ready = Stamp::at(prefill_start);
            }
            rec.prefill_start = Stamp::at(prefill_start);
            rec.first_token = Stamp::at(now);
            rec.decode_ready = Stamp::at(now);
            rec.decode_start = Stamp::at(now);
        }
        for id in self.replicas[r].sched.complete_step() {
            if self.aborted(id) {
                // its placement was completed when it was aborted
                continue;
            }
            let work = self.work(id);
            self.done(id, now);
            self.replica_place.complete(r, work);
        }
        for id in std::mem::take(&mut self.replicas[r].leaving) {
            self.replicas[r].sched.remove(id);
        }
        self.try_replica_step(now, r);
    }
}
