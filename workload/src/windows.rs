//! A run cut into windows of time: per window, the offered and arrived
//! rate, goodput and SLO attainment per tier, TTFT, and the queue lengths
//! at the window's end ([`WindowReport`]), for runs whose load changes
//! ([`crate::schedule`]). Everything is derived from the per-request
//! records; a request belongs to the window it arrived in.

use crate::report::{SloTier, Stats};
use crate::schedule::RateSchedule;
use easerve_sched::RequestRecord;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// One window of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WindowReport {
    /// Start, seconds since the run began.
    pub start_s: f64,
    /// End, seconds.
    pub end_s: f64,
    /// The schedule's mean rate over the window, `(Λ(end) − Λ(start)) /
    /// length`, requests/s (`None` without a schedule).
    pub offered_rate: Option<f64>,
    /// Requests that arrived in the window.
    pub arrived: usize,
    /// Of those, the ones that finished.
    pub completed: usize,
    /// TTFT of the window's arrivals that got a first token, seconds.
    pub ttft: Stats,
    /// Per SLO tier (strict → relaxed): the window's arrivals that met both
    /// bounds, per second of window (requests/s).
    pub goodput: Vec<f64>,
    /// Per SLO tier: the share of the window's arrivals that met both bounds.
    pub attainment: Vec<f64>,
    /// Requests waiting for an encode pass at the window's end.
    pub encode_queue: usize,
    /// Requests waiting for a prefill batch at the window's end.
    pub prefill_queue: usize,
    /// Requests waiting for a decode slot at the window's end.
    pub decode_queue: usize,
    /// Requests arrived and not finished (nor failed, nor turned away) at the window's end.
    pub in_system: usize,
}

/// The windows of `window_s` seconds covering `[0, last arrival]` of a run
/// (`window_s > 0`), with the offered rate from `schedule` when given.
/// O(requests + windows).
pub fn windows(
    records: &[RequestRecord],
    slo: &[SloTier],
    window_s: f64,
    schedule: Option<&RateSchedule>,
) -> Vec<WindowReport> {
    let last = records.iter().map(|r| r.arrival).fold(0.0, f64::max);
    let n = ((last / window_s).floor() as usize + 1).min(1_000_000);
    let idx = |t: f64| ((t / window_s).floor().max(0.0) as usize).min(n - 1);
    let mut ttfts: Vec<Vec<f64>> = vec![Vec::new(); n];
    let mut arrived = vec![0usize; n];
    let mut completed = vec![0usize; n];
    let mut good = vec![vec![0usize; slo.len()]; n];
    // difference arrays over window ends: a request waiting in [a, b) counts
    // at every window end e with a ≤ e < b
    let mut queues = vec![vec![0i64; n + 1]; 4];
    let mut count = |q: usize, a: Option<f64>, b: Option<f64>| {
        let Some(a) = a else { return };
        // the first window end e = (j + 1)·w at or after a
        let first = ((a / window_s).ceil() as usize).saturating_sub(1);
        let stop = b.map_or(n, |b| {
            // window ends e = (j + 1)·w < b
            let j = (b / window_s).ceil() as usize;
            j.saturating_sub(1).min(n)
        });
        if first < stop {
            queues[q][first] += 1;
            queues[q][stop] -= 1;
        }
    };
    for r in records {
        let w = idx(r.arrival);
        arrived[w] += 1;
        if r.rejected {
            continue;
        }
        let (ttft, tpot) = (r.ttft(), r.tpot());
        ttfts[w].extend(ttft);
        if r.finish.is_some() {
            completed[w] += 1;
            for (g, t) in good[w].iter_mut().zip(slo) {
                *g += usize::from(
                    ttft.is_some_and(|x| x <= t.ttft_s) && tpot.is_some_and(|x| x <= t.tpot_s),
                );
            }
        }
        let end = r.finish.get().or(if r.failure.is_some() {
            Some(r.arrival)
        } else {
            None
        });
        count(0, Some(r.arrival), r.encode_start.get().or(end));
        count(1, r.prefill_ready.get(), r.prefill_start.get().or(end));
        count(2, r.decode_ready.get(), r.decode_start.get().or(end));
        count(3, Some(r.arrival), end);
    }
    let mut run = [0i64; 4];
    (0..n)
        .map(|i| {
            for (q, acc) in run.iter_mut().enumerate() {
                *acc += queues[q][i];
            }
            let (a, b) = (i as f64 * window_s, (i + 1) as f64 * window_s);
            let per = |x: usize| {
                if arrived[i] == 0 {
                    0.0
                } else {
                    x as f64 / arrived[i] as f64
                }
            };
            WindowReport {
                start_s: a,
                end_s: b,
                offered_rate: schedule.map(|s| (s.integral(b) - s.integral(a)) / window_s),
                arrived: arrived[i],
                completed: completed[i],
                ttft: Stats::of(std::mem::take(&mut ttfts[i])),
                goodput: good[i].iter().map(|&g| g as f64 / window_s).collect(),
                attainment: good[i].iter().map(|&g| per(g)).collect(),
                encode_queue: run[0].max(0) as usize,
                prefill_queue: run[1].max(0) as usize,
                decode_queue: run[2].max(0) as usize,
                in_system: run[3].max(0) as usize,
            }
        })
        .collect()
}

/// The windows as a text table: one row per window, the goodput and
/// attainment of tier `tier` (an index into the run's SLO tiers).
pub fn render_windows(ws: &[WindowReport], tier: usize, tier_name: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:>9} {:>9} {:>8} {:>7} {:>9} {:>9} {:>10} {:>7} {:>7} {:>7} {:>7}",
        "start s",
        "offered",
        "arrived",
        "done",
        "TTFT mean",
        "TTFT p99",
        format!("good {}", &tier_name[..tier_name.len().min(5)]),
        "attain",
        "enc q",
        "pre q",
        "in sys"
    );
    for w in ws {
        let _ = writeln!(
            s,
            "{:>9.0} {:>9} {:>8} {:>7} {:>9.2} {:>9.2} {:>10.3} {:>6.0}% {:>7} {:>7} {:>7}",
            w.start_s,
            w.offered_rate.map_or("-".into(), |r| format!("{r:.3}")),
            w.arrived,
            w.completed,
            w.ttft.mean,
            w.ttft.p99,
            w.goodput.get(tier).copied().unwrap_or(0.0),
            100.0 * w.attainment.get(tier).copied().unwrap_or(0.0),
            w.encode_queue,
            w.prefill_queue,
            w.in_system
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use easerve_sched::Stamp;

    fn rec(id: u64, arrival: f64, enc: f64, first: f64, finish: f64) -> RequestRecord {
        let mut r = RequestRecord {
            id,
            arrival,
            output_tokens: 10,
            ..Default::default()
        };
        r.encode_start = Stamp::at(enc);
        r.encode_end = Stamp::at(enc + 0.1);
        r.prefill_ready = Stamp::at(enc + 0.1);
        r.prefill_start = Stamp::at(enc + 0.1);
        r.first_token = Stamp::at(first);
        r.decode_ready = Stamp::at(first);
        r.decode_start = Stamp::at(first);
        r.finish = Stamp::at(finish);
        r
    }

    #[test]
    fn counts_arrivals_goodput_and_queues_per_window() {
        let slo = [SloTier {
            name: "moderate".into(),
            ttft_s: 2.0,
            tpot_s: 1.0,
        }];
        let recs = vec![
            rec(0, 0.5, 0.6, 1.0, 2.0),     // window 0, TTFT 0.5: good
            rec(1, 3.0, 12.5, 13.0, 14.0),  // window 0, waits for encode past t = 10: bad
            rec(2, 11.0, 12.5, 13.0, 14.0), // window 1
        ];
        let ws = windows(&recs, &slo, 10.0, None);
        assert_eq!(ws.len(), 2);
        assert_eq!((ws[0].arrived, ws[1].arrived), (2, 1));
        assert_eq!(ws[0].goodput, vec![0.1]);
        assert_eq!(ws[0].attainment, vec![0.5]);
        // at t = 10, request 1 still waits for encode; at t = 20 none is left
        assert_eq!((ws[0].encode_queue, ws[0].in_system), (1, 1));
        assert_eq!((ws[1].encode_queue, ws[1].in_system), (0, 0));
        assert!((ws[0].ttft.mean - 5.25).abs() < 1e-9, "TTFTs 0.5 and 10 s");
    }
}
