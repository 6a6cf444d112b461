//! Runs under a changing load ([`easerve_workload::schedule`]): the
//! per-window timelines of a sweep (SVG and CSV), and how each point rides
//! the first change of its offered rate ([`ChangeSummary`]: the worst
//! window's P99 TTFT after the change, and the time it takes to settle).

use crate::plot::{Figure, LineChart, Scale, Series};
use crate::sweep::{NamedChart, SweepPart, SweepRow};
use easerve_workload::windows::WindowReport;
use serde::Serialize;
use std::fmt::Write as _;

/// A run's load has changed once a window's offered rate is more than this
/// fraction off the first window's (10 %).
pub const CHANGE_FRACTION: f64 = 0.10;

/// A window has settled when its mean TTFT is within this factor of the
/// level the phase ends at (or [`SETTLE_SLACK_S`] above it, whichever is
/// larger), and every later window of the phase is too.
pub const SETTLE_FACTOR: f64 = 1.2;

/// Absolute slack of the settling band, seconds (so that a level of a few
/// hundred ms is not held to tens of ms of noise).
pub const SETTLE_SLACK_S: f64 = 0.5;

/// How one run rode the first change of its offered rate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChangeSummary {
    /// Start of the first window whose offered rate changed, seconds.
    pub change_s: f64,
    /// Offered rate before → after (the window before the change, and the
    /// first window at which it stops moving: the end of a ramp), requests/s.
    pub rate_before: f64,
    /// See `rate_before`.
    pub rate_after: f64,
    /// Median over the windows before the change of each window's P99 TTFT, seconds.
    pub p99_ttft_before_s: f64,
    /// The largest window P99 TTFT at or after the change, seconds.
    pub p99_ttft_after_s: f64,
    /// The level the run ends at: the median window mean TTFT over the last
    /// third of the windows after the change, seconds.
    pub level_ttft_s: f64,
    /// From the change to the start of the first window from which every
    /// window's mean TTFT stays within the band ([`SETTLE_FACTOR`],
    /// [`SETTLE_SLACK_S`]) of `level_ttft_s`, seconds; `None` when the last
    /// window is still outside it.
    pub settle_s: Option<f64>,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    if xs.is_empty() {
        0.0
    } else {
        xs[xs.len() / 2]
    }
}

/// The first change of `ws`' offered rate and how the run rode it (`None`
/// without offered rates, a change, or windows after it that hold arrivals).
/// A change starts where the rate begins to move towards the first window
/// more than [`CHANGE_FRACTION`] off the run's first rate, and the windows
/// after it run until the rate moves again once it has stopped (or the
/// run's end).
pub fn change_summary(ws: &[WindowReport]) -> Option<ChangeSummary> {
    let rates: Vec<f64> = ws.iter().map(|w| w.offered_rate).collect::<Option<_>>()?;
    let moved = |i: usize| (rates[i] - rates[i - 1]).abs() > 1e-6 * rates[i - 1].max(1e-9);
    // the first window more than CHANGE_FRACTION off the first one's rate,
    // and back to where the rate began to move (the start of a ramp)
    let k = (1..rates.len())
        .find(|&i| (rates[i] - rates[0]).abs() > CHANGE_FRACTION * rates[0].max(1e-9))?;
    let mut c = k;
    while c > 1 && moved(c - 1) {
        c -= 1;
    }
    // forward to where it stops moving (the end of a ramp); the phase it
    // leads to lasts until the rate moves again (or the run ends)
    let mut j = k;
    while j + 1 < rates.len() && moved(j + 1) {
        j += 1;
    }
    let end = (j + 1..rates.len())
        .find(|&i| moved(i))
        .unwrap_or(rates.len());
    // windows with arrivals only (the run's tail may hold none)
    let after: Vec<&WindowReport> = ws[c..end].iter().filter(|w| w.arrived > 0).collect();
    if after.is_empty() {
        return None;
    }
    let tail = &after[after.len() - after.len().div_ceil(3)..];
    let level = median(tail.iter().map(|w| w.ttft.mean).collect());
    let band = (level * SETTLE_FACTOR).max(level + SETTLE_SLACK_S);
    let settled_from = (0..after.len())
        .rev()
        .take_while(|&i| after[i].ttft.mean <= band)
        .last();
    let change_s = ws[c].start_s;
    Some(ChangeSummary {
        change_s,
        rate_before: rates[c - 1],
        rate_after: rates[j],
        p99_ttft_before_s: median(ws[..c].iter().map(|w| w.ttft.p99).collect()),
        p99_ttft_after_s: after.iter().map(|w| w.ttft.p99).fold(0.0, f64::max),
        level_ttft_s: level,
        settle_s: settled_from.map(|i| after[i].start_s - change_s),
    })
}

fn name(r: &SweepRow) -> String {
    let mut n = r.system.clone();
    if !r.variant.is_empty() {
        n = format!("{n} [{}]", r.variant);
    }
    format!("{n} @{} req/s", r.rate)
}

/// The rows that carry windows, seed 1 of each (variant, system, rate).
fn timeline_rows(whole: &SweepPart) -> Vec<&SweepRow> {
    let mut out: Vec<&SweepRow> = Vec::new();
    for r in whole.rows.iter().filter(|r| !r.windows.is_empty()) {
        let same =
            |o: &&SweepRow| o.variant == r.variant && o.system == r.system && o.rate == r.rate;
        match out.iter().position(same) {
            Some(i) if out[i].seed <= r.seed => {}
            Some(i) => out[i] = r,
            None => out.push(r),
        }
    }
    out
}

/// The index of the `moderate` tier of `whole` (else the middle one).
fn moderate(whole: &SweepPart) -> usize {
    whole
        .tiers
        .iter()
        .position(|t| t == "moderate")
        .unwrap_or(whole.tiers.len() / 2)
}

/// Timelines of a sweep whose runs have windows (none otherwise): per
/// window, the offered rate, the goodput at the `moderate` tier, the P99
/// TTFT and the requests in the system; one series per (variant, system,
/// rate), seed 1.
pub fn timeline_charts(whole: &SweepPart) -> Vec<NamedChart> {
    let rows = timeline_rows(whole);
    if rows.is_empty() {
        return Vec::new();
    }
    let tier = moderate(whole);
    let tier_name = whole.tiers.get(tier).cloned().unwrap_or_default();
    type Pick = fn(&WindowReport, usize) -> f64;
    let specs: [(&str, String, &str, Scale, Pick); 4] = [
        (
            "timeline-offered.svg",
            "Offered rate per window".into(),
            "offered rate (req/s)",
            Scale::Linear,
            |w, _| w.offered_rate.unwrap_or(f64::NAN),
        ),
        (
            "timeline-goodput.svg",
            format!("Goodput per window at the {tier_name} SLO tier"),
            "goodput (req/s)",
            Scale::Linear,
            |w, t| w.goodput.get(t).copied().unwrap_or(0.0),
        ),
        (
            "timeline-p99-ttft.svg",
            "P99 TTFT per window (by arrival)".into(),
            "P99 TTFT (s)",
            Scale::Log,
            |w, _| if w.arrived > 0 { w.ttft.p99 } else { f64::NAN },
        ),
        (
            "timeline-queue.svg",
            "Requests in the system at each window's end".into(),
            "requests",
            Scale::Linear,
            |w, _| w.in_system as f64,
        ),
    ];
    specs
        .into_iter()
        .map(|(file, title, y, scale, pick)| NamedChart {
            file: file.into(),
            figure: Figure::one(LineChart {
                title,
                x_label: "time (s)".into(),
                y_label: y.into(),
                y_scale: scale,
                series: rows
                    .iter()
                    .map(|r| {
                        Series::new(
                            name(r),
                            r.windows
                                .iter()
                                .map(|w| (w.start_s, pick(w, tier)))
                                .collect(),
                        )
                    })
                    .collect(),
                step: true,
            }),
        })
        .collect()
}

/// Every window of every run as CSV (`None` when no run has windows).
pub fn windows_csv(whole: &SweepPart) -> Option<String> {
    let rows: Vec<&SweepRow> = whole
        .rows
        .iter()
        .filter(|r| !r.windows.is_empty())
        .collect();
    if rows.is_empty() {
        return None;
    }
    let tier = moderate(whole);
    let mut s = String::from(
        "variant,system,rate,seed,start_s,end_s,offered_rate,arrived,completed,ttft_mean_s,ttft_p99_s,goodput_moderate,attainment_moderate,encode_queue,prefill_queue,decode_queue,in_system\n",
    );
    for r in rows {
        for w in &r.windows {
            let _ = writeln!(
                s,
                "\"{}\",{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                r.variant.replace('"', "'"),
                r.system,
                r.rate,
                r.seed,
                w.start_s,
                w.end_s,
                w.offered_rate.map_or(String::new(), |x| x.to_string()),
                w.arrived,
                w.completed,
                w.ttft.mean,
                w.ttft.p99,
                w.goodput.get(tier).copied().unwrap_or(0.0),
                w.attainment.get(tier).copied().unwrap_or(0.0),
                w.encode_queue,
                w.prefill_queue,
                w.decode_queue,
                w.in_system
            );
        }
    }
    Some(s)
}

/// The change summary of each (variant, system, rate) as a text table:
/// each figure the median over the point's seeds (a settle time that never
/// came counts as the longest), `None` when no run has a change.
pub fn change_table(whole: &SweepPart) -> Option<String> {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<48} {:>8} {:>12} {:>10} {:>10} {:>8} {:>9} {:>5}",
        "point", "change s", "rate", "P99 before", "P99 after", "level s", "settle s", "seeds"
    );
    let mut any = false;
    for r in timeline_rows(whole) {
        let runs: Vec<ChangeSummary> = whole
            .rows
            .iter()
            .filter(|o| o.variant == r.variant && o.system == r.system && o.rate == r.rate)
            .filter_map(|o| change_summary(&o.windows))
            .collect();
        let Some(first) = runs.first() else {
            continue;
        };
        any = true;
        let med = |f: fn(&ChangeSummary) -> f64| median(runs.iter().map(f).collect());
        let settle = med(|c| c.settle_s.unwrap_or(f64::INFINITY));
        let _ = writeln!(
            s,
            "{:<48} {:>8.0} {:>12} {:>10.2} {:>10.2} {:>8.2} {:>9} {:>5}",
            name(r),
            first.change_s,
            format!("{:.2}→{:.2}", first.rate_before, first.rate_after),
            med(|c| c.p99_ttft_before_s),
            med(|c| c.p99_ttft_after_s),
            med(|c| c.level_ttft_s),
            if settle.is_finite() {
                format!("{settle:.0}")
            } else {
                "never".into()
            },
            runs.len()
        );
    }
    any.then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use easerve_workload::Stats;

    fn w(i: usize, rate: f64, mean: f64) -> WindowReport {
        WindowReport {
            start_s: i as f64 * 10.0,
            end_s: (i + 1) as f64 * 10.0,
            offered_rate: Some(rate),
            arrived: 10,
            completed: 10,
            ttft: Stats {
                mean,
                p99: 2.0 * mean,
                ..Stats::of(vec![mean])
            },
            goodput: vec![1.0],
            attainment: vec![1.0],
            encode_queue: 0,
            prefill_queue: 0,
            decode_queue: 0,
            in_system: 0,
        }
    }

    #[test]
    fn settles_when_ttft_returns_to_its_level() {
        // step at window 3; TTFT spikes, then settles at 2 s from window 6 on
        let means = [1.0, 1.0, 1.0, 8.0, 5.0, 3.5, 2.1, 2.0, 1.9, 2.0, 2.0];
        let ws: Vec<WindowReport> = means
            .iter()
            .enumerate()
            .map(|(i, &m)| w(i, if i < 3 { 1.0 } else { 2.0 }, m))
            .collect();
        let c = change_summary(&ws).expect("a change");
        assert_eq!(c.change_s, 30.0);
        assert_eq!((c.rate_before, c.rate_after), (1.0, 2.0));
        assert_eq!(c.p99_ttft_after_s, 16.0);
        assert_eq!(c.level_ttft_s, 2.0);
        // band max(2.4, 2.5) = 2.5: window 5 (3.5) is outside, 6.. inside
        assert_eq!(c.settle_s, Some(30.0));
        // no change, no summary
        let flat: Vec<WindowReport> = (0..5).map(|i| w(i, 1.0, 1.0)).collect();
        assert!(change_summary(&flat).is_none());
    }
}
