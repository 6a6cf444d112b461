//! Sending the requests: each at its time (or when a `--max-concurrency` slot
//! frees), as a streamed chat completion; every content chunk's arrival is
//! timed.
//!
//! Request bodies are built ahead of their send time on a thread of their
//! own (encoding media takes milliseconds), a bounded queue ahead of the
//! sender, so building one never delays another's send.

use crate::media::{content_part, ImageCodec};
use crate::workload::{prompt_text, segment_text, BenchRequest};
use easerve_workload::rng::stream;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// Where and how to send.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Server root, e.g. `http://127.0.0.1:8000` (plain HTTP).
    pub base_url: String,
    /// Path of the chat completions endpoint (`/v1/chat/completions`).
    pub endpoint: String,
    /// The `model` field of every request.
    pub model: String,
    /// Requests in flight at most (`None`: as many as arrive).
    pub max_concurrency: Option<usize>,
    /// Seconds a request may take, from send to its last byte.
    pub timeout_s: f64,
    /// How images and video frames are encoded.
    pub codec: ImageCodec,
    /// Seed of the media and prompt text.
    pub seed: u64,
    /// Show a progress bar (on a terminal).
    pub progress: bool,
}

/// What happened to one request. Times are seconds since the start of the run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Request index.
    pub id: u64,
    /// When it was due.
    pub scheduled: f64,
    /// When it was sent (later than due when a concurrency slot was awaited).
    pub sent: f64,
    /// Arrival of each chunk that carried output text.
    pub token_times: Vec<f64>,
    /// When the stream ended.
    pub finish: Option<f64>,
    /// `usage.prompt_tokens`, when the server reported it.
    pub prompt_tokens: Option<u64>,
    /// `usage.completion_tokens`, when the server reported it.
    pub completion_tokens: Option<u64>,
    /// Why the request failed; `None` when it completed.
    pub error: Option<String>,
}

impl Outcome {
    /// Output tokens: the server's count, else the chunks that carried text.
    pub fn output_tokens(&self) -> u64 {
        self.completion_tokens
            .unwrap_or(self.token_times.len() as u64)
    }
}

/// A run that could not start.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The base URL is not one this client can reach.
    #[error("--base-url {0}")]
    BaseUrl(String),
    /// A request body could not be built (a media shape it cannot encode).
    #[error("request {id}: {message}")]
    Body {
        /// The request.
        id: u64,
        /// What failed.
        message: String,
    },
    /// The async runtime could not start.
    #[error("cannot start the client: {0}")]
    Runtime(String),
}

/// The JSON body of `r`: one user message with the text and the items'
/// content parts, streamed, with `max_tokens`, `min_tokens` and `ignore_eos`
/// fixing the output length and `stream_options.include_usage` asking for
/// the token counts.
///
/// # Errors
/// A media shape that cannot be encoded.
pub fn request_body(r: &BenchRequest, cfg: &ClientConfig) -> Result<Vec<u8>, String> {
    let content = match &r.content {
        Some(c) => repeated_parts(r, c, cfg)?,
        None => {
            let mut rng = stream(cfg.seed, &format!("bench-media/{}", r.id));
            let mut content = vec![
                json!({ "type": "text", "text": prompt_text(cfg.seed, r.id, r.prompt_words) }),
            ];
            for item in &r.items {
                content.push(content_part(&mut rng, item, cfg.codec)?);
            }
            content
        }
    };
    let body = json!({
        "model": cfg.model,
        "messages": [{ "role": "user", "content": content }],
        "max_tokens": r.output_tokens,
        "min_tokens": r.output_tokens,
        "ignore_eos": true,
        "temperature": 0.0,
        "stream": true,
        "stream_options": { "include_usage": true },
    });
    serde_json::to_vec(&body).map_err(|e| e.to_string())
}

/// The content parts of a request whose content repeats: its segments in
/// prompt order, each item segment (as the segment names it) as its
/// media part with the bytes drawn from its id (`bench-item/{id:016x}`),
/// each text segment as a text part ([`segment_text`]): a repeated image is
/// the same bytes, a shared system prompt or an earlier turn the same text.
/// One user message carries the whole prompt, earlier turns' answers
/// included, as the twin's prompt has them.
fn repeated_parts(
    r: &BenchRequest,
    c: &easerve_sched::Content,
    cfg: &ClientConfig,
) -> Result<Vec<Value>, String> {
    let ids: Vec<u64> = c.items().map(|i| i.id).collect();
    let mut parts = Vec::with_capacity(c.segments().len());
    for piece in c.pieces() {
        match piece {
            easerve_sched::Piece::Item(k, _) => {
                let mut rng = stream(cfg.seed, &format!("bench-item/{:016x}", ids[k]));
                let item = r
                    .items
                    .get(k)
                    .ok_or("a content item beyond the request's items")?;
                parts.push(content_part(&mut rng, item, cfg.codec)?);
            }
            easerve_sched::Piece::Text(s) => parts
                .push(json!({ "type": "text", "text": segment_text(cfg.seed, s.id, s.tokens) })),
        }
    }
    Ok(parts)
}

/// Check that `base_url` is a plain-HTTP URL this client can reach.
///
/// # Errors
/// Names what is wrong: not a URL, or HTTPS (not built in).
pub fn check_base_url(base_url: &str) -> Result<(), ClientError> {
    let url = reqwest::Url::parse(base_url).map_err(|e| {
        ClientError::BaseUrl(format!(
            "`{base_url}`: not a URL ({e}); e.g. http://127.0.0.1:8000"
        ))
    })?;
    match url.scheme() {
        "http" => Ok(()),
        "https" => Err(ClientError::BaseUrl(format!(
            "`{base_url}`: this build speaks plain HTTP only; reach an HTTPS endpoint through a local proxy"
        ))),
        s => Err(ClientError::BaseUrl(format!("`{base_url}`: scheme `{s}`; use http://"))),
    }
}

/// Send every request of `requests` (in arrival order) and time its stream.
/// Returns one outcome per request, in request order, and the wall time from
/// the start to the last byte received, seconds.
///
/// # Errors
/// A bad base URL, a body that cannot be built, or a runtime that cannot
/// start; a request that fails is an outcome with its `error`, not an error.
pub fn run(
    requests: &[BenchRequest],
    cfg: &ClientConfig,
) -> Result<(Vec<Outcome>, f64), ClientError> {
    check_base_url(&cfg.base_url)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| ClientError::Runtime(e.to_string()))?;
    rt.block_on(send_all(requests, cfg))
}

async fn send_all(
    requests: &[BenchRequest],
    cfg: &ClientConfig,
) -> Result<(Vec<Outcome>, f64), ClientError> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .map_err(|e| ClientError::Runtime(e.to_string()))?;
    let url = format!(
        "{}/{}",
        cfg.base_url.trim_end_matches('/'),
        cfg.endpoint.trim_start_matches('/')
    );
    let bar = cfg.progress.then(|| {
        let pb = indicatif::ProgressBar::new(requests.len() as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} requests  {elapsed}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    });
    // bodies are built on a thread of their own, a bounded queue ahead
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, ClientError>>(8);
    let to_build: Vec<BenchRequest> = requests.to_vec();
    let build_cfg = cfg.clone();
    std::thread::spawn(move || {
        for r in &to_build {
            let body = request_body(r, &build_cfg)
                .map_err(|message| ClientError::Body { id: r.id, message });
            let stop = body.is_err();
            if tx.blocking_send(body).is_err() || stop {
                return;
            }
        }
    });
    let slots = cfg
        .max_concurrency
        .map(|n| Arc::new(Semaphore::new(n.max(1))));
    let timeout = Duration::try_from_secs_f64(cfg.timeout_s)
        .map_err(|e| ClientError::Runtime(format!("timeout {} s: {e}", cfg.timeout_s)))?;
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(requests.len());
    for r in requests {
        let body = rx
            .recv()
            .await
            .unwrap_or_else(|| Err(ClientError::Runtime("the body builder stopped".into())))?;
        let due = Duration::try_from_secs_f64(r.arrival.max(0.0))
            .ok()
            .and_then(|d| start.checked_add(d))
            .ok_or_else(|| {
                ClientError::Runtime(format!("request {}: send time {} s", r.id, r.arrival))
            })?;
        tokio::time::sleep_until(due.into()).await;
        let permit = match &slots {
            Some(s) => Some(s.clone().acquire_owned().await.expect("never closed")),
            None => None,
        };
        let (client, url, bar) = (client.clone(), url.clone(), bar.clone());
        let (id, scheduled) = (r.id, r.arrival);
        tasks.push(tokio::spawn(async move {
            let mut o = Outcome {
                id,
                scheduled,
                sent: start.elapsed().as_secs_f64(),
                ..Outcome::default()
            };
            let res =
                tokio::time::timeout(timeout, stream_one(&client, &url, body, start, &mut o)).await;
            match res {
                Ok(Ok(())) => {}
                Ok(Err(e)) => o.error = Some(e),
                Err(_) => o.error = Some(format!("timed out after {} s", timeout.as_secs_f64())),
            }
            if o.error.is_some() {
                o.finish = None;
            }
            drop(permit);
            if let Some(pb) = &bar {
                pb.inc(1);
            }
            o
        }));
    }
    let mut outcomes = Vec::with_capacity(tasks.len());
    for t in tasks {
        outcomes.push(t.await.map_err(|e| ClientError::Runtime(e.to_string()))?);
    }
    if let Some(pb) = &bar {
        pb.finish_and_clear();
    }
    // as vllm bench serve: from the start until every request is gathered
    Ok((outcomes, start.elapsed().as_secs_f64()))
}

/// Send one body and read its server-sent events until `data: [DONE]`.
async fn stream_one(
    client: &reqwest::Client,
    url: &str,
    body: Vec<u8>,
    start: Instant,
    o: &mut Outcome,
) -> Result<(), String> {
    let resp = client
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .body(body)
        .send()
        .await
        .map_err(|e| format!("connection: {e}"))?;
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| text.chars().take(200).collect());
        return Err(format!("HTTP {}: {message}", status.as_u16()));
    }
    let mut chunks = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| format!("stream: {e}"))?;
        let now = start.elapsed().as_secs_f64();
        // only the new bytes are scanned; complete lines are taken off once
        let scanned = buf.len();
        buf.extend_from_slice(&chunk);
        let mut from = 0;
        let mut done = false;
        for pos in scanned..buf.len() {
            if buf[pos] != b'\n' {
                continue;
            }
            let line = String::from_utf8_lossy(&buf[from..pos]);
            from = pos + 1;
            if on_line(line.trim_end_matches('\r'), now, o)? {
                done = true;
                break;
            }
        }
        buf.drain(..from);
        if done {
            // read to the end, briefly, so the connection can be reused
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                while chunks.next().await.is_some() {}
            })
            .await;
            return Ok(());
        }
        if buf.len() > MAX_LINE_BYTES {
            return Err(format!(
                "a line of the stream longer than {} MiB",
                MAX_LINE_BYTES >> 20
            ));
        }
    }
    Err("the stream ended before `data: [DONE]`".into())
}

/// Longest line of the event stream the client holds, bytes.
const MAX_LINE_BYTES: usize = 16 << 20;

/// Whether a streamed choice carries output, as `vllm bench serve` counts it
/// (`_choice_has_streamed_output` in vLLM 0.33.0's
/// `vllm/benchmarks/lib/endpoint_request_func.py`): text, reasoning or a tool
/// call; or an empty `content` without a `role` (a token that decodes to
/// nothing). The opening chunk, which carries the role, does not count.
fn has_output(choice: &Value) -> bool {
    let Some(delta) = choice.get("delta").and_then(Value::as_object) else {
        // the completions endpoint: `text`
        return choice["text"].as_str().is_some_and(|t| !t.is_empty());
    };
    let set = |k: &str| match delta.get(k) {
        Some(Value::String(t)) => !t.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        _ => false,
    };
    set("content")
        || set("reasoning")
        || set("reasoning_content")
        || set("tool_calls")
        || set("function_call")
        || (delta.get("content") == Some(&Value::String(String::new()))
            && !delta.contains_key("role"))
}

/// One line of the event stream: a `data:` line with a chunk records the
/// arrival of its output and any usage; `data: [DONE]` ends the stream
/// (returns true; the request's end is its last output, as E2EL is measured
/// in `vllm bench serve`); an `error` object fails the request.
fn on_line(line: &str, now: f64, o: &mut Outcome) -> Result<bool, String> {
    let Some(data) = line.strip_prefix("data:") else {
        return Ok(false);
    };
    let data = data.trim();
    if data == "[DONE]" {
        o.finish = o.token_times.last().copied();
        if o.finish.is_none() {
            return Err("the stream carried no output".into());
        }
        return Ok(true);
    }
    let v: Value = serde_json::from_str(data)
        .map_err(|e| format!("a chunk that is not JSON ({e}): {data:.120}"))?;
    if let Some(e) = v.get("error") {
        return Err(format!(
            "error in the stream: {}",
            e["message"].as_str().unwrap_or("(no message)")
        ));
    }
    if has_output(&v["choices"][0]) {
        o.token_times.push(now);
    }
    if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
        o.prompt_tokens = u["prompt_tokens"].as_u64().or(o.prompt_tokens);
        o.completion_tokens = u["completion_tokens"].as_u64().or(o.completion_tokens);
    }
    Ok(false)
}

/// A client of seed `seed` for tests that build request bodies without a
/// server (its URL refuses connections).
#[cfg(test)]
pub(crate) fn offline_config(seed: u64) -> ClientConfig {
    ClientConfig {
        base_url: "http://127.0.0.1:1".into(),
        endpoint: "/v1/chat/completions".into(),
        model: "m".into(),
        max_concurrency: None,
        timeout_s: 1.0,
        codec: ImageCodec::Png,
        seed,
        progress: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use easerve_sched::{Content, ContentItem, MmItem, Segment};

    /// A text segment with the id of the request's next item is sent as
    /// text, not as that item's image: the body follows the segments' kinds.
    #[test]
    fn text_with_an_items_id_is_sent_as_text() {
        let item = ContentItem {
            id: 42,
            encoder_tokens: 10,
            llm_tokens: 8,
        };
        let segments = [
            Segment::text(42, 3),
            Segment::item(0, 42, 8),
            Segment::text(9, 2),
        ];
        let r = BenchRequest {
            id: 0,
            arrival: 0.0,
            items: vec![MmItem::Image {
                height: 28,
                width: 28,
            }],
            prompt_words: 5,
            output_tokens: 1,
            content: Some(Content::new([item].into_iter(), &segments)),
        };
        let cfg = offline_config(1);
        let v: Value = serde_json::from_slice(&request_body(&r, &cfg).unwrap()).unwrap();
        let parts = v["messages"][0]["content"].as_array().unwrap();
        let kinds: Vec<&str> = parts.iter().map(|p| p["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["text", "image_url", "text"]);
        assert_eq!(parts[0]["text"], segment_text(1, 42, 3));
        assert_eq!(parts[2]["text"], segment_text(1, 9, 2));
    }

    #[test]
    fn event_lines_record_output_usage_done_and_errors() {
        let mut o = Outcome::default();
        assert_eq!(on_line(": keep-alive", 0.1, &mut o), Ok(false));
        let role = r#"data: {"choices":[{"delta":{"role":"assistant","content":""}}]}"#;
        assert_eq!(on_line(role, 0.2, &mut o), Ok(false));
        assert!(
            o.token_times.is_empty(),
            "the opening chunk carries no output"
        );
        on_line(
            r#"data: {"choices":[{"delta":{"content":"Hi"}}]}"#,
            0.3,
            &mut o,
        )
        .unwrap();
        on_line(
            r#"data:{"choices":[{"delta":{"reasoning":"hm"}}]}"#,
            0.35,
            &mut o,
        )
        .unwrap();
        on_line(
            r#"data: {"choices":[{"delta":{"content":""}}]}"#,
            0.36,
            &mut o,
        )
        .unwrap();
        on_line(
            r#"data: {"choices":[],"usage":{"prompt_tokens":700,"completion_tokens":3}}"#,
            0.37,
            &mut o,
        )
        .unwrap();
        assert_eq!(o.token_times, vec![0.3, 0.35, 0.36]);
        assert_eq!((o.prompt_tokens, o.output_tokens()), (Some(700), 3));
        // the end is the last output, not the [DONE] line
        assert_eq!(on_line("data: [DONE]", 0.4, &mut o), Ok(true));
        assert_eq!(o.finish, Some(0.36));
        assert!(
            on_line(r#"data: {"error":{"message":"boom"}}"#, 0.5, &mut o)
                .unwrap_err()
                .contains("boom")
        );
        assert!(on_line("data: {not json", 0.5, &mut o).is_err());
        let mut empty = Outcome::default();
        assert!(on_line("data: [DONE]", 0.1, &mut empty).is_err());
    }

    #[test]
    fn only_plain_http_urls_are_taken() {
        assert!(check_base_url("http://127.0.0.1:8000").is_ok());
        for bad in ["https://example.com", "127.0.0.1:8000", "ftp://x"] {
            assert!(check_base_url(bad).is_err(), "{bad}");
        }
    }
}
