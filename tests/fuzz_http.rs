//! Fuzzing `easerve serve`'s chat-completions endpoint over loopback, as
//! `fuzz_cli` fuzzes the command line: each case mutates a valid body from a
//! fixed seed — its structure (keys dropped, duplicated, nested, the JSON
//! cut short), its types, its sizes (counts, long strings, many messages or
//! parts), the media headers of its data URLs and of the request, its
//! base64, and its text (unicode, control characters, bytes that are not
//! UTF-8) — and sends it. Every case must be answered with a 4xx or a 200,
//! and no worker may die: `/health` stays 200 and nothing failed in the
//! server's report.
//!
//! The cases are the same on every run: `EASERVE_FUZZ_HTTP_CASES` sets their
//! number (default 1,000; docs/serve-and-bench.md gives the figures of 2,000)
//! and `EASERVE_FUZZ_HTTP_SEED` the seed (default 2026). Each case takes
//! two to four mutations in a row, so most are refused while read, before
//! any model work; a valid body asks for one token (of a 16×16 image, one in
//! ten), so it ends with its prefill.

use crate::num;
use crate::serve_cli::{b64, png, Server};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A valid body: a few words (and one time in ten a small image), one
/// token: the request ends with its prefill.
fn base(rng: &mut impl Rng, image: &str) -> Value {
    let mut content = vec![json!({"type": "text", "text": "describe this picture"})];
    if rng.gen_bool(0.1) {
        content.push(json!({"type": "image_url", "image_url": {"url": image}}));
    }
    json!({
        "model": "tiny-image",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": content},
        ],
        "max_tokens": 1,
        "stream": rng.gen_bool(0.3),
        "ignore_eos": true,
    })
}

/// Values of every JSON type, and hostile ones.
fn any_value(rng: &mut impl Rng) -> Value {
    let strings = [
        "",
        " ",
        "0",
        "-1",
        "NaN",
        "null",
        "true",
        "🦀🦀🦀",
        "\u{202e}gnp.",
        "\u{0}",
        "\u{feff}",
        "e\u{301}",
        "data:",
        "data:image/png;base64,",
        "file:///etc/passwd",
        "http://127.0.0.1/x.png",
    ];
    match rng.gen_range(0..10) {
        0 => Value::Null,
        1 => json!(rng.gen_bool(0.5)),
        2 => json!(rng.gen_range(-5i64..5)),
        3 => [
            json!(-1e308),
            json!(1e308),
            json!(0.5),
            json!(4_294_967_296u64),
            json!(u64::MAX),
        ][rng.gen_range(0..5)]
        .clone(),
        4 => json!(strings[rng.gen_range(0..strings.len())]),
        5 => json!([]),
        6 => json!({}),
        7 => json!([1, "a", null]),
        8 => json!({"type": "text"}),
        _ => json!("x".repeat(rng.gen_range(1..20_000))),
    }
}

/// Every JSON pointer in `v` (objects' keys and arrays' indices).
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = format!("{at}/{k}");
                out.push(p.clone());
                pointers(x, p, out);
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                let p = format!("{at}/{i}");
                out.push(p.clone());
                pointers(x, p, out);
            }
        }
        _ => {}
    }
}

/// Remove the value at pointer `p` from its parent.
fn remove(v: &mut Value, p: &str) {
    let (parent, key) = p.rsplit_once('/').unwrap();
    match v.pointer_mut(parent) {
        Some(Value::Object(m)) => {
            m.remove(key);
        }
        Some(Value::Array(a)) => {
            if let Ok(i) = key.parse::<usize>() {
                if i < a.len() {
                    a.remove(i);
                }
            }
        }
        _ => {}
    }
}

/// Set `key` of `body`, turning a body that is not an object into one.
fn put(body: &mut Value, key: &str, v: Value) {
    if !body.is_object() {
        *body = json!({"messages": body.take()});
    }
    body[key] = v;
}

/// Set the user message's content (a message of its own where the body
/// has none at that place).
fn put_content(body: &mut Value, v: Value) {
    match body.pointer_mut("/messages/1/content") {
        Some(slot) => *slot = v,
        None => put(body, "messages", json!([{"role": "user", "content": v}])),
    }
}

/// A data URL's media header or base64 made wrong.
fn bad_media(rng: &mut impl Rng, image: &str) -> String {
    let data = image.split_once(',').map_or("", |x| x.1);
    match rng.gen_range(0..10) {
        0 => format!("data:image/gif;base64,{data}"),
        1 => format!("data:text/plain;base64,{data}"),
        2 => format!("data:image/png,{data}"),
        3 => format!("data:image/png;base64,{}", &data[..data.len() / 2]),
        4 => format!("data:image/png;base64,{data}===="),
        5 => format!("data:image/png;base64,{}", data.replace('A', "*")),
        6 => format!(
            "data:image/png;base64,{}",
            b64(b"\x89PNG\r\n\x1a\nnot a png")
        ),
        7 => format!("data:image/jpeg;base64,{data}"),
        8 => "data:;base64,".to_string(),
        _ => format!("DATA:IMAGE/PNG;BASE64,{data}"),
    }
}

/// One mutation of `body`; returns the body's bytes and its content type.
fn mutate(rng: &mut impl Rng, mut body: Value, image: &str) -> (Vec<u8>, &'static str) {
    let mut ptrs = Vec::new();
    pointers(&body, String::new(), &mut ptrs);
    let p = ptrs.choose(rng).cloned().unwrap_or_default();
    let mut content_type = "application/json";
    match rng.gen_range(0..12) {
        // structure
        0 => remove(&mut body, &p),
        1 => {
            if let Some(x) = body.pointer_mut(&p) {
                *x = json!([x.clone(), x.clone()]);
            }
        }
        2 => {
            let depth = [2, 64, 600][rng.gen_range(0..3)];
            let mut x = body.pointer(&p).cloned().unwrap_or(Value::Null);
            for _ in 0..depth {
                x = json!([x]);
            }
            if let Some(slot) = body.pointer_mut(&p) {
                *slot = x;
            }
        }
        3 => {
            put(&mut body, "unknown_field", any_value(rng));
            put(&mut body, "n", json!(rng.gen_range(0..4)));
        }
        // types
        4 | 5 => {
            if let Some(x) = body.pointer_mut(&p) {
                *x = any_value(rng);
            }
        }
        // sizes
        6 => {
            let n = [0, 50, 100_000][rng.gen_range(0..3)];
            let msgs = vec![json!({"role": "user", "content": "hi"}); n];
            put(&mut body, "messages", json!(msgs));
        }
        7 => {
            let n = [2, 1_200][rng.gen_range(0..2)];
            let part = json!({"type": "image_url", "image_url": {"url": image}});
            put_content(&mut body, json!(vec![part; n]));
        }
        // media headers and base64
        8 => {
            let part = json!({"type": "image_url", "image_url": {"url": bad_media(rng, image)}});
            put_content(&mut body, json!([part]));
        }
        9 => {
            content_type = [
                "text/plain",
                "",
                "application/json; charset=latin1",
                "image/png",
            ][rng.gen_range(0..4)];
        }
        // unicode
        10 => {
            let texts = [
                "🦀".repeat(500),
                "\u{0}\u{1}\u{7f}".into(),
                "\u{202e}\u{200b}".repeat(50),
                "𝓊𝓃𝒾𝒸𝑜𝒹𝑒 ".repeat(200),
            ];
            put_content(&mut body, json!(texts[rng.gen_range(0..texts.len())]));
        }
        // bytes: cut short, or not UTF-8, or a lone surrogate escape
        _ => {
            let text = body.to_string();
            let mut bytes = text.into_bytes();
            match rng.gen_range(0..3) {
                0 => bytes.truncate(rng.gen_range(0..bytes.len())),
                1 => {
                    let at = rng.gen_range(0..bytes.len());
                    bytes.splice(at..at, [0xff, 0xfe, 0xc0, 0x80]);
                }
                _ => {
                    let s = String::from_utf8(bytes).unwrap();
                    bytes = s.replacen("be brief", "\\ud800 brief", 1).into_bytes();
                }
            }
            return (bytes, content_type);
        }
    }
    (body.to_string().into_bytes(), content_type)
}

/// Case `i` of `seed`: its body's bytes and content type. Each case has its
/// own RNG stream, so a case is the same whichever client sends it.
fn case(seed: u64, i: usize, image: &str) -> (Vec<u8>, &'static str) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(i as u64);
    // two to four mutations in a row, while the body stays small JSON
    let mut body = base(&mut rng, image);
    let mut out = (Vec::new(), "");
    for _ in 0..rng.gen_range(2..=4) {
        out = mutate(&mut rng, body.clone(), image);
        if out.0.len() > 64 << 10 || out.1 != "application/json" {
            break;
        }
        match serde_json::from_slice::<Value>(&out.0) {
            Ok(v) => body = v,
            Err(_) => break,
        }
    }
    out
}

/// 1,000 mutated chat bodies (by default) against one loopback server: each answered 200
/// or 4xx, no worker dead, nothing failed.
#[test]
fn mutated_chat_bodies_get_4xx_or_200_and_no_worker_dies() {
    let _timed = crate::timed();
    let cases: usize = env_or("EASERVE_FUZZ_HTTP_CASES", 1_000);
    let seed: u64 = env_or("EASERVE_FUZZ_HTTP_SEED", 2026);
    let s = Server::start("scenarios/cpu-image.toml", &["--admission-limit", "64"]);
    let image = png(16, 16);
    let url = format!("{}/v1/chat/completions", s.base);
    // eight clients at once, client k sending cases k, k + 8, …
    let clients = 8;
    let answers: Vec<(usize, u16, Vec<u8>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|k| {
                let (http, url, image) = (s.http.clone(), url.clone(), image.clone());
                scope.spawn(move || {
                    (k..cases)
                        .step_by(clients)
                        .map(|i| {
                            let (bytes, ct) = case(seed, i, &image);
                            let mut req = http.post(&url).body(bytes.clone());
                            if !ct.is_empty() {
                                req = req.header("content-type", ct);
                            }
                            let r = req.send().unwrap_or_else(|e| panic!("case {i}: {e}"));
                            let status = r.status().as_u16();
                            // the whole answer is read (a stream to its end)
                            let _ = r.bytes();
                            (i, status, bytes)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let mut served = 0;
    for (i, status, bytes) in &answers {
        assert!(
            *status == 200 || (400..500).contains(status),
            "case {i} got {status}: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
        );
        served += usize::from(*status == 200);
    }
    assert_eq!(answers.len(), cases);
    let client_errors = answers.iter().filter(|a| (400..500).contains(&a.1)).count();
    eprintln!("fuzz_http: {cases} cases, {served} served (200), {client_errors} answered 4xx");
    assert!(served > 0 && served < cases, "{served} of {cases} served");
    assert_eq!(s.get("/health").0, 200, "a worker died");
    let r = s.stop();
    assert_eq!(num(&r, "/completed") as usize, served);
    assert!(
        r.get("failed").is_none(),
        "requests failed: {}",
        r["failures"]
    );
}
