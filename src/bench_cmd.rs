//! `easerve bench`: load any OpenAI-compatible chat endpoint with a
//! scenario's workload or `vllm bench serve`'s `random-mm`, `random` or
//! `prefix_repetition` dataset and report
//! what it measured (`easerve_bench`), with `vllm bench serve`'s flags, text
//! layout and JSON keys.
//!
//! The client is the cargo feature `bench` (on with `exec`); a build without
//! it keeps the flags (`--help`) and exits 2 saying how to build it.

#[cfg(feature = "bench")]
use crate::BadInput;
#[cfg(feature = "bench")]
use easerve_bench::client::{run as send, ClientConfig, ClientError};
#[cfg(feature = "bench")]
use easerve_bench::media::{check_item, ImageCodec};
#[cfg(feature = "bench")]
use easerve_bench::result::{parse_goodput, BenchResult, GoodputBound};
#[cfg(feature = "bench")]
use easerve_bench::workload::{
    parse_bucket_config, send_times, BenchRequest, PrefixRepetition, RandomMm,
};
#[cfg(feature = "bench")]
use easerve_workload::report::{RunMeta, SloTier};
#[cfg(feature = "bench")]
use easerve_workload::scenario::{Overrides, Scenario};
#[cfg(feature = "bench")]
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `easerve bench` (names and defaults of `vllm bench serve`).
#[derive(clap::Args, Debug)]
#[command(allow_negative_numbers = true)]
#[cfg_attr(not(feature = "bench"), allow(dead_code))]
pub(crate) struct BenchArgs {
    /// Server root, e.g. http://127.0.0.1:8000 (plain HTTP).
    #[arg(long)]
    base_url: String,
    /// The `model` every request names (what the server's /v1/models lists).
    #[arg(long)]
    model: String,
    /// Path of the chat completions endpoint.
    #[arg(long, default_value = "/v1/chat/completions")]
    endpoint: String,
    /// Send this scenario's requests (its generator, seed, rate and arrival
    /// process; its SLO tiers for --slo; its media pool, system prompts and
    /// conversations, equal content sent as equal bytes) instead of a random
    /// dataset; the
    /// report then names its model and cluster, so `easerve calib validate`
    /// compares it with `easerve sim` of the scenario.
    #[arg(long, value_name = "FILE", conflicts_with_all = [
        "dataset_name", "random_input_len", "random_output_len", "random_range_ratio",
        "random_mm_base_items_per_request", "random_mm_num_mm_items_range_ratio",
        "random_mm_bucket_config", "burstiness", "prefix_repetition_prefix_len",
        "prefix_repetition_suffix_len", "prefix_repetition_num_prefixes",
        "prefix_repetition_output_len",
    ])]
    scenario: Option<PathBuf>,
    /// Random dataset when no scenario is given: `random-mm` (text and
    /// images or videos), `random` (text only) or `prefix_repetition` (text
    /// prompts that share one of a few prefixes, vLLM's).
    #[arg(long, default_value = "random-mm")]
    dataset_name: String,
    /// Text prompt length, in common English words (the server counts the tokens).
    #[arg(long, default_value_t = 1024)]
    random_input_len: u32,
    /// Output tokens (max_tokens = min_tokens, ignore_eos).
    #[arg(long, default_value_t = 128)]
    random_output_len: u32,
    /// Lengths uniform in [len·(1−r), len·(1+r)], r in [0, 1).
    #[arg(long, default_value_t = 0.0)]
    random_range_ratio: f64,
    /// Multimodal items per request.
    #[arg(long, default_value_t = 1)]
    random_mm_base_items_per_request: u32,
    /// Items per request uniform in [n·(1−r), n·(1+r)], r in [0, 1].
    #[arg(long, default_value_t = 0.0)]
    random_mm_num_mm_items_range_ratio: f64,
    /// Item shapes and their probabilities, `{(HEIGHT, WIDTH, FRAMES): P, …}`
    /// (FRAMES 1: an image; more: a video of that many frames).
    #[arg(long, default_value = "{(256, 256, 1): 0.5, (720, 1280, 1): 0.5}")]
    random_mm_bucket_config: String,
    /// prefix_repetition: words of each shared prefix.
    #[arg(long, default_value_t = 256)]
    prefix_repetition_prefix_len: u32,
    /// prefix_repetition: words of each request's own suffix, after its prefix.
    #[arg(long, default_value_t = 256)]
    prefix_repetition_suffix_len: u32,
    /// prefix_repetition: distinct prefixes; each opens ⌊num-prompts /
    /// num-prefixes⌋ requests (so that many times this are sent).
    #[arg(long, default_value_t = 10)]
    prefix_repetition_num_prefixes: u32,
    /// prefix_repetition: output tokens of every request.
    #[arg(long, default_value_t = 128)]
    prefix_repetition_output_len: u32,
    /// Requests to send (default: the scenario's `workload.requests`, else 1000).
    #[arg(long)]
    num_prompts: Option<i64>,
    /// Requests per second (`inf`: all at once, and the report's offered rate
    /// is the requests over the run's duration; default: the scenario's rate,
    /// else inf).
    #[arg(long)]
    request_rate: Option<f64>,
    /// Gamma shape of the gaps between sends: 1 is Poisson, below 1 burstier
    /// (coefficient of variation 1/√burstiness).
    #[arg(long, default_value_t = 1.0)]
    burstiness: f64,
    /// Ramp the request rate from `--ramp-up-start-rps` to
    /// `--ramp-up-end-rps` over the run, by request index as `vllm bench
    /// serve` does: `linear` or `exponential` (instead of `--request-rate`
    /// and a scenario's own arrivals).
    #[arg(long, value_name = "STRATEGY", conflicts_with = "request_rate")]
    ramp_up_strategy: Option<String>,
    /// The ramp's first rate, requests/s (≥ 0; > 0 for exponential).
    #[arg(long, value_name = "RPS", requires = "ramp_up_strategy")]
    ramp_up_start_rps: Option<f64>,
    /// The ramp's last rate, requests/s (≥ the start).
    #[arg(long, value_name = "RPS", requires = "ramp_up_strategy")]
    ramp_up_end_rps: Option<f64>,
    /// Requests in flight at most.
    #[arg(long)]
    max_concurrency: Option<usize>,
    /// Seed of the workload, its media and its text (default: the scenario's, else 0).
    #[arg(long)]
    seed: Option<u64>,
    /// Goodput bounds, e.g. `--goodput ttft:2000 tpot:50` (milliseconds;
    /// keys ttft, tpot, e2el).
    #[arg(long, num_args = 1.., value_name = "KEY:MS", conflicts_with = "slo")]
    goodput: Vec<String>,
    /// Goodput at this SLO tier of the scenario (its TTFT and TPOT bounds).
    #[arg(long, value_name = "TIER", requires = "scenario")]
    slo: Option<String>,
    /// Image encoding: jpeg (quality 75, as vllm bench serve's random-mm) or
    /// png (video frames are always JPEG).
    #[arg(long, default_value = "jpeg")]
    image_format: String,
    /// Seconds a request may take before it counts as failed, in (0, 21600].
    #[arg(long, default_value_t = 600.0)]
    timeout: f64,
    /// Print the result as JSON (vLLM's keys, easerve's report under `easerve`).
    #[arg(long)]
    json: bool,
    /// Also write one CSV row per request (times in seconds).
    #[arg(long, value_name = "FILE")]
    requests_csv: Option<PathBuf>,
}

/// Longest `--timeout`, seconds (6 hours).
#[cfg(feature = "bench")]
const MAX_TIMEOUT_S: f64 = 21_600.0;

/// Latest send time of a run, seconds after its start (a week).
#[cfg(feature = "bench")]
const MAX_SPAN_S: f64 = 604_800.0;

#[cfg(feature = "bench")]
fn bad(msg: String) -> anyhow::Error {
    BadInput(msg).into()
}

/// The requests, SLO tiers and run description the arguments ask for.
#[cfg(feature = "bench")]
fn workload(a: &BenchArgs) -> anyhow::Result<(Vec<BenchRequest>, Vec<SloTier>, RunMeta)> {
    if let Some(r) = a.request_rate {
        if r.is_nan() || r <= 0.0 {
            return Err(bad(format!(
                "--request-rate {r}: a rate > 0 requests/s, or inf"
            )));
        }
    }
    if !(a.burstiness.is_finite() && a.burstiness > 0.0) {
        return Err(bad(format!(
            "--burstiness {}: a number > 0 (1 is Poisson)",
            a.burstiness
        )));
    }
    if let Some(n) = a.num_prompts {
        if !(1..=10_000_000).contains(&n) {
            return Err(bad(format!("--num-prompts {n}: allowed 1 ..= 10000000")));
        }
    }
    match &a.scenario {
        Some(path) => scenario_workload(a, path),
        None if a.dataset_name == "prefix_repetition" => prefix_workload(a),
        None => random_workload(a),
    }
}

/// `--scenario`'s requests (with `--seed`, `--request-rate` and
/// `--num-prompts` applied), its SLO tiers, and its model and cluster.
#[cfg(feature = "bench")]
fn scenario_workload(
    a: &BenchArgs,
    path: &std::path::Path,
) -> anyhow::Result<(Vec<BenchRequest>, Vec<SloTier>, RunMeta)> {
    let o = Overrides {
        seed: a.seed,
        rate: a.request_rate.filter(|r| r.is_finite()),
        requests: a.num_prompts,
        ..Default::default()
    };
    let sc = Scenario::load(path, &o).map_err(|e| bad(e.to_string()))?;
    let mut reqs: Vec<BenchRequest> = easerve_workload::generate::generate_requests(&sc)
        .iter()
        .map(BenchRequest::from_request)
        .collect();
    if a.request_rate.is_some_and(f64::is_infinite) {
        reqs.iter_mut().for_each(|r| r.arrival = 0.0);
    }
    if let Some(times) = ramp_times(a, reqs.len(), sc.seed)? {
        reqs.iter_mut().zip(times).for_each(|(r, t)| r.arrival = t);
    }
    // the scenario's model and cluster, as `easerve sim` names them, so
    // `calib validate` compares the two
    let meta = RunMeta {
        scenario: sc.name.clone(),
        deployment: format!("measured at {}", a.base_url),
        model: sc.model.name.clone(),
        cluster: sc.cluster_label(),
        seed: sc.seed,
        offered_rate: a.request_rate.unwrap_or(sc.workload.rate),
        requests: reqs.len(),
    };
    Ok((reqs, sc.slo, meta))
}

/// The send times of a vLLM ramp-up (`--ramp-up-*`), checked by vLLM's
/// rules (`vllm/benchmarks/serve.py`: both rates given, ≥ 0, start ≤ end,
/// start > 0 for exponential); `None` without `--ramp-up-strategy`.
#[cfg(feature = "bench")]
fn ramp_times(a: &BenchArgs, n: usize, seed: u64) -> anyhow::Result<Option<Vec<f64>>> {
    use easerve_workload::generate::{ramp_up_times, RampUp};
    let Some(text) = &a.ramp_up_strategy else {
        return Ok(None);
    };
    let strategy: RampUp = text
        .parse()
        .map_err(|e| bad(format!("--ramp-up-strategy {e}")))?;
    let (Some(start), Some(end)) = (a.ramp_up_start_rps, a.ramp_up_end_rps) else {
        return Err(bad(
            "--ramp-up-strategy needs both --ramp-up-start-rps and --ramp-up-end-rps".into(),
        ));
    };
    let ok = |x: f64| x.is_finite() && (0.0..=1e6).contains(&x);
    if !ok(start) || !ok(end) || start > end {
        return Err(bad(format!(
            "--ramp-up-start-rps {start} --ramp-up-end-rps {end}: rates in [0, 1e6] requests/s with start ≤ end"
        )));
    }
    if strategy == RampUp::Exponential && start == 0.0 {
        return Err(bad(
            "--ramp-up-start-rps 0: an exponential ramp cannot start at 0 requests/s".into(),
        ));
    }
    if !(a.burstiness.is_finite() && a.burstiness > 0.0) {
        return Err(bad(format!("--burstiness {}: must be > 0", a.burstiness)));
    }
    Ok(Some(ramp_up_times(
        strategy,
        (start, end),
        a.burstiness,
        n,
        seed,
    )))
}

/// A random (or random-mm) dataset's requests, vLLM's way.
#[cfg(feature = "bench")]
fn random_workload(a: &BenchArgs) -> anyhow::Result<(Vec<BenchRequest>, Vec<SloTier>, RunMeta)> {
    let n = a.num_prompts.unwrap_or(1000) as usize;
    if !(0.0..1.0).contains(&a.random_range_ratio) {
        return Err(bad(format!(
            "--random-range-ratio {}: allowed [0, 1)",
            a.random_range_ratio
        )));
    }
    if !(0.0..=1.0).contains(&a.random_mm_num_mm_items_range_ratio) {
        return Err(bad(format!(
            "--random-mm-num-mm-items-range-ratio {}: allowed [0, 1]",
            a.random_mm_num_mm_items_range_ratio
        )));
    }
    let (base_items, buckets) = match a.dataset_name.as_str() {
        "random-mm" => (
            a.random_mm_base_items_per_request,
            parse_bucket_config(&a.random_mm_bucket_config)
                .map_err(|e| bad(format!("--random-mm-bucket-config {e}")))?,
        ),
        "random" => (0, Vec::new()),
        other => {
            return Err(bad(format!(
                "--dataset-name {other}: allowed random-mm, random, prefix_repetition (or give --scenario)"
            )))
        }
    };
    if a.random_output_len == 0 {
        return Err(bad(
            "--random-output-len 0: at least 1 output token (the server generates exactly this many)"
                .into(),
        ));
    }
    let d = RandomMm {
        input_len: a.random_input_len,
        output_len: a.random_output_len,
        range_ratio: a.random_range_ratio,
        base_items,
        items_range_ratio: a.random_mm_num_mm_items_range_ratio,
        buckets,
    };
    dataset_run(a, n, |times, seed| d.requests(times, seed))
}

/// A dataset's `n` requests, drawn by `draw` from their send times (the
/// ramp's, else at `--request-rate` with `--burstiness`) and the seed, and
/// what the report says of the run.
#[cfg(feature = "bench")]
fn dataset_run(
    a: &BenchArgs,
    n: usize,
    draw: impl FnOnce(&[f64], u64) -> Vec<BenchRequest>,
) -> anyhow::Result<(Vec<BenchRequest>, Vec<SloTier>, RunMeta)> {
    let rate = a.request_rate.unwrap_or(f64::INFINITY);
    let seed = a.seed.unwrap_or(0);
    let times = match ramp_times(a, n, seed)? {
        Some(t) => t,
        None => send_times(rate, a.burstiness, n, seed),
    };
    let meta = RunMeta {
        scenario: a.dataset_name.clone(),
        deployment: format!("measured at {}", a.base_url),
        model: a.model.clone(),
        cluster: "the server's".into(),
        seed,
        offered_rate: rate,
        requests: n,
    };
    Ok((draw(&times, seed), Vec::new(), meta))
}

/// Largest `--prefix-repetition-prefix-len` or `-suffix-len`, words: a
/// bound on one request's body (about 6 bytes a word), not on any model's
/// context.
#[cfg(feature = "bench")]
const MAX_SEGMENT_WORDS: u32 = 1_000_000;

/// vLLM's `prefix_repetition` dataset ([`PrefixRepetition`]), checked by
/// its rules (`num_prompts ≥ num_prefixes`) and ours (a prompt of at least
/// one word, at least one output token).
#[cfg(feature = "bench")]
fn prefix_workload(a: &BenchArgs) -> anyhow::Result<(Vec<BenchRequest>, Vec<SloTier>, RunMeta)> {
    let d = PrefixRepetition {
        prefix_len: a.prefix_repetition_prefix_len,
        suffix_len: a.prefix_repetition_suffix_len,
        num_prefixes: a.prefix_repetition_num_prefixes,
        output_len: a.prefix_repetition_output_len,
    };
    for (flag, v) in [("prefix-len", d.prefix_len), ("suffix-len", d.suffix_len)] {
        if v > MAX_SEGMENT_WORDS {
            return Err(bad(format!(
                "--prefix-repetition-{flag} {v}: allowed 0 ..= {MAX_SEGMENT_WORDS} words"
            )));
        }
    }
    if d.prefix_len + d.suffix_len == 0 {
        return Err(bad(
            "--prefix-repetition-prefix-len 0 --prefix-repetition-suffix-len 0: a prompt needs at least one word".into(),
        ));
    }
    if d.output_len == 0 {
        return Err(bad(
            "--prefix-repetition-output-len 0: at least 1 output token (the server generates exactly this many)".into(),
        ));
    }
    let asked = a.num_prompts.unwrap_or(1000) as usize;
    let n = d.count(asked);
    if d.num_prefixes == 0 || n == 0 {
        return Err(bad(format!(
            "--prefix-repetition-num-prefixes {}: allowed 1 ..= --num-prompts ({asked})",
            d.num_prefixes
        )));
    }
    dataset_run(a, n, |times, seed| d.requests(times, seed))
}

/// The flags' own ranges, before any request is built; the image codec.
#[cfg(feature = "bench")]
fn check_flags(a: &BenchArgs) -> anyhow::Result<ImageCodec> {
    let codec = match a.image_format.as_str() {
        "png" => ImageCodec::Png,
        "jpeg" | "jpg" => ImageCodec::Jpeg,
        other => return Err(bad(format!("--image-format {other}: allowed png, jpeg"))),
    };
    if !(a.timeout.is_finite() && a.timeout > 0.0 && a.timeout <= MAX_TIMEOUT_S) {
        return Err(bad(format!(
            "--timeout {}: seconds in (0, {MAX_TIMEOUT_S}]",
            a.timeout
        )));
    }
    if a.model.trim().is_empty() {
        return Err(bad(format!(
            "--model `{}`: empty; give the model name the server serves (what its /v1/models lists)",
            a.model
        )));
    }
    if a.endpoint.is_empty()
        || a.endpoint
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(bad(format!(
            "--endpoint `{}`: a URL path such as /v1/chat/completions, without spaces or control characters",
            a.endpoint.escape_debug()
        )));
    }
    if a.max_concurrency == Some(0) {
        return Err(bad(
            "--max-concurrency 0: at least 1 request in flight".into()
        ));
    }
    Ok(codec)
}

/// Every request can be built and sent in time, before anything is sent.
#[cfg(feature = "bench")]
fn check_requests(a: &BenchArgs, requests: &[BenchRequest]) -> anyhow::Result<()> {
    let source = if a.scenario.is_some() {
        "--scenario"
    } else {
        "--random-mm-bucket-config"
    };
    for r in requests {
        for item in &r.items {
            check_item(item).map_err(|e| bad(format!("{source}: request {}: {e}", r.id)))?;
        }
    }
    if let Some(last) = requests.last().filter(|r| r.arrival > MAX_SPAN_S) {
        return Err(bad(format!(
            "--request-rate: the last request would be sent {:.3e} s after the start; at most {MAX_SPAN_S} s (a week) is allowed",
            last.arrival
        )));
    }
    Ok(())
}

#[cfg(feature = "bench")]
pub(crate) fn run(a: BenchArgs) -> anyhow::Result<ExitCode> {
    let codec = check_flags(&a)?;
    let mut bounds: Vec<GoodputBound> = a
        .goodput
        .iter()
        .map(|g| parse_goodput(g).map_err(|e| bad(format!("--goodput {e}"))))
        .collect::<anyhow::Result<_>>()?;
    let (requests, slo, meta) = workload(&a)?;
    check_requests(&a, &requests)?;
    if let Some(tier) = &a.slo {
        let t = slo.iter().find(|t| &t.name == tier).ok_or_else(|| {
            let names: Vec<&str> = slo.iter().map(|t| t.name.as_str()).collect();
            bad(format!(
                "--slo {tier}: the scenario's tiers are {}",
                names.join(", ")
            ))
        })?;
        bounds = vec![
            GoodputBound::Ttft(t.ttft_s * 1e3),
            GoodputBound::Tpot(t.tpot_s * 1e3),
        ];
    }
    // the server's address is checked before the results file is touched
    easerve_bench::client::check_base_url(&a.base_url).map_err(|e| bad(e.to_string()))?;
    // the results file is opened, and its header written, before the first
    // request: a file that cannot be written fails now, not after the run
    let csv = match &a.requests_csv {
        Some(path) => Some(open_csv(path)?),
        None => None,
    };
    let seed = meta.seed;
    let cfg = ClientConfig {
        base_url: a.base_url.clone(),
        endpoint: a.endpoint.clone(),
        model: a.model.clone(),
        max_concurrency: a.max_concurrency,
        timeout_s: a.timeout,
        codec,
        seed,
        progress: !a.json && std::io::stderr().is_terminal(),
    };
    let (outcomes, duration) = send(&requests, &cfg).map_err(|e| match e {
        ClientError::Runtime(_) => anyhow::Error::from(e),
        _ => bad(e.to_string()),
    })?;
    let mut meta = meta;
    if !meta.offered_rate.is_finite() {
        // all at once: JSON has no infinity, so the report offers the
        // requests over the run's duration
        meta.offered_rate = if duration > 0.0 {
            meta.requests as f64 / duration
        } else {
            0.0
        };
    }
    let result = BenchResult::new(outcomes, duration, &bounds, &slo, meta);
    // the result first: a CSV that fails late (a disk that fills) loses the
    // rows, not the measurement
    if a.json {
        sayln!("{}", serde_json::to_string_pretty(&result.to_json())?);
    } else {
        say!("{}", result.render_text());
    }
    if let (Some(path), Some(f)) = (&a.requests_csv, csv) {
        result
            .write_csv_rows(f, false)
            .map_err(|e| cannot_write_csv(path, &e))?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(feature = "bench")]
fn cannot_write_csv(path: &std::path::Path, e: &dyn std::fmt::Display) -> anyhow::Error {
    bad(format!(
        "--requests-csv {}: cannot write: {e}",
        path.display()
    ))
}

/// `--requests-csv`: created, its header written and flushed, so a path that
/// cannot be written (a folder, a full disk, no permission) fails before
/// anything is sent.
#[cfg(feature = "bench")]
fn open_csv(path: &std::path::Path) -> anyhow::Result<std::fs::File> {
    use std::io::Write as _;
    if path.exists() && !path.is_file() {
        // a FIFO would block the open; a device or folder is no results file
        return Err(cannot_write_csv(
            path,
            &"not a regular file (a device, FIFO or folder); give a file path",
        ));
    }
    let mut f = std::fs::File::create(path).map_err(|e| cannot_write_csv(path, &e))?;
    let mut line = easerve_bench::result::CSV_HEADER.join(",");
    line.push('\n');
    f.write_all(line.as_bytes())
        .and_then(|()| f.flush())
        .map_err(|e| cannot_write_csv(path, &e))?;
    Ok(f)
}

/// `easerve bench` in a build without the client: what to build.
#[cfg(not(feature = "bench"))]
pub(crate) fn run(_a: BenchArgs) -> anyhow::Result<ExitCode> {
    Err(crate::BadInput(
        "`easerve bench` is the HTTP load generator, and this easerve was built without it; \
         build it with `cargo build --release --features bench` (`--features exec` has it too), \
         or run `cargo run --release --features bench -- bench …`"
            .into(),
    )
    .into())
}
