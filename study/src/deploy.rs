//! From a chosen deployment to files that launch it: the scenario that
//! reproduces the choice in `easerve sim` and `easerve exec`, and launch files
//! for three engines that serve multimodal models in the
//! Encode → Prefill → Decode style — vLLM, SGLang and NVIDIA Dynamo — with a
//! benchmark script and a README that says, per engine, which of easerve's
//! knobs it keeps, which it only approximates and which it drops, and what the
//! simulator predicts for the deployment as that engine can run it.
//!
//! Every engine flag written here was read in the source of a named release
//! ([`VLLM`], [`SGLANG`], [`DYNAMO`]); what could not be
//! confirmed there is left out, and the emitted README says so.
//!
//! # How each engine runs an easerve deployment
//! None of the three has load-adaptive encode micro-batching, partial
//! offload of prefill to a worker on the encode GPU, or SM partitioning
//! between the two. Each runs the same allocation with:
//! * encode batching as an engine batches: when the encoder is free it takes
//!   what is queued, up to a fixed bound (vLLM and Dynamo: `--max-num-seqs`
//!   on the encoder instance; SGLang: `SGLANG_ENCODER_MAX_BATCH_SIZE`). The
//!   simulator runs this as dispatch `queue-length:1` at the same `B`.
//! * every prefill remote (`s = 1`): no local prefill worker, no SM split.
//! * the engine's own encode framework terms: vLLM and SGLang preprocess in
//!   Python inside the engine (framework `aggregated`, vLLM-like); Dynamo's
//!   pass-through encode worker is charged the per-pass overhead calibrated
//!   from the EAServe paper's Dynamo measurements (framework `passthrough`).
//!   Neither engine's per-pass overhead was measured here.

use easerve_model::EncoderKind;
use easerve_sched::{MmItem, Worker};
use easerve_workload::scenario::{Scenario, ScenarioFile, Shapes};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// An engine release whose source the emitted flags were checked against.
#[derive(Clone, Copy, Debug)]
pub struct EngineRelease {
    /// The engine's name.
    pub engine: &'static str,
    /// Its version.
    pub version: &'static str,
    /// Where its flags were read.
    pub checked: &'static str,
}

/// vLLM 0.33.0: `vllm serve` with an encoder-cache connector and a KV connector.
pub const VLLM: EngineRelease = EngineRelease {
    engine: "vLLM",
    version: "0.33.0",
    checked: "the vllm 0.33.0 wheel (PyPI): vllm/engine/arg_utils.py, vllm/entrypoints/common/cli_args.py, vllm/config/ec_transfer.py, vllm/config/kv_transfer.py, vllm/config/scheduler.py, vllm/config/multimodal.py, vllm/envs.py; the example examples/disaggregated/disaggregated_encoder/ (disagg_1e1p1d_example.sh, disagg_epd_proxy.py) of vllm-project/vllm",
};

/// SGLang 0.5.23 with sglang-router 0.3.2.
pub const SGLANG: EngineRelease = EngineRelease {
    engine: "SGLang",
    version: "0.5.23 (router: sglang-router 0.3.2)",
    checked: "the sglang 0.5.23 wheel (PyPI): sglang/srt/arg_groups/fields/{disagg,parallel,device,serving,mm,schedule}.py, sglang/srt/arg_groups/pd_disaggregation_hook.py, sglang/srt/environ.py; the sglang-router 0.3.2 wheel: sglang_router/router_args.py; docs/advanced_features/epd_disaggregation.md of sgl-project/sglang",
};

/// NVIDIA Dynamo 1.6.1 (its vLLM backend, which pins vLLM 0.31.0).
pub const DYNAMO: EngineRelease = EngineRelease {
    engine: "NVIDIA Dynamo",
    version: "1.6.1 (vLLM backend; image nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1)",
    checked: "the ai-dynamo 1.6.1 wheel (PyPI): dynamo/vllm/backend_args.py, dynamo/vllm/args.py, dynamo/profiler/templates/dgd/vllm/disagg.yaml, dynamo/profiler/utils/config_modifiers/vllm.py (the --max-num-seqs and --max-num-batched-tokens it sets on its vLLM workers); the DynamoGraphDeployment v1beta1 types of ai-dynamo/dynamo (deploy/operator/api/v1beta1/dynamographdeployment_types.go)",
};

/// `easerve bench` of this build, which `bench.sh` runs.
pub const EASERVE_BENCH: EngineRelease = EngineRelease {
    engine: "easerve bench",
    version: env!("CARGO_PKG_VERSION"),
    checked: "this build's `easerve bench --help`",
};

/// The engines files are emitted for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// vLLM ([`VLLM`]).
    Vllm,
    /// SGLang ([`SGLANG`]).
    Sglang,
    /// NVIDIA Dynamo ([`DYNAMO`]).
    Dynamo,
}

impl Engine {
    /// All of them, in the order the README lists them.
    pub const ALL: [Engine; 3] = [Engine::Vllm, Engine::Sglang, Engine::Dynamo];

    /// The folder of its files inside the output folder.
    pub fn dir(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
            Engine::Dynamo => "dynamo",
        }
    }

    /// The release its flags were checked against.
    pub fn release(self) -> EngineRelease {
        match self {
            Engine::Vllm => VLLM,
            Engine::Sglang => SGLANG,
            Engine::Dynamo => DYNAMO,
        }
    }

    /// The encode framework terms the simulator charges it (see the module doc).
    pub fn framework(self) -> &'static str {
        match self {
            Engine::Vllm | Engine::Sglang => "aggregated",
            Engine::Dynamo => "passthrough",
        }
    }
}

/// What to emit beyond the scenario.
#[derive(Clone, Debug)]
pub struct EmitOptions {
    /// The weights the engines load (a Hugging Face repository or a local
    /// path); `None` takes the model preset's checkpoint
    /// ([`easerve_model::hf_checkpoint`]).
    pub model_path: Option<String>,
    /// GPUs per node: the cluster's GPU `g` is GPU `g % gpus_per_node` of node
    /// `g / gpus_per_node`.
    pub gpus_per_node: u32,
    /// TP of each replica of the aggregated baseline (its
    /// `deployment.aggregated_tp`); `None` keeps the scenario's, else the
    /// smallest degree that fits.
    pub aggregated_tp: Option<u32>,
}

impl Default for EmitOptions {
    fn default() -> Self {
        EmitOptions {
            model_path: None,
            gpus_per_node: 8,
            aggregated_tp: None,
        }
    }
}

/// Why nothing (or not everything) was emitted.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// The scenario or the options cannot be emitted (bad input).
    #[error("{0}")]
    Input(String),
    /// A file could not be written.
    #[error("--emit {path}: cannot write: {error}")]
    Io {
        /// The file.
        path: String,
        /// What the system said.
        error: String,
    },
    /// An engine's variant of the scenario did not validate (a bug: it only
    /// changes knobs to values the validator accepts).
    #[error("{0}")]
    Variant(String),
}

/// Goodput at one SLO tier.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TierPrediction {
    /// Tier name.
    pub name: String,
    /// Requests/s meeting the tier.
    pub goodput: f64,
    /// Fraction of completed requests meeting it.
    pub attainment: f64,
}

/// What the simulator predicts for one way of running the deployment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// `easerve`, or the engine.
    pub system: String,
    /// The engine release, for an engine's row.
    pub engine_version: Option<String>,
    /// The scenario that reproduces it, relative to the output folder.
    pub scenario: String,
    /// The deployment as the simulator ran it.
    pub deployment: String,
    /// The encode framework terms charged.
    pub framework: String,
    /// Requests completed.
    pub completed: usize,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Mean TTFT, seconds.
    pub mean_ttft_s: f64,
    /// P99 TTFT, seconds.
    pub p99_ttft_s: f64,
    /// Mean TPOT, seconds.
    pub mean_tpot_s: f64,
    /// P99 TPOT, seconds.
    pub p99_tpot_s: f64,
    /// Goodput per SLO tier.
    pub goodput: Vec<TierPrediction>,
    /// The stage that limits it.
    pub bottleneck: String,
}

/// What [`emit`] wrote.
#[derive(Clone, Debug)]
pub struct Emitted {
    /// Every file, in the order written.
    pub files: Vec<PathBuf>,
    /// easerve's deployment first, then each engine's approximation.
    pub predictions: Vec<Prediction>,
    /// Folders not written (an engine's, e.g. every engine's for a
    /// deployment without P workers; `aggregated`), and why.
    pub skipped: Vec<(String, String)>,
}

/// One server instance of the deployment.
#[derive(Clone, Debug)]
struct Instance {
    /// `E0`, `P0`, `D0`.
    label: String,
    /// GPUs in the cluster's numbering.
    gpus: Vec<u32>,
    /// The node it runs on.
    node: u32,
    /// Its GPUs on that node.
    local_gpus: Vec<u32>,
    tp: u32,
    /// Expert-parallel degree: data-parallel attention replicas over which
    /// the experts are split (1 without EP).
    ep: u32,
    /// HTTP port.
    port: u16,
}

impl Instance {
    /// `http://HOST:PORT`, with the node's host a shell variable.
    fn url(&self) -> String {
        format!("http://{}:{}", node_host(self.node), self.port)
    }

    fn cuda_visible_devices(&self) -> String {
        join(&self.local_gpus, ",")
    }

    /// `TP2`, or `TP2,EP4` with expert parallelism.
    fn layout(&self) -> String {
        easerve_model::Parallel::new(self.tp, self.ep).to_string()
    }

    /// vLLM's parallelism flags: `--tensor-parallel-size t`, and with EP `e`
    /// also `--data-parallel-size e --enable-expert-parallel` (e attention
    /// replicas; vLLM then spreads the experts over all `t·e` ranks, each
    /// expert whole, where the twin splits each expert over `t`: the same
    /// GPUs, another split of the expert GEMMs when `t > 1`).
    fn vllm_parallel_flags(&self) -> Vec<String> {
        let mut f = vec![format!("--tensor-parallel-size {}", self.tp)];
        if self.ep > 1 {
            f.push(format!("--data-parallel-size {}", self.ep));
            f.push("--enable-expert-parallel".into());
        }
        f
    }

    /// SGLang's parallelism flags: `--tp-size` over all the instance's GPUs,
    /// and with EP `e` `--ep-size e --enable-dp-attention --dp-size e`
    /// (attention at TP `t` in each of `e` replicas, each expert split over
    /// `t·e / e = t` ranks: the twin's layout).
    fn sglang_parallel_flags(&self) -> Vec<String> {
        let mut f = vec![format!("--tp-size {}", self.tp * self.ep)];
        if self.ep > 1 {
            f.push(format!("--ep-size {}", self.ep));
            f.push("--enable-dp-attention".into());
            f.push(format!("--dp-size {}", self.ep));
        }
        f
    }
}

/// The shell expression of node `n`'s address (`NODE0_HOST`, … default
/// 127.0.0.1).
fn node_host(n: u32) -> String {
    format!("${{NODE{n}_HOST:-127.0.0.1}}")
}

fn join<T: ToString>(xs: &[T], sep: &str) -> String {
    xs.iter().map(T::to_string).collect::<Vec<_>>().join(sep)
}

/// The LLM's dtype flags of a prefill or decode instance (vLLM and SGLang
/// name them alike): `--quantization fp8` for per-tensor FP8 weights (the
/// engine quantizes a BF16 checkpoint as it loads it; a block-scaled FP8
/// checkpoint carries its own `quantization_config`, so it takes no flag),
/// and `--kv-cache-dtype KV` (`fp8` for vLLM, `fp8_e4m3` for SGLang) for an
/// FP8 KV cache.
fn llm_dtype_flags(sc: &Scenario, kv: &str) -> Vec<String> {
    let mut f = Vec::new();
    if sc.llm_dtype() == "fp8" {
        f.push("--quantization fp8".to_string());
    }
    if sc.model.llm.kv_bytes() == 1 {
        f.push(format!("--kv-cache-dtype {kv}"));
    }
    f
}

/// `--trust-remote-code` (vLLM, SGLang and Dynamo's vLLM workers alike) for
/// a checkpoint that ships its own modeling code
/// ([`easerve_model::ModelArch::needs_remote_code`]: InternVL).
fn remote_code_flags(sc: &Scenario) -> Vec<String> {
    if sc.model.needs_remote_code() {
        vec!["--trust-remote-code".into()]
    } else {
        Vec::new()
    }
}

/// Ports: encoders from 8100, prefill from 8200, decode from 8300, the
/// front door (proxy, router, frontend) 8000.
const FRONT_PORT: u16 = 8000;
const PORT_BASE: [u16; 3] = [8100, 8200, 8300];
/// Ports of the aggregated baseline's replicas.
const AGGREGATED_PORT: u16 = 8400;

/// The E, P and D server instances of `sc`'s deployment (local prefill
/// workers, which no engine has, are left out).
fn instances(sc: &Scenario, gpus_per_node: u32) -> Result<[Vec<Instance>; 3], DeployError> {
    let t = sc.topology();
    let remote: Vec<Worker> = t.prefill().iter().filter(|w| !w.local).cloned().collect();
    let stages: [&[Worker]; 3] = [t.encode(), &remote, t.decode()];
    let mut out: [Vec<Instance>; 3] = Default::default();
    for (s, workers) in stages.iter().enumerate() {
        for (i, w) in workers.iter().enumerate() {
            if let Some(c) = &sc.cluster {
                out[s].push(placed_instance(c, w, PORT_BASE[s] + i as u16));
                continue;
            }
            let node = w.gpus[0] / gpus_per_node;
            if w.gpus.iter().any(|g| g / gpus_per_node != node) {
                return Err(DeployError::Input(format!(
                    "--gpus-per-node {gpus_per_node}: worker {} spans GPUs {} on more than one node; the emitted launch files run one instance per node (use a larger --gpus-per-node, or a deployment whose TP groups fit a node)",
                    w.label,
                    join(&w.gpus, ",")
                )));
            }
            out[s].push(Instance {
                label: w.label.clone(),
                gpus: w.gpus.clone(),
                node,
                local_gpus: w.gpus.iter().map(|g| g % gpus_per_node).collect(),
                tp: w.tp,
                ep: w.ep,
                port: PORT_BASE[s] + i as u16,
            });
        }
    }
    Ok(out)
}

/// The instance of worker `w` on a cluster of node groups: the node the
/// placement gave it ([`easerve_sched::Topology::placed`]), numbered across
/// the groups in order (`NODE{n}_HOST`), and its GPUs on that node
/// (`--gpus-per-node` does not apply: each group gives its own).
fn placed_instance(c: &easerve_workload::scenario::Cluster, w: &Worker, port: u16) -> Instance {
    let (g, n) = (w.place.group as usize, w.place.node);
    let nodes_before: u32 = c.groups[..g].iter().map(|x| x.node.nodes).sum();
    let gpus_before: u32 = c.groups[..g].iter().map(|x| x.node.gpus()).sum();
    let first = gpus_before + n * c.groups[g].node.gpus_per_node;
    Instance {
        label: w.label.clone(),
        gpus: w.gpus.clone(),
        node: nodes_before + n,
        local_gpus: w.gpus.iter().map(|x| x - first).collect(),
        tp: w.tp,
        ep: w.ep,
        port,
    }
}

/// Whether [`emit`] can write `sc`'s deployment into `dir` with `opts`, so a
/// caller can find out before a long search; returns the weights the engines
/// load.
///
/// # Errors
/// [`DeployError::Input`], naming the field or flag: a system other than
/// `easerve`, a `--seed` above `i64::MAX` (a TOML integer), `--gpus-per-node`
/// 0, an empty `--model-path` or a model with no known checkpoint and none
/// given, an `--aggregated-tp` above `--gpus-per-node`, or a `dir` that holds files
/// (files of another deployment left beside the new ones would launch on the
/// wrong GPUs).
pub fn check(sc: &Scenario, dir: &Path, opts: &EmitOptions) -> Result<String, DeployError> {
    if sc.system != easerve_workload::scenario::System::Easerve {
        return Err(DeployError::Input(format!(
            "{}: deployment.system is `{}`; launch files are written for an easerve EPD deployment (system `easerve`)",
            sc.file,
            sc.system.name()
        )));
    }
    if i64::try_from(sc.seed).is_err() {
        // a scenario file holds it as a TOML integer (a file's own seed
        // cannot get here: it was read as one)
        return Err(DeployError::Input(format!(
            "--seed {}: the emitted scenario.toml holds the seed as a TOML integer, 0 ..= {}; give a seed in that range",
            sc.seed,
            i64::MAX
        )));
    }
    if opts.gpus_per_node == 0 {
        return Err(DeployError::Input(
            "--gpus-per-node 0: a node holds at least 1 GPU".into(),
        ));
    }
    if let Some(tp) = opts.aggregated_tp.filter(|&tp| tp > opts.gpus_per_node) {
        return Err(DeployError::Input(format!(
            "--aggregated-tp {tp}: a replica would span more than one node of --gpus-per-node {}",
            opts.gpus_per_node
        )));
    }
    let model_path = match &opts.model_path {
        Some(p) if p.trim().is_empty() => {
            return Err(DeployError::Input(
                "--model-path: empty; give a Hugging Face repository or a local path".into(),
            ))
        }
        Some(p) => p.clone(),
        None => easerve_model::hf_checkpoint(&sc.model.name)
            .map(str::to_string)
            .ok_or_else(|| {
                DeployError::Input(format!(
                    "model `{}` has no known checkpoint for the engines to load; give one with --model-path (a Hugging Face repository or a local path)",
                    sc.model.name
                ))
            })?,
    };
    if std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some()) {
        return Err(DeployError::Input(format!(
            "--emit {}: the folder holds files already; give a new or empty folder (files of another deployment left beside the new ones would launch on the wrong GPUs)",
            dir.display()
        )));
    }
    Ok(model_path)
}

/// Write the deployment of `sc` (an `easerve` system scenario) under `dir`:
/// `scenario.toml`, per engine a variant scenario and its launch files,
/// `bench.sh`, `predictions.json` and `README.md`. Each scenario is
/// simulated for its prediction. A deployment without P workers (all
/// prefill on local workers beside the encoders) has no counterpart in any
/// engine: its engine folders are not written, and README.md and
/// [`Emitted::skipped`] say why.
///
/// # Errors
/// [`DeployError::Input`] as [`check`] says, and for a TP group across nodes;
/// [`DeployError::Io`] for a file
/// that cannot be written.
pub fn emit(sc: &Scenario, dir: &Path, opts: &EmitOptions) -> Result<Emitted, DeployError> {
    let model_path = check(sc, dir, opts)?;
    let inst = instances(sc, opts.gpus_per_node)?;
    let mut w = Writer {
        dir: dir.to_path_buf(),
        files: Vec::new(),
    };
    let base = sc.raw.with_absolute_paths(Path::new(&sc.file));
    let deployment = format!(
        "{} B={} s={}",
        sc.deployment.allocation, sc.deployment.max_batch, sc.deployment.offload
    );
    w.write(
        "scenario.toml",
        &scenario_text(&base, &format!(
            "The scenario `{}` with the deployment {deployment}: `easerve sim scenario.toml` reproduces the prediction in README.md, and `easerve exec scenario.toml` runs it.",
            sc.name
        ))?,
    )?;
    let mut predictions = vec![predict(sc, "easerve", None, "scenario.toml")];
    let mut skipped = Vec::new();
    // every engine's prefill runs on prefill instances: without P workers
    // (all prefill local, beside the encoders) none of them can run the
    // deployment as chosen, and its folder says so instead
    let no_p = sc.deployment.allocation.prefill.workers == 0;
    for engine in Engine::ALL {
        if no_p {
            skipped.push((engine.dir().to_string(), no_prefill_instances(sc, engine)));
            continue;
        }
        if engine == Engine::Sglang {
            if let Err(why) = sglang_accepts(sc) {
                skipped.push((engine.dir().to_string(), why));
                continue;
            }
        }
        let raw = engine_variant(&base, engine, &sc.name);
        let rel = format!("{}/scenario.toml", engine.dir());
        let path = dir.join(&rel);
        let variant = Scenario::validate(
            raw.clone(),
            &path.display().to_string(),
            &format!("{}-{}", sc.name, engine.dir()),
        )
        .map_err(|e| {
            DeployError::Variant(format!(
                "the {} variant of the scenario: {e}",
                engine.release().engine
            ))
        })?;
        w.write(
            &rel,
            &scenario_text(&raw, &format!(
                "The scenario `{}` with the deployment {deployment} as {} {} runs it: encode batches up to B as the engine forms them (dispatch queue-length:1), every prefill remote (s = 1), the engine's encode framework terms ({}). `easerve sim {rel}` reproduces the prediction in ../README.md.",
                sc.name,
                engine.release().engine,
                engine.release().version,
                engine.framework()
            ))?,
        )?;
        predictions.push(predict(
            &variant,
            engine.dir(),
            Some(format!(
                "{} {}",
                engine.release().engine,
                engine.release().version
            )),
            &rel,
        ));
        match engine {
            Engine::Vllm => vllm_files(&mut w, sc, &inst, &model_path),
            Engine::Sglang => sglang_files(&mut w, sc, &inst, &model_path),
            Engine::Dynamo => dynamo_files(&mut w, sc, &inst, &model_path),
        }?;
    }
    match aggregated_files(&mut w, sc, &base, dir, &model_path, opts)? {
        Ok(p) => predictions.push(p),
        Err(why) => skipped.push(("aggregated".to_string(), why)),
    }
    w.write("bench.sh", &bench_script(sc, &model_path))?;
    let json = serde_json::to_string_pretty(&predictions).expect("predictions serialise");
    w.write("predictions.json", &(json + "\n"))?;
    w.write(
        "README.md",
        &readme(sc, &deployment, &inst, &predictions, &skipped),
    )?;
    Ok(Emitted {
        files: w.files,
        predictions,
        skipped,
    })
}

/// Why `engine` cannot run `sc`'s deployment, which has no P workers.
fn no_prefill_instances(sc: &Scenario, engine: Engine) -> String {
    format!(
        "the deployment {} B={} s={} has no P workers: all its prefill runs on local prefill workers beside the encoders, which {} has no counterpart for, so its launch files would have no prefill instance; to run it on {}, deploy an allocation with at least one nP(TPk) (`easerve search` lists them; `easerve deploy --deployment`)",
        sc.deployment.allocation,
        sc.deployment.max_batch,
        sc.deployment.offload,
        engine.release().engine,
        engine.release().engine
    )
}

struct Writer {
    dir: PathBuf,
    files: Vec<PathBuf>,
}

impl Writer {
    fn write(&mut self, rel: &str, text: &str) -> Result<(), DeployError> {
        let path = self.dir.join(rel);
        let io = |e: std::io::Error| DeployError::Io {
            path: path.display().to_string(),
            error: e.to_string(),
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        std::fs::write(&path, text).map_err(io)?;
        #[cfg(unix)]
        if rel.ends_with(".sh") {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).map_err(io)?;
        }
        self.files.push(path);
        Ok(())
    }
}

/// The scenario an engine runs (see the module doc).
fn engine_variant(base: &ScenarioFile, engine: Engine, name: &str) -> ScenarioFile {
    let mut r = base.clone();
    r.name = Some(format!("{name}-{}", engine.dir()));
    let d = &mut r.deployment;
    d.dispatch = Some("queue-length:1".into());
    d.gap_quantile = None;
    d.max_age_s = None;
    d.offload = 1.0;
    d.router = None;
    d.sm_policy = None;
    d.framework = Some(engine.framework().into());
    // the engine's own preprocessing (its framework's default), not easerve's
    d.preprocess = None;
    d.preprocess_threads = None;
    r
}

fn scenario_text(raw: &ScenarioFile, what: &str) -> Result<String, DeployError> {
    let body = toml::to_string(raw).map_err(|e| {
        DeployError::Variant(format!("the scenario cannot be written as TOML: {e}"))
    })?;
    let mut s = String::new();
    for l in wrap(
        &format!("{what} Written by `easerve deploy`; relative paths were made absolute."),
        96,
    ) {
        let _ = writeln!(s, "# {l}");
    }
    Ok(format!("{s}\n{body}"))
}

fn predict(sc: &Scenario, system: &str, engine_version: Option<String>, rel: &str) -> Prediction {
    let r = easerve_sim::simulate(sc).report;
    Prediction {
        system: system.into(),
        engine_version,
        scenario: rel.into(),
        deployment: match sc.knobs.aggregated_tp {
            Some(tp) if sc.system == easerve_workload::scenario::System::Aggregated => {
                format!("{} replicas at TP{tp}, every stage inline", sc.gpus / tp)
            }
            _ => sc.deployment.to_string(),
        },
        framework: sc
            .raw
            .deployment
            .framework
            .clone()
            .unwrap_or_else(|| sc.system.name().into()),
        completed: r.completed,
        request_throughput: r.request_throughput,
        mean_ttft_s: r.ttft.mean,
        p99_ttft_s: r.ttft.p99,
        mean_tpot_s: r.tpot.mean,
        p99_tpot_s: r.tpot.p99,
        goodput: r
            .goodput
            .iter()
            .map(|t| TierPrediction {
                name: t.name.clone(),
                goodput: t.goodput,
                attainment: t.attainment,
            })
            .collect(),
        bottleneck: r.bottleneck,
    }
}

/// The header every launch file starts with: what it is and the release its
/// flags were checked against.
fn header(comment: &str, sc: &Scenario, what: &str, release: &EngineRelease) -> String {
    let mut s = String::new();
    for line in [
        what.to_string(),
        format!(
            "Deployment: {} B={} s={} of scenario `{}` ({} × {}).",
            sc.deployment.allocation,
            sc.deployment.max_batch,
            sc.deployment.offload,
            sc.name,
            sc.gpus,
            sc.gpu.name
        ),
        format!(
            "Flags checked against {} {}: {}.",
            release.engine, release.version, release.checked
        ),
        "Written by `easerve deploy`; see README.md beside it.".to_string(),
    ] {
        for l in wrap(&line, 96) {
            let _ = writeln!(s, "{comment} {l}");
        }
    }
    s
}

/// Greedy word wrap at `width` characters.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split_whitespace() {
        let last = lines.last_mut().expect("one line");
        if !last.is_empty() && last.chars().count() + 1 + word.chars().count() > width {
            lines.push(word.to_string());
        } else {
            if !last.is_empty() {
                last.push(' ');
            }
            last.push_str(word);
        }
    }
    lines
}

/// A shell word: single-quoted unless it is plain.
fn sh(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The encoder's step budget in vLLM (`--max-num-batched-tokens`, which is
/// also its encoder cache size, `vllm/config/scheduler.py`): the multimodal
/// tokens of B of the scenario's largest requests, and at least 8192, the
/// `vllm serve` default of vLLM 0.33.0 on GPUs of 70–160 GB other than the
/// A100 (`vllm/engine/arg_utils.py`; 2048 below, 16384 above), so the
/// budget never falls below that default.
fn encoder_budget(sc: &Scenario) -> u64 {
    (sc.deployment.max_batch as u64 * sc.workload.shapes.max_mm_tokens(&sc.model)).max(8192)
}

/// The encoder's bound on sequences per step in vLLM (`--max-num-seqs`):
/// vLLM's E/P/D proxy sends each multimodal item to the encoders as a request
/// of its own, so B requests are B times the most items a request carries.
fn encoder_max_seqs(sc: &Scenario) -> u64 {
    sc.deployment.max_batch as u64 * sc.workload.shapes.max_items().max(1)
}

/// GiB (2³⁰ bytes) of embeddings each encode worker's encoder cache keeps
/// (`[deployment.encoder_cache] capacity_gib`); `None` with it off.
fn encoder_cache_gib(sc: &Scenario) -> Option<f64> {
    sc.knobs
        .caches
        .encoder
        .map(|e| e.capacity_bytes as f64 / (1u64 << 30) as f64)
}

/// vLLM's multimodal processor cache on an encoder instance
/// (`--mm-processor-cache-gb`, vLLM 0.33.0 `vllm/config/multimodal.py`,
/// default 4 GiB): it keeps processed items keyed by their input's hash, so
/// a repeated item skips preprocessing. With `[deployment.encoder_cache]
/// hash_raw_bytes = true` the twin prices exactly that, and it gets the
/// cache's capacity; with `hash_raw_bytes` off a hit still pays its
/// preprocessing, so it is 0 (off). With the encoder cache off no flag is
/// written (the workload repeats no item). The encoder outputs themselves
/// are reused by mm_hash through the EC connector's store; vLLM has no flag
/// for its encoder cache's size.
fn vllm_encoder_cache_flags(sc: &Scenario) -> Vec<String> {
    match (sc.knobs.caches.encoder, encoder_cache_gib(sc)) {
        (Some(e), Some(gib)) => {
            let gib = if e.hash_raw_bytes { gib } else { 0.0 };
            vec![format!("--mm-processor-cache-gb {gib}")]
        }
        _ => Vec::new(),
    }
}

/// The EC connector role of a vLLM encoder instance: `ec_producer` (it
/// writes its outputs to the connector's folder for the prefill instances),
/// or with `[deployment.encoder_store]` `ec_both` (vLLM 0.33.0
/// `vllm/config/ec_transfer.py`: `ec_role` is `ec_producer`, `ec_consumer`
/// or `ec_both`; as the example `examples/disaggregated/ec_both_encoder`):
/// the encoder then also loads, instead of encoding, an item whose output
/// another encoder instance wrote there, which is the shared store.
fn encoder_ec_role(sc: &Scenario) -> &'static str {
    match sc.knobs.caches.store {
        Some(_) => "ec_both",
        None => "ec_producer",
    }
}

/// vLLM's prefix caching on a prefill instance (vLLM 0.33.0
/// `--enable-prefix-caching`, on by default, and `--block-size`): on with
/// the scenario's block size where `[deployment.prefix_cache]` is set, else
/// off, as the twin then models no prefix cache.
fn vllm_prefix_flags(sc: &Scenario) -> Vec<String> {
    match &sc.knobs.caches.prefix {
        Some(p) => vec![
            "--enable-prefix-caching".into(),
            format!("--block-size {}", p.block_size),
        ],
        None => vec!["--no-enable-prefix-caching".into()],
    }
}

/// SGLang's radix cache on a prefill server (SGLang 0.5.23, on by default;
/// `--disable-radix-cache`, and `--page-size`, tokens per KV page, default
/// 1): the scenario's block size as the page where `[deployment.prefix_cache]`
/// is set, else disabled.
fn sglang_prefix_flags(sc: &Scenario) -> Vec<String> {
    match &sc.knobs.caches.prefix {
        Some(p) => vec![format!("--page-size {}", p.block_size)],
        None => vec!["--disable-radix-cache".into()],
    }
}

/// Dynamo's frontend router: the KV-aware router (`--router-mode kv`,
/// `--kv-overlap-score-weight`, `--kv-cache-block-size`) where the scenario
/// has both `[deployment.prefix_cache]` and `[deployment.cache_routing]`
/// (the twin's placement cost is the router's, `sched::CacheRouting`);
/// else none (round-robin, Dynamo's default).
fn dynamo_router_args(sc: &Scenario) -> Vec<String> {
    let c = &sc.knobs.caches;
    match (&c.prefix, &c.routing) {
        (Some(p), Some(r)) => vec![
            "--router-mode".into(),
            "kv".into(),
            "--kv-overlap-score-weight".into(),
            r.overlap_weight.to_string(),
            "--kv-cache-block-size".into(),
            p.block_size.to_string(),
        ],
        _ => Vec::new(),
    }
}

/// The start of every emitted script: the shebang, the [`header`] (what it
/// is and the release its flags were checked against), strict mode, and for
/// a script that loads the weights, its [`model_lines`].
fn script_head(sc: &Scenario, what: &str, release: &EngineRelease, model: Option<&str>) -> String {
    let mut s = format!(
        "#!/usr/bin/env bash\n{}set -euo pipefail\n",
        header("#", sc, what, release)
    );
    if let Some(m) = model {
        s += &model_lines(m);
    }
    s
}

/// `command` and its `flags`, one flag per continued line.
fn command_lines(command: &str, flags: &[String]) -> String {
    format!("{command} \\\n    {}\n", flags.join(" \\\n    "))
}

/// `DEFAULT_MODEL` (quoted for the shell) and `MODEL`, which the environment
/// may override.
fn model_lines(model: &str) -> String {
    format!(
        "DEFAULT_MODEL={}\nMODEL=\"${{MODEL:-$DEFAULT_MODEL}}\"\n",
        sh(model)
    )
}

/// vLLM's `--limit-mm-per-prompt` for the scenario's modality.
fn vllm_mm_limit(sc: &Scenario) -> Option<String> {
    let n = sc.workload.shapes.max_items();
    let key = match &sc.workload.shapes {
        Shapes::Items { buckets, .. } => match buckets.first().map(|b| b.0) {
            Some(MmItem::Video { .. }) => "video",
            _ => "image",
        },
        Shapes::Audio { .. } => "audio",
        Shapes::Text => return None,
    };
    Some(format!("{{\"{key}\":{n}}}"))
}

fn vllm_files(
    w: &mut Writer,
    sc: &Scenario,
    inst: &[Vec<Instance>; 3],
    model: &str,
) -> Result<(), DeployError> {
    let k = &sc.knobs;
    let ec = |role: &str| {
        format!(
            "{{\"ec_connector\":\"ECExampleConnector\",\"ec_role\":\"{role}\",\"ec_connector_extra_config\":{{\"shared_storage_path\":\"'\"$EC_PATH\"'\"}}}}"
        )
    };
    let kv = |role: &str| format!("{{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"{role}\"}}");
    let limit = vllm_mm_limit(sc);
    let roles = [
        "encoder-only (encoder-cache producer)",
        "prefill (encoder-cache consumer, KV producer)",
        "decode (KV consumer)",
    ];
    let mut nixl_port = 5600u32;
    for (s, stage) in inst.iter().enumerate() {
        for i in stage {
            let mut text = script_head(
                sc,
                &format!(
                    "vLLM instance {}: {}, {} on GPU {} of node {} (cluster GPU {}), port {}.",
                    i.label,
                    roles[s],
                    i.layout(),
                    i.cuda_visible_devices(),
                    i.node,
                    join(&i.gpus, ","),
                    i.port
                ),
                &VLLM,
                Some(model),
            );
            let mut flags: Vec<String> = vec![format!("--port {}", i.port)];
            flags.extend(i.vllm_parallel_flags());
            flags.extend(remote_code_flags(sc));
            if s > 0 {
                flags.extend(llm_dtype_flags(sc, "fp8"));
            }
            let mut env = format!("CUDA_VISIBLE_DEVICES={}", i.cuda_visible_devices());
            match s {
                0 => {
                    text += "# the encoder cache goes through this folder: shared by every instance (a shared file system across nodes)\n";
                    text +=
                        "EC_PATH=\"${EC_PATH:-/tmp/easerve-ec-cache}\"\nmkdir -p \"$EC_PATH\"\n";
                    flags.push(format!("--max-num-seqs {}", encoder_max_seqs(sc)));
                    flags.push(format!("--max-num-batched-tokens {}", encoder_budget(sc)));
                    flags.push("--no-enable-prefix-caching".into());
                    flags.extend(vllm_encoder_cache_flags(sc));
                    flags.push(format!(
                        "--ec-transfer-config '{}'",
                        ec(encoder_ec_role(sc))
                    ));
                }
                1 => {
                    text += "EC_PATH=\"${EC_PATH:-/tmp/easerve-ec-cache}\"\n";
                    env += &format!(
                        " VLLM_NIXL_SIDE_CHANNEL_HOST=\"{}\" VLLM_NIXL_SIDE_CHANNEL_PORT={nixl_port}",
                        node_host(i.node)
                    );
                    nixl_port += 10;
                    flags.push(format!("--max-num-seqs {}", k.prefill_max_seqs));
                    flags.push(format!(
                        "--max-num-batched-tokens {}",
                        k.prefill_token_budget
                    ));
                    flags.push(format!(
                        "--gpu-memory-utilization {}",
                        k.gpu_memory_utilization
                    ));
                    flags.extend(vllm_prefix_flags(sc));
                    flags.push(format!("--ec-transfer-config '{}'", ec("ec_consumer")));
                    flags.push(format!("--kv-transfer-config '{}'", kv("kv_producer")));
                }
                _ => {
                    env += &format!(
                        " VLLM_NIXL_SIDE_CHANNEL_HOST=\"{}\" VLLM_NIXL_SIDE_CHANNEL_PORT={nixl_port}",
                        node_host(i.node)
                    );
                    nixl_port += 10;
                    flags.push(format!("--max-num-seqs {}", k.decode_max_batch));
                    flags.push(format!(
                        "--gpu-memory-utilization {}",
                        k.gpu_memory_utilization
                    ));
                    flags.push(format!("--kv-transfer-config '{}'", kv("kv_consumer")));
                }
            }
            if let Some(l) = &limit {
                flags.push(format!("--limit-mm-per-prompt {}", sh(l)));
            }
            flags.push("--enable-request-id-headers".into());
            text += &command_lines(&format!("exec env {env} vllm serve \"$MODEL\""), &flags);
            w.write(&format!("vllm/{}.sh", i.label), &text)?;
        }
    }
    let urls = |s: usize| join(&inst[s].iter().map(Instance::url).collect::<Vec<_>>(), ",");
    let mut proxy = script_head(
sc,
&format!("vLLM's E/P/D proxy in front of the instances, on port {FRONT_PORT}: the example script disagg_epd_proxy.py of vLLM's source (examples/disaggregated/disaggregated_encoder/), which no package installs; set VLLM_EPD_PROXY to its path."),
&VLLM,
None,
);
    proxy += "PROXY=\"${VLLM_EPD_PROXY:-examples/disaggregated/disaggregated_encoder/disagg_epd_proxy.py}\"\n";
    let _ = writeln!(
        proxy,
        "exec python \"$PROXY\" --host 0.0.0.0 --port {FRONT_PORT} \\\n    --encode-servers-urls \"{}\" \\\n    --prefill-servers-urls \"{}\" \\\n    --decode-servers-urls \"{}\"",
        urls(0),
        urls(1),
        urls(2)
    );
    w.write("vllm/proxy.sh", &proxy)?;
    Ok(())
}

/// Whether SGLang 0.5.23's encoder disaggregation accepts the model: its
/// `pd_disaggregation_hook.py` lists the architectures (the Qwen2-VL,
/// Qwen2.5-VL and Qwen3-VL families among them, no LLaVA, no Ultravox); a
/// model whose encoder is the Qwen vision transformer is of those families.
fn sglang_accepts(sc: &Scenario) -> Result<(), String> {
    match sc.model.encoder.as_ref().map(|e| &e.kind) {
        Some(EncoderKind::QwenVit { .. }) => Ok(()),
        _ => Err(format!(
            "SGLang 0.5.23 runs encoder disaggregation only for the architectures its pd_disaggregation_hook.py lists (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5, Qwen2-Audio, Qwen2.5-Omni, Qwen3-Omni, Kimi-VL and a few others); `{}` is not one of them, so no SGLang files were written and no SGLang prediction is given",
            sc.model.name
        )),
    }
}

fn sglang_files(
    w: &mut Writer,
    sc: &Scenario,
    inst: &[Vec<Instance>; 3],
    model: &str,
) -> Result<(), DeployError> {
    let k = &sc.knobs;
    let b = sc.deployment.max_batch;
    let encoder_urls = join(
        &inst[0]
            .iter()
            .map(|i| format!("\"{}\"", i.url()))
            .collect::<Vec<_>>(),
        " ",
    );
    let roles = ["encoder-only", "prefill (language-only)", "decode"];
    for (s, stage) in inst.iter().enumerate() {
        for (n, i) in stage.iter().enumerate() {
            let mut text = script_head(
                sc,
                &format!(
                    "SGLang instance {}: {}, {} on GPU {} of node {} (cluster GPU {}), port {}.",
                    i.label,
                    roles[s],
                    i.layout(),
                    i.cuda_visible_devices(),
                    i.node,
                    join(&i.gpus, ","),
                    i.port
                ),
                &SGLANG,
                Some(model),
            );
            let mut env = String::new();
            let mut flags: Vec<String> = vec![
                "--model-path \"$MODEL\"".into(),
                "--host 0.0.0.0".into(),
                format!("--port {}", i.port),
            ];
            flags.extend(i.sglang_parallel_flags());
            flags.extend(remote_code_flags(sc));
            flags.push(format!("--base-gpu-id {}", i.local_gpus[0]));
            if s > 0 {
                flags.extend(llm_dtype_flags(sc, "fp8_e4m3"));
            }
            match s {
                0 => {
                    env = format!("env SGLANG_ENCODER_MAX_BATCH_SIZE={b} ");
                    flags.push("--encoder-only".into());
                    flags.push("--encoder-transfer-backend zmq_to_scheduler".into());
                }
                1 => {
                    flags.push("--disaggregation-mode prefill".into());
                    flags.push("--language-only".into());
                    flags.push(format!("--encoder-urls {encoder_urls}"));
                    flags.push("--encoder-transfer-backend zmq_to_scheduler".into());
                    flags.extend(sglang_prefix_flags(sc));
                    flags.push(format!("--disaggregation-bootstrap-port {}", 8998 + n));
                    flags.push(
                        "--disaggregation-transfer-backend \"${KV_BACKEND:-mooncake}\"".into(),
                    );
                    flags.push(format!(
                        "--mem-fraction-static {}",
                        k.gpu_memory_utilization
                    ));
                }
                _ => {
                    flags.push("--disaggregation-mode decode".into());
                    flags.push(
                        "--disaggregation-transfer-backend \"${KV_BACKEND:-mooncake}\"".into(),
                    );
                    flags.push(format!("--max-running-requests {}", k.decode_max_batch));
                    flags.push(format!(
                        "--mem-fraction-static {}",
                        k.gpu_memory_utilization
                    ));
                }
            }
            text += &command_lines(&format!("exec {env}python -m sglang.launch_server"), &flags);
            w.write(&format!("sglang/{}.sh", i.label), &text)?;
        }
    }
    let mut router = script_head(
sc,
&format!("SGLang's router in PD mode on port {FRONT_PORT}: the encoders are reached from the prefill servers (--encoder-urls), so the router sees prefill and decode only (sglang-router 0.3.2 has no EPD mode)."),
&SGLANG,
None,
);
    let mut flags = vec!["--pd-disaggregation".to_string()];
    for (n, p) in inst[1].iter().enumerate() {
        flags.push(format!("--prefill \"{}\" {}", p.url(), 8998 + n));
    }
    for d in &inst[2] {
        flags.push(format!("--decode \"{}\"", d.url()));
    }
    flags.push("--host 0.0.0.0".into());
    flags.push(format!("--port {FRONT_PORT}"));
    router += &command_lines("exec python -m sglang_router.launch_router", &flags);
    w.write("sglang/router.sh", &router)?;
    Ok(())
}

/// A YAML scalar: JSON's double-quoted form, which YAML reads the same.
fn yq(s: &str) -> String {
    serde_json::to_string(s).expect("a string serialises")
}

fn dynamo_files(
    w: &mut Writer,
    sc: &Scenario,
    inst: &[Vec<Instance>; 3],
    model: &str,
) -> Result<(), DeployError> {
    let k = &sc.knobs;
    let image = "nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.6.1";
    let name: String = sc
        .name
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let mut y = header("#", sc, "NVIDIA Dynamo DynamoGraphDeployment (v1beta1) of the deployment: a frontend, the encode workers, the prefill workers and the decode workers, each with its GPUs per replica. Kubernetes assigns the GPUs and the operator the ports.", &DYNAMO);
    y += "# Not confirmed in 1.6.1: the component `type` enum has no encode value, so the encode\n";
    y += "# workers are a generic `worker` component; no 1.6.1 multimodal DynamoGraphDeployment\n";
    y += "# example was found to check this against.\n";
    y += "apiVersion: nvidia.com/v1beta1\nkind: DynamoGraphDeployment\nmetadata:\n";
    let _ = writeln!(
        y,
        "  name: {}",
        yq(&format!("easerve-{}", name.trim_matches('-')))
    );
    y += "spec:\n  components:\n";
    let component = |y: &mut String,
                     name: &str,
                     ty: &str,
                     replicas: usize,
                     gpus: u32,
                     args: &[String]| {
        let _ = writeln!(
            y,
            "    - name: {}\n      type: {}\n      replicas: {replicas}",
            yq(name),
            yq(ty)
        );
        y.push_str(
            "      podTemplate:\n        spec:\n          containers:\n            - name: main\n",
        );
        let _ = writeln!(y, "              image: {}", yq(image));
        let (command, rest): (&[&str], &[String]) = if ty == "frontend" {
            (&["python3", "-m", "dynamo.frontend"], args)
        } else {
            (&["python3", "-m", "dynamo.vllm"], args)
        };
        let _ = writeln!(
            y,
            "              command: [{}]",
            command.iter().map(|c| yq(c)).collect::<Vec<_>>().join(", ")
        );
        let _ = writeln!(
            y,
            "              args: [{}]",
            rest.iter().map(|c| yq(c)).collect::<Vec<_>>().join(", ")
        );
        if gpus > 0 {
            let _ = writeln!(y, "              resources:\n                limits:\n                  nvidia.com/gpu: {}", yq(&gpus.to_string()));
        }
    };
    let mut front: Vec<String> = vec!["--http-port".into(), FRONT_PORT.to_string()];
    front.extend(dynamo_router_args(sc));
    component(&mut y, "Frontend", "frontend", 1, 0, &front);
    let model_args = |mode: &str| -> Vec<String> {
        let mut a: Vec<String> = vec![
            "--model".into(),
            model.into(),
            "--disaggregation-mode".into(),
            mode.into(),
            "--enable-multimodal".into(),
        ];
        a.extend(remote_code_flags(sc));
        a
    };
    let mut enc = model_args("encode");
    enc.extend([
        "--max-num-seqs".into(),
        encoder_max_seqs(sc).to_string(),
        "--max-num-batched-tokens".into(),
        encoder_budget(sc).to_string(),
    ]);
    enc.extend(
        vllm_encoder_cache_flags(sc)
            .iter()
            .flat_map(|f| f.split(' ').map(str::to_string).collect::<Vec<_>>()),
    );
    // GPUs of one worker, and its vLLM parallelism flags as separate args
    let gpus = |s: usize| inst[s].first().map_or(1, |i| i.tp * i.ep);
    let par_args = |s: usize| -> Vec<String> {
        inst[s].first().map_or_else(Vec::new, |i| {
            i.vllm_parallel_flags()
                .iter()
                .flat_map(|f| f.split(' ').map(str::to_string).collect::<Vec<_>>())
                .collect()
        })
    };
    component(&mut y, "encode", "worker", inst[0].len(), gpus(0), &enc);
    let mut pre = model_args("prefill");
    pre.push("--route-to-encoder".into());
    pre.extend(par_args(1));
    pre.extend(
        vllm_prefix_flags(sc)
            .iter()
            .flat_map(|f| f.split(' ').map(str::to_string).collect::<Vec<_>>()),
    );
    pre.extend([
        "--max-num-seqs".into(),
        k.prefill_max_seqs.to_string(),
        "--max-num-batched-tokens".into(),
        k.prefill_token_budget.to_string(),
        "--kv-transfer-config".into(),
        "{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_producer\"}".into(),
    ]);
    component(&mut y, "prefill", "prefill", inst[1].len(), gpus(1), &pre);
    let dtype_args: Vec<String> = llm_dtype_flags(sc, "fp8")
        .iter()
        .flat_map(|f| f.split(' ').map(str::to_string).collect::<Vec<_>>())
        .collect();
    pre.extend(dtype_args.iter().cloned());
    let mut dec = model_args("decode");
    dec.extend(par_args(2));
    dec.extend(dtype_args);
    dec.extend(["--max-num-seqs".into(), k.decode_max_batch.to_string()]);
    component(&mut y, "decode", "decode", inst[2].len(), gpus(2), &dec);
    w.write("dynamo/deployment.yaml", &y)?;
    Ok(())
}

/// The aggregated baseline on the same GPUs, as a single-engine server runs
/// it: `GPUs / TP` replicas of `vllm serve` at the scenario's
/// `deployment.aggregated_tp` (default: the smallest TP that holds the LLM,
/// its encoder and one longest sequence), each running every stage, and its
/// prediction (`easerve sim --system aggregated`). `Ok(Err(why))` when a
/// replica would span nodes.
fn aggregated_files(
    w: &mut Writer,
    sc: &Scenario,
    base: &ScenarioFile,
    dir: &Path,
    model: &str,
    opts: &EmitOptions,
) -> Result<Result<Prediction, String>, DeployError> {
    let gpus_per_node = opts.gpus_per_node;
    if sc.cluster.is_some() {
        return Ok(Err(
            "no aggregated replicas written: the aggregated baseline is laid out on one node, not on node groups (`[[cluster.groups]]`)".into(),
        ));
    }
    let rel = "aggregated/scenario.toml";
    let mut raw = base.clone();
    raw.name = Some(format!("{}-aggregated", sc.name));
    raw.deployment.system = Some("aggregated".into());
    raw.deployment.framework = None;
    // preprocessing in its API server at arrival: easerve's settings do not apply
    raw.deployment.preprocess = None;
    raw.deployment.preprocess_threads = None;
    // the twin models no cache in the aggregated system: its prediction is
    // without them (the README's knob table says so)
    raw.deployment.encoder_cache = None;
    raw.deployment.prefix_cache = None;
    raw.deployment.cache_routing = None;
    raw.deployment.encoder_store = None;
    if let Some(tp) = opts.aggregated_tp {
        raw.deployment.aggregated_tp = Some(i64::from(tp));
    }
    let variant = Scenario::validate(
        raw.clone(),
        &dir.join(rel).display().to_string(),
        &format!("{}-aggregated", sc.name),
    )
    .map_err(|e| match opts.aggregated_tp {
        Some(tp) => DeployError::Input(format!("--aggregated-tp {tp}: {e}")),
        None => DeployError::Variant(format!("the aggregated variant of the scenario: {e}")),
    })?;
    let tp = variant
        .knobs
        .aggregated_tp
        .ok_or_else(|| DeployError::Variant("the aggregated variant has no replica TP".into()))?;
    if tp > gpus_per_node {
        return Ok(Err(format!(
            "no aggregated replicas written: a replica at TP{tp} spans more than one node of --gpus-per-node {gpus_per_node}"
        )));
    }
    let replicas = sc.gpus / tp;
    w.write(
        rel,
        &scenario_text(&raw, &format!(
            "The scenario `{}` on the same {} GPUs as a single-engine server (vLLM {}, aggregated) runs it: {replicas} replicas at TP{tp} (deployment.aggregated_tp), each running encode inline before prefill with continuous batching. `easerve sim {rel}` reproduces the prediction in ../README.md.",
            sc.name, sc.gpus, VLLM.version
        ))?,
    )?;
    let k = &sc.knobs;
    let limit = vllm_mm_limit(sc);
    for r in 0..replicas {
        let gpus: Vec<u32> = (r * tp..(r + 1) * tp).collect();
        let node = gpus[0] / gpus_per_node;
        if gpus.iter().any(|g| g / gpus_per_node != node) {
            return Ok(Err(format!(
                "no aggregated replicas written: replica {r} (GPUs {}) spans two nodes of --gpus-per-node {gpus_per_node}",
                join(&gpus, ",")
            )));
        }
        let local: Vec<u32> = gpus.iter().map(|g| g % gpus_per_node).collect();
        let port = AGGREGATED_PORT + r as u16;
        let mut text = script_head(
sc,
&format!(
                "vLLM aggregated replica {r} of {replicas}: every stage in one engine, TP{tp} on GPU {} of node {node} (cluster GPU {}), port {port}. The baseline the EPD deployment is compared with; put any HTTP load balancer in front of the replicas.",
                join(&local, ","),
                join(&gpus, ",")
            ),
&VLLM,
Some(model),
);
        let mut flags = vec![
            format!("--port {port}"),
            format!("--tensor-parallel-size {tp}"),
            format!("--max-num-batched-tokens {}", k.prefill_token_budget),
            format!("--max-num-seqs {}", k.decode_max_batch),
            format!("--gpu-memory-utilization {}", k.gpu_memory_utilization),
        ];
        flags.extend(remote_code_flags(sc));
        if let Some(l) = &limit {
            flags.push(format!("--limit-mm-per-prompt {}", sh(l)));
        }
        text += &command_lines(
            &format!(
                "exec env CUDA_VISIBLE_DEVICES={} vllm serve \"$MODEL\"",
                join(&local, ",")
            ),
            &flags,
        );
        w.write(&format!("aggregated/vllm-replica{r}.sh"), &text)?;
    }
    Ok(Ok(predict(
        &variant,
        "aggregated",
        Some(format!("vLLM {} aggregated", VLLM.version)),
        rel,
    )))
}

/// `bench.sh`: `easerve bench` with the scenario's own requests (the
/// simulator's generator and seed) at its rate, one SLO tier as goodput.
fn bench_script(sc: &Scenario, model: &str) -> String {
    let wl = &sc.workload;
    let mut s = script_head(
sc,
&format!(
            "Measure the deployment with the scenario's own requests ({} at {} req/s: the simulator's generator and seed) against the front door of whichever engine runs it (BASE_URL, default http://127.0.0.1:{FRONT_PORT}). Usage: bench.sh [TIER] (default: {}, the tier search's goodput rules rank deployments by: `moderate`, else the scenario's middle tier). The result (vllm bench serve's keys, easerve's report under `easerve`) goes to OUT (default bench-result.json) and one row per request beside it. EASERVE (default easerve) must be a build with the bench client: `cargo build --release --features bench`.",
            wl.requests, wl.rate, default_tier(sc).unwrap_or("none")
        ),
&EASERVE_BENCH,
Some(model),
);
    let _ = writeln!(
        s,
        "BASE_URL=\"${{BASE_URL:-http://127.0.0.1:{FRONT_PORT}}}\""
    );
    s += "OUT=\"${OUT:-bench-result.json}\"\nEASERVE=\"${EASERVE:-easerve}\"\n";
    s += "HERE=\"$(cd \"$(dirname \"${BASH_SOURCE[0]}\")\" && pwd)\"\n";
    let mut flags = vec![
        "--scenario \"$HERE/scenario.toml\"".to_string(),
        "--base-url \"$BASE_URL\"".into(),
        "--model \"$MODEL\"".into(),
    ];
    if let Some(tier) = default_tier(sc) {
        let _ = writeln!(s, "TIER=\"${{1:-{tier}}}\"");
        flags.push("--slo \"$TIER\"".into());
    }
    flags.push("--requests-csv \"${OUT%.json}.csv\"".into());
    flags.push("--json".into());
    s += &command_lines("\"$EASERVE\" bench", &flags).replace("--json\n", "--json > \"$OUT\"\n");
    s += "echo \"bench.sh: wrote $OUT\" >&2\n";
    s
}

/// `bench.sh`'s default tier: the one the search's goodput rules count
/// attainment in ([`easerve_has::own::rule_tier`]: `moderate`, else the middle
/// tier), not the strictest, which a deployment tuned for throughput may
/// meet for no request.
fn default_tier(sc: &Scenario) -> Option<&str> {
    if sc.slo.is_empty() {
        return None;
    }
    sc.slo
        .get(easerve_has::own::rule_tier(sc))
        .map(|t| t.name.as_str())
}

fn fmt_s(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3}")
    } else {
        "—".into()
    }
}

/// The deployment's README: its instances, the predictions, easerve's knobs per
/// engine and the files written.
fn readme(
    sc: &Scenario,
    deployment: &str,
    inst: &[Vec<Instance>; 3],
    predictions: &[Prediction],
    skipped: &[(String, String)],
) -> String {
    let mut s = String::new();
    readme_instances(&mut s, sc, deployment, inst);
    readme_predictions(&mut s, sc, predictions);
    readme_knobs(&mut s, sc);
    readme_files(&mut s, predictions, skipped);
    s
}

/// The README's title, scenario line, instance table and front-door paragraph.
fn readme_instances(s: &mut String, sc: &Scenario, deployment: &str, inst: &[Vec<Instance>; 3]) {
    *s += &format!("# Deployment {deployment} of `{}`\n\n", sc.name);
    let _ = writeln!(
        s,
        "{} × {} serving {} at {} req/s ({} requests, seed {}). Written by `easerve deploy`.\n",
        sc.gpus, sc.gpu.name, sc.model.name, sc.workload.rate, sc.workload.requests, sc.seed
    );
    *s += "## Instances\n\n| instance | role | TP | cluster GPUs | node | GPUs on the node | port |\n|---|---|---|---|---|---|---|\n";
    let roles = ["encode", "prefill", "decode"];
    for (st, stage) in inst.iter().enumerate() {
        for i in stage {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} |",
                i.label,
                roles[st],
                i.tp,
                join(&i.gpus, ","),
                i.node,
                i.cuda_visible_devices(),
                i.port
            );
        }
    }
    let _ = writeln!(
        s,
        "\nThe front door (proxy, router or frontend) listens on port {FRONT_PORT}. Node `k`'s address is the shell variable `NODEk_HOST` (default 127.0.0.1). easerve's local prefill workers (co-located on the encode GPUs when s < 1) have no counterpart in any engine and are not launched.\n"
    );
}

/// The README's predictions table: one row per system, with a paragraph on what the engines' rows assume.
fn readme_predictions(s: &mut String, sc: &Scenario, predictions: &[Prediction]) {
    *s += "## Predictions\n\nThe simulator's figures for the deployment as easerve runs it and as each engine can run it (`predictions.json` has them all; each row's scenario reproduces it with `easerve sim`):\n\n";
    let tiers: Vec<&str> = predictions
        .first()
        .map(|p| p.goodput.iter().map(|t| t.name.as_str()).collect())
        .unwrap_or_default();
    *s += "| system | scenario | throughput (req/s) | mean TTFT (s) | P99 TTFT (s) | mean TPOT (ms) |";
    for t in &tiers {
        let _ = write!(s, " goodput {t} (req/s) |");
    }
    *s += " bottleneck |\n|---|---|---|---|---|---|";
    for _ in &tiers {
        *s += "---|";
    }
    *s += "---|\n";
    for p in predictions {
        let _ = write!(
            s,
            "| {} | `{}` | {:.3} | {} | {} | {:.1} |",
            p.engine_version.as_deref().unwrap_or("easerve"),
            p.scenario,
            p.request_throughput,
            fmt_s(p.mean_ttft_s),
            fmt_s(p.p99_ttft_s),
            p.mean_tpot_s * 1e3
        );
        for t in &p.goodput {
            let _ = write!(s, " {:.3} |", t.goodput);
        }
        let _ = writeln!(s, " {} |", p.bottleneck);
    }
    if sc.deployment.allocation.prefill.workers == 0 {
        *s += "\nNo engine runs this deployment, so none has a row here (the aggregated baseline aside): it has no P workers (all its prefill runs on local prefill workers beside the encoders), which none of vLLM, SGLang and Dynamo can run; see Files.\n\n";
    } else {
        *s += "\nThe engines' rows run the same allocation with encode batches formed as an engine forms them (when the encoder is free it takes what is queued, up to B: dispatch `queue-length:1`), every prefill remote (s = 1), and the engine's encode framework terms: vLLM and SGLang preprocess in Python inside the engine (framework `aggregated`, no per-pass term); Dynamo's pass-through encode worker is charged the per-pass overhead calibrated from the EAServe paper's Dynamo measurements (framework `passthrough`). Neither figure was measured on these engines: `bench.sh` measures a deployment.\n\n";
    }
}

/// The README's table of how each engine keeps, approximates or drops easerve's knobs.
fn readme_knobs(s: &mut String, sc: &Scenario) {
    *s += "## easerve's knobs per engine\n\n| knob | vLLM | SGLang | Dynamo |\n|---|---|---|---|\n";
    let b = sc.deployment.max_batch;
    let k = &sc.knobs;
    let rows: [(&str, [String; 3]); 8] = [
        ("allocation (E, P, D instances, TP)", [
            "kept: one `vllm serve` per instance, `--tensor-parallel-size`, `CUDA_VISIBLE_DEVICES`".into(),
            "kept: one `sglang.launch_server` per instance, `--tp-size`, `--base-gpu-id`".into(),
            "kept: replicas and `nvidia.com/gpu` per component; Kubernetes picks the GPUs".into(),
        ]),
        ("encode micro-batch bound B", [
            format!("approximated: `--max-num-seqs {}` on the encoder bounds its batch (B times the most items a request carries: the proxy sends each item as a request of its own); no dispatch rule", encoder_max_seqs(sc)),
            format!("approximated: `SGLANG_ENCODER_MAX_BATCH_SIZE={b}` bounds the encoder's batch; no dispatch rule"),
            format!("approximated: `--max-num-seqs {}` on the encode worker (a vLLM engine; B times the most items a request carries)", encoder_max_seqs(sc)),
        ]),
        ("Poisson-gap dispatch", [
            "dropped: the engine batches what is queued when its step starts".into(),
            "dropped: the encoder coalesces concurrent requests up to its bound".into(),
            "dropped: the prefill worker splits a request's items across encoders (`DYN_SPLIT_ENCODE`)".into(),
        ]),
        ("offload ratio s (local prefill on the encode GPU)", [
            "dropped: every prefill runs on a prefill instance".into(),
            "dropped (`--enable-adaptive-dispatch-to-encoder` moves encoding the other way; not set)".into(),
            "dropped".into(),
        ]),
        ("SM partitioning between encode and local prefill", [
            "dropped: no SM partitioning between instances".into(),
            "dropped: `--enable-pdmux` splits SMs only inside one non-disaggregated server".into(),
            "dropped".into(),
        ]),
        ("prefill batch (token budget, sequences)", [
            format!("kept: `--max-num-batched-tokens {}`, `--max-num-seqs {}`", k.prefill_token_budget, k.prefill_max_seqs),
            "dropped: SGLang's own prefill scheduling (`--chunked-prefill-size` chunks, it does not bound a batch)".into(),
            format!("kept: `--max-num-batched-tokens {}`, `--max-num-seqs {}`", k.prefill_token_budget, k.prefill_max_seqs),
        ]),
        ("decode batch cap", [
            format!("kept: `--max-num-seqs {}`", k.decode_max_batch),
            format!("kept: `--max-running-requests {}`", k.decode_max_batch),
            format!("kept: `--max-num-seqs {}`", k.decode_max_batch),
        ]),
        ("GPU memory fraction for weights and KV cache", [
            format!("kept: `--gpu-memory-utilization {}` on prefill and decode", k.gpu_memory_utilization),
            format!("approximated: `--mem-fraction-static {}` (SGLang's static share for weights and KV pool)", k.gpu_memory_utilization),
            "dropped: not passed (`--gpu-memory-utilization` was not confirmed in Dynamo 1.6.1's templates; its workers pass vLLM 0.31.0's engine arguments through)".into(),
        ]),
    ];
    for (knob, cells) in rows.into_iter().chain(cache_rows(sc)) {
        let _ = writeln!(s, "| {knob} | {} | {} | {} |", cells[0], cells[1], cells[2]);
    }
    *s += "\nNot modelled for any engine: how its proxy or router spreads requests over several encode or prefill instances (vLLM's proxy sends each item round-robin, SGLang's prefill servers call their encoders, Dynamo splits a request's items over the encoders; the simulator places whole requests on the least-loaded worker).\n\n";
}

/// The README's rows for the caches (`[deployment.encoder_cache]`,
/// `[deployment.prefix_cache]`, `[deployment.cache_routing]`): what each
/// engine keeps of them and drops.
fn cache_rows(sc: &Scenario) -> Vec<(&'static str, [String; 3])> {
    let c = &sc.knobs.caches;
    let mut rows = Vec::new();
    if let Some(e) = &c.encoder {
        let gib = encoder_cache_gib(sc).unwrap_or(0.0);
        let pre = if e.hash_raw_bytes {
            format!("`--mm-processor-cache-gb {gib}` keeps processed items by their input's hash, so a hit skips preprocessing (`hash_raw_bytes`)")
        } else {
            "`--mm-processor-cache-gb 0`: a hit is preprocessed again, as the twin prices it".into()
        };
        rows.push(("encoder cache (per encode worker, LRU)", [
            format!("approximated: encoder outputs are reused by mm_hash through the EC connector's folder, which has no capacity (vLLM has no flag for its encoder cache's size); {pre}"),
            "dropped: SGLang's encoder-only server keeps no encoder outputs across requests".into(),
            format!("approximated: as vLLM (the encode worker is a vLLM engine); {pre}"),
        ]));
    }
    if let Some(st) = &c.store {
        let gib = st.capacity_bytes as f64 / (1u64 << 30) as f64;
        rows.push(("shared encoder-output store (across encode workers, LRU)", [
            format!("approximated: the encoder instances run the EC connector as `ec_both`, so each loads the outputs any encoder wrote to `$EC_PATH` instead of encoding them; the folder has no capacity or eviction (the twin's {gib:.1} GiB LRU is dropped: size the file system under `$EC_PATH`), and its reads and writes are the file system's, not the twin's link"),
            "dropped: SGLang's encoder-only server keeps no encoder outputs across requests".into(),
            "dropped: the encode workers' EC connector is not configured by this deployment".into(),
        ]));
    }
    rows.push(("prefix cache (per prefill worker, KV blocks)", match &c.prefix {
        Some(p) => [
            format!("kept: `--enable-prefix-caching --block-size {}` on the prefill instances; the decode instances keep vLLM's default", p.block_size),
            format!("kept: the radix cache (on by default) with `--page-size {}`", p.block_size),
            format!("kept: `--enable-prefix-caching --block-size {}` on the prefill workers", p.block_size),
        ],
        None => [
            "kept off: `--no-enable-prefix-caching` on the prefill instances (the twin models no prefix cache)".into(),
            "kept off: `--disable-radix-cache` on the prefill servers".into(),
            "kept off: `--no-enable-prefix-caching` on the prefill workers".into(),
        ],
    }));
    if !c.is_off() {
        rows.push(("the caches in the aggregated baseline (`aggregated/`)", [
            "dropped: its prediction has no cache (the twin models none for the aggregated system); the replicas keep vLLM's defaults".into(),
            "—".into(),
            "—".into(),
        ]));
    }
    if let (Some(_), Some(r)) = (&c.prefix, &c.routing) {
        rows.push(("cache-aware placement (overlap weight)", [
            "dropped: the proxy picks instances round-robin".into(),
            "dropped: the router runs in PD mode (`--pd-disaggregation`) with its own policy; no cache-aware option was confirmed there".into(),
            format!("kept: the frontend's KV router, `--router-mode kv --kv-overlap-score-weight {}`; the encode workers are not placed by cache", r.overlap_weight),
        ]));
    }
    rows
}

/// The README's list of the files written (or why an engine's were not).
fn readme_files(s: &mut String, predictions: &[Prediction], skipped: &[(String, String)]) {
    *s += "## Files\n\n";
    *s += "* `scenario.toml` — the scenario with this deployment: `easerve sim scenario.toml` gives the easerve row above, `easerve exec scenario.toml` runs it on easerve's executor.\n";
    match skipped.iter().find(|(d, _)| d == "vllm") {
        Some((_, why)) => {
            let _ = writeln!(s, "* `vllm/` — not written: {why}.");
        }
        None => {
            let _ = writeln!(
                s,
                "* `vllm/` — vLLM {}: `E*.sh`, `P*.sh`, `D*.sh` start each instance on its node (encoders first, then prefill and decode), then `proxy.sh` the front door. The encoder cache goes through `EC_PATH` (default /tmp/easerve-ec-cache), which every instance must share (a shared file system across nodes); KV caches move with NIXL. vLLM's EPD example calls only the 1E+1P+1D layout stable, and runs TP1 everywhere: other layouts were not confirmed. `vllm/scenario.toml` is the simulator's version of it.",
                VLLM.version
            );
        }
    }
    match skipped.iter().find(|(d, _)| d == "sglang") {
        Some((_, why)) => {
            let _ = writeln!(s, "* `sglang/` — not written: {why}.");
        }
        None => {
            let _ = writeln!(
                s,
                "* `sglang/` — SGLang {}: `E*.sh` (encoder-only servers), `P*.sh` (language-only prefill servers that call the encoders), `D*.sh`, then `router.sh`. KV transfer uses `KV_BACKEND` (default mooncake, SGLang's default; on a node without InfiniBand try nixl: not confirmed). An encoder at TP > 1 was not confirmed.",
                SGLANG.version
            );
        }
    }
    match skipped.iter().find(|(d, _)| d == "dynamo") {
        Some((_, why)) => {
            let _ = writeln!(s, "* `dynamo/` — not written: {why}.");
        }
        None => {
            let _ = writeln!(
                s,
                "* `dynamo/deployment.yaml` — NVIDIA Dynamo {}: a DynamoGraphDeployment for its Kubernetes operator (`kubectl apply -f`). Not confirmed: the encode workers' component type (the v1beta1 type enum has no encode value; `worker` is used), and whether the decode worker needs `--kv-transfer-config`.",
                DYNAMO.version
            );
        }
    }
    *s += "* `bench.sh [TIER]` — `easerve bench` with this scenario's own requests (the simulator's generator and seed: the same prompts' lengths, media shapes and send times) against `BASE_URL`, the tier's TTFT and TPOT bounds as goodput; it writes `bench-result.json` (vllm bench serve's keys, easerve's report under `easerve`) and a CSV row per request. Images and audio go as OpenAI's `image_url` and `input_audio` parts, video as vLLM's frames form (`video_url` with `data:video/jpeg;base64,F1,F2,…`; SGLang's and Dynamo's handling of it was not checked).\n";
    match predictions.iter().find(|p| p.system == "aggregated") {
        Some(p) => {
            let _ = writeln!(
                s,
                "* `aggregated/` — the baseline on the same GPUs: {} (`--aggregated-tp` or the scenario's `deployment.aggregated_tp` sets the replicas' TP), one `vllm serve` script per replica (ports from {AGGREGATED_PORT}), and its scenario (the last row above).",
                p.deployment
            );
        }
        None => {
            if let Some((_, why)) = skipped.iter().find(|(d, _)| d == "aggregated") {
                let _ = writeln!(s, "* `aggregated/` — {why}.");
            }
        }
    }
    *s += "* `predictions.json` — the table above.\n";
}
