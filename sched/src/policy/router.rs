//! Remote/local prefill routing (EAServe §3.3).

use crate::RouterPolicy;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Where one request's prefill runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// On a remote prefill worker (its own GPUs).
    Remote,
    /// On the local prefill worker co-located on the encode GPU.
    Local,
}

#[derive(Clone, Debug)]
enum Kind {
    Deficit { d: f64 },
    Random(Box<ChaCha8Rng>),
    Windowed { window: u32, pos: u32 },
}

/// Splits a request stream so that a fraction `s` goes remote.
///
/// The deficit counter (the default): accumulator `d = 0`; per request `d += s`;
/// if `d ≥ 1` send remote and `d −= 1`, else local. After `n` requests the remote
/// count stays within ±1 of `n·s`; no more than `⌈1/(1−s)⌉` consecutive remote or
/// `⌈1/s⌉` consecutive local decisions occur. `O(1)` per request.
#[derive(Clone, Debug)]
pub struct Router {
    s: f64,
    kind: Kind,
    /// `(Λ, λ̂)`: the rate `s` was tuned at and the online estimate, when the
    /// ratio tracks the rate ([`Router::tracking`]).
    track: Option<(f64, crate::RateEstimator)>,
}

impl Router {
    /// A router sending fraction `s ∈ [0, 1]` remote (clamped into that range).
    pub fn new(policy: &RouterPolicy, s: f64) -> Self {
        let s = if s.is_nan() { 1.0 } else { s.clamp(0.0, 1.0) };
        let kind = match *policy {
            RouterPolicy::Deficit => Kind::Deficit { d: 0.0 },
            RouterPolicy::Random { seed } => {
                Kind::Random(Box::new(ChaCha8Rng::seed_from_u64(seed)))
            }
            RouterPolicy::Windowed { window } => Kind::Windowed {
                window: window.max(1),
                pos: 0,
            },
        };
        Router {
            s,
            kind,
            track: None,
        }
    }

    /// The same router with its ratio tracking the arrival rate: `s` was
    /// tuned (by HAS) at `rate` requests/s, so the remote prefill pool was
    /// sized for `s·rate`; with the online estimate λ̂ (an exponentially
    /// decayed arrival count of time constant `tau_s`,
    /// [`crate::RateEstimate::Ewma`]) the router sends remote the fraction
    /// `s' = clamp(s·rate/λ̂, 0, 1)`, which keeps the remote pool's load at
    /// that design point: a surge goes to the local prefill workers on the
    /// encode GPUs, a lull sends more to the remote pool. At λ̂ = rate,
    /// `s' = s`; `s = 1` is not tracked (no local worker). The other way
    /// round (keeping the local load at `(1 − s)·rate`) was measured too and
    /// made the P99 TTFT after a step worse on the image scenario (README,
    /// "Changing load").
    pub fn tracking(mut self, rate: f64, tau_s: f64) -> Self {
        if rate > 0.0 && rate.is_finite() && self.s < 1.0 {
            let est = crate::RateEstimator::of(crate::RateEstimate::Ewma { tau_s }, Some(rate));
            self.track = Some((rate, est));
        }
        self
    }

    /// An arrival at `now` (seconds): feeds the estimate of a tracking router.
    pub fn observe(&mut self, now: f64) {
        if let Some((_, est)) = &mut self.track {
            est.observe(now);
        }
    }

    /// Set the offload ratio `s` (clamped into `[0, 1]`; NaN keeps it), as a
    /// planner changes it live; a tracking router keeps its design rate.
    pub fn set_offload(&mut self, s: f64) {
        if !s.is_nan() {
            self.s = s.clamp(0.0, 1.0);
        }
    }

    /// The configured offload ratio `s`.
    pub fn offload(&self) -> f64 {
        self.s
    }

    /// The ratio in force: `s`, or for a tracking router `s'` at the current
    /// estimate ([`Router::tracking`]).
    pub fn effective_offload(&self) -> f64 {
        match &self.track {
            Some((rate, est)) => match est.rate() {
                Some(l) if l > 0.0 => (self.s * rate / l).clamp(0.0, 1.0),
                _ => self.s,
            },
            None => self.s,
        }
    }

    /// Decide the next request's route.
    pub fn route(&mut self) -> Route {
        let s = self.effective_offload();
        match &mut self.kind {
            Kind::Deficit { d } => {
                *d += s;
                if *d >= 1.0 {
                    *d -= 1.0;
                    Route::Remote
                } else {
                    Route::Local
                }
            }
            Kind::Random(rng) => {
                if s >= 1.0 || (s > 0.0 && rng.gen::<f64>() < s) {
                    Route::Remote
                } else {
                    Route::Local
                }
            }
            Kind::Windowed { window, pos } => {
                let remote_per_window = (s * *window as f64).floor() as u32;
                let r = if *pos < remote_per_window {
                    Route::Remote
                } else {
                    Route::Local
                };
                *pos = (*pos + 1) % *window;
                r
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn longest_runs(routes: &[Route]) -> (usize, usize) {
        let (mut best_r, mut best_l, mut run, mut prev) = (0, 0, 0, None);
        for &r in routes {
            run = if Some(r) == prev { run + 1 } else { 1 };
            prev = Some(r);
            match r {
                Route::Remote => best_r = best_r.max(run),
                Route::Local => best_l = best_l.max(run),
            }
        }
        (best_r, best_l)
    }

    #[test]
    fn tracking_router_keeps_the_remote_load_at_its_design_point() {
        // s = 0.6 tuned at 2 req/s: remote gets 1.2 req/s. At 4 req/s the
        // router should send 0.6·2/4 = 0.3 remote (remote still 1.2 req/s).
        let mut r = Router::new(&RouterPolicy::Deficit, 0.6).tracking(2.0, 5.0);
        assert!(
            (r.effective_offload() - 0.6).abs() < 1e-12,
            "seeded at the design rate"
        );
        let mut t = 0.0;
        let mut remote = 0;
        for i in 0..4000 {
            t += 0.25;
            r.observe(t);
            if i >= 2000 && r.route() == Route::Remote {
                remote += 1;
            }
        }
        // λ̂ = 4 + 1/τ (the EWMA's bias, RateEstimate::Ewma): s' = 0.295
        assert!((r.effective_offload() - 0.3).abs() < 0.01);
        assert!((remote as f64 / 2000.0 - 0.3).abs() < 0.015, "{remote}");
        // a fixed router ignores the rate
        let mut f = Router::new(&RouterPolicy::Deficit, 0.6);
        f.observe(1.0);
        f.observe(1.01);
        assert_eq!(f.effective_offload(), 0.6);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn deficit_count_within_one_of_ns(s in 0.0f64..=1.0, n in 1usize..3000) {
            let mut r = Router::new(&RouterPolicy::Deficit, s);
            let mut remote = 0usize;
            for i in 1..=n {
                if r.route() == Route::Remote { remote += 1; }
                let target = i as f64 * s;
                prop_assert!((remote as f64 - target).abs() <= 1.0 + 1e-9,
                    "after {} requests: {} remote vs n·s = {}", i, remote, target);
            }
        }

        #[test]
        fn deficit_runs_are_bounded(s in 0.0f64..=1.0, n in 1usize..3000) {
            let mut r = Router::new(&RouterPolicy::Deficit, s);
            let routes: Vec<Route> = (0..n).map(|_| r.route()).collect();
            let (remote_run, local_run) = longest_runs(&routes);
            if s < 1.0 {
                prop_assert!(remote_run as f64 <= (1.0 / (1.0 - s)).ceil(), "remote run {} at s={}", remote_run, s);
            }
            if s > 0.0 {
                prop_assert!(local_run as f64 <= (1.0 / s).ceil(), "local run {} at s={}", local_run, s);
            }
        }

        #[test]
        fn windowed_hits_floor_sw_per_window(s in 0.0f64..=1.0, w in 1u32..64) {
            let mut r = Router::new(&RouterPolicy::Windowed { window: w }, s);
            let remote = (0..w).filter(|_| r.route() == Route::Remote).count();
            prop_assert_eq!(remote as u32, (s * w as f64).floor() as u32);
        }
    }

    #[test]
    fn extremes() {
        for policy in [RouterPolicy::Deficit, RouterPolicy::Random { seed: 3 }] {
            let mut all_remote = Router::new(&policy, 1.0);
            let mut all_local = Router::new(&policy, 0.0);
            for _ in 0..100 {
                assert_eq!(all_remote.route(), Route::Remote);
                assert_eq!(all_local.route(), Route::Local);
            }
        }
    }

    #[test]
    fn random_is_noisier_than_deficit() {
        // the reason the deficit counter exists: at s = 0.5 random routing
        // produces long same-direction runs, the deficit counter alternates.
        let mut rnd = Router::new(&RouterPolicy::Random { seed: 7 }, 0.5);
        let mut def = Router::new(&RouterPolicy::Deficit, 0.5);
        let a: Vec<Route> = (0..2000).map(|_| rnd.route()).collect();
        let b: Vec<Route> = (0..2000).map(|_| def.route()).collect();
        let (ra, la) = longest_runs(&a);
        let (rb, lb) = longest_runs(&b);
        assert!(ra.max(la) >= 6, "random longest run {}", ra.max(la));
        assert_eq!(rb.max(lb), 1);
    }
}
