//! The scenario file as written: [`ScenarioFile`] and its sections, plain
//! data with unknown fields rejected; parsing TOML with errors that name the
//! field ([`ScenarioFile::parse`]); the command-line [`Overrides`] and the
//! serving [`System`] they may name; and `--set`'s dotted paths
//! (`set_path`). Nothing here checks a value: that is `validate/`.

use super::ScenarioError;
use easerve_calib::{GpuSpec, LinkSpec};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The raw scenario file. All fields are plain data; see `scenarios/README.md`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    /// Scenario name (default: the file stem).
    pub name: Option<String>,
    /// Master seed of every RNG stream (default 0).
    #[serde(default)]
    pub seed: u64,
    /// Where stage costs come from: unset (default: `cluster.kernels` decides),
    /// `"roofline"` (the roofline whatever `cluster.kernels` says) or the path of
    /// a profile file (`easerve calib roofline`, measured or imported), relative
    /// to the scenario file's folder.
    pub profile: Option<String>,
    /// The model.
    pub model: ModelSection,
    /// The GPUs.
    pub cluster: ClusterSection,
    /// Allocation and knobs.
    pub deployment: DeploymentSection,
    /// Arrivals and request shapes.
    pub workload: WorkloadSection,
    /// SLO tiers, strict → relaxed.
    #[serde(default)]
    pub slo: Vec<SloSection>,
    /// What one request may ask for (`[limits]`; vLLM's defaults when absent).
    #[serde(default)]
    pub limits: LimitsSection,
    /// A planner that changes the deployment while it runs (`[planner]`;
    /// absent: none, the deployment as given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planner: Option<PlannerSection>,
}

/// `[planner]`: which planner changes the deployment while it runs, and
/// how often (`sched::planner`).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PlannerSection {
    /// `static` (default), `load` or `twin`.
    pub policy: Option<String>,
    /// Seconds between decisions (default: `workload.window_s`).
    pub window_s: Option<f64>,
    /// Least seconds between two changes (default: the window), at least
    /// the longest model load.
    pub dwell_s: Option<f64>,
    /// Seconds the `twin` policy simulates ahead (default 600).
    pub horizon_s: Option<f64>,
    /// GB/s a worker loads its model's weights at (default: the cluster's
    /// link, `cluster.link`, as the path from host memory to the GPU).
    pub load_bandwidth_gbs: Option<f64>,
    /// Measured seconds from a worker's start to its model being loaded,
    /// per stage: `[encode, prefill, decode]` (for instance a run's
    /// `planner.changes[].ready_at` less each start in `easerve exec`'s
    /// report). Replaces the derivation from `load_bandwidth_gbs`, which
    /// counts the weights' bytes only (no process start, no warm-up).
    pub load_s: Option<Vec<f64>>,
    /// The SLO tier whose goodput the `twin` policy counts (default
    /// `moderate`, else the last tier).
    pub tier: Option<String>,
    /// `load` policy: requests queued per worker above which a stage grows
    /// (default 0.5, Dynamo's), below which it may shrink (`queue_down`,
    /// default 0.2).
    pub queue_up: Option<f64>,
    /// See `queue_up`.
    pub queue_down: Option<f64>,
    /// `load` policy: decode KV use above which decode grows (default 0.9),
    /// below which it may shrink (`kv_down`, default 0.5).
    pub kv_up: Option<f64>,
    /// See `kv_up`.
    pub kv_down: Option<f64>,
    /// `load` policy: the fraction of a window the encode or prefill
    /// workers were busy (busy worker-seconds over the window times the
    /// workers active at its end) above which the stage grows (`busy_up`,
    /// in (0, 1)) and below which it may shrink (`busy_down`, in
    /// [0, `busy_up`)); give both or neither (default: not watched).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_up: Option<f64>,
    /// See `busy_up`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_down: Option<f64>,
    /// `load` policy: the queue compared with `queue_up` and `queue_down`,
    /// `end` (at the window's end, the default) or `mean` (averaged over
    /// the window).
    pub queue_signal: Option<String>,
}

/// `[model]`
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// A preset name of `easerve-model` (give this or `file`).
    pub preset: Option<String>,
    /// A TOML file defining a custom model (the fields of `easerve_model::ModelArch`;
    /// example: `scenarios/custom/qwen2.5-vl-7b.toml`), relative to the scenario's folder.
    pub file: Option<String>,
    /// How an MoE model's tokens spread over its experts: `balanced`,
    /// `power_law_1.01` or `power_law_1.2` (the distributions aiconfigurator
    /// measured its MoE kernels with); default the model file's, else balanced.
    pub moe_routing: Option<String>,
    /// The LLM's weights and activations in prefill and decode: `bfloat16` or
    /// `fp8` (vLLM's and SGLang's `--quantization fp8`: FP8 weights, dynamic
    /// FP8 activations); the encoder stays BF16. Default: the model's.
    pub dtype: Option<String>,
    /// The KV cache: `bfloat16` or `fp8` (`--kv-cache-dtype fp8`). Default:
    /// the LLM's dtype.
    pub kv_cache_dtype: Option<String>,
    /// Gemma 3's pan-and-scan crops (`do_pan_and_scan`, with HF's default
    /// crop rule), for a SigLIP encoder only. Default: the model's (off).
    pub pan_and_scan: Option<bool>,
}

/// `cluster.link`: a preset name or the link's figures.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(untagged)]
pub enum LinkChoice {
    /// A preset of [`LinkSpec::preset`].
    Preset(String),
    /// `{ name, bandwidth_gbs (GB/s per direction), latency_s (s per transfer) }`.
    Inline(LinkSpec),
}

/// `[cluster]`
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// A GPU preset name of `easerve-calib` (give this or `gpu_file`).
    pub gpu: Option<String>,
    /// A TOML file defining a custom GPU (the fields of `easerve_calib::GpuSpec`;
    /// example: `scenarios/custom/l40s.toml`), relative to the scenario's folder.
    pub gpu_file: Option<String>,
    /// GPUs in the cluster (with `groups`: absent, or their total).
    #[serde(default)]
    pub gpus: i64,
    /// The GPU-to-GPU link (default: the GPU's own): a preset name, or an
    /// inline table `{ name, bandwidth_gbs, latency_s }`.
    pub link: Option<LinkChoice>,
    /// Cost source when no profile is given: `"auto"` (default: measured kernels
    /// where the GPU preset has aiconfigurator tables or a proxy — the RTX 6000
    /// Ada is priced from the L40S's — else the roofline), `"roofline"`, or
    /// `"l40s-proxy"` (only for the RTX 6000 Ada: the same as `auto` there).
    pub kernels: Option<String>,
    /// Seconds of preprocessing on this deployment's host per second on the machine
    /// that measured it (`calib/preprocess/`); default 1.
    pub host_cpu_scale: Option<f64>,
    /// CPU cores of the hosts serving the cluster, all nodes together (default:
    /// 6 per GPU, the EAServe paper's testbed of 48 cores for 8 GPUs; 1 per
    /// GPU on the `cpu` device, whose cores are the device). An encode
    /// worker preprocesses on `host_cores / gpus` threads
    /// (`deployment.preprocess_threads` overrides). On the `cpu` device,
    /// when given, the cores of the one host every worker shares, whose
    /// sharing the simulator prices (`Scenario::cpu_host_cores`).
    pub host_cores: Option<i64>,
    /// Node groups (`[[cluster.groups]]`): a cluster of several nodes or GPU
    /// types. Without them the cluster is one node of `gpus` GPUs of type
    /// `gpu` joined by `link`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupSection>,
}

/// `[[cluster.groups]]`: `nodes` identical nodes.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GroupSection {
    /// The group's name (unique; `deployment.groups` refers to it).
    pub name: String,
    /// Nodes in the group, ≥ 1.
    pub nodes: i64,
    /// GPUs per node, ≥ 1.
    pub gpus_per_node: i64,
    /// A GPU preset name (give this or `gpu_file`).
    pub gpu: Option<String>,
    /// A custom GPU file, relative to the scenario's folder.
    pub gpu_file: Option<String>,
    /// The intra-node GPU-to-GPU link (default: the GPU's own): a preset
    /// name or an inline table `{ name, bandwidth_gbs, latency_s }`.
    pub link: Option<LinkChoice>,
    /// The node's NIC bandwidth, GB/s per direction, all its ports together
    /// (8 × 400 Gb/s InfiniBand NDR = 400 GB/s; 2 × 100 GbE = 25 GB/s).
    pub nic_bandwidth_gbs: f64,
    /// Seconds a NIC transfer takes beyond its bytes (the NIC's latency).
    pub nic_latency_s: f64,
    /// Dollars per GPU-hour (needed on every group by a cost objective).
    pub cost_per_gpu_hour: Option<f64>,
}

/// `[deployment.groups]`: the node group each stage runs on (default: the
/// groups in order, first fit).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct StageGroupsSection {
    /// The group of the encode workers (and their local prefill workers).
    pub encode: Option<String>,
    /// The group of the remote prefill workers.
    pub prefill: Option<String>,
    /// The group of the decode workers.
    pub decode: Option<String>,
}

/// `[deployment]`
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentSection {
    /// Allocation in the paper's notation, e.g. `2E(TP1)+1P(TP2)+1D(TP4)`.
    pub allocation: String,
    /// Serving system: `easerve` (default), `passthrough`, `aggregated`,
    /// `epd-serve` or `hydrainfer`.
    pub system: Option<String>,
    /// Serving framework whose fixed encode costs (per pass, per request) and
    /// preprocessing implementation are charged: `easerve`, `passthrough`,
    /// `aggregated`, `epd-serve` or `hydrainfer` (default: the system's own). Runs one system's scheduling on
    /// another's framework, e.g. micro-batching added to a pass-through framework
    /// (the EAServe paper's Table 1).
    pub framework: Option<String>,
    /// Encode micro-batch bound B (≥ 1).
    pub batch: i64,
    /// Offload ratio s ∈ [0, 1].
    pub offload: f64,
    /// `poisson-gap` (default), `immediate`, `fixed-timeout:SECONDS`, `queue-length:K`.
    pub dispatch: Option<String>,
    /// Poisson-gap quantile q ∈ (0, 1) (default 0.9).
    pub gap_quantile: Option<f64>,
    /// Max-age safety valve, seconds (default `T_enc(B)`).
    pub max_age_s: Option<f64>,
    /// `deficit` (default), `random`, `windowed:W`.
    pub router: Option<String>,
    /// How the Poisson-gap rule estimates the arrival rate: `window`
    /// (default: the last 16 gaps), `fixed` (the scenario's rate) or
    /// `ewma:TAU_S` (an EWMA of time constant TAU_S seconds, which the
    /// offload router tracks too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_estimator: Option<String>,
    /// `dynamic` (default), `none`, `static:F`.
    pub sm_policy: Option<String>,
    /// Prefill token budget per batch (default 8192).
    pub prefill_token_budget: Option<i64>,
    /// Prefill sequences per batch (default 64).
    pub prefill_max_seqs: Option<i64>,
    /// Decode running-batch cap (default 256).
    pub decode_max_batch: Option<i64>,
    /// Embedding envelopes an encode worker may have in flight before it holds
    /// its next micro-batch (backpressure; default 4).
    pub max_inflight_transfers: Option<i64>,
    /// KV-cache block size in tokens (default 16).
    pub kv_block_size: Option<i64>,
    /// Fraction of GPU memory usable for weights + KV cache (default 0.9).
    pub gpu_memory_utilization: Option<f64>,
    /// Admission control: requests admitted and not yet finished beyond which
    /// an arrival is rejected (counted in the report). Unset: admit all.
    pub admission_limit: Option<i64>,
    /// TP degree of each replica of the `aggregated` system (default: the
    /// smallest that holds the LLM, its encoder and one longest sequence);
    /// the cluster runs `gpus / aggregated_tp` replicas.
    pub aggregated_tp: Option<i64>,
    /// How the engine launches each stage's passes: eagerly or from captured
    /// CUDA graphs (`[deployment.launch]`; default: vLLM's).
    pub launch: Option<LaunchSection>,
    /// Host preprocessing of the encode stage: `pipelined` (its own CPU
    /// stage: each request is preprocessed on the encode worker's threads as
    /// soon as it is placed there, while earlier passes hold the GPU) or
    /// `serial` (each pass preprocesses its micro-batch on one thread, then
    /// runs its GPU phase). Default: `pipelined` for the easerve and
    /// hydrainfer frameworks on a GPU, `serial` for the pass-through framework
    /// (its calibration charged preprocessing in series), for epd-serve
    /// (whose passes preprocess their shards) and on the `cpu` device (the
    /// cores that would preprocess are the ones that encode).
    pub preprocess: Option<String>,
    /// Preprocessing threads per encode worker when pipelined (1 ..= 1,024;
    /// default `cluster.host_cores / cluster.gpus`, at least 1).
    pub preprocess_threads: Option<i64>,
    /// The encoder cache of each encode worker (absent: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoder_cache: Option<EncoderCacheSection>,
    /// The prefix cache of each prefill worker (absent: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_cache: Option<PrefixCacheSection>,
    /// Cache-aware placement (absent: least outstanding work).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_routing: Option<CacheRoutingSection>,
    /// The encoder-output store shared by the encode workers (absent: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoder_store: Option<EncoderStoreSection>,
    /// The node group of each stage (`[deployment.groups]`; only with
    /// `[[cluster.groups]]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<StageGroupsSection>,
}

/// `[deployment.launch]`: the engine's launch mode per stage
/// ([`easerve_calib::launch`]). Applies to the measured-kernel cost source; a
/// measured profile already holds its engine's launches.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchSection {
    /// Whose defaults: `vllm` (default), `sglang` or `easerve`.
    pub engine: Option<String>,
    /// Encode stage: `eager` or `graph`.
    pub encode: Option<String>,
    /// Prefill stage: `eager` or `graph`.
    pub prefill: Option<String>,
    /// Decode stage: `eager` or `graph`.
    pub decode: Option<String>,
    /// The largest encode or prefill pass, tokens, that captured graphs cover
    /// (1 ..= 1,048,576; default: the engine's).
    pub graph_max_tokens: Option<i64>,
    /// The largest decode step, sequences, that captured graphs cover
    /// (1 ..= 65,536; default: the engine's).
    pub graph_max_batch: Option<i64>,
    /// Host microseconds per eagerly launched kernel (0 ..= 10,000; default
    /// 16.35, measured: [`easerve_calib::launch::EAGER_LAUNCH_S`]).
    pub per_launch_us: Option<f64>,
}

/// `[workload]`
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSection {
    /// Requests in the run.
    pub requests: i64,
    /// Mean arrival rate, requests/s (required unless replaying a trace; with a
    /// trace, rescales it to this mean rate).
    pub rate: Option<f64>,
    /// `poisson` (default), `gamma` or `trace`.
    pub arrival: Option<String>,
    /// Trace CSV in the Azure LLM inference trace format (`arrival = "trace"`),
    /// relative to the scenario file's folder.
    pub trace: Option<String>,
    /// Speed-up of the trace's arrivals (> 1 = more requests per second; default 1).
    pub rate_scale: Option<f64>,
    /// Coefficient of variation of inter-arrival gaps (gamma only, default 1).
    pub cv: Option<f64>,
    /// `image`, `video`, `audio` or `text`.
    pub modality: String,
    /// Mean text prompt tokens (vllm `--random-input-len`); from the trace when replaying one.
    pub input_len: Option<i64>,
    /// Mean output tokens (vllm `--random-output-len`); from the trace when replaying one.
    pub output_len: Option<i64>,
    /// Lengths uniform in `[len·(1−r), len·(1+r)]` (vllm `--random-range-ratio`, default 0).
    pub range_ratio: Option<f64>,
    /// Image shapes.
    pub image: Option<ItemsSection<ImageBucket>>,
    /// Video shapes.
    pub video: Option<ItemsSection<VideoBucket>>,
    /// Audio durations.
    pub audio: Option<AudioSection>,
    /// A time-varying rate (`[[workload.phases]]`, laid end to end and
    /// repeated); with `rate` too, rescaled to that mean rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phases: Option<Vec<PhaseSection>>,
    /// Length of the report's windows, seconds (default with `phases`: one
    /// 24th of the schedule; without, no windows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_s: Option<f64>,
    /// Clients give up this many seconds after their request's arrival: a
    /// request not finished by then is aborted (counted apart from failures);
    /// default: clients wait for ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// Items drawn from a pool of repeated media (`[workload.pool]`);
    /// absent: every item is unique.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolSection>,
    /// Multi-turn conversations (`[workload.conversation]`); absent: every
    /// request is a conversation of one turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<ConversationSection>,
    /// Shared system prompts (`[workload.system_prompt]`); absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<SystemPromptSection>,
}

/// `[deployment.encoder_cache]`: each encode worker keeps encoder outputs
/// keyed by item content, least recently used evicted first.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EncoderCacheSection {
    /// Embeddings each encode worker keeps, GiB (at least one item's, at
    /// most the GPU's memory).
    pub capacity_gib: f64,
    /// The front end hashes raw bytes, so a hit skips preprocessing too
    /// (default false: vLLM hashes the processed item).
    pub hash_raw_bytes: Option<bool>,
}

/// `[deployment.encoder_store]`: one store of encoder outputs every encode
/// worker reads and writes, keyed by item content, least recently used
/// evicted first (vLLM's EC connector, Mooncake Store). It sits in the host
/// memory of the cluster's first node.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EncoderStoreSection {
    /// Embeddings the store keeps, GiB (at least one item's, at most
    /// 1,048,576 GiB).
    pub capacity_gib: f64,
    /// The link a worker on the store's node reaches it over: a preset or
    /// `{ name, bandwidth_gbs, latency_s }`, as `cluster.link` (absent: the
    /// node's intra-node link). Workers on other nodes use the NICs.
    pub link: Option<LinkChoice>,
}

/// `[deployment.prefix_cache]`: each prefill worker keeps the KV blocks of
/// earlier prompts in its KV pool, keyed by the hash chain of their
/// content (tokens and item hashes), least recently used evicted first.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PrefixCacheSection {
    /// Tokens per KV block: a power of two, 1 ..= 1,024 (default 16, as vLLM).
    pub block_size: Option<i64>,
}

/// `[deployment.cache_routing]`: place requests on encode and prefill
/// workers by what their caches hold, bounded by load (as Dynamo's KV
/// router: `overlap_weight × new work + outstanding work`, lower is better).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CacheRoutingSection {
    /// Weight of the work a worker's cache does not hold against the work
    /// already placed there (0 ..= 100; default 1, Dynamo's
    /// `--kv-overlap-score-weight` default).
    pub overlap_weight: Option<f64>,
}

/// `[workload.pool]`: the media items of the run are drawn from a pool of
/// `size` distinct items, each with a stable content id (from the seed and
/// its index) and a shape drawn once from the bucket table.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSection {
    /// Distinct items in the pool (1 ..= 10^7).
    pub size: i64,
    /// `zipf` (default) or `uniform`: how often each item is drawn.
    pub popularity: Option<String>,
    /// Zipf exponent α ≥ 0 (default 1; 0 is uniform): item `k` (from 1) is
    /// drawn with probability ∝ `k^−α`.
    pub alpha: Option<f64>,
}

/// `[workload.conversation]`: requests come in conversations of `turns`
/// turns; each turn resends the earlier turns (their text, answers and
/// media), so its prompt grows.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConversationSection {
    /// Turns per conversation (1 ..= 1,000).
    pub turns: i64,
    /// Mean think time between one turn's arrival and the next, seconds
    /// (exponential; 0 ..= 10^6; default 0).
    pub think_time_s: Option<f64>,
}

/// `[workload.system_prompt]`: every request starts with one of `count`
/// distinct system prompts of `tokens` tokens (a conversation keeps its own).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SystemPromptSection {
    /// Tokens of each system prompt (1 ..= 10^6).
    pub tokens: i64,
    /// Distinct system prompts (1 ..= 10^6; default 1).
    pub count: Option<i64>,
}

/// `[[workload.phases]]`: one phase of a rate schedule. `kind` says which
/// fields it takes: `constant` (`duration_s`, `rate`), `ramp` (`duration_s`,
/// `from`, `to`), `diurnal` (`duration_s`, `period_s`, `peak`, `trough`),
/// `burst` (`duration_s`, `on_s`, `off_s`, `peak`, `trough`), `servegen`
/// (`trace`: a ServeGen `chunk-N-trace.csv`, relative to the scenario; its
/// own window length, checked against `window_s` when given).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseSection {
    /// `constant`, `ramp`, `diurnal`, `burst` or `servegen`.
    pub kind: String,
    /// Length, seconds.
    pub duration_s: Option<f64>,
    /// Constant rate, requests/s.
    pub rate: Option<f64>,
    /// Ramp start rate, requests/s.
    pub from: Option<f64>,
    /// Ramp end rate, requests/s.
    pub to: Option<f64>,
    /// Diurnal period, seconds.
    pub period_s: Option<f64>,
    /// Diurnal or burst peak rate, requests/s.
    pub peak: Option<f64>,
    /// Diurnal or burst trough rate, requests/s.
    pub trough: Option<f64>,
    /// Burst: seconds on.
    pub on_s: Option<f64>,
    /// Burst: seconds off.
    pub off_s: Option<f64>,
    /// ServeGen trace CSV.
    pub trace: Option<String>,
    /// ServeGen window length, seconds (checked against the trace's).
    pub window_s: Option<f64>,
    /// Share of the phase's arrivals that carry the scenario's media, in
    /// [0, 1] (default 1); the rest are text-only.
    pub media_share: Option<f64>,
}

/// `[workload.image]` and `[workload.video]`: items per request and a bucket
/// table of shapes with probabilities (like vllm `--random-mm-bucket-config`).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ItemsSection<B> {
    /// Mean items per request (default 1).
    pub items_per_request: Option<i64>,
    /// Items uniform in `[n·(1−r), n·(1+r)]`, at least 1 (default 0).
    pub items_range_ratio: Option<f64>,
    /// Shape buckets with probabilities.
    pub buckets: Vec<B>,
}

/// One image size bucket.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ImageBucket {
    /// Pixels.
    pub height: i64,
    /// Pixels.
    pub width: i64,
    /// Relative weight (normalised over the table).
    pub probability: f64,
}

/// One video shape bucket.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct VideoBucket {
    /// Sampled frames.
    pub frames: i64,
    /// Pixels.
    pub height: i64,
    /// Pixels.
    pub width: i64,
    /// Relative weight.
    pub probability: f64,
}

/// `[workload.audio]`
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AudioSection {
    /// Mean clip duration, seconds (log-normal).
    pub mean_s: f64,
    /// Log-normal shape σ (spread; default 0.5).
    pub sigma: Option<f64>,
    /// Cap on a clip's duration, seconds (default 30: one Whisper window).
    pub max_s: Option<f64>,
}

/// `[[slo]]`
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SloSection {
    /// Tier name.
    pub name: String,
    /// TTFT bound, seconds.
    pub ttft_s: f64,
    /// TPOT bound, milliseconds.
    pub tpot_ms: f64,
}

/// `[limits]`: what one request may ask for; a request over a limit is
/// refused at arrival (`easerve_sched::Limits`). Every field is optional.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// Most tokens, prompt plus completion, of one request.
    pub max_model_len: Option<i64>,
    /// Most prompt tokens (text and media) one prefill pass takes whole.
    pub max_prefill_tokens: Option<i64>,
    /// Most items per request by modality, e.g. `{ image = 16, video = 1 }`
    /// (vLLM's `--limit-mm-per-prompt`; 999 for a modality not named).
    pub limit_mm_per_prompt: Option<std::collections::BTreeMap<String, i64>>,
    /// Most pixels of one image, decoded.
    pub max_image_pixels: Option<i64>,
    /// Most frames of one video.
    pub max_video_frames: Option<i64>,
    /// Most seconds of one audio clip.
    pub max_audio_seconds: Option<f64>,
    /// Most bytes of decoded media per request (RGB8 pixels, f32 samples at 16 kHz).
    pub max_media_bytes: Option<i64>,
}

/// Overrides from the command line, applied to the raw file before validation.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `--seed`.
    pub seed: Option<u64>,
    /// `--rate`.
    pub rate: Option<f64>,
    /// `--requests`.
    pub requests: Option<i64>,
    /// Replace the allocation.
    pub allocation: Option<String>,
    /// Replace B.
    pub batch: Option<i64>,
    /// Replace s.
    pub offload: Option<f64>,
    /// Run the scenario as another system (see [`System`]).
    pub system: Option<System>,
    /// `--profile`: take stage costs from this profile (a path as given on the
    /// command line, relative to the working directory) instead of the scenario's.
    pub profile: Option<std::path::PathBuf>,
    /// `--max-model-len`, `--limit-mm-per-prompt` and the other limit flags:
    /// each given field replaces the scenario's in `[limits]`.
    pub limits: LimitsSection,
    /// `--rate-estimator`: `window`, `fixed` or `ewma:TAU_S`.
    pub rate_estimator: Option<String>,
    /// `--planner`: `static`, `load` or `twin` (`planner.policy`).
    pub planner: Option<String>,
    /// Replace `[deployment.groups]`, the node group of each stage (a
    /// searched deployment on node groups, `groups=ENCODE,PREFILL,DECODE`).
    pub groups: Option<StageGroupsSection>,
}

pub use easerve_sched::System;

impl Overrides {
    /// The command-line flag that set `field`, if one did.
    pub fn flag_for(&self, field: &str) -> Option<&'static str> {
        let set = |given: bool, flag| given.then_some(flag);
        match field {
            "seed" => set(self.seed.is_some(), "--seed"),
            "workload.rate" => set(self.rate.is_some(), "--rate"),
            "workload.requests" => set(self.requests.is_some(), "--requests"),
            "deployment.allocation" => set(self.allocation.is_some(), "--allocation"),
            "deployment.batch" => set(self.batch.is_some(), "--batch"),
            "deployment.offload" => set(self.offload.is_some(), "--offload"),
            "deployment.system" => set(self.system.is_some(), "--system"),
            "profile" => set(self.profile.is_some(), "--profile"),
            "limits.max_model_len" => set(self.limits.max_model_len.is_some(), "--max-model-len"),
            "limits.max_prefill_tokens" => set(
                self.limits.max_prefill_tokens.is_some(),
                "--max-prefill-tokens",
            ),
            f if f.starts_with("limits.limit_mm_per_prompt") => set(
                self.limits.limit_mm_per_prompt.is_some(),
                "--limit-mm-per-prompt",
            ),
            "limits.max_image_pixels" => {
                set(self.limits.max_image_pixels.is_some(), "--max-image-pixels")
            }
            "limits.max_video_frames" => {
                set(self.limits.max_video_frames.is_some(), "--max-video-frames")
            }
            "limits.max_audio_seconds" => set(
                self.limits.max_audio_seconds.is_some(),
                "--max-audio-seconds",
            ),
            "limits.max_media_bytes" => {
                set(self.limits.max_media_bytes.is_some(), "--max-media-bytes")
            }
            "deployment.rate_estimator" => set(self.rate_estimator.is_some(), "--rate-estimator"),
            "planner.policy" => set(self.planner.is_some(), "--planner"),
            _ => None,
        }
    }

    /// Blame an error on the command line when the field came from a flag.
    pub fn attribute(&self, mut e: ScenarioError) -> ScenarioError {
        if let Some(flag) = self.flag_for(&e.field) {
            e.file = format!("{} (with {flag} from the command line)", e.file);
            e.field = format!("{flag} / {}", e.field);
        }
        e
    }
}

impl ScenarioFile {
    /// A copy whose relative paths (`profile` unless `"roofline"`,
    /// `model.file`, `cluster.gpu_file`, `workload.trace`), which resolve
    /// against the scenario file's folder, are made absolute against the
    /// folder of `file`, so the copy reads the same files from any folder.
    pub fn with_absolute_paths(&self, file: &Path) -> ScenarioFile {
        let dir = file.parent().unwrap_or(Path::new("."));
        let abs = |p: &mut Option<String>| {
            if let Some(s) = p.as_mut() {
                let path = Path::new(s.as_str());
                if path.is_relative() {
                    let joined = dir.join(path);
                    *s = std::path::absolute(&joined)
                        .unwrap_or(joined)
                        .display()
                        .to_string();
                }
            }
        };
        let mut r = self.clone();
        if r.profile.as_deref() != Some("roofline") {
            abs(&mut r.profile);
        }
        abs(&mut r.model.file);
        abs(&mut r.cluster.gpu_file);
        abs(&mut r.workload.trace);
        r
    }

    /// Parse TOML text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<ScenarioFile, ScenarioError> {
        let de = toml::Deserializer::new(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            let inner = e.into_inner();
            let msg = plain_types(inner.message());
            let at = inner
                .span()
                .map(|s| {
                    let line = text[..s.start.min(text.len())].matches('\n').count() + 1;
                    format!(" (line {line})")
                })
                .unwrap_or_default();
            // the TOML parser rejects some values (an integer beyond 64 bits)
            // before serde sees a field: name it from the text
            let field = match (field.as_str(), inner.span()) {
                (".", Some(span)) => field_at(text, span.start).unwrap_or("<top level>".into()),
                (".", None) => "<top level>".into(),
                _ => field,
            };
            ScenarioError {
                file: file.to_string(),
                field,
                message: format!("{msg}{at}"),
            }
        })
    }

    /// Apply command-line overrides.
    pub fn apply(&mut self, o: &Overrides) {
        if let Some(s) = o.seed {
            self.seed = s;
        }
        if let Some(r) = o.rate {
            self.workload.rate = Some(r);
        }
        if let Some(n) = o.requests {
            self.workload.requests = n;
        }
        if let Some(a) = &o.allocation {
            self.deployment.allocation = a.clone();
        }
        if let Some(b) = o.batch {
            self.deployment.batch = b;
        }
        if let Some(s) = o.offload {
            self.deployment.offload = s;
        }
        if let Some(g) = &o.groups {
            self.deployment.groups = Some(g.clone());
        }
        if let Some(e) = &o.rate_estimator {
            self.deployment.rate_estimator = Some(e.clone());
        }
        if let Some(p) = &o.planner {
            self.planner.get_or_insert_with(Default::default).policy = Some(p.clone());
        }
        if let Some(system) = o.system {
            self.deployment.system = Some(system.name().to_string());
        }
        if let Some(p) = &o.profile {
            // Absolute, so it is not read relative to the scenario's folder.
            let abs = std::path::absolute(p).unwrap_or_else(|_| p.clone());
            self.profile = Some(abs.display().to_string());
        }
        let (l, from) = (&mut self.limits, &o.limits);
        macro_rules! take {
            ($($f:ident),*) => {$(if from.$f.is_some() { l.$f = from.$f.clone(); })*};
        }
        take!(
            max_model_len,
            max_prefill_tokens,
            limit_mm_per_prompt,
            max_image_pixels,
            max_video_frames,
            max_audio_seconds,
            max_media_bytes
        );
    }
}

/// A `--set` value that is not a number or a boolean: a TOML inline array
/// when it reads as one (`[0.4, 0.5, 0.5]`), else the text as a string.
pub(super) fn inline_array(value: &str) -> toml::Value {
    if value.trim_start().starts_with('[') {
        if let Ok(mut t) = toml::from_str::<toml::Table>(&format!("v = {value}")) {
            if let Some(v) = t.remove("v") {
                return v;
            }
        }
    }
    toml::Value::String(value.to_string())
}

/// Before `--set cluster.link.FIELD`: a preset link (named, or the GPU
/// preset's own) becomes its table, so one figure can be changed.
pub(super) fn expand_link_preset(doc: &mut toml::Value) {
    let Some(cluster) = doc.get_mut("cluster").and_then(|c| c.as_table_mut()) else {
        return;
    };
    let preset = match cluster.get("link") {
        Some(toml::Value::String(name)) => LinkSpec::preset(name),
        None => cluster
            .get("gpu")
            .and_then(|g| g.as_str())
            .and_then(GpuSpec::preset)
            .map(|g| g.link),
        _ => None,
    };
    if let Some(table) = preset.and_then(|l| toml::Value::try_from(l).ok()) {
        cluster.insert("link".into(), table);
    }
}

/// The dotted field whose value starts at byte `offset` of a TOML text: the
/// key before the `=` there, under the last `[table]` or `[[array]]` header
/// above it, and inside an array of inline tables (`buckets = [ { … } ]`)
/// under the array's key.
pub(super) fn field_at(text: &str, offset: usize) -> Option<String> {
    let before = text.get(..offset.min(text.len()))?;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    let ident = |t: &str| -> Option<String> {
        let t = t.trim_end().strip_suffix('=')?.trim_end();
        let k: String = t
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        (!k.is_empty()).then_some(k)
    };
    let key = ident(&before[start..])?;
    let above = &before[..start];
    let mut path = Vec::new();
    if before[start..].trim_start().starts_with('{')
        || !before[start..].trim_start().starts_with(&key)
    {
        // inside an array of inline tables: the array's key, the nearest
        // `name = [` line above that is not closed
        if let Some(array) = above
            .lines()
            .rev()
            .take_while(|l| !l.trim().starts_with('['))
            .find_map(|l| {
                let (k, v) = l.split_once('=')?;
                v.trim_start()
                    .starts_with('[')
                    .then(|| k.trim().to_string())
            })
        {
            path.push(array);
        }
    }
    let table = above.lines().rev().find_map(|l| {
        let l = l.trim();
        (l.starts_with('[') && !l.contains('='))
            .then(|| l.trim_matches(|c| c == '[' || c == ']').trim().to_string())
    });
    if let Some(t) = table.filter(|t| !t.is_empty()) {
        path.insert(0, t);
    }
    path.push(key);
    Some(path.join("."))
}

/// A deserializer message with Rust type names said in words.
pub(super) fn plain_types(msg: &str) -> String {
    msg.replace(
        "data did not match any variant of untagged enum LinkChoice",
        "expected a link preset name or a table { name, bandwidth_gbs, latency_s }",
    )
    .replace("expected i64", "expected an integer")
    .replace("expected u64", "expected an integer ≥ 0")
    .replace("expected u32", "expected an integer ≥ 0")
    .replace("expected f64", "expected a number")
}

/// Set `path` in `node` to `value`, creating tables on the way; through an
/// array of tables the rest of the path is set in every element (so
/// `workload.video.buckets.frames=16` sets every bucket's frames).
pub(super) fn set_path(
    node: &mut toml::Value,
    path: &[&str],
    value: &toml::Value,
) -> Result<(), String> {
    if let toml::Value::Array(items) = node {
        // `groups.1.nodes`: one element by its index
        if let Some(i) = path.first().and_then(|p| p.parse::<usize>().ok()) {
            let n = items.len();
            let item = items
                .get_mut(i)
                .ok_or_else(|| format!("index {i} is past the {n} element(s) there"))?;
            return set_path(item, &path[1..], value);
        }
        for item in items.iter_mut() {
            set_path(item, path, value)?;
        }
        return Ok(());
    }
    let table = node
        .as_table_mut()
        .ok_or_else(|| format!("`{}` goes through a value, not a table", path.join(".")))?;
    match path {
        [leaf] => {
            table.insert(leaf.to_string(), value.clone());
            Ok(())
        }
        [head, rest @ ..] => set_path(
            table
                .entry(head.to_string())
                .or_insert_with(|| toml::Value::Table(Default::default())),
            rest,
            value,
        ),
        [] => Err("empty key".into()),
    }
}

#[cfg(test)]
mod set_tests {
    use super::set_path;

    #[test]
    fn sets_nested_fields_and_every_element_of_a_table_array() {
        let mut doc: toml::Value = toml::from_str(
            "[cluster]\ngpu = \"a\"\n[workload.video]\nbuckets = [{ frames = 8 }, { frames = 16 }]\n",
        )
        .unwrap();
        set_path(
            &mut doc,
            &["cluster", "gpu"],
            &toml::Value::String("b".into()),
        )
        .unwrap();
        set_path(
            &mut doc,
            &["workload", "video", "buckets", "frames"],
            &toml::Value::Integer(32),
        )
        .unwrap();
        set_path(&mut doc, &["deployment", "batch"], &toml::Value::Integer(4)).unwrap();
        assert_eq!(doc["cluster"]["gpu"].as_str(), Some("b"));
        let b = doc["workload"]["video"]["buckets"].as_array().unwrap();
        assert!(b.iter().all(|x| x["frames"].as_integer() == Some(32)));
        assert_eq!(doc["deployment"]["batch"].as_integer(), Some(4));
        assert!(set_path(&mut doc, &["cluster", "gpu", "x"], &toml::Value::Integer(1)).is_err());
        // an index picks one element (`--set cluster.groups.1.nodes=2`)
        let path = ["workload", "video", "buckets", "1", "frames"];
        set_path(&mut doc, &path, &toml::Value::Integer(4)).unwrap();
        let b = doc["workload"]["video"]["buckets"].as_array().unwrap();
        assert_eq!(
            (b[0]["frames"].as_integer(), b[1]["frames"].as_integer()),
            (Some(32), Some(4))
        );
        let past = ["workload", "video", "buckets", "2", "frames"];
        assert!(set_path(&mut doc, &past, &toml::Value::Integer(4)).is_err());
    }
}
