//! Encode dispatch: when an encode worker turns its queue into a micro-batch.

use crate::{DispatchPolicy, RequestId};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;

/// Number of recent inter-arrival gaps the online rate estimate averages over.
///
/// A window (rather than an EWMA) keeps the estimate exact for a stationary
/// Poisson stream after 16 arrivals and forgets a rate change within 16 arrivals;
/// 16 gaps give a relative standard error of 1/√16 = 25 % on λ̂, which moves the
/// threshold `g` by the same fraction — small next to the spread of `T_enc(k)`.
pub const RATE_WINDOW: usize = 16;

/// How a batcher (and, with [`RateEstimate::Ewma`], the offload router)
/// estimates the arrival rate λ̂.
///
/// Parsed from and shown as `window`, `fixed` or `ewma:TAU_S`
/// (`deployment.rate_estimator`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RateEstimate {
    /// The mean of the last [`RATE_WINDOW`] gaps, the scenario's rate until
    /// the first gap (the behaviour every report before `rate_estimator`
    /// was written with; the offload ratio stays fixed).
    #[default]
    Window,
    /// The scenario's rate per encode worker throughout, never updated (the
    /// rate HAS tuned for; the offload ratio stays fixed).
    Fixed,
    /// An exponentially weighted count of arrivals with time constant
    /// `tau_s`: `λ̂ = S/τ` with `S = Σ e^(−(t − tᵢ)/τ)` over past arrivals
    /// `tᵢ`, updated at each arrival as `S ← S·e^(−gap/τ) + 1` and read at
    /// the latest one (the exponentially weighted moving average of the
    /// arrival process itself; unlike an EWMA of the gaps, whose weight
    /// would grow with the gap and bias the mean gap up to `2/λ`). For a
    /// steady Poisson stream `E[λ̂] = λ + 1/τ` (the arrival just counted)
    /// and its relative standard error is `1/√(2λτ)`; after a step it
    /// forgets the old rate as `e^(−t/τ)`. Seeded with `S = τ·` the
    /// scenario's rate. The offload router tracks the rate too
    /// ([`crate::Router::tracking`]).
    Ewma {
        /// Time constant τ, seconds (> 0).
        tau_s: f64,
    },
}

impl std::fmt::Display for RateEstimate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RateEstimate::Window => write!(f, "window"),
            RateEstimate::Fixed => write!(f, "fixed"),
            RateEstimate::Ewma { tau_s } => write!(f, "ewma:{tau_s}"),
        }
    }
}

impl std::str::FromStr for RateEstimate {
    type Err = String;
    /// `window`, `fixed` or `ewma:TAU_S` (`TAU_S` seconds, finite, > 0).
    fn from_str(s: &str) -> Result<RateEstimate, String> {
        match s.trim() {
            "window" => Ok(RateEstimate::Window),
            "fixed" => Ok(RateEstimate::Fixed),
            other => {
                let tau = other
                    .strip_prefix("ewma:")
                    .ok_or_else(|| format!("`{other}`: allowed window, fixed, ewma:TAU_S"))?;
                match tau.trim().parse::<f64>() {
                    Ok(t) if t.is_finite() && t > 0.0 => Ok(RateEstimate::Ewma { tau_s: t }),
                    _ => Err(format!(
                        "`{other}`: the EWMA time constant must be seconds > 0, e.g. ewma:30"
                    )),
                }
            }
        }
    }
}

/// Online arrival-rate estimate ([`RateEstimate`]): by default from the last
/// [`RATE_WINDOW`] inter-arrival gaps.
#[derive(Clone, Debug, Default)]
pub struct RateEstimator {
    gaps: VecDeque<f64>,
    sum: f64,
    last: Option<f64>,
    hint: Option<f64>,
    kind: RateEstimate,
    /// The decayed arrival count `S` (`Ewma` only).
    decayed: f64,
}

impl RateEstimator {
    /// An estimator seeded with an optional rate hint (requests/s), used until
    /// the first gap is observed.
    pub fn new(hint: Option<f64>) -> Self {
        RateEstimator::of(RateEstimate::Window, hint)
    }

    /// An estimator of kind `kind` seeded with an optional rate hint (requests/s).
    pub fn of(kind: RateEstimate, hint: Option<f64>) -> Self {
        let hint = hint.filter(|r| *r > 0.0 && r.is_finite());
        let decayed = match (kind, hint) {
            (RateEstimate::Ewma { tau_s }, Some(h)) => h * tau_s,
            _ => 0.0,
        };
        RateEstimator {
            hint,
            kind,
            decayed,
            ..Default::default()
        }
    }

    /// Record an arrival at `now` (seconds).
    pub fn observe(&mut self, now: f64) {
        if let RateEstimate::Ewma { tau_s } = self.kind {
            let gap = self.last.map_or(0.0, |l| (now - l).max(0.0));
            self.decayed = self.decayed * (-gap / tau_s).exp() + 1.0;
        }
        if let Some(last) = self.last {
            let gap = (now - last).max(0.0);
            match self.kind {
                RateEstimate::Window => {
                    self.gaps.push_back(gap);
                    self.sum += gap;
                    if self.gaps.len() > RATE_WINDOW {
                        self.sum -= self.gaps.pop_front().unwrap_or(0.0);
                    }
                }
                RateEstimate::Fixed | RateEstimate::Ewma { .. } => {}
            }
        }
        self.last = Some(now);
    }

    /// Estimated arrival rate λ̂ in requests/s, or `None` before any gap (and
    /// without a hint). Simultaneous arrivals only (all gaps 0) give `+∞`.
    pub fn rate(&self) -> Option<f64> {
        match self.kind {
            RateEstimate::Window => {
                if self.gaps.is_empty() {
                    return self.hint;
                }
                let sum = self.sum.max(0.0);
                Some(if sum > 0.0 {
                    self.gaps.len() as f64 / sum
                } else {
                    f64::INFINITY
                })
            }
            RateEstimate::Fixed => self.hint,
            RateEstimate::Ewma { tau_s } => (self.decayed > 0.0)
                .then_some(self.decayed / tau_s)
                .or(self.hint),
        }
    }

    /// Time of the last observed arrival.
    pub fn last_arrival(&self) -> Option<f64> {
        self.last
    }
}

/// The resolved parameters of a batcher, recorded in the run report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatcherParams {
    /// Policy name.
    pub policy: String,
    /// Batch bound `B`.
    pub max_batch: usize,
    /// Gap quantile `q` (Poisson-gap only).
    pub q: Option<f64>,
    /// Max-age safety valve, seconds (Poisson-gap, queue-length).
    pub max_age_s: Option<f64>,
    /// Fixed timeout, seconds (fixed-timeout only).
    pub timeout_s: Option<f64>,
    /// Queue-length trigger (queue-length only).
    pub queue_length: Option<usize>,
    /// `W(k) = T_enc(k)` for k = 1..=B, seconds: the wait budget of the
    /// Poisson-gap rule, from the encode cost model.
    pub wait_budget_s: Vec<f64>,
}

#[derive(Clone, Debug)]
enum Rule {
    Immediate,
    FixedTimeout(f64),
    QueueLength { k: usize, max_age: f64 },
    PoissonGap { q: f64, max_age: f64 },
}

/// The encode dispatcher of one encode worker (EAServe §3.2).
///
/// # Driving it
/// 1. On each arrival at this worker call [`Batcher::on_arrival`].
/// 2. Whenever the encoder is free (after an arrival, after a pass completes, at
///    a wake-up) call [`Batcher::poll_dispatch`]; a returned batch is to be
///    encoded now, in FCFS order.
/// 3. If it returned `None` with requests queued, arm a timer for
///    [`Batcher::poll_timeout`] and call `poll_dispatch` again when it fires.
///    A spurious or stale wake-up returns `None` and is harmless.
///
/// # The Poisson-gap rule
/// With `k` requests queued and the encoder free:
/// * `k ≥ B`: dispatch `B` now.
/// * otherwise estimate λ̂ online ([`RateEstimator`]) and take
///   `g = −ln(1−q)/λ̂`, the q-quantile of an exponential inter-arrival gap.
/// * if `g > W(k) = T_enc(k)` (the next request is unlikely to come within one
///   pass of the batch we hold), dispatch now;
/// * otherwise wait: dispatch when no request has arrived for `g` since the last
///   arrival, or the oldest queued request's age reaches `max_age`.
///
/// Defaults need no per-workload tuning: `q = 0.9`, `W(k) = T_enc(k)`,
/// `max_age = T_enc(B)`.
#[derive(Clone, Debug)]
pub struct Batcher {
    rule: Rule,
    max_batch: usize,
    /// (id, arrival time at this worker, whether it has items to encode)
    queue: VecDeque<(RequestId, f64, bool)>,
    /// Queued requests with items to encode (all of them without an
    /// encoder cache).
    encoding: usize,
    rate: RateEstimator,
    wait_budget: Vec<f64>,
    params: BatcherParams,
}

impl Batcher {
    /// A batcher for `policy` with batch bound `max_batch` (`B ≥ 1`).
    /// `encode_latency(k)` is the encode time of a micro-batch of `k` requests
    /// (seconds), from the cost model; it sets `W(k)` and the default `max_age`.
    ///
    /// # Panics
    /// If `max_batch == 0` (callers validate user input before building).
    pub fn new(
        policy: &DispatchPolicy,
        max_batch: usize,
        encode_latency: impl Fn(usize) -> f64,
    ) -> Self {
        assert!(max_batch >= 1, "batch bound B must be at least 1");
        let wait_budget: Vec<f64> = (1..=max_batch).map(&encode_latency).collect();
        let t_b = wait_budget[max_batch - 1];
        let (rule, hint) = match *policy {
            DispatchPolicy::Immediate => (Rule::Immediate, None),
            DispatchPolicy::FixedTimeout { timeout_s } => (Rule::FixedTimeout(timeout_s), None),
            DispatchPolicy::QueueLength { k, max_age_s } => (
                Rule::QueueLength {
                    k: k.clamp(1, max_batch),
                    max_age: max_age_s.unwrap_or(t_b),
                },
                None,
            ),
            DispatchPolicy::PoissonGap {
                q,
                max_age_s,
                rate_hint,
            } => (
                Rule::PoissonGap {
                    q,
                    max_age: max_age_s.unwrap_or(t_b),
                },
                rate_hint,
            ),
        };
        let max_batch = if matches!(rule, Rule::Immediate) {
            1
        } else {
            max_batch
        };
        let params = BatcherParams {
            policy: policy.to_string(),
            max_batch,
            q: match rule {
                Rule::PoissonGap { q, .. } => Some(q),
                _ => None,
            },
            max_age_s: match rule {
                Rule::PoissonGap { max_age, .. } | Rule::QueueLength { max_age, .. } => {
                    Some(max_age)
                }
                _ => None,
            },
            timeout_s: match rule {
                Rule::FixedTimeout(t) => Some(t),
                _ => None,
            },
            queue_length: match rule {
                Rule::QueueLength { k, .. } => Some(k),
                _ => None,
            },
            wait_budget_s: wait_budget.clone(),
        };
        Batcher {
            rule,
            max_batch,
            queue: VecDeque::new(),
            encoding: 0,
            rate: RateEstimator::new(hint),
            wait_budget,
            params,
        }
    }

    /// The same batcher estimating its arrival rate by `kind` (seeded with
    /// the policy's rate hint).
    pub fn with_estimator(mut self, kind: RateEstimate) -> Self {
        self.rate = RateEstimator::of(kind, self.rate.hint);
        self
    }

    /// Set the batch bound `B` live, within `1..=` the bound it was built
    /// with (its `W(k)` table ends there); returns the bound in force. An
    /// `Immediate` batcher keeps 1.
    pub fn set_max_batch(&mut self, b: usize) -> usize {
        if !matches!(self.rule, Rule::Immediate) {
            self.max_batch = b.clamp(1, self.wait_budget.len());
        }
        self.max_batch
    }

    /// The batch bound `B` in force.
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// The resolved parameters (for the report).
    pub fn params(&self) -> &BatcherParams {
        &self.params
    }

    /// Requests waiting for a pass.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no request is waiting.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The current arrival-rate estimate (requests/s) of this worker.
    pub fn rate_estimate(&self) -> Option<f64> {
        self.rate.rate()
    }

    /// The Poisson-gap threshold `g = −ln(1−q)/λ̂` in seconds for the current
    /// rate estimate (`None` for other policies or before any estimate).
    pub fn gap_threshold(&self) -> Option<f64> {
        match self.rule {
            Rule::PoissonGap { q, .. } => self.rate.rate().map(|r| gap_threshold(q, r)),
            _ => None,
        }
    }

    /// A request arrives at this worker at `now`.
    pub fn on_arrival(&mut self, now: f64, id: RequestId) {
        self.on_arrival_with(now, id, true);
    }

    /// A request arrives at this worker at `now`; `encodes`: whether it
    /// has items to encode (false when the encoder cache holds them all).
    /// The Poisson-gap rule counts only requests that encode: they set the
    /// rate it estimates and the `k` of `W(k) = T_enc(k)`, and a batch of
    /// requests that encode nothing goes at once (waiting would amortize
    /// nothing).
    pub fn on_arrival_with(&mut self, now: f64, id: RequestId, encodes: bool) {
        self.queue.push_back((id, now, encodes));
        if encodes {
            self.encoding += 1;
            self.rate.observe(now);
        }
    }

    /// Remove and return every queued request, FCFS (its worker died: they
    /// go elsewhere).
    pub fn drain_queued(&mut self) -> Vec<RequestId> {
        self.encoding = 0;
        self.queue.drain(..).map(|(id, _, _)| id).collect()
    }

    /// Take every entry of request `id` out of the queue (its client left
    /// before its pass started); returns how many there were (more than one
    /// for a request queued as shards). A timer armed for the old queue may
    /// then fire early: the wake-up re-examines the queue and is harmless.
    pub fn remove(&mut self, id: RequestId) -> usize {
        let before = self.queue.len();
        let mut encodes = 0;
        self.queue.retain(|&(q, _, e)| {
            let keep = q != id;
            encodes += usize::from(!keep && e);
            keep
        });
        self.encoding -= encodes;
        before - self.queue.len()
    }

    /// Whether the batch held now should go, given the encoder is free.
    fn ready(&self, now: f64) -> bool {
        let k = self.queue.len();
        if k == 0 {
            return false;
        }
        if k >= self.max_batch {
            return true;
        }
        let oldest = self.queue[0].1;
        match self.rule {
            Rule::Immediate => true,
            // deadlines are compared as `now >= start + span`, the same sum
            // `poll_timeout` returns, so a wake-up at that time always fires.
            Rule::FixedTimeout(t) => now >= oldest + t,
            Rule::QueueLength {
                k: trigger,
                max_age,
            } => k >= trigger || now >= oldest + max_age,
            Rule::PoissonGap { q, max_age } => {
                let Some(rate) = self.rate.rate() else {
                    return true;
                };
                let Some(w) = self.encoding.checked_sub(1) else {
                    return true;
                };
                let g = gap_threshold(q, rate);
                if g > self.wait_budget[w.min(k - 1)] {
                    return true;
                }
                let last = self.rate.last_arrival().unwrap_or(oldest);
                now >= last + g || now >= oldest + max_age
            }
        }
    }

    /// If the encoder is free and the rule says go, remove and return the next
    /// micro-batch (at most `B` request ids, FCFS). `None` means hold: either
    /// nothing is queued, the encoder is busy, or the rule waits (then see
    /// [`Batcher::poll_timeout`]).
    pub fn poll_dispatch(&mut self, now: f64, encoder_free: bool) -> Option<Vec<RequestId>> {
        let mut ids = Vec::new();
        self.poll_dispatch_into(now, encoder_free, &mut ids)
            .then_some(ids)
    }

    /// [`Batcher::poll_dispatch`] into `ids` (cleared first when the rule
    /// says go, so a caller can keep one vector for every pass): true when a
    /// micro-batch was removed into it; `ids` is untouched otherwise.
    #[must_use]
    pub fn poll_dispatch_into(
        &mut self,
        now: f64,
        encoder_free: bool,
        ids: &mut Vec<RequestId>,
    ) -> bool {
        if !encoder_free || !self.ready(now) {
            return false;
        }
        let n = self.queue.len().min(self.max_batch);
        ids.clear();
        for (id, _, encodes) in self.queue.drain(..n) {
            self.encoding -= usize::from(encodes);
            ids.push(id);
        }
        true
    }

    /// When the held batch should be re-examined (absolute seconds), if the rule
    /// is waiting on a timer. The earliest of the gap deadline and the max-age
    /// deadline for Poisson-gap; the timeout for fixed-timeout.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<f64> {
        let oldest = self.queue.front()?.1;
        match self.rule {
            Rule::Immediate => None,
            Rule::FixedTimeout(t) => Some(oldest + t),
            Rule::QueueLength { max_age, .. } => Some(oldest + max_age),
            Rule::PoissonGap { q, max_age } => {
                let rate = self.rate.rate()?;
                let g = gap_threshold(q, rate);
                let last = self.rate.last_arrival().unwrap_or(oldest);
                Some((last + g).min(oldest + max_age))
            }
        }
    }
}

/// `g = −ln(1−q)/λ`: the q-quantile of an exponential gap with rate `λ` (seconds).
pub(crate) fn gap_threshold(q: f64, rate: f64) -> f64 {
    -(1.0 - q).ln() / rate
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t_enc(k: usize) -> f64 {
        0.5 + 0.05 * k as f64
    }

    fn pg(hint: Option<f64>) -> DispatchPolicy {
        DispatchPolicy::PoissonGap {
            q: 0.9,
            max_age_s: None,
            rate_hint: hint,
        }
    }

    /// Arrival times of a Poisson stream at `rate` from `t0`, `n` of them.
    fn poisson(rate: f64, t0: f64, n: usize, seed: u64) -> Vec<f64> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut t = t0;
        (0..n)
            .map(|_| {
                t += -(1.0 - rng.gen::<f64>()).ln() / rate;
                t
            })
            .collect()
    }

    #[test]
    fn estimators_converge_after_a_step_and_fixed_holds_its_hint() {
        for seed in 0..5 {
            let before = poisson(1.0, 0.0, 300, seed);
            let after = poisson(4.0, before[299], 2000, seed + 100);
            let tau = 30.0;
            let mut ewma = RateEstimator::of(RateEstimate::Ewma { tau_s: tau }, Some(1.0));
            let mut window = RateEstimator::of(RateEstimate::Window, Some(1.0));
            let mut fixed = RateEstimator::of(RateEstimate::Fixed, Some(1.0));
            for &t in &before {
                for e in [&mut ewma, &mut window, &mut fixed] {
                    e.observe(t);
                }
            }
            let near = |x: f64, want: f64, tol: f64| (x / want - 1.0).abs() < tol;
            assert!(near(ewma.rate().unwrap(), 1.0, 0.35), "seed {seed}");
            // after 5 τ at the new rate the EWMA has forgotten the old one:
            // e^-5 of its weight left, and σ ≈ 1/√(2λτ) ≈ 6.5 %
            let step = before[299];
            let mut settled_at = None;
            for &t in &after {
                for e in [&mut ewma, &mut window, &mut fixed] {
                    e.observe(t);
                }
                if t > step + 5.0 * tau {
                    assert!(near(ewma.rate().unwrap(), 4.0, 0.3), "seed {seed} at {t}");
                }
                if settled_at.is_none() && near(ewma.rate().unwrap(), 4.0, 0.3) {
                    settled_at = Some(t - step);
                }
            }
            assert!(settled_at.unwrap() < 3.0 * tau, "{settled_at:?}");
            // the window's estimate is its last RATE_WINDOW gaps', exactly
            let n = after.len();
            let own = RATE_WINDOW as f64 / (after[n - 1] - after[n - 1 - RATE_WINDOW]);
            assert!(near(window.rate().unwrap(), own, 1e-9));
            assert_eq!(fixed.rate(), Some(1.0));
        }
    }

    #[test]
    fn rate_estimates_parse_and_print() {
        for t in ["window", "fixed", "ewma:30", "ewma:0.5"] {
            let e: RateEstimate = t.parse().unwrap();
            assert_eq!(e.to_string(), t);
        }
        for bad in ["ewma", "ewma:0", "ewma:-1", "ewma:inf", "median"] {
            assert!(bad.parse::<RateEstimate>().is_err(), "{bad}");
        }
    }

    #[test]
    fn gap_threshold_falls_as_rate_rises() {
        let mut prev = f64::INFINITY;
        for rate in [0.1, 0.5, 1.0, 2.0, 5.0, 20.0] {
            let mut b = Batcher::new(&pg(None), 8, t_enc);
            for i in 0..40 {
                b.on_arrival(i as f64 / rate, i);
            }
            let g = b.gap_threshold().unwrap();
            assert!(g < prev, "g={g} at rate {rate} not below {prev}");
            assert!((g - (10f64).ln() / rate).abs() < 1e-9 * g.max(1.0));
            prev = g;
        }
    }

    #[test]
    fn full_batch_dispatches_at_once() {
        let mut b = Batcher::new(&pg(Some(100.0)), 4, t_enc);
        for i in 0..4 {
            b.on_arrival(0.001 * i as f64, i);
        }
        assert_eq!(b.poll_dispatch(0.003, true), Some(vec![0, 1, 2, 3]));
        // busy encoder: nothing goes
        for i in 4..10 {
            b.on_arrival(0.003 + 0.001 * i as f64, i);
        }
        assert_eq!(b.poll_dispatch(0.02, false), None);
        assert_eq!(b.poll_dispatch(0.02, true), Some(vec![4, 5, 6, 7]));
    }

    #[test]
    fn low_load_dispatches_immediately() {
        // 0.2 req/s: g = 11.5 s ≫ T_enc(1) = 0.55 s
        let mut b = Batcher::new(&pg(Some(0.2)), 8, t_enc);
        b.on_arrival(3.0, 7);
        assert_eq!(b.poll_dispatch(3.0, true), Some(vec![7]));
    }

    #[test]
    fn high_load_waits_then_gap_fires() {
        // 50 req/s: g = 0.046 s < T_enc(1): hold for the next arrival.
        let mut b = Batcher::new(&pg(Some(50.0)), 8, t_enc);
        b.on_arrival(1.0, 0);
        assert_eq!(b.poll_dispatch(1.0, true), None);
        let wake = b.poll_timeout().unwrap();
        assert!((wake - (1.0 + (10f64).ln() / 50.0)).abs() < 1e-12);
        // a spurious early wake-up is a no-op
        assert_eq!(b.poll_dispatch(wake - 1e-3, true), None);
        assert_eq!(b.poll_dispatch(wake, true), Some(vec![0]));
    }

    #[test]
    fn max_age_bounds_the_wait() {
        let mut b = Batcher::new(&pg(Some(1000.0)), 64, t_enc);
        // arrivals every 2 ms keep resetting the gap timer; max_age = T_enc(64) = 3.7 s
        let mut t = 0.0;
        let mut id = 0;
        loop {
            b.on_arrival(t, id);
            id += 1;
            if let Some(batch) = b.poll_dispatch(t, true) {
                assert!(t <= 3.7 + 1e-9, "held until {t}");
                assert!(!batch.is_empty());
                break;
            }
            let wake = b.poll_timeout().unwrap();
            assert!(wake <= 3.7 + 1e-9);
            t += 0.002;
            if t >= wake {
                assert!(b.poll_dispatch(wake, true).is_some());
                break;
            }
        }
    }

    #[test]
    fn immediate_is_one_per_pass() {
        let mut b = Batcher::new(&DispatchPolicy::Immediate, 8, t_enc);
        b.on_arrival(0.0, 0);
        b.on_arrival(0.0, 1);
        assert_eq!(b.poll_dispatch(0.0, true), Some(vec![0]));
        assert_eq!(b.poll_dispatch(0.0, true), Some(vec![1]));
        assert_eq!(b.params().max_batch, 1);
    }

    #[test]
    fn fixed_timeout_and_queue_length() {
        let mut b = Batcher::new(&DispatchPolicy::FixedTimeout { timeout_s: 0.1 }, 8, t_enc);
        b.on_arrival(0.0, 0);
        assert_eq!(b.poll_dispatch(0.05, true), None);
        assert_eq!(b.poll_timeout(), Some(0.1));
        assert_eq!(b.poll_dispatch(0.1, true), Some(vec![0]));

        let mut b = Batcher::new(
            &DispatchPolicy::QueueLength {
                k: 3,
                max_age_s: None,
            },
            8,
            t_enc,
        );
        b.on_arrival(0.0, 0);
        b.on_arrival(0.1, 1);
        assert_eq!(b.poll_dispatch(0.1, true), None);
        b.on_arrival(0.2, 2);
        assert_eq!(b.poll_dispatch(0.2, true), Some(vec![0, 1, 2]));
        b.on_arrival(1.0, 3);
        assert_eq!(b.poll_timeout(), Some(1.0 + t_enc(8)));
    }
}
