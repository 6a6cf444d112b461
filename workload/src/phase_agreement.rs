//! Two runs of one rate schedule compared window by window (`easerve calib
//! validate --per-window`): the mean TTFT of each window's arrivals in the
//! simulated and the measured run and its relative error, and the worker
//! changes each run's planner made, by kind. With `workload.window_s` set
//! to the phase length, a window is a phase.

use crate::report::{ChangeRecord, Report};
use serde::Serialize;

/// One window of the comparison.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WindowRow {
    /// Start and end, seconds since the run began.
    pub start_s: f64,
    /// End, seconds.
    pub end_s: f64,
    /// Mean TTFT of the simulated run's arrivals in the window, seconds.
    pub sim_ttft_s: f64,
    /// Mean TTFT of the measured run's arrivals in the window, seconds.
    pub measured_ttft_s: f64,
    /// `(sim − measured) / measured`.
    pub error: f64,
}

/// The comparison ([`compare_windows`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WindowAgreement {
    /// Windows both runs have, in order.
    pub rows: Vec<WindowRow>,
    /// The simulated run's worker changes, by kind ([`change_kind`]).
    pub sim_changes: Vec<String>,
    /// The measured run's.
    pub measured_changes: Vec<String>,
}

/// A worker change by kind: `D→P` (a role change: a decode worker's
/// devices to prefill), `+E` (a worker started on spare devices), `−D` (a
/// worker drained and stopped), by the stage letters of the labels; with
/// `!` appended when its load failed. `None` for a change of `B` or `s`.
pub fn change_kind(c: &ChangeRecord) -> Option<String> {
    let stage = |l: &Option<String>| l.as_ref().and_then(|l| l.chars().next());
    let kind = match (stage(&c.from), stage(&c.to)) {
        (Some(f), Some(t)) => format!("{f}→{t}"),
        (None, Some(t)) => format!("+{t}"),
        (Some(f), None) => format!("−{f}"),
        (None, None) => return None,
    };
    Some(if c.failed_at.is_some() {
        kind + "!"
    } else {
        kind
    })
}

/// Compare `sim` with `measured` window by window: the windows both have
/// (matched by start time), and each run's worker changes.
pub fn compare_windows(sim: &Report, measured: &Report) -> WindowAgreement {
    let rows = sim
        .windows
        .iter()
        .filter_map(|s| {
            let m = measured
                .windows
                .iter()
                .find(|m| (m.start_s - s.start_s).abs() < 1e-6)?;
            (m.ttft.mean > 0.0 && m.arrived > 0 && s.arrived > 0).then(|| WindowRow {
                start_s: s.start_s,
                end_s: s.end_s,
                sim_ttft_s: s.ttft.mean,
                measured_ttft_s: m.ttft.mean,
                error: (s.ttft.mean - m.ttft.mean) / m.ttft.mean,
            })
        })
        .collect();
    let kinds = |r: &Report| -> Vec<String> {
        r.planner
            .as_ref()
            .map(|p| p.changes.iter().filter_map(change_kind).collect())
            .unwrap_or_default()
    };
    WindowAgreement {
        rows,
        sim_changes: kinds(sim),
        measured_changes: kinds(measured),
    }
}

impl WindowAgreement {
    /// The windows whose |error| exceeds `max` (a fraction).
    pub fn exceeding(&self, max: f64) -> Vec<&WindowRow> {
        self.rows.iter().filter(|r| r.error.abs() > max).collect()
    }

    /// Whether the two runs made the same worker changes, by kind and in
    /// order.
    pub fn same_changes(&self) -> bool {
        self.sim_changes == self.measured_changes
    }

    /// The table and both runs' changes, as text.
    pub fn render_text(&self) -> String {
        let mut s = String::from("| window (s) | mean TTFT sim (s) | mean TTFT measured (s) | error |\n|---|---|---|---|\n");
        for r in &self.rows {
            s.push_str(&format!(
                "| {:.0}–{:.0} | {:.3} | {:.3} | {:+.1} % |\n",
                r.start_s,
                r.end_s,
                r.sim_ttft_s,
                r.measured_ttft_s,
                r.error * 100.0
            ));
        }
        let list = |v: &[String]| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(", ")
            }
        };
        s.push_str(&format!(
            "worker changes, sim: {} ({})\nworker changes, measured: {} ({})\n",
            self.sim_changes.len(),
            list(&self.sim_changes),
            self.measured_changes.len(),
            list(&self.measured_changes)
        ));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use easerve_sched::{Change, WorkerRef};

    fn change(from: Option<&str>, to: Option<&str>, failed: bool) -> ChangeRecord {
        ChangeRecord {
            at: 5.0,
            change: Change::Start {
                worker: WorkerRef::Prefill(1),
            },
            from: from.map(Into::into),
            to: to.map(Into::into),
            stopped_at: None,
            ready_at: None,
            failed_at: failed.then_some(6.0),
            failure: None,
        }
    }

    #[test]
    fn changes_are_named_by_kind() {
        assert_eq!(
            change_kind(&change(Some("D1"), Some("P1"), false)).as_deref(),
            Some("D→P")
        );
        assert_eq!(
            change_kind(&change(None, Some("E1"), false)).as_deref(),
            Some("+E")
        );
        assert_eq!(
            change_kind(&change(Some("P1"), None, false)).as_deref(),
            Some("−P")
        );
        assert_eq!(
            change_kind(&change(None, Some("E1"), true)).as_deref(),
            Some("+E!")
        );
        assert_eq!(change_kind(&change(None, None, false)), None);
    }
}
