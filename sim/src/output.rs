//! Turning a finished run's records and meters into a [`SimOutput`] — one
//! place for every engine.

use crate::meter::GpuMeter;
use crate::timeline::Timeline;
use crate::SimOutput;
use easerve_sched::RequestRecord;
use easerve_workload::report::{EncodeSummary, GpuReport, RunMeta};
use easerve_workload::{Report, Scenario};

/// What an engine hands over at the end of a run.
pub(crate) struct RunParts {
    pub(crate) deployment: String,
    pub(crate) records: Vec<RequestRecord>,
    pub(crate) meters: Vec<GpuMeter>,
    /// `(stage, worker label)` of each GPU.
    pub(crate) roles: Vec<(String, String)>,
    pub(crate) encode: EncodeSummary,
    pub(crate) notes: Vec<String>,
    pub(crate) events: u64,
    pub(crate) max_sm_share_sum: f64,
    pub(crate) timeline: Option<Timeline>,
    /// Requests finished and the latest finish time, when the engine kept
    /// them (`Controller::finished`); else counted from the records.
    pub(crate) finished: Option<(usize, f64)>,
}

pub(crate) fn assemble(sc: &Scenario, parts: RunParts) -> SimOutput {
    // the run starts at t = 0, as in the report
    let (finished, end) = parts.finished.unwrap_or_else(|| {
        parts
            .records
            .iter()
            .filter_map(|r| r.finish.get())
            .fold((0, 0.0), |(n, end), f| (n + 1, f64::max(end, f)))
    });
    let duration = end.max(1e-12);
    let gpus = parts
        .meters
        .iter()
        .zip(parts.roles)
        .enumerate()
        .map(|(g, (m, (stage, worker)))| GpuReport {
            gpu: g as u32,
            stage,
            worker,
            busy_fraction: (m.busy_time() / duration).min(1.0),
            sm_utilization: (m.sm_time() / duration).min(1.0),
        })
        .collect();
    let meta = RunMeta {
        scenario: sc.name.clone(),
        deployment: parts.deployment,
        model: sc.model.name.clone(),
        cluster: sc.cluster_label(),
        seed: sc.seed,
        offered_rate: sc.workload.rate,
        requests: parts.records.len(),
    };
    let mut report = Report::build(
        meta,
        &parts.records,
        &sc.slo,
        gpus,
        parts.encode,
        parts.notes,
    );
    report.events = parts.events;
    if let Some(w) = sc.workload.window_s {
        report.windows = easerve_workload::windows::windows(
            &parts.records,
            &sc.slo,
            w,
            sc.workload.schedule.as_ref(),
        );
    }
    // failed and turned-away requests are counted, with their reasons, in
    // the report itself
    let unfinished = report.meta.requests.saturating_sub(
        finished + report.failed + report.rejected + report.refused + report.aborted,
    );
    if unfinished > 0 {
        report.notes.push(format!(
            "{unfinished} requests neither completed, failed nor were turned away: the run ended with them in the system"
        ));
    }
    SimOutput {
        report,
        records: parts.records,
        events: parts.events,
        queue_events: parts.events,
        inline_steps: 0,
        max_sm_share_sum: parts.max_sm_share_sum,
        decisions: Vec::new(),
        service: None,
        timeline: parts.timeline.map(Timeline::into_json),
    }
}
