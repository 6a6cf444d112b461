//! Faults: a worker's death (its requests fail, its envelopes in flight land
//! nowhere) and the run's interruption.

use super::{Controller, EnvelopeId, Place, WorkerRef};
use crate::RequestId;

/// Why an injected kill at `at` seconds fails a worker's requests: one
/// wording for every driver that injects faults (the harness, the simulator).
pub fn kill_reason(at: f64) -> String {
    format!("killed {at:.3} s into the run (fault injection)")
}

impl Controller {
    pub(super) fn on_worker_failed(&mut self, now: f64, w: WorkerRef, reason: &str) {
        let label = self.label(w);
        let why = format!("{label} failed: {reason}");
        let victims: Vec<RequestId> = match w {
            WorkerRef::Encode(i) => {
                // its shards are lost with it (intra-request parallelism)
                let holders = if self.mechanisms.split_items {
                    self.shard_holders(i)
                } else {
                    Vec::new()
                };
                let e = &mut self.encode[i];
                e.alive = false;
                e.busy = false;
                e.gpu_phase = false;
                e.pass.clear();
                e.timer = None;
                self.encode_place.retire(i);
                // its GPU's SMs are the local prefill worker's again
                self.reshare_local(now, i);
                let mut victims = self.place_ids(Place::Encode(i));
                victims.extend(holders);
                victims
            }
            WorkerRef::Prefill(i) => {
                self.prefill[i].alive = false;
                self.prefill[i].busy = false;
                self.prefill[i].batch.clear();
                if !self.prefill[i].local {
                    self.remote_place.retire(i);
                }
                self.place_ids(Place::Prefill(i))
            }
            WorkerRef::Decode(i) => {
                self.decode[i].alive = false;
                self.decode[i].in_run = false;
                self.decode_place.retire(i);
                self.place_ids(Place::Decode(i))
            }
            WorkerRef::Replica(i) => {
                let r = &mut self.replicas[i];
                r.alive = false;
                r.stepping = false;
                r.admitted.clear();
                self.replica_place.retire(i);
                self.place_ids(Place::Replica(i))
            }
        };
        // an encode worker that lost its local prefill partner keeps routing
        // there: those requests fail when their embeddings land
        for id in victims {
            self.fail(id, &why);
        }
        if let WorkerRef::Prefill(p) = w {
            // envelopes in flight to it land nowhere: their senders get their
            // in-flight slots back (their requests failed above)
            let lost: Vec<EnvelopeId> = self
                .envelopes
                .iter()
                .enumerate()
                .filter(|(_, e)| e.in_flight && e.to == p)
                .map(|(s, e)| (e.gen as u64) << 32 | s as u64)
                .collect();
            for e in lost {
                self.on_embeddings(now, e, now);
            }
        }
    }

    pub(super) fn interrupt(&mut self, reason: &str) {
        // nothing more starts, not even what was asked for before
        self.commands.clear();
        for i in 0..self.place.len() {
            self.fail(i as RequestId, reason);
        }
        for e in &mut self.encode {
            e.alive = false;
            e.timer = None;
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

    fn place_ids(&self, place: Place) -> Vec<RequestId> {
        (0..self.place.len())
            .filter(|&i| self.place[i] == place)
            .map(|i| i as RequestId)
            .collect()
    }
}
