//! The OpenAI chat-completions request and response bodies `easerve serve`
//! reads and writes: parsing a request into a scheduler [`Request`] and its
//! decoded media, with an OpenAI-style error naming what is wrong, and the
//! JSON of completions, stream chunks and errors.
//!
//! Accepted content parts (`messages[i].content` is a string or a list):
//! * `{"type": "text", "text": "…"}`;
//! * `{"type": "image_url", "image_url": {"url": "data:image/png;base64,…"}}`
//!   (PNG or JPEG);
//! * `{"type": "input_audio", "input_audio": {"data": "…", "format": "wav"}}`
//!   (base64 WAV);
//! * video as frames, either `{"type": "video_url", "video_url": {"url":
//!   "data:video/jpeg;base64,F1,F2,…"}}` (vLLM's frame form: base64 JPEG or
//!   PNG frames joined by commas) or `{"type": "video", "video": ["data:image/…;base64,…", …]}`
//!   (one image data URL per frame).
//!
//! Remote `http(s)` URLs are refused: the server fetches nothing.
//!
//! Token counts: the executor's models carry seeded random weights and no
//! tokenizer, so a text prompt counts one token per whitespace-separated word
//! (what `easerve bench` sends: one word per token of the scenario), and the
//! multimodal tokens are the model's own count for each item's shape
//! ([`easerve_workload::generate::item_tokens`]).
//!
//! The prompt ([`Request::content`]) is the messages in order, each
//! message's parts in the order sent: each medium its embeddings, each text
//! part a segment keyed by the SHA-256 of its role and text ([`text_key`])
//! whose tokens the prefill worker draws from that key. Equal text is so
//! equal tokens, and the prefix cache's hash chain finds a system prompt
//! or a conversation's earlier turns that another request sent before.
//!
//! A completion's text is its
//! token ids, one ` {id}` per token; it always runs to its `max_tokens` (the
//! models have no end-of-sequence token), so `ignore_eos` and `min_tokens` are
//! accepted and change nothing.

use base64::Engine;
use easerve_model::ModelArch;
use easerve_sched::limits::decoded_bytes;
use easerve_sched::{
    Content, ContentItem, LimitExceeded, Limits, MmItem, Modality, Request, Segment,
};
use serde_json::{json, Value};

use crate::input::{ItemKeying, Media};
use crate::wire::WireMedia;

/// What is wrong with a request, as an HTTP status and an OpenAI-style error.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// HTTP status: 400 (bad request), 404 (unknown model), 408 (the
    /// request's deadline passed: aborted), 429 (admission),
    /// 500 (the request failed in the server), 503 (starting or shutting down).
    pub status: u16,
    /// What is wrong, naming the field.
    pub message: String,
}

impl ApiError {
    /// A 400 naming what is wrong.
    pub fn bad(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
        }
    }

    /// The error type OpenAI's SDKs map the status to.
    pub fn kind(&self) -> &'static str {
        match self.status {
            400 => "BadRequestError",
            404 => "NotFoundError",
            413 => "RequestTooLargeError",
            408 => "APIStatusError",
            429 => "RateLimitError",
            503 => "ServiceUnavailableError",
            _ => "InternalServerError",
        }
    }

    /// The body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": null,
                "code": self.status,
            }
        })
    }
}

/// What the server knows of its model to check a request against.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// The name clients put in `model` (the scenario's model preset).
    pub name: String,
    /// Its architecture (token counts per item).
    pub arch: ModelArch,
    /// The most tokens (prompt + completion) one request may hold: the
    /// scenario's `limits.max_model_len`, at most one more than the longest
    /// context a decode worker's empty KV cache admits
    /// (`DecodeScheduler::max_context_tokens`, the rule by which the
    /// controller fails a request whose cache can never fit).
    pub max_model_len: u64,
    /// What one request may ask for ([`Limits`]; its `max_model_len` is the
    /// one above): checked while the body is read, each item counted before
    /// it is decoded, so a request over a limit costs no worker.
    pub limits: Limits,
    /// Completion tokens when a request sets no `max_tokens` (the scenario's
    /// `workload.output_len`).
    pub default_max_tokens: u32,
    /// How media items are keyed for the encoder and prefix caches when
    /// either (or the shared store) is on; `None` hashes no medium (each
    /// item then has an id of its own, [`unique_items`]). Text parts are
    /// always keyed by their content ([`text_key`]): their tokens are drawn
    /// from it.
    pub item_keys: Option<ItemKeying>,
}

/// A parsed, checked chat-completions request.
#[derive(Clone, Debug)]
pub struct ChatRequest {
    /// The scheduler's view (id and arrival are set when it is admitted).
    pub request: Request,
    /// Decoded media, one per item.
    pub media: Vec<WireMedia>,
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `timeout`, seconds after its arrival at which the request is aborted
    /// if it has not finished (an easerve extension; at most
    /// [`MAX_TIMEOUT_S`]); `None`: the scenario's `workload.timeout_s`, if any.
    pub timeout_s: Option<f64>,
}

/// The longest `timeout` a request may give, seconds (one day).
pub const MAX_TIMEOUT_S: f64 = 86_400.0;

/// Parse and check one `POST /v1/chat/completions` body, decoding its media.
///
/// # Errors
/// 400 for malformed JSON, a missing or wrong field, broken base64, an
/// undecodable or unsupported medium, a remote URL, a modality the model
/// has no encoder for, or more tokens than the model holds; 404 for another
/// model's name.
pub fn parse_chat(body: &[u8], model: &ModelInfo) -> Result<ChatRequest, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad(format!("malformed JSON body: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| ApiError::bad("the body must be a JSON object"))?;
    check_model(obj.get("model"), model)?;
    let stream = flag(obj.get("stream"), "stream")?;
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => flag(o.get("include_usage"), "stream_options.include_usage")?,
        Some(_) => return Err(ApiError::bad("`stream_options` must be an object")),
    };
    flag(obj.get("ignore_eos"), "ignore_eos")?;
    let timeout_s = timeout(obj.get("timeout"))?;
    let max_tokens = match (obj.get("max_completion_tokens"), obj.get("max_tokens")) {
        (Some(v), _) if !v.is_null() => count(v, "max_completion_tokens")?,
        (_, Some(v)) if !v.is_null() => count(v, "max_tokens")?,
        _ => model.default_max_tokens,
    };
    if let Some(v) = obj.get("min_tokens").filter(|v| !v.is_null()) {
        let min = v
            .as_u64()
            .ok_or_else(|| ApiError::bad("`min_tokens` must be a whole number ≥ 0"))?;
        if min > u64::from(max_tokens) {
            return Err(ApiError::bad(format!(
                "`min_tokens` {min} is more than the {max_tokens} completion tokens asked for"
            )));
        }
    }
    let messages = obj
        .get("messages")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::bad("`messages` must be a non-empty list"))?;
    let Messages {
        words,
        media,
        raw_keys,
        order,
    } = read_messages(messages, model)?;
    let prompt_tokens = u32::try_from(words)
        .map_err(|_| ApiError::bad(format!("the prompt's {words} words are too many")))?;
    let items: Vec<MmItem> = media.iter().map(Media::item).collect();
    for (k, it) in items.iter().enumerate() {
        model.limits.check_item(k, it).map_err(refused)?;
    }
    if let Some(limit) = model.limits.max_media_bytes {
        let bytes: u64 = items.iter().map(decoded_bytes).sum();
        if bytes > limit {
            return Err(refused(LimitExceeded::MediaBytes { bytes, limit }));
        }
    }
    let mut content_items = Vec::with_capacity(items.len());
    let (mut encoder_tokens, mut mm_tokens) = (0u64, 0u64);
    for (k, it) in items.iter().enumerate() {
        let t = easerve_workload::generate::item_tokens(&model.arch, it).map_err(|e| {
            ApiError::bad(format!(
                "multimodal item {k} ({it:?}) does not suit model `{}`: {e}",
                model.name
            ))
        })?;
        encoder_tokens += t.encoder_tokens;
        mm_tokens += t.llm_tokens;
        content_items.push(ContentItem {
            id: match model.item_keys {
                Some(ItemKeying::Raw) => raw_keys[k],
                Some(ItemKeying::Decoded) => media[k].content_key(),
                None => UNKEYED_ITEM,
            },
            encoder_tokens: t.encoder_tokens as u32,
            llm_tokens: t.llm_tokens as u32,
        });
    }
    let limits = Limits {
        max_model_len: Some(model.max_model_len),
        ..model.limits.clone()
    };
    limits
        .check_tokens(u64::from(prompt_tokens) + mm_tokens, u64::from(max_tokens))
        .map_err(refused)?;
    Ok(ChatRequest {
        request: Request {
            id: 0,
            arrival: 0.0,
            items: items.into(),
            prompt_tokens,
            output_tokens: max_tokens,
            encoder_tokens,
            mm_tokens,
            content: Some(prompt_content(content_items, &order)),
        },
        media: media.iter().map(WireMedia::of).collect(),
        stream,
        include_usage,
        timeout_s,
    })
}

/// The body's `model`, if given, must name the served model (404 otherwise,
/// as vLLM answers).
fn check_model(v: Option<&Value>, model: &ModelInfo) -> Result<(), ApiError> {
    match v {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if *m == model.name => Ok(()),
        Some(Value::String(m)) => Err(ApiError {
            status: 404,
            message: format!(
                "The model `{m}` does not exist; this server serves `{}`",
                model.name
            ),
        }),
        Some(_) => Err(ApiError::bad("`model` must be a string")),
    }
}

/// The body's `timeout`: seconds in (0, [`MAX_TIMEOUT_S`]], or none.
fn timeout(v: Option<&Value>) -> Result<Option<f64>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|t| *t > 0.0 && *t <= MAX_TIMEOUT_S)
            .map(Some)
            .ok_or_else(|| {
                ApiError::bad(format!(
                    "`timeout` must be a number of seconds in (0, {MAX_TIMEOUT_S}], not {v}"
                ))
            }),
    }
}

/// What a request's messages hold, read in the order the client sent them.
struct Messages {
    /// Words of all text parts (one token each).
    words: u64,
    /// Each medium, decoded, in order.
    media: Vec<Media>,
    /// Each medium's key over its part as sent ([`ItemKeying::Raw`] only).
    raw_keys: Vec<u64>,
    /// The prompt in order: each text part as a segment ([`text_key`], its
    /// words), `None` for the next medium.
    order: Vec<Option<Segment>>,
}

/// Read `messages` in order (each message's role checked, each content
/// part read and its medium decoded), counting media against the limits
/// before decoding them.
fn read_messages(messages: &[Value], model: &ModelInfo) -> Result<Messages, ApiError> {
    let mut out = Messages {
        words: 0,
        media: Vec::new(),
        raw_keys: Vec::new(),
        order: Vec::new(),
    };
    let mut modalities: Vec<Modality> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let at = format!("messages[{i}]");
        let m = m
            .as_object()
            .ok_or_else(|| ApiError::bad(format!("{at} must be an object")))?;
        let role = match m.get("role").and_then(Value::as_str) {
            Some(r @ ("system" | "user" | "assistant" | "developer" | "tool")) => r,
            Some(r) => {
                return Err(ApiError::bad(format!(
                    "{at}.role `{r}` is not one of system, user, assistant, developer, tool"
                )))
            }
            None => return Err(ApiError::bad(format!("{at}.role is missing"))),
        };
        match m.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(t)) => out.text(role, t),
            Some(Value::Array(parts)) => {
                for (j, part) in parts.iter().enumerate() {
                    let at = format!("{at}.content[{j}]");
                    // counted before it is decoded: the 1,000th image costs nothing
                    if let Some(m) = part_modality(part) {
                        modalities.push(m);
                        model.limits.check_counts(&modalities).map_err(refused)?;
                    }
                    match content_part(part, &at)? {
                        Part::Text(t) => out.text(role, t),
                        Part::Media(x) => {
                            if model.item_keys == Some(ItemKeying::Raw) {
                                // the part as the client sent it: its base64 payload
                                out.raw_keys
                                    .push(crate::input::content_key([part.to_string().as_bytes()]));
                            }
                            out.media.push(x);
                            out.order.push(None);
                        }
                    }
                }
            }
            Some(_) => {
                return Err(ApiError::bad(format!(
                    "{at}.content must be a string or a list of parts"
                )))
            }
        }
    }
    Ok(out)
}

impl Messages {
    /// A text part `text` of a message of `role`: its words, and a segment
    /// of them unless it has none.
    fn text(&mut self, role: &str, text: &str) {
        let words = text.split_whitespace().count() as u64;
        self.words += words;
        if words > 0 {
            // at most the prompt's words, which must fit in u32
            let tokens = words.min(u64::from(u32::MAX)) as u32;
            self.order
                .push(Some(Segment::text(text_key(role, text), tokens)));
        }
    }
}

/// The content id of a text part: the first 8 bytes of the SHA-256 of
/// `text` and the `role` of its message ([`crate::input::content_key`]
/// over `"text"`, the role and the text). Equal text from the same role is
/// then one segment in every request of every client, its tokens drawn from
/// this id by the prefill worker (the models have no tokenizer; stream
/// `exec-segment/{id}` of the run's seed, as `easerve exec` draws a
/// scenario's segments), so a shared system prompt or a conversation's
/// resent turns are the same tokens and the same hash-chain keys.
pub fn text_key(role: &str, text: &str) -> u64 {
    crate::input::content_key([&b"text"[..], role.as_bytes(), text.as_bytes()])
}

/// The prompt's content: its `items` (content ids and tokens, in order)
/// and its segments in `order` (text parts, and for each `None` the next
/// item's embeddings, marked as that item whatever the text ids).
fn prompt_content(items: Vec<ContentItem>, order: &[Option<Segment>]) -> Content {
    let mut next = items.iter().enumerate();
    let segments: Vec<Segment> = order
        .iter()
        .filter_map(|s| match s {
            Some(s) => Some(*s),
            None => next
                .next()
                .map(|(k, i)| Segment::item(k as u32, i.id, i.llm_tokens)),
        })
        .collect();
    Content::new(items.into_iter(), &segments)
}

/// Placeholder content id of an item the server does not key (every cache
/// off: nothing is hashed) until its request has a ticket.
const UNKEYED_ITEM: u64 = u64::MAX;

/// Give request `r`'s unkeyed items (every cache off, [`ModelInfo::item_keys`]
/// `None`) content ids derived from `unique` (a number no other request of
/// the server has) and their index, so no other request shares them.
pub fn unique_items(r: &mut Request, unique: u64) {
    let Some(c) = r.content.as_mut() else {
        return;
    };
    if c.items().all(|i| i.id != UNKEYED_ITEM) {
        return;
    }
    let base = easerve_sched::cache::mix(UNKEYED_ITEM, unique);
    let mut parts = c.parts();
    let ids = (0u64..).map(|k| easerve_sched::cache::mix(base, k));
    for (i, id) in parts
        .items
        .iter_mut()
        .filter(|i| i.id == UNKEYED_ITEM)
        .zip(ids)
    {
        i.id = id;
    }
    // each item's segment takes its item's id; text keeps its own
    for s in &mut parts.segments {
        if let Some(k) = s.item {
            s.id = parts.items[k as usize].id;
        }
    }
    *c = Content::new(parts.items.into_iter(), &parts.segments);
}

fn flag(v: Option<&Value>, name: &str) -> Result<bool, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::bad(format!("`{name}` must be true or false"))),
    }
}

fn count(v: &Value, name: &str) -> Result<u32, ApiError> {
    v.as_u64()
        .filter(|&n| n >= 1)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| ApiError::bad(format!("`{name}` must be a whole number ≥ 1, not {v}")))
}

enum Part<'a> {
    Text(&'a str),
    Media(Media),
}

/// A request over a limit: a 400 that names the limit and its value.
fn refused(e: LimitExceeded) -> ApiError {
    ApiError::bad(e.to_string())
}

/// The modality of a content part that carries a medium, from its `type`.
fn part_modality(part: &Value) -> Option<Modality> {
    match part.get("type").and_then(Value::as_str)? {
        "image_url" => Some(Modality::Image),
        "input_audio" => Some(Modality::Audio),
        "video_url" | "video" => Some(Modality::Video),
        _ => None,
    }
}

fn content_part<'a>(part: &'a Value, at: &str) -> Result<Part<'a>, ApiError> {
    let ty = part
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad(format!("{at}.type is missing")))?;
    let field = |name: &str| {
        part.get(name)
            .ok_or_else(|| ApiError::bad(format!("{at}: a `{ty}` part needs `{name}`")))
    };
    match ty {
        "text" => Ok(Part::Text(field("text")?.as_str().ok_or_else(|| {
            ApiError::bad(format!("{at}.text must be a string"))
        })?)),
        "image_url" => {
            let url = url_of(field("image_url")?, &format!("{at}.image_url"))?;
            Ok(Part::Media(Media::Image(image_url(
                url,
                &format!("{at}.image_url.url"),
            )?)))
        }
        "input_audio" => {
            let a = field("input_audio")?;
            let at = format!("{at}.input_audio");
            match a.get("format").and_then(Value::as_str) {
                Some("wav") => {}
                Some(f) => {
                    return Err(ApiError::bad(format!(
                        "{at}.format `{f}` is not supported: send WAV (`wav`)"
                    )))
                }
                None => return Err(ApiError::bad(format!("{at}.format is missing (`wav`)"))),
            }
            let data = a
                .get("data")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::bad(format!("{at}.data must be a base64 string")))?;
            let bytes = base64_bytes(data, &format!("{at}.data"))?;
            Media::wav_bytes(&bytes)
                .map(Part::Media)
                .map_err(|e| ApiError::bad(format!("{at}.data is not a readable WAV file: {e}")))
        }
        "video_url" => {
            let at = format!("{at}.video_url.url");
            let url = url_of(field("video_url")?, &at)?;
            let (mime, data) = data_url(url, &at)?;
            if !matches!(mime, "video/jpeg" | "video/png") {
                return Err(ApiError::bad(format!(
                    "{at}: media type `{mime}` is not supported: send frames as `data:video/jpeg;base64,F1,F2,…` (or video/png)"
                )));
            }
            let frames = data
                .split(',')
                .enumerate()
                .map(|(k, f)| {
                    rgb(
                        &base64_bytes(f, &format!("{at} frame {k}"))?,
                        &format!("{at} frame {k}"),
                    )
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Part::Media(Media::Video(frames)))
        }
        "video" => {
            let list = field("video")?
                .as_array()
                .filter(|l| !l.is_empty())
                .ok_or_else(|| {
                    ApiError::bad(format!(
                        "{at}.video must be a non-empty list of image data URLs"
                    ))
                })?;
            let frames = list
                .iter()
                .enumerate()
                .map(|(k, f)| {
                    let at = format!("{at}.video[{k}]");
                    let url = f
                        .as_str()
                        .ok_or_else(|| ApiError::bad(format!("{at} must be an image data URL")))?;
                    image_url(url, &at)
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Part::Media(Media::Video(frames)))
        }
        other => Err(ApiError::bad(format!(
            "{at}.type `{other}` is not supported (text, image_url, input_audio, video_url, video)"
        ))),
    }
}

/// `{"url": "…"}` or a bare string.
fn url_of<'a>(v: &'a Value, at: &str) -> Result<&'a str, ApiError> {
    v.get("url")
        .and_then(Value::as_str)
        .or_else(|| v.as_str())
        .ok_or_else(|| ApiError::bad(format!("{at}.url must be a string")))
}

/// `(media type, payload)` of a base64 data URL.
fn data_url<'a>(url: &'a str, at: &str) -> Result<(&'a str, &'a str), ApiError> {
    if url.starts_with("http://") || url.starts_with("https://") {
        return Err(ApiError::bad(format!(
            "{at}: remote URLs are not fetched by this server; send the media inline as a base64 data URL (data:image/png;base64,…)"
        )));
    }
    let rest = url.strip_prefix("data:").ok_or_else(|| {
        ApiError::bad(format!(
            "{at} must be a base64 data URL (data:<type>;base64,…)"
        ))
    })?;
    let (head, data) = rest
        .split_once(',')
        .ok_or_else(|| ApiError::bad(format!("{at}: a data URL needs a comma before its data")))?;
    let mime = head.strip_suffix(";base64").ok_or_else(|| {
        ApiError::bad(format!(
            "{at}: only base64 data URLs are read (data:<type>;base64,…)"
        ))
    })?;
    Ok((mime, data))
}

fn image_url(url: &str, at: &str) -> Result<image::RgbImage, ApiError> {
    let (mime, data) = data_url(url, at)?;
    if !matches!(mime, "image/png" | "image/jpeg" | "image/jpg") {
        return Err(ApiError::bad(format!(
            "{at}: media type `{mime}` is not supported (image/png or image/jpeg)"
        )));
    }
    rgb(&base64_bytes(data, at)?, at)
}

fn rgb(bytes: &[u8], at: &str) -> Result<image::RgbImage, ApiError> {
    Media::rgb_bytes(bytes)
        .map_err(|e| ApiError::bad(format!("{at} is not a readable PNG or JPEG image: {e}")))
}

fn base64_bytes(data: &str, at: &str) -> Result<Vec<u8>, ApiError> {
    base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| ApiError::bad(format!("{at}: invalid base64: {e}")))
}

/// A token as completion text: ` {id}`.
pub fn token_text(tok: u32) -> String {
    format!(" {tok}")
}

/// One `chat.completion.chunk` with `delta` and `finish_reason`.
pub fn chunk(id: &str, created: u64, model: &str, delta: Value, finish: Option<&str>) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish }],
    })
}

/// The `usage` object.
pub fn usage(prompt: u64, completion: u64) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

/// A whole `chat.completion` (non-streaming answer).
pub fn completion(
    id: &str,
    created: u64,
    model: &str,
    text: &str,
    prompt: u64,
    completion_tokens: u64,
) -> Value {
    json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": text },
            "logprobs": null,
            "finish_reason": "length",
        }],
        "usage": usage(prompt, completion_tokens),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> ModelInfo {
        ModelInfo {
            name: "tiny-image".into(),
            arch: ModelArch::preset("tiny-image").unwrap(),
            max_model_len: 4096,
            limits: Limits::default(),
            default_max_tokens: 4,
            item_keys: None,
        }
    }

    fn png(w: u32, h: u32) -> String {
        let img = image::RgbImage::from_pixel(w, h, image::Rgb([10, 20, 30]));
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, image::ImageFormat::Png).unwrap();
        base64::engine::general_purpose::STANDARD.encode(out.into_inner())
    }

    #[test]
    fn a_text_and_image_request_counts_words_and_the_models_image_tokens() {
        let body = json!({
            "model": "tiny-image",
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "describe this  picture please"},
                {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", png(224, 224))}},
            ]}],
            "max_tokens": 3,
            "stream": true,
        });
        let r = parse_chat(body.to_string().as_bytes(), &tiny()).unwrap();
        assert_eq!(r.request.prompt_tokens, 4);
        assert_eq!(r.request.output_tokens, 3);
        // tiny-image: a 224×224 image is 336 LLM tokens (presets.rs)
        assert_eq!(r.request.mm_tokens, 336);
        assert_eq!(
            r.request.items.as_slice(),
            [MmItem::Image {
                height: 224,
                width: 224
            }]
        );
        assert!(r.stream && !r.include_usage);
    }

    /// Text parts are segments keyed by role and text, in message order
    /// with the media; unkeyed items get ids of their own per request.
    #[test]
    fn text_is_keyed_by_role_and_content_in_message_order() {
        let image = format!("data:image/png;base64,{}", png(224, 224));
        let parse = |system: &str, role: &str| {
            let body = json!({"messages": [
                {"role": "system", "content": system},
                {"role": role, "content": [
                    {"type": "text", "text": "look at"},
                    {"type": "image_url", "image_url": {"url": image}},
                    {"type": "text", "text": "this one"},
                ]},
            ]});
            parse_chat(body.to_string().as_bytes(), &tiny())
                .unwrap()
                .request
        };
        let (mut a, mut b) = (parse("be brief", "user"), parse("be brief", "user"));
        let segments = |r: &Request| r.content.as_ref().unwrap().segments().collect::<Vec<_>>();
        let tokens: Vec<u32> = segments(&a).iter().map(|s| s.tokens).collect();
        assert_eq!(tokens, [2, 2, 336, 2]);
        assert_eq!(segments(&a)[0].id, text_key("system", "be brief"));
        assert_eq!(segments(&a)[3].id, text_key("user", "this one"));
        assert_ne!(text_key("user", "be brief"), text_key("system", "be brief"));
        unique_items(&mut a, 1);
        unique_items(&mut b, 2);
        let (sa, sb) = (segments(&a), segments(&b));
        // the text is shared, the unkeyed image is each request's own
        assert_eq!((sa[0], sa[1], sa[3]), (sb[0], sb[1], sb[3]));
        assert_ne!(sa[2].id, sb[2].id);
        let item = a.content.as_ref().unwrap().items().next().unwrap();
        assert_eq!(item.id, sa[2].id);
        let pieces: Vec<_> = a.content.as_ref().unwrap().pieces().collect();
        assert_eq!(pieces[2], easerve_sched::Piece::Item(0, 336));
        // the chain: equal keys up to the image, then another system prompt
        // or role parts ways from the first link
        let keys = |r: &Request| r.content.as_ref().unwrap().keys().to_vec();
        assert_eq!(keys(&a)[..2], keys(&b)[..2]);
        assert_ne!(keys(&a)[0], keys(&parse("be short", "user"))[0]);
        assert_ne!(keys(&a)[1], keys(&parse("be brief", "assistant"))[1]);
    }

    /// Issue 29: a text part whose key equals an item's content id (a
    /// client can search for such text) was taken for the item when the
    /// prompt was built; the prompt's parts now follow the message order.
    #[test]
    fn text_keyed_like_an_item_stays_text_in_the_prompt() {
        let item = ContentItem {
            id: 42,
            encoder_tokens: 360,
            llm_tokens: 336,
        };
        let order = [Some(Segment::text(42, 3)), None, Some(Segment::text(9, 2))];
        let c = prompt_content(vec![item], &order);
        let pieces: Vec<_> = c.pieces().collect();
        assert_eq!(
            pieces,
            [
                easerve_sched::Piece::Text(Segment::text(42, 3)),
                easerve_sched::Piece::Item(0, 336),
                easerve_sched::Piece::Text(Segment::text(9, 2)),
            ]
        );
        assert_eq!(
            crate::wire::PromptPart::of(&c),
            [
                crate::wire::PromptPart::Text { id: 42, tokens: 3 },
                crate::wire::PromptPart::Item { tokens: 336 },
                crate::wire::PromptPart::Text { id: 9, tokens: 2 },
            ]
        );
        // an unkeyed item gets a fresh id; text keyed like the placeholder keeps its own
        let unkeyed = ContentItem {
            id: UNKEYED_ITEM,
            ..item
        };
        let order = [Some(Segment::text(UNKEYED_ITEM, 3)), None];
        let mut r = parse_chat(
            json!({"messages": [{"role": "user", "content": "hi"}]})
                .to_string()
                .as_bytes(),
            &tiny(),
        )
        .unwrap()
        .request;
        r.content = Some(prompt_content(vec![unkeyed], &order));
        unique_items(&mut r, 5);
        let c = r.content.as_ref().unwrap();
        let segs: Vec<Segment> = c.segments().collect();
        let id = c.items().next().unwrap().id;
        assert_ne!(id, UNKEYED_ITEM);
        assert_eq!(
            segs,
            [Segment::text(UNKEYED_ITEM, 3), Segment::item(0, id, 336)]
        );
    }

    #[test]
    fn each_bad_request_names_what_is_wrong() {
        let m = tiny();
        let case = |body: &str| parse_chat(body.as_bytes(), &m).unwrap_err();
        assert!(case("{not json").message.contains("malformed JSON"));
        assert_eq!(
            case(r#"{"model":"other","messages":[{"role":"user","content":"hi"}]}"#).status,
            404
        );
        assert!(case(r#"{"messages":[]}"#).message.contains("messages"));
        let e = case(
            r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,@@@"}}]}]}"#,
        );
        assert!(
            e.message
                .contains("messages[0].content[0].image_url.url: invalid base64"),
            "{}",
            e.message
        );
        let e = case(
            r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}]}]}"#,
        );
        assert!(
            e.message.contains("remote URLs are not fetched"),
            "{}",
            e.message
        );
        let e = case(
            r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/gif;base64,AAAA"}}]}]}"#,
        );
        assert!(e.message.contains("image/gif"), "{}", e.message);
        let e = case(r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":5000}"#);
        assert!(
            e.message.contains("maximum context length is 4096"),
            "{}",
            e.message
        );
        let e = case(
            r#"{"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}}]}]}"#,
        );
        assert!(e.message.contains("not a readable WAV"), "{}", e.message);
        assert!(
            case(r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":0}"#)
                .message
                .contains("max_tokens")
        );
    }
}
