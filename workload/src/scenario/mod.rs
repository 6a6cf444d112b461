//! Scenario files: parse → validate → resolve.
//!
//! A scenario is a TOML file (documented field by field in
//! `scenarios/README.md`). [`Scenario::load`] parses it into plain data
//! ([`ScenarioFile`], unknown fields rejected), validates every value, resolves
//! the model and GPU presets and checks memory feasibility, and only then
//! returns a [`Scenario`]. Every error names the file, the field and what is
//! allowed ([`ScenarioError`]).
//!
//! Where each step lives:
//!
//! * this file — the validated [`Scenario`] and what it holds ([`Workload`],
//!   [`Arrival`], [`Shapes`], [`ServingKnobs`]), the [`ScenarioError`], and
//!   loading: [`Scenario::load`], [`Scenario::load_with`] (with `--set`
//!   fields) and [`Scenario::raw_with`] (read, set and override without
//!   validating);
//! * `file.rs` — the file as written: [`ScenarioFile`] and its sections,
//!   the command-line [`Overrides`] and the [`System`] they may name, TOML
//!   parsing with errors that name the field, `--set` paths;
//! * `validate/` — [`Scenario::validate`], one module per section (`model`,
//!   `cluster`, `workload`, `deployment`, `profile`, `slo`) and the checks of
//!   the allocation against the cluster and the model (`feasibility`), with
//!   every bound a field has ([`MAX_BATCH`], [`MAX_RATE`], …), and the size
//!   warnings of a valid but large run;
//! * `cost.rs` — the cost source a scenario names ([`Scenario::cost`]:
//!   a profile, measured kernels or the roofline);
//! * `controller.rs` — the controller a scenario lays out
//!   ([`Scenario::controller`]: topology, batchers and SM split, decode
//!   schedulers, dispatch).

mod controller;
mod cost;
mod file;
mod restart;
mod validate;

pub use file::{
    AudioSection, CacheRoutingSection, ClusterSection, ConversationSection, DeploymentSection,
    EncoderCacheSection, EncoderStoreSection, GroupSection, ImageBucket, ItemsSection,
    LaunchSection, LimitsSection, LinkChoice, ModelSection, Overrides, PhaseSection,
    PlannerSection, PoolSection, PrefixCacheSection, ScenarioFile, SloSection, StageGroupsSection,
    System, SystemPromptSection, VideoBucket, WorkloadSection,
};
pub use validate::{
    check_model, num, ModelError, HARDWARE_MIN, HOST_CORES_PER_GPU, KV_DTYPES, LLM_DTYPES,
    MAX_BATCH, MAX_HORIZON_S, MAX_POOL, MAX_RATE, MAX_TIER_NAME, MAX_WAIT_S, NODE_GPUS,
    NO_FP8_GPUS, PHASE_KINDS, SIM_BYTES_PER_REQUEST, SIM_STEPS_PER_SECOND,
};

use crate::report::SloTier;
use easerve_calib::GpuSpec;
use easerve_model::ModelArch;
use easerve_sched::{Deployment, MmItem, Modality};
use file::{expand_link_preset, inline_array, set_path};
use serde::{Deserialize, Serialize};
use std::path::Path;

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
    /// What one request may ask for (`[limits]`); a request over a limit is
    /// refused at arrival by every driver.
    pub limits: easerve_sched::Limits,
    /// How the engine launches each stage's passes (`[deployment.launch]`).
    pub launch: easerve_calib::Launch,
    /// The planner that changes the deployment while it runs
    /// (`[planner]`); `None` without the section (no planner report).
    pub planner: Option<PlannerSetup>,
    /// The node groups and the deployment placed on them
    /// (`[[cluster.groups]]`); `None` for the one-node form (`gpu`, `gpus`,
    /// `link`), where `gpu` is every worker's GPU.
    pub cluster: Option<Cluster>,
    /// The raw file (kept so overrides can be re-validated).
    pub raw: ScenarioFile,
}

/// A cluster of node groups, validated, with the deployment placed on it.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// The groups, in the file's order.
    pub groups: Vec<Group>,
    /// The group of each stage: encode (and its local prefill), prefill,
    /// decode (`[deployment.groups]`).
    pub stage_groups: [usize; 3],
    /// Every worker's GPUs and node ([`easerve_sched::Topology::placed`]).
    pub topology: easerve_sched::Topology,
}

impl Scenario {
    /// The GPU type of the cluster, or of each node group joined by `+`
    /// (`l40s+h100-sxm`), each type once.
    pub fn gpu_types(&self) -> String {
        match &self.cluster {
            None => self.gpu.name.clone(),
            Some(c) => {
                let mut names: Vec<&str> = Vec::new();
                for g in &c.groups {
                    if !names.contains(&g.gpu.name.as_str()) {
                        names.push(&g.gpu.name);
                    }
                }
                names.join("+")
            }
        }
    }

    /// The cores of the one CPU host every worker of a scenario on the `cpu`
    /// device runs on (each CPU "GPU" is that host: `easerve exec` starts
    /// every worker process on it), with where the figure comes from:
    /// `cluster.host_cores` when the scenario gives it, else the cores of
    /// the host that measured its profile (`provenance.cores`). `None` for a
    /// scenario on GPUs, or on the CPU with neither figure (then the
    /// simulator prices each CPU worker as a device of its own).
    pub fn cpu_host_cores(&self) -> Option<(u32, &'static str)> {
        if self.gpu_types() != "cpu" {
            return None;
        }
        if let Some(n) = self.raw.cluster.host_cores {
            return Some((n.clamp(1, 1 << 20) as u32, "cluster.host_cores"));
        }
        let cores = self.profile.as_ref()?.provenance.cores?;
        Some((cores, "the profile's measuring host, provenance.cores"))
    }

    /// The cluster in one line: `8× h100-sxm (nvlink4)`, or per node group
    /// `NAME: NODES×GPUS_PER_NODE GPU (LINK, NIC B GB/s)` joined by ` + `.
    pub fn cluster_label(&self) -> String {
        match &self.cluster {
            None => format!("{}× {} ({})", self.gpus, self.gpu.name, self.gpu.link.name),
            Some(c) => c
                .groups
                .iter()
                .map(|g| {
                    format!(
                        "{}: {}×{} {} ({}, NIC {} GB/s)",
                        g.node.name,
                        g.node.nodes,
                        g.node.gpus_per_node,
                        g.gpu.name,
                        g.gpu.link.name,
                        g.nic.bandwidth_gbs
                    )
                })
                .collect::<Vec<_>>()
                .join(" + "),
        }
    }
}

impl ScenarioFile {
    /// GPUs of the cluster as written: the node groups' total, or
    /// `cluster.gpus` without groups.
    pub fn cluster_gpus(&self) -> i64 {
        match self.cluster.groups.is_empty() {
            true => self.cluster.gpus,
            false => self
                .cluster
                .groups
                .iter()
                .map(|g| g.nodes.max(0) * g.gpus_per_node.max(0))
                .sum(),
        }
    }
}

impl Cluster {
    /// The group of stage `s` (0 encode, 1 prefill, 2 decode).
    pub fn stage(&self, s: usize) -> &Group {
        &self.groups[self.stage_groups[s]]
    }

    /// Dollars per hour of the whole cluster, when every group gives a cost.
    pub fn cost_per_hour(&self) -> Option<f64> {
        self.groups
            .iter()
            .map(|g| g.cost_per_gpu_hour.map(|c| c * f64::from(g.node.gpus())))
            .sum()
    }
}

/// One node group, validated (`[[cluster.groups]]`).
#[derive(Clone, Debug)]
pub struct Group {
    /// Name, nodes and GPUs per node.
    pub node: easerve_sched::NodeGroup,
    /// The GPU type, with the intra-node link in force.
    pub gpu: GpuSpec,
    /// Each node's NIC: GB/s per direction and seconds per transfer.
    pub nic: easerve_calib::LinkSpec,
    /// Dollars per GPU-hour, if given.
    pub cost_per_gpu_hour: Option<f64>,
}

/// A validated `[planner]`.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannerSetup {
    /// What the planner is built from.
    pub config: easerve_sched::planner::PlannerConfig,
    /// The SLO tier the `twin` policy counts (an index into `slo`).
    pub tier: usize,
    /// Where the model load times come from (for the notes).
    pub load_source: String,
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
    /// The time-varying rate, when the scenario gives phases (its mean is
    /// [`Workload::rate`]); `None`: one rate throughout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<crate::schedule::RateSchedule>,
    /// Length of the report's windows, seconds (`workload.window_s`, or one
    /// 24th of the schedule's cycle — hourly on a day); `None`: no windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_s: Option<f64>,
    /// Seconds after its arrival at which a client gives up on its request
    /// (`workload.timeout_s`): the controller aborts it then
    /// ([`easerve_sched::ControllerConfig::client_timeout_s`]); `None`:
    /// clients wait for ever.
    pub timeout_s: Option<f64>,
    /// How the workload repeats itself (`[workload.pool]`,
    /// `[workload.conversation]`, `[workload.system_prompt]`); `None`:
    /// every item and prompt is unique.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reuse: Option<Reuse>,
}

impl Workload {
    /// Whether the workload says what repeats: a reuse section, or a
    /// trace's `ItemHashes` / `ConversationId` columns.
    pub fn repeats(&self) -> bool {
        self.reuse.is_some()
            || matches!(
                self.arrival,
                Arrival::Trace {
                    content: Some(_),
                    ..
                }
            )
    }
}

/// How a workload repeats itself, validated ([`crate::reuse`] generates it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Reuse {
    /// The media pool: distinct items and their popularity.
    pub pool: Option<(u64, Popularity)>,
    /// Turns per conversation (1: none) and the mean think time, seconds.
    pub conversation: Option<(u32, f64)>,
    /// Shared system prompts: tokens of each and how many distinct.
    pub system_prompt: Option<(u32, u32)>,
}

/// How often each pool item is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Popularity {
    /// Every item equally often.
    Uniform,
    /// Item `k` (from 1) with probability ∝ `k^−α`.
    Zipf(f64),
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
        /// Its item hashes and conversations, when it has either column.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<crate::trace::TraceContent>,
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
    /// How the Poisson-gap rule estimates the arrival rate
    /// (`deployment.rate_estimator`; default `window`).
    #[serde(default, skip_serializing_if = "is_window")]
    pub rate_estimate: easerve_sched::RateEstimate,
    /// The caches (`[deployment.encoder_cache]`); all off by default.
    #[serde(default, skip_serializing_if = "easerve_sched::CacheConfig::is_off")]
    pub caches: easerve_sched::CacheConfig,
}

/// Blame error `e` on the `--set KEY=VALUE` that set its field (the key
/// itself, or a table or array the key is inside; an array element as
/// `groups.1` or, for a set of every element, `buckets.frames`), naming it in
/// the error's file as [`Overrides::attribute`] names a flag; `e` unchanged
/// when no set did (the last set of the field wins, as when they were
/// applied).
fn attribute_sets(mut e: ScenarioError, sets: &[(String, String)]) -> ScenarioError {
    // `cluster.groups[1].nodes` as a set names it: `cluster.groups.1.nodes`,
    // and every element's `cluster.groups.nodes`
    let mut indexed = String::with_capacity(e.field.len());
    let mut every = String::with_capacity(e.field.len());
    let mut in_index = false;
    for c in e.field.chars() {
        match c {
            '[' => {
                indexed.push('.');
                in_index = true;
            }
            ']' => in_index = false,
            c => {
                indexed.push(c);
                if !in_index {
                    every.push(c);
                }
            }
        }
    }
    let under = |key: &str, f: &str| {
        f == key
            || f.strip_prefix(key)
                .is_some_and(|rest| rest.starts_with('.'))
    };
    let from_set = sets
        .iter()
        .rev()
        .find(|(key, _)| under(key, &indexed) || under(key, &every));
    if let Some((key, value)) = from_set {
        e.file = format!(
            "{} (with --set {key}={value} from the command line)",
            e.file
        );
    }
    e
}

fn is_window(r: &easerve_sched::RateEstimate) -> bool {
    *r == easerve_sched::RateEstimate::Window
}

impl Scenario {
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
        let original = easerve_calib::input::read_text(path).map_err(|e| ScenarioError {
            file: file.clone(),
            field: "(file)".into(),
            message: format!("cannot read the scenario file: {e}"),
        })?;
        let mut text = original.clone();
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
                    .unwrap_or_else(|_| inline_array(value));
                set_path(&mut doc, &parts, &parsed).map_err(|m| set_err(key, m))?;
            }
            text = toml::to_string(&doc).map_err(|e| set_err("(all)", e.to_string()))?;
        }
        let mut raw = ScenarioFile::parse(&text, &file).map_err(|e| {
            if sets.is_empty() {
                return e;
            }
            let e = attribute_sets(e, sets);
            if e.file != file {
                // the text parsed is the file with the sets applied, written
                // anew: its line numbers are not the file's
                let mut e = e;
                if let Some(at) = e.message.rfind(" (line ") {
                    if e.message.ends_with(')') {
                        e.message.truncate(at);
                    }
                }
                return e;
            }
            // not a set's: the file's own error, with the file's line
            ScenarioFile::parse(&original, &file).err().unwrap_or(e)
        })?;
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
        .map_err(|e| attribute_sets(overrides.attribute(e), sets))
    }

    /// The name a scenario file without a `name` field gets: its file stem.
    pub fn default_name(path: &Path) -> String {
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "scenario".into())
    }
}
