//! `[planner]`: the policy, its window, dwell and horizon, the load
//! bandwidth the model load times come from, the SLO tier the `twin`
//! policy counts, the `load` policy's thresholds.

use super::{Scenario, ScenarioError, V};
use crate::scenario::PlannerSetup;
use easerve_model::Parallel;
use easerve_sched::planner::{BusyRule, LoadRule, PlannerConfig, PlannerPolicy, QueueSignal};
use easerve_sched::System;

/// Seconds the `twin` policy simulates ahead by default: ten minutes, the
/// horizon its speed is held to (one decision ≤ 50 ms, `benches/planner.rs`).
pub(crate) const DEFAULT_HORIZON_S: f64 = 600.0;

/// The validated `[planner]` of `sc` (its other sections validated), or
/// `None` without the section.
pub(super) fn planner_section(
    sc: &Scenario,
    v: &V<'_>,
) -> Result<Option<PlannerSetup>, ScenarioError> {
    let Some(p) = &sc.raw.planner else {
        return Ok(None);
    };
    let policy: PlannerPolicy = p
        .policy
        .as_deref()
        .unwrap_or("static")
        .parse()
        .map_err(|e: String| v.err("planner.policy", e))?;
    if policy != PlannerPolicy::Static
        && !matches!(sc.system, System::Easerve | System::Passthrough)
    {
        return Err(v.err(
            "planner.policy",
            format!(
                "the `{policy}` planner moves EPD workers; {} has none it can move (allowed with systems easerve and passthrough)",
                sc.system
            ),
        ));
    }
    let pos = |field: &str, x: Option<f64>| -> Result<Option<f64>, ScenarioError> {
        match x {
            Some(x) if !(x > 0.0 && x.is_finite()) => {
                Err(v.err(field, format!("{x} is not a positive number")))
            }
            x => Ok(x),
        }
    };
    let window_s = match pos("planner.window_s", p.window_s)?.or(sc.workload.window_s) {
        Some(w) => w,
        None => {
            return Err(v.err(
                "planner.window_s",
                "required when `workload.window_s` is not set (seconds between decisions)",
            ))
        }
    };
    let gbs = pos("planner.load_bandwidth_gbs", p.load_bandwidth_gbs)?;
    let (load_s, load_source) = match &p.load_s {
        Some(_) if gbs.is_some() => return Err(v.err(
            "planner.load_s",
            "give `planner.load_s` (measured) or `planner.load_bandwidth_gbs` (derived), not both",
        )),
        Some(m) => measured_load_times(v, m)?,
        None => {
            let (gbs, source) = load_bandwidth(sc, gbs);
            (load_times(sc, gbs), source)
        }
    };
    let tier = tier_of(sc, v, p.tier.as_deref())?;
    let d = LoadRule::default();
    let config = PlannerConfig {
        policy,
        window_s,
        dwell_s: pos("planner.dwell_s", p.dwell_s)?.unwrap_or(window_s),
        load_s,
        cluster_gpus: sc.gpus,
        horizon_s: pos("planner.horizon_s", p.horizon_s)?.unwrap_or(DEFAULT_HORIZON_S),
        rule: LoadRule {
            queue_up: pos("planner.queue_up", p.queue_up)?.unwrap_or(d.queue_up),
            queue_down: p.queue_down.unwrap_or(d.queue_down),
            kv_up: pos("planner.kv_up", p.kv_up)?.unwrap_or(d.kv_up),
            kv_down: p.kv_down.unwrap_or(d.kv_down),
            signal: match p.queue_signal.as_deref() {
                None => QueueSignal::default(),
                Some(s) => s
                    .parse()
                    .map_err(|e: String| v.err("planner.queue_signal", e))?,
            },
            busy: busy_rule(v, p.busy_up, p.busy_down)?,
        },
        offload: sc.deployment.offload,
    };
    config.check().map_err(|e| v.err(&e.field, e.message))?;
    Ok(Some(PlannerSetup {
        config,
        tier,
        load_source,
    }))
}

/// `planner.busy_up` and `planner.busy_down`: both or neither (their
/// ranges, `0 ≤ down < up < 1`, are `PlannerConfig::check`'s).
fn busy_rule(
    v: &V<'_>,
    up: Option<f64>,
    down: Option<f64>,
) -> Result<Option<BusyRule>, ScenarioError> {
    match (up, down) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(v.err(
            "planner.busy_down",
            "required with `planner.busy_up` (the busy fraction below which a stage may shrink, in [0, busy_up))",
        )),
        (None, Some(_)) => Err(v.err(
            "planner.busy_up",
            "required with `planner.busy_down` (the busy fraction above which a stage grows, in (0, 1))",
        )),
        (Some(up), Some(down)) => Ok(Some(BusyRule { up, down })),
    }
}

/// The load bandwidth, GB/s, and where it comes from: `given`, else the
/// cluster's link as the path from host memory to the GPU.
fn load_bandwidth(sc: &Scenario, given: Option<f64>) -> (f64, String) {
    match given {
        Some(b) => (b, format!("planner.load_bandwidth_gbs = {b} GB/s")),
        None => (
            sc.gpu.link.bandwidth_gbs,
            format!(
                "the cluster's link `{}`, {} GB/s (calib/src/gpu.rs), as the path from host memory to the GPU",
                sc.gpu.link.name, sc.gpu.link.bandwidth_gbs
            ),
        ),
    }
}

/// `planner.load_s`: three positive seconds (encode, prefill, decode), and
/// the source the report names.
fn measured_load_times(v: &V<'_>, m: &[f64]) -> Result<([f64; 3], String), ScenarioError> {
    match m {
        [e, p, d] if m.iter().all(|x| *x > 0.0 && x.is_finite()) => Ok((
            [*e, *p, *d],
            format!("planner.load_s = [{e}, {p}, {d}] s (measured, given in the scenario)"),
        )),
        _ => Err(v.err(
            "planner.load_s",
            format!(
                "{m:?}: expected three positive seconds, [encode, prefill, decode] (a worker's start to its model loaded)"
            ),
        )),
    }
}

/// The SLO tier the `twin` policy counts: `planner.tier`, else `moderate`,
/// else the last tier.
fn tier_of(sc: &Scenario, v: &V<'_>, tier: Option<&str>) -> Result<usize, ScenarioError> {
    match tier {
        Some(t) => sc.slo.iter().position(|s| s.name == t).ok_or_else(|| {
            let names: Vec<&str> = sc.slo.iter().map(|s| s.name.as_str()).collect();
            v.err(
                "planner.tier",
                format!("no SLO tier `{t}`; allowed: {}", names.join(", ")),
            )
        }),
        None => Ok(sc
            .slo
            .iter()
            .position(|s| s.name == "moderate")
            .unwrap_or(sc.slo.len().saturating_sub(1))),
    }
}

/// Seconds to load each stage's model on one worker's GPUs at `gbs` GB/s:
/// the weight bytes one GPU holds over the bandwidth, the GPUs loading in
/// parallel (encode: the encoder's weights split over its TP; prefill and
/// decode: `ModelArch::llm_weight_bytes_per_gpu` at the stage's TP and EP).
pub(crate) fn load_times(sc: &Scenario, gbs: f64) -> [f64; 3] {
    let a = &sc.deployment.allocation;
    let bytes = [
        sc.model.encoder_weight_bytes() / f64::from(a.encode.tp.max(1)),
        sc.model
            .llm_weight_bytes_per_gpu(Parallel::new(a.prefill.tp.max(1), a.prefill.ep.max(1))),
        sc.model
            .llm_weight_bytes_per_gpu(Parallel::new(a.decode.tp.max(1), a.decode.ep.max(1))),
    ];
    bytes.map(|b| b / (gbs * 1e9))
}

impl Scenario {
    /// Spare slots per stage (encode, remote prefill, decode) a planner may
    /// start: as many workers of the stage's size as the cluster's GPUs
    /// hold, less the deployment's; none for the `static` planner or
    /// without one.
    pub fn planner_spares(&self) -> [u32; 3] {
        let moves = self
            .planner
            .as_ref()
            .is_some_and(|p| p.config.policy != PlannerPolicy::Static);
        if !moves || self.aggregated().is_some() {
            return [0; 3];
        }
        let a = &self.deployment.allocation;
        [a.encode, a.prefill, a.decode].map(|pool| {
            let g = pool.gpus_per_worker();
            if g == 0 || pool.workers == 0 {
                0
            } else {
                (self.gpus / g).saturating_sub(pool.workers)
            }
        })
    }
}
