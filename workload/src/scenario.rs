//! Scenario files: parse → validate → resolve.
//!
//! A scenario is a TOML file (documented field by field in
//! `scenarios/README.md`). [`Scenario::load`] parses it into plain data
//! ([`ScenarioFile`], unknown fields rejected), validates every value, resolves
//! the model and GPU presets and checks memory feasibility, and only then
//! returns a [`Scenario`]. Every error names the file, the field and what is
//! allowed ([`ScenarioError`]).

use crate::generate::item_tokens;
use crate::report::SloTier;
use easerve_calib::{Efficiency, GpuSpec, LinkSpec, Roofline};
use easerve_model::ModelArch;
use easerve_sched::{
    Allocation, Deployment, DispatchPolicy, MmItem, Modality, RouterPolicy, SmPolicy,
};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Longest SLO tier name, characters.
pub const MAX_TIER_NAME: usize = 64;

/// Smallest hardware figure accepted (TFLOPS, GB/s, GB): a thousandth of a
/// unit. Below it service times leave the span the clock resolves
/// ([`MAX_HORIZON_S`]); the upper bounds are far above any device.
pub const HARDWARE_MIN: f64 = 1e-3;

const HARDWARE_WHY: &str =
    "far outside any device, service times would leave the span the simulator's clock resolves";

/// Largest encode micro-batch `B` (`deployment.batch`).
pub const MAX_BATCH: i64 = 4096;

/// Longest an encode batcher may hold a request, seconds
/// (`deployment.max_age_s`, the `fixed-timeout:SECONDS` dispatch).
pub const MAX_WAIT_S: f64 = 3600.0;

/// Longest simulated span the arrivals may cover, seconds (about 31.7 years):
/// times are f64 seconds, whose resolution there is still 0.12 µs; much
/// further out, service times of microseconds vanish in rounding.
pub const MAX_HORIZON_S: f64 = 1e9;

/// A scenario that cannot be used: which file, which field, what is allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{file}: `{field}`: {message}")]
pub struct ScenarioError {
    /// The scenario file (or `<cli>` for a command-line override).
    pub file: String,
    /// Dotted path of the offending field, e.g. `deployment.batch`.
    pub field: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

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

/// The LLM dtypes a scenario may name, with their bytes per element: BF16;
/// FP8 with per-tensor scales (vLLM's `--quantization fp8`, ModelOpt FP8
/// checkpoints); FP8 with 128x128 block scales (the format of Qwen's and
/// DeepSeek's FP8 checkpoints). Each is priced from its own aiconfigurator
/// rows (`gemm_dtype`, `moe_dtype`).
pub const LLM_DTYPES: &[(&str, u32)] = &[("bfloat16", 2), ("fp8", 1), ("fp8_block", 1)];

/// The KV-cache dtypes a scenario may name, with their bytes per element.
pub const KV_DTYPES: &[(&str, u32)] = &[("bfloat16", 2), ("fp8", 1)];

/// GPU presets without FP8 tensor cores (FP8 needs compute capability 8.9 or
/// later: Ada, Hopper, Blackwell; the A100 is 8.0, and the aiconfigurator
/// data has no FP8 GEMM or quantize rows for it), and the host CPU.
pub const NO_FP8_GPUS: &[&str] = &["a100-sxm4-80gb", "cpu"];

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
    /// GPUs in the cluster.
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
    /// (`deployment.preprocess_threads` overrides).
    pub host_cores: Option<i64>,
}

/// `[deployment]`
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentSection {
    /// Allocation in the paper's notation, e.g. `2E(TP1)+1P(TP2)+1D(TP4)`.
    pub allocation: String,
    /// Serving system: `easerve` (default), `passthrough` or `aggregated`.
    pub system: Option<String>,
    /// Serving framework whose fixed encode costs (per pass, per request) and
    /// preprocessing implementation are charged: `easerve`, `passthrough` or
    /// `aggregated` (default: the system's own). Runs one system's scheduling on
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
    /// runs its GPU phase). Default: `pipelined` for the easerve framework on a
    /// GPU, `serial` for the pass-through framework (its calibration charged
    /// preprocessing in series) and on the `cpu` device (the cores that would
    /// preprocess are the ones that encode).
    pub preprocess: Option<String>,
    /// Preprocessing threads per encode worker when pipelined (1 ..= 1,024;
    /// default `cluster.host_cores / cluster.gpus`, at least 1).
    pub preprocess_threads: Option<i64>,
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

/// Arrival process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Arrival {
    /// Exponential gaps.
    Poisson,
    /// Gamma gaps with this coefficient of variation.
    Gamma {
        /// CV of gaps.
        cv: f64,
    },
    /// Replay of a trace: arrival times and token counts per request.
    Trace {
        /// The trace file.
        path: String,
        /// Its first `requests` rows, rescaled.
        rows: Vec<crate::trace::TraceRow>,
    },
}

/// Request shapes, validated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Shapes {
    /// Images or videos from a bucket table of shapes with probabilities.
    Items {
        /// Mean items per request.
        items: u32,
        /// Range ratio of items.
        items_range_ratio: f64,
        /// `(item shape, probability)`; probabilities are relative weights.
        buckets: Vec<(MmItem, f64)>,
    },
    /// Audio clips with log-normal duration.
    Audio {
        /// Mean seconds.
        mean_s: f64,
        /// Log-normal σ.
        sigma: f64,
        /// Cap, seconds.
        max_s: f64,
    },
    /// No multimodal items.
    Text,
}

/// The workload, validated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// Requests in the run.
    pub requests: usize,
    /// Mean rate, requests/s.
    pub rate: f64,
    /// Arrival process.
    pub arrival: Arrival,
    /// Mean text prompt tokens.
    pub input_len: u32,
    /// Mean output tokens.
    pub output_len: u32,
    /// Range ratio of lengths.
    pub range_ratio: f64,
    /// Modality.
    pub modality: Modality,
    /// Item shapes.
    pub shapes: Shapes,
}

/// Serving knobs beyond the deployment, validated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServingKnobs {
    /// Prefill token budget per batch.
    pub prefill_token_budget: u64,
    /// Prefill sequences per batch.
    pub prefill_max_seqs: usize,
    /// Decode running-batch cap.
    pub decode_max_batch: usize,
    /// Embedding envelopes in flight per encode worker before backpressure.
    pub max_inflight_transfers: usize,
    /// KV block size, tokens.
    pub kv_block_size: u64,
    /// Usable fraction of GPU memory.
    pub gpu_memory_utilization: f64,
    /// Requests in the system (admitted, not finished) beyond which arrivals
    /// are rejected; `None` admits all.
    #[serde(default)]
    pub admission_limit: Option<usize>,
    /// TP degree of each local prefill worker (spanning that many encode GPUs);
    /// `None` when `s = 1`.
    pub local_prefill_tp: Option<u32>,
    /// TP degree of each replica of the `aggregated` system (`None` otherwise).
    pub aggregated_tp: Option<u32>,
    /// Preprocessing threads of each encode worker when preprocessing is a
    /// pipelined host stage (`deployment.preprocess = "pipelined"`); `None`
    /// when each pass preprocesses its own micro-batch on one thread, in
    /// series with its GPU phase.
    #[serde(default)]
    pub preprocess_threads: Option<u32>,
}

/// A validated scenario, ready to be simulated or executed.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Name.
    pub name: String,
    /// The file it came from.
    pub file: String,
    /// Master seed.
    pub seed: u64,
    /// The model.
    pub model: ModelArch,
    /// GPU spec (with the link in force).
    pub gpu: GpuSpec,
    /// GPUs in the cluster.
    pub gpus: u32,
    /// Deployment.
    pub deployment: Deployment,
    /// Knobs.
    pub knobs: ServingKnobs,
    /// The serving system that runs it.
    pub system: System,
    /// The measured (or written) profile its costs come from; `None` = roofline.
    pub profile: Option<easerve_calib::Profile>,
    /// Workload.
    pub workload: Workload,
    /// SLO tiers, strict → relaxed.
    pub slo: Vec<SloTier>,
    /// How the engine launches each stage's passes (`[deployment.launch]`).
    pub launch: easerve_calib::Launch,
    /// The raw file (kept so overrides can be re-validated).
    pub raw: ScenarioFile,
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
}

/// Largest `workload.rate` (and `rate_scale`) a scenario accepts, requests/s.
pub const MAX_RATE: f64 = 1e6;

/// Which serving system runs the scenario's allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum System {
    /// The scenario's own deployment: adaptive micro-batching with its B, its s,
    /// its dispatch, router and SM policies.
    Easerve,
    /// How a pass-through EPD framework (e.g. Dynamo) runs the same allocation:
    /// encode one request per pass (B = 1, `immediate`), every prefill remote (s = 1).
    Passthrough,
    /// How a single-engine server (e.g. vLLM) runs the cluster: replicas of TP
    /// GPUs (`GPUs / TP` of them, TP the smallest degree at which the LLM, its
    /// encoder and one longest sequence fit), each running encode inline before
    /// prefill, with continuous batching. The allocation is ignored.
    Aggregated,
}

impl System {
    /// The name used in scenarios and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            System::Easerve => "easerve",
            System::Passthrough => "passthrough",
            System::Aggregated => "aggregated",
        }
    }
}

impl std::str::FromStr for System {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "easerve" => Ok(System::Easerve),
            "passthrough" => Ok(System::Passthrough),
            "aggregated" => Ok(System::Aggregated),
            _ => Err(format!(
                "unknown system `{s}`; allowed: easerve, passthrough, aggregated"
            )),
        }
    }
}

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
        if let Some(system) = o.system {
            self.deployment.system = Some(system.name().to_string());
        }
        if let Some(p) = &o.profile {
            // Absolute, so it is not read relative to the scenario's folder.
            let abs = std::path::absolute(p).unwrap_or_else(|_| p.clone());
            self.profile = Some(abs.display().to_string());
        }
    }
}

struct V<'a> {
    file: &'a str,
}

impl V<'_> {
    fn err(&self, field: &str, message: impl Into<String>) -> ScenarioError {
        ScenarioError {
            file: self.file.to_string(),
            field: field.to_string(),
            message: message.into(),
        }
    }

    /// Validate a non-empty table field by field; `each` gets `field[i]` and the row.
    fn table<B, T>(
        &self,
        field: &str,
        rows: &[B],
        mut each: impl FnMut(&str, &B) -> Result<T, ScenarioError>,
    ) -> Result<Vec<T>, ScenarioError> {
        if rows.is_empty() {
            return Err(self.err(field, "at least one bucket is required"));
        }
        rows.iter()
            .enumerate()
            .map(|(i, row)| each(&format!("{field}[{i}]"), row))
            .collect()
    }

    fn int(&self, field: &str, v: i64, min: i64, max: i64) -> Result<i64, ScenarioError> {
        if v < min || v > max {
            Err(self.err(
                field,
                format!("{v} is out of range: allowed {min} ..= {max}"),
            ))
        } else {
            Ok(v)
        }
    }

    fn real(
        &self,
        field: &str,
        v: f64,
        lo: f64,
        hi: f64,
        open_lo: bool,
    ) -> Result<f64, ScenarioError> {
        let ok = v.is_finite() && (if open_lo { v > lo } else { v >= lo }) && v <= hi;
        if ok {
            Ok(v)
        } else {
            let l = if open_lo { "(" } else { "[" };
            Err(self.err(
                field,
                format!(
                    "{} is out of range: allowed {l}{}, {}]",
                    num(v),
                    num(lo),
                    num(hi)
                ),
            ))
        }
    }
}

/// A number as an error message shows it: plain when it is of everyday size,
/// in scientific notation when it is tiny or huge (never 309 digits).
pub fn num(x: f64) -> String {
    let a = x.abs();
    if x == 0.0 || !x.is_finite() || (1e-4..1e15).contains(&a) {
        format!("{x}")
    } else {
        format!("{x:e}")
    }
}

/// Split `name:value`.
fn split_arg(s: &str) -> (&str, Option<&str>) {
    match s.split_once(':') {
        Some((a, b)) => (a.trim(), Some(b.trim())),
        None => (s.trim(), None),
    }
}

/// Peak memory of a simulated run per request, bytes: 449 MB at 1,000,000
/// requests of the image scenario (README "Speed", `/usr/bin/time -f %M`).
pub const SIM_BYTES_PER_REQUEST: f64 = 449.0;

/// Decode iterations a simulated run gets through per second, about: the
/// image scenario's 1,000,000-request run takes 1.71 s for 10.8 M iterations
/// inside decode runs, plus 9.1 M other events (README "Speed"), so about 6.3
/// M iterations per second of the whole run.
pub const SIM_STEPS_PER_SECOND: f64 = 6.3e6;

impl Scenario {
    /// Warnings for a run that is valid but large: its memory estimate
    /// ([`SIM_BYTES_PER_REQUEST`]) over 2 GB, or an upper bound on its decode
    /// iterations (every output token an iteration of its own) that would take
    /// over a minute at [`SIM_STEPS_PER_SECOND`]. Nothing is capped.
    pub fn size_warnings(&self) -> Vec<String> {
        let w = &self.workload;
        let mut out = Vec::new();
        let bytes = w.requests as f64 * SIM_BYTES_PER_REQUEST;
        if bytes > 2e9 {
            out.push(format!(
                "{} requests need about {:.1} GB of memory in the simulator ({} bytes each, measured); lower workload.requests for a smaller run",
                w.requests,
                bytes / 1e9,
                SIM_BYTES_PER_REQUEST
            ));
        }
        let steps = w.requests as f64 * f64::from(w.output_len) * (1.0 + w.range_ratio);
        let secs = steps / SIM_STEPS_PER_SECOND;
        if secs > 60.0 {
            out.push(format!(
                "{} requests of up to {} output tokens may take up to {} decode iterations, about {} s to simulate (the exec driver is slower still); lower workload.output_len or workload.requests for a quicker run",
                w.requests,
                (f64::from(w.output_len) * (1.0 + w.range_ratio)).ceil(),
                num(steps),
                num(secs.round())
            ));
        }
        out
    }

    /// The stage costs the scenario names: its `profile`; else measured kernels
    /// when its GPU is a preset with aiconfigurator tables, or the RTX 6000 Ada
    /// (priced from the L40S's tables, same AD102 die), and the data is found
    /// ([`easerve_calib::aic::find_data_dir`]; `cluster.kernels = "roofline"` opts
    /// out); else the roofline of its model and GPU. Either carries the serving
    /// system's own framework and measured preprocessing terms
    /// ([`easerve_calib::preprocess::EncodeTerms`]). When the tables cannot be
    /// read, or the GPU has tables but the data is absent, the roofline is used
    /// and its notes say why.
    pub fn cost(&self) -> Box<dyn easerve_calib::StageCost> {
        use easerve_calib::{Efficiency, Roofline};
        if let Some(p) = &self.profile {
            return Box::new(p.clone());
        }
        let roofline = || {
            Box::new(
                Roofline::new(self.model.clone(), self.gpu.clone(), Efficiency::default())
                    .with_terms(self.encode_terms()),
            )
        };
        match self.kernel_cost() {
            Some(Ok(k)) => Box::new(k),
            Some(Err(e)) => Box::new(WithNote(
                roofline(),
                format!("measured kernels unusable, roofline used instead: {e}"),
            )),
            None if !self.roofline_named()
                && self.raw.cluster.gpu.is_some()
                && easerve_calib::kernel_cost::kernel_source_for(&self.gpu.name).is_some()
                && easerve_calib::aic::find_data_dir().is_none() =>
            {
                Box::new(WithNote(
                    roofline(),
                    format!(
                        "{} has measured kernel tables, but no aiconfigurator data was found ($EASERVE_AICONFIGURATOR_DIR, ../shared/data/aiconfigurator): roofline used instead",
                        self.gpu.name
                    ),
                ))
            }
            None => roofline(),
        }
    }

    /// The serving system's encode terms on this deployment's host: framework
    /// terms and measured preprocessing ([`easerve_calib::preprocess::EncodeTerms`]),
    /// preprocessing scaled by `cluster.host_cpu_scale`.
    pub fn encode_terms(&self) -> easerve_calib::preprocess::EncodeTerms {
        easerve_calib::preprocess::EncodeTerms::for_system(
            &self.model,
            self.framework(),
            easerve_calib::Efficiency::default().encode_pass_s,
            self.raw.cluster.host_cpu_scale.unwrap_or(1.0),
        )
    }

    /// The serving framework whose encode terms apply: `deployment.framework`, or
    /// the system's own.
    pub fn framework(&self) -> &str {
        self.raw
            .deployment
            .framework
            .as_deref()
            .unwrap_or(self.system.name())
    }

    /// The LLM's weight dtype in aiconfigurator's names (`bfloat16`, `fp8`,
    /// `fp8_block`): `model.dtype`, else `fp8` for a model file of 1-byte
    /// weights, else `bfloat16`.
    pub fn llm_dtype(&self) -> &str {
        match self.raw.model.dtype.as_deref() {
            Some(d) => d,
            None if self.model.llm.dtype_bytes == 1 => "fp8",
            None => "bfloat16",
        }
    }

    /// Whether the scenario asks for the roofline by name (`cluster.kernels =
    /// "roofline"` or `profile = "roofline"`).
    fn roofline_named(&self) -> bool {
        self.raw.cluster.kernels.as_deref() == Some("roofline")
            || self.raw.profile.as_deref() == Some("roofline")
    }

    /// The measured-kernel cost of this scenario, if its GPU and `cluster.kernels`
    /// select one and the data directory exists; `Some(Err)` when the tables are
    /// there but cannot be read.
    pub fn kernel_cost(
        &self,
    ) -> Option<Result<easerve_calib::KernelCost, easerve_calib::KernelError>> {
        if self.roofline_named() || self.raw.cluster.gpu.is_none() {
            return None;
        }
        let dir = easerve_calib::aic::find_data_dir()?;
        easerve_calib::KernelCost::from_data(
            &dir,
            &self.model,
            &self.gpu,
            self.framework(),
            self.llm_dtype(),
            self.raw.cluster.host_cpu_scale.unwrap_or(1.0),
            true,
        )
        .map(|k| k.map(|k| k.with_launch(self.launch.clone())))
        .transpose()
    }

    /// The measured kernel tables [`Scenario::cost`] would read, checked: an
    /// error naming `cluster.kernels` and the unreadable file when the tables
    /// are there but cannot be read (a corrupt GEMM or fused-MoE parquet, a
    /// table without a needed column), where [`Scenario::cost`] itself falls
    /// back to the roofline with a note. The command line refuses such a
    /// scenario (exit 2) rather than answer from another cost source.
    ///
    /// # Errors
    /// As above; absent data or a roofline scenario is not an error.
    pub fn check_kernel_tables(&self) -> Result<(), ScenarioError> {
        match self.kernel_cost() {
            Some(Err(e)) => Err(ScenarioError {
                file: self.file.clone(),
                field: "cluster.kernels".into(),
                message: format!(
                    "the measured kernel tables of {} cannot be read: {e}; restore the file, or set `cluster.kernels = \"roofline\"` to price from the roofline",
                    self.gpu.name
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Where the deployment's workers run: GPUs, labels and local-prefill
    /// groups ([`easerve_sched::Topology`]), built from the allocation and the
    /// local prefill TP.
    pub fn topology(&self) -> easerve_sched::Topology {
        easerve_sched::Topology::new(&self.deployment.allocation, self.knobs.local_prefill_tp)
    }

    /// One continuous-batching scheduler per decode worker, with the KV blocks
    /// its TP group's memory holds after the LLM weights (a property of model
    /// × GPU whatever the cost source; `Roofline::kv_bytes_free_per_gpu`).
    pub fn decode_schedulers(&self) -> Vec<easerve_sched::DecodeScheduler> {
        use easerve_calib::{Efficiency, Roofline};
        use easerve_sched::{DecodeScheduler, KvBlocks};
        let d = self.deployment.allocation.decode;
        let par = easerve_model::Parallel::new(d.tp, d.ep);
        let free = Roofline::new(self.model.clone(), self.gpu.clone(), Efficiency::default())
            .kv_bytes_free_per_gpu(par, 0.0, self.knobs.gpu_memory_utilization)
            .unwrap_or(0.0)
            * par.gpus() as f64;
        let kv = KvBlocks::from_memory(
            free,
            self.model.kv_bytes_per_token(),
            self.knobs.kv_block_size,
        );
        (0..self.deployment.allocation.decode.workers)
            .map(|_| DecodeScheduler::new(kv, self.knobs.decode_max_batch))
            .collect()
    }

    /// The encode-side policies of a run, as both faces build them: one
    /// [`easerve_sched::Batcher`] per encode worker and the SM split. A
    /// typical request's items (median encoder tokens, over `requests` with
    /// their per-item `tokens`) stand for "a request" in the batcher's
    /// `W(k) = T_enc(k)` and in the SM table, both from `cost` (seconds):
    /// the time a pass holds its worker ([`easerve_calib::EncodeTime::pass`]),
    /// which leaves preprocessing out when it is pipelined.
    pub fn encode_policies(
        &self,
        requests: &[easerve_sched::Request],
        tokens: &crate::generate::ItemTokenTable,
        cost: &dyn easerve_calib::StageCost,
    ) -> (Vec<easerve_sched::Batcher>, easerve_sched::SmSplit) {
        use crate::generate::{typical_batch, typical_items};
        use easerve_sched::{Batcher, SmSplit};
        let dep = &self.deployment;
        let b = dep.max_batch;
        let typical = typical_items(requests, tokens);
        let threads = self.knobs.preprocess_threads;
        let t_enc = |k: usize, share: f64| {
            cost.encode(&typical_batch(&typical, k), share)
                .pass(threads)
        };
        let split = if dep.has_local_prefill() {
            SmSplit::new(&dep.sm_policy, b, t_enc)
        } else {
            SmSplit::Static(1.0)
        };
        let dispatch = self.encode_dispatch();
        let batchers = (0..dep.allocation.encode.workers)
            .map(|_| Batcher::new(&dispatch, b, |k| t_enc(k, 1.0)))
            .collect();
        (batchers, split)
    }

    /// The [`easerve_sched::Controller`] of one run of this scenario, as both
    /// faces drive it: `requests` (with their per-item `tokens`, for the
    /// policies' costs), the batchers and SM split of
    /// [`Scenario::encode_policies`], the [`Scenario::topology`], the decode
    /// schedulers and the knobs. `log_decisions` keeps the decision log.
    pub fn controller(
        &self,
        requests: Vec<easerve_sched::Request>,
        tokens: &crate::generate::ItemTokenTable,
        cost: &dyn easerve_calib::StageCost,
        log_decisions: bool,
    ) -> easerve_sched::Controller {
        let cfg = self.controller_config(&requests, tokens, cost, log_decisions);
        easerve_sched::Controller::new(requests, cfg)
    }

    /// The layout and policies of [`Scenario::controller`], for a controller
    /// whose requests come later ([`easerve_sched::Controller::add_request`],
    /// as `easerve serve` learns of them): `requests` and `tokens` only stand
    /// for a typical request in the encode policies' costs.
    pub fn controller_config(
        &self,
        requests: &[easerve_sched::Request],
        tokens: &crate::generate::ItemTokenTable,
        cost: &dyn easerve_calib::StageCost,
        log_decisions: bool,
    ) -> easerve_sched::ControllerConfig {
        let (batchers, split) = self.encode_policies(requests, tokens, cost);
        let dep = &self.deployment;
        easerve_sched::ControllerConfig {
            batchers,
            topology: self.topology(),
            decode: self.decode_schedulers(),
            prefill_token_budget: self.knobs.prefill_token_budget,
            prefill_max_seqs: self.knobs.prefill_max_seqs,
            max_inflight_transfers: self.knobs.max_inflight_transfers,
            router: (dep.router.clone(), dep.offload),
            split,
            admission_limit: self.knobs.admission_limit,
            log_decisions,
            preprocess_ahead: self.knobs.preprocess_threads.is_some(),
        }
    }

    /// The encode dispatch policy each encode worker runs: the scenario's,
    /// with the Poisson-gap rate estimate seeded from the offered rate per
    /// encode worker when the scenario gives no hint.
    pub fn encode_dispatch(&self) -> easerve_sched::DispatchPolicy {
        use easerve_sched::DispatchPolicy;
        let workers = self.deployment.allocation.encode.workers;
        match self.deployment.dispatch.clone() {
            DispatchPolicy::PoissonGap {
                q,
                max_age_s,
                rate_hint: None,
            } if workers > 0 => DispatchPolicy::PoissonGap {
                q,
                max_age_s,
                rate_hint: Some(self.workload.rate / workers as f64),
            },
            d => d,
        }
    }

    /// Read, parse, validate and resolve a scenario file.
    pub fn load(path: &Path, overrides: &Overrides) -> Result<Scenario, ScenarioError> {
        Scenario::load_with(path, &[], overrides)
    }

    /// Read a scenario file, set fields by dotted path (`sets`, e.g.
    /// `("cluster.gpu", "h100-sxm")`; a value that parses as a TOML number or
    /// boolean is one, anything else a string) and apply `overrides`, without
    /// validating: for callers that change the cluster and must choose a
    /// deployment that fits before the scenario can validate.
    ///
    /// # Errors
    /// The file cannot be read or parsed; a path through a non-table names the
    /// `--set` key.
    pub fn raw_with(
        path: &Path,
        sets: &[(String, String)],
        overrides: &Overrides,
    ) -> Result<ScenarioFile, ScenarioError> {
        let file = path.display().to_string();
        let mut text = easerve_calib::input::read_text(path).map_err(|e| ScenarioError {
            file: file.clone(),
            field: "(file)".into(),
            message: format!("cannot read the scenario file: {e}"),
        })?;
        if !sets.is_empty() {
            let set_err = |key: &str, message: String| ScenarioError {
                file: format!("{file} (with --set {key})"),
                field: key.to_string(),
                message,
            };
            let mut doc: toml::Value = toml::from_str(&text).map_err(|e| ScenarioError {
                file: file.clone(),
                field: "<top level>".into(),
                message: e.message().to_string(),
            })?;
            for (key, value) in sets {
                let parts: Vec<&str> = key.split('.').collect();
                if parts.len() == 3 && parts[..2] == ["cluster", "link"] {
                    expand_link_preset(&mut doc);
                }
                let parsed = value
                    .parse::<i64>()
                    .map(toml::Value::Integer)
                    .or_else(|_| value.parse::<f64>().map(toml::Value::Float))
                    .or_else(|_| value.parse::<bool>().map(toml::Value::Boolean))
                    .unwrap_or_else(|_| toml::Value::String(value.clone()));
                set_path(&mut doc, &parts, &parsed).map_err(|m| set_err(key, m))?;
            }
            text = toml::to_string(&doc).map_err(|e| set_err("(all)", e.to_string()))?;
        }
        let mut raw = ScenarioFile::parse(&text, &file)?;
        raw.apply(overrides);
        Ok(raw)
    }

    /// Load, apply `sets` then `overrides`, and validate: [`Scenario::raw_with`]
    /// followed by [`Scenario::validate`] (the file stem is the default name).
    ///
    /// Errors: as [`Scenario::raw_with`], then any field that does not
    /// validate (attributed to the override that set it).
    pub fn load_with(
        path: &Path,
        sets: &[(String, String)],
        overrides: &Overrides,
    ) -> Result<Scenario, ScenarioError> {
        let raw = Scenario::raw_with(path, sets, overrides)?;
        Scenario::validate(
            raw,
            &path.display().to_string(),
            &Scenario::default_name(path),
        )
        .map_err(|e| overrides.attribute(e))
    }

    /// The name a scenario file without a `name` field gets: its file stem.
    pub fn default_name(path: &Path) -> String {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "scenario".into())
    }

    /// Validate raw data into a scenario.
    pub fn validate(
        mut raw: ScenarioFile,
        file: &str,
        default_name: &str,
    ) -> Result<Scenario, ScenarioError> {
        let v = V { file };
        let system: System = raw
            .deployment
            .system
            .as_deref()
            .unwrap_or("easerve")
            .parse()
            .map_err(|e: String| v.err("deployment.system", e))?;
        if let Some(f) = &raw.deployment.framework {
            use easerve_calib::preprocess::FRAMEWORKS;
            if !FRAMEWORKS.contains(&f.as_str()) {
                return Err(v.err(
                    "deployment.framework",
                    format!(
                        "unknown framework `{f}`; allowed: {}",
                        FRAMEWORKS.join(", ")
                    ),
                ));
            }
        }
        if system == System::Passthrough {
            // the same allocation, run as a pass-through EPD framework runs it;
            // what the user gave (B, s, the dispatch rule, …) is still checked
            // before it is replaced
            deployment_section(&raw, &v)?;
            raw.deployment.batch = 1;
            raw.deployment.dispatch = Some("immediate".into());
            raw.deployment.offload = 1.0;
        }
        let dir = Path::new(file).parent().unwrap_or(Path::new("."));
        let (model, gpu, gpus) = cluster_section(&raw, &v, dir)?;

        // --- workload ---
        let Workload {
            requests,
            rate,
            arrival,
            input_len,
            output_len,
            range_ratio,
            modality,
            shapes,
        } = workload_section(&raw, &v, file, &model)?;

        // --- deployment ---
        let (dep, knobs) = deployment_section(&raw, &v)?;
        let Deployment {
            allocation,
            max_batch,
            offload,
            dispatch,
            router,
            sm_policy,
        } = dep;
        let ServingKnobs {
            prefill_token_budget: knobs_budget,
            prefill_max_seqs,
            decode_max_batch,
            max_inflight_transfers,
            kv_block_size,
            gpu_memory_utilization: mem_util,
            admission_limit,
            ..
        } = knobs;

        // --- feasibility against the cluster and the model ---
        let fa = "deployment.allocation";
        if allocation.gpus() > gpus {
            return Err(v.err(
                fa,
                format!(
                    "`{allocation}` needs {} GPUs but the cluster has {gpus} (cluster.gpus)",
                    allocation.gpus()
                ),
            ));
        }
        let multimodal = modality != Modality::Text;
        if allocation.encode.workers > 0 && allocation.encode.tp != 1 {
            return Err(v.err(
                fa,
                format!(
                    "encode workers run at TP1 (each encoder fits on one GPU; more encode GPUs means more workers): use {}E(TP1) instead of {}E(TP{})",
                    allocation.encode.gpus(),
                    allocation.encode.workers,
                    allocation.encode.tp
                ),
            ));
        }
        check_expert_parallel(&allocation, &model).map_err(|m| v.err(fa, m))?;
        if multimodal && allocation.encode.workers == 0 {
            return Err(v.err(
                fa,
                "a multimodal workload needs at least one encode worker (nE(TPk))",
            ));
        }
        if !multimodal && allocation.encode.workers > 0 {
            return Err(v.err(
                fa,
                "a text workload has no encode stage: leave out the E term",
            ));
        }
        if allocation.decode.workers == 0 {
            return Err(v.err(fa, "at least one decode worker (nD(TPk)) is required"));
        }
        if system == System::Passthrough && allocation.prefill.workers == 0 {
            return Err(v.err(
                "deployment.system",
                format!("passthrough runs every prefill on remote P workers, but `{allocation}` has none; add nP(TPk)"),
            ));
        }
        if offload > 0.0 && allocation.prefill.workers == 0 {
            return Err(v.err(
                "deployment.offload",
                format!("{offload} sends requests to remote prefill but `{allocation}` has no P workers; use offload = 0 or add nP(TPk)"),
            ));
        }
        if offload < 1.0 && !multimodal {
            return Err(v.err(
                "deployment.offload",
                "must be 1 for a text workload (no encode GPUs to co-locate prefill on)",
            ));
        }
        let roof = Roofline::new(model.clone(), gpu.clone(), Efficiency::default());
        // a trace brings its own lengths; the shapes add multimodal tokens
        let trace_max = match &arrival {
            Arrival::Trace { rows, .. } => rows
                .iter()
                .map(|r| r.prompt_tokens as u64 + r.output_tokens as u64)
                .max()
                .unwrap_or(0),
            _ => 0,
        };
        let max_seq_tokens =
            trace_max + max_sequence_tokens(&model, input_len, output_len, range_ratio, &shapes);
        let kv_per_token = model.kv_bytes_per_token();
        let fits = |par: easerve_model::Parallel, extra: f64| -> Option<f64> {
            roof.kv_bytes_free_per_gpu(par, extra, mem_util)
                .map(|free| free * par.gpus() as f64)
                // whole blocks: the engine rounds capacity down and need up
                .filter(|total| {
                    *total >= (max_seq_tokens + 2 * kv_block_size) as f64 * kv_per_token
                })
        };
        for (field, pool, stage) in [
            ("P", allocation.prefill, "prefill"),
            ("D", allocation.decode, "decode"),
        ] {
            let par = easerve_model::Parallel::new(pool.tp, pool.ep);
            if pool.workers > 0 && fits(par, 0.0).is_none() {
                let weights = model.llm_weight_bytes_per_gpu(par);
                let need = (weights + max_seq_tokens as f64 * kv_per_token / pool.tp as f64) / 1e9;
                return Err(v.err(
                    fa,
                    format!(
                        "{stage} at {par}: {}'s weights ({:.1} GB per GPU) plus the KV cache of one longest sequence ({max_seq_tokens} tokens) need {need:.1} GB per GPU, more than {:.0}% of {} GB on {}; use a larger TP for {field}",
                        model.name,
                        weights / 1e9,
                        mem_util * 100.0,
                        gpu.memory_gb,
                        gpu.name
                    ),
                ));
            }
        }
        if multimodal && model.encoder_weight_bytes() > mem_util * gpu.memory_bytes() {
            return Err(v.err(
                fa,
                format!(
                    "the encoder of {} does not fit on one {}",
                    model.name, gpu.name
                ),
            ));
        }
        let asked_tp = raw.deployment.aggregated_tp;
        if asked_tp.is_some() && system != System::Aggregated {
            return Err(v.err(
                "deployment.aggregated_tp",
                "only used with system = \"aggregated\"",
            ));
        }
        let aggregated_tp = if let (System::Aggregated, Some(tp)) = (system, asked_tp) {
            let tp = v.int("deployment.aggregated_tp", tp, 1, i64::from(gpus))? as u32;
            if !tp.is_power_of_two() {
                return Err(v.err(
                    "deployment.aggregated_tp",
                    format!("{tp} is not a TP degree: use a power of two ≤ cluster.gpus ({gpus})"),
                ));
            }
            if fits(tp.into(), model.encoder_weight_bytes()).is_none() {
                return Err(v.err(
                    "deployment.aggregated_tp",
                    format!(
                        "{} with its encoder and one longest sequence does not fit TP{tp} of {}",
                        model.name, gpu.name
                    ),
                ));
            }
            Some(tp)
        } else if system == System::Aggregated {
            let tp = [1u32, 2, 4, 8, 16, 32]
                .into_iter()
                .filter(|tp| *tp <= gpus)
                .find(|&tp| fits(tp.into(), model.encoder_weight_bytes()).is_some())
                .ok_or_else(|| {
                    v.err(
                        "deployment.system",
                        format!(
                            "aggregated: {} with its encoder and one longest sequence fits no TP degree within the cluster's {gpus} GPUs",
                            model.name
                        ),
                    )
                })?;
            Some(tp)
        } else {
            None
        };
        let local_prefill_tp = if offload < 1.0 {
            let e_gpus = allocation.encode.gpus();
            let tp = [1u32, 2, 4, 8, 16]
                .into_iter()
                .filter(|tp| *tp <= e_gpus)
                .find(|&tp| fits(tp.into(), model.encoder_weight_bytes()).is_some())
                .ok_or_else(|| {
                    v.err(
                        "deployment.offload",
                        format!(
                            "s = {offload} < 1 co-locates local prefill workers on the encode GPUs, but {}'s weights next to its encoder do not fit on the {e_gpus} encode GPU(s) of `{allocation}` at any TP; use offload = 1 or more encode workers",
                            model.name
                        ),
                    )
                })?;
            if !allocation.encode.workers.is_multiple_of(tp) {
                return Err(v.err(
                    "deployment.offload",
                    format!(
                        "s = {offload} < 1 co-locates local prefill workers spanning {tp} encode GPUs each (the LLM needs TP{tp} next to the encoder), so the encode worker count must be a multiple of {tp}; `{allocation}` has {}",
                        allocation.encode.workers
                    ),
                ));
            }
            Some(tp)
        } else {
            None
        };

        let preprocess_threads = preprocess_section(&raw, &v, system, &gpu, gpus)?;

        // --- cost source ---
        let profile = profile_section(&raw, &v, file, &model, &gpu)?;

        let slo = slo_section(&raw, &v)?;
        let launch = launch_section(&raw, &v)?;

        let deployment = Deployment {
            allocation,
            max_batch,
            offload,
            dispatch,
            router,
            sm_policy,
        };
        Ok(Scenario {
            name: raw.name.clone().unwrap_or_else(|| default_name.to_string()),
            file: file.to_string(),
            seed: raw.seed,
            model,
            gpu,
            gpus,
            deployment,
            system,
            profile,
            knobs: ServingKnobs {
                prefill_token_budget: knobs_budget,
                prefill_max_seqs,
                decode_max_batch,
                max_inflight_transfers,
                kv_block_size,
                gpu_memory_utilization: mem_util,
                admission_limit,
                local_prefill_tp,
                aggregated_tp,
                preprocess_threads,
            },
            workload: Workload {
                requests,
                rate,
                arrival,
                input_len,
                output_len,
                range_ratio,
                modality,
                shapes,
            },
            slo,
            launch,
            raw,
        })
    }
}

/// `deployment.sm_policy` checked: `dynamic` (default), `none` or
/// `static:F` with both sides of the split at least
/// [`easerve_sched::MIN_SM_SHARE`].
fn sm_policy_of(text: Option<&str>, v: &V<'_>) -> Result<SmPolicy, ScenarioError> {
    let sm_text = text.unwrap_or("dynamic");
    Ok(match split_arg(sm_text) {
        ("dynamic", None) => SmPolicy::Dynamic,
        ("none", None) => SmPolicy::None,
        ("static", Some(f)) => SmPolicy::Static(
            f.parse::<f64>()
                .ok()
                .filter(|f| {
                    (easerve_sched::MIN_SM_SHARE..=1.0 - easerve_sched::MIN_SM_SHARE).contains(f)
                })
                .ok_or_else(|| {
                    v.err(
                        "deployment.sm_policy",
                        format!("`{f}` is not an SM share in [0.001, 0.999] (each side of the split needs at least 0.001 of the SMs to progress)"),
                    )
                })?,
        ),
        _ => {
            return Err(v.err(
                "deployment.sm_policy",
                format!("unknown SM policy `{sm_text}`; allowed: dynamic, none, static:F"),
            ))
        }
    })
}

/// A trace whose first `rows` all arrive at one instant has no rate to
/// rescale: `workload.rate` or `workload.rate_scale` on it is bad input.
fn check_rescalable(
    rows: &[crate::trace::TraceRow],
    rate_given: bool,
    scale_given: bool,
    v: &V<'_>,
) -> Result<(), ScenarioError> {
    let one_instant = rows.len() > 1 && rows.last().is_some_and(|r| r.t <= 0.0);
    if one_instant && (rate_given || scale_given) {
        let field = if rate_given {
            "workload.rate"
        } else {
            "workload.rate_scale"
        };
        return Err(v.err(
            field,
            format!(
        "the trace's first {} rows all arrive at one instant, so it has no rate to rescale; leave out workload.rate and workload.rate_scale to replay it as it is, or give a trace whose timestamps differ",
        rows.len()
            ),
        ));
    }
    Ok(())
}

/// Default host cores per GPU: the EAServe paper's testbed, two AMD EPYC 9254
/// (48 cores) for eight RTX 6000 Ada GPUs (PAPER.txt, "Testbed and
/// baselines").
pub const HOST_CORES_PER_GPU: i64 = 6;

/// `deployment.preprocess`, `deployment.preprocess_threads` and
/// `cluster.host_cores` checked: the preprocessing threads of each encode
/// worker when preprocessing is pipelined, `None` when it is serial.
fn preprocess_section(
    raw: &ScenarioFile,
    v: &V<'_>,
    system: System,
    gpu: &GpuSpec,
    gpus: u32,
) -> Result<Option<u32>, ScenarioError> {
    let d = &raw.deployment;
    let on_cpu = gpu.name == "cpu";
    let host_cores = match raw.cluster.host_cores {
        Some(n) => v.int("cluster.host_cores", n, 1, 1 << 20)?,
        None if on_cpu => i64::from(gpus),
        None => HOST_CORES_PER_GPU * i64::from(gpus),
    };
    let framework = d.framework.as_deref().unwrap_or(system.name());
    let pipelined = match d.preprocess.as_deref() {
        Some("pipelined") => true,
        Some("serial") => false,
        Some(other) => {
            return Err(v.err(
                "deployment.preprocess",
                format!("unknown preprocessing `{other}`; allowed: pipelined, serial"),
            ))
        }
        None => framework == "easerve" && !on_cpu,
    };
    let threads = match d.preprocess_threads {
        Some(n) => v.int("deployment.preprocess_threads", n, 1, 1024)? as u32,
        None => (host_cores / i64::from(gpus.max(1))).clamp(1, 1024) as u32,
    };
    if d.preprocess_threads.is_some() && !pipelined {
        let why = match d.preprocess.as_deref() {
            Some(_) => "deployment.preprocess is \"serial\"".to_string(),
            None if on_cpu => "preprocessing is serial by default on the `cpu` device".to_string(),
            None => format!("preprocessing is serial by default for framework `{framework}`"),
        };
        return Err(v.err(
            "deployment.preprocess_threads",
            format!("only used with deployment.preprocess = \"pipelined\", and {why} (a serial pass preprocesses on one thread); set preprocess = \"pipelined\" or leave preprocess_threads out"),
        ));
    }
    Ok(pipelined.then_some(threads))
}

/// `[deployment.launch]` checked: names from [`easerve_calib::launch`], sizes and
/// the per-launch cost in range.
fn launch_section(raw: &ScenarioFile, v: &V) -> Result<easerve_calib::Launch, ScenarioError> {
    use easerve_calib::{Engine, Launch, LaunchMode};
    let Some(l) = &raw.deployment.launch else {
        return Ok(Launch::default());
    };
    let engine = match &l.engine {
        Some(e) => Engine::parse(e).map_err(|m| v.err("deployment.launch.engine", m))?,
        None => Engine::Vllm,
    };
    let mut out = Launch::of_engine(engine);
    let tokens = l
        .graph_max_tokens
        .map(|t| v.int("deployment.launch.graph_max_tokens", t, 1, 1 << 20))
        .transpose()?;
    let batch = l
        .graph_max_batch
        .map(|t| v.int("deployment.launch.graph_max_batch", t, 1, 1 << 16))
        .transpose()?;
    use easerve_calib::LaunchStage as S;
    for (name, given, stage, max, which) in [
        ("encode", &l.encode, &mut out.encode, tokens, S::Encode),
        ("prefill", &l.prefill, &mut out.prefill, tokens, S::Prefill),
        ("decode", &l.decode, &mut out.decode, batch, S::Decode),
    ] {
        if let Some(m) = given {
            stage.mode =
                LaunchMode::parse(m).map_err(|e| v.err(&format!("deployment.launch.{name}"), e))?;
        }
        if let Some(max) = max {
            stage.graph_max = max as u64;
        } else if stage.mode == LaunchMode::Graph && stage.graph_max == 0 {
            // graphed where the engine's default is eager
            stage.graph_max = easerve_calib::launch::default_graph_max(which);
        }
    }
    if let Some(us) = l.per_launch_us {
        out.per_launch_s =
            v.real("deployment.launch.per_launch_us", us, 0.0, 10_000.0, false)? * 1e-6;
        out.per_launch_source = format!("{us} µs, given by the scenario");
    }
    Ok(out)
}

/// The `[model]` and `[cluster]` sections: the model and GPU (presets or
/// custom files next to the scenario, in `dir`), the link and cost-source
/// choices, and the GPU count.
fn cluster_section(
    raw: &ScenarioFile,
    v: &V<'_>,
    dir: &Path,
) -> Result<(ModelArch, GpuSpec, u32), ScenarioError> {
    let mut model = preset_or_file(
        v,
        dir,
        ("model", "model.preset", "model.file"),
        (raw.model.preset.as_deref(), raw.model.file.as_deref()),
        ("model", ModelArch::preset, ModelArch::preset_names()),
        check_model,
    )?;
    if let Some(r) = raw.model.moe_routing.as_deref() {
        let names = easerve_model::MoeRouting::ALL.map(|r| r.name()).join(", ");
        let routing = easerve_model::MoeRouting::from_name(r).ok_or_else(|| {
            v.err(
                "model.moe_routing",
                format!("`{r}` is not a routing (allowed: {names})"),
            )
        })?;
        match model.llm.moe.as_mut() {
            Some(m) => m.routing = routing,
            None => {
                return Err(v.err(
                    "model.moe_routing",
                    format!(
                        "{} is a dense model (no `llm.moe`): leave `moe_routing` out",
                        model.name
                    ),
                ))
            }
        }
    }
    let dtype_bytes = |field: &str, value: Option<&str>| -> Result<Option<u32>, ScenarioError> {
        let Some(d) = value else { return Ok(None) };
        let table = if field == "model.dtype" {
            LLM_DTYPES
        } else {
            KV_DTYPES
        };
        table
            .iter()
            .find(|(n, _)| *n == d)
            .map(|(_, b)| Some(*b))
            .ok_or_else(|| {
                v.err(
                    field,
                    format!(
                        "`{d}` is not a dtype (allowed: {})",
                        table.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                    ),
                )
            })
    };
    if let Some(on) = raw.model.pan_and_scan {
        match model.encoder.as_mut().map(|e| &mut e.kind) {
            Some(easerve_model::EncoderKind::Siglip { pan_and_scan, .. }) => {
                *pan_and_scan = on.then(easerve_model::PanAndScan::default);
            }
            _ => {
                return Err(v.err(
                    "model.pan_and_scan",
                    format!(
                        "{}'s encoder is not SigLIP (Gemma 3): pan-and-scan does not apply; leave it out",
                        model.name
                    ),
                ))
            }
        }
    }
    let w = dtype_bytes("model.dtype", raw.model.dtype.as_deref())?;
    let kv = dtype_bytes("model.kv_cache_dtype", raw.model.kv_cache_dtype.as_deref())?;
    if let Some(b) = w {
        model.llm.dtype_bytes = b;
    }
    if let Some(b) = kv {
        model.llm.kv_dtype_bytes = Some(b);
    }
    let fp8_field = if model.llm.dtype_bytes == 1 {
        Some("model.dtype")
    } else if model.llm.kv_bytes() == 1 {
        Some("model.kv_cache_dtype")
    } else {
        None
    };
    let mut gpu = preset_or_file(
        v,
        dir,
        ("cluster", "cluster.gpu", "cluster.gpu_file"),
        (raw.cluster.gpu.as_deref(), raw.cluster.gpu_file.as_deref()),
        ("GPU", GpuSpec::preset, GpuSpec::preset_names()),
        check_gpu,
    )?;
    match &raw.cluster.link {
        Some(LinkChoice::Preset(link)) => {
            gpu.link = LinkSpec::preset(link).ok_or_else(|| {
                v.err(
                    "cluster.link",
                    format!(
                        "unknown link `{link}`; allowed: {}, or a table {{ name, bandwidth_gbs, latency_s }}",
                        LinkSpec::preset_names().join(", ")
                    ),
                )
            })?;
        }
        Some(LinkChoice::Inline(link)) => {
            check_link(link).map_err(|(f, m)| v.err(&format!("cluster.link.{f}"), m))?;
            gpu.link = link.clone();
        }
        None => {}
    }
    if let Some(k) = &raw.cluster.kernels {
        if !["auto", "roofline", "l40s-proxy"].contains(&k.as_str()) {
            return Err(v.err(
                "cluster.kernels",
                format!("unknown cost source `{k}`; allowed: auto, roofline, l40s-proxy"),
            ));
        }
        if k == "l40s-proxy" && raw.cluster.gpu.as_deref() != Some("rtx-6000-ada") {
            return Err(v.err(
                "cluster.kernels",
                "`l40s-proxy` prices only `cluster.gpu = \"rtx-6000-ada\"` (same AD102 die as the L40S)",
            ));
        }
    }
    if let Some(x) = raw.cluster.host_cpu_scale {
        v.real("cluster.host_cpu_scale", x, 0.0, 1000.0, true)?;
    }
    let gpus = v.int("cluster.gpus", raw.cluster.gpus, 1, 4096)? as u32;
    if let Some(field) = fp8_field {
        if NO_FP8_GPUS.contains(&gpu.name.as_str()) {
            return Err(v.err(
                field,
                format!(
                    "{} has no FP8 units (FP8 needs compute capability 8.9+: Ada, Hopper, Blackwell); its kernel tables have bfloat16 only; use bfloat16",
                    gpu.name
                ),
            ));
        }
    }
    Ok((model, gpu, gpus))
}

/// The `[workload]` section: request count, arrival process and rate (or a
/// trace next to the scenario, `file`), prompt and output lengths, and the
/// modality's shapes, checked against what `model` accepts.
fn workload_section(
    raw: &ScenarioFile,
    v: &V<'_>,
    file: &str,
    model: &ModelArch,
) -> Result<Workload, ScenarioError> {
    let w = &raw.workload;
    let requests = v.int("workload.requests", w.requests, 1, 10_000_000)? as usize;
    let given_rate = w
        .rate
        .map(|r| v.real("workload.rate", r, 0.0, MAX_RATE, true))
        .transpose()?;
    let arrival_kind = w.arrival.as_deref().unwrap_or("poisson");
    if arrival_kind != "gamma" && w.cv.is_some() {
        return Err(v.err("workload.cv", "only used with arrival = \"gamma\""));
    }
    if arrival_kind != "trace" && (w.trace.is_some() || w.rate_scale.is_some()) {
        let f = if w.trace.is_some() {
            "workload.trace"
        } else {
            "workload.rate_scale"
        };
        return Err(v.err(f, "only used with arrival = \"trace\""));
    }
    let need_rate = || {
        given_rate.ok_or_else(|| {
            v.err(
                "workload.rate",
                "required (requests/s > 0) unless arrival = \"trace\"",
            )
        })
    };
    let (arrival, rate) = match arrival_kind {
        "poisson" => (Arrival::Poisson, need_rate()?),
        "gamma" => {
            let cv = v.real("workload.cv", w.cv.unwrap_or(1.0), 0.0, 100.0, true)?;
            let rate = need_rate()?;
            // the generator draws gaps from Gamma(k = 1/cv², θ = 1/(rate·k))
            let k = 1.0 / (cv * cv);
            let theta = 1.0 / (rate * k);
            if !(k.is_finite() && theta.is_normal()) {
                return Err(v.err(
                    "workload.cv",
                    format!(
                        "{} is too small at rate {}: the gamma gaps' shape 1/cv² = {} and scale {} are not representable; use a larger cv",
                        num(cv),
                        num(rate),
                        num(k),
                        num(theta)
                    ),
                ));
            }
            (Arrival::Gamma { cv }, rate)
        }
        "trace" => {
            let name = w
                .trace
                .as_deref()
                .ok_or_else(|| v.err("workload.trace", "required when arrival = \"trace\": a CSV in the Azure LLM inference trace format"))?;
            let path = Path::new(file)
                .parent()
                .unwrap_or(Path::new("."))
                .join(name);
            let mut rows = crate::trace::read_azure(&path, requests)
                .map_err(|e| v.err("workload.trace", format!("{}: {e}", path.display())))?;
            let native = crate::trace::mean_rate(&rows);
            check_rescalable(&rows, given_rate.is_some(), w.rate_scale.is_some(), v)?;
            let scale = match (given_rate, w.rate_scale) {
                (Some(_), Some(_)) => {
                    return Err(v.err("workload.rate_scale", "give either workload.rate (a target mean rate) or workload.rate_scale, not both"))
                }
                (Some(r), None) => r / native,
                (None, s) => v.real("workload.rate_scale", s.unwrap_or(1.0), 0.0, MAX_RATE, true)?,
            };
            crate::trace::scale(&mut rows, scale);
            let rate = crate::trace::mean_rate(&rows);
            (
                Arrival::Trace {
                    path: path.display().to_string(),
                    rows,
                },
                rate,
            )
        }
        other => {
            return Err(v.err(
                "workload.arrival",
                format!("unknown arrival `{other}`; allowed: poisson, gamma, trace"),
            ))
        }
    };
    if let Arrival::Trace { rows, path } = &arrival {
        if rows.len() < requests {
            return Err(v.err(
                "workload.requests",
                format!(
                    "{requests} requests asked for, but the trace {path} has {} rows; a trace is replayed once, so ask for at most that many",
                    rows.len()
                ),
            ));
        }
    }
    // the arrivals must span a time the simulator can resolve: a trace's own
    // span (its mean rate counts gaps, so requests / rate would overstate it)
    let horizon = match &arrival {
        Arrival::Trace { rows, .. } => rows.get(requests.saturating_sub(1)).map_or(0.0, |r| r.t),
        _ => requests as f64 / rate,
    };
    if horizon.is_nan() || horizon > MAX_HORIZON_S {
        return Err(v.err(
            "workload.rate",
            format!(
                "{} requests/s spreads {requests} requests over {} s; the simulator's clock resolves service times only within {} s, so give a rate of at least {}",
                num(rate),
                num(horizon),
                num(MAX_HORIZON_S),
                num(requests as f64 / MAX_HORIZON_S)
            ),
        ));
    }
    let replay = matches!(arrival, Arrival::Trace { .. });
    let len = |field: &str, x: Option<i64>, min: i64| -> Result<i64, ScenarioError> {
        match x {
            Some(x) => v.int(field, x, min, 10_000_000),
            None if replay => Ok(min.max(1)),
            None => Err(v.err(field, format!("required: tokens ≥ {min}"))),
        }
    };
    let input_len = len("workload.input_len", w.input_len, 0)? as u32;
    let output_len = len("workload.output_len", w.output_len, 1)? as u32;
    let range_ratio = v.real(
        "workload.range_ratio",
        w.range_ratio.unwrap_or(0.0),
        0.0,
        1.0,
        false,
    )?;
    let modality = match w.modality.as_str() {
        "image" => Modality::Image,
        "video" => Modality::Video,
        "audio" => Modality::Audio,
        "text" => Modality::Text,
        other => {
            return Err(v.err(
                "workload.modality",
                format!("unknown modality `{other}`; allowed: image, video, audio, text"),
            ))
        }
    };
    let unused = |name: &str, present: bool| -> Result<(), ScenarioError> {
        if present && w.modality != name {
            Err(v.err(
                &format!("workload.{name}"),
                format!("given but workload.modality is `{}`", w.modality),
            ))
        } else {
            Ok(())
        }
    };
    unused("image", w.image.is_some())?;
    unused("video", w.video.is_some())?;
    unused("audio", w.audio.is_some())?;
    let items =
        |field: &str, n: Option<i64>, r: Option<f64>| -> Result<(u32, f64), ScenarioError> {
            Ok((
                v.int(&format!("{field}.items_per_request"), n.unwrap_or(1), 1, 64)? as u32,
                v.real(
                    &format!("{field}.items_range_ratio"),
                    r.unwrap_or(0.0),
                    0.0,
                    1.0,
                    false,
                )?,
            ))
        };
    let prob = |field: String, p: f64| v.real(&field, p, 0.0, f64::MAX, false);
    let missing = |name: &str| {
        v.err(
            &format!("workload.{name}"),
            format!("required when workload.modality = \"{name}\""),
        )
    };
    let shapes = match modality {
        Modality::Image => {
            let s = w.image.as_ref().ok_or_else(|| missing("image"))?;
            let (items, items_range_ratio) =
                items("workload.image", s.items_per_request, s.items_range_ratio)?;
            let buckets = v.table("workload.image.buckets", &s.buckets, |f, b| {
                let height = v.int(&format!("{f}.height"), b.height, 1, 16384)? as u32;
                let width = v.int(&format!("{f}.width"), b.width, 1, 16384)? as u32;
                let p = prob(format!("{f}.probability"), b.probability)?;
                Ok((MmItem::Image { height, width }, p))
            })?;
            Shapes::Items {
                items,
                items_range_ratio,
                buckets,
            }
        }
        Modality::Video => {
            let s = w.video.as_ref().ok_or_else(|| missing("video"))?;
            let (items, items_range_ratio) =
                items("workload.video", s.items_per_request, s.items_range_ratio)?;
            let buckets = v.table("workload.video.buckets", &s.buckets, |f, b| {
                let frames = v.int(&format!("{f}.frames"), b.frames, 1, 4096)? as u32;
                let height = v.int(&format!("{f}.height"), b.height, 1, 16384)? as u32;
                let width = v.int(&format!("{f}.width"), b.width, 1, 16384)? as u32;
                let p = prob(format!("{f}.probability"), b.probability)?;
                Ok((
                    MmItem::Video {
                        frames,
                        height,
                        width,
                    },
                    p,
                ))
            })?;
            Shapes::Items {
                items,
                items_range_ratio,
                buckets,
            }
        }
        Modality::Audio => {
            let s = w.audio.as_ref().ok_or_else(|| missing("audio"))?;
            Shapes::Audio {
                mean_s: v.real("workload.audio.mean_s", s.mean_s, 0.0, 3600.0, true)?,
                sigma: v.real(
                    "workload.audio.sigma",
                    s.sigma.unwrap_or(0.5),
                    0.0,
                    5.0,
                    false,
                )?,
                max_s: v.real(
                    "workload.audio.max_s",
                    s.max_s.unwrap_or(30.0),
                    0.1,
                    3600.0,
                    false,
                )?,
            }
        }
        Modality::Text => Shapes::Text,
    };
    let bucket_total: f64 = match &shapes {
        Shapes::Items { buckets, .. } => buckets.iter().map(|b| b.1).sum(),
        _ => 1.0,
    };
    if !(bucket_total > 0.0 && bucket_total.is_finite()) {
        return Err(v.err(
            &format!("workload.{}.buckets", w.modality),
            format!(
                "probabilities sum to {}; they are relative weights whose sum must be positive and finite",
                num(bucket_total)
            ),
        ));
    }
    // check the model accepts the modality and every bucket shape
    let token_check = match &shapes {
        Shapes::Items { buckets, .. } => buckets
            .iter()
            .try_for_each(|b| item_tokens(model, &b.0).map(|_| ())),
        Shapes::Audio { mean_s, .. } => model.audio_tokens(*mean_s).map(|_| ()),
        Shapes::Text => Ok(()),
    };
    token_check.map_err(|e| v.err(&format!("workload.{}", w.modality), e.to_string()))?;
    Ok(Workload {
        requests,
        rate,
        arrival,
        input_len,
        output_len,
        range_ratio,
        modality,
        shapes,
    })
}

/// The `[deployment]` section: the allocation, `B`, `s`, the dispatch, router
/// and SM policies, and the serving knobs (local-prefill and aggregated TP
/// are resolved later, against the cluster and the model).
fn deployment_section(
    raw: &ScenarioFile,
    v: &V<'_>,
) -> Result<(Deployment, ServingKnobs), ScenarioError> {
    let d = &raw.deployment;
    let allocation: Allocation =
        d.allocation
            .parse()
            .map_err(|e: easerve_sched::AllocationError| {
                v.err("deployment.allocation", e.to_string())
            })?;
    let max_batch = v.int("deployment.batch", d.batch, 1, MAX_BATCH)? as usize;
    let offload = v.real("deployment.offload", d.offload, 0.0, 1.0, false)?;
    let q = d.gap_quantile.unwrap_or(0.9);
    if !(q > 0.0 && q < 1.0) {
        return Err(v.err(
            "deployment.gap_quantile",
            format!("{} is out of range: allowed (0, 1)", num(q)),
        ));
    }
    let max_age_s = d
        .max_age_s
        .map(|x| v.real("deployment.max_age_s", x, 0.0, MAX_WAIT_S, false))
        .transpose()?;
    let dispatch_text = d.dispatch.as_deref().unwrap_or("poisson-gap");
    let dispatch = match split_arg(dispatch_text) {
        ("poisson-gap", None) => DispatchPolicy::PoissonGap { q, max_age_s, rate_hint: None },
        ("immediate", None) => DispatchPolicy::Immediate,
        ("fixed-timeout", Some(t)) => DispatchPolicy::FixedTimeout {
            timeout_s: t
                .parse::<f64>()
                .ok()
                .filter(|x| (0.0..=MAX_WAIT_S).contains(x))
                .ok_or_else(|| v.err("deployment.dispatch", format!("`{t}` is not a timeout in seconds in [0, {MAX_WAIT_S}] (the bound of deployment.max_age_s)")))?,
        },
        ("queue-length", Some(k)) => DispatchPolicy::QueueLength {
            k: k.parse::<usize>()
                .ok()
                .filter(|k| *k >= 1)
                .ok_or_else(|| v.err("deployment.dispatch", format!("`{k}` is not a queue length ≥ 1")))?,
            max_age_s,
        },
        _ => {
            return Err(v.err(
                "deployment.dispatch",
                format!("unknown dispatch `{dispatch_text}`; allowed: poisson-gap, immediate, fixed-timeout:SECONDS, queue-length:K"),
            ))
        }
    };
    let router_text = d.router.as_deref().unwrap_or("deficit");
    let router =
        match split_arg(router_text) {
            ("deficit", None) => RouterPolicy::Deficit,
            ("random", None) => RouterPolicy::Random {
                seed: crate::rng::subseed(raw.seed, "router"),
            },
            ("windowed", Some(w)) => RouterPolicy::Windowed {
                window: w.parse::<u32>().ok().filter(|w| *w >= 1).ok_or_else(|| {
                    v.err("deployment.router", format!("`{w}` is not a window ≥ 1"))
                })?,
            },
            _ => {
                return Err(v.err(
                    "deployment.router",
                    format!("unknown router `{router_text}`; allowed: deficit, random, windowed:W"),
                ))
            }
        };
    let sm_policy = sm_policy_of(d.sm_policy.as_deref(), v)?;
    // optional positive integer knob: `deployment.NAME`, default, upper bound
    let knob = |name: &str, value: Option<i64>, default: i64, max: i64| {
        v.int(
            &format!("deployment.{name}"),
            value.unwrap_or(default),
            1,
            max,
        )
    };
    let knobs_budget = knob(
        "prefill_token_budget",
        d.prefill_token_budget,
        8192,
        1 << 30,
    )? as u64;
    let prefill_max_seqs = knob("prefill_max_seqs", d.prefill_max_seqs, 64, 1 << 20)? as usize;
    let decode_max_batch = knob("decode_max_batch", d.decode_max_batch, 256, 1 << 20)? as usize;
    let kv_block_size = knob("kv_block_size", d.kv_block_size, 16, 1 << 16)? as u64;
    let max_inflight_transfers = knob(
        "max_inflight_transfers",
        d.max_inflight_transfers,
        4,
        1 << 16,
    )? as usize;
    let admission_limit = match d.admission_limit {
        Some(n) => Some(v.int("deployment.admission_limit", n, 1, 1 << 30)? as usize),
        None => None,
    };
    let mem_util = v.real(
        "deployment.gpu_memory_utilization",
        d.gpu_memory_utilization.unwrap_or(0.9),
        0.0,
        1.0,
        true,
    )?;

    Ok((
        Deployment {
            allocation,
            max_batch,
            offload,
            dispatch,
            router,
            sm_policy,
        },
        ServingKnobs {
            prefill_token_budget: knobs_budget,
            prefill_max_seqs,
            decode_max_batch,
            max_inflight_transfers,
            kv_block_size,
            gpu_memory_utilization: mem_util,
            admission_limit,
            local_prefill_tp: None,
            aggregated_tp: None,
            preprocess_threads: None,
        },
    ))
}

/// The `profile` field: a measured profile next to the scenario (`file`),
/// which must profile the scenario's model on its GPU and link; `None` for
/// none or `"roofline"`.
fn profile_section(
    raw: &ScenarioFile,
    v: &V<'_>,
    file: &str,
    model: &ModelArch,
    gpu: &GpuSpec,
) -> Result<Option<easerve_calib::Profile>, ScenarioError> {
    let profile = match raw.profile.as_deref() {
        None | Some("roofline") => None,
        Some(name) => {
            let path = Path::new(file)
                .parent()
                .unwrap_or(Path::new("."))
                .join(name);
            let text = easerve_calib::input::read_text(&path)
                .map_err(|e| v.err("profile", format!("cannot read {}: {e}", path.display())))?;
            // a custom GPU (cluster.gpu_file) is a known device for its own profiles
            let p = easerve_calib::Profile::from_toml_str_with_devices(
                &text,
                &path.display().to_string(),
                std::slice::from_ref(&gpu.name),
                std::slice::from_ref(&gpu.link.name),
            )
            .map_err(|e| v.err("profile", e.to_string()))?;
            let prov = &p.provenance;
            if prov.model != model.name || prov.device != gpu.name || prov.link != gpu.link.name {
                return Err(v.err(
                    "profile",
                    format!(
                        "{} profiles {} on {} over {}, but the scenario runs {} on {} over {}",
                        path.display(),
                        prov.model,
                        prov.device,
                        prov.link,
                        model.name,
                        gpu.name,
                        gpu.link.name
                    ),
                ));
            }
            check_profile_tables(&p, raw, v, &path)?;
            Some(p)
        }
    };

    Ok(profile)
}

/// A profile that would make a stage free is refused: an encode table is
/// needed by a multimodal workload, and a table whose `median` latencies are
/// all 0 prices every batch of its stage at nothing.
fn check_profile_tables(
    p: &easerve_calib::Profile,
    raw: &ScenarioFile,
    v: &V<'_>,
    path: &Path,
) -> Result<(), ScenarioError> {
    let modality = raw.workload.modality.as_str();
    if modality != "text" && p.encode_table().is_none() {
        return Err(v.err(
            "profile",
            format!(
                "{} has no encode table, which a {modality} workload needs (every encode pass would be free); measure one with `easerve profile`, or write its [[encode]] rows",
                path.display()
            ),
        ));
    }
    let tables = p
        .encode_table()
        .into_iter()
        .chain([p.prefill_table(), p.decode_table()]);
    for t in tables {
        let Some(m) = t.columns().iter().position(|c| c == "median") else {
            continue;
        };
        if !t.rows().is_empty() && t.rows().iter().all(|r| r.get(m).is_some_and(|x| *x <= 0.0)) {
            return Err(v.err(
                "profile",
                format!(
                    "{}: every `median` of its {} table is 0, which would make that stage free; give the measured latencies",
                    path.display(),
                    t.stage().name()
                ),
            ));
        }
    }
    Ok(())
}

/// The `[[slo]]` tiers: names and TTFT / TPOT bounds (seconds).
fn slo_section(raw: &ScenarioFile, v: &V<'_>) -> Result<Vec<SloTier>, ScenarioError> {
    let mut slo = Vec::new();
    for (i, t) in raw.slo.iter().enumerate() {
        let f = format!("slo[{i}]");
        let name = &t.name;
        // tier names also name files (`goodput-NAME.svg`) and metric labels
        let plain = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if name.is_empty() || name.len() > MAX_TIER_NAME || !plain || name.starts_with('.') {
            return Err(v.err(
                &format!("{f}.name"),
                format!(
                    "`{}` is not a tier name: use 1 to {MAX_TIER_NAME} ASCII letters, digits, `_`, `-` or `.`, not starting with `.`",
                    name.chars().take(80).collect::<String>()
                ),
            ));
        }
        if raw.slo[..i].iter().any(|o| &o.name == name) {
            return Err(v.err(
                &format!("{f}.name"),
                format!("tier `{name}` is named twice"),
            ));
        }
        slo.push(SloTier {
            name: name.clone(),
            ttft_s: v.real(&format!("{f}.ttft_s"), t.ttft_s, 0.0, 1e9, true)?,
            tpot_s: v.real(&format!("{f}.tpot_ms"), t.tpot_ms, 0.0, 1e9, true)? / 1e3,
        });
    }

    Ok(slo)
}

/// Upper bound on one sequence's tokens (prompt + multimodal + output) the
/// workload can draw: the KV cache of a single worker must hold at least this.
fn max_sequence_tokens(model: &ModelArch, input: u32, output: u32, r: f64, shapes: &Shapes) -> u64 {
    let hi = |len: u32| (len as f64 * (1.0 + r)).ceil() as u64;
    hi(input) + hi(output) + shapes.max_mm_tokens(model)
}

impl Shapes {
    /// The most multimodal items one request can draw: `⌈items·(1 + r)⌉`, the
    /// top of [`crate::generate`]'s uniform range (1 for audio, 0 for text).
    pub fn max_items(&self) -> u64 {
        match self {
            Shapes::Items {
                items,
                items_range_ratio,
                ..
            } => ((f64::from(*items) * (1.0 + items_range_ratio)).ceil() as u64).max(1),
            Shapes::Audio { .. } => 1,
            Shapes::Text => 0,
        }
    }

    /// The most multimodal tokens one request can bring to the LLM under
    /// `model`: its largest bucket's tokens times [`Shapes::max_items`] (the
    /// longest clip for audio).
    pub fn max_mm_tokens(&self, model: &ModelArch) -> u64 {
        match self {
            Shapes::Items { buckets, .. } => {
                let per = buckets
                    .iter()
                    .filter_map(|b| item_tokens(model, &b.0).ok())
                    .map(|t| t.llm_tokens)
                    .max()
                    .unwrap_or(0);
                per * self.max_items()
            }
            Shapes::Audio { max_s, .. } => model
                .audio_tokens(*max_s)
                .map(|t| t.llm_tokens)
                .unwrap_or(0),
            Shapes::Text => 0,
        }
    }
}

/// Read a custom model or GPU definition; errors name the file and the field.
/// What a preset field names (`"model"`), its lookup, and the allowed names.
type Presets<'a, T> = (&'a str, fn(&str) -> Option<T>, &'a [&'a str]);

/// A model or GPU given either as a preset name or as a custom TOML file next
/// to the scenario (in `dir`), exactly one of the two. `fields` names the
/// section and its preset and file fields; `presets` names what it is, looks
/// a preset up and lists the allowed names; `check` validates a custom file.
fn preset_or_file<T: serde::de::DeserializeOwned>(
    v: &V,
    dir: &Path,
    (section, preset_field, file_field): (&str, &str, &str),
    given: (Option<&str>, Option<&str>),
    (what, preset, names): Presets<'_, T>,
    check: fn(&T) -> Result<(), String>,
) -> Result<T, ScenarioError> {
    let key = |f: &str| f.rsplit('.').next().unwrap_or(f).to_string();
    match given {
        (Some(name), None) => preset(name).ok_or_else(|| {
            v.err(
                preset_field,
                format!(
                    "unknown {what} `{name}`; allowed: {} (or `{file_field}` for a custom {what})",
                    names.join(", ")
                ),
            )
        }),
        (None, Some(f)) => {
            let path = dir.join(f);
            let x: T = load_custom(v, file_field, &path)?;
            check(&x).map_err(|e| v.err(file_field, format!("{}: {e}", path.display())))?;
            Ok(x)
        }
        _ => Err(v.err(
            section,
            format!(
                "give exactly one of `{}` and `{}`",
                key(preset_field),
                key(file_field)
            ),
        )),
    }
}

fn load_custom<T: serde::de::DeserializeOwned>(
    v: &V,
    field: &str,
    path: &Path,
) -> Result<T, ScenarioError> {
    let text = easerve_calib::input::read_text(path)
        .map_err(|e| v.err(field, format!("cannot read {}: {e}", path.display())))?;
    serde_path_to_error::deserialize(toml::Deserializer::new(&text)).map_err(|e| {
        let inner_field = e.path().to_string();
        let inner = e.into_inner();
        // as in ScenarioFile::parse: a value the TOML parser rejects names
        // its field from the text
        let inner_field = match (inner_field.as_str(), inner.span()) {
            (".", Some(span)) => field_at(&text, span.start).unwrap_or(inner_field),
            _ => inner_field,
        };
        v.err(
            field,
            format!(
                "{}: field `{inner_field}`: {}",
                path.display(),
                plain_types(inner.message())
            ),
        )
    })
}

/// Shapes a custom model must have: every size positive, heads dividing the
/// width, KV heads dividing the heads, 1-, 2- or 4-byte weights.
pub fn check_model(m: &ModelArch) -> Result<(), String> {
    let l = &m.llm;
    let positive = [
        ("llm.layers", l.layers),
        ("llm.hidden", l.hidden),
        ("llm.heads", l.heads),
        ("llm.kv_heads", l.kv_heads),
        ("llm.head_dim", l.head_dim),
        ("llm.ffn", l.ffn),
        ("llm.vocab", l.vocab),
    ];
    for (name, x) in positive {
        if x == 0 {
            return Err(format!("field `{name}` must be ≥ 1"));
        }
    }
    if !l.heads.is_multiple_of(l.kv_heads) {
        return Err(format!(
            "field `llm.kv_heads` ({}) must divide `llm.heads` ({})",
            l.kv_heads, l.heads
        ));
    }
    if ![1, 2, 4].contains(&l.dtype_bytes) {
        return Err("field `llm.dtype_bytes` must be 1, 2 or 4".into());
    }
    if let Some(moe) = &l.moe {
        check_moe(moe, l.layers)?;
    }
    if let Some(e) = &m.encoder {
        for (name, x) in [
            ("encoder.layers", e.layers),
            ("encoder.hidden", e.hidden),
            ("encoder.heads", e.heads),
            ("encoder.ffn", e.ffn),
        ] {
            if x == 0 {
                return Err(format!("field `{name}` must be ≥ 1"));
            }
        }
        if !e.hidden.is_multiple_of(e.heads) {
            return Err(format!(
                "field `encoder.heads` ({}) must divide `encoder.hidden` ({})",
                e.heads, e.hidden
            ));
        }
        if ![1, 2, 4].contains(&e.dtype_bytes) {
            return Err("field `encoder.dtype_bytes` must be 1, 2 or 4".into());
        }
        check_encoder_kind(&e.kind)?;
        if let easerve_model::EncoderKind::TiledVit { projector, .. }
        | easerve_model::EncoderKind::OmniAudio { projector, .. } = &e.kind
        {
            if projector.last() != Some(&l.hidden) {
                return Err(format!(
                    "field `encoder.kind.*.projector` must end at the LLM's width `llm.hidden` = {}, got {projector:?}",
                    l.hidden
                ));
            }
            // what the projector's first layer reads: the encoder's features,
            // widened by the pixel shuffle's folding
            let (first, why) = match &e.kind {
                easerve_model::EncoderKind::TiledVit { pixel_shuffle, .. } => (
                    u64::from(*pixel_shuffle).pow(2) * u64::from(e.hidden),
                    "`pixel_shuffle`² × `encoder.hidden`",
                ),
                _ => (u64::from(e.hidden), "`encoder.hidden`"),
            };
            if projector.first().map(|&w| u64::from(w)) != Some(first) {
                return Err(format!(
                    "field `encoder.kind.*.projector` must start at {why} = {first} (the features it reads), got {projector:?}"
                ));
            }
            let params: u64 = projector
                .windows(2)
                .map(|w| u64::from(w[0]) * u64::from(w[1]))
                .sum();
            if params != e.projector_params {
                return Err(format!(
                    "field `encoder.projector_params` ({}) must equal the projector's weights, the sum of its widths' products ({params})",
                    e.projector_params
                ));
            }
        }
        if let easerve_model::EncoderKind::QwenVit { deepstack, .. } = &e.kind {
            if let Some(t) = deepstack.iter().find(|&&t| t >= e.layers) {
                return Err(format!(
                    "field `encoder.kind.QwenVit.deepstack` names block {t}; allowed: 0 ..= {} (encoder.layers − 1)",
                    e.layers - 1
                ));
            }
        }
    }
    if m.name.trim().is_empty() {
        return Err("field `name` must not be empty".into());
    }
    Ok(())
}

/// GPUs of one node: one worker's `TP × EP` must stay within it. Every GPU
/// system of the aiconfigurator data is an 8-GPU node (HGX H100/H200/B200,
/// 8-GPU A100, L40S and RTX PRO 6000 servers) and its NCCL tables stop at 8
/// GPUs; cross-node expert parallelism is not modelled.
pub const NODE_GPUS: u32 = 8;

/// Expert parallelism in an allocation: only an MoE model's prefill and
/// decode workers take `EP > 1`; EP must divide the experts, and one worker's
/// `TP × EP` GPUs must fit in a node ([`NODE_GPUS`]).
fn check_expert_parallel(a: &Allocation, model: &ModelArch) -> Result<(), String> {
    if a.encode.ep > 1 {
        return Err(format!(
            "encode workers take no expert parallelism (the encoder has no experts): use {}E(TP1)",
            a.encode.workers
        ));
    }
    for (stage, letter, pool) in [("prefill", 'P', a.prefill), ("decode", 'D', a.decode)] {
        if pool.workers == 0 {
            continue;
        }
        if pool.ep > 1 {
            let Some(moe) = &model.llm.moe else {
                return Err(format!(
                    "{stage} at EP{}: {} is a dense model (no experts to split); use {}{letter}(TP{})",
                    pool.ep, model.name, pool.workers, pool.tp
                ));
            };
            if !moe.experts.is_multiple_of(pool.ep) {
                let allowed: Vec<String> = (1..=moe.experts.min(NODE_GPUS))
                    .filter(|e| moe.experts.is_multiple_of(*e))
                    .map(|e| e.to_string())
                    .collect();
                return Err(format!(
                    "{stage} at EP{}: EP must divide the {} experts of {} (allowed up to {NODE_GPUS}: {})",
                    pool.ep,
                    moe.experts,
                    model.name,
                    allowed.join(", ")
                ));
            }
        }
        if pool.ep > 1 && pool.gpus_per_worker() > NODE_GPUS {
            return Err(format!(
                "{stage} at TP{} × EP{} = {} GPUs spans more than one {NODE_GPUS}-GPU node (a worker's TP × EP must be at most {NODE_GPUS})",
                pool.tp,
                pool.ep,
                pool.gpus_per_worker()
            ));
        }
    }
    Ok(())
}

/// The MoE fields of a model file: experts, top-k and widths ≥ 1, top-k at
/// most the experts, the dense leading layers fewer than the layers.
fn check_moe(m: &easerve_model::MoeArch, layers: u32) -> Result<(), String> {
    for (name, x) in [
        ("llm.moe.experts", m.experts),
        ("llm.moe.top_k", m.top_k),
        ("llm.moe.expert_ffn", m.expert_ffn),
        ("llm.moe.router", m.router),
    ] {
        if x == 0 {
            return Err(format!("field `{name}` must be ≥ 1"));
        }
    }
    if m.top_k > m.experts {
        return Err(format!(
            "field `llm.moe.top_k` ({}) must be ≤ `llm.moe.experts` ({})",
            m.top_k, m.experts
        ));
    }
    if m.shared_experts > 0 && m.shared_ffn == 0 {
        return Err(
            "field `llm.moe.shared_ffn` must be ≥ 1 when `llm.moe.shared_experts` ≥ 1".into(),
        );
    }
    if m.first_dense_layers >= layers {
        return Err(format!(
            "field `llm.moe.first_dense_layers` ({}) must be < `llm.layers` ({layers}): a model whose layers are all dense has no `moe` table",
            m.first_dense_layers
        ));
    }
    Ok(())
}

/// Before `--set cluster.link.FIELD`: a preset link (named, or the GPU
/// preset's own) becomes its table, so one figure can be changed.
fn expand_link_preset(doc: &mut toml::Value) {
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

/// A link's figures: a name (it names the link in reports and profiles),
/// bandwidth positive and finite, latency finite and ≥ 0; else the field and
/// what is wrong.
fn check_link(l: &LinkSpec) -> Result<(), (&'static str, String)> {
    if l.name.trim().is_empty() {
        return Err(("name", "must not be empty".into()));
    }
    if !(HARDWARE_MIN..=1e5).contains(&l.bandwidth_gbs) {
        return Err((
            "bandwidth_gbs",
            format!(
                "{} GB/s is not a plausible link: allowed [{HARDWARE_MIN}, 1e5] ({HARDWARE_WHY})",
                num(l.bandwidth_gbs)
            ),
        ));
    }
    if !(0.0..=1.0).contains(&l.latency_s) {
        return Err((
            "latency_s",
            format!(
                "{} s per transfer is not a plausible link: allowed [0, 1]",
                num(l.latency_s)
            ),
        ));
    }
    Ok(())
}

/// A custom GPU's figures must be positive and finite.
fn check_gpu(g: &GpuSpec) -> Result<(), String> {
    for (name, x, hi) in [
        ("bf16_tflops", g.bf16_tflops, 1e5),
        ("mem_bandwidth_gbs", g.mem_bandwidth_gbs, 1e6),
        ("memory_gb", g.memory_gb, 1e6),
    ] {
        if !(HARDWARE_MIN..=hi).contains(&x) {
            return Err(format!(
                "field `{name}` = {} is not a plausible figure: allowed [{HARDWARE_MIN}, {}] ({HARDWARE_WHY})",
                num(x),
                num(hi)
            ));
        }
    }
    check_link(&g.link).map_err(|(f, m)| format!("field `link.{f}`: {m}"))?;
    if g.sms == 0 {
        return Err("field `sms` must be ≥ 1".into());
    }
    Ok(())
}

/// The dotted field whose value starts at byte `offset` of a TOML text: the
/// key before the `=` there, under the last `[table]` or `[[array]]` header
/// above it, and inside an array of inline tables (`buckets = [ { … } ]`)
/// under the array's key.
fn field_at(text: &str, offset: usize) -> Option<String> {
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
fn plain_types(msg: &str) -> String {
    msg.replace(
        "data did not match any variant of untagged enum LinkChoice",
        "expected a link preset name or a table { name, bandwidth_gbs, latency_s }",
    )
    .replace("expected i64", "expected an integer")
    .replace("expected u64", "expected an integer ≥ 0")
    .replace("expected u32", "expected an integer ≥ 0")
    .replace("expected f64", "expected a number")
}

/// Token-rule sizes of a custom encoder: every size used as a divisor ≥ 1.
fn check_encoder_kind(kind: &easerve_model::EncoderKind) -> Result<(), String> {
    use easerve_model::EncoderKind;
    let sizes: Vec<(&str, u64)> = match kind {
        EncoderKind::ClipAnyres {
            image_size,
            patch,
            grid_pinpoints,
        } => {
            if grid_pinpoints.is_empty() || grid_pinpoints.iter().any(|&(h, w)| h == 0 || w == 0) {
                return Err("field `encoder.kind.ClipAnyres.grid_pinpoints` must list [height, width] pairs ≥ 1".into());
            }
            if image_size < patch {
                return Err("field `encoder.kind.ClipAnyres.image_size` must be ≥ `patch`".into());
            }
            vec![
                ("ClipAnyres.image_size", u64::from(*image_size)),
                ("ClipAnyres.patch", u64::from(*patch)),
            ]
        }
        EncoderKind::QwenVit {
            patch,
            temporal_patch,
            spatial_merge,
            window_px,
            fullatt_every,
            min_pixels,
            max_pixels,
            video_min_pixels,
            video_max_pixels,
            deepstack: _,
            video_bounds_per_clip: _,
        } => {
            if video_min_pixels > video_max_pixels {
                return Err(
                    "field `encoder.kind.QwenVit.video_min_pixels` must be ≤ `video_max_pixels`"
                        .into(),
                );
            }
            if min_pixels > max_pixels {
                return Err(
                    "field `encoder.kind.QwenVit.min_pixels` must be ≤ `max_pixels`".into(),
                );
            }
            vec![
                ("QwenVit.patch", u64::from(*patch)),
                ("QwenVit.temporal_patch", u64::from(*temporal_patch)),
                ("QwenVit.spatial_merge", u64::from(*spatial_merge)),
                ("QwenVit.window_px", u64::from(*window_px)),
                ("QwenVit.fullatt_every", u64::from(*fullatt_every)),
                ("QwenVit.max_pixels", *max_pixels),
                ("QwenVit.video_max_pixels", *video_max_pixels),
            ]
        }
        EncoderKind::Siglip {
            image_size,
            patch,
            pooled_side,
            pan_and_scan,
        } => {
            if image_size < patch {
                return Err("field `encoder.kind.Siglip.image_size` must be ≥ `patch`".into());
            }
            if pooled_side > &(image_size / patch.max(&1)) {
                return Err("field `encoder.kind.Siglip.pooled_side` must be at most `image_size / patch` (the patches per side)".into());
            }
            if let Some(p) = pan_and_scan {
                if p.min_crop == 0
                    || p.max_crops < 2
                    || !(p.min_ratio.is_finite() && p.min_ratio >= 1.0)
                {
                    return Err("field `encoder.kind.Siglip.pan_and_scan` needs `min_crop` ≥ 1, `max_crops` ≥ 2 and `min_ratio` ≥ 1".into());
                }
            }
            vec![
                ("Siglip.image_size", u64::from(*image_size)),
                ("Siglip.patch", u64::from(*patch)),
                ("Siglip.pooled_side", u64::from(*pooled_side)),
            ]
        }
        EncoderKind::TiledVit {
            image_size,
            patch,
            pixel_shuffle,
            tiling,
            projector,
        } => {
            if image_size < patch {
                return Err("field `encoder.kind.TiledVit.image_size` must be ≥ `patch`".into());
            }
            if *patch > 0
                && *pixel_shuffle > 0
                && (!image_size.is_multiple_of(*patch)
                    || !(image_size / patch).is_multiple_of(*pixel_shuffle))
            {
                return Err(format!(
                    "field `encoder.kind.TiledVit.image_size` ({image_size}) must be a multiple of `patch` ({patch}) whose patch side {} is a multiple of `pixel_shuffle` ({pixel_shuffle})",
                    image_size / patch
                ));
            }
            let (lo, hi) = match *tiling {
                easerve_model::Tiling::InternVl {
                    min_tiles,
                    max_tiles,
                    ..
                } => (min_tiles, max_tiles),
                easerve_model::Tiling::Llama4 { max_tiles } => (1, max_tiles),
            };
            if lo == 0 || lo > hi || hi > 64 {
                return Err(
                    "field `encoder.kind.TiledVit.tiling` needs 1 ≤ `min_tiles` ≤ `max_tiles` ≤ 64"
                        .into(),
                );
            }
            check_projector("TiledVit", projector)?;
            vec![
                ("TiledVit.patch", u64::from(*patch)),
                ("TiledVit.pixel_shuffle", u64::from(*pixel_shuffle)),
            ]
        }
        EncoderKind::OmniAudio {
            mel_bins,
            chunk_frames,
            window_chunks,
            conv_channels,
            projector,
        } => {
            check_projector("OmniAudio", projector)?;
            vec![
                ("OmniAudio.mel_bins", u64::from(*mel_bins)),
                ("OmniAudio.chunk_frames", u64::from(*chunk_frames)),
                ("OmniAudio.window_chunks", u64::from(*window_chunks)),
                ("OmniAudio.conv_channels", u64::from(*conv_channels)),
            ]
        }
        EncoderKind::Whisper {
            mel_bins,
            window_s,
            frames_per_window,
            stack,
        } => {
            if !(window_s.is_finite() && *window_s > 0.0) {
                return Err("field `encoder.kind.Whisper.window_s` must be a number > 0".into());
            }
            vec![
                ("Whisper.mel_bins", u64::from(*mel_bins)),
                ("Whisper.frames_per_window", u64::from(*frames_per_window)),
                ("Whisper.stack", u64::from(*stack)),
            ]
        }
    };
    match sizes.iter().find(|(_, x)| *x == 0) {
        Some((name, _)) => Err(format!("field `encoder.kind.{name}` must be ≥ 1")),
        None => Ok(()),
    }
}

/// A projector chain of `family`: at least two widths (one linear layer), none 0.
fn check_projector(family: &str, widths: &[u32]) -> Result<(), String> {
    if widths.len() < 2 || widths.contains(&0) {
        return Err(format!(
            "field `encoder.kind.{family}.projector` must list at least two widths ≥ 1 (input first, the LLM's hidden last), got {widths:?}"
        ));
    }
    Ok(())
}

/// Set `path` in `node` to `value`, creating tables on the way; through an
/// array of tables the rest of the path is set in every element (so
/// `workload.video.buckets.frames=16` sets every bucket's frames).
fn set_path(node: &mut toml::Value, path: &[&str], value: &toml::Value) -> Result<(), String> {
    if let toml::Value::Array(items) = node {
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

/// A stage cost with one more note (why a fallback was taken).
struct WithNote(Box<dyn easerve_calib::StageCost>, String);

impl easerve_calib::StageCost for WithNote {
    fn encode(
        &self,
        items: &[easerve_model::ItemTokens],
        sm_share: f64,
    ) -> easerve_calib::EncodeTime {
        self.0.encode(items, sm_share)
    }
    fn preprocess(&self, items: &[easerve_model::ItemTokens]) -> f64 {
        self.0.preprocess(items)
    }
    fn prefill(&self, seq_lens: &[u64], par: easerve_model::Parallel, sm_share: f64) -> f64 {
        self.0.prefill(seq_lens, par, sm_share)
    }
    fn decode_step(
        &self,
        batch: u64,
        total_context_tokens: u64,
        par: easerve_model::Parallel,
    ) -> f64 {
        self.0.decode_step(batch, total_context_tokens, par)
    }
    fn decode_steps(
        &self,
        batch: u64,
        context: u64,
        par: easerve_model::Parallel,
        steps: u64,
        out: &mut Vec<f64>,
    ) {
        self.0.decode_steps(batch, context, par, steps, out)
    }
    fn transfer(&self, bytes: f64) -> f64 {
        self.0.transfer(bytes)
    }
    fn time_slice_penalty(&self) -> f64 {
        self.0.time_slice_penalty()
    }
    fn bandwidth_interference(&self) -> f64 {
        self.0.bandwidth_interference()
    }
    fn notes(&self) -> Vec<String> {
        let mut n = vec![self.1.clone()];
        n.extend(self.0.notes());
        n
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
    }
}
