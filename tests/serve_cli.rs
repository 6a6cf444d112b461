//! `easerve serve` on loopback: real worker processes behind the HTTP front.
//! Each test starts a server on port 0 (the address comes on its stdout),
//! talks to it, and stops it with SIGTERM by its PID, which drains it and
//! prints its JSON report.

use crate::{easerve, num, root};
use base64::Engine;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `easerve serve`.
pub(crate) struct Server {
    pub(crate) child: Child,
    out: BufReader<ChildStdout>,
    /// `http://ADDR`.
    pub(crate) base: String,
    pub(crate) http: reqwest::blocking::Client,
}

impl Server {
    /// Start serving `scenario` with `args`, and wait until `/health` says 200.
    pub(crate) fn start(scenario: &str, args: &[&str]) -> Server {
        let mut child = crate::easerve_command()
            .args(["serve", scenario, "--listen", "127.0.0.1:0", "--json"])
            .args(args)
            .current_dir(root())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start easerve serve");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).expect("the listening line");
        let addr = line
            .strip_prefix("listening on ")
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
            .to_string();
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap();
        let s = Server {
            child,
            out,
            base: addr,
            http,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            match s.http.get(format!("{}/health", s.base)).send() {
                Ok(r) if r.status() == 200 => break,
                Ok(r) => assert_eq!(r.status(), 503, "health while starting"),
                Err(e) => panic!("health: {e}"),
            }
            assert!(Instant::now() < deadline, "the workers did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        s
    }

    pub(crate) fn post(&self, body: &Value) -> (u16, String) {
        let r = self
            .http
            .post(format!("{}/v1/chat/completions", self.base))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .expect("POST");
        (r.status().as_u16(), r.text().unwrap_or_default())
    }

    pub(crate) fn get(&self, path: &str) -> (u16, String) {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .expect("GET");
        (r.status().as_u16(), r.text().unwrap_or_default())
    }

    /// SIGTERM, then the report it prints once drained.
    pub(crate) fn stop(mut self) -> Value {
        let pid = self.child.id().to_string();
        let st = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(st.success());
        let mut rest = String::new();
        self.out.read_to_string(&mut rest).unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "serve exited with {status}");
        serde_json::from_str(&rest).unwrap_or_else(|e| panic!("report: {e}: {rest}"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

pub(crate) fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub(crate) fn png(w: u32, h: u32) -> String {
    let img = image::RgbImage::from_fn(w, h, |x, y| image::Rgb([x as u8, y as u8, 99]));
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    format!("data:image/png;base64,{}", b64(&out.into_inner()))
}

fn wav(seconds: f64) -> String {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut out = std::io::Cursor::new(Vec::new());
    let mut w = hound::WavWriter::new(&mut out, spec).unwrap();
    for i in 0..(seconds * 16_000.0) as usize {
        w.write_sample(((i as f64 * 0.05).sin() * 8000.0) as i16)
            .unwrap();
    }
    w.finalize().unwrap();
    b64(&out.into_inner())
}

/// Parse an SSE body: the content of every chunk, the usage, and whether
/// it ended with `[DONE]`.
fn sse(body: &str) -> (Vec<String>, Option<Value>, bool) {
    let mut content = Vec::new();
    let mut usage = None;
    let mut done = false;
    for data in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(data).expect("a JSON chunk");
        assert!(v.get("error").is_none(), "error chunk: {v}");
        if let Some(c) = v
            .pointer("/choices/0/delta/content")
            .and_then(Value::as_str)
        {
            if !c.is_empty() {
                content.push(c.to_string());
            }
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            usage = Some(u.clone());
        }
    }
    (content, usage, done)
}

/// A streamed request with one medium, `words` words and `max_tokens`.
pub(crate) fn chat(part: Value, words: usize, max_tokens: u32, stream: bool) -> Value {
    let text = vec!["word"; words].join(" ");
    json!({
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}, part]}],
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": stream,
        "stream_options": {"include_usage": true},
    })
}

/// A streamed request per modality returns its tokens and a usage that
/// counts the model's multimodal tokens; a non-streamed one answers whole.
#[test]
fn streamed_image_audio_and_video_requests_return_tokens_and_usage() {
    let _timed = crate::timed();
    // tiny-image: a 224×224 image is 336 LLM tokens (model/src/presets.rs)
    let s = Server::start("scenarios/cpu-image.toml", &[]);
    let part = json!({"type": "image_url", "image_url": {"url": png(224, 224)}});
    let (status, body) = s.post(&chat(part.clone(), 5, 4, true));
    assert_eq!(status, 200, "{body}");
    let (content, usage, done) = sse(&body);
    assert_eq!(content.len(), 4, "{body}");
    assert!(done);
    let usage = usage.expect("usage chunk");
    assert_eq!(usage["prompt_tokens"], 5 + 336);
    assert_eq!(usage["completion_tokens"], 4);
    let (status, body) = s.post(&chat(part, 2, 3, false));
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["usage"]["prompt_tokens"], 2 + 336);
    assert_eq!(v["usage"]["completion_tokens"], 3);
    assert_eq!(
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        3
    );
    let (status, models) = s.get("/v1/models");
    assert_eq!(status, 200);
    assert!(models.contains("tiny-image"), "{models}");
    let r = s.stop();
    assert_eq!(num(&r, "/completed"), 2.0);

    // audio: the whisper-style encoder's own count for 2 s
    let s = Server::start("scenarios/cpu-audio.toml", &[]);
    let part = json!({"type": "input_audio", "input_audio": {"data": wav(2.0), "format": "wav"}});
    let (status, body) = s.post(&chat(part, 3, 4, true));
    assert_eq!(status, 200, "{body}");
    let (content, usage, done) = sse(&body);
    assert_eq!(content.len(), 4);
    assert!(done);
    let arch = tiny_arch("cpu-audio");
    let mm = easerve_workload::generate::item_tokens(
        &arch,
        &easerve_sched::MmItem::Audio { seconds: 2.0 },
    )
    .unwrap()
    .llm_tokens;
    assert_eq!(usage.unwrap()["prompt_tokens"], 3 + mm);
    s.stop();

    // video: a list of frames, each an image data URL
    let s = Server::start("scenarios/cpu-video.toml", &[]);
    let frames: Vec<String> = (0..8).map(|_| png(112, 112)).collect();
    let part = json!({"type": "video", "video": frames});
    let (status, body) = s.post(&chat(part, 3, 2, true));
    assert_eq!(status, 200, "{body}");
    let (content, usage, _) = sse(&body);
    assert_eq!(content.len(), 2);
    // tiny-video: eight 112×112 frames are 64 LLM tokens (model/src/presets.rs)
    assert_eq!(usage.unwrap()["prompt_tokens"], 3 + 64);
    s.stop();
}

/// `serve` on a cluster of node groups: a request's envelope bytes are
/// known once its items are decoded, and its cross-node transfers wait for
/// the modelled NIC as under `exec` (`exec_cli::assert_nic_held`): the
/// encoder's node sends each image's 336 embedding tokens. Runtime: about
/// 10 s (3 requests, one at a time).
#[test]
fn serve_runs_node_groups_with_the_modelled_nic_delay() {
    let _timed = crate::timed();
    let f = crate::exec_cli::two_group_slow_nic();
    let s = Server::start(f.path().to_str().unwrap(), &[]);
    let part = json!({"type": "image_url", "image_url": {"url": png(224, 224)}});
    for _ in 0..3 {
        let (status, body) = s.post(&chat(part.clone(), 4, 3, false));
        assert_eq!(status, 200, "{body}");
    }
    let r = s.stop();
    assert_eq!(num(&r, "/completed"), 3.0);
    let sent = crate::exec_cli::assert_nic_held(&r, 3.0);
    // tiny-image: a 224×224 image is 336 LLM tokens (model/src/presets.rs)
    let per_token = tiny_arch("cpu-two-group").embedding_bytes_per_token();
    assert_eq!(sent, 3.0 * 336.0 * per_token);
}

fn tiny_arch(scenario: &str) -> easerve_model::ModelArch {
    let sc = easerve_workload::Scenario::load(
        &root().join(format!("scenarios/{scenario}.toml")),
        &Default::default(),
    )
    .unwrap();
    sc.model
}

/// Every malformed request gets its 4xx with an error body naming what is
/// wrong, and the server goes on answering.
#[test]
fn malformed_requests_get_4xx_and_the_server_keeps_serving() {
    let _timed = crate::timed();
    let s = Server::start("scenarios/cpu-image.toml", &[]);
    let raw = |body: &str| {
        let r = s
            .http
            .post(format!("{}/v1/chat/completions", s.base))
            .body(body.to_string())
            .send()
            .unwrap();
        (r.status().as_u16(), r.text().unwrap())
    };
    let user = |content: Value| json!({"messages": [{"role": "user", "content": content}]});
    let cases: Vec<(String, u16, &str)> = vec![
        ("{\"messages\": [".into(), 400, "malformed JSON"),
        (
            json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).to_string(),
            404,
            "gpt-4o",
        ),
        (
            user(json!([{"type": "image_url", "image_url": {"url": "data:image/png;base64,!!notbase64"}}])).to_string(),
            400,
            "invalid base64",
        ),
        (
            user(json!([{"type": "image_url", "image_url": {"url": "data:image/webp;base64,AAAA"}}])).to_string(),
            400,
            "image/webp",
        ),
        (
            user(json!([{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}])).to_string(),
            400,
            "remote URLs are not fetched",
        ),
        (
            user(json!([{"type": "input_audio", "input_audio": {"data": wav(1.0), "format": "wav"}}])).to_string(),
            400,
            "does not suit model",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100_000_000}).to_string(),
            400,
            "maximum context length",
        ),
    ];
    for (body, want, says) in &cases {
        let (status, text) = raw(body);
        assert_eq!(status, *want, "{body} → {text}");
        let v: Value = serde_json::from_str(&text).expect("a JSON error body");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(says), "{body}: {msg}");
        assert_eq!(v["error"]["code"], *want);
    }
    assert_eq!(s.get("/health").0, 200);
    let (status, body) = s.post(&user(json!("still here?")));
    assert_eq!(status, 200, "{body}");
    let r = s.stop();
    assert_eq!(num(&r, "/completed"), 1.0);
}

/// A request of hundreds of images is refused with a 400 that names the
/// limit before any worker sees it: 1,000 images by the count per modality
/// (vLLM's 999, counted before decoding), 300 small ones (about 40,800
/// prompt tokens) by what one prefill pass can take in this host's memory,
/// or by `--max-prefill-tokens` where that is lower. Every worker stays up:
/// ordinary requests after them succeed and nothing failed.
#[test]
fn requests_over_a_limit_get_400_at_once_and_cost_no_worker() {
    let _timed = crate::timed();
    let s = Server::start(
        "scenarios/cpu-image.toml",
        &[
            "--max-prefill-tokens",
            "20000",
            "--max-image-pixels",
            "1000000",
        ],
    );
    let images = |n: usize, side: u32| {
        let img = png(side, side);
        let parts: Vec<Value> = (0..n)
            .map(|_| json!({"type": "image_url", "image_url": {"url": img}}))
            .collect();
        json!({"messages": [{"role": "user", "content": parts}], "max_tokens": 4})
    };
    for (body, says) in [
        (images(1000, 8), "limit_mm_per_prompt"),
        (images(300, 64), "max_prefill_tokens"),
        (images(1, 1001), "max_image_pixels"),
    ] {
        let (status, text) = s.post(&body);
        assert_eq!(status, 400, "{text}");
        let v: Value = serde_json::from_str(&text).expect("a JSON error body");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(says), "{msg} should name {says}");
    }
    let (_, models) = s.get("/v1/models");
    let models: Value = serde_json::from_str(&models).unwrap();
    assert!(models["data"][0]["max_model_len"].as_u64().unwrap() > 0);
    for _ in 0..3 {
        let (status, body) = s.post(&chat(
            json!({"type": "image_url", "image_url": {"url": png(64, 64)}}),
            8,
            4,
            false,
        ));
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(s.get("/health").0, 200);
    let r = s.stop();
    assert_eq!(num(&r, "/completed"), 3.0);
    assert!(r.get("failed").is_none(), "{r}");
}

/// A burst beyond the admission limit gets 429s, every admitted request
/// completes; SIGTERM during a load drains what is in flight; `/metrics`
/// parses and counts the completed requests.
#[test]
fn admission_429s_sigterm_drains_and_metrics_count_completions() {
    let _timed = crate::timed();
    let s = std::sync::Arc::new(Server::start(
        "scenarios/cpu-image.toml",
        &["--admission-limit", "3"],
    ));
    let part = json!({"type": "image_url", "image_url": {"url": png(224, 224)}});
    let body = chat(part, 4, 6, false);
    let burst: Vec<_> = (0..12)
        .map(|_| {
            let (s, body) = (s.clone(), body.clone());
            std::thread::spawn(move || s.post(&body))
        })
        .collect();
    let codes: Vec<(u16, String)> = burst.into_iter().map(|h| h.join().unwrap()).collect();
    let ok = codes.iter().filter(|c| c.0 == 200).count();
    let limited = codes.iter().filter(|c| c.0 == 429).count();
    assert_eq!(ok + limited, 12, "{codes:?}");
    assert!(limited >= 1 && ok >= 3, "{ok} completed, {limited} got 429");
    for (c, text) in codes.iter().filter(|c| c.0 == 429) {
        let v: Value = serde_json::from_str(text).unwrap();
        assert_eq!(v["error"]["code"], *c);
    }
    // /metrics: Prometheus text; the TTFT histogram counts the completions
    let (status, text) = s.get("/metrics");
    assert_eq!(status, 200);
    let metrics = parse_prometheus(&text);
    let count = metrics["vllm:time_to_first_token_seconds_count"];
    assert_eq!(count, ok as f64, "{text}");
    assert_eq!(metrics["vllm:e2e_request_latency_seconds_count"], ok as f64);
    assert_eq!(metrics["easerve:request_rejected_total"], limited as f64);
    assert!(metrics.contains_key("vllm:num_requests_running"));
    assert!(metrics["easerve:encode_micro_batch_size_count"] >= 1.0);

    // SIGTERM with three requests in flight: they all finish
    let inflight: Vec<_> = (0..3)
        .map(|k| {
            let (s, body) = (s.clone(), body.clone());
            std::thread::sleep(Duration::from_millis(30 * k));
            std::thread::spawn(move || s.post(&body))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(150));
    let pid = s.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    // draining: new requests and /health get 503 (unless the drain is over
    // and the socket closed already)
    std::thread::sleep(Duration::from_millis(50));
    let late = s
        .http
        .post(format!("{}/v1/chat/completions", s.base))
        .body(body.to_string())
        .send();
    if let Ok(r) = late {
        assert_eq!(r.status().as_u16(), 503, "a request after SIGTERM");
        let v: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shutting down"));
    }
    if let Ok(r) = s.http.get(format!("{}/health", s.base)).send() {
        assert_eq!(r.status().as_u16(), 503, "/health while draining");
    }
    let answers: Vec<(u16, String)> = inflight.into_iter().map(|h| h.join().unwrap()).collect();
    for (code, text) in &answers {
        assert!(*code == 200 || *code == 429, "{code}: {text}");
    }
    let served = answers.iter().filter(|a| a.0 == 200).count();
    assert!(served >= 1, "{answers:?}");
    let Ok(mut s) = std::sync::Arc::try_unwrap(s) else {
        panic!("every request thread has ended");
    };
    let mut rest = String::new();
    s.out.read_to_string(&mut rest).unwrap();
    assert!(s.child.wait().unwrap().success());
    let r: Value = serde_json::from_str(&rest).unwrap();
    assert_eq!(num(&r, "/completed"), (ok + served) as f64);
    assert!(r.get("failed").is_none(), "nothing fails in a drain: {r}");
    let turned_away = limited + answers.iter().filter(|a| a.0 == 429).count();
    assert_eq!(num(&r, "/rejected"), turned_away as f64);
}

/// `name value` of each sample line (labels dropped); panics on a line
/// that is not a comment, `# EOF` or a sample.
pub(crate) fn parse_prometheus(text: &str) -> std::collections::HashMap<String, f64> {
    let mut out = std::collections::HashMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line}"));
        let name = series.split('{').next().unwrap();
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "metric name {name}"
        );
        let v: f64 = value.parse().unwrap_or_else(|_| panic!("value in {line}"));
        // histograms: keep the _count/_sum, not each bucket
        if !name.ends_with("_bucket") {
            out.insert(name.to_string(), v);
        }
    }
    out
}

/// `easerve bench` with `scenario`'s requests (24 of them) against `easerve
/// serve` of the same scenario and seed: the bench result's bytes, after
/// checking that its mean TTFT and TPOT are within 10 % of the server's own.
fn bench_against_serve(scenario: &str, model: &str) -> Vec<u8> {
    let s = Server::start(scenario, &[]);
    let base = s.base.clone();
    let out = easerve(&[
        "bench",
        "--base-url",
        &base,
        "--model",
        model,
        "--scenario",
        scenario,
        "--num-prompts",
        "24",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let b: Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = s.stop();
    assert_eq!(num(&r, "/completed"), 24.0, "{scenario}");
    assert_eq!(num(&b, "/completed"), 24.0, "{scenario}");
    for (what, client, server) in [
        (
            "TTFT",
            num(&b, "/mean_ttft_ms") / 1e3,
            num(&r, "/ttft/mean"),
        ),
        (
            "TPOT",
            num(&b, "/mean_tpot_ms") / 1e3,
            num(&r, "/tpot/mean"),
        ),
    ] {
        let rel = (client - server).abs() / server;
        eprintln!(
            "{scenario} {what}: bench {client:.4} s, the server {server:.4} s ({:+.1} %)",
            (client / server - 1.0) * 100.0
        );
        assert!(
            rel <= 0.10,
            "{scenario} {what}: bench {client:.4} s vs the server's {server:.4} s ({:.1} %)",
            rel * 100.0
        );
    }
    out.stdout
}

/// The client and the server agree on every `cpu-*` scenario, and the
/// twin is refined from the client's measurement of the image one.
#[test]
fn bench_against_serve_agrees_with_the_servers_report() {
    let _timed = crate::timed();
    bench_against_serve("scenarios/cpu-audio.toml", "tiny-audio");
    bench_against_serve("scenarios/cpu-video.toml", "tiny-video");
    let bench = bench_against_serve("scenarios/cpu-image.toml", "tiny-image");

    // calibrate the twin from the client's measurement: the refined profile loads
    let dir = tempfile::tempdir().unwrap();
    let measured = dir.path().join("bench.json");
    std::fs::write(&measured, &bench).unwrap();
    let sim = dir.path().join("sim.json");
    let simulated = crate::sim_json(
        &root().join("scenarios/cpu-image.toml"),
        &["--requests", "24"],
    );
    std::fs::write(&sim, simulated.to_string()).unwrap();
    let refined = dir.path().join("refined.toml");
    let p = |x: &std::path::Path| x.to_str().unwrap().to_string();
    let out = easerve(&[
        "calib",
        "refine",
        "--profile",
        "scenarios/profiles/tiny-image.cpu.toml",
        "--sim",
        &p(&sim),
        "--measured",
        &p(&measured),
        "-o",
        &p(&refined),
    ]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("decode") && said.contains("TTFT"), "{said}");
    assert!(said.contains("not identified"), "{said}");
    let again = crate::sim_json(
        &root().join("scenarios/cpu-image.toml"),
        &["--requests", "24", "--profile", &p(&refined)],
    );
    assert!(num(&again, "/tpot/mean") > 0.0);
}

/// Tensor parallelism computes what TP 1 does: the same request (an image and
/// text, 12 greedy tokens) gets the same completion from `1E+1P+1D` at TP 1,
/// at P TP 2 and D TP 2, across a KV handoff from TP 2 to TP 1 and from
/// TP 1 to TP 2 (the cache resharded by KV heads on the way), and with the
/// encoder split over two ranks (E TP 2). Runtime: five servers of the tiny
/// model, about 10 s in a debug build on 2 cores.
#[test]
fn tp2_prefill_and_decode_complete_as_tp1() {
    let _timed = crate::timed();
    let body = json!({"max_tokens": 12, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": png(224, 112)}},
        {"type": "text", "text": "what is in this picture"},
    ]}]});
    let completion = |alloc: &str| -> String {
        // offload 1: every prefill on the prefill worker
        let s = Server::start(
            "scenarios/cpu-image-tp2.toml",
            &["--allocation", alloc, "--offload", "1"],
        );
        let (code, text) = s.post(&body);
        assert_eq!(code, 200, "{alloc}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        let r = s.stop();
        assert_eq!(r["completed"].as_f64(), Some(1.0), "{alloc}: {r}");
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let want = completion("1E(TP1)+1P(TP1)+1D(TP1)");
    assert_eq!(want.split_whitespace().count(), 12, "{want}");
    for alloc in [
        "1E(TP1)+1P(TP2)+1D(TP2)",
        "1E(TP1)+1P(TP2)+1D(TP1)",
        "1E(TP1)+1P(TP1)+1D(TP2)",
        "1E(TP2)+1P(TP1)+1D(TP1)",
    ] {
        assert_eq!(completion(alloc), want, "{alloc}");
    }
}

/// With the encoder and prefix caches on, the server keys each image by its
/// decoded pixels: a repeated image hits, its encode is skipped, a prompt
/// that opens with it prefills only the rest over the kept KV blocks, and
/// the completions are those of a server without the caches (greedy tokens:
/// the cached path's logits are within 1e-3 of the full prefill's,
/// `model/src/nn/tests.rs`); `/metrics` and the report count the hits.
/// With the shared encoder-output store alone, the same completions, and
/// the store's hits in the report. Runs about 7 s (three servers of the
/// tiny model, five sequential requests each).
#[test]
fn the_caches_hit_repeated_images_and_change_no_token() {
    let _timed = crate::timed();
    let (a, b) = (png(224, 224), png(112, 224));
    let image = |url: &str| json!({"type": "image_url", "image_url": {"url": url}});
    // the third and fifth repeat the first, the fourth the second
    let bodies: Vec<Value> = [&a, &b, &a, &b, &a]
        .iter()
        .map(|u| chat(image(u), 3, 3, false))
        .collect();
    let serve = |scenario: &str| {
        let s = Server::start(scenario, &[]);
        let answers: Vec<String> = bodies
            .iter()
            .map(|body| {
                let (status, text) = s.post(body);
                assert_eq!(status, 200, "{text}");
                let v: Value = serde_json::from_str(&text).unwrap();
                v["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect();
        (s, answers)
    };
    let (off, plain) = serve("scenarios/cpu-image.toml");
    off.stop();
    let (s, cached) = serve("scenarios/cpu-image-reuse.toml");
    assert_eq!(cached, plain, "the cache changed the completions");
    // every request has completed, so its lookup is counted: wait for the
    // metrics to say so, not a snapshot
    let deadline = Instant::now() + Duration::from_secs(60);
    let metrics = loop {
        let (status, text) = s.get("/metrics");
        assert_eq!(status, 200);
        let m = parse_prometheus(&text);
        if m.get("easerve:encoder_cache_queries_total") == Some(&5.0) {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "encoder cache queries never reached 5: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(metrics["easerve:encoder_cache_hits_total"], 3.0);
    assert!(metrics["easerve:encoder_cache_usage_bytes"] > 0.0);
    // the prefix cache: whole blocks of 16 tokens of the repeated images
    // at the prefill worker that prefilled them before
    let hits = metrics["vllm:prefix_cache_hits_total"];
    assert!(metrics["vllm:prefix_cache_queries_total"] > 0.0);
    assert!(hits > 0.0 && hits % 16.0 == 0.0, "prefix cache hits {hits}");
    let r = s.stop();
    assert_eq!(num(&r, "/reuse/encoder_cache/hits"), 3.0, "{r}");
    assert_eq!(num(&r, "/reuse/encoder_cache/queries"), 5.0);
    // the shared store alone: the repeats' embeddings come from the
    // controller's process with their pass, not from the encoder
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(root().join("scenarios/cpu-image-reuse.toml")).unwrap();
    let profiles = root().join("scenarios/profiles/");
    let text = text
        .replace("[deployment.encoder_cache]", "[deployment.encoder_store]")
        .replace("\"profiles/", &format!("\"{}", profiles.display()));
    let path = dir.path().join("cpu-image-store.toml");
    std::fs::write(&path, text).unwrap();
    let (s, stored) = serve(path.to_str().unwrap());
    assert_eq!(stored, plain, "the store changed the completions");
    let r = s.stop();
    assert!(r["reuse"].get("encoder_cache").is_none(), "{r}");
    assert_eq!(num(&r, "/reuse/encoder_store/queries"), 5.0, "{r}");
    assert_eq!(num(&r, "/reuse/encoder_store/hits"), 3.0, "{r}");
    assert_eq!(num(&r, "/reuse/encoder_store/writes"), 2.0, "{r}");
}

/// `/metrics` once the prefix cache has been asked about `queries` prompt
/// tokens (every request so far placed on the prefill worker): its hits.
fn prefix_hits_after(s: &Server, queries: f64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, text) = s.get("/metrics");
        assert_eq!(status, 200);
        let m = parse_prometheus(&text);
        if m.get("vllm:prefix_cache_queries_total") == Some(&queries) {
            return m["vllm:prefix_cache_hits_total"];
        }
        assert!(
            Instant::now() < deadline,
            "prefix cache queries never reached {queries}: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The completion's text and its prompt tokens (`usage`).
fn answer(s: &Server, body: &Value) -> (String, f64) {
    let (status, text) = s.post(body);
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    (content.to_string(), num(&v, "/usage/prompt_tokens"))
}

/// Text is keyed by its content, so the prefix cache finds text that other
/// requests sent (issue 29: the server keyed each request's text as its
/// own). Two requests that open with the same 40-word system prompt share
/// its two whole blocks (32 tokens); one with another system prompt of as
/// many words shares none; a conversation's second turn that resends the
/// first (its text and image, and the answer the client got) prefills over
/// the first turn's whole blocks, and answers as a server without caches
/// answers the same second turn from scratch. Every prefill is remote
/// (`--offload 1`), on the one prefill worker. Two servers of the tiny
/// model, about 5 s.
#[test]
fn equal_system_prompts_and_resent_turns_hit_the_prefix_cache() {
    let _timed = crate::timed();
    let words = |tag: &str, n: usize| -> String {
        (0..n)
            .map(|k| format!("{tag}{k}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (s1, s2) = (words("a", 40), words("b", 40));
    let ask = |system: &str, question: &str| {
        json!({"max_tokens": 3, "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ]})
    };
    let s = Server::start("scenarios/cpu-image-reuse.toml", &["--offload", "1"]);
    let (_, a) = answer(&s, &ask(&s1, "what is one"));
    assert_eq!(prefix_hits_after(&s, a), 0.0);
    let (_, b) = answer(&s, &ask(&s1, "tell me about two please"));
    assert_eq!(
        prefix_hits_after(&s, a + b),
        32.0,
        "the shared system prompt"
    );
    let (_, c) = answer(&s, &ask(&s2, "tell me about two please"));
    assert_eq!(
        prefix_hits_after(&s, a + b + c),
        32.0,
        "another system prompt"
    );

    let first = json!({"role": "user", "content": [
        {"type": "text", "text": "describe this picture"},
        {"type": "image_url", "image_url": {"url": png(224, 224)}},
    ]});
    let (said, t1) = answer(&s, &json!({"max_tokens": 3, "messages": [first.clone()]}));
    let queried = a + b + c + t1;
    assert_eq!(prefix_hits_after(&s, queried), 32.0);
    let second = json!({"max_tokens": 3, "messages": [
        first,
        {"role": "assistant", "content": said},
        {"role": "user", "content": "and what else is there"},
    ]});
    let (cached, t2) = answer(&s, &second);
    // the first turn's whole blocks: its text and image, not its answer
    let blocks = (t1 / 16.0).floor() * 16.0;
    assert!(blocks > 0.0 && t2 > t1 + 3.0, "{t1} {t2}");
    assert_eq!(prefix_hits_after(&s, queried + t2), 32.0 + blocks);
    s.stop();
    let off = Server::start("scenarios/cpu-image.toml", &["--offload", "1"]);
    let (scratch, _) = answer(&off, &second);
    off.stop();
    assert_eq!(cached, scratch, "the cached turn changed the completion");
}
