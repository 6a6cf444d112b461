//! A virtual-clock harness that drives the encode front end of the scheduler —
//! placement, the [`Batcher`] of each encode worker and the [`Router`] — with
//! no simulator and no executor, so every policy can be tested alone.
//!
//! Encode passes take `service(k)` seconds for a batch of `k`; nothing
//! downstream of encode is modelled here.
//!
//! ```
//! use easerve_sched::{harness::EncodeHarness, DispatchPolicy, RouterPolicy};
//! let arrivals: Vec<f64> = (0..100).map(|i| i as f64 * 0.01).collect();
//! let mut h = EncodeHarness::new(
//!     2, &DispatchPolicy::poisson_gap(), 8, &RouterPolicy::Deficit, 0.5,
//!     |k| 0.05 + 0.01 * k as f64, arrivals,
//! );
//! h.drive();
//! assert_eq!(h.dispatched(), 100);
//! ```

use crate::{Batcher, DispatchPolicy, LeastOutstanding, RequestId, Route, Router, RouterPolicy};
use std::collections::VecDeque;

/// One encode pass started by the harness.
#[derive(Clone, Debug, PartialEq)]
pub struct DispatchRecord {
    /// When the pass started.
    pub time: f64,
    /// Encode worker index.
    pub worker: usize,
    /// Requests in the micro-batch, FCFS.
    pub ids: Vec<RequestId>,
    /// Arrival time of the oldest request in the batch.
    pub oldest_arrival: f64,
    /// When the worker last became free before this pass.
    pub free_since: f64,
}

struct Worker {
    batcher: Batcher,
    busy_until: Option<f64>,
    batch_len: usize,
    free_since: f64,
}

/// The harness: a virtual clock, a list of arrival times, `n` encode workers.
pub struct EncodeHarness {
    /// Current virtual time, seconds.
    pub now: f64,
    arrivals: VecDeque<f64>,
    arrival_of: Vec<f64>,
    workers: Vec<Worker>,
    placement: LeastOutstanding,
    router: Router,
    service: Box<dyn Fn(usize) -> f64>,
    /// Every pass started, in order.
    pub log: Vec<DispatchRecord>,
    /// Every routing decision, in order.
    pub routes: Vec<(RequestId, Route)>,
}

impl EncodeHarness {
    /// A harness with `workers` encode workers, each batching with `policy` and
    /// bound `max_batch`, routing with `router` at offload `s`; passes take
    /// `service(k)` seconds; requests arrive at `arrivals` (seconds, ascending).
    pub fn new(
        workers: usize,
        policy: &DispatchPolicy,
        max_batch: usize,
        router: &RouterPolicy,
        s: f64,
        service: impl Fn(usize) -> f64 + 'static,
        arrivals: Vec<f64>,
    ) -> Self {
        let workers = (0..workers.max(1))
            .map(|_| Worker {
                batcher: Batcher::new(policy, max_batch, &service),
                busy_until: None,
                batch_len: 0,
                free_since: 0.0,
            })
            .collect::<Vec<_>>();
        EncodeHarness {
            now: 0.0,
            arrival_of: Vec::with_capacity(arrivals.len()),
            arrivals: arrivals.into(),
            placement: LeastOutstanding::new(workers.len()),
            workers,
            router: Router::new(router, s),
            service: Box::new(service),
            log: Vec::new(),
            routes: Vec::new(),
        }
    }

    /// Requests dispatched so far.
    pub fn dispatched(&self) -> usize {
        self.log.iter().map(|r| r.ids.len()).sum()
    }

    fn next_time(&self) -> Option<f64> {
        let mut t = self.arrivals.front().copied();
        let mut consider = |x: f64| t = Some(t.map_or(x, |y: f64| y.min(x)));
        for w in &self.workers {
            match w.busy_until {
                Some(b) => consider(b),
                None => {
                    if let Some(wake) = w.batcher.poll_timeout() {
                        consider(wake.max(self.now));
                    }
                }
            }
        }
        t
    }

    /// Advance to the next event and process everything due then; false when
    /// nothing is left to do.
    pub fn step(&mut self) -> bool {
        let Some(t) = self.next_time() else {
            return false;
        };
        debug_assert!(t >= self.now, "time went back");
        self.now = t;
        for (i, w) in self.workers.iter_mut().enumerate() {
            if w.busy_until.is_some_and(|b| b <= t) {
                w.busy_until = None;
                w.free_since = t;
                self.placement.complete(i, w.batch_len as f64);
            }
        }
        while self.arrivals.front().is_some_and(|&a| a <= t) {
            let a = self.arrivals.pop_front().unwrap_or(t);
            let id = self.arrival_of.len() as RequestId;
            self.arrival_of.push(a);
            let w = self.placement.assign(1.0);
            self.workers[w].batcher.on_arrival(t, id);
        }
        for (i, w) in self.workers.iter_mut().enumerate() {
            if let Some(ids) = w.batcher.poll_dispatch(t, w.busy_until.is_none()) {
                let oldest_arrival = ids
                    .iter()
                    .map(|&id| self.arrival_of[id as usize])
                    .fold(f64::INFINITY, f64::min);
                w.busy_until = Some(t + (self.service)(ids.len()));
                w.batch_len = ids.len();
                for &id in &ids {
                    self.routes.push((id, self.router.route()));
                }
                self.log.push(DispatchRecord {
                    time: t,
                    worker: i,
                    ids,
                    oldest_arrival,
                    free_since: w.free_since,
                });
            }
        }
        true
    }

    /// Run until nothing is left.
    pub fn drive(&mut self) {
        while self.step() {}
    }

    /// Run at most `max_steps` steps; true when everything finished.
    pub fn drive_bounded(&mut self, max_steps: usize) -> bool {
        for _ in 0..max_steps {
            if !self.step() {
                return true;
            }
        }
        self.next_time().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t_enc(k: usize) -> f64 {
        0.3 + 0.02 * k as f64
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// No request is held by the batching rule beyond max_age = T_enc(B)
        /// once its worker is free; every request is dispatched exactly once.
        #[test]
        fn poisson_gap_respects_max_age_and_conserves_requests(
            gaps in proptest::collection::vec(0.0f64..0.5, 1..300),
            workers in 1usize..4,
            b in 1usize..16,
        ) {
            let mut t = 0.0;
            let arrivals: Vec<f64> = gaps.iter().map(|g| { t += g; t }).collect();
            let n = arrivals.len();
            let mut h = EncodeHarness::new(workers, &DispatchPolicy::poisson_gap(), b,
                &RouterPolicy::Deficit, 0.5, t_enc, arrivals);
            prop_assert!(h.drive_bounded(100_000));
            let max_age = t_enc(b);
            let mut seen = vec![false; n];
            for r in &h.log {
                prop_assert!(r.ids.len() <= b);
                let hold_from = r.oldest_arrival.max(r.free_since);
                prop_assert!(r.time <= hold_from.max(r.oldest_arrival + max_age) + 1e-9,
                    "dispatch at {} oldest {} free since {}", r.time, r.oldest_arrival, r.free_since);
                for &id in &r.ids {
                    prop_assert!(!seen[id as usize], "request {} dispatched twice", id);
                    seen[id as usize] = true;
                }
            }
            prop_assert!(seen.iter().all(|s| *s));
            prop_assert_eq!(h.routes.len(), n);
        }
    }

    #[test]
    fn batches_grow_with_load() {
        let mean_batch = |rate: f64| {
            let arrivals: Vec<f64> = (0..400).map(|i| i as f64 / rate).collect();
            let mut h = EncodeHarness::new(
                1,
                &DispatchPolicy::poisson_gap(),
                16,
                &RouterPolicy::Deficit,
                1.0,
                t_enc,
                arrivals,
            );
            h.drive();
            h.dispatched() as f64 / h.log.len() as f64
        };
        let (low, high) = (mean_batch(0.5), mean_batch(40.0));
        assert!((low - 1.0).abs() < 1e-9, "low-load batches {low}");
        assert!(high > 8.0, "high-load batches {high}");
    }
}
