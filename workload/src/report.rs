//! The run report: one type for the simulator and the executor, so the two can
//! be diffed field by field.
//!
//! Definitions (one everywhere): TTFT = first token − arrival; TPOT =
//! (E2E − TTFT)/(output − 1), 0 when output ≤ 1; E2E = last token − arrival;
//! throughput = completed / duration; goodput of an SLO tier = requests meeting
//! every SLO of the tier / duration (the vLLM/DistServe definition). Duration
//! runs from the first arrival to the last completion. Percentiles interpolate
//! linearly between order statistics (numpy's default).

use easerve_sched::{BatcherParams, RequestRecord, Stamp};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// An SLO tier: a request is good when it meets both bounds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SloTier {
    /// Tier name.
    pub name: String,
    /// TTFT bound, seconds.
    pub ttft_s: f64,
    /// TPOT bound, seconds.
    pub tpot_s: f64,
}

/// Summary statistics of a latency, seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Maximum.
    pub max: f64,
}

impl Stats {
    /// Statistics of `xs` (all zero when empty): percentiles interpolate
    /// linearly between order statistics, which are selected (`O(n)`, no
    /// sort); the mean is the compensated sum ([`compensated_sum`]) over the
    /// count.
    pub fn of(mut xs: Vec<f64>) -> Stats {
        Stats::of_scratch(&mut xs)
    }

    /// [`Stats::of`] on a buffer the caller reuses: `xs` is left in an
    /// unspecified order, each slot holding the bits of a
    /// [`total_order_key`], so the caller clears it before gathering again.
    fn of_scratch(xs: &mut [f64]) -> Stats {
        let n = xs.len();
        if n == 0 {
            return Stats::default();
        }
        let mean = compensated_sum(xs) / n as f64;
        // selection runs on integer keys in `f64::total_cmp`'s order, which
        // compare faster than floats through it; each key's bits are kept in
        // the sample's own slot (only `to_bits`/`from_bits` touch them)
        for x in xs.iter_mut() {
            *x = f64::from_bits(total_order_key(*x));
        }
        let key = |x: &f64| x.to_bits();
        let pos = |p: f64| p / 100.0 * (n - 1) as f64;
        // the order statistics the percentiles need, ascending: each is
        // selected from what lies above the one before
        let mut ranks = Vec::with_capacity(7);
        for p in [50.0, 90.0, 99.0] {
            ranks.extend([pos(p).floor() as usize, pos(p).ceil() as usize]);
        }
        ranks.push(n - 1);
        ranks.sort_unstable();
        ranks.dedup();
        let mut from = 0;
        for &r in &ranks {
            xs[from..].select_nth_unstable_by_key(r - from, key);
            from = r + 1;
        }
        let at = |i: usize| from_total_order_key(key(&xs[i]));
        let pct = |p: f64| {
            let pos = pos(p);
            let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
            at(lo) + (at(hi) - at(lo)) * (pos - lo as f64)
        };
        Stats {
            mean,
            p50: pct(50.0),
            p90: pct(90.0),
            p99: pct(99.0),
            max: at(n - 1),
        }
    }
}

/// `x`'s bits as an unsigned integer that orders as [`f64::total_cmp`] does:
/// negative values have every bit flipped, the others only the sign bit.
pub fn total_order_key(x: f64) -> u64 {
    let bits = x.to_bits();
    bits ^ ((((bits as i64) >> 63) as u64) | (1 << 63))
}

/// The inverse of [`total_order_key`].
pub fn from_total_order_key(key: u64) -> f64 {
    f64::from_bits(if key >> 63 == 1 {
        key ^ (1 << 63)
    } else {
        !key
    })
}

/// The sum of `xs` with Neumaier's compensated summation ("Rundungsfehleranalyse
/// einiger Verfahren zur Summation endlicher Summen", ZAMM 54, 1974): the
/// rounding error of each addition is carried and added back once, so the
/// error is at most `2ε|S| + O(nε²)·Σ|xᵢ|` (ε = 2⁻⁵³), where a plain running
/// sum's grows as `O(nε)·Σ|xᵢ|`.
pub fn compensated_sum(xs: &[f64]) -> f64 {
    let (mut sum, mut carry) = (0.0f64, 0.0f64);
    for &x in xs {
        let t = sum + x;
        carry += if sum.abs() >= x.abs() {
            (sum - t) + x
        } else {
            (x - t) + sum
        };
        sum = t;
    }
    sum + carry
}

/// Goodput at one SLO tier.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TierResult {
    /// Tier name.
    pub name: String,
    /// TTFT bound, seconds.
    pub ttft_s: f64,
    /// TPOT bound, seconds.
    pub tpot_s: f64,
    /// Requests meeting both bounds.
    pub good: usize,
    /// Good requests / duration, requests/s.
    pub goodput: f64,
    /// Good requests / completed requests.
    pub attainment: f64,
}

/// Pipeline stages whose queueing and service are reported.
pub const STAGES: [&str; 5] = [
    "encode",
    "embedding transfer",
    "prefill",
    "kv transfer",
    "decode",
];

/// Queueing and service of one stage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageReport {
    /// Stage name (one of [`STAGES`]).
    pub stage: String,
    /// Requests that passed through it.
    pub requests: usize,
    /// Wait before service, seconds.
    pub queue: Stats,
    /// Service (pass / transfer / generation), seconds.
    pub service: Stats,
    /// Mean busy fraction of the stage's GPUs (compute stages only).
    pub busy_fraction: Option<f64>,
}

/// Use of one GPU over the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuReport {
    /// GPU index in the cluster.
    pub gpu: u32,
    /// Stage whose worker owns it: `encode`, `prefill`, `decode`, or `idle`.
    pub stage: String,
    /// Worker label, e.g. `E0`, `P1`, `D0` (with `+L0` when a local prefill
    /// worker is co-located).
    pub worker: String,
    /// Fraction of the run during which any work ran on it.
    pub busy_fraction: f64,
    /// SM-time utilisation: ∫ (share of SMs doing GPU work) dt / duration.
    pub sm_utilization: f64,
}

/// Encode-stage summary.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EncodeSummary {
    /// Encode passes run.
    pub passes: usize,
    /// Mean micro-batch size.
    pub mean_batch: f64,
    /// Resolved dispatch parameters of worker 0 (all workers share them).
    pub batcher: Option<BatcherParams>,
    /// Fraction of requests whose prefill ran remote (the realised `s`).
    pub remote_fraction: f64,
}

impl EncodeSummary {
    /// The encode summary of a run driven by `ctrl`, from its counters: the
    /// passes started and their mean batch (an aggregated replica's iteration
    /// that encodes counts as a pass), worker 0's batcher, and the share of
    /// routed prefills that went remote (1 when nothing was routed; 0 for the
    /// aggregated system, whose replicas prefill what they encode).
    pub fn of(ctrl: &easerve_sched::Controller) -> EncodeSummary {
        let c = ctrl.counters();
        EncodeSummary {
            passes: c.passes,
            mean_batch: if c.passes > 0 {
                c.passed_requests as f64 / c.passes as f64
            } else {
                0.0
            },
            batcher: ctrl.batcher_params().cloned(),
            remote_fraction: if c.routed > 0 {
                c.remote_routed as f64 / c.routed as f64
            } else if ctrl.topology().replica().is_empty() {
                1.0
            } else {
                0.0
            },
        }
    }
}

/// Offered load against capacity at one stage.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageLoad {
    /// `encode`, `prefill` or `decode`.
    pub stage: String,
    /// Requests offered to the stage, requests/s.
    pub offered: f64,
    /// What the stage's workers can serve, requests/s (from the cost model at
    /// the deployment's B, s and TP).
    pub capacity: f64,
    /// `offered / capacity`: above 1 the stage cannot keep up.
    pub load: f64,
}

/// Why the run behaved as it did, in numbers and in plain words.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    /// Load ratio per compute stage.
    pub loads: Vec<StageLoad>,
    /// The stage with the highest load ratio.
    pub most_loaded: String,
    /// Its load over the next stage's load (how far it leads); `None` when the
    /// next stage carries no load.
    pub lead: Option<f64>,
    /// Fraction of the run the encode GPUs had no GPU work (mean over them).
    pub encode_gpu_idle: Option<f64>,
    /// One sentence per finding.
    pub findings: Vec<String>,
}

/// Version of the report's JSON schema (documented in the README, "JSON
/// report"). Raised on any change that renames, removes or re-means a field.
pub const REPORT_SCHEMA_VERSION: u32 = 1;

/// Everything a run measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// [`REPORT_SCHEMA_VERSION`] of the writer.
    pub schema_version: u32,
    /// What ran: scenario, deployment, cluster, seed, offered load.
    #[serde(flatten)]
    pub meta: RunMeta,
    /// Requests completed.
    pub completed: usize,
    /// Start of the run (t = 0) → last completion, seconds.
    pub duration_s: f64,
    /// Completed / duration, requests/s.
    pub request_throughput: f64,
    /// Output tokens / duration, tokens/s.
    pub output_throughput: f64,
    /// (Prompt incl. multimodal embeddings + output tokens) / duration, tokens/s.
    pub total_token_throughput: f64,
    /// Time to first token.
    pub ttft: Stats,
    /// Time per output token (excluding the first).
    pub tpot: Stats,
    /// End-to-end latency.
    pub e2e: Stats,
    /// Goodput per SLO tier, strict → relaxed.
    pub goodput: Vec<TierResult>,
    /// Per-stage queueing and service.
    pub stages: Vec<StageReport>,
    /// Per-GPU use.
    pub gpus: Vec<GpuReport>,
    /// Encode summary.
    pub encode: EncodeSummary,
    /// The stage where work piles up, named for a run of a scenario by one
    /// rule (`easerve_sim::name_bottleneck`): the stage of the highest offered
    /// load / capacity, or `aggregated` for the aggregated baseline; `none`
    /// with [`NOT_NAMED`] in a report read from outside a run (no stage times).
    pub bottleneck: String,
    /// Why it was named the bottleneck.
    pub bottleneck_reason: String,
    /// Notes on where cost figures came from and what was extrapolated.
    pub notes: Vec<String>,
    /// Events the simulator processed (0 for a measured run).
    #[serde(default)]
    pub events: u64,
    /// Stage loads and findings in plain words.
    #[serde(default)]
    pub explanation: Explanation,
    /// Whether the run was measured by the executor (`easerve exec`) rather
    /// than simulated.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub measured: bool,
    /// Requests that failed (a worker died, the run was interrupted).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failed: usize,
    /// Arrivals turned away by admission control (queue full).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rejected: usize,
    /// Failed requests per reason, most frequent first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<FailureCount>,
    /// Arrivals refused for asking more than the limits allow (`[limits]`),
    /// counted apart from failures: no work was done for them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub refused: usize,
    /// Refused requests per limit, most frequent first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<FailureCount>,
    /// Requests aborted because their client left or their deadline passed
    /// (`workload.timeout_s`, a request's `timeout`), counted apart from
    /// failures: nothing went wrong in the server.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub aborted: usize,
    /// Aborted requests per reason, most frequent first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aborts: Vec<FailureCount>,
    /// The run cut into windows of time (a scenario with a rate schedule or
    /// `workload.window_s`; see [`crate::windows`]); empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<crate::windows::WindowReport>,
    /// The planner's account (a scenario with `[planner]` or `--planner`):
    /// GPU-hours, goodput per GPU-hour, each change, every decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planner: Option<PlannerReport>,
    /// Reuse: what the workload offers and what each cache found (a
    /// workload that repeats itself, or a cache turned on); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reuse: Option<ReuseReport>,
    /// Worker deaths and restarts, when a worker died in the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supervision: Option<SupervisionReport>,
    /// Each NIC port that carried a cross-node transfer (a cluster of node
    /// groups), then each direction of the shared encoder store's host link
    /// that carried a transfer (the store on; [`STORE_LINK`]); absent
    /// otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<LinkReport>,
}

/// How the shared encoder store's host link is named in [`LinkReport::link`]:
/// `encoder store out (fetches)`, `encoder store in (writes)`.
pub const STORE_LINK: &str = "encoder store";

/// One direction of a shared link over a run (one node's NIC, or the shared
/// encoder store's host link): what it carried, how busy it was and how
/// long transfers waited for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkReport {
    /// `group/nodeN NIC out` or `… NIC in`; `encoder store out (fetches)`
    /// or `encoder store in (writes)` ([`STORE_LINK`]).
    pub link: String,
    /// Transfers it carried.
    pub transfers: u64,
    /// Bytes it carried.
    pub bytes: f64,
    /// Busy seconds over the run's duration, `[0, 1]`.
    pub utilisation: f64,
    /// Mean seconds a transfer waited for the port (queueing).
    pub mean_queue_s: f64,
    /// Longest such wait, seconds.
    pub max_queue_s: f64,
}

impl LinkReport {
    fn render_all(links: &[LinkReport], s: &mut String) {
        use std::fmt::Write;
        let (store, nics): (Vec<&LinkReport>, Vec<&LinkReport>) =
            links.iter().partition(|l| l.link.starts_with(STORE_LINK));
        for (title, links) in [
            ("NICs (cross-node transfers):", nics),
            ("Encoder store's host link (transfers on its node):", store),
        ] {
            if links.is_empty() {
                continue;
            }
            let _ = writeln!(s, "{title}");
            for l in links {
                l.render(s);
            }
        }
    }

    fn render(&self, s: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            s,
            "  {:<28} {:>8} transfers  {:>9.3} GB  util {:>5.1}%  queue mean {:.3} ms, max {:.3} ms",
            self.link,
            self.transfers,
            self.bytes / 1e9,
            self.utilisation * 100.0,
            self.mean_queue_s * 1e3,
            self.max_queue_s * 1e3
        );
    }
}

/// What supervision saw in a run: deaths, restarts, the time with a worker
/// dead (degraded) and with a stage without any live worker (down), and each
/// death.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SupervisionReport {
    /// Worker deaths (a restart that died while loading counts again).
    pub deaths: usize,
    /// Restarts that brought a worker back.
    pub restarts: usize,
    /// Seconds with at least one worker dead.
    pub degraded_s: f64,
    /// Seconds with some stage having no live worker (`/health` 503).
    pub down_s: f64,
    /// Each death, in order.
    pub outages: Vec<OutageReport>,
}

/// One death of a worker.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OutageReport {
    /// Worker label.
    pub worker: String,
    /// When it died, seconds since the start of the run.
    pub died_at: f64,
    /// Why.
    pub reason: String,
    /// Restart attempts for this death.
    pub attempts: u32,
    /// When it rejoined, seconds; absent if it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub back_at: Option<f64>,
    /// Seconds its restart took to load the model: measured by the worker
    /// (`exec`, `serve`) or derived (`sim`: weight bytes over the host link).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_s: Option<f64>,
    /// Its last lines of stderr (at most 20), oldest first (`exec`, `serve`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stderr: Vec<String>,
}

impl SupervisionReport {
    /// The supervision section of a run `ctrl` drove until `now` (seconds);
    /// `None` when no worker died.
    pub fn of(ctrl: &easerve_sched::Controller, now: f64) -> Option<SupervisionReport> {
        if ctrl.outages().is_empty() {
            return None;
        }
        let c = ctrl.supervision(now);
        Some(SupervisionReport {
            deaths: c.deaths,
            restarts: c.restarts,
            degraded_s: c.degraded_s,
            down_s: c.down_s,
            outages: ctrl
                .outages()
                .iter()
                .map(|o| OutageReport {
                    worker: o.worker.clone(),
                    died_at: o.died_at,
                    reason: o.reason.clone(),
                    attempts: o.attempts,
                    back_at: o.back_at,
                    ..OutageReport::default()
                })
                .collect(),
        })
    }

    fn render(&self, s: &mut String) {
        head(s, " Supervision ");
        line(s, "Worker deaths:", self.deaths.to_string());
        line(s, "Worker restarts:", self.restarts.to_string());
        line(s, "Degraded time (s):", format!("{:.2}", self.degraded_s));
        line(s, "Stage-down time (s):", format!("{:.2}", self.down_s));
        for o in &self.outages {
            let back = match (o.back_at, o.load_s) {
                (Some(b), Some(l)) => format!("back at {b:.2} s (load {l:.3} s)"),
                (Some(b), None) => format!("back at {b:.2} s"),
                _ => "not back".into(),
            };
            let first = o.reason.lines().next().unwrap_or("");
            line(
                s,
                &format!("  {} died at {:.2} s:", o.worker, o.died_at),
                format!("{back}; {first}"),
            );
        }
    }
}

/// What a planner did in a run ([`Report::planner`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlannerReport {
    /// `static`, `load` or `twin`.
    pub policy: String,
    /// Seconds between decisions.
    pub window_s: f64,
    /// Least seconds between changes.
    pub dwell_s: f64,
    /// Seconds to load each stage's model (encode, prefill, decode).
    pub load_s: [f64; 3],
    /// Where the load times come from.
    pub load_source: String,
    /// GPU-hours the run held: each worker's GPUs from the start (or its
    /// model load) until it stopped or the run ended.
    pub gpu_hours: f64,
    /// Good requests per GPU-hour, per SLO tier.
    pub goodput_per_gpu_hour: Vec<TierValue>,
    /// Each change, with its time and duration.
    pub changes: Vec<ChangeRecord>,
    /// Every planning decision with its inputs.
    pub decisions: Vec<easerve_sched::planner::PlanRecord>,
}

/// A value per SLO tier.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TierValue {
    /// Tier name.
    pub tier: String,
    /// The value.
    pub value: f64,
}

/// One change of the deployment in a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChangeRecord {
    /// When the controller got it, seconds.
    pub at: f64,
    /// The change.
    pub change: easerve_sched::Change,
    /// The worker drained (label), if any.
    pub from: Option<String>,
    /// The worker started (label), if any.
    pub to: Option<String>,
    /// When the drained worker stopped (its work done), seconds.
    pub stopped_at: Option<f64>,
    /// When the started worker was ready (its model loaded), seconds; the
    /// change took `ready_at − at` (or `stopped_at − at` for a removal).
    pub ready_at: Option<f64>,
    /// When the started worker died loading its model, seconds (the change
    /// failed: [`easerve_sched::Decision::LoadFailed`]); `easerve exec` and
    /// `serve` only, the simulator's loads do not fail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_at: Option<f64>,
    /// Why it died, as the executor saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

impl ChangeRecord {
    /// The change as the text report's "Planner" section lists it: when
    /// (`  at 900 s`) and what, with how long it took (`add P1 (1.4 s)`,
    /// `remove D2 (1.5 s)`, `P1 -> D1 (…)`, `set s = 0.400 (at once)`,
    /// `set B = 4 (at once)`).
    pub fn text_line(&self) -> (String, String) {
        let what = match (&self.from, &self.to) {
            (Some(f), Some(t)) => format!("{f} -> {t}"),
            (Some(f), None) => format!("remove {f}"),
            (None, Some(t)) => format!("add {t}"),
            (None, None) => match self.change {
                easerve_sched::Change::SetBatch { max_batch } => format!("set B = {max_batch}"),
                easerve_sched::Change::SetOffload { s } => format!("set s = {s:.3}"),
                other => format!("{other:?}"),
            },
        };
        let end = self.ready_at.or(self.stopped_at);
        let took = match (self.failed_at, end) {
            (Some(f), _) => format!("failed loading at {f:.1} s"),
            (None, Some(e)) => format!("{:.1} s", e - self.at),
            (None, None) if self.from.is_none() && self.to.is_none() => "at once".into(),
            (None, None) => "-".into(),
        };
        (format!("  at {:.0} s", self.at), format!("{what} ({took})"))
    }
}

/// What a run reused: the reuse its workload offers and each cache's hits.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReuseReport {
    /// What an unbounded cache that saw every earlier request would find.
    pub offered: crate::reuse::OfferedReuse,
    /// The encoder cache (items), when on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoder_cache: Option<CacheReport>,
    /// The prefix cache (prompt tokens), when on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_cache: Option<CacheReport>,
    /// The shared encoder-output store (items the encode workers' own
    /// caches missed), when on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoder_store: Option<StoreReport>,
}

/// The shared encoder-output store over a run: its lookups, hits and the
/// bytes it moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StoreReport {
    /// Items looked up (those the worker's own cache missed).
    pub queries: u64,
    /// Of which held: fetched, not encoded.
    pub hits: u64,
    /// `hits / queries`.
    pub hit_rate: f64,
    /// Items evicted.
    pub evictions: u64,
    /// Items written (encoded outputs it did not hold).
    pub writes: u64,
    /// Bytes fetched by the hits.
    pub fetched_bytes: u64,
    /// Bytes written.
    pub written_bytes: u64,
}

impl From<easerve_sched::StoreCounters> for StoreReport {
    fn from(c: easerve_sched::StoreCounters) -> StoreReport {
        StoreReport {
            queries: c.queries,
            hits: c.hits,
            hit_rate: c.cache().hit_rate(),
            evictions: c.evictions,
            writes: c.writes,
            fetched_bytes: c.fetched_bytes,
            written_bytes: c.written_bytes,
        }
    }
}

/// One cache's lookups and hits over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheReport {
    /// Lookups: items (encoder cache) or prompt tokens (prefix cache), as
    /// vLLM's `prefix_cache_queries` counts tokens.
    pub queries: u64,
    /// Of which found.
    pub hits: u64,
    /// `hits / queries`.
    pub hit_rate: f64,
    /// Entries evicted (items, or KV blocks).
    pub evictions: u64,
}

impl From<easerve_sched::CacheCounters> for CacheReport {
    fn from(c: easerve_sched::CacheCounters) -> CacheReport {
        CacheReport {
            queries: c.queries,
            hits: c.hits,
            hit_rate: c.hit_rate(),
            evictions: c.evictions,
        }
    }
}

/// How many requests failed for one reason.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FailureCount {
    /// The reason, e.g. `E0 failed: exited with signal 9`.
    pub reason: String,
    /// Requests.
    pub count: usize,
}

impl FailureCount {
    /// Count one more request for `reason` in `counts`.
    fn count(counts: &mut Vec<FailureCount>, reason: &str) {
        match counts.iter_mut().find(|f| f.reason == reason) {
            Some(f) => f.count += 1,
            None => counts.push(FailureCount {
                reason: reason.to_string(),
                count: 1,
            }),
        }
    }

    /// Most frequent first, then by reason.
    fn sort(counts: &mut [FailureCount]) {
        counts.sort_by(|a, b| b.count.cmp(&a.count).then(a.reason.cmp(&b.reason)));
    }
}

impl TierResult {
    /// Each tier of `slo` with its `good` requests of `completed`; `per_s`
    /// turns a count into a rate over the run (requests/s).
    fn of(
        slo: &[SloTier],
        good: Vec<usize>,
        completed: usize,
        per_s: impl Fn(f64) -> f64,
    ) -> Vec<TierResult> {
        slo.iter()
            .zip(good)
            .map(|(t, good)| TierResult {
                name: t.name.clone(),
                ttft_s: t.ttft_s,
                tpot_s: t.tpot_s,
                good,
                goodput: per_s(good as f64),
                attainment: if completed == 0 {
                    0.0
                } else {
                    good as f64 / completed as f64
                },
            })
            .collect()
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Identification of a run, for the report header.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunMeta {
    /// Scenario name.
    pub scenario: String,
    /// Deployment, e.g. `2E(TP1)+1P(TP2)+1D(TP4) B=8 s=1 …`.
    pub deployment: String,
    /// Model preset.
    pub model: String,
    /// GPU count × preset and link.
    pub cluster: String,
    /// Seed.
    pub seed: u64,
    /// Offered rate, requests/s.
    pub offered_rate: f64,
    /// Requests offered.
    pub requests: usize,
}

/// The reason beside `none` in a report no run of a scenario named a
/// bottleneck for (see [`Report::bottleneck`]).
pub const NOT_NAMED: &str =
    "not named: the report holds no stage loads (measured from outside the serving system)";

/// One `key value` line of the text report, the key padded to 42 columns.
fn line(s: &mut String, k: &str, v: String) {
    let _ = writeln!(s, "{k:<42}{v}");
}

/// The reuse lines: what the workload offers, each cache's hit rate.
fn text_reuse(s: &mut String, r: &ReuseReport) {
    let o = &r.offered;
    line(
        s,
        "Offered reuse (items / prompt tokens):",
        format!(
            "{:.1} % / {:.1} %",
            o.items_seen_before * 100.0,
            o.prompt_tokens_seen_before * 100.0
        ),
    );
    for (name, c) in [
        ("Encoder cache hit rate (items):", &r.encoder_cache),
        ("Prefix cache hit rate (tokens):", &r.prefix_cache),
    ] {
        if let Some(c) = c {
            line(
                s,
                name,
                format!("{:.1} % of {}", c.hit_rate * 100.0, c.queries),
            );
        }
    }
    if let Some(c) = &r.encoder_store {
        line(
            s,
            "Encoder store hit rate (items):",
            format!("{:.1} % of {}", c.hit_rate * 100.0, c.queries),
        );
        let gb = |b: u64| b as f64 / 1e9;
        line(
            s,
            "Encoder store fetched / written:",
            format!(
                "{:.2} GB / {:.2} GB ({} items; {} evicted)",
                gb(c.fetched_bytes),
                gb(c.written_bytes),
                c.writes,
                c.evictions
            ),
        );
    }
}

/// A section heading of the text report, centred in dashes.
fn head(s: &mut String, title: &str) {
    let _ = writeln!(s, "{:-^56}", title);
}

/// A stage's lifecycle moments in a record: `(ready, start, end)`; its wait
/// is `start − ready`, its service `end − start`.
type Pick = fn(&RequestRecord) -> (Stamp, Stamp, Stamp);

/// Where one stage's samples come from and go: the pass over the records
/// that gathers them ([`Latencies::gather`]), the buffer of its service
/// times and the buffer of its waits.
struct StagePick {
    name: &'static str,
    pick: Pick,
    pass: usize,
    serve: usize,
    /// `None` for the transfers: they have no queue of their own in the
    /// records (ready is their start, so every wait is 0; a link's queueing
    /// is part of its transfer), and their waits are not gathered.
    wait: Option<usize>,
}

/// The buffers of the first pass that TTFT, TPOT and E2E take.
const TTFT_BUF: usize = 0;
const TPOT_BUF: usize = 1;
const E2E_BUF: usize = 2;

/// The stages of [`STAGES`], in order: the encode stage's samples share the
/// first pass with TTFT, TPOT and E2E (buffers 3 and 4), the other stages'
/// fill the second (buffers 0–5).
const STAGE_PICKS: [StagePick; 5] = [
    StagePick {
        name: STAGES[0],
        pick: |r| (Stamp::at(r.arrival), r.encode_start, r.encode_end),
        pass: 0,
        serve: 3,
        wait: Some(4),
    },
    StagePick {
        name: STAGES[1],
        pick: |r| (r.encode_end, r.encode_end, r.prefill_ready),
        pass: 1,
        serve: 0,
        wait: None,
    },
    StagePick {
        name: STAGES[2],
        pick: |r| (r.prefill_ready, r.prefill_start, r.first_token),
        pass: 1,
        serve: 1,
        wait: Some(2),
    },
    StagePick {
        name: STAGES[3],
        pick: |r| (r.first_token, r.first_token, r.decode_ready),
        pass: 1,
        serve: 3,
        wait: None,
    },
    StagePick {
        name: STAGES[4],
        pick: |r| (r.decode_ready, r.decode_start, r.finish),
        pass: 1,
        serve: 4,
        wait: Some(5),
    },
];

/// The latencies of a run's finished requests: TTFT, TPOT, E2E and each
/// stage's `(requests, wait, service)`, in [`STAGE_PICKS`] order.
struct Latencies {
    ttft: Stats,
    tpot: Stats,
    e2e: Stats,
    stages: [(usize, Stats, Stats); 5],
}

impl Latencies {
    /// Gathered in two passes over `records` into one set of six buffers,
    /// reused: TTFT, TPOT, E2E and the encode stage in the first, the other
    /// stages in the second. `each` sees every record, in order, during the
    /// first. Every figure is independent of the order its samples come in,
    /// and each buffer gets them in record order. One pass for all of them
    /// held thirteen vectors of one `f64` per request beside the records
    /// (1.04 GB at 10,000,000 requests, docs/datacenter.md); these hold six,
    /// and the second pass costs a read of the records.
    fn gather(records: &[RequestRecord], mut each: impl FnMut(&RequestRecord)) -> Latencies {
        let span = |a: Stamp, b: Stamp| Some(b.get()? - a.get()?);
        let gather = |bufs: &mut [Vec<f64>; 6], r: &RequestRecord, pass: usize| {
            for p in STAGE_PICKS.iter().filter(|p| p.pass == pass) {
                let (ready, start, end) = (p.pick)(r);
                if let (Some(wait), Some(serve)) = (span(ready, start), span(start, end)) {
                    bufs[p.serve].push(serve);
                    if let Some(w) = p.wait {
                        bufs[w].push(wait);
                    }
                }
            }
        };
        let mut stages = [(0usize, Stats::default(), Stats::default()); 5];
        let stats_of =
            |bufs: &mut [Vec<f64>; 6], pass: usize, stages: &mut [(usize, Stats, Stats); 5]| {
                for (p, out) in STAGE_PICKS.iter().zip(stages.iter_mut()) {
                    if p.pass == pass {
                        let requests = bufs[p.serve].len();
                        let wait = p
                            .wait
                            .map_or(Stats::default(), |w| Stats::of_scratch(&mut bufs[w]));
                        *out = (requests, wait, Stats::of_scratch(&mut bufs[p.serve]));
                    }
                }
            };
        // sized once: growing by doubling would copy every sample log₂ n times
        let n = records.len();
        let mut bufs: [Vec<f64>; 6] = std::array::from_fn(|_| Vec::new());
        for b in &mut bufs[..5] {
            b.reserve_exact(n);
        }
        for r in records {
            each(r);
            if r.finish.is_none() {
                continue;
            }
            bufs[TTFT_BUF].extend(r.ttft());
            bufs[TPOT_BUF].extend(r.tpot());
            bufs[E2E_BUF].extend(r.e2e());
            gather(&mut bufs, r, 0);
        }
        let [ttft, tpot, e2e] =
            [TTFT_BUF, TPOT_BUF, E2E_BUF].map(|i| Stats::of_scratch(&mut bufs[i]));
        stats_of(&mut bufs, 0, &mut stages);
        for b in &mut bufs {
            b.clear();
            b.reserve_exact(n);
        }
        for r in records.iter().filter(|r| r.finish.is_some()) {
            gather(&mut bufs, r, 1);
        }
        stats_of(&mut bufs, 1, &mut stages);
        Latencies {
            ttft,
            tpot,
            e2e,
            stages,
        }
    }
}

impl Report {
    /// Build the report from per-request records.
    pub fn build(
        meta: RunMeta,
        records: &[RequestRecord],
        slo: &[SloTier],
        gpus: Vec<GpuReport>,
        encode: EncodeSummary,
        notes: Vec<String>,
    ) -> Report {
        let mut start = f64::INFINITY;
        let mut end = f64::NEG_INFINITY;
        let mut completed = 0usize;
        let (mut out_tokens, mut in_tokens) = (0u64, 0u64);
        let mut good = vec![0usize; slo.len()];
        let mut failures: Vec<FailureCount> = Vec::new();
        let mut refusals: Vec<FailureCount> = Vec::new();
        let mut aborts: Vec<FailureCount> = Vec::new();
        let mut rejected = 0usize;
        let latencies = Latencies::gather(records, |r| {
            start = start.min(r.arrival);
            rejected += usize::from(r.rejected);
            if let Some(reason) = &r.failure {
                FailureCount::count(&mut failures, reason);
            }
            if let Some(limit) = r.refused {
                FailureCount::count(&mut refusals, limit.name());
            }
            if let Some(why) = r.aborted {
                FailureCount::count(&mut aborts, why.name());
            }
            let Some(finish) = r.finish.get() else {
                return;
            };
            completed += 1;
            end = end.max(finish);
            let (ttft, tpot) = (r.ttft(), r.tpot());
            out_tokens += r.output_tokens as u64;
            in_tokens += r.prefill_tokens;
            for (n, t) in good.iter_mut().zip(slo) {
                *n += usize::from(
                    ttft.is_some_and(|x| x <= t.ttft_s) && tpot.is_some_and(|x| x <= t.tpot_s),
                );
            }
        });
        let duration = if completed == 0 {
            0.0
        } else {
            (end - start).max(1e-12)
        };
        let per_s = |x: f64| if duration > 0.0 { x / duration } else { 0.0 };
        let goodput = TierResult::of(slo, good, completed, per_s);
        let stage_busy = |stage: &str| {
            let v: Vec<f64> = gpus
                .iter()
                .filter(|g| g.stage == stage)
                .map(|g| g.busy_fraction)
                .collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        let stages: Vec<StageReport> = STAGE_PICKS
            .iter()
            .zip(latencies.stages)
            .map(|(p, (requests, queue, service))| StageReport {
                stage: p.name.to_string(),
                requests,
                queue,
                service,
                busy_fraction: stage_busy(p.name),
            })
            .collect();
        for counts in [&mut failures, &mut refusals, &mut aborts] {
            FailureCount::sort(counts);
        }
        Report {
            schema_version: REPORT_SCHEMA_VERSION,
            meta,
            completed,
            duration_s: duration,
            request_throughput: per_s(completed as f64),
            output_throughput: per_s(out_tokens as f64),
            total_token_throughput: per_s((out_tokens + in_tokens) as f64),
            ttft: latencies.ttft,
            tpot: latencies.tpot,
            e2e: latencies.e2e,
            goodput,
            stages,
            gpus,
            encode,
            bottleneck: "none".into(),
            bottleneck_reason: NOT_NAMED.into(),
            notes,
            events: 0,
            explanation: Explanation::default(),
            measured: false,
            failed: failures.iter().map(|f| f.count).sum(),
            rejected,
            failures,
            refused: refusals.iter().map(|f| f.count).sum(),
            refusals,
            aborted: aborts.iter().map(|f| f.count).sum(),
            aborts,
            windows: Vec::new(),
            planner: None,
            reuse: None,
            supervision: None,
            links: Vec::new(),
        }
    }

    /// The report as text, laid out like `vllm bench serve`'s summary.
    pub fn render_text(&self) -> String {
        let mut s = String::new();
        self.text_summary(&mut s);
        self.text_latencies(&mut s);
        self.text_goodput(&mut s);
        self.text_stages(&mut s);
        self.text_encode(&mut s);
        self.text_gpus(&mut s);
        self.text_explanation(&mut s);
        self.text_windows(&mut s);
        self.text_planner(&mut s);
        if let Some(sup) = &self.supervision {
            sup.render(&mut s);
        }
        LinkReport::render_all(&self.links, &mut s);
        self.text_footer(&mut s);
        s
    }

    /// The planner's account, when the run had one: GPU-hours, goodput per
    /// GPU-hour per tier, and each change with its time and duration.
    fn text_planner(&self, s: &mut String) {
        let Some(p) = &self.planner else {
            return;
        };
        head(s, " Planner ");
        line(s, "Policy:", p.policy.clone());
        line(s, "GPU-hours:", format!("{:.3}", p.gpu_hours));
        for t in &p.goodput_per_gpu_hour {
            line(
                s,
                &format!("Good requests per GPU-hour ({}):", t.tier),
                format!("{:.1}", t.value),
            );
        }
        line(s, "Changes:", p.changes.len().to_string());
        for c in &p.changes {
            let (when, what) = c.text_line();
            line(s, &when, what);
        }
    }

    /// The per-window table, when the run has windows: goodput and
    /// attainment of the `moderate` tier (else the middle one).
    fn text_windows(&self, s: &mut String) {
        if self.windows.is_empty() {
            return;
        }
        head(s, " Per window ");
        let tier = self
            .goodput
            .iter()
            .position(|t| t.name == "moderate")
            .unwrap_or(self.goodput.len() / 2);
        let name = self.goodput.get(tier).map_or("-", |t| t.name.as_str());
        s.push_str(&crate::windows::render_windows(&self.windows, tier, name));
    }

    /// The title, the run's identity, request counts and throughputs.
    fn text_summary(&self, s: &mut String) {
        let source = if self.measured {
            " Serving Benchmark Result (measured) "
        } else {
            " Serving Benchmark Result (simulated) "
        };
        let _ = writeln!(s, "{:=^56}", source);
        line(s, "Scenario:", self.meta.scenario.clone());
        line(s, "Model:", self.meta.model.clone());
        line(s, "Cluster:", self.meta.cluster.clone());
        line(s, "Deployment:", self.meta.deployment.clone());
        line(s, "Seed:", self.meta.seed.to_string());
        line(
            s,
            "Offered rate (req/s):",
            format!("{:.2}", self.meta.offered_rate),
        );
        line(
            s,
            "Successful requests:",
            format!("{} / {}", self.completed, self.meta.requests),
        );
        if self.rejected > 0 {
            line(
                s,
                "Rejected by admission (queue full):",
                self.rejected.to_string(),
            );
        }
        if self.refused > 0 {
            line(s, "Refused (over a limit):", self.refused.to_string());
            for f in &self.refusals {
                line(s, &format!("  {}", f.count), f.reason.clone());
            }
        }
        if self.aborted > 0 {
            line(s, "Aborted (client left):", self.aborted.to_string());
            for f in &self.aborts {
                line(s, &format!("  {}", f.count), f.reason.clone());
            }
        }
        if self.failed > 0 {
            line(s, "Failed requests:", self.failed.to_string());
            for f in &self.failures {
                line(s, &format!("  {}", f.count), f.reason.clone());
            }
        }
        line(
            s,
            "Benchmark duration (s):",
            format!("{:.2}", self.duration_s),
        );
        line(
            s,
            "Request throughput (req/s):",
            format!("{:.2}", self.request_throughput),
        );
        line(
            s,
            "Output token throughput (tok/s):",
            format!("{:.2}", self.output_throughput),
        );
        line(
            s,
            "Total token throughput (tok/s, incl. mm):",
            format!("{:.2}", self.total_token_throughput),
        );
    }

    /// Mean, median, P90 and P99 of TTFT, TPOT and end-to-end latency.
    fn text_latencies(&self, s: &mut String) {
        let ms = |x: f64| x * 1e3;
        for (title, abbr, st) in [
            (" Time to First Token ", "TTFT", &self.ttft),
            (
                " Time per Output Token (excl. 1st token) ",
                "TPOT",
                &self.tpot,
            ),
            (" End-to-end Latency ", "E2EL", &self.e2e),
        ] {
            head(s, title);
            line(
                s,
                &format!("Mean {abbr} (ms):"),
                format!("{:.2}", ms(st.mean)),
            );
            line(
                s,
                &format!("Median {abbr} (ms):"),
                format!("{:.2}", ms(st.p50)),
            );
            line(
                s,
                &format!("P90 {abbr} (ms):"),
                format!("{:.2}", ms(st.p90)),
            );
            line(
                s,
                &format!("P99 {abbr} (ms):"),
                format!("{:.2}", ms(st.p99)),
            );
        }
    }

    /// The goodput table, one row per SLO tier.
    fn text_goodput(&self, s: &mut String) {
        head(s, " Goodput per SLO tier ");
        let _ = writeln!(
            s,
            "{:<12}{:>10}{:>10}{:>8}{:>16}",
            "tier", "TTFT≤(s)", "TPOT≤(ms)", "good", "goodput(req/s)"
        );
        if self.goodput.is_empty() {
            let _ = writeln!(
                s,
                "(none: the scenario has no [[slo]] tiers; scenarios/README.md says how to add them)"
            );
        }
        for t in &self.goodput {
            let _ = writeln!(
                s,
                "{:<12}{:>10.2}{:>10.1}{:>8}{:>16.3}",
                t.name,
                t.ttft_s,
                t.tpot_s * 1e3,
                t.good,
                t.goodput
            );
        }
    }

    /// The per-stage queue and service table.
    fn text_stages(&self, s: &mut String) {
        let ms = |x: f64| x * 1e3;
        head(s, " Stages (ms) ");
        let _ = writeln!(
            s,
            "{:<20}{:>9}{:>9}{:>10}{:>9}{:>13}",
            "stage", "queue", "q P99", "service", "s P99", "GPU w/ work"
        );
        for st in &self.stages {
            let busy = st
                .busy_fraction
                .map(|b| format!("{:.0}%", b * 100.0))
                .unwrap_or_else(|| "-".into());
            if st.requests == 0 {
                // e.g. encode in a text-only run: no request passed through it
                let _ = writeln!(
                    s,
                    "{:<20}{:>9}{:>9}{:>10}{:>9}{:>13}",
                    st.stage, "-", "-", "-", "-", busy
                );
                continue;
            }
            let _ = writeln!(
                s,
                "{:<20}{:>9.1}{:>9.1}{:>10.1}{:>9.1}{:>13}",
                st.stage,
                ms(st.queue.mean),
                ms(st.queue.p99),
                ms(st.service.mean),
                ms(st.service.p99),
                busy
            );
        }
    }

    /// Encode passes, the encode dispatch and the remote prefill fraction.
    fn text_encode(&self, s: &mut String) {
        let e = &self.encode;
        line(
            s,
            "Encode passes / mean micro-batch:",
            format!("{} / {:.2}", e.passes, e.mean_batch),
        );
        if let Some(b) = &e.batcher {
            let mut d = b.policy.clone();
            if let Some(a) = b.max_age_s {
                let _ = write!(d, ", max_age {:.0} ms", a * 1e3);
            }
            line(s, "Encode dispatch:", d);
        }
        line(
            s,
            "Remote prefill fraction:",
            format!("{:.3}", e.remote_fraction),
        );
        if let Some(r) = &self.reuse {
            text_reuse(s, r);
        }
    }

    /// One line per GPU: its worker, stage, time with work and SM time. On
    /// the `cpu` device (the CPU executor's worker slots, or a simulation of
    /// it) the lines say `CPU slot`, not `GPU`.
    fn text_gpus(&self, s: &mut String) {
        let cpu = self.meta.cluster.split(' ').nth(1) == Some("cpu");
        let label = if cpu { "CPU slot" } else { "GPU" };
        head(
            s,
            if cpu {
                " Worker slots (host CPU) "
            } else {
                " GPUs "
            },
        );
        for g in &self.gpus {
            let _ = writeln!(
                s,
                "{label} {:<3}{:<10}{:<9} with work {:>5.1}%   SM-time {:>5.1}%",
                g.gpu,
                g.worker,
                g.stage,
                g.busy_fraction * 100.0,
                g.sm_utilization * 100.0
            );
        }
    }

    /// The stage loads and findings, if any.
    fn text_explanation(&self, s: &mut String) {
        let x = &self.explanation;
        if !x.loads.is_empty() || !x.findings.is_empty() {
            head(s, " Explanation ");
            if !x.loads.is_empty() {
                let _ = writeln!(
                    s,
                    "{:<12}{:>16}{:>18}{:>10}",
                    "stage", "offered (req/s)", "capacity (req/s)", "load"
                );
                for l in &x.loads {
                    let _ = writeln!(
                        s,
                        "{:<12}{:>16.2}{:>18.2}{:>10.2}",
                        l.stage, l.offered, l.capacity, l.load
                    );
                }
                let _ = writeln!(
                    s,
                    "(load = offered / capacity at full batches; \"GPU w/ work\" above is the time any work runs: a decode batch of one keeps it near 100 %)"
                );
            }
            for f in &x.findings {
                let _ = writeln!(s, "- {f}");
            }
        }
    }

    /// The bottleneck, its reason and the notes.
    fn text_footer(&self, s: &mut String) {
        head(s, "");
        line(s, "Bottleneck stage:", self.bottleneck.clone());
        let _ = writeln!(s, "  {}", self.bottleneck_reason);
        for n in &self.notes {
            for l in wrap(&format!("note: {n}"), NOTE_COLUMNS, "      ") {
                let _ = writeln!(s, "{l}");
            }
        }
        let _ = writeln!(s, "{:=^56}", "");
    }
}

/// Width the text report wraps its notes at, in characters (`--json` keeps
/// each note as one string).
pub const NOTE_COLUMNS: usize = 100;

/// `text` broken at spaces into lines of at most `width` characters (a word
/// longer than that stands alone), every line after the first starting with
/// `indent`.
fn wrap(text: &str, width: usize, indent: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    let mut len = 0;
    for word in text.split(' ') {
        let w = word.chars().count();
        if len > 0 && len + 1 + w > width {
            lines.push(std::mem::take(&mut line));
            line.push_str(indent);
            len = indent.chars().count();
            line.push_str(word);
            len += w;
        } else {
            if len > 0 {
                line.push(' ');
                len += 1;
            }
            line.push_str(word);
            len += w;
        }
    }
    lines.push(line);
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_pass_gives_every_sample_set_a_buffer_of_its_own() {
        for pass in 0..2 {
            let mut used: Vec<usize> = if pass == 0 {
                vec![TTFT_BUF, TPOT_BUF, E2E_BUF]
            } else {
                Vec::new()
            };
            for p in STAGE_PICKS.iter().filter(|p| p.pass == pass) {
                used.extend(std::iter::once(p.serve).chain(p.wait));
            }
            let n = used.len();
            used.sort_unstable();
            used.dedup();
            assert_eq!(used.len(), n, "pass {pass} shares a buffer: {used:?}");
            assert!(used.iter().all(|&b| b < 6));
        }
        let names: Vec<&str> = STAGE_PICKS.iter().map(|p| p.name).collect();
        assert_eq!(names, STAGES);
    }

    #[test]
    fn the_two_passes_give_what_one_vector_per_sample_set_gives() {
        // records with every stage, with no encode (text), unfinished, and
        // transfers whose wait is 0 by construction
        let records: Vec<RequestRecord> = (0..500u64)
            .map(|i| {
                let t = i as f64 * 0.37;
                let at = |x: f64| Stamp::at(t + x * (1.0 + (i % 7) as f64 * 0.13));
                let mut r = RequestRecord {
                    id: i,
                    arrival: t,
                    output_tokens: 1 + (i % 5) as u32,
                    prefill_tokens: 100 + i,
                    ..Default::default()
                };
                if i % 3 != 0 {
                    (r.encode_start, r.encode_end) = (at(0.01), at(0.05));
                }
                (r.prefill_ready, r.prefill_start, r.first_token) = (at(0.06), at(0.09), at(0.2));
                if i % 11 != 0 {
                    (r.decode_ready, r.decode_start, r.finish) = (at(0.21), at(0.3), at(0.9));
                }
                r
            })
            .collect();
        let mut seen = 0;
        let got = Latencies::gather(&records, |_| seen += 1);
        assert_eq!(seen, records.len());
        let done: Vec<&RequestRecord> = records.iter().filter(|r| r.finish.is_some()).collect();
        let of = |f: &dyn Fn(&RequestRecord) -> Option<f64>| {
            Stats::of(done.iter().filter_map(|r| f(r)).collect())
        };
        assert_eq!(got.ttft, of(&|r| r.ttft()));
        assert_eq!(got.tpot, of(&|r| r.tpot()));
        assert_eq!(got.e2e, of(&|r| r.e2e()));
        for (p, &(requests, wait, service)) in STAGE_PICKS.iter().zip(&got.stages) {
            let spans: Vec<(f64, f64)> = done
                .iter()
                .filter_map(|r| {
                    let (a, b, c) = (p.pick)(r);
                    Some((b.get()? - a.get()?, c.get()? - b.get()?))
                })
                .collect();
            assert_eq!(requests, spans.len(), "{}", p.name);
            assert!(requests > 0, "{}", p.name);
            assert_eq!(
                wait,
                Stats::of(spans.iter().map(|s| s.0).collect()),
                "{}",
                p.name
            );
            assert_eq!(
                service,
                Stats::of(spans.iter().map(|s| s.1).collect()),
                "{}",
                p.name
            );
        }
    }

    #[test]
    fn notes_wrap_at_spaces_within_the_width() {
        let text = "note: ".to_string() + &"word ".repeat(60) + "end";
        let lines = wrap(&text, NOTE_COLUMNS, "      ");
        assert!(lines.len() > 2, "{lines:?}");
        assert!(lines.iter().all(|l| l.chars().count() <= NOTE_COLUMNS));
        assert!(lines[1..].iter().all(|l| l.starts_with("      word")));
        let joined: Vec<&str> = lines.iter().flat_map(|l| l.split_whitespace()).collect();
        assert_eq!(joined.join(" "), text);
        assert_eq!(wrap("short", 100, "  "), vec!["short"]);
        let long = "x".repeat(150);
        assert_eq!(wrap(&long, 100, "  "), vec![long.clone()]);
    }

    #[test]
    fn planner_changes_read_in_the_field_s_terms() {
        let change = |change, from: Option<&str>, to: Option<&str>, ready: Option<f64>| {
            ChangeRecord {
                at: 900.0,
                change,
                from: from.map(str::to_string),
                to: to.map(str::to_string),
                stopped_at: None,
                ready_at: ready,
                failed_at: None,
                failure: None,
            }
            .text_line()
        };
        use easerve_sched::Change;
        // s' = 0.2 · 3 / 1 is not 0.6 in binary
        let s = change(Change::SetOffload { s: 0.2 * 3.0 }, None, None, None);
        assert_eq!(s, ("  at 900 s".into(), "set s = 0.600 (at once)".into()));
        let b = change(Change::SetBatch { max_batch: 4 }, None, None, None);
        assert_eq!(b.1, "set B = 4 (at once)");
        let w = easerve_sched::WorkerRef::Prefill(1);
        let add = change(Change::Start { worker: w }, None, Some("P1"), Some(901.4));
        assert_eq!(add.1, "add P1 (1.4 s)");
    }

    #[test]
    fn stats_percentiles() {
        let s = Stats::of((1..=101).map(|x| x as f64).collect());
        assert_eq!(s.p50, 51.0);
        assert_eq!(s.p90, 91.0);
        assert_eq!(s.p99, 100.0);
        assert_eq!(s.mean, 51.0);
        assert_eq!(Stats::of(vec![]), Stats::default());
    }

    #[test]
    fn compensated_sum_keeps_what_a_plain_sum_loses() {
        assert_eq!(compensated_sum(&[1e16, 1.0, -1e16]), 1.0);
        assert_eq!([1e16, 1.0, -1e16].iter().sum::<f64>(), 0.0);
        assert_eq!(compensated_sum(&[0.1; 10]), 1.0);
        assert_ne!([0.1; 10].iter().sum::<f64>(), 1.0);
        assert_eq!(compensated_sum(&[]), 0.0);
    }

    #[test]
    fn total_order_keys_round_trip_in_order() {
        let xs = [
            f64::NEG_INFINITY,
            -2.5,
            -0.0,
            0.0,
            1e-300,
            0.25,
            3.0,
            f64::INFINITY,
        ];
        let keys: Vec<u64> = xs.iter().map(|&x| total_order_key(x)).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        for (&x, &k) in xs.iter().zip(&keys) {
            assert_eq!(from_total_order_key(k).to_bits(), x.to_bits());
        }
    }

    #[test]
    fn percentiles_select_the_same_order_statistics_as_a_sort() {
        // a shuffled sample with ties: selection must agree with sorting
        let xs: Vec<f64> = (0..1001u64)
            .map(|i| ((i * 7919) % 1001 / 3) as f64)
            .collect();
        let mut sorted = xs.clone();
        sorted.sort_by(f64::total_cmp);
        let pct = |p: f64| {
            let pos = p / 100.0 * 1000.0;
            let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
            sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
        };
        let s = Stats::of(xs);
        assert_eq!(
            (s.p50, s.p90, s.p99, s.max),
            (pct(50.0), pct(90.0), pct(99.0), sorted[1000])
        );
    }

    /// Larger samples of other shapes: with ties, within one binade, spread
    /// over many exponents, with negative values, and constant; against a sort.
    #[test]
    fn selection_agrees_with_a_sort_on_large_samples() {
        let n = 40_001u64;
        let shuffled = |i: u64| (i * 104_729) % n;
        let cases: Vec<(&str, Vec<f64>)> = vec![
            ("ties", (0..n).map(|i| (shuffled(i) / 7) as f64).collect()),
            (
                "one binade",
                (0..n).map(|i| 1.0 + shuffled(i) as f64 * 1e-9).collect(),
            ),
            (
                "many exponents",
                (0..n)
                    .map(|i| (shuffled(i) as f64 * 0.001).exp2())
                    .collect(),
            ),
            (
                "negatives",
                (0..n).map(|i| shuffled(i) as f64 - 20_000.5).collect(),
            ),
            ("constant", vec![0.25; n as usize]),
        ];
        for (name, xs) in cases {
            let mut sorted = xs.clone();
            sorted.sort_by(f64::total_cmp);
            let last = (n - 1) as f64;
            let pct = |p: f64| {
                let pos = p / 100.0 * last;
                let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
                sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
            };
            let s = Stats::of(xs);
            assert_eq!(
                (s.p50, s.p90, s.p99, s.max),
                (pct(50.0), pct(90.0), pct(99.0), sorted[n as usize - 1]),
                "{name}"
            );
        }
    }

    #[test]
    fn goodput_counts_requests_meeting_every_slo() {
        let rec = |id, ttft: f64, finish: f64, out| RequestRecord {
            id,
            arrival: 0.0,
            output_tokens: out,
            first_token: easerve_sched::Stamp::at(ttft),
            finish: easerve_sched::Stamp::at(finish),
            ..Default::default()
        };
        // TPOT = (finish - ttft)/(out - 1)
        let records = vec![
            rec(0, 1.0, 2.0, 11),
            rec(1, 3.0, 4.0, 11),
            rec(2, 1.0, 10.0, 11),
            rec(3, 0.5, 0.5, 1),
        ];
        let tier = SloTier {
            name: "t".into(),
            ttft_s: 2.0,
            tpot_s: 0.2,
        };
        let r = Report::build(
            RunMeta::default(),
            &records,
            &[tier],
            vec![],
            EncodeSummary::default(),
            vec![],
        );
        assert_eq!(r.goodput[0].good, 2); // 0 and 3 (tpot 0 for output 1)
        assert!((r.duration_s - 10.0).abs() < 1e-12);
        assert!((r.goodput[0].goodput - 0.2).abs() < 1e-12);
        assert_eq!(r.completed, 4);
    }
}
