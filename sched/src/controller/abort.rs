//! Aborts: a request whose client left ([`Event::Abort`](super::Event::Abort))
//! or whose deadline passed (the controller's own timer) leaves the system.
//! One decision in one place for every driver: what has not started is
//! cancelled (taken out of its encode, prefill or decode queue), what runs
//! stops at its next step boundary (an encode pass or a prefill batch runs to
//! its end and drops the request there; a decode run yields after the
//! iteration in progress), and its KV blocks are freed.

use super::{Command, Controller, Decision, Place, WorkerRef};
use crate::{Abort, RequestId};
use std::cmp::Reverse;

impl Controller {
    /// Request `id` is no longer wanted at `now`, for `reason`.
    pub(super) fn abort(&mut self, now: f64, id: RequestId, reason: Abort) {
        let i = id as usize;
        let place = self.place[i];
        if place == Place::Done {
            return;
        }
        if place != Place::NotArrived {
            self.in_system -= 1;
        }
        self.place[i] = Place::Done;
        self.take_encoder_ops(id);
        self.records[i].aborted = Some(reason);
        self.counters.aborted += 1;
        self.prune_deadlines();
        self.decide(|| Decision::Abort {
            at: now,
            id,
            reason,
        });
        match place {
            Place::Encode(_) => self.abort_in_encode(now, id),
            Place::Prefill(p) => self.abort_in_prefill(p as usize, id),
            Place::Decode(d) => self.abort_in_decode(now, d as usize, id),
            Place::Replica(r) => self.abort_in_replica(now, r as usize, id),
            // the front end's preprocessing ends to nothing (`on_preprocessed`)
            Place::NotArrived | Place::FrontEnd | Place::Done => {}
        }
    }

    /// Out of every encode queue it waits in (one, or one per shard); a pass
    /// that holds it runs to its end and routes nothing for it.
    fn abort_in_encode(&mut self, now: f64, id: RequestId) {
        let req = &self.requests[id as usize];
        let n = if self.mechanisms.split_items {
            req.items.len().max(1)
        } else {
            1
        };
        let work = req.encoder_tokens as f64 / n as f64;
        for w in 0..self.encode.len() {
            let e = &mut self.encode[w];
            let queued = e.batcher.remove(id);
            e.queued.retain(|(q, _)| *q != id);
            for _ in 0..queued {
                self.encode_place.complete(w, work);
            }
            if queued > 0 && self.preprocess_ahead {
                // its media were handed to the worker ahead of its pass
                let worker = WorkerRef::Encode(w);
                self.commands.push_back(Command::Discard { worker, id });
            }
            if queued > 0 {
                // the batcher's deadline may have been the request's
                self.try_dispatch(now, w);
            }
        }
    }

    /// Out of prefill worker `p`'s queue (the rest of a chunked prompt
    /// included); an envelope still on its way, or the batch in flight,
    /// drops it when it lands or ends.
    fn abort_in_prefill(&mut self, p: usize, id: RequestId) {
        let slot = &mut self.prefill[p];
        let running = slot.batch.iter().any(|it| it.id == id);
        // the rest of it queued, or all of it while its embeddings travel
        let left = match slot.queue.remove(id) {
            Some(tokens) => tokens,
            None if running => 0,
            None => self.requests[id as usize].prefill_tokens(),
        };
        if !slot.local && left > 0 {
            self.remote_place.complete(p, left as f64);
        }
        if !running {
            // its embeddings are there, or get there before this command
            let worker = WorkerRef::Prefill(p);
            self.commands.push_back(Command::Discard { worker, id });
        }
    }

    /// Out of decode worker `d`: its KV blocks are freed now when it waits or
    /// no run is in flight, else when the run in flight yields after the
    /// iteration in progress. A KV cache still on its way is freed when it
    /// lands (the worker frees it on [`Command::Release`]; the controller
    /// ignores the landing).
    fn abort_in_decode(&mut self, now: f64, d: usize, id: RequestId) {
        let work = self.work(id);
        self.decode_place.complete(d, work);
        let i = id as usize;
        let landed = self.records[i].decode_ready.is_some();
        let slot = &mut self.decode[d];
        if landed && slot.in_run && slot.sched.batch().any(|x| x == id) {
            slot.leaving.push(id);
            if !slot.yielded {
                slot.yielded = true;
                self.decide(|| Decision::DecodeYield { at: now, worker: d });
                self.commands.push_back(Command::DecodeYield { worker: d });
            }
            return;
        }
        slot.sched.remove(id);
        self.commands.push_back(Command::Release { worker: d, id });
        self.try_decode(now, d);
    }

    /// Decode worker `d`'s run ended: the sequences aborted during it leave
    /// the batch and free their blocks.
    pub(super) fn release_leaving(&mut self, d: usize) {
        let leaving = std::mem::take(&mut self.decode[d].leaving);
        for &id in &leaving {
            // one that finished in the run's last iteration left already
            self.decode[d].sched.remove(id);
            self.commands.push_back(Command::Release { worker: d, id });
        }
        let mut leaving = leaving;
        leaving.clear();
        self.decode[d].leaving = leaving;
    }

    /// Out of aggregated replica `r`: from its waiting queue now, from its
    /// running batch now or at the end of the iteration in flight.
    fn abort_in_replica(&mut self, now: f64, r: usize, id: RequestId) {
        let work = self.work(id);
        self.replica_place.complete(r, work);
        let rep = &mut self.replicas[r];
        if rep.waiting.remove(id).is_some() {
            return;
        }
        if rep.stepping {
            rep.leaving.push(id);
            return;
        }
        rep.sched.remove(id);
        self.try_replica_step(now, r);
    }

    /// Request `id`'s deadline: arrival plus the smaller of its own timeout
    /// `own` ([`Controller::set_timeout`]) and the run's
    /// ([`super::ControllerConfig::client_timeout_s`]), if either is set.
    pub(super) fn arm_deadline(&mut self, id: RequestId, own: Option<f64>) {
        let timeout = match (own, self.client_timeout_s) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(t) => t,
                None => return,
            },
        };
        let at = self.requests[id as usize].arrival + timeout;
        // non-negative finite seconds order as their bits do
        self.deadlines.push(Reverse((at.max(0.0).to_bits(), id)));
    }

    /// The earliest deadline armed, seconds (it may belong to a request that
    /// ended since: the wake-up is then a no-op).
    pub(super) fn next_deadline(&self) -> Option<f64> {
        self.deadlines
            .peek()
            .map(|Reverse((bits, _))| f64::from_bits(*bits))
    }

    /// Drop the earliest deadlines while their requests have ended, so a run
    /// whose requests all ended holds no timer.
    pub(super) fn prune_deadlines(&mut self) {
        while let Some(&Reverse((_, id))) = self.deadlines.peek() {
            if self.place[id as usize] != Place::Done {
                break;
            }
            self.deadlines.pop();
        }
    }

    /// Abort every request whose deadline is at or before `now`.
    pub(super) fn expire_deadlines(&mut self, now: f64) {
        while let Some(&Reverse((bits, id))) = self.deadlines.peek() {
            if f64::from_bits(bits) > now {
                break;
            }
            self.deadlines.pop();
            self.abort(now, id, Abort::Deadline);
        }
    }
}

#[cfg(all(test, feature = "harness"))]
mod tests {
    use crate::harness::{config_for, test_request, Cluster, Service};
    use crate::{Abort, Allocation, Decision, KvBlocks, PrefillItem, Request, RequestId, SmSplit};

    /// A decode iteration, seconds.
    const STEP_S: f64 = 0.01;

    /// Fixed times: a pass 10 ms host and 20 ms GPU, a prefill batch 5 ms,
    /// a decode iteration [`STEP_S`], a transfer 1 ms.
    struct Fixed;
    impl Service for Fixed {
        fn encode(&mut self, _: usize, _: &[RequestId], _: f64) -> (f64, f64) {
            (0.01, 0.02)
        }
        fn prefill(&mut self, _: usize, _: &[PrefillItem], _: f64) -> f64 {
            0.005
        }
        fn decode(&mut self, _: usize, _: u64, _: u64) -> f64 {
            STEP_S
        }
        fn embeddings(&mut self, _: usize, _: &[RequestId]) -> f64 {
            0.001
        }
        fn kv(&mut self, _: usize, _: RequestId) -> f64 {
            0.001
        }
        fn front_end(&mut self, id: RequestId) -> f64 {
            unreachable!("no front end in an EPD deployment (request {id})")
        }
        fn replica_step(&mut self, r: usize, _: &[RequestId], _: u64, _: u64) -> (f64, f64) {
            unreachable!("no replica {r} in an EPD deployment")
        }
    }

    /// `n` requests of 100 output tokens (1 s of decode each) arriving
    /// `gap` seconds apart on `1E+1P+1D`, client timeout `timeout`.
    fn cluster(n: usize, gap: f64, timeout: Option<f64>) -> Cluster<Fixed> {
        let alloc: Allocation = "1E(TP1)+1P(TP1)+1D(TP1)".parse().unwrap();
        let mut cfg = config_for(
            &alloc,
            None,
            SmSplit::Static(1.0),
            KvBlocks::new(1 << 12, 16),
            None,
        );
        cfg.client_timeout_s = timeout;
        let requests: Vec<Request> = (0..n)
            .map(|i| Request {
                output_tokens: 100,
                ..test_request(i, i as f64 * gap)
            })
            .collect();
        Cluster::new(crate::Controller::new(requests, cfg), Fixed)
    }

    fn dispatched(c: &Cluster<Fixed>, id: RequestId) -> bool {
        c.ctrl
            .decisions()
            .iter()
            .any(|d| matches!(d, Decision::Dispatch { ids, .. } if ids.contains(&id)))
    }

    /// Every request ended exactly once, nothing is left in the system, and
    /// every KV block is free again.
    fn all_ended_and_freed(c: &Cluster<Fixed>) {
        assert!(c.ctrl.is_finished());
        assert_eq!(c.ctrl.in_system(), 0);
        for r in c.ctrl.records() {
            let ends = [r.finish.is_some(), r.failure.is_some(), r.aborted.is_some()];
            assert_eq!(ends.iter().filter(|e| **e).count(), 1, "{r:?}");
        }
        assert_eq!(c.ctrl.decode_kv(0).used(), 0);
        assert_eq!(c.ctrl.decode_batch(0).count(), 0);
    }

    /// A client that leaves while its request waits for its encode pass
    /// costs no pass; one that leaves while its pass runs is dropped at the
    /// pass's end (no prefill); one that leaves mid-decode leaves the batch
    /// at the end of the iteration in progress, and its blocks are freed.
    #[test]
    fn an_abort_cancels_queued_work_and_stops_running_work_at_the_next_step() {
        // four arrivals in 4 ms: one pass at a time (B = 4, immediate), so
        // 1..3 queue behind request 0's pass (0 to 30 ms)
        let mut c = cluster(4, 0.001, None);
        c.abort_at(2, 0.005); // queued for encode
        c.abort_at(0, 0.015); // in its pass
        c.abort_at(1, 0.5); // mid-decode
        c.drive();
        all_ended_and_freed(&c);
        let recs = c.ctrl.records();
        assert!(!dispatched(&c, 2), "request 2 was encoded after its abort");
        assert!(dispatched(&c, 0) && recs[0].prefill_start.is_none());
        assert!(recs[1].decode_start.is_some() && recs[1].finish.is_none());
        assert!(recs[3].finish.is_some());
        assert_eq!(c.ctrl.counters().aborted, 3);
        assert!(recs
            .iter()
            .take(3)
            .all(|r| r.aborted == Some(Abort::Disconnected)));
        // the run holding request 1 yields at once; the next holds only 3
        let log = c.ctrl.decisions();
        let at = log
            .iter()
            .position(|d| matches!(d, Decision::Abort { id: 1, .. }))
            .unwrap();
        assert!(matches!(
            log[at + 1],
            Decision::DecodeYield { worker: 0, .. }
        ));
        let next_run = log[at..]
            .iter()
            .find_map(|d| match d {
                Decision::DecodeRun { at, batch, .. } => Some((*at, *batch)),
                _ => None,
            })
            .unwrap();
        assert_eq!(next_run.1, 1, "{log:?}");
        assert!(next_run.0 - 0.5 <= STEP_S + 1e-9, "{next_run:?}");
    }

    /// Each request takes about 1.04 s, and waits 30 ms more than the one
    /// before for its encode pass; with a client timeout of 1.1 s the slowest
    /// requests are aborted at their deadline (not failed) and
    /// the rest finish as they would without it.
    #[test]
    fn a_deadline_aborts_what_has_not_finished_by_then() {
        let mut without = cluster(8, 0.001, None);
        without.drive();
        let mut with = cluster(8, 0.001, Some(1.1));
        with.drive();
        all_ended_and_freed(&with);
        let (a, b) = (without.ctrl.records(), with.ctrl.records());
        let mut late = 0;
        for (x, y) in a.iter().zip(b) {
            let e2e = x.e2e().unwrap();
            if e2e <= 1.1 {
                assert_eq!(x.finish, y.finish, "request {}", x.id);
            } else {
                late += 1;
                assert_eq!(y.aborted, Some(Abort::Deadline), "request {}", x.id);
                assert!(y.failure.is_none());
            }
        }
        assert!(late > 0 && late < 8, "{late} late requests");
        assert_eq!(with.ctrl.counters().aborted, late);
        assert_eq!(with.ctrl.counters().failed, 0);
    }

    /// A request whose own timeout is shorter than the run's is aborted at
    /// its own; an abort of a request that ended is a no-op.
    #[test]
    fn a_requests_own_timeout_and_a_late_abort() {
        let mut c = cluster(2, 0.5, Some(100.0));
        c.ctrl.set_timeout(1, 0.2);
        c.abort_at(0, 50.0);
        c.drive();
        all_ended_and_freed(&c);
        let r = c.ctrl.records();
        assert!(r[0].finish.is_some() && r[0].aborted.is_none());
        assert_eq!(r[1].aborted, Some(Abort::Deadline));
        let at = c.ctrl.decisions().iter().find_map(|d| match d {
            Decision::Abort { at, id: 1, .. } => Some(*at),
            _ => None,
        });
        assert!(at.is_some_and(|t| (t - 0.7).abs() < 1e-9), "{at:?}");
    }
}
