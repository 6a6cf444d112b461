//! The `[workload]` section: request count, arrival process and rate (or a
//! replayed trace), prompt and output lengths, and the modality's shapes,
//! checked against what the model accepts; and the bounds on what one
//! request can draw ([`Shapes::max_items`], [`Shapes::max_mm_tokens`]).

use super::{num, V};
use crate::generate::item_tokens;
use crate::scenario::{Arrival, ScenarioError, ScenarioFile, Shapes, Workload, WorkloadSection};
use easerve_model::ModelArch;
use easerve_sched::{MmItem, Modality};
use std::path::Path;

/// Longest simulated span the arrivals may cover, seconds (about 31.7 years):
/// times are f64 seconds, whose resolution there is still 0.12 µs; much
/// further out, service times of microseconds vanish in rounding.
pub const MAX_HORIZON_S: f64 = 1e9;

/// Most windows a run's report may hold (`workload.window_s` against the
/// run's expected span, requests / rate).
pub(crate) const MAX_WINDOWS: f64 = 100_000.0;

/// Largest `workload.rate` (and `rate_scale`) a scenario accepts, requests/s.
pub const MAX_RATE: f64 = 1e6;

/// The `[workload]` section: request count, arrival process and rate (or a
/// trace next to the scenario, `file`), prompt and output lengths, and the
/// modality's shapes, checked against what `model` accepts.
pub(super) fn workload_section(
    raw: &ScenarioFile,
    v: &V<'_>,
    file: &str,
    model: &ModelArch,
) -> Result<Workload, ScenarioError> {
    let w = &raw.workload;
    let requests = v.int("workload.requests", w.requests, 1, 10_000_000)? as usize;
    let schedule = super::schedule::schedule_of(w, v, file)?;
    // a schedule without `rate` runs at its own mean; with `rate`, rescaled to it
    let own_mean;
    let w = match (&schedule, w.rate) {
        (Some(s), None) => {
            own_mean = WorkloadSection {
                rate: Some(s.mean_rate()),
                ..w.clone()
            };
            &own_mean
        }
        _ => w,
    };
    let (arrival, rate) = arrival_of(w, v, file, requests)?;
    let schedule = schedule.map(|s| s.with_mean(rate));
    let window_s = match (w.window_s, &schedule) {
        (Some(x), _) => Some(v.real("workload.window_s", x, 0.0, MAX_HORIZON_S, true)?),
        (None, Some(s)) => Some(s.period_s() / 24.0),
        (None, None) => None,
    };
    // the report keeps one row per window: bound them by the run's expected span
    if let Some(ws) = window_s {
        let windows = requests as f64 / rate / ws;
        if windows > MAX_WINDOWS {
            return Err(v.err(
                "workload.window_s",
                format!(
                    "{} s windows over the run's expected {} s are {} windows; at most {}: give a longer window",
                    num(ws),
                    num(requests as f64 / rate),
                    num(windows.round()),
                    num(MAX_WINDOWS)
                ),
            ));
        }
    }
    let timeout_s = match w.timeout_s {
        Some(x) => Some(v.real("workload.timeout_s", x, 0.0, MAX_HORIZON_S, true)?),
        None => None,
    };
    let replay = matches!(arrival, Arrival::Trace { .. });
    let (input_len, output_len, range_ratio) = lengths_of(w, v, replay)?;
    let modality = modality_of(w, v)?;
    let shapes = shapes_of(w, v, modality)?;
    // check the model accepts the modality and every bucket shape
    let token_check = match &shapes {
        Shapes::Items { buckets, .. } => buckets
            .iter()
            .try_for_each(|b| item_tokens(model, &b.0).map(|_| ())),
        Shapes::Audio { mean_s, .. } => model.audio_tokens(*mean_s).map(|_| ()),
        Shapes::Text => Ok(()),
    };
    token_check.map_err(|e| v.err(&format!("workload.{}", w.modality), e.to_string()))?;
    let reuse = super::reuse::reuse_of(w, v, &shapes, &arrival)?;
    Ok(Workload {
        requests,
        rate,
        arrival,
        input_len,
        output_len,
        range_ratio,
        modality,
        shapes,
        schedule,
        window_s,
        reuse,
        timeout_s,
    })
}

/// The arrival process and its mean rate, requests/s: `workload.rate` with
/// `poisson` or `gamma` (and its `cv`), or a trace replayed at its own rate,
/// rescaled; the arrivals of `requests` must span a time the simulator's
/// clock resolves ([`MAX_HORIZON_S`]).
fn arrival_of(
    w: &WorkloadSection,
    v: &V<'_>,
    file: &str,
    requests: usize,
) -> Result<(Arrival, f64), ScenarioError> {
    let given_rate = w
        .rate
        .map(|r| v.real("workload.rate", r, 0.0, MAX_RATE, true))
        .transpose()?;
    let arrival_kind = w.arrival.as_deref().unwrap_or("poisson");
    if arrival_kind != "gamma" && w.cv.is_some() {
        return Err(v.err("workload.cv", "only used with arrival = \"gamma\""));
    }
    if arrival_kind != "trace" && (w.trace.is_some() || w.rate_scale.is_some()) {
        let f = if w.trace.is_some() {
            "workload.trace"
        } else {
            "workload.rate_scale"
        };
        return Err(v.err(f, "only used with arrival = \"trace\""));
    }
    let need_rate = || {
        given_rate.ok_or_else(|| {
            v.err(
                "workload.rate",
                "required (requests/s > 0) unless arrival = \"trace\"",
            )
        })
    };
    let (arrival, rate) = match arrival_kind {
        "poisson" => (Arrival::Poisson, need_rate()?),
        "gamma" => {
            let cv = v.real("workload.cv", w.cv.unwrap_or(1.0), 0.0, 100.0, true)?;
            let rate = need_rate()?;
            // the generator draws gaps from Gamma(k = 1/cv², θ = 1/(rate·k))
            let k = 1.0 / (cv * cv);
            let theta = 1.0 / (rate * k);
            if !(k.is_finite() && theta.is_normal()) {
                return Err(v.err(
                    "workload.cv",
                    format!(
                        "{} is too small at rate {}: the gamma gaps' shape 1/cv² = {} and scale {} are not representable; use a larger cv",
                        num(cv),
                        num(rate),
                        num(k),
                        num(theta)
                    ),
                ));
            }
            (Arrival::Gamma { cv }, rate)
        }
        "trace" => trace_arrival(w, v, file, requests, given_rate)?,
        other => {
            return Err(v.err(
                "workload.arrival",
                format!("unknown arrival `{other}`; allowed: poisson, gamma, trace"),
            ))
        }
    };
    if let Arrival::Trace { rows, path, .. } = &arrival {
        if rows.len() < requests {
            return Err(v.err(
                "workload.requests",
                format!(
                    "{requests} requests asked for, but the trace {path} has {} rows; a trace is replayed once, so ask for at most that many",
                    rows.len()
                ),
            ));
        }
    }
    // the arrivals must span a time the simulator can resolve: a trace's own
    // span (its mean rate counts gaps, so requests / rate would overstate it)
    let horizon = match &arrival {
        Arrival::Trace { rows, .. } => rows.get(requests.saturating_sub(1)).map_or(0.0, |r| r.t),
        _ => requests as f64 / rate,
    };
    if horizon.is_nan() || horizon > MAX_HORIZON_S {
        return Err(v.err(
            "workload.rate",
            format!(
                "{} requests/s spreads {requests} requests over {} s; the simulator's clock resolves service times only within {} s, so give a rate of at least {}",
                num(rate),
                num(horizon),
                num(MAX_HORIZON_S),
                num(requests as f64 / MAX_HORIZON_S)
            ),
        ));
    }
    Ok((arrival, rate))
}

/// `arrival = "trace"`: the first `requests` rows of `workload.trace` (next
/// to the scenario, `file`), rescaled to `given_rate` or by
/// `workload.rate_scale`; the arrival and its mean rate, requests/s.
fn trace_arrival(
    w: &WorkloadSection,
    v: &V<'_>,
    file: &str,
    requests: usize,
    given_rate: Option<f64>,
) -> Result<(Arrival, f64), ScenarioError> {
    let name = w.trace.as_deref().ok_or_else(|| {
        v.err(
            "workload.trace",
            "required when arrival = \"trace\": a CSV in the Azure LLM inference trace format",
        )
    })?;
    let path = Path::new(file)
        .parent()
        .unwrap_or(Path::new("."))
        .join(name);
    let (mut rows, content) = crate::trace::read_azure_content(&path, requests)
        .map_err(|e| v.err("workload.trace", format!("{}: {e}", path.display())))?;
    let native = crate::trace::mean_rate(&rows);
    check_rescalable(&rows, given_rate.is_some(), w.rate_scale.is_some(), v)?;
    let scale =
        match (given_rate, w.rate_scale) {
            (Some(_), Some(_)) => return Err(v.err(
                "workload.rate_scale",
                "give either workload.rate (a target mean rate) or workload.rate_scale, not both",
            )),
            (Some(r), None) => r / native,
            (None, s) => v.real("workload.rate_scale", s.unwrap_or(1.0), 0.0, MAX_RATE, true)?,
        };
    crate::trace::scale(&mut rows, scale);
    let rate = crate::trace::mean_rate(&rows);
    Ok((
        Arrival::Trace {
            path: path.display().to_string(),
            rows,
            content: (!content.is_empty()).then_some(content),
        },
        rate,
    ))
}

/// A trace whose first `rows` all arrive at one instant has no rate to
/// rescale: `workload.rate` or `workload.rate_scale` on it is bad input.
fn check_rescalable(
    rows: &[crate::trace::TraceRow],
    rate_given: bool,
    scale_given: bool,
    v: &V<'_>,
) -> Result<(), ScenarioError> {
    let one_instant = rows.len() > 1 && rows.last().is_some_and(|r| r.t <= 0.0);
    if one_instant && (rate_given || scale_given) {
        let field = if rate_given {
            "workload.rate"
        } else {
            "workload.rate_scale"
        };
        return Err(v.err(
            field,
            format!(
        "the trace's first {} rows all arrive at one instant, so it has no rate to rescale; leave out workload.rate and workload.rate_scale to replay it as it is, or give a trace whose timestamps differ",
        rows.len()
            ),
        ));
    }
    Ok(())
}

/// Mean prompt and output tokens and their range ratio; a replayed trace
/// brings its own lengths, so they may be left out.
fn lengths_of(
    w: &WorkloadSection,
    v: &V<'_>,
    replay: bool,
) -> Result<(u32, u32, f64), ScenarioError> {
    let len = |field: &str, x: Option<i64>, min: i64| -> Result<i64, ScenarioError> {
        match x {
            Some(x) => v.int(field, x, min, 10_000_000),
            None if replay => Ok(min.max(1)),
            None => Err(v.err(field, format!("required: tokens ≥ {min}"))),
        }
    };
    let input_len = len("workload.input_len", w.input_len, 0)? as u32;
    let output_len = len("workload.output_len", w.output_len, 1)? as u32;
    let range_ratio = v.real(
        "workload.range_ratio",
        w.range_ratio.unwrap_or(0.0),
        0.0,
        1.0,
        false,
    )?;
    Ok((input_len, output_len, range_ratio))
}

/// `workload.modality`, with no shape section given for another modality.
fn modality_of(w: &WorkloadSection, v: &V<'_>) -> Result<Modality, ScenarioError> {
    let modality = match w.modality.as_str() {
        "image" => Modality::Image,
        "video" => Modality::Video,
        "audio" => Modality::Audio,
        "text" => Modality::Text,
        other => {
            return Err(v.err(
                "workload.modality",
                format!("unknown modality `{other}`; allowed: image, video, audio, text"),
            ))
        }
    };
    let unused = |name: &str, present: bool| -> Result<(), ScenarioError> {
        if present && w.modality != name {
            Err(v.err(
                &format!("workload.{name}"),
                format!("given but workload.modality is `{}`", w.modality),
            ))
        } else {
            Ok(())
        }
    };
    unused("image", w.image.is_some())?;
    unused("video", w.video.is_some())?;
    unused("audio", w.audio.is_some())?;
    Ok(modality)
}

/// The modality's shapes: items per request and a bucket table of shapes
/// with relative weights (images, videos), or clip durations (audio).
fn shapes_of(w: &WorkloadSection, v: &V<'_>, modality: Modality) -> Result<Shapes, ScenarioError> {
    let items =
        |field: &str, n: Option<i64>, r: Option<f64>| -> Result<(u32, f64), ScenarioError> {
            Ok((
                v.int(&format!("{field}.items_per_request"), n.unwrap_or(1), 1, 64)? as u32,
                v.real(
                    &format!("{field}.items_range_ratio"),
                    r.unwrap_or(0.0),
                    0.0,
                    1.0,
                    false,
                )?,
            ))
        };
    let prob = |field: String, p: f64| v.real(&field, p, 0.0, f64::MAX, false);
    let missing = |name: &str| {
        v.err(
            &format!("workload.{name}"),
            format!("required when workload.modality = \"{name}\""),
        )
    };
    let shapes = match modality {
        Modality::Image => {
            let s = w.image.as_ref().ok_or_else(|| missing("image"))?;
            let (items, items_range_ratio) =
                items("workload.image", s.items_per_request, s.items_range_ratio)?;
            let buckets = v.table("workload.image.buckets", &s.buckets, |f, b| {
                let height = v.int(&format!("{f}.height"), b.height, 1, 16384)? as u32;
                let width = v.int(&format!("{f}.width"), b.width, 1, 16384)? as u32;
                let p = prob(format!("{f}.probability"), b.probability)?;
                Ok((MmItem::Image { height, width }, p))
            })?;
            Shapes::Items {
                items,
                items_range_ratio,
                buckets,
            }
        }
        Modality::Video => {
            let s = w.video.as_ref().ok_or_else(|| missing("video"))?;
            let (items, items_range_ratio) =
                items("workload.video", s.items_per_request, s.items_range_ratio)?;
            let buckets = v.table("workload.video.buckets", &s.buckets, |f, b| {
                let frames = v.int(&format!("{f}.frames"), b.frames, 1, 4096)? as u32;
                let height = v.int(&format!("{f}.height"), b.height, 1, 16384)? as u32;
                let width = v.int(&format!("{f}.width"), b.width, 1, 16384)? as u32;
                let p = prob(format!("{f}.probability"), b.probability)?;
                Ok((
                    MmItem::Video {
                        frames,
                        height,
                        width,
                    },
                    p,
                ))
            })?;
            Shapes::Items {
                items,
                items_range_ratio,
                buckets,
            }
        }
        Modality::Audio => {
            let s = w.audio.as_ref().ok_or_else(|| missing("audio"))?;
            Shapes::Audio {
                mean_s: v.real("workload.audio.mean_s", s.mean_s, 0.0, 3600.0, true)?,
                sigma: v.real(
                    "workload.audio.sigma",
                    s.sigma.unwrap_or(0.5),
                    0.0,
                    5.0,
                    false,
                )?,
                max_s: v.real(
                    "workload.audio.max_s",
                    s.max_s.unwrap_or(30.0),
                    0.1,
                    3600.0,
                    false,
                )?,
            }
        }
        Modality::Text => Shapes::Text,
    };
    let bucket_total: f64 = match &shapes {
        Shapes::Items { buckets, .. } => buckets.iter().map(|b| b.1).sum(),
        _ => 1.0,
    };
    if !(bucket_total > 0.0 && bucket_total.is_finite()) {
        return Err(v.err(
            &format!("workload.{}.buckets", w.modality),
            format!(
                "probabilities sum to {}; they are relative weights whose sum must be positive and finite",
                num(bucket_total)
            ),
        ));
    }
    Ok(shapes)
}

/// Upper bound on one sequence's tokens (prompt + multimodal + output) the
/// workload can draw: the KV cache of a single worker must hold at least this.
pub(super) fn max_sequence_tokens(
    model: &ModelArch,
    input: u32,
    output: u32,
    r: f64,
    shapes: &Shapes,
) -> u64 {
    let hi = |len: u32| (len as f64 * (1.0 + r)).ceil() as u64;
    hi(input) + hi(output) + shapes.max_mm_tokens(model)
}

impl Shapes {
    /// The most multimodal items one request can draw: `⌈items·(1 + r)⌉`, the
    /// top of [`crate::generate`]'s uniform range (1 for audio, 0 for text).
    pub fn max_items(&self) -> u64 {
        match self {
            Shapes::Items {
                items,
                items_range_ratio,
                ..
            } => ((f64::from(*items) * (1.0 + items_range_ratio)).ceil() as u64).max(1),
            Shapes::Audio { .. } => 1,
            Shapes::Text => 0,
        }
    }

    /// The most multimodal tokens one request can bring to the LLM under
    /// `model`: its largest bucket's tokens times [`Shapes::max_items`] (the
    /// longest clip for audio).
    pub fn max_mm_tokens(&self, model: &ModelArch) -> u64 {
        match self {
            Shapes::Items { buckets, .. } => {
                let per = buckets
                    .iter()
                    .filter_map(|b| item_tokens(model, &b.0).ok())
                    .map(|t| t.llm_tokens)
                    .max()
                    .unwrap_or(0);
                per * self.max_items()
            }
            Shapes::Audio { max_s, .. } => model
                .audio_tokens(*max_s)
                .map(|t| t.llm_tokens)
                .unwrap_or(0),
            Shapes::Text => 0,
        }
    }
}
