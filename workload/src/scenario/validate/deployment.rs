//! The `[deployment]` section: the serving system and framework, the
//! allocation, `B`, `s`, the dispatch, router and SM policies, the serving
//! knobs, host preprocessing (`deployment.preprocess`, with
//! `cluster.host_cores`) and the launch modes (`[deployment.launch]`).

use super::{num, V};
use crate::scenario::{ScenarioError, ScenarioFile, ServingKnobs, System};
use easerve_calib::GpuSpec;
use easerve_sched::{Allocation, Deployment, DispatchPolicy, RouterPolicy, SmPolicy};

/// Largest encode micro-batch `B` (`deployment.batch`).
pub const MAX_BATCH: i64 = 4096;

/// Longest an encode batcher may hold a request, seconds
/// (`deployment.max_age_s`, the `fixed-timeout:SECONDS` dispatch).
pub const MAX_WAIT_S: f64 = 3600.0;

/// Default host cores per GPU: the EAServe paper's testbed, two AMD EPYC 9254
/// (48 cores) for eight RTX 6000 Ada GPUs (PAPER.txt, "Testbed and
/// baselines").
pub const HOST_CORES_PER_GPU: i64 = 6;

/// Split `name:value`.
fn split_arg(s: &str) -> (&str, Option<&str>) {
    match s.split_once(':') {
        Some((a, b)) => (a.trim(), Some(b.trim())),
        None => (s.trim(), None),
    }
}

/// `deployment.system` and `deployment.framework`: the serving system
/// (default `easerve`) and, when given, a framework of
/// [`easerve_calib::preprocess::FRAMEWORKS`].
pub(super) fn system_of(raw: &ScenarioFile, v: &V<'_>) -> Result<System, ScenarioError> {
    let system: System = raw
        .deployment
        .system
        .as_deref()
        .unwrap_or("easerve")
        .parse()
        .map_err(|e: easerve_sched::UnknownSystem| v.err("deployment.system", e.to_string()))?;
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
    Ok(system)
}

/// The `[deployment]` section: the allocation, `B`, `s`, the dispatch, router
/// and SM policies, and the serving knobs (local-prefill and aggregated TP
/// are resolved later, against the cluster and the model).
pub(super) fn deployment_section(
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
    let rate_estimate = match d.rate_estimator.as_deref() {
        None => easerve_sched::RateEstimate::default(),
        Some(t) => t
            .parse()
            .map_err(|e: String| v.err("deployment.rate_estimator", e))?,
    };
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
            rate_estimate,
            caches: easerve_sched::CacheConfig::default(),
        },
    ))
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

/// `deployment.preprocess`, `deployment.preprocess_threads` and
/// `cluster.host_cores` checked: the preprocessing threads of each encode
/// worker when preprocessing is pipelined, `None` when it is serial.
pub(super) fn preprocess_section(
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
        // HydraInfer's request processor preprocesses on a thread pool as
        // requests arrive (`hydrainfer/engine/request_processor.py`)
        None => matches!(framework, "easerve" | "hydrainfer") && !on_cpu,
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
pub(super) fn launch_section(
    raw: &ScenarioFile,
    v: &V,
) -> Result<easerve_calib::Launch, ScenarioError> {
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
