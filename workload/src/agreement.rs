//! How far a simulated run agrees with a measured one (`easerve calib
//! validate`): compare two [`Report`]s metric by metric.
//!
//! The measured run's JSON **is** a [`Report`] (DESIGN.md "Metrics": the same
//! report type comes out of sim and exec), as `easerve sim --json` writes it
//! and `easerve exec --json` writes the same. So a simulated report is a valid
//! stand-in for a measured one in tests.
//!
//! Compared, each as measured value, simulated value and relative error
//! `(simulated − measured) / measured` (0 when both are 0, ±∞ when only the
//! measured value is 0):
//!
//! * throughput: requests/s and output tokens/s;
//! * TTFT, TPOT, E2E: mean, P50, P90, P99;
//! * per compute stage (encode, prefill, decode) that either run passed
//!   through, keyed by the stage and the TP degrees its workers run at (from
//!   each report's deployment: the allocation's TP, and TP 1 for the local
//!   prefill workers of an offload `s` < 1), e.g. `prefill TP2 service mean
//!   (s)`: mean queueing and mean service time. A stage whose TP differs
//!   between the two runs gets one pair of rows per run (the other side 0),
//!   as a stage time at one TP says nothing about another.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::report::{Report, StageReport, REPORT_SCHEMA_VERSION};

/// One compared figure.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// What it is, e.g. `TTFT P90 (s)` or `encode service mean (s)`.
    pub metric: String,
    /// Value in the measured run.
    pub measured: f64,
    /// Value in the simulated run.
    pub simulated: f64,
    /// `(simulated − measured) / measured`; 0 when both are 0, ±∞ when only the
    /// measured value is 0.
    pub rel_error: f64,
}

/// All compared figures of two runs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Agreement {
    /// One row per figure, in the order of the module doc.
    pub rows: Vec<Row>,
}

/// Why a report could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReportLoadError {
    /// The file could not be read.
    #[error("cannot read report {file}: {source}")]
    Io {
        /// The file.
        file: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The JSON is not a report.
    #[error("report {file}: field `{path}`: {message} (the file must be the JSON of `easerve sim --json`, or a measured run in the same format)")]
    Json {
        /// The file.
        file: String,
        /// Path of the offending field (`.` for the document).
        path: String,
        /// What serde said.
        message: String,
    },
    /// The JSON is a report, but not one that can be compared: another schema
    /// version, or a negative or non-finite latency or throughput.
    #[error("report {file}: field `{field}`: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// The offending field.
        field: String,
        /// What is wrong and what is allowed.
        message: String,
    },
}

/// Read a report JSON: `easerve sim --json` or `easerve exec --json`, or the
/// result of `easerve bench --json`, whose member `easerve` is the report of
/// the requests it measured (its other members are `vllm bench serve`'s).
pub fn load_report(path: impl AsRef<Path>) -> Result<Report, ReportLoadError> {
    let path = path.as_ref();
    let file = path.display().to_string();
    let mut text = easerve_calib::input::read_text(path).map_err(|source| ReportLoadError::Io {
        file: file.clone(),
        source,
    })?;
    if let Ok(serde_json::Value::Object(mut m)) = serde_json::from_str::<serde_json::Value>(&text) {
        if let Some(report) = m.remove("easerve").filter(serde_json::Value::is_object) {
            text = report.to_string();
        }
    }
    let mut de = serde_json::Deserializer::from_str(&text);
    let report: Report = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        ReportLoadError::Json {
            file: file.clone(),
            // serde names no field when the text is not JSON at all
            path: if path == "?" || path == "." {
                "<document>".into()
            } else {
                path
            },
            message: e.inner().to_string(),
        }
    })?;
    check_report(&report).map_err(|(field, message)| ReportLoadError::Invalid {
        file,
        field,
        message,
    })?;
    Ok(report)
}

/// Read the measured side of a comparison: anything [`load_report`] reads,
/// or the result JSON of `vllm bench serve --save-result --save-detailed`
/// (any server vLLM's client measured), told by its `ttfts` member.
///
/// From a vLLM result these fields are read: `duration` (s), `ttfts`
/// (s per request), `itls` (s between output chunks, per request),
/// `output_lens`, `input_lens` (prompt tokens) and `errors` (an empty string
/// for a success). A request's E2E is its TTFT plus its ITLs, which ends at
/// its last output chunk (vLLM's own `latency` runs to the end of the stream,
/// a few milliseconds later), and its TPOT `(E2E − TTFT)/(output − 1)`;
/// throughputs are over `duration`. The result names
/// no easerve model or cluster, so the report takes `simulated`'s (the
/// caller says the two runs are of one deployment) and says so in a note;
/// it has no stage times.
///
/// # Errors
/// What [`load_report`] says, or a vLLM result's missing or malformed field.
pub fn load_measured(
    path: impl AsRef<Path>,
    simulated: &Report,
) -> Result<Report, ReportLoadError> {
    let path = path.as_ref();
    let file = path.display().to_string();
    let text = easerve_calib::input::read_text(path).map_err(|source| ReportLoadError::Io {
        file: file.clone(),
        source,
    })?;
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(v) if v.get("ttfts").is_some() && v.get("easerve").is_none() => {
            report_from_vllm(&v, simulated).map_err(|(field, message)| ReportLoadError::Invalid {
                file,
                field,
                message,
            })
        }
        _ => load_report(path),
    }
}

fn report_from_vllm(v: &serde_json::Value, simulated: &Report) -> Result<Report, (String, String)> {
    use crate::report::{EncodeSummary, RunMeta};
    let bad = |field: &str, m: &str| (field.to_string(), m.to_string());
    let list = |field: &str| {
        v.get(field)
            .and_then(serde_json::Value::as_array)
            .ok_or_else(|| {
                bad(
                    field,
                    "missing: run vllm bench serve with --save-result --save-detailed",
                )
            })
    };
    let duration = v
        .get("duration")
        .and_then(serde_json::Value::as_f64)
        .filter(|d| d.is_finite() && *d > 0.0)
        .ok_or_else(|| bad("duration", "must be a number of seconds > 0"))?;
    let (ttfts, itls, outs, errors) = (
        list("ttfts")?,
        list("itls")?,
        list("output_lens")?,
        list("errors")?,
    );
    let ins = list("input_lens")?;
    let n = ttfts.len();
    for (field, l) in [
        ("itls", itls),
        ("output_lens", outs),
        ("errors", errors),
        ("input_lens", ins),
    ] {
        if l.len() != n {
            return Err(bad(
                field,
                &format!("has {} entries, ttfts has {n}", l.len()),
            ));
        }
    }
    let mut records = Vec::with_capacity(n);
    let mut failed = 0usize;
    for i in 0..n {
        let err = errors[i].as_str().unwrap_or("");
        if !err.is_empty() {
            failed += 1;
            continue;
        }
        let ttft = ttfts[i]
            .as_f64()
            .filter(|t| t.is_finite() && *t >= 0.0)
            .ok_or_else(|| bad(&format!("ttfts[{i}]"), "must be seconds ≥ 0"))?;
        let gaps = itls[i]
            .as_array()
            .ok_or_else(|| bad(&format!("itls[{i}]"), "must be a list of seconds"))?;
        let mut e2e = ttft;
        for (j, g) in gaps.iter().enumerate() {
            e2e += g
                .as_f64()
                .filter(|t| t.is_finite() && *t >= 0.0)
                .ok_or_else(|| bad(&format!("itls[{i}][{j}]"), "must be seconds ≥ 0"))?;
        }
        let out = outs[i]
            .as_u64()
            .and_then(|o| u32::try_from(o).ok())
            .ok_or_else(|| {
                bad(
                    &format!("output_lens[{i}]"),
                    "must be a whole number of tokens",
                )
            })?;
        let prompt = ins[i].as_u64().ok_or_else(|| {
            bad(
                &format!("input_lens[{i}]"),
                "must be a whole number of tokens",
            )
        })?;
        records.push(easerve_sched::RequestRecord {
            id: i as u64,
            arrival: 0.0,
            output_tokens: out,
            prefill_tokens: prompt,
            first_token: easerve_sched::Stamp::at(ttft),
            finish: easerve_sched::Stamp::at(e2e),
            ..Default::default()
        });
    }
    let meta = RunMeta {
        requests: n,
        offered_rate: 0.0,
        ..simulated.meta.clone()
    };
    let slo: Vec<crate::report::SloTier> = simulated
        .goodput
        .iter()
        .map(|t| crate::report::SloTier {
            name: t.name.clone(),
            ttft_s: t.ttft_s,
            tpot_s: t.tpot_s,
        })
        .collect();
    let mut notes = vec!["read from a vllm bench serve result: per-request TTFT, ITLs, prompt and output lengths; no send times or stage times; model and cluster taken from the simulated report".to_string()];
    if n != simulated.meta.requests {
        notes.push(format!(
            "the vLLM result holds {n} requests and the simulation {}: are they one workload?",
            simulated.meta.requests
        ));
    }
    let mut r = Report::build(
        meta,
        &records,
        &slo,
        Vec::new(),
        EncodeSummary::default(),
        notes,
    );
    // throughputs over vLLM's duration (the records carry no send times)
    let scale = r.duration_s / duration;
    r.duration_s = duration;
    r.request_throughput *= scale;
    r.output_throughput *= scale;
    r.total_token_throughput *= scale;
    for t in &mut r.goodput {
        t.goodput *= scale;
    }
    r.failed = failed;
    r.measured = true;
    check_report(&r)?;
    Ok(r)
}

/// A report's schema version is this build's and every latency and
/// throughput in it is finite and ≥ 0; else the field and what is wrong.
fn check_report(r: &Report) -> Result<(), (String, String)> {
    if r.schema_version != REPORT_SCHEMA_VERSION {
        return Err((
            "schema_version".into(),
            format!(
                "{} is not this build's report schema ({REPORT_SCHEMA_VERSION}); re-run the command that wrote it",
                r.schema_version
            ),
        ));
    }
    let mut figures: Vec<(String, f64)> = vec![
        ("duration_s".into(), r.duration_s),
        ("request_throughput".into(), r.request_throughput),
        ("output_throughput".into(), r.output_throughput),
    ];
    let mut stats = |name: &str, s: &crate::report::Stats| {
        for (q, x) in [
            ("mean", s.mean),
            ("p50", s.p50),
            ("p90", s.p90),
            ("p99", s.p99),
            ("max", s.max),
        ] {
            figures.push((format!("{name}.{q}"), x));
        }
    };
    stats("ttft", &r.ttft);
    stats("tpot", &r.tpot);
    stats("e2e", &r.e2e);
    for (i, st) in r.stages.iter().enumerate() {
        stats(&format!("stages[{i}].queue"), &st.queue);
        stats(&format!("stages[{i}].service"), &st.service);
    }
    match figures.iter().find(|(_, x)| !(x.is_finite() && *x >= 0.0)) {
        Some((field, x)) => Err((
            field.clone(),
            format!("{x} is not a latency or rate: allowed finite values ≥ 0"),
        )),
        None => Ok(()),
    }
}

/// Why two runs cannot be compared ([`comparable`]), or why a measured run
/// has nothing to compare against ([`measurable`]).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CompareError {
    /// The runs are of different models.
    #[error("the runs are of different models: simulated `{simulated}`, measured `{measured}`")]
    Models {
        /// The simulated run's model.
        simulated: String,
        /// The measured run's model.
        measured: String,
    },
    /// The runs are on different clusters.
    #[error("the runs are on different clusters: simulated `{simulated}`, measured `{measured}`")]
    Clusters {
        /// The simulated run's cluster.
        simulated: String,
        /// The measured run's cluster.
        measured: String,
    },
    /// The measured run completed no request.
    #[error("the measured run has no completed request, so nothing to compare")]
    NoneCompleted,
    /// The measured run's mean TTFT is 0, missing or not finite.
    #[error(
        "the measured run's TTFTs are all 0 (or missing) over its {completed} completed requests; a TTFT is the time from a request's arrival to its first token"
    )]
    NoTtft {
        /// Its completed requests.
        completed: usize,
    },
    /// The measured run's mean TPOT is 0, missing or not finite though its
    /// requests generated more than one token each.
    #[error(
        "the measured run's TPOTs are all 0 (or missing) though its requests generated {tokens_each:.1} tokens each"
    )]
    NoTpot {
        /// Output tokens per request, by the run's token rate over its duration.
        tokens_each: f64,
    },
}

/// Whether two reports describe runs that can be compared: the same model
/// on the same cluster (GPU type, count and link). The error names both.
pub fn comparable(simulated: &Report, measured: &Report) -> Result<(), CompareError> {
    let (s, m) = (&simulated.meta, &measured.meta);
    if s.model != m.model {
        return Err(CompareError::Models {
            simulated: s.model.clone(),
            measured: m.model.clone(),
        });
    }
    if s.cluster != m.cluster {
        return Err(CompareError::Clusters {
            simulated: s.cluster.clone(),
            measured: m.cluster.clone(),
        });
    }
    Ok(())
}

/// Whether a measured run has something to compare against: at least one
/// completed request, with a positive mean TTFT, and a positive mean TPOT when
/// its requests generated more than one token each (by its output token rate
/// over its duration).
///
/// # Errors
/// What the run lacks, in words.
pub fn measurable(measured: &Report) -> Result<(), CompareError> {
    if measured.completed == 0 {
        return Err(CompareError::NoneCompleted);
    }
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(measured.ttft.mean) {
        return Err(CompareError::NoTtft {
            completed: measured.completed,
        });
    }
    // output tokens per request, from the run's token rate over its duration
    let tokens_each = measured.output_throughput * measured.duration_s / measured.completed as f64;
    if tokens_each > 1.0 && !positive(measured.tpot.mean) {
        return Err(CompareError::NoTpot { tokens_each });
    }
    Ok(())
}

/// `(simulated − measured) / measured` with the conventions of [`Row::rel_error`].
pub fn rel_error(measured: f64, simulated: f64) -> f64 {
    if measured == 0.0 {
        if simulated == 0.0 {
            0.0
        } else {
            f64::INFINITY.copysign(simulated)
        }
    } else {
        (simulated - measured) / measured
    }
}

/// The TP degrees of the encode, prefill and decode workers of `r`'s
/// deployment (`2E(TP1)+1P(TP2)+1D(TP4) B=8 s=0.8 …`), ascending: the
/// allocation's, and TP 1 for prefill when `s` < 1 with encode workers (local
/// prefill workers share the encode workers' GPUs at TP 1,
/// [`easerve_sched::Allocation`]). `None` when the deployment does not start
/// with an allocation.
fn stage_tps(r: &Report) -> Option<[Vec<u32>; 3]> {
    let mut words = r.meta.deployment.split_whitespace();
    let a: easerve_sched::Allocation = words.next()?.parse().ok()?;
    let offload = words
        .find_map(|w| w.strip_prefix("s="))
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(1.0);
    let of = |p: easerve_sched::StagePool| if p.workers > 0 { vec![p.tp] } else { vec![] };
    let mut prefill = of(a.prefill);
    if offload < 1.0 && a.encode.workers > 0 && !prefill.contains(&1) {
        prefill.insert(0, 1);
    }
    Some([of(a.encode), prefill, of(a.decode)])
}

/// `TP2`, or `TP1,2` for a stage whose workers run at several degrees.
fn tp_label(tps: &[u32]) -> String {
    let t: Vec<String> = tps.iter().map(u32::to_string).collect();
    format!("TP{}", t.join(","))
}

impl Agreement {
    /// Compare a simulated report with a measured one.
    pub fn compare(simulated: &Report, measured: &Report) -> Agreement {
        let mut rows = Vec::new();
        let mut push = |metric: String, m: f64, s: f64| {
            rows.push(Row {
                metric,
                measured: m,
                simulated: s,
                rel_error: rel_error(m, s),
            })
        };
        push(
            "throughput (req/s)".into(),
            measured.request_throughput,
            simulated.request_throughput,
        );
        push(
            "output throughput (tok/s)".into(),
            measured.output_throughput,
            simulated.output_throughput,
        );
        let stats = [
            ("TTFT", &measured.ttft, &simulated.ttft),
            ("TPOT", &measured.tpot, &simulated.tpot),
            ("E2E", &measured.e2e, &simulated.e2e),
        ];
        for (name, m, s) in stats {
            for (q, a, b) in [
                ("mean", m.mean, s.mean),
                ("P50", m.p50, s.p50),
                ("P90", m.p90, s.p90),
                ("P99", m.p99, s.p99),
            ] {
                push(format!("{name} {q} (s)"), a, b);
            }
        }
        let stage = |r: &Report, name: &str| -> Option<StageReport> {
            r.stages
                .iter()
                .find(|s| s.stage == name && s.requests > 0)
                .cloned()
        };
        // a run measured from outside the server (`easerve bench`) sees no
        // stage: its rows would compare the simulation with nothing
        let stages_seen = measured.stages.iter().any(|s| s.requests > 0);
        for (i, name) in ["encode", "prefill", "decode"]
            .into_iter()
            .enumerate()
            .filter(|_| stages_seen)
        {
            let (m, s) = (stage(measured, name), stage(simulated, name));
            if m.is_none() && s.is_none() {
                continue;
            }
            let q = |x: &Option<StageReport>| x.as_ref().map_or(0.0, |x| x.queue.mean);
            let v = |x: &Option<StageReport>| x.as_ref().map_or(0.0, |x| x.service.mean);
            let key = |r: &Report| stage_tps(r).map(|t| tp_label(&t[i]));
            let (km, ks) = (key(measured), key(simulated));
            let keyed = |k: &Option<String>| match k {
                Some(t) => format!("{name} {t}"),
                None => name.to_string(),
            };
            if km == ks {
                let k = keyed(&km);
                push(format!("{k} queueing mean (s)"), q(&m), q(&s));
                push(format!("{k} service mean (s)"), v(&m), v(&s));
            } else {
                let (a, b) = (keyed(&km), keyed(&ks));
                push(format!("{a} queueing mean (s)"), q(&m), 0.0);
                push(format!("{a} service mean (s)"), v(&m), 0.0);
                push(format!("{b} queueing mean (s)"), 0.0, q(&s));
                push(format!("{b} service mean (s)"), 0.0, v(&s));
            }
        }
        Agreement { rows }
    }

    /// The row with the largest |relative error| (`None` when there are no rows).
    pub fn worst(&self) -> Option<&Row> {
        self.rows
            .iter()
            .max_by(|a, b| a.rel_error.abs().total_cmp(&b.rel_error.abs()))
    }

    /// Rows whose |relative error| exceeds `max_error` (a fraction, 0.1 = 10 %).
    pub fn exceeding(&self, max_error: f64) -> Vec<&Row> {
        self.rows
            .iter()
            .filter(|r| r.rel_error.abs() > max_error)
            .collect()
    }

    /// A table: metric, measured, simulated, relative error in %.
    pub fn render_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<30}{:>14}{:>14}{:>10}",
            "metric", "measured", "simulated", "error"
        );
        for r in &self.rows {
            let err = if r.rel_error.is_finite() {
                format!("{:+.1}%", r.rel_error * 100.0)
            } else {
                "inf".to_string()
            };
            let _ = writeln!(
                s,
                "{:<30}{:>14.6}{:>14.6}{:>10}",
                r.metric, r.measured, r.simulated, err
            );
        }
        if let Some(w) = self.worst() {
            let _ = writeln!(
                s,
                "largest |error|: {} ({:.1}%)",
                w.metric,
                w.rel_error.abs() * 100.0
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{EncodeSummary, RunMeta};
    use easerve_sched::RequestRecord;

    /// Records of a small run, every timestamp multiplied by `f`.
    fn records(f: f64) -> Vec<RequestRecord> {
        (0..20u64)
            .map(|i| {
                let a = i as f64 * 0.5;
                let x = (i % 7) as f64 * 0.01;
                let t = [
                    a,
                    a + 0.1 + x,
                    a + 1.6 + x,
                    a + 1.65 + x,
                    a + 1.7 + 2.0 * x,
                    a + 2.0 + 2.0 * x,
                    a + 2.01 + 2.0 * x,
                    a + 2.02 + 3.0 * x,
                    a + 4.0 + 3.0 * x,
                ];
                RequestRecord {
                    id: i,
                    arrival: t[0] * f,
                    output_tokens: 50 + i as u32,
                    prefill_tokens: 3000,
                    encode_worker: Some(0),
                    encode_batch: Some(1),
                    encode_start: easerve_sched::Stamp::at(t[1] * f),
                    encode_end: easerve_sched::Stamp::at(t[2] * f),
                    prefill_ready: easerve_sched::Stamp::at(t[3] * f),
                    prefill_start: easerve_sched::Stamp::at(t[4] * f),
                    first_token: easerve_sched::Stamp::at(t[5] * f),
                    decode_ready: easerve_sched::Stamp::at(t[6] * f),
                    decode_start: easerve_sched::Stamp::at(t[7] * f),
                    finish: easerve_sched::Stamp::at(t[8] * f),
                    ..Default::default()
                }
            })
            .collect()
    }

    fn report(f: f64) -> Report {
        Report::build(
            RunMeta::default(),
            &records(f),
            &[],
            vec![],
            EncodeSummary::default(),
            vec![],
        )
    }

    #[test]
    fn a_run_against_itself_has_zero_error() {
        let r = report(1.0);
        let v = Agreement::compare(&r, &r);
        assert_eq!(v.rows.len(), 2 + 12 + 6);
        assert!(v.rows.iter().all(|r| r.rel_error == 0.0), "{v:?}");
        assert!(v.exceeding(0.0).is_empty());
    }

    #[test]
    fn scaled_latencies_give_the_scale_as_error() {
        // every timestamp × 1.25: latencies +25 %, throughput 1/1.25 − 1 = −20 %
        let measured = report(1.0);
        let sim = report(1.25);
        let v = Agreement::compare(&sim, &measured);
        for r in &v.rows {
            let want = if r.metric.contains("throughput") {
                -0.2
            } else {
                0.25
            };
            assert!(
                (r.rel_error - want).abs() < 1e-9,
                "{}: {} vs {want}",
                r.metric,
                r.rel_error
            );
        }
        assert_eq!(v.exceeding(0.24).len(), v.rows.len() - 2);
        assert!(v.exceeding(0.26).is_empty());
        assert!((v.worst().unwrap().rel_error - 0.25).abs() < 1e-9);
        assert!(v.render_text().contains("+25.0%"));
    }

    #[test]
    fn reports_round_trip_through_json_and_bad_files_name_the_field() {
        let dir = std::env::temp_dir().join(format!("easerve-validate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("r.json");
        let r = report(1.0);
        std::fs::write(&p, serde_json::to_string_pretty(&r).unwrap()).unwrap();
        // serde_json's default float parsing may differ from the written value in
        // the last bit, so compare through the agreement
        let back = load_report(&p).unwrap();
        assert_eq!(back.completed, r.completed);
        let v = Agreement::compare(&back, &r);
        assert!(v.rows.iter().all(|x| x.rel_error.abs() < 1e-12), "{v:?}");
        std::fs::write(&p, r#"{"scenario": "x", "completed": "many"}"#).unwrap();
        let e = load_report(&p).unwrap_err().to_string();
        assert!(e.contains("r.json") && e.contains("completed"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Stage rows are keyed by stage and TP (the local prefill workers of
    /// `s` < 1 at TP 1); a stage at another TP in the other run gets rows of
    /// its own.
    #[test]
    fn stage_rows_are_keyed_by_stage_and_tp() {
        let with = |deployment: &str| {
            let mut r = report(1.0);
            r.meta.deployment = deployment.into();
            r
        };
        let a = with("1E(TP1)+1P(TP2)+1D(TP2) B=8 s=0.8 sm=dynamic");
        let v = Agreement::compare(&a, &a);
        let names: Vec<&str> = v.rows.iter().map(|r| r.metric.as_str()).collect();
        for want in [
            "encode TP1 service mean (s)",
            "prefill TP1,2 queueing mean (s)",
            "decode TP2 service mean (s)",
        ] {
            assert!(names.contains(&want), "{names:?}");
        }
        let b = with("1E(TP1)+1P(TP2)+1D(TP4) B=8 s=1");
        let v = Agreement::compare(&b, &a);
        let row = |m: &str| v.rows.iter().find(|r| r.metric == m).unwrap();
        assert_eq!(row("decode TP2 service mean (s)").simulated, 0.0);
        assert_eq!(row("decode TP4 service mean (s)").measured, 0.0);
        assert!(row("prefill TP2 service mean (s)").measured == 0.0);
        assert_eq!(v.rows.len(), 2 + 12 + 2 + 4 + 4);
    }

    #[test]
    fn zero_measured_is_infinite_error_unless_both_zero() {
        assert_eq!(rel_error(0.0, 0.0), 0.0);
        assert_eq!(rel_error(0.0, 1.0), f64::INFINITY);
        assert_eq!(rel_error(2.0, 1.0), -0.5);
    }
}
