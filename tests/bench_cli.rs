//! `easerve bench` against a loopback OpenAI-compatible server that streams
//! with known timing: the measured TTFT, TPOT and ITL match what the server
//! did, failures are counted with their reason, the media are real files of
//! the shapes asked for, and a scenario's requests are the simulator's.

use crate::{easerve, root, sim_json};
use base64::Engine as _;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the server saw of one request.
#[derive(Clone, Debug, Default)]
pub(crate) struct Seen {
    pub(crate) words: usize,
    /// Each text part, in order.
    pub(crate) texts: Vec<String>,
    pub(crate) images: Vec<(u32, u32)>,
    pub(crate) audio_s: Vec<f64>,
    pub(crate) video_frames: Vec<usize>,
    pub(crate) max_tokens: u64,
}

/// A server on 127.0.0.1 (port 0) that streams `max_tokens` one-word chunks:
/// the first after `ttft`, then one every `gap`; every `fail_every`-th
/// request (1-based) gets HTTP 500. Prompt tokens in `usage`: words plus 100
/// per image, frame or audio clip.
pub(crate) struct FakeServer {
    pub(crate) url: String,
    pub(crate) seen: Arc<Mutex<Vec<Seen>>>,
}

pub(crate) fn fake_server(ttft: Duration, gap: Duration, fail_every: usize) -> FakeServer {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let count = Arc::new(Mutex::new(0usize));
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let (log, count) = (log.clone(), count.clone());
            std::thread::spawn(move || serve(conn, ttft, gap, fail_every, &log, &count));
        }
    });
    FakeServer { url, seen }
}

fn serve(
    conn: TcpStream,
    ttft: Duration,
    gap: Duration,
    fail_every: usize,
    log: &Mutex<Vec<Seen>>,
    count: &Mutex<usize>,
) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let l = line.trim_end().to_ascii_lowercase();
        if l.is_empty() {
            break;
        }
        if let Some(v) = l.strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).unwrap();
    let req: Value = serde_json::from_slice(&body).unwrap();
    let mut out = conn;
    out.set_nodelay(true).unwrap();
    let n = {
        let mut c = count.lock().unwrap();
        *c += 1;
        *c
    };
    if fail_every > 0 && n % fail_every == 0 {
        let msg = r#"{"error":{"message":"scheduled failure","type":"server_error"}}"#;
        let _ = write!(
            out,
            "HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{msg}",
            msg.len()
        );
        return;
    }
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.decode(s).unwrap();
    let image = |url: &str| {
        let data = url.split_once(";base64,").unwrap().1;
        let img = image::load_from_memory(&b64(data)).unwrap();
        (img.height(), img.width())
    };
    let mut s = Seen {
        max_tokens: req["max_tokens"].as_u64().unwrap(),
        ..Seen::default()
    };
    for part in req["messages"][0]["content"].as_array().unwrap() {
        match part["type"].as_str().unwrap() {
            "text" => {
                let text = part["text"].as_str().unwrap();
                s.words += text.split_whitespace().count();
                s.texts.push(text.to_string());
            }
            "image_url" => s
                .images
                .push(image(part["image_url"]["url"].as_str().unwrap())),
            "input_audio" => {
                let wav = hound::WavReader::new(std::io::Cursor::new(b64(part["input_audio"]
                    ["data"]
                    .as_str()
                    .unwrap())))
                .unwrap();
                s.audio_s
                    .push(f64::from(wav.duration()) / f64::from(wav.spec().sample_rate));
            }
            "video_url" => {
                // vLLM's frames form: data:video/jpeg;base64,F1,F2,…
                let url = part["video_url"]["url"].as_str().unwrap();
                let frames = url.strip_prefix("data:video/jpeg;base64,").unwrap();
                let frames: Vec<&str> = frames.split(',').collect();
                for f in &frames {
                    let img = image::load_from_memory(&b64(f)).unwrap();
                    s.images.push((img.height(), img.width()));
                }
                s.video_frames.push(frames.len());
            }
            other => panic!("unexpected part {other}"),
        }
    }
    let prompt = s.words + 100 * (s.images.len() + s.audio_s.len());
    let tokens = s.max_tokens;
    log.lock().unwrap().push(s);
    let _ = write!(
        out,
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
    );
    let chunk = |c: &str| {
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{c}\"}}}}]}}\n\n")
    };
    let _ = out
        .write_all(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n");
    std::thread::sleep(ttft);
    for i in 0..tokens {
        if i > 0 {
            std::thread::sleep(gap);
        }
        let _ = out.write_all(chunk(" tok").as_bytes());
        let _ = out.flush();
    }
    let _ = write!(
        out,
        "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt},\"completion_tokens\":{tokens}}}}}\n\ndata: [DONE]\n\n"
    );
}

/// A result's `completed` and `failed` counts.
fn completed_failed(r: &Value) -> (u64, u64) {
    let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k}: {}", r[k]));
    (n("completed"), n("failed"))
}

fn bench_json(args: &[&str]) -> Value {
    let out = easerve(args);
    assert!(
        out.status.success(),
        "easerve {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON result")
}

#[test]
fn bench_measures_what_the_server_did_and_counts_failures() {
    let server = fake_server(Duration::from_millis(80), Duration::from_millis(10), 5);
    let csv = tempfile::NamedTempFile::new().unwrap();
    let r = bench_json(&[
        "bench",
        "--base-url",
        &server.url,
        "--model",
        "m",
        "--num-prompts",
        "20",
        "--request-rate",
        "40",
        "--random-input-len",
        "30",
        "--random-output-len",
        "12",
        "--random-mm-bucket-config",
        "{(64, 48, 1): 0.5, (32, 40, 3): 0.5}",
        "--goodput",
        "ttft:1000",
        "tpot:1000",
        "--requests-csv",
        csv.path().to_str().unwrap(),
        "--json",
    ]);
    let num = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k}: {}", r[k]));
    assert_eq!((num("completed"), num("failed")), (16.0, 4.0));
    // the server waited 80 ms before the first token and 10 ms between tokens
    let ttft = num("mean_ttft_ms");
    assert!((80.0..200.0).contains(&ttft), "mean TTFT {ttft} ms");
    let (tpot, itl) = (num("mean_tpot_ms"), num("median_itl_ms"));
    assert!((9.0..25.0).contains(&tpot), "mean TPOT {tpot} ms");
    assert!((5.0..25.0).contains(&itl), "median ITL {itl} ms");
    assert_eq!(num("total_output_tokens"), 16.0 * 12.0);
    let errors: Vec<&str> = r["errors"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .filter(|e| !e.is_empty())
        .collect();
    assert_eq!(errors.len(), 4);
    assert!(
        errors
            .iter()
            .all(|e| e.contains("HTTP 500: scheduled failure")),
        "{errors:?}"
    );
    assert!((num("request_goodput") - num("request_throughput")).abs() < 1e-9);
    // easerve's report of the same requests agrees and counts the failures
    let e = &r["easerve"];
    assert_eq!(e["completed"], 16);
    assert_eq!(e["failed"], 4);
    assert!((e["ttft"]["mean"].as_f64().unwrap() * 1e3 - ttft).abs() < 1e-6);
    // the media were real files of the shapes drawn; the text the length asked for
    let seen = server.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 16);
    let shapes: Vec<(u32, u32)> = seen.iter().flat_map(|s| s.images.clone()).collect();
    assert!(
        shapes.iter().all(|&s| s == (64, 48) || s == (32, 40)),
        "{shapes:?}"
    );
    assert!(seen.iter().any(|s| s.video_frames == [3]));
    assert!(seen.iter().all(|s| s.words == 30 && s.max_tokens == 12));
    // input tokens are the server's usage counts
    let want: usize = seen.iter().map(|s| s.words + 100 * s.images.len()).sum();
    assert_eq!(num("total_input_tokens"), want as f64);
    let rows = std::fs::read_to_string(csv.path()).unwrap();
    assert_eq!(rows.lines().count(), 21);
}

#[test]
fn a_scenarios_requests_are_the_simulators_with_its_tiers_as_goodput() {
    let server = fake_server(Duration::from_millis(5), Duration::from_millis(1), 0);
    let scenario = root().join("scenarios/cpu-audio.toml");
    let r = bench_json(&[
        "bench",
        "--base-url",
        &server.url,
        "--model",
        "m",
        "--scenario",
        scenario.to_str().unwrap(),
        "--num-prompts",
        "6",
        "--request-rate",
        "inf",
        "--slo",
        "relaxed",
        "--json",
    ]);
    assert_eq!(r["completed"], 6);
    // the simulator's requests of the same scenario and seed: the same clips
    // and output lengths
    let o = easerve_workload::scenario::Overrides {
        requests: Some(6),
        ..Default::default()
    };
    let sc = easerve_workload::scenario::Scenario::load(&scenario, &o).unwrap();
    let reqs = easerve_workload::generate::generate_requests(&sc);
    let mut want: Vec<(u64, f64)> = reqs
        .iter()
        .map(|q| match q.items[..] {
            [easerve_sched::MmItem::Audio { seconds }] => (u64::from(q.output_tokens), seconds),
            _ => panic!("an audio request"),
        })
        .collect();
    let mut got: Vec<(u64, f64)> = server
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| (s.max_tokens, s.audio_s[0]))
        .collect();
    want.sort_by(|a, b| a.1.total_cmp(&b.1));
    got.sort_by(|a, b| a.1.total_cmp(&b.1));
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.0, w.0);
        assert!((g.1 - w.1).abs() <= 1.0 / 16_000.0, "{g:?} against {w:?}");
    }
    assert_eq!(
        r["total_output_tokens"].as_u64(),
        Some(want.iter().map(|w| w.0).sum())
    );
    assert!(r["request_goodput"].as_f64().is_some());
    assert_eq!(r["easerve"]["scenario"], "cpu-audio");
    // calib validate takes the bench result as the measured run of the scenario
    let tmp = tempfile::tempdir().unwrap();
    let measured = tmp.path().join("bench.json");
    std::fs::write(&measured, serde_json::to_vec(&r).unwrap()).unwrap();
    let simulated = tmp.path().join("sim.json");
    std::fs::write(
        &simulated,
        serde_json::to_vec(&sim_json(&scenario, &["--requests", "6"])).unwrap(),
    )
    .unwrap();
    let out = easerve(&[
        "calib",
        "validate",
        "--sim",
        simulated.to_str().unwrap(),
        "--measured",
        measured.to_str().unwrap(),
        "--max-error",
        "1000000",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("TTFT mean"), "{text}");
}

/// `--dataset-name prefix_repetition` sends vLLM's dataset: `num_prefixes ×
/// ⌊num_prompts / num_prefixes⌋` prompts, each one of the shared prefixes
/// (the same words every time) followed by a suffix of its own.
#[test]
fn the_prefix_repetition_dataset_sends_shared_prefixes_and_own_suffixes() {
    let server = fake_server(Duration::from_millis(1), Duration::from_millis(1), 0);
    let r = bench_json(&[
        "bench",
        "--dataset-name",
        "prefix_repetition",
        "--num-prompts",
        "14",
        "--base-url",
        &server.url,
        "--model",
        "m",
        "--prefix-repetition-prefix-len",
        "40",
        "--prefix-repetition-suffix-len",
        "8",
        "--prefix-repetition-num-prefixes",
        "3",
        "--prefix-repetition-output-len",
        "5",
        "--json",
    ]);
    assert_eq!(completed_failed(&r), (12, 0));
    assert_eq!(r["total_output_tokens"].as_u64(), Some(12 * 5));
    let seen = server.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 12);
    let mut prefixes = std::collections::HashMap::new();
    let mut suffixes = std::collections::HashSet::new();
    for s in &seen {
        assert_eq!((s.texts.len(), s.words, s.max_tokens), (2, 48, 5), "{s:?}");
        assert_eq!(s.texts[0].split_whitespace().count(), 40);
        *prefixes.entry(s.texts[0].clone()).or_insert(0) += 1;
        suffixes.insert(s.texts[1].clone());
    }
    assert_eq!(prefixes.values().copied().collect::<Vec<_>>(), [4, 4, 4]);
    assert_eq!(suffixes.len(), 12);
}

#[test]
fn bad_bench_input_exits_2_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["--base-url", "https://example.com"], "plain HTTP"),
        (&["--base-url", "not a url"], "--base-url"),
        (
            &["--random-mm-bucket-config", "{(1, 2): 1}"],
            "--random-mm-bucket-config",
        ),
        (&["--goodput", "ttfx:3"], "--goodput"),
        (&["--request-rate", "0"], "--request-rate"),
        (&["--dataset-name", "sharegpt"], "--dataset-name"),
        // vLLM refuses fewer prompts than prefixes
        (
            &["--dataset-name", "prefix_repetition"],
            "--prefix-repetition-num-prefixes 10: allowed 1 ..= --num-prompts (1)",
        ),
        (
            &[
                "--dataset-name",
                "prefix_repetition",
                "--prefix-repetition-num-prefixes",
                "1",
                "--prefix-repetition-output-len",
                "0",
            ],
            "--prefix-repetition-output-len 0",
        ),
        (&["--image-format", "gif"], "--image-format"),
        (&["--max-concurrency", "0"], "--max-concurrency"),
        // checked before anything is sent
        (
            &[
                "--random-mm-bucket-config",
                "{(64, 64, 1): 0.5, (20000, 20, 1): 0.5}",
                "--num-prompts",
                "4",
            ],
            "--random-mm-bucket-config: request",
        ),
        (&["--timeout", "1e300"], "--timeout"),
        (&["--request-rate", "1e-12"], "--request-rate"),
        (
            &[
                "--scenario",
                "scenarios/cpu-audio.toml",
                "--burstiness",
                "2",
            ],
            "cannot be used with",
        ),
        // vLLM's ramp-up rules (vllm/benchmarks/serve.py)
        (
            &[
                "--ramp-up-strategy",
                "quadratic",
                "--ramp-up-start-rps",
                "1",
                "--ramp-up-end-rps",
                "2",
            ],
            "--ramp-up-strategy `quadratic`: allowed linear, exponential",
        ),
        (
            &[
                "--ramp-up-strategy",
                "exponential",
                "--ramp-up-start-rps",
                "0",
                "--ramp-up-end-rps",
                "2",
            ],
            "--ramp-up-start-rps 0",
        ),
        (
            &[
                "--ramp-up-strategy",
                "linear",
                "--ramp-up-start-rps",
                "3",
                "--ramp-up-end-rps",
                "2",
            ],
            "start ≤ end",
        ),
        (
            &["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1"],
            "--ramp-up-end-rps",
        ),
        (
            &["--ramp-up-strategy", "linear", "--request-rate", "2"],
            "cannot be used with",
        ),
    ];
    for (extra, want) in cases {
        let mut args = vec!["bench", "--model", "m"];
        if !extra.contains(&"--num-prompts") {
            args.extend(["--num-prompts", "1"]);
        }
        if !extra.contains(&"--base-url") {
            args.extend(["--base-url", "http://127.0.0.1:9"]);
        }
        args.extend_from_slice(extra);
        let out = easerve(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // a server that is not there: every request fails with its reason, none is lost
    let r = bench_json(&[
        "bench",
        "--base-url",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--num-prompts",
        "3",
        "--dataset-name",
        "random",
        "--random-input-len",
        "5",
        "--json",
    ]);
    assert_eq!(completed_failed(&r), (0, 3));
    assert!(r["errors"][0].as_str().unwrap().contains("connection"));
}

/// `calib validate` and `calib refine` read the result JSON of `vllm bench
/// serve --save-result --save-detailed`: per-request TTFT, ITLs and output
/// lengths give TTFT, TPOT and E2E, throughput is over its `duration`, and a
/// failed request is counted, not measured.
#[test]
fn a_vllm_bench_serve_result_is_validated_and_refined_against() {
    let tmp = tempfile::tempdir().unwrap();
    let vllm = serde_json::json!({
        "duration": 4.0,
        "completed": 2,
        "request_throughput": 0.5,
        "input_lens": [100, 100, 100],
        "output_lens": [4, 3, 0],
        "ttfts": [0.5, 0.7, 0.0],
        "itls": [[0.1, 0.1, 0.1], [0.2, 0.2], []],
        "generated_texts": ["a b c d", "a b c", ""],
        "errors": ["", "", "Bad Gateway"],
    });
    let measured = tmp.path().join("vllm.json");
    std::fs::write(&measured, vllm.to_string()).unwrap();
    let scenario = root().join("scenarios/cpu-image.toml");
    let simulated = tmp.path().join("sim.json");
    std::fs::write(
        &simulated,
        sim_json(&scenario, &["--requests", "6"]).to_string(),
    )
    .unwrap();
    let (s, m) = (simulated.to_str().unwrap(), measured.to_str().unwrap());
    let out = easerve(&[
        "calib",
        "validate",
        "--sim",
        s,
        "--measured",
        m,
        "--json",
        "--max-error",
        "1000000",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = |metric: &str| {
        v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["metric"] == metric)
            .unwrap_or_else(|| panic!("no row {metric}: {v}"))["measured"]
            .as_f64()
            .unwrap()
    };
    // TTFT mean (0.5 + 0.7)/2; E2E 0.8 and 1.1; TPOT 0.1 and 0.2; 2 of 3 over 4 s
    assert!((row("TTFT mean (s)") - 0.6).abs() < 1e-9);
    assert!((row("E2E mean (s)") - 0.95).abs() < 1e-9);
    assert!((row("TPOT mean (s)") - 0.15).abs() < 1e-9);
    assert!((row("throughput (req/s)") - 0.5).abs() < 1e-9);
    let refined = tmp.path().join("refined.toml");
    let out = easerve(&[
        "calib",
        "refine",
        "--profile",
        "scenarios/profiles/tiny-image.cpu.toml",
        "--sim",
        s,
        "--measured",
        m,
        "-o",
        refined.to_str().unwrap(),
    ]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("not identified"), "{said}");
    sim_json(
        &scenario,
        &["--requests", "6", "--profile", refined.to_str().unwrap()],
    );
    // a result without the detailed fields says what to add
    std::fs::write(&measured, r#"{"duration": 4.0, "ttfts": [0.5]}"#).unwrap();
    let out = easerve(&["calib", "validate", "--sim", s, "--measured", m]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--save-detailed"));
}
