//! `easerve serve`: the executor behind an OpenAI-compatible HTTP server.
//!
//! The same [`Controller`] and worker processes as `easerve exec`; the only
//! difference is where requests come from. Each `POST /v1/chat/completions`
//! is parsed and its media decoded for real ([`crate::openai`]), then handed
//! to the driver loop, which adds it to the controller
//! ([`Controller::add_request`]) as an arrival at that instant; the tokens
//! the prefill and decode workers emit are streamed back as they come.
//!
//! Endpoints:
//! * `POST /v1/chat/completions` (streaming as server-sent events, or not);
//! * `GET /v1/models`, `GET /health` (200 once the workers are up and while
//!   every stage has a live worker; 503 while they start, while a stage's
//!   workers are all dead or restarting, and once the server drains);
//! * `GET /metrics` in the Prometheus (OpenMetrics) text format, with vLLM's
//!   names ([`Metrics`]).
//!
//! Status codes: 400 for a bad request (the body names the field), 404 for
//! another model's name, 408 when a body is not received in time or a
//! request's deadline passes, 413 for a body over 256 MiB, 429 when
//! admission control turns a request away, 500 when a request fails in the server (a
//! worker died), 503 while the workers start and once the server drains.
//!
//! Cancellation: a client that disconnects (its handler's future or its
//! event stream is dropped, [`Abandoned`]) aborts its request, and so does
//! one whose deadline passes (its body's `timeout`, or the scenario's
//! `workload.timeout_s`; answered 408): the controller takes it out of every
//! queue and stops its work at the next step boundary
//! ([`easerve_sched::Event::Abort`]). The socket's own limits (header and
//! body read timeouts, a cap on connections) are [`crate::socket`]'s.
//!
//! Shutdown: on SIGTERM or Ctrl-C (or `--time-limit`) the server stops
//! accepting (503), lets every request in flight finish, stops the workers
//! and hands back the report of what it served.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use easerve_calib::StageCost;
use easerve_sched::{Controller, RequestId, RequestRecord};
use easerve_workload::generate::generate_with_tokens;
use easerve_workload::Scenario;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::sync::mpsc;

use crate::openai::{self, ApiError, ChatRequest, ModelInfo};
use crate::run::Incoming;
use crate::run::{
    build_report, shut_down, start_workers, DetectAt, ExecError, ExecOptions, ExecOutput, Fault,
    KillPlan, Links, Pool, Relay,
};
use crate::socket::SocketLimits;
use crate::wire::WireMedia;

/// The largest request body read: 256 MiB (a few dozen base64 video frames).
pub const MAX_BODY_BYTES: usize = 256 << 20;

/// How to serve.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Workers, device, threads, startup timeout, fault injection; the time
    /// limit starts the drain that many seconds after the workers are up.
    pub exec: ExecOptions,
    /// Address to listen on (port 0: any free port).
    pub listen: SocketAddr,
    /// Keep the decision log (`--decisions FILE`); it grows with every
    /// request, so it is off unless asked for.
    pub log_decisions: bool,
    /// Header and body read timeouts, and the cap on connections.
    pub socket: SocketLimits,
}

const STARTING: u8 = 0;
const READY: u8 = 1;
const DRAINING: u8 = 2;

/// What the driver tells one request's handler, in order: `Accepted` or
/// `Rejected` first, then tokens, then `Done` or `Failed`.
#[derive(Debug)]
pub(crate) enum Out {
    Accepted,
    Rejected(String),
    Token(u32),
    Done,
    Failed(String),
    /// Its deadline passed (408).
    Aborted(String),
}

/// A parsed request on its way to the driver, and where its answer goes.
pub(crate) struct Submission {
    pub(crate) chat: ChatRequest,
    pub(crate) reply: mpsc::UnboundedSender<Out>,
    /// When its body was received: its arrival (decoding the media is part
    /// of serving it, as `t_pre` is of an encode pass's cost).
    pub(crate) received: Instant,
    /// What its handler sends back when its client leaves ([`Abandoned`]).
    pub(crate) ticket: u64,
}

/// Held by a request's handler (and its event stream) from its submission:
/// dropped before the request ended, because the client went away and
/// hyper dropped the handler's future or the response stream, it tells the
/// driver, which aborts the request. A drop after the end is ignored (the
/// driver forgot the ticket when it sent the end).
pub(crate) struct Abandoned {
    ticket: u64,
    tx: mpsc::UnboundedSender<u64>,
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        let _ = self.tx.send(self.ticket);
    }
}

/// The server's metrics, registered under vLLM's names where vLLM has one
/// (vLLM V1's `vllm/v1/metrics/loggers.py`, whose bucket bounds these
/// histograms copy: TTFT, inter-token and request-latency grids, the same in
/// published `/metrics` of vLLM 0.10 to 0.30; not checked against 0.33.0's
/// source) and under `easerve:` for the encode stage:
///
/// | name | kind | what |
/// |---|---|---|
/// | `vllm:time_to_first_token_seconds` | histogram | TTFT, observed when a request's first token goes out |
/// | `vllm:inter_token_latency_seconds` | histogram | each gap between two of a request's tokens |
/// | `vllm:time_per_output_token_seconds` | histogram | the same gaps (vLLM's older name for them) |
/// | `vllm:request_time_per_output_token_seconds` | histogram | TPOT of each completed request with more than one output token, (E2E − TTFT)/(output − 1) |
/// | `vllm:e2e_request_latency_seconds` | histogram | E2E of each completed request |
/// | `vllm:request_queue_time_seconds` | histogram | arrival to the start of a completed request's first stage (encode pass, or prefill batch for text) |
/// | `vllm:num_requests_running` | gauge | admitted requests past their queues |
/// | `vllm:num_requests_waiting` | gauge | requests in an encode, prefill or decode queue |
/// | `vllm:request_success_total` | counter | completed requests |
/// | `easerve:request_failure_total` | counter | requests that failed in the server |
/// | `easerve:request_rejected_total` | counter | requests turned away by admission (429) |
/// | `easerve:request_aborted_total` | counter | requests aborted: the client disconnected or the deadline passed (vLLM V1 has no counter of its own: it counts them in `vllm:request_success_total{finished_reason="abort"}`, `vllm/v1/metrics/loggers.py`) |
/// | `vllm:kv_cache_usage_perc` | gauge | fraction of the decode workers' KV blocks in use (1 = full) |
/// | `easerve:encode_queue_length` | gauge | requests waiting for an encode pass, all encode workers |
/// | `easerve:encode_micro_batch_size` | histogram | requests per encode pass |
/// | `easerve:encode_sm_share` | gauge | SM (thread) share of the latest encode pass |
/// | `easerve:prefill_offload_fraction` | gauge | realised share of prefills routed to remote workers (the offload ratio s) |
/// | `easerve:worker_deaths_total` | counter | worker deaths (exits, kills, missed heartbeats; a restart that dies while loading counts again) |
/// | `easerve:worker_restarts_total` | counter | restarts that brought a worker back (its model loaded, it rejoined) |
/// | `easerve:workers_down` | gauge | workers dead now (restarting or not): 0 at full capacity |
/// | `easerve:degraded_seconds` | gauge | seconds so far with at least one worker dead |
/// | `easerve:stage_down_seconds` | gauge | seconds so far with some stage having no live worker (`/health` 503) |
/// | `vllm:prefix_cache_queries_total` | counter | prompt tokens looked up in the prefill workers' prefix caches (0 with it off) |
/// | `vllm:prefix_cache_hits_total` | counter | of which found cached |
/// | `easerve:encoder_cache_queries_total` | counter | media items looked up in the encode workers' encoder caches (0 with it off) |
/// | `easerve:encoder_cache_hits_total` | counter | of which held (their encode skipped) |
/// | `easerve:encoder_cache_usage_bytes` | gauge | bytes of embeddings the encoder caches hold (the directory's sizes: LLM tokens × hidden size × dtype bytes) |
///
/// Times are seconds from a request's arrival (its body received) at the
/// server. Every label set carries `model_name`.
pub struct Metrics {
    registry: Registry,
    ttft: Histogram,
    itl: Histogram,
    tpot: Histogram,
    request_tpot: Histogram,
    e2e: Histogram,
    queue: Histogram,
    running: Gauge,
    waiting: Gauge,
    success: Counter,
    failure: Counter,
    rejected: Counter,
    aborted: Counter,
    kv_usage: Gauge<f64, AtomicU64>,
    encode_queue: Gauge,
    micro_batch: Histogram,
    sm_share: Gauge<f64, AtomicU64>,
    offload: Gauge<f64, AtomicU64>,
    deaths: Counter,
    restarts: Counter,
    workers_down: Gauge,
    degraded: Gauge<f64, AtomicU64>,
    down: Gauge<f64, AtomicU64>,
    prefix_queries: Counter,
    prefix_hits: Counter,
    encoder_queries: Counter,
    encoder_hits: Counter,
    encoder_bytes: Gauge,
    store_queries: Counter,
    store_hits: Counter,
    store_bytes: Gauge,
}

/// vLLM's TTFT buckets, seconds.
const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's per-output-token buckets, seconds.
const TPOT_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's request-latency buckets (E2E, queue time), seconds.
const LATENCY_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

impl Metrics {
    fn new(model: &str) -> Metrics {
        let mut registry = Registry::with_labels(
            [(
                std::borrow::Cow::Borrowed("model_name"),
                std::borrow::Cow::Owned(model.to_string()),
            )]
            .into_iter(),
        );
        let m = Metrics {
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(TPOT_BUCKETS),
            tpot: Histogram::new(TPOT_BUCKETS),
            request_tpot: Histogram::new(TPOT_BUCKETS),
            e2e: Histogram::new(LATENCY_BUCKETS),
            queue: Histogram::new(LATENCY_BUCKETS),
            running: Gauge::default(),
            waiting: Gauge::default(),
            success: Counter::default(),
            failure: Counter::default(),
            rejected: Counter::default(),
            aborted: Counter::default(),
            kv_usage: Gauge::default(),
            encode_queue: Gauge::default(),
            micro_batch: Histogram::new((0..10).map(|k| f64::from(1u32 << k))),
            sm_share: Gauge::default(),
            offload: Gauge::default(),
            deaths: Counter::default(),
            restarts: Counter::default(),
            workers_down: Gauge::default(),
            degraded: Gauge::default(),
            down: Gauge::default(),
            prefix_queries: Counter::default(),
            prefix_hits: Counter::default(),
            encoder_queries: Counter::default(),
            encoder_hits: Counter::default(),
            encoder_bytes: Gauge::default(),
            store_queries: Counter::default(),
            store_hits: Counter::default(),
            store_bytes: Gauge::default(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            "vllm:time_to_first_token_seconds",
            "Time to first token, seconds",
            m.ttft.clone(),
        );
        r.register(
            "vllm:inter_token_latency_seconds",
            "Time between two tokens of a request, seconds",
            m.itl.clone(),
        );
        r.register(
            "vllm:time_per_output_token_seconds",
            "Time between two tokens of a request, seconds (older name of the inter-token latency)",
            m.tpot.clone(),
        );
        r.register(
            "vllm:request_time_per_output_token_seconds",
            "Time per output token after the first, seconds, per completed request",
            m.request_tpot.clone(),
        );
        r.register(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency, seconds, per completed request",
            m.e2e.clone(),
        );
        r.register(
            "vllm:request_queue_time_seconds",
            "Arrival to the start of the request's first stage, seconds",
            m.queue.clone(),
        );
        r.register(
            "vllm:num_requests_running",
            "Admitted requests past their queues",
            m.running.clone(),
        );
        r.register(
            "vllm:num_requests_waiting",
            "Requests waiting in an encode, prefill or decode queue",
            m.waiting.clone(),
        );
        r.register(
            "vllm:request_success",
            "Completed requests",
            m.success.clone(),
        );
        r.register(
            "easerve:request_failure",
            "Requests that failed in the server",
            m.failure.clone(),
        );
        r.register(
            "easerve:request_rejected",
            "Requests turned away by admission control (HTTP 429)",
            m.rejected.clone(),
        );
        r.register(
            "easerve:request_aborted",
            "Requests aborted: the client disconnected or the request's deadline passed",
            m.aborted.clone(),
        );
        r.register(
            "vllm:kv_cache_usage_perc",
            "Fraction of the decode workers' KV cache blocks in use (1 = full)",
            m.kv_usage.clone(),
        );
        r.register(
            "easerve:encode_queue_length",
            "Requests waiting for an encode pass, all encode workers",
            m.encode_queue.clone(),
        );
        r.register(
            "easerve:encode_micro_batch_size",
            "Requests per encode pass (micro-batch)",
            m.micro_batch.clone(),
        );
        r.register(
            "easerve:encode_sm_share",
            "SM (thread) share of the latest encode pass",
            m.sm_share.clone(),
        );
        r.register(
            "easerve:prefill_offload_fraction",
            "Realised fraction of prefills routed to remote prefill workers",
            m.offload.clone(),
        );
        m.register_supervision(r);
        m.register_caches(r);
        Metrics { registry, ..m }
    }

    /// Supervision's counters and gauges (worker deaths, restarts, time
    /// degraded or with a stage down).
    fn register_supervision(&self, r: &mut Registry) {
        r.register(
            "easerve:worker_deaths",
            "Worker deaths (exits, kills, missed heartbeats)",
            self.deaths.clone(),
        );
        r.register(
            "easerve:worker_restarts",
            "Worker restarts that brought a worker back",
            self.restarts.clone(),
        );
        r.register(
            "easerve:workers_down",
            "Workers dead now, restarting or not",
            self.workers_down.clone(),
        );
        r.register(
            "easerve:degraded_seconds",
            "Seconds with at least one worker dead",
            self.degraded.clone(),
        );
        r.register(
            "easerve:stage_down_seconds",
            "Seconds with some stage having no live worker",
            self.down.clone(),
        );
    }

    /// The caches' counters: vLLM's prefix-cache names (tokens, as vLLM
    /// counts them), the encoder cache's in the same style.
    fn register_caches(&self, r: &mut Registry) {
        r.register(
            "vllm:prefix_cache_queries",
            "Prompt tokens looked up in the prefill workers' prefix caches",
            self.prefix_queries.clone(),
        );
        r.register(
            "vllm:prefix_cache_hits",
            "Prompt tokens found in the prefill workers' prefix caches",
            self.prefix_hits.clone(),
        );
        r.register(
            "easerve:encoder_cache_queries",
            "Media items looked up in the encode workers' encoder caches",
            self.encoder_queries.clone(),
        );
        r.register(
            "easerve:encoder_cache_hits",
            "Media items whose embeddings the encode workers' encoder caches held",
            self.encoder_hits.clone(),
        );
        r.register(
            "easerve:encoder_cache_usage_bytes",
            "Bytes of embeddings the encode workers' encoder caches hold",
            self.encoder_bytes.clone(),
        );
        r.register(
            "easerve:encoder_store_queries",
            "Media items looked up in the shared encoder-output store (those the workers' own caches missed)",
            self.store_queries.clone(),
        );
        r.register(
            "easerve:encoder_store_hits",
            "Media items whose embeddings the shared encoder-output store held",
            self.store_hits.clone(),
        );
        r.register(
            "easerve:encoder_store_usage_bytes",
            "Bytes of embeddings the shared encoder-output store holds",
            self.store_bytes.clone(),
        );
    }

    /// The caches' counters and gauge, from the controller's.
    fn caches(&self, ctrl: &Controller) {
        let catch_up = |c: &Counter, to: u64| c.inc_by(to.saturating_sub(c.get()));
        let (enc, pre) = ctrl.cache_counters();
        if let Some(e) = enc {
            catch_up(&self.encoder_queries, e.queries);
            catch_up(&self.encoder_hits, e.hits);
            self.encoder_bytes.set(ctrl.encoder_cache_bytes() as i64);
        }
        if let Some(p) = pre {
            catch_up(&self.prefix_queries, p.queries);
            catch_up(&self.prefix_hits, p.hits);
        }
        if let Some(s) = ctrl.store_counters() {
            catch_up(&self.store_queries, s.queries);
            catch_up(&self.store_hits, s.hits);
            self.store_bytes.set(ctrl.encoder_store_bytes() as i64);
        }
    }

    /// The text exposition.
    fn encode(&self) -> String {
        let mut out = String::new();
        // writing into a String cannot fail
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// A gap between two tokens of one request, seconds.
    fn token_gap(&self, gap: f64) {
        self.itl.observe(gap);
        self.tpot.observe(gap);
    }

    fn completed(&self, r: &RequestRecord) {
        if let Some(e2e) = r.e2e() {
            self.e2e.observe(e2e);
        }
        if let Some(tpot) = r.tpot().filter(|_| r.output_tokens > 1) {
            self.request_tpot.observe(tpot);
        }
        if let Some(start) = r.encode_start.get().or(r.prefill_start.get()) {
            self.queue.observe(start - r.arrival);
        }
        self.success.inc();
    }

    /// Supervision's counters and gauges, from the controller's at `now`.
    fn supervision(&self, ctrl: &Controller, now: f64) {
        let s = ctrl.supervision(now);
        self.deaths
            .inc_by((s.deaths as u64).saturating_sub(self.deaths.get()));
        self.restarts
            .inc_by((s.restarts as u64).saturating_sub(self.restarts.get()));
        self.workers_down.set(ctrl.dead_workers() as i64);
        self.degraded.set(s.degraded_s);
        self.down.set(s.down_s);
    }

    /// The gauges, from the controller's state now.
    fn update(&self, ctrl: &Controller) {
        let topo = ctrl.topology();
        let enc: usize = (0..topo.encode().len())
            .map(|w| ctrl.encode_queue_len(w))
            .sum();
        let pre: usize = (0..topo.prefill().len())
            .map(|p| ctrl.prefill_queue_len(p))
            .sum();
        let dec: usize = (0..topo.decode().len())
            .map(|d| ctrl.decode_waiting(d))
            .sum();
        let waiting = enc + pre + dec;
        self.encode_queue.set(enc as i64);
        self.waiting.set(waiting as i64);
        self.running
            .set(ctrl.in_system().saturating_sub(waiting) as i64);
        let (used, total) = (0..topo.decode().len())
            .map(|d| ctrl.decode_kv(d))
            .fold((0u64, 0u64), |(u, t), kv| (u + kv.used(), t + kv.total()));
        if total > 0 {
            self.kv_usage.set(used as f64 / total as f64);
        }
        let c = ctrl.counters();
        if c.routed > 0 {
            self.offload.set(c.remote_routed as f64 / c.routed as f64);
        }
        self.caches(ctrl);
    }
}

/// The controller of a server: `sc`'s deployment with no requests yet (they
/// come over HTTP, [`Controller::add_request`]); the scenario's workload
/// stands for a typical request in the encode policies' costs.
pub(crate) fn serving_controller(
    sc: &Scenario,
    cost: &dyn StageCost,
    log_decisions: bool,
) -> Controller {
    let (typical, tokens) = generate_with_tokens(sc);
    let cfg = sc.controller_config(&typical, &tokens, cost, log_decisions);
    let mut ctrl = Controller::new(Vec::new(), cfg);
    // the encode workers hold the embeddings the encoder cache keeps
    ctrl.keep_encoder_ops();
    ctrl.keep_prefix_ops();
    ctrl
}

/// What the HTTP handlers share.
pub(crate) struct App {
    model: ModelInfo,
    state: AtomicU8,
    submit: mpsc::UnboundedSender<Submission>,
    metrics: Metrics,
    /// Completion ids: `chatcmpl-{n}`.
    next: AtomicU64,
    /// Requests between their receipt and their hand-over to the driver
    /// (parsing, decoding): a drain waits for them.
    receiving: AtomicUsize,
    /// A stage has no live worker left: `/health` says 503.
    stage_down: AtomicBool,
    /// Where a handler whose client left sends its ticket ([`Abandoned`]).
    abandon: mpsc::UnboundedSender<u64>,
    /// The next ticket.
    next_ticket: AtomicU64,
    /// How long a body may take to come whole.
    body_timeout: Duration,
}

/// How the front end keys items for `caches`: not at all with every cache
/// (and the shared store) off; over the raw bytes when the encoder cache
/// says `hash_raw_bytes`; over the decoded items otherwise.
fn item_keys(caches: &easerve_sched::CacheConfig) -> Option<crate::input::ItemKeying> {
    use crate::input::ItemKeying;
    match (&caches.encoder, &caches.prefix) {
        (None, None) if caches.store.is_none() => None,
        (Some(e), _) if e.hash_raw_bytes => Some(ItemKeying::Raw),
        _ => Some(ItemKeying::Decoded),
    }
}

impl App {
    /// The state of a server of `sc`'s model, starting, whose handlers
    /// hand requests to `submit`.
    pub(crate) fn new(
        sc: &Scenario,
        submit: mpsc::UnboundedSender<Submission>,
        abandon: mpsc::UnboundedSender<u64>,
        body_timeout: Duration,
    ) -> App {
        // the controller's own bound: the scenario's, the model's maximum
        // positions, and what one sequence's KV cache holds on a decode worker
        let max_model_len = sc
            .resolution(false)
            .limits()
            .max_model_len
            .unwrap_or(u64::MAX);
        let model = ModelInfo {
            name: sc.model.name.clone(),
            arch: sc.model.clone(),
            max_model_len,
            limits: sc.limits.clone(),
            default_max_tokens: sc.workload.output_len.max(1),
            item_keys: item_keys(&sc.knobs.caches),
        };
        App {
            metrics: Metrics::new(&model.name),
            model,
            state: AtomicU8::new(STARTING),
            submit,
            next: AtomicU64::new(0),
            receiving: AtomicUsize::new(0),
            stage_down: AtomicBool::new(false),
            abandon,
            next_ticket: AtomicU64::new(0),
            body_timeout,
        }
    }
}

/// Counts a request as being received until dropped.
struct Receiving<'a>(&'a AtomicUsize);

impl Drop for Receiving<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn error_response(e: &ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(e.body())).into_response()
}

fn unavailable(app: &App) -> Option<ApiError> {
    match app.state.load(Ordering::SeqCst) {
        READY => None,
        STARTING => Some(ApiError {
            status: 503,
            message: "the server is starting: its workers are loading the model".into(),
        }),
        _ => Some(ApiError {
            status: 503,
            message: "the server is shutting down and accepts no new requests".into(),
        }),
    }
}

async fn health(State(app): State<Arc<App>>) -> Response {
    if app.stage_down.load(Ordering::SeqCst) {
        return error_response(&ApiError {
            status: 503,
            message: "a stage has no live worker: its workers are restarting, and requests that need it fail until one is back"
                .into(),
        });
    }
    match unavailable(&app) {
        None => StatusCode::OK.into_response(),
        Some(e) => error_response(&e),
    }
}

async fn models(State(app): State<Arc<App>>) -> Response {
    Json(json!({
        "object": "list",
        "data": [{
            "id": app.model.name,
            "object": "model",
            "created": unix_now(),
            "owned_by": "easerve",
            "max_model_len": app.model.max_model_len,
        }],
    }))
    .into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics.encode(),
    )
        .into_response()
}

/// `POST /v1/chat/completions`: read and parse the request, submit it, then
/// answer with the whole completion or, when asked to stream, with server-sent events.
async fn chat(State(app): State<Arc<App>>, body: Body) -> Response {
    let received = Instant::now();
    // counted before the state is read, so a drain that starts now waits
    // for this request or this request sees the drain
    app.receiving.fetch_add(1, Ordering::SeqCst);
    let _receiving = Receiving(&app.receiving);
    if let Some(e) = unavailable(&app) {
        return error_response(&e);
    }
    let chat = match read_chat(&app, body).await {
        Ok(c) => c,
        Err(e) => return error_response(&e),
    };
    let (stream, include_usage) = (chat.stream, chat.include_usage);
    let prompt = u64::from(chat.request.prompt_tokens) + chat.request.mm_tokens;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let gone = ApiError {
        status: 503,
        message: "the server is shutting down and accepts no new requests".into(),
    };
    let ticket = app.next_ticket.fetch_add(1, Ordering::Relaxed);
    let sent = app.submit.send(Submission {
        chat,
        reply: tx,
        received,
        ticket,
    });
    drop(_receiving);
    if sent.is_err() {
        return error_response(&gone);
    }
    // from here on, a client that leaves aborts its request
    let guard = Abandoned {
        ticket,
        tx: app.abandon.clone(),
    };
    match rx.recv().await {
        Some(Out::Accepted) => {}
        Some(Out::Rejected(why)) => {
            return error_response(&ApiError {
                status: 429,
                message: why,
            })
        }
        _ => return error_response(&gone),
    }
    let id = format!("chatcmpl-{}", app.next.fetch_add(1, Ordering::Relaxed));
    let created = unix_now();
    let model = app.model.name.clone();
    if !stream {
        let out = complete(rx, &id, created, &model, prompt).await;
        drop(guard);
        return out;
    }
    stream_chunks(rx, guard, id, created, model, prompt, include_usage)
}

/// The request body, read whole and parsed (decoding media off the runtime's threads).
async fn read_chat(app: &App, body: Body) -> Result<ChatRequest, ApiError> {
    let read = axum::body::to_bytes(body, MAX_BODY_BYTES);
    let body: Bytes = match tokio::time::timeout(app.body_timeout, read).await {
        Ok(Ok(b)) => b,
        Err(_) => {
            return Err(ApiError {
                status: 408,
                message: format!(
                    "the request body did not come whole within {} s of its headers (the server's body read timeout)",
                    app.body_timeout.as_secs_f64()
                ),
            })
        }
        Ok(Err(e)) => {
            return Err(ApiError {
                status: 413,
                message: format!(
                    "the request body could not be read whole ({e}); at most {MAX_BODY_BYTES} bytes are read"
                ),
            })
        }
    };
    // decoding media is CPU work: off the runtime's threads
    let model = app.model.clone();
    let parsed = tokio::task::spawn_blocking(move || openai::parse_chat(&body, &model)).await;
    let chat = match parsed {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(e),
        Err(e) => {
            return Err(ApiError {
                status: 500,
                message: format!("reading the request failed: {e}"),
            })
        }
    };
    Ok(chat)
}

/// The whole completion of a non-streamed request, once its last token is out.
async fn complete(
    mut rx: mpsc::UnboundedReceiver<Out>,
    id: &str,
    created: u64,
    model: &str,
    prompt: u64,
) -> Response {
    let mut text = String::new();
    let mut n = 0u64;
    loop {
        match rx.recv().await {
            Some(Out::Token(t)) => {
                text.push_str(&openai::token_text(t));
                n += 1;
            }
            Some(Out::Done) => break,
            Some(Out::Failed(why)) => {
                return error_response(&ApiError {
                    status: 500,
                    message: why,
                })
            }
            Some(Out::Aborted(why)) => {
                return error_response(&ApiError {
                    status: 408,
                    message: why,
                })
            }
            Some(Out::Accepted | Out::Rejected(_)) => {}
            None => {
                return error_response(&ApiError {
                    status: 500,
                    message: "the request was lost in the server".into(),
                })
            }
        }
    }
    Json(openai::completion(id, created, model, &text, prompt, n)).into_response()
}

/// Server-sent events: a role chunk, a chunk per token, a finishing chunk,
/// the usage chunk when asked for, then [DONE].
fn stream_chunks(
    rx: mpsc::UnboundedReceiver<Out>,
    guard: Abandoned,
    id: String,
    created: u64,
    model: String,
    prompt: u64,
    include_usage: bool,
) -> Response {
    let first = openai::chunk(
        &id,
        created,
        &model,
        json!({"role": "assistant", "content": ""}),
        None,
    );
    // the stream holds the guard: dropped with it when the client leaves
    let state = Some((rx, 0u64, Some(first)));
    let events = futures_util::stream::unfold(state, move |st| {
        let _held = &guard;
        let (id, model) = (id.clone(), model.clone());
        async move {
            let (mut rx, mut n, pending) = st?;
            if let Some(first) = pending {
                return Some((vec![sse(&first)], Some((rx, n, None))));
            }
            let data = match rx.recv().await {
                Some(Out::Token(t)) => {
                    n += 1;
                    let c = openai::chunk(
                        &id,
                        created,
                        &model,
                        json!({"content": openai::token_text(t)}),
                        None,
                    );
                    return Some((vec![sse(&c)], Some((rx, n, None))));
                }
                Some(Out::Done) => {
                    let mut v = vec![sse(&openai::chunk(
                        &id,
                        created,
                        &model,
                        json!({}),
                        Some("length"),
                    ))];
                    if include_usage {
                        v.push(sse(&json!({
                            "id": id, "object": "chat.completion.chunk", "created": created,
                            "model": model, "choices": [], "usage": openai::usage(prompt, n),
                        })));
                    }
                    v
                }
                Some(Out::Failed(why)) => vec![sse(&ApiError {
                    status: 500,
                    message: why,
                }
                .body())],
                Some(Out::Aborted(why)) => vec![sse(&ApiError {
                    status: 408,
                    message: why,
                }
                .body())],
                Some(Out::Accepted | Out::Rejected(_)) => {
                    return Some((Vec::new(), Some((rx, n, None))))
                }
                None => vec![sse(&ApiError {
                    status: 500,
                    message: "the request was lost in the server".into(),
                }
                .body())],
            };
            let mut data = data;
            data.push(Ok(SseEvent::default().data("[DONE]")));
            Some((data, None))
        }
    });
    let flat = futures_util::StreamExt::flat_map(events, futures_util::stream::iter);
    Sse::new(flat).into_response()
}

fn sse(v: &serde_json::Value) -> Result<SseEvent, std::convert::Infallible> {
    Ok(SseEvent::default().data(v.to_string()))
}

/// One request in the server: where its answer goes and how many tokens it
/// has been sent.
struct InFlight {
    reply: mpsc::UnboundedSender<Out>,
    accepted: bool,
    sent: u32,
    /// When its latest token went out, seconds since the start.
    last_token: f64,
}

/// Serve `sc`'s deployment until SIGTERM, Ctrl-C or the time limit, then
/// drain and report. `on_listen` hears the bound address once the socket is
/// open (before the workers are up: requests get 503 until they are).
///
/// # Errors
/// When the address cannot be bound or the workers do not start.
pub fn serve(
    sc: &Scenario,
    cost: &dyn StageCost,
    opts: &ServeOptions,
    on_listen: impl FnOnce(SocketAddr),
) -> Result<ExecOutput, ExecError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(run(sc, cost, opts, on_listen))
}

async fn run(
    sc: &Scenario,
    cost: &dyn StageCost,
    opts: &ServeOptions,
    on_listen: impl FnOnce(SocketAddr),
) -> Result<ExecOutput, ExecError> {
    let sc = &*crate::run::as_applied(sc, &opts.exec);
    let mut ctrl = serving_controller(sc, cost, opts.log_decisions);
    if let Some(b) = opts.exec.restart {
        ctrl.supervise(b);
    }
    let (submit, mut submissions) = mpsc::unbounded_channel::<Submission>();
    let (abandon, mut abandoned) = mpsc::unbounded_channel::<u64>();
    let app = Arc::new(App::new(sc, submit, abandon, opts.socket.body_timeout));
    let router = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::disable())
        .with_state(app.clone());
    // SIGTERM and Ctrl-C are ours from before the workers start: a stop
    // while they load kills them (kill_on_drop) rather than orphaning them
    let mut stop = Stop::new()?;
    let listener = tokio::net::TcpListener::bind(opts.listen).await?;
    on_listen(listener.local_addr()?);
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(crate::socket::serve_http(
        listener,
        router,
        opts.socket,
        async {
            let _ = http_stopped.await;
        },
    ));

    let started = tokio::select! {
        p = start_workers(sc, ctrl.topology(), &opts.exec) => p,
        _ = stop.recv() => Err(ExecError::Startup(
            "stopped (SIGTERM or Ctrl-C) while the workers were starting".into(),
        )),
    };
    let mut pool = match started {
        Ok(p) => p,
        Err(e) => {
            let _ = stop_http.send(());
            let _ = server.await;
            return Err(e);
        }
    };
    app.state.store(READY, Ordering::SeqCst);
    let plan = crate::plan::ExecPlan::of(sc, ctrl.topology(), std::sync::Arc::from(sc.cost()));
    // on node groups a cross-node transfer lands its modelled NIC time late,
    // as under `exec`; a request's envelope bytes are known once it came
    let nics = crate::run::Nics::of(sc, &Default::default());
    let (faults, run_s, (plan, nics)) = drive(
        &mut ctrl,
        &mut pool,
        Inbox {
            submissions: &mut submissions,
            abandoned: &mut abandoned,
        },
        &app,
        opts,
        &mut stop,
        (plan, nics),
    )
    .await;
    // no submission is taken from here on: a late one gets 503
    drop(submissions);
    let _ = stop_http.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), server).await;
    shut_down(&mut pool).await;
    // the offered rate is what came: arrivals over their span
    let arrivals: Vec<f64> = ctrl.records().iter().map(|r| r.arrival).collect();
    let span = arrivals.iter().copied().fold(f64::NEG_INFINITY, f64::max)
        - arrivals.iter().copied().fold(f64::INFINITY, f64::min);
    let offered = if arrivals.len() > 1 && span > 0.0 {
        (arrivals.len() - 1) as f64 / span
    } else {
        0.0
    };
    let mut report = build_report(
        sc,
        &ctrl,
        &pool,
        run_s,
        &faults,
        &None,
        &opts.exec,
        "served by easerve serve over HTTP: one run of every request that came, from all clients together (requests carry no client identity to split them by); offered rate: those requests over their arrivals' span",
        offered,
    );
    crate::plan::account(plan, &ctrl, &mut report);
    if let Some(n) = nics {
        report.links = n.report(report.duration_s);
    }
    let decisions = ctrl.take_decisions();
    Ok(ExecOutput {
        report,
        records: ctrl.into_records(),
        decisions,
        faults,
        interrupted: None,
    })
}

/// SIGTERM and Ctrl-C (SIGINT) as one stream of stop requests.
struct Stop {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Stop {
    fn new() -> std::io::Result<Stop> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Ok(Stop {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Stop {})
    }

    /// The next stop request (never returns where there are no signals).
    async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
        #[cfg(not(unix))]
        std::future::pending::<()>().await
    }
}

/// What the handlers send the driver: requests, and the tickets of
/// requests whose clients left.
struct Inbox<'a> {
    submissions: &'a mut mpsc::UnboundedReceiver<Submission>,
    abandoned: &'a mut mpsc::UnboundedReceiver<u64>,
}

/// Take requests as they come and carry out the controller's commands until
/// the server is told to stop and every request in it has ended. The wall
/// clock and the waiting are here; what a wake-up means is [`ServeLoop`]'s.
async fn drive(
    ctrl: &mut Controller,
    pool: &mut Pool,
    mut inbox: Inbox<'_>,
    app: &App,
    opts: &ServeOptions,
    stop: &mut Stop,
    (plan, nics): (Option<crate::plan::ExecPlan>, Option<crate::run::Nics>),
) -> (
    Vec<Fault>,
    f64,
    (Option<crate::plan::ExecPlan>, Option<crate::run::Nics>),
) {
    let t0 = Instant::now();
    let now = || t0.elapsed().as_secs_f64();
    let mut serve = ServeLoop::new();
    serve.set_plan(plan);
    serve.relay.links.nics = nics;
    let mut kill = KillPlan::new(opts.exec.kill);
    let mut draining = false;

    loop {
        let mut wake = f64::INFINITY;
        if let Some(t) = ctrl.poll_timeout() {
            wake = wake.min(t);
        }
        if let Some(t) = kill.due() {
            wake = wake.min(t);
        }
        if let (Some(t), false) = (opts.exec.time_limit_s, draining) {
            wake = wake.min(t);
        }
        wake = wake.min(pool.sup.wake_at());
        if let Some(t) = serve.plan_wake() {
            wake = wake.min(t);
        }
        // a drain looks again for requests still being received
        let cap = if draining { 0.05 } else { 3600.0 };
        let sleep_for = (wake - now()).clamp(0.0, cap);
        let mut heard = None;
        let mut arrived: Option<Submission> = None;
        let Inbox {
            submissions,
            abandoned,
        } = &mut inbox;
        tokio::select! {
            ev = pool.rx.recv() => match ev {
                Some(ev) => heard = Some(ev),
                None => break,
            },
            sub = submissions.recv() => arrived = sub,
            Some(ticket) = abandoned.recv() => serve.abandon(ticket),
            _ = tokio::time::sleep(Duration::from_secs_f64(sleep_for)) => {}
            _ = stop.recv() => draining = true,
        }
        if let Some(ev) = heard {
            let at = DetectAt {
                now: now(),
                killed_at: kill.killed_at,
            };
            serve.hear(pool, ev, at, ctrl);
        }
        let t = now();
        if opts.exec.time_limit_s.is_some_and(|lim| t >= lim) {
            draining = true;
        }
        if draining {
            app.state.store(DRAINING, Ordering::SeqCst);
            serve.set_plan_open(false);
        }
        kill.inject(pool, t);
        for ev in pool.supervise(t) {
            let at = DetectAt {
                now: t,
                killed_at: kill.killed_at,
            };
            serve.hear(pool, ev, at, ctrl);
        }
        if let Some(sub) = arrived {
            // its arrival is its receipt (clamped to the run's start)
            let arrival = sub
                .received
                .saturating_duration_since(t0)
                .as_secs_f64()
                .min(t);
            serve.submit(ctrl, sub, arrival);
        }
        serve.wake(ctrl, pool, app, t);
        if draining
            && serve.flight.is_empty()
            && ctrl.in_system() == 0
            && inbox.submissions.is_empty()
            && app.receiving.load(Ordering::SeqCst) == 0
        {
            break;
        }
    }
    let plan = serve.relay.plan.take();
    let nics = serve.relay.links.nics.take();
    (serve.relay.faults, now(), (plan, nics))
}

/// What `easerve serve`'s loop does when it wakes: requests submitted over
/// HTTP join the controller ([`Controller::add_request`]) and arrive after
/// what the workers said ([`Relay`]); tokens go out to their handlers as the
/// workers emit them; each handler hears what became of its request. No
/// clock: `now` (seconds since the workers were up) comes from the caller,
/// the wall clock in [`drive`] and a virtual one in the tests.
pub(crate) struct ServeLoop {
    relay: Relay,
    /// Requests in the server, by id.
    flight: HashMap<RequestId, InFlight>,
    /// The requests of the handlers' tickets, while in the server.
    tickets: HashMap<u64, RequestId>,
    /// Tokens the workers emitted since the last wake-up.
    tokens: Vec<(RequestId, u32)>,
}

impl ServeLoop {
    pub(crate) fn new() -> ServeLoop {
        let mut links = Links::default();
        links.passes = Some(Vec::new());
        ServeLoop {
            relay: Relay::new(links),
            flight: HashMap::new(),
            tickets: HashMap::new(),
            tokens: Vec::new(),
        }
    }

    /// Run `plan` (a scenario's planner, [`crate::plan`]).
    pub(crate) fn set_plan(&mut self, plan: Option<crate::plan::ExecPlan>) {
        self.relay.plan = plan;
    }

    /// Whether requests may still come: another planner window is timed
    /// only while they may (a server draining takes no more).
    pub(crate) fn set_plan_open(&mut self, open: bool) {
        if let Some(p) = self.relay.plan.as_mut() {
            p.open = open;
        }
    }

    /// When the planner's window ends next, if a planner runs.
    pub(crate) fn plan_wake(&self) -> Option<f64> {
        self.relay.plan_wake()
    }

    /// Whether a `twin` decision's simulations are out on their thread.
    #[cfg(feature = "agreement")]
    pub(crate) fn simulating(&self) -> bool {
        self.relay.plan.as_ref().is_some_and(|p| p.simulating)
    }

    /// A message from the workers, noticed at `at.now` (`ctrl`: the
    /// controller, for the planner's account).
    pub(crate) fn hear(&mut self, pool: &mut Pool, ev: Incoming, at: DetectAt, ctrl: &Controller) {
        self.relay.hear(pool, ev, at, Some(&mut self.tokens), ctrl);
    }

    /// A request came at `arrival` (seconds): the controller takes it, and
    /// it arrives at the next wake-up.
    pub(crate) fn submit(&mut self, ctrl: &mut Controller, sub: Submission, arrival: f64) {
        let Submission {
            chat,
            reply,
            ticket,
            ..
        } = sub;
        let mut req = chat.request;
        req.arrival = arrival;
        openai::unique_items(&mut req, ticket);
        if let Some(n) = self.relay.links.nics.as_mut() {
            n.add_request(&req.items);
        }
        let id = ctrl.add_request(req);
        if let Some(t) = chat.timeout_s {
            ctrl.set_timeout(id, t);
        }
        self.relay.links.media.insert(id, chat.media);
        self.tickets.insert(ticket, id);
        self.flight.insert(
            id,
            InFlight {
                reply,
                accepted: false,
                sent: 0,
                last_token: 0.0,
            },
        );
        self.relay.arrive(id);
    }

    /// The client of the request with `ticket` left: the controller hears
    /// of it at the next wake-up ([`easerve_sched::Event::Abort`]). A
    /// ticket whose request ended already is ignored.
    pub(crate) fn abandon(&mut self, ticket: u64) {
        if let Some(id) = self.tickets.remove(&ticket) {
            self.relay.abort(id);
        }
    }

    /// Wake up at `t`: the tokens heard go out, the controller hears what is
    /// due ([`Relay::wake`]), and the handlers and metrics hear the outcome.
    pub(crate) fn wake(&mut self, ctrl: &mut Controller, pool: &mut Pool, app: &App, t: f64) {
        // tokens go out as the workers emit them, before the controller's
        // follow-up work (a KV handoff, the next dispatch) can hold them back:
        // the records stamp them at `t`
        for (id, tok) in self.tokens.drain(..) {
            if let Some(f) = self.flight.get_mut(&id) {
                if f.sent < ctrl.requests()[id as usize].output_tokens {
                    let r = &ctrl.records()[id as usize];
                    if f.sent == 0 {
                        app.metrics.ttft.observe(t - r.arrival);
                    } else {
                        app.metrics.token_gap(t - f.last_token);
                    }
                    f.sent += 1;
                    f.last_token = t;
                    let _ = f.reply.send(Out::Token(tok));
                }
            }
        }
        self.relay.wake(ctrl, pool, t);
        let links = &mut self.relay.links;
        if let Some(passes) = links.passes.as_mut() {
            for (size, share) in passes.drain(..) {
                app.metrics.micro_batch.observe(size as f64);
                app.metrics.sm_share.set(share);
            }
        }
        resolve(
            ctrl,
            &mut self.flight,
            (&mut links.media, &mut links.embeddings),
            &app.metrics,
        );
        if self.tickets.len() > self.flight.len() {
            let flight = &self.flight;
            self.tickets.retain(|_, id| flight.contains_key(id));
        }
        app.metrics.update(ctrl);
        app.metrics.supervision(ctrl, t);
        // `/health`: 503 while some stage has no live worker (the controller's word)
        app.stage_down.store(ctrl.stage_down(), Ordering::SeqCst);
    }
}

/// Tell each request's handler what became of it: admitted or turned away,
/// then finished or failed.
fn resolve(
    ctrl: &Controller,
    flight: &mut HashMap<RequestId, InFlight>,
    (media, embeddings): (
        &mut HashMap<RequestId, Vec<WireMedia>>,
        &mut HashMap<RequestId, crate::wire::Matrix>,
    ),
    metrics: &Metrics,
) {
    flight.retain(|&id, f| {
        let r = &ctrl.records()[id as usize];
        if r.rejected {
            metrics.rejected.inc();
            media.remove(&id);
            let _ = f.reply.send(Out::Rejected(
                "the server is at its admission limit: too many requests in flight; retry later"
                    .into(),
            ));
            return false;
        }
        if !f.accepted {
            f.accepted = true;
            let _ = f.reply.send(Out::Accepted);
        }
        if let Some(why) = r.aborted {
            metrics.aborted.inc();
            media.remove(&id);
            // a client that left hears nothing; one whose deadline passed, a 408
            let _ = f.reply.send(Out::Aborted(format!(
                "the request was aborted: {} before it finished",
                why.name()
            )));
            return false;
        }
        if let Some(why) = &r.failure {
            metrics.failure.inc();
            media.remove(&id);
            embeddings.remove(&id);
            let _ = f
                .reply
                .send(Out::Failed(format!("the request failed: {why}")));
            return false;
        }
        if r.finish.is_some() {
            metrics.completed(r);
            let _ = f.reply.send(Out::Done);
            return false;
        }
        true
    });
}
