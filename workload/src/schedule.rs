//! Time-varying arrival rates: a [`RateSchedule`] of phases (constant,
//! linear ramp, diurnal sinusoid, on/off bursts, a ServeGen replay of rates
//! per window) and the non-homogeneous arrivals drawn from it.
//!
//! # How arrivals are drawn: time rescaling
//! With `λ(t)` the scheduled rate and `Λ(t) = ∫₀ᵗ λ` its integral, a
//! renewal process of unit mean gap in *operational time* `u` (gaps
//! `Exp(1)` for Poisson; `Gamma(k = 1/cv², θ = 1/k)` for Gamma, mean 1 and
//! CV `cv`) is mapped to wall time by `t = Λ⁻¹(u)` (the time-rescaling
//! theorem: Brown et al., "The time-rescaling theorem and its application to
//! neural spike train data analysis", Neural Computation 14(2), 2002). For
//! Poisson this is exactly the non-homogeneous Poisson process of intensity
//! `λ(t)`; for Gamma it is the Gamma renewal process run on the clock `Λ`
//! (locally a Gamma process of rate `λ(t)` and CV `cv`). No candidate is
//! thrown away (as thinning would), so one draw per request from the
//! `arrivals` stream, whatever the schedule.
//!
//! `Λ⁻¹` is closed-form on constant and ramp pieces (the root of a quadratic)
//! and found by safeguarded Newton iteration on diurnal pieces (`Λ` is
//! monotone there, its derivative the rate itself). Past the schedule's end
//! it repeats: `λ(t + T) = λ(t)` with `T` the schedule's length, so a run of
//! any number of requests is defined.

use rand::Rng;
use rand_distr::{Distribution, Exp, Gamma};
use serde::{Deserialize, Serialize};
use std::f64::consts::PI;

/// One phase of a schedule as the scenario states it (for reports; the
/// arithmetic runs on [`Piece`]s).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Phase {
    /// `rate` requests/s for `duration_s`.
    Constant {
        /// Length, seconds (> 0).
        duration_s: f64,
        /// Requests/s (≥ 0).
        rate: f64,
    },
    /// From `from` to `to` requests/s linearly over `duration_s`.
    Ramp {
        /// Length, seconds (> 0).
        duration_s: f64,
        /// Rate at the start, requests/s.
        from: f64,
        /// Rate at the end, requests/s.
        to: f64,
    },
    /// `λ(τ) = m − a·cos(2πτ/P)` with `m = (peak+trough)/2`, `a =
    /// (peak−trough)/2`: starts at the trough, peaks at `P/2`.
    Diurnal {
        /// Length, seconds (> 0).
        duration_s: f64,
        /// Period `P`, seconds (> 0).
        period_s: f64,
        /// Highest rate, requests/s (≥ trough).
        peak: f64,
        /// Lowest rate, requests/s (≥ 0).
        trough: f64,
    },
    /// Bursts: `peak` for `on_s`, then `trough` for `off_s`, repeated over
    /// `duration_s` (the last cycle cut short).
    Burst {
        /// Length, seconds (> 0).
        duration_s: f64,
        /// Seconds at `peak` per cycle (> 0).
        on_s: f64,
        /// Seconds at `trough` per cycle (> 0).
        off_s: f64,
        /// Rate while on, requests/s.
        peak: f64,
        /// Rate while off, requests/s (≥ 0, ≤ peak).
        trough: f64,
    },
    /// Rates per window of a ServeGen trace (`start_s, rate, …` per row),
    /// each held for `window_s`.
    Replay {
        /// The CSV it came from.
        path: String,
        /// Window length, seconds (from the trace's `start_s` column).
        window_s: f64,
        /// Rate per window, requests/s.
        rates: Vec<f64>,
    },
}

impl Phase {
    /// Length of the phase, seconds.
    pub fn duration_s(&self) -> f64 {
        match self {
            Phase::Constant { duration_s, .. }
            | Phase::Ramp { duration_s, .. }
            | Phase::Diurnal { duration_s, .. }
            | Phase::Burst { duration_s, .. } => *duration_s,
            Phase::Replay {
                window_s, rates, ..
            } => window_s * rates.len() as f64,
        }
    }

    fn scaled(&self, f: f64) -> Phase {
        let mut p = self.clone();
        match &mut p {
            Phase::Constant { rate, .. } => *rate *= f,
            Phase::Ramp { from, to, .. } => {
                *from *= f;
                *to *= f;
            }
            Phase::Diurnal { peak, trough, .. } | Phase::Burst { peak, trough, .. } => {
                *peak *= f;
                *trough *= f;
            }
            Phase::Replay { rates, .. } => rates.iter_mut().for_each(|r| *r *= f),
        }
        p
    }

    /// The phase as pieces starting at `t0`.
    fn pieces(&self, t0: f64, out: &mut Vec<Piece>) {
        match *self {
            Phase::Constant { duration_s, rate } => {
                out.push(Piece::linear(t0, duration_s, rate, rate))
            }
            Phase::Ramp {
                duration_s,
                from,
                to,
            } => out.push(Piece::linear(t0, duration_s, from, to)),
            Phase::Diurnal {
                duration_s,
                period_s,
                peak,
                trough,
            } => out.push(Piece {
                t0,
                dur: duration_s,
                shape: Shape::Sine {
                    mean: (peak + trough) / 2.0,
                    amp: (peak - trough) / 2.0,
                    period: period_s,
                },
            }),
            Phase::Burst {
                duration_s,
                on_s,
                off_s,
                peak,
                trough,
            } => {
                let mut t = 0.0;
                let mut on = true;
                while t < duration_s {
                    let (len, r) = if on { (on_s, peak) } else { (off_s, trough) };
                    let len = len.min(duration_s - t);
                    out.push(Piece::linear(t0 + t, len, r, r));
                    t += len;
                    on = !on;
                }
            }
            Phase::Replay {
                window_s,
                ref rates,
                ..
            } => {
                for (i, &r) in rates.iter().enumerate() {
                    out.push(Piece::linear(t0 + i as f64 * window_s, window_s, r, r));
                }
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    /// `r0 + (r1 − r0)·τ/dur`.
    Linear { r0: f64, r1: f64 },
    /// `mean − amp·cos(2πτ/period)`.
    Sine { mean: f64, amp: f64, period: f64 },
}

/// A stretch of the schedule whose integrated rate has a closed form.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Piece {
    t0: f64,
    dur: f64,
    shape: Shape,
}

impl Piece {
    fn linear(t0: f64, dur: f64, r0: f64, r1: f64) -> Piece {
        Piece {
            t0,
            dur,
            shape: Shape::Linear { r0, r1 },
        }
    }

    /// `λ(t0 + τ)`, requests/s.
    fn rate(&self, tau: f64) -> f64 {
        match self.shape {
            Shape::Linear { r0, r1 } => r0 + (r1 - r0) * tau / self.dur,
            Shape::Sine { mean, amp, period } => mean - amp * (2.0 * PI * tau / period).cos(),
        }
    }

    /// `∫₀^τ λ(t0 + x) dx`, requests.
    fn integral(&self, tau: f64) -> f64 {
        match self.shape {
            Shape::Linear { r0, r1 } => r0 * tau + (r1 - r0) * tau * tau / (2.0 * self.dur),
            Shape::Sine { mean, amp, period } => {
                mean * tau - amp * period / (2.0 * PI) * (2.0 * PI * tau / period).sin()
            }
        }
    }

    /// The `τ ∈ [0, dur]` with `integral(τ) = u` (`0 ≤ u ≤ integral(dur)`).
    fn inverse(&self, u: f64) -> f64 {
        match self.shape {
            Shape::Linear { r0, r1 } => {
                let a = (r1 - r0) / self.dur;
                // (a/2)τ² + r0·τ − u = 0, in the form stable for a → 0 and a < 0
                let disc = (r0 * r0 + 2.0 * a * u).max(0.0);
                let den = r0 + disc.sqrt();
                if den > 0.0 {
                    (2.0 * u / den).clamp(0.0, self.dur)
                } else {
                    self.dur
                }
            }
            Shape::Sine { .. } => {
                // Newton on a monotone function, kept inside a bisection bracket
                let (mut lo, mut hi) = (0.0, self.dur);
                let mut tau = (u / self.integral(self.dur).max(f64::MIN_POSITIVE)) * self.dur;
                for _ in 0..100 {
                    let f = self.integral(tau) - u;
                    if f.abs() <= 1e-12 * u.max(1.0) {
                        break;
                    }
                    if f > 0.0 {
                        hi = tau;
                    } else {
                        lo = tau;
                    }
                    let d = self.rate(tau);
                    let next = tau - f / d;
                    tau = if d > 0.0 && next > lo && next < hi {
                        next
                    } else {
                        0.5 * (lo + hi)
                    };
                    if hi - lo <= 1e-12 * self.dur {
                        break;
                    }
                }
                tau.clamp(0.0, self.dur)
            }
        }
    }
}

/// A rate schedule: phases laid end to end, repeated past its end.
/// Serialized as its list of phases.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(into = "Vec<Phase>", try_from = "Vec<Phase>")]
pub struct RateSchedule {
    /// The phases as stated.
    pub phases: Vec<Phase>,
    /// Per phase, the share of its arrivals that carry the scenario's media
    /// (the rest are text-only); all 1 unless set ([`RateSchedule::with_media`]).
    media: Vec<f64>,
    pieces: Vec<Piece>,
    /// `Λ` at each piece's start; the last entry is `Λ(T)`.
    cum: Vec<f64>,
}

impl From<RateSchedule> for Vec<Phase> {
    fn from(s: RateSchedule) -> Vec<Phase> {
        s.phases
    }
}

impl TryFrom<Vec<Phase>> for RateSchedule {
    type Error = String;
    fn try_from(phases: Vec<Phase>) -> Result<RateSchedule, String> {
        RateSchedule::new(phases).ok_or_else(|| "a schedule with no arrivals".to_string())
    }
}

impl RateSchedule {
    /// A schedule of `phases` (each validated: positive length, rates ≥ 0,
    /// finite; see the scenario's `[[workload.phases]]`). `None` when no
    /// phase is given or the whole schedule has no arrivals (`Λ(T) = 0`).
    pub fn new(phases: Vec<Phase>) -> Option<RateSchedule> {
        let mut pieces = Vec::new();
        let mut t = 0.0;
        for p in &phases {
            p.pieces(t, &mut pieces);
            t += p.duration_s();
        }
        let mut cum = Vec::with_capacity(pieces.len() + 1);
        let mut acc = 0.0;
        cum.push(0.0);
        for p in &pieces {
            acc += p.integral(p.dur);
            cum.push(acc);
        }
        (acc > 0.0 && acc.is_finite()).then_some(RateSchedule {
            media: vec![1.0; phases.len()],
            phases,
            pieces,
            cum,
        })
    }

    /// The same schedule with `shares[i]` (in [0, 1]) of phase `i`'s arrivals
    /// carrying media, the rest text-only (a modality mix that changes by
    /// phase); a missing share is 1.
    pub fn with_media(mut self, shares: &[f64]) -> RateSchedule {
        for (m, s) in self.media.iter_mut().zip(shares) {
            *m = s.clamp(0.0, 1.0);
        }
        self
    }

    /// Whether some phase has text-only arrivals.
    pub fn mixes(&self) -> bool {
        self.media.iter().any(|&m| m < 1.0)
    }

    /// The share of arrivals at `t` (seconds, repeating past the end) that
    /// carry media.
    pub fn media_share_at(&self, t: f64) -> f64 {
        let t = t.max(0.0) % self.period_s();
        let mut start = 0.0;
        for (p, &m) in self.phases.iter().zip(&self.media) {
            start += p.duration_s();
            if t < start {
                return m;
            }
        }
        self.media.last().copied().unwrap_or(1.0)
    }

    /// Length `T` of one cycle, seconds.
    pub fn period_s(&self) -> f64 {
        self.pieces.last().map_or(0.0, |p| p.t0 + p.dur)
    }

    /// Mean rate over one cycle, `Λ(T)/T`, requests/s.
    pub fn mean_rate(&self) -> f64 {
        self.total() / self.period_s()
    }

    fn total(&self) -> f64 {
        *self.cum.last().unwrap_or(&0.0)
    }

    /// The same schedule with every rate times `f` (`f > 0`).
    pub fn scaled(&self, f: f64) -> RateSchedule {
        RateSchedule::new(self.phases.iter().map(|p| p.scaled(f)).collect())
            .expect("a positive multiple of a schedule with arrivals has arrivals")
            .with_media(&self.media)
    }

    /// The same schedule rescaled to mean rate `rate` (requests/s).
    pub fn with_mean(&self, rate: f64) -> RateSchedule {
        self.scaled(rate / self.mean_rate())
    }

    /// `λ(t)`, requests/s (`t ≥ 0`, repeating past the end).
    pub fn rate_at(&self, t: f64) -> f64 {
        let t = t.max(0.0) % self.period_s();
        let i = self.piece_at(t);
        let p = &self.pieces[i];
        p.rate(t - p.t0)
    }

    /// `Λ(t) = ∫₀ᵗ λ`, expected arrivals in `[0, t]`.
    pub fn integral(&self, t: f64) -> f64 {
        let t = t.max(0.0);
        let cycles = (t / self.period_s()).floor();
        let r = t - cycles * self.period_s();
        let i = self.piece_at(r);
        let p = &self.pieces[i];
        cycles * self.total() + self.cum[i] + p.integral((r - p.t0).clamp(0.0, p.dur))
    }

    /// The piece holding `t` (within one cycle).
    fn piece_at(&self, t: f64) -> usize {
        self.pieces
            .partition_point(|p| p.t0 + p.dur <= t)
            .min(self.pieces.len() - 1)
    }

    /// `Λ⁻¹(u)`: the time by which `u` arrivals are expected, seconds.
    pub fn inverse(&self, u: f64) -> f64 {
        let total = self.total();
        let cycles = (u / total).floor();
        let r = u - cycles * total;
        // the last piece whose start lies at or below r and which has arrivals
        let mut i = self.cum.partition_point(|&c| c <= r).saturating_sub(1);
        i = i.min(self.pieces.len() - 1);
        while i + 1 < self.pieces.len() && self.cum[i + 1] <= r {
            i += 1;
        }
        let p = &self.pieces[i];
        cycles * self.period_s() + p.t0 + p.inverse(r - self.cum[i])
    }

    /// `n` arrival times (seconds, ascending) by time rescaling (module
    /// docs): unit-mean gaps from `rng` (`cv = None`: exponential; `Some(cv)`:
    /// Gamma of that CV) in operational time, mapped through `Λ⁻¹`.
    ///
    /// # Panics
    /// If `cv` is not positive and finite (validated by the scenario).
    pub fn arrivals<R: Rng>(&self, rng: &mut R, cv: Option<f64>, n: usize) -> Vec<f64> {
        let mut u = 0.0;
        let mut out = Vec::with_capacity(n);
        let exp = Exp::new(1.0).expect("rate 1");
        let gamma = cv.map(|cv| {
            let k = 1.0 / (cv * cv);
            Gamma::new(k, 1.0 / k).expect("cv validated > 0")
        });
        for _ in 0..n {
            u += match &gamma {
                Some(g) => g.sample(rng),
                None => exp.sample(rng),
            };
            out.push(self.inverse(u));
        }
        out
    }
}

/// The per-window rates of a ServeGen trace CSV (`start_s, rate, cv, family,
/// shape, scale` per row, no header; ServeGen's `chunk-N-trace.csv`): the
/// window length (the constant step of `start_s`) and the rates, requests/s.
///
/// # Errors
/// A message naming the row when the file cannot be read, a row does not
/// parse, a rate is negative, or the windows are not evenly spaced.
pub fn read_servegen(path: &std::path::Path) -> Result<(f64, Vec<f64>), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let mut starts = Vec::new();
    let mut rates = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut cols = line.split(',');
        let mut col = |name: &str| -> Result<f64, String> {
            cols.next()
                .and_then(|c| c.trim().parse::<f64>().ok())
                .filter(|x| x.is_finite())
                .ok_or_else(|| format!("row {}: `{name}` is not a number", i + 1))
        };
        let start = col("start_s")?;
        let rate = col("rate")?;
        if rate < 0.0 {
            return Err(format!("row {}: rate {rate} is negative", i + 1));
        }
        starts.push(start);
        rates.push(rate);
    }
    if starts.len() < 2 {
        return Err("fewer than two windows: no window length to read".into());
    }
    let window = starts[1] - starts[0];
    let even = starts
        .windows(2)
        .all(|w| ((w[1] - w[0]) - window).abs() <= 1e-6 * window.abs().max(1.0));
    if !(window > 0.0 && even) {
        return Err("the windows' start_s are not evenly spaced and ascending".into());
    }
    Ok((window, rates))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;

    fn day() -> RateSchedule {
        RateSchedule::new(vec![
            Phase::Constant {
                duration_s: 100.0,
                rate: 1.0,
            },
            Phase::Ramp {
                duration_s: 50.0,
                from: 1.0,
                to: 4.0,
            },
            Phase::Diurnal {
                duration_s: 300.0,
                period_s: 200.0,
                peak: 3.0,
                trough: 1.0,
            },
            Phase::Burst {
                duration_s: 100.0,
                on_s: 10.0,
                off_s: 30.0,
                peak: 6.0,
                trough: 0.0,
            },
        ])
        .expect("arrivals")
    }

    #[test]
    fn inverse_undoes_the_integral() {
        let s = day();
        for i in 0..2000 {
            let t = i as f64 * 0.61;
            let u = s.integral(t);
            let back = s.inverse(u);
            // where λ = 0 the inverse is any point of a flat stretch
            assert!(
                (s.integral(back) - u).abs() < 1e-6,
                "t {t} u {u} back {back}"
            );
        }
    }

    #[test]
    fn mean_and_rescaling() {
        let s = day();
        // 100·1 + 50·2.5 + 300·2 + (3 on-periods: 10+10+10)·6 = 1005 over 550 s
        assert!((s.integral(550.0) - 1005.0).abs() < 1e-9);
        assert!((s.mean_rate() - 1005.0 / 550.0).abs() < 1e-12);
        assert!((s.with_mean(4.0).mean_rate() - 4.0).abs() < 1e-12);
        assert_eq!(s.rate_at(5.0), 1.0);
        assert!((s.rate_at(125.0) - 2.5).abs() < 1e-12);
        assert!(
            (s.rate_at(250.0) - 3.0).abs() < 1e-9,
            "diurnal peaks at P/2"
        );
        assert_eq!(s.rate_at(465.0), 0.0, "burst off");
        assert_eq!(s.rate_at(555.0), 1.0, "repeats");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// The count of arrivals in each window matches the integrated rate
        /// there: a sum of Poisson counts of mean `Λ(b) − Λ(a)`, within 5σ.
        #[test]
        fn arrivals_follow_the_integrated_rate(
            r0 in 0.2f64..5.0, r1 in 0.2f64..5.0, peak in 1.0f64..8.0, frac in 0.0f64..1.0,
            period in 20.0f64..400.0, seed in 0u64..1000, gamma in proptest::bool::ANY,
        ) {
            let s = RateSchedule::new(vec![
                Phase::Ramp { duration_s: 200.0, from: r0, to: r1 },
                Phase::Diurnal { duration_s: 400.0, period_s: period, peak, trough: peak * frac },
                Phase::Burst { duration_s: 200.0, on_s: 20.0, off_s: 40.0, peak, trough: 0.0 },
            ]).expect("arrivals");
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let n = 6000;
            let cv = gamma.then_some(0.7);
            let t = s.arrivals(&mut rng, cv, n);
            prop_assert!(t.windows(2).all(|w| w[0] <= w[1]));
            let end = t[n - 1];
            let w = 100.0;
            let mut a = 0.0;
            while a + w <= end {
                let expect = s.integral(a + w) - s.integral(a);
                let got = t.iter().filter(|&&x| x >= a && x < a + w).count() as f64;
                // Poisson variance = mean; a Gamma renewal count's ≈ cv²·mean
                let sd = expect.sqrt().max(1.0);
                prop_assert!((got - expect).abs() <= 5.0 * sd + 1.0,
                    "window [{a}, {}): {got} arrivals, expected {expect}", a + w);
                a += w;
            }
            // the whole run: n arrivals by the time Λ reaches ≈ n
            let total = s.integral(end);
            prop_assert!((total - n as f64).abs() <= 5.0 * (n as f64).sqrt() + 1.0);
        }
    }

    #[test]
    fn servegen_rates_read_when_present() {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/data/servegen-mm-image/chunk-1-trace.csv");
        if !p.exists() {
            eprintln!(
                "skipped: {} absent (ServeGen data lives outside the repository)",
                p.display()
            );
            return;
        }
        let (w, rates) = read_servegen(&p).expect("parses");
        assert_eq!(w, 600.0);
        assert_eq!(rates.len(), 144);
        assert!(rates.iter().any(|&r| r > 0.0));
    }
}
