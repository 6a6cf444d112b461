//! `easerve serve` under clients that leave and clients that abuse the
//! socket: a disconnect or a passed deadline aborts its request and frees its
//! work (the running-request gauge and the KV blocks in use fall back to
//! zero); slowloris connections are closed at the header read timeout, a
//! slow body gets a 408, connections over the cap a 503, and floods of large
//! bodies and of disconnects leave the server serving.

use crate::num;
use crate::serve_cli::{parse_prometheus, png, Server};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// `ADDR` of `http://ADDR`.
fn addr(s: &Server) -> String {
    s.base.trim_start_matches("http://").to_string()
}

/// A raw HTTP/1.1 POST of `body` on a fresh connection, left open.
fn raw_post(s: &Server, body: &Value) -> TcpStream {
    let mut c = TcpStream::connect(addr(s)).unwrap();
    let text = body.to_string();
    write!(
        c,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{text}",
        text.len()
    )
    .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c
}

/// Read from `c` until `needle` has come (or the connection ends).
fn read_until(c: &mut TcpStream, needle: &str) -> String {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains(needle) {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

fn metrics(s: &Server) -> HashMap<String, f64> {
    let (status, text) = s.get("/metrics");
    assert_eq!(status, 200);
    parse_prometheus(&text)
}

/// Poll `/metrics` until `ok` holds (within 20 s); the last reading.
fn wait_for(
    s: &Server,
    what: &str,
    ok: impl Fn(&HashMap<String, f64>) -> bool,
) -> HashMap<String, f64> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = metrics(s);
        if ok(&m) {
            return m;
        }
        assert!(Instant::now() < deadline, "{what}: {m:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A long request: 20,000 tokens of a small image (tens of seconds of
/// decode), which only an abort ends early.
fn long(stream: bool) -> Value {
    json!({
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "go on"},
            {"type": "image_url", "image_url": {"url": png(64, 64)}},
        ]}],
        "max_tokens": 20_000,
        "ignore_eos": true,
        "stream": stream,
    })
}

/// A streamed request whose client leaves after its first tokens, a
/// non-streamed one whose client leaves mid-decode, and one whose
/// `timeout` passes: all three are aborted (not failed), the running gauge
/// and the KV blocks in use fall back to zero, and the server serves on.
#[test]
fn a_client_that_leaves_or_times_out_aborts_its_request_and_frees_its_work() {
    let _timed = crate::timed();
    let s = Server::start("scenarios/cpu-image.toml", &[]);
    let running = |m: &HashMap<String, f64>| m["vllm:num_requests_running"];
    let kv = |m: &HashMap<String, f64>| m["vllm:kv_cache_usage_perc"];
    let aborted = |m: &HashMap<String, f64>| m["easerve:request_aborted_total"];

    let mut c = raw_post(&s, &long(true));
    let first = read_until(&mut c, "\"content\":\" ");
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    let busy = wait_for(&s, "decoding", |m| running(m) == 1.0 && kv(m) > 0.0);
    drop(c);
    // the blocks are freed at the end of the decode iteration in progress
    let freed = |n: f64| {
        move |m: &HashMap<String, f64>| aborted(m) == n && running(m) == 0.0 && kv(m) == 0.0
    };
    wait_for(&s, "the stream's abort", freed(1.0));
    assert!(kv(&busy) > 0.0);

    let c = raw_post(&s, &long(false));
    wait_for(&s, "decoding", |m| running(m) == 1.0 && kv(m) > 0.0);
    drop(c);
    wait_for(&s, "the second abort", freed(2.0));

    let mut timed_out = long(false);
    timed_out["timeout"] = json!(0.5);
    let t0 = Instant::now();
    let (status, body) = s.post(&timed_out);
    assert_eq!(status, 408, "{body}");
    assert!(body.contains("deadline passed"), "{body}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    let mut bad = long(false);
    bad["timeout"] = json!(-1);
    assert_eq!(s.post(&bad).0, 400);

    let mut short = long(false);
    short["max_tokens"] = json!(3);
    assert_eq!(s.post(&short).0, 200);
    let m = wait_for(&s, "all done", |m| running(m) == 0.0 && kv(m) == 0.0);
    assert_eq!(aborted(&m), 3.0);
    assert_eq!(m["easerve:request_failure_total"], 0.0);
    let r = s.stop();
    assert_eq!(num(&r, "/aborted"), 3.0, "{r}");
    assert_eq!(num(&r, "/completed"), 1.0);
    assert!(r.get("failed").is_none(), "{r}");
    let reasons: Vec<(String, f64)> = r["aborts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["reason"].as_str().unwrap().to_string(), num(f, "/count")))
        .collect();
    assert_eq!(
        reasons,
        [
            ("client disconnected".to_string(), 2.0),
            ("deadline passed".to_string(), 1.0)
        ]
    );
}

/// Slowloris connections are closed at the header read timeout (1 s here)
/// while `/health` answers; a body that stalls gets a 408; connections over
/// the cap get a 503; a flood of 8 MiB bodies gets 4xx each; a flood of 24
/// clients that leave mid-request leaves nothing running. Then an ordinary
/// request succeeds and nothing failed.
#[test]
fn slowloris_large_bodies_and_disconnect_floods_leave_the_server_serving() {
    let _timed = crate::timed();
    let s = Server::start(
        "scenarios/cpu-image.toml",
        &[
            "--header-read-timeout",
            "1",
            "--body-read-timeout",
            "1",
            "--max-connections",
            "40",
            "--admission-limit",
            "8",
        ],
    );
    let connect = || {
        let c = TcpStream::connect(addr(&s)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c
    };
    // slowloris: headers that never end
    let mut slow: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut c = connect();
            c.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
                .unwrap();
            c
        })
        .collect();
    assert_eq!(s.get("/health").0, 200);
    let t0 = Instant::now();
    for c in &mut slow {
        let mut buf = [0u8; 256];
        // closed by the server (EOF, or a reset): nothing else comes
        let n = c.read(&mut buf).unwrap_or(0);
        let got = String::from_utf8_lossy(&buf[..n]).to_string();
        assert!(
            n == 0 || got.contains("408") || got.contains("400"),
            "{got}"
        );
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    drop(slow);
    // a body that stalls
    let mut c = connect();
    c.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n{\"messages\"")
        .unwrap();
    let got = read_until(&mut c, "\r\n\r\n");
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    // over the cap: 40 connections open, the next ones get 503
    let held: Vec<TcpStream> = (0..40).map(|_| connect()).collect();
    std::thread::sleep(Duration::from_millis(100));
    let mut over = connect();
    let got = read_until(&mut over, "}}");
    assert!(got.starts_with("HTTP/1.1 503"), "{got}");
    drop(held);
    // the header timeout closes them: the server answers again
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(s.get("/health").0, 200);
    // a flood of large bodies: 2 million words each, refused after reading
    let big =
        json!({"messages": [{"role": "user", "content": "w ".repeat(4 << 20)}], "max_tokens": 1});
    let big = std::sync::Arc::new(big);
    let codes: Vec<u16> = std::thread::scope(|scope| {
        let hs: Vec<_> = (0..12)
            .map(|_| {
                let big = big.clone();
                let s = &s;
                scope.spawn(move || s.post(&big).0)
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(codes.iter().all(|c| (400..500).contains(c)), "{codes:?}");
    // a flood of clients that leave mid-request
    let gone: Vec<TcpStream> = (0..24).map(|_| raw_post(&s, &long(true))).collect();
    std::thread::sleep(Duration::from_millis(500));
    drop(gone);
    let running = |m: &HashMap<String, f64>| m["vllm:num_requests_running"];
    // an aborted sequence leaves the count at once but frees its blocks when
    // the decode iteration in progress yields: wait for both (a leak fails)
    let m = wait_for(&s, "the flood's aborts", |m| {
        running(m) == 0.0
            && m["vllm:num_requests_waiting"] == 0.0
            && m["vllm:kv_cache_usage_perc"] == 0.0
    });
    assert!(m["easerve:request_aborted_total"] >= 1.0, "{m:?}");
    let mut short = long(false);
    short["max_tokens"] = json!(2);
    assert_eq!(s.post(&short).0, 200);
    let r = s.stop();
    assert!(r.get("failed").is_none(), "{r}");
    // every request that reached the controller ended: served, aborted or turned away
    let ended = num(&r, "/completed")
        + r.get("aborted").map_or(0.0, |_| num(&r, "/aborted"))
        + r.get("rejected").map_or(0.0, |_| num(&r, "/rejected"))
        + r.get("refused").map_or(0.0, |_| num(&r, "/refused"));
    assert_eq!(ended, num(&r, "/requests"), "{r}");
}
