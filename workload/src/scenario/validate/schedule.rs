//! `[[workload.phases]]`: a time-varying rate schedule, phase by phase, each
//! field checked against its kind ([`crate::schedule::Phase`]).

use super::{num, MAX_HORIZON_S, MAX_RATE, V};
use crate::scenario::{PhaseSection, ScenarioError, WorkloadSection};
use crate::schedule::{read_servegen, Phase, RateSchedule};
use std::path::Path;

/// Most on/off cycles one `burst` phase may hold (each is two pieces of
/// the schedule, searched per arrival; a million cycles is a few tens of MB).
pub(crate) const MAX_BURST_CYCLES: f64 = 1e6;

/// The kinds a phase may be.
pub const PHASE_KINDS: [&str; 5] = ["constant", "ramp", "diurnal", "burst", "servegen"];

/// The schedule of `workload.phases` (`None` when absent); ServeGen traces
/// are read relative to the scenario `file`.
pub(super) fn schedule_of(
    w: &WorkloadSection,
    v: &V<'_>,
    file: &str,
) -> Result<Option<RateSchedule>, ScenarioError> {
    let Some(rows) = &w.phases else {
        return Ok(None);
    };
    if rows.is_empty() {
        return Err(v.err(
            "workload.phases",
            "at least one phase is required (or leave the field out for one rate throughout)",
        ));
    }
    if w.arrival.as_deref() == Some("trace") {
        return Err(v.err(
            "workload.phases",
            "a rate schedule draws its own arrivals (poisson or gamma); a trace brings its own times",
        ));
    }
    let dir = Path::new(file).parent().unwrap_or(Path::new("."));
    let mut phases = Vec::with_capacity(rows.len());
    let mut media = Vec::with_capacity(rows.len());
    let mut span = 0.0;
    for (i, row) in rows.iter().enumerate() {
        let f = format!("workload.phases[{i}]");
        let p = phase_of(row, v, &f, dir)?;
        span += p.duration_s();
        phases.push(p);
        media.push(match row.media_share {
            Some(m) => v.real(&format!("{f}.media_share"), m, 0.0, 1.0, false)?,
            None => 1.0,
        });
    }
    if span > MAX_HORIZON_S {
        return Err(v.err(
            "workload.phases",
            format!(
                "the phases last {} s; at most {} s",
                num(span),
                num(MAX_HORIZON_S)
            ),
        ));
    }
    RateSchedule::new(phases)
        .map(|s| Some(s.with_media(&media)))
        .ok_or_else(|| {
            v.err(
                "workload.phases",
                "every phase has rate 0: the schedule has no arrivals",
            )
        })
}

/// One phase: its kind, and exactly the fields that kind takes.
fn phase_of(row: &PhaseSection, v: &V<'_>, f: &str, dir: &Path) -> Result<Phase, ScenarioError> {
    let given: [(&str, bool); 11] = [
        ("duration_s", row.duration_s.is_some()),
        ("rate", row.rate.is_some()),
        ("from", row.from.is_some()),
        ("to", row.to.is_some()),
        ("period_s", row.period_s.is_some()),
        ("peak", row.peak.is_some()),
        ("trough", row.trough.is_some()),
        ("on_s", row.on_s.is_some()),
        ("off_s", row.off_s.is_some()),
        ("trace", row.trace.is_some()),
        ("window_s", row.window_s.is_some()),
    ];
    let takes: &[&str] = match row.kind.as_str() {
        "constant" => &["duration_s", "rate"],
        "ramp" => &["duration_s", "from", "to"],
        "diurnal" => &["duration_s", "period_s", "peak", "trough"],
        "burst" => &["duration_s", "on_s", "off_s", "peak", "trough"],
        "servegen" => &["trace", "window_s"],
        other => {
            return Err(v.err(
                &format!("{f}.kind"),
                format!(
                    "unknown phase kind `{other}`; allowed: {}",
                    PHASE_KINDS.join(", ")
                ),
            ))
        }
    };
    if let Some((name, _)) = given.iter().find(|(n, g)| *g && !takes.contains(n)) {
        return Err(v.err(
            &format!("{f}.{name}"),
            format!(
                "not used by a `{}` phase, which takes: {}",
                row.kind,
                takes.join(", ")
            ),
        ));
    }
    let need = |name: &str, x: Option<f64>| {
        x.ok_or_else(|| {
            v.err(
                &format!("{f}.{name}"),
                format!("required for a `{}` phase", row.kind),
            )
        })
    };
    let positive = |name: &str, x: Option<f64>| {
        let x = need(name, x)?;
        if x.is_finite() && x > 0.0 {
            Ok(x)
        } else {
            Err(v.err(
                &format!("{f}.{name}"),
                format!("{} seconds: must be > 0", num(x)),
            ))
        }
    };
    let rate = |name: &str, x: Option<f64>| {
        v.real(&format!("{f}.{name}"), need(name, x)?, 0.0, MAX_RATE, false)
    };
    let peak_trough = || -> Result<(f64, f64), ScenarioError> {
        let (peak, trough) = (rate("peak", row.peak)?, rate("trough", row.trough)?);
        if peak < trough {
            return Err(v.err(
                &format!("{f}.peak"),
                format!(
                    "{} is below the trough {}: the peak must be at least the trough",
                    num(peak),
                    num(trough)
                ),
            ));
        }
        Ok((peak, trough))
    };
    Ok(match row.kind.as_str() {
        "constant" => Phase::Constant {
            duration_s: positive("duration_s", row.duration_s)?,
            rate: rate("rate", row.rate)?,
        },
        "ramp" => Phase::Ramp {
            duration_s: positive("duration_s", row.duration_s)?,
            from: rate("from", row.from)?,
            to: rate("to", row.to)?,
        },
        "diurnal" => {
            let duration_s = positive("duration_s", row.duration_s)?;
            let period_s = positive("period_s", row.period_s)?;
            let (peak, trough) = peak_trough()?;
            Phase::Diurnal {
                duration_s,
                period_s,
                peak,
                trough,
            }
        }
        "burst" => {
            let duration_s = positive("duration_s", row.duration_s)?;
            let on_s = positive("on_s", row.on_s)?;
            let off_s = positive("off_s", row.off_s)?;
            if duration_s / (on_s + off_s) > MAX_BURST_CYCLES {
                return Err(v.err(
                    &format!("{f}.on_s"),
                    format!(
                        "{} s on and {} s off over {} s are more than {} cycles; lengthen on_s and off_s",
                        num(on_s),
                        num(off_s),
                        num(duration_s),
                        num(MAX_BURST_CYCLES)
                    ),
                ));
            }
            let (peak, trough) = peak_trough()?;
            Phase::Burst {
                duration_s,
                on_s,
                off_s,
                peak,
                trough,
            }
        }
        _ => servegen_phase(row, v, f, dir)?,
    })
}

/// A `servegen` phase: the trace's per-window rates.
fn servegen_phase(
    row: &PhaseSection,
    v: &V<'_>,
    f: &str,
    dir: &Path,
) -> Result<Phase, ScenarioError> {
    let field = format!("{f}.trace");
    let name = row.trace.as_deref().ok_or_else(|| {
        v.err(
            &field,
            "required for a `servegen` phase: a ServeGen chunk-N-trace.csv (start_s, rate, cv, family, shape, scale)",
        )
    })?;
    let path = dir.join(name);
    let (window_s, rates) =
        read_servegen(&path).map_err(|e| v.err(&field, format!("{}: {e}", path.display())))?;
    if let Some(w) = row.window_s {
        if (w - window_s).abs() > 1e-9 * window_s {
            return Err(v.err(
                &format!("{f}.window_s"),
                format!(
                    "{} s, but the trace's windows are {} s apart",
                    num(w),
                    num(window_s)
                ),
            ));
        }
    }
    if rates.iter().any(|&r| r > MAX_RATE) {
        return Err(v.err(&field, format!("a window's rate exceeds {}", num(MAX_RATE))));
    }
    Ok(Phase::Replay {
        path: path.display().to_string(),
        window_s,
        rates,
    })
}
