//! What a benchmark run measured: easerve's [`Report`] (the same as `sim`'s
//! and `exec`'s, so `calib validate` compares them) and `vllm bench serve`'s
//! result keys, with its text layout.
//!
//! Definitions follow `vllm bench serve` (vLLM 0.33.0,
//! `vllm/benchmarks/serve.py`): TTFT is send → first chunk with output; ITL
//! the gaps between chunks with output; TPOT `(E2EL − TTFT)/(output − 1)`
//! for outputs longer than one token; E2EL send → last chunk with output;
//! duration the wall time from the start until every request is gathered;
//! percentiles by linear interpolation; `std` the population standard
//! deviation.

use crate::client::Outcome;
use easerve_sched::RequestRecord;
use easerve_workload::report::{EncodeSummary, Report, RunMeta, SloTier};
use serde::Serialize;
use serde_json::{Map, Value};
use std::fmt::Write as _;

/// A goodput bound of `--goodput` (`ttft:MS`, `tpot:MS`, `e2el:MS`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GoodputBound {
    /// TTFT at most this many ms.
    Ttft(f64),
    /// TPOT at most this many ms.
    Tpot(f64),
    /// E2EL at most this many ms.
    E2el(f64),
}

/// Parse one `--goodput` value, `KEY:MS`.
///
/// # Errors
/// An unknown key or a bound that is not a number ≥ 0.
pub fn parse_goodput(s: &str) -> Result<GoodputBound, String> {
    let (k, v) = s
        .split_once(':')
        .ok_or_else(|| format!("`{s}`: expected KEY:MILLISECONDS with KEY ttft, tpot or e2el"))?;
    let ms: f64 = v
        .parse()
        .ok()
        .filter(|x: &f64| x.is_finite() && *x >= 0.0)
        .ok_or_else(|| format!("`{s}`: the bound must be a number of milliseconds ≥ 0"))?;
    match k {
        "ttft" => Ok(GoodputBound::Ttft(ms)),
        "tpot" => Ok(GoodputBound::Tpot(ms)),
        "e2el" => Ok(GoodputBound::E2el(ms)),
        _ => Err(format!(
            "`{s}`: unknown key `{k}`; allowed ttft, tpot, e2el"
        )),
    }
}

/// Summary of one latency, in ms, with vLLM's key names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct MsStats {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub median: f64,
    /// Population standard deviation.
    pub std: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl MsStats {
    /// Of `xs` in seconds (all zero when empty).
    pub fn of_seconds(xs: &[f64]) -> MsStats {
        if xs.is_empty() {
            return MsStats::default();
        }
        let mut v: Vec<f64> = xs.iter().map(|x| x * 1e3).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
        let pct = |p: f64| {
            let pos = p / 100.0 * (n - 1.0);
            let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
            v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
        };
        MsStats {
            mean,
            median: pct(50.0),
            std: var.sqrt(),
            p99: pct(99.0),
        }
    }
}

/// The columns of [`BenchResult::write_csv`].
pub const CSV_HEADER: [&str; 9] = [
    "id",
    "scheduled_s",
    "sent_s",
    "ttft_s",
    "tpot_s",
    "e2el_s",
    "prompt_tokens",
    "output_tokens",
    "error",
];

/// The measured figures of a run.
#[derive(Clone, Debug)]
pub struct BenchResult {
    /// Wall time, start to last byte, seconds.
    pub duration: f64,
    /// Requests that completed.
    pub completed: usize,
    /// Requests that failed (server error, timeout, broken stream).
    pub failed: usize,
    /// Prompt tokens of completed requests (the server's `usage`).
    pub total_input_tokens: u64,
    /// Output tokens of completed requests.
    pub total_output_tokens: u64,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Requests meeting every `--goodput` bound per second (`None` without bounds).
    pub request_goodput: Option<f64>,
    /// Output tokens per second.
    pub output_throughput: f64,
    /// Prompt and output tokens per second.
    pub total_token_throughput: f64,
    /// TTFT, ms.
    pub ttft: MsStats,
    /// TPOT, ms.
    pub tpot: MsStats,
    /// ITL, ms.
    pub itl: MsStats,
    /// E2EL, ms.
    pub e2el: MsStats,
    /// Failures by reason, most frequent first.
    pub errors: Vec<(String, usize)>,
    /// easerve's report of the same requests.
    pub report: Report,
    outcomes: Vec<Outcome>,
}

/// The outcome as easerve's request record: its send as the arrival, and for
/// a request that completed, its first and last output as the first token
/// and the finish.
fn record(o: &Outcome) -> RequestRecord {
    let done = o.error.is_none() && o.finish.is_some();
    RequestRecord {
        id: o.id,
        arrival: o.sent,
        output_tokens: o.output_tokens() as u32,
        prefill_tokens: o.prompt_tokens.unwrap_or(0),
        first_token: o.token_times.first().copied().filter(|_| done).into(),
        finish: o.finish.filter(|_| done).into(),
        ..Default::default()
    }
}

/// TTFT, TPOT and E2EL of a completed outcome, seconds, as the request
/// record defines them ([`RequestRecord::ttft`], [`RequestRecord::tpot`],
/// [`RequestRecord::e2e`]); `None` for one that failed.
fn latencies(o: &Outcome) -> Option<(f64, f64, f64)> {
    let r = record(o);
    Some((r.ttft()?, r.tpot()?, r.e2e()?))
}

impl BenchResult {
    /// The figures of `outcomes` over `duration` seconds; `goodput` bounds;
    /// `slo` the tiers easerve's report scores; `meta` what the report says
    /// was run.
    pub fn new(
        outcomes: Vec<Outcome>,
        duration: f64,
        goodput: &[GoodputBound],
        slo: &[SloTier],
        meta: RunMeta,
    ) -> BenchResult {
        let (mut ttfts, mut tpots, mut itls, mut e2els) = (vec![], vec![], vec![], vec![]);
        let (mut input, mut output, mut good, mut completed) = (0u64, 0u64, 0usize, 0usize);
        let mut errors: Vec<(String, usize)> = Vec::new();
        let mut records = Vec::with_capacity(outcomes.len());
        for o in &outcomes {
            let lat = latencies(o);
            let mut rec = record(o);
            match lat {
                Some((ttft, tpot, e2el)) => {
                    completed += 1;
                    ttfts.push(ttft);
                    e2els.push(e2el);
                    if o.output_tokens() > 1 {
                        tpots.push(tpot);
                    }
                    itls.extend(o.token_times.windows(2).map(|w| w[1] - w[0]));
                    input += o.prompt_tokens.unwrap_or(0);
                    output += o.output_tokens();
                    let meets = goodput.iter().all(|b| match *b {
                        GoodputBound::Ttft(ms) => ttft * 1e3 <= ms,
                        GoodputBound::Tpot(ms) => tpot * 1e3 <= ms,
                        GoodputBound::E2el(ms) => e2el * 1e3 <= ms,
                    });
                    good += usize::from(meets);
                }
                None => {
                    let why = o
                        .error
                        .clone()
                        .unwrap_or_else(|| "the stream carried no output text".into());
                    match errors.iter_mut().find(|e| e.0 == why) {
                        Some(e) => e.1 += 1,
                        None => errors.push((why.clone(), 1)),
                    }
                    rec.failure = Some(why.into());
                }
            }
            records.push(rec);
        }
        errors.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let per_s = |x: f64| if duration > 0.0 { x / duration } else { 0.0 };
        let mut report = Report::build(
            meta,
            &records,
            slo,
            Vec::new(),
            EncodeSummary::default(),
            vec!["measured by `easerve bench` from the client: stage times are not visible from outside the server".into()],
        );
        report.measured = true;
        BenchResult {
            duration,
            completed,
            failed: outcomes.len() - completed,
            total_input_tokens: input,
            total_output_tokens: output,
            request_throughput: per_s(completed as f64),
            request_goodput: (!goodput.is_empty()).then(|| per_s(good as f64)),
            output_throughput: per_s(output as f64),
            total_token_throughput: per_s((input + output) as f64),
            ttft: MsStats::of_seconds(&ttfts),
            tpot: MsStats::of_seconds(&tpots),
            itl: MsStats::of_seconds(&itls),
            e2el: MsStats::of_seconds(&e2els),
            errors,
            report,
            outcomes,
        }
    }

    /// The result as `vllm bench serve --save-result --save-detailed` writes
    /// it (its keys: `duration`, `completed`, `failed`, `total_input_tokens`,
    /// `total_output_tokens`, `request_throughput`, `request_goodput`,
    /// `output_throughput`, `total_token_throughput`, `input_lens`,
    /// `output_lens`, `ttfts`, `itls`, `latencies`, `errors`, and
    /// `mean_/median_/std_/p99_{ttft,tpot,itl,e2el}_ms`), plus `easerve`:
    /// easerve's report.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        let mut put = |k: &str, v: Value| {
            m.insert(k.to_string(), v);
        };
        put("duration", self.duration.into());
        put("completed", self.completed.into());
        put("failed", self.failed.into());
        put("total_input_tokens", self.total_input_tokens.into());
        put("total_output_tokens", self.total_output_tokens.into());
        put("request_throughput", self.request_throughput.into());
        put(
            "request_goodput",
            self.request_goodput.map_or(Value::Null, Value::from),
        );
        put("output_throughput", self.output_throughput.into());
        put("total_token_throughput", self.total_token_throughput.into());
        let done = |o: &&Outcome| o.error.is_none() && o.finish.is_some();
        let each =
            |f: &dyn Fn(&Outcome) -> Value| -> Value { self.outcomes.iter().map(f).collect() };
        put(
            "input_lens",
            // as vLLM writes them: 0 where a count is unknown or a request failed
            each(&|o| o.prompt_tokens.unwrap_or(0).into()),
        );
        put(
            "output_lens",
            each(&|o| if done(&o) { o.output_tokens() } else { 0 }.into()),
        );
        put("ttfts", each(&|o| latencies(o).map_or(0.0, |l| l.0).into()));
        put(
            "itls",
            each(&|o| {
                o.token_times
                    .windows(2)
                    .map(|w| w[1] - w[0])
                    .collect::<Vec<f64>>()
                    .into()
            }),
        );
        put(
            "latencies",
            each(&|o| latencies(o).map_or(0.0, |l| l.2).into()),
        );
        put(
            "errors",
            each(&|o| o.error.clone().map_or(Value::from(""), Value::from)),
        );
        for (name, s) in [
            ("ttft", self.ttft),
            ("tpot", self.tpot),
            ("itl", self.itl),
            ("e2el", self.e2el),
        ] {
            put(&format!("mean_{name}_ms"), s.mean.into());
            put(&format!("median_{name}_ms"), s.median.into());
            put(&format!("std_{name}_ms"), s.std.into());
            put(&format!("p99_{name}_ms"), s.p99.into());
        }
        put(
            "easerve",
            serde_json::to_value(&self.report).expect("the report serialises"),
        );
        Value::Object(m)
    }

    /// The summary, laid out as `vllm bench serve` prints it.
    pub fn render_text(&self) -> String {
        let mut s = String::new();
        let line = |s: &mut String, k: &str, v: String| {
            let _ = writeln!(s, "{k:<40} {v:<10}");
        };
        let _ = writeln!(s, "{:=^50}", " Serving Benchmark Result ");
        line(&mut s, "Successful requests:", self.completed.to_string());
        line(&mut s, "Failed requests:", self.failed.to_string());
        line(
            &mut s,
            "Benchmark duration (s):",
            format!("{:.2}", self.duration),
        );
        line(
            &mut s,
            "Total input tokens:",
            self.total_input_tokens.to_string(),
        );
        line(
            &mut s,
            "Total generated tokens:",
            self.total_output_tokens.to_string(),
        );
        line(
            &mut s,
            "Request throughput (req/s):",
            format!("{:.2}", self.request_throughput),
        );
        if let Some(g) = self.request_goodput {
            line(&mut s, "Request goodput (req/s):", format!("{g:.2}"));
        }
        line(
            &mut s,
            "Output token throughput (tok/s):",
            format!("{:.2}", self.output_throughput),
        );
        line(
            &mut s,
            "Total token throughput (tok/s):",
            format!("{:.2}", self.total_token_throughput),
        );
        for (title, name, st) in [
            ("Time to First Token", "TTFT", self.ttft),
            ("Time per Output Token (excl. 1st token)", "TPOT", self.tpot),
            ("Inter-token Latency", "ITL", self.itl),
            ("End-to-end Latency", "E2EL", self.e2el),
        ] {
            let _ = writeln!(s, "{title:-^50}");
            line(
                &mut s,
                &format!("Mean {name} (ms):"),
                format!("{:.2}", st.mean),
            );
            line(
                &mut s,
                &format!("Median {name} (ms):"),
                format!("{:.2}", st.median),
            );
            line(
                &mut s,
                &format!("P99 {name} (ms):"),
                format!("{:.2}", st.p99),
            );
        }
        let _ = writeln!(s, "{}", "=".repeat(50));
        for (why, n) in &self.errors {
            let _ = writeln!(s, "failed: {n} × {why}");
        }
        s
    }

    /// One CSV row per request: id, scheduled and send time, TTFT, TPOT and
    /// E2EL (s), prompt and output tokens, error; [`CSV_HEADER`] first.
    ///
    /// # Errors
    /// A write that fails.
    pub fn write_csv<W: std::io::Write>(&self, w: W) -> Result<(), csv::Error> {
        self.write_csv_rows(w, true)
    }

    /// [`Self::write_csv`] without the header when `header` is false (for a
    /// file whose header was written, and so checked, before the run).
    ///
    /// # Errors
    /// A write that fails.
    pub fn write_csv_rows<W: std::io::Write>(&self, w: W, header: bool) -> Result<(), csv::Error> {
        let mut out = csv::Writer::from_writer(w);
        if header {
            out.write_record(CSV_HEADER)?;
        }
        for o in &self.outcomes {
            let lat = latencies(o);
            let f = |x: Option<f64>| x.map_or(String::new(), |v| v.to_string());
            out.write_record([
                o.id.to_string(),
                o.scheduled.to_string(),
                o.sent.to_string(),
                f(lat.map(|l| l.0)),
                f(lat.map(|l| l.1)),
                f(lat.map(|l| l.2)),
                o.prompt_tokens.map_or(String::new(), |t| t.to_string()),
                o.output_tokens().to_string(),
                o.error.clone().unwrap_or_default(),
            ])?;
        }
        out.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(id: u64, sent: f64, first: f64, gap: f64, n: usize) -> Outcome {
        let token_times: Vec<f64> = (0..n).map(|i| sent + first + gap * i as f64).collect();
        Outcome {
            id,
            scheduled: sent,
            sent,
            finish: token_times.last().copied(),
            token_times,
            prompt_tokens: Some(100),
            completion_tokens: Some(n as u64),
            error: None,
        }
    }

    #[test]
    fn figures_follow_vllm_definitions() {
        let mut outs = vec![
            outcome(0, 0.0, 0.1, 0.01, 11),
            outcome(1, 1.0, 0.3, 0.02, 11),
        ];
        outs.push(Outcome {
            id: 2,
            error: Some("HTTP 500: boom".into()),
            ..Default::default()
        });
        let meta = RunMeta {
            scenario: "t".into(),
            deployment: "http://x".into(),
            model: "m".into(),
            cluster: "endpoint".into(),
            seed: 0,
            offered_rate: 1.0,
            requests: 3,
        };
        let r = BenchResult::new(outs, 2.0, &[GoodputBound::Ttft(200.0)], &[], meta);
        assert_eq!((r.completed, r.failed), (2, 1));
        assert!((r.ttft.mean - 200.0).abs() < 1e-9 && (r.ttft.std - 100.0).abs() < 1e-9);
        assert!((r.tpot.mean - 15.0).abs() < 1e-9);
        assert!((r.itl.median - 15.0).abs() < 1e-6);
        assert_eq!(r.request_goodput, Some(0.5));
        assert_eq!(r.total_output_tokens, 22);
        assert_eq!(r.errors, vec![("HTTP 500: boom".to_string(), 1)]);
        // easerve's report agrees on TTFT and counts the failure
        assert!((r.report.ttft.mean - 0.2).abs() < 1e-12);
        assert_eq!(r.report.failed, 1);
        let j = r.to_json();
        assert_eq!(j["completed"], 2);
        assert_eq!(j["ttfts"][2], 0.0, "vLLM writes 0 for a failed request");
        assert!((j["mean_tpot_ms"].as_f64().unwrap() - 15.0).abs() < 1e-9);
        assert!(r.render_text().contains("Mean TTFT (ms):"));
    }

    #[test]
    fn goodput_bounds_parse_and_bad_ones_say_why() {
        assert_eq!(parse_goodput("ttft:500"), Ok(GoodputBound::Ttft(500.0)));
        assert_eq!(parse_goodput("e2el:1.5"), Ok(GoodputBound::E2el(1.5)));
        for bad in ["ttft", "ttft:-1", "foo:3", "tpot:x"] {
            assert!(parse_goodput(bad).is_err(), "{bad}");
        }
    }
}
