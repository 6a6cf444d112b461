//! `[deployment.encoder_cache]`, `[deployment.prefix_cache]`,
//! `[deployment.encoder_store]`: the caches a deployment runs, checked
//! against the system, the model and the workload's largest item.

use super::{num, V};
use crate::scenario::{ScenarioError, ScenarioFile, ServingKnobs, Shapes, System, Workload};
use easerve_calib::{Efficiency, GpuSpec, Roofline};
use easerve_model::{ModelArch, Parallel};
use easerve_sched::{
    CacheConfig, Deployment, EncoderCacheConfig, EncoderStoreConfig, PrefixCacheConfig, StoreLink,
};

/// What the caches are checked against.
pub(super) struct Against<'a> {
    pub(super) system: System,
    pub(super) model: &'a ModelArch,
    pub(super) gpu: &'a GpuSpec,
    pub(super) workload: &'a Workload,
    pub(super) deployment: &'a Deployment,
    pub(super) knobs: &'a ServingKnobs,
    /// TP of each local prefill worker.
    pub(super) local_prefill_tp: Option<u32>,
}

/// The caches of `raw`'s deployment (all off when it names none).
pub(super) fn cache_section(
    raw: &ScenarioFile,
    v: &V<'_>,
    a: &Against<'_>,
) -> Result<CacheConfig, ScenarioError> {
    let mut caches = CacheConfig::default();
    let d = &raw.deployment;
    let named = [
        ("deployment.encoder_cache", d.encoder_cache.is_some()),
        ("deployment.prefix_cache", d.prefix_cache.is_some()),
        ("deployment.encoder_store", d.encoder_store.is_some()),
    ];
    if let Some(&(field, _)) = named.iter().find(|n| n.1) {
        // the caches run on whole requests at EPD workers
        if !matches!(a.system, System::Easerve | System::Passthrough) {
            return Err(v.err(
                field,
                format!(
                    "{} has no such cache here; allowed with system easerve or passthrough",
                    a.system
                ),
            ));
        }
    }
    caches.encoder = encoder_cache(raw, v, a)?;
    caches.prefix = prefix_cache(raw, v, a)?;
    caches.store = encoder_store(raw, v, a)?;
    if let Some(r) = &raw.deployment.cache_routing {
        if caches.encoder.is_none() && caches.prefix.is_none() {
            return Err(v.err(
                "deployment.cache_routing",
                "routes by what the per-worker caches hold: turn on [deployment.encoder_cache] or [deployment.prefix_cache]",
            ));
        }
        let w = v.real(
            "deployment.cache_routing.overlap_weight",
            r.overlap_weight.unwrap_or(1.0),
            0.0,
            100.0,
            false,
        )?;
        caches.routing = Some(easerve_sched::CacheRouting { overlap_weight: w });
    }
    Ok(caches)
}

/// `[deployment.prefix_cache]`: the block size, and each prefill worker's
/// KV pool in blocks (its GPUs' memory at `gpu_memory_utilization` less the
/// LLM's weights, and for a local worker the encoder's too; as
/// [`Roofline::kv_bytes_free_per_gpu`]).
fn prefix_cache(
    raw: &ScenarioFile,
    v: &V<'_>,
    a: &Against<'_>,
) -> Result<Option<PrefixCacheConfig>, ScenarioError> {
    let Some(p) = &raw.deployment.prefix_cache else {
        return Ok(None);
    };
    let field = "deployment.prefix_cache.block_size";
    let bs = p
        .block_size
        .unwrap_or(easerve_sched::cache::DEFAULT_BLOCK_SIZE as i64);
    if !(1..=1024).contains(&bs) || bs & (bs - 1) != 0 {
        return Err(v.err(
            field,
            format!("{bs}: allowed a power of two, 1 ..= 1024 tokens (vLLM's default 16)"),
        ));
    }
    let roof = Roofline::new(a.model.clone(), a.gpu.clone(), Efficiency::default());
    let util = a.knobs.gpu_memory_utilization;
    let block_bytes = a.model.kv_bytes_per_token() * bs as f64;
    let blocks = |par: Parallel, extra: f64| {
        (roof.kv_bytes_free_per_gpu(par, extra, util).unwrap_or(0.0) * par.gpus() as f64
            / block_bytes)
            .floor() as u64
    };
    let pf = a.deployment.allocation.prefill;
    Ok(Some(PrefixCacheConfig {
        block_size: bs as u32,
        remote_blocks: blocks(Parallel::new(pf.tp, pf.ep), 0.0),
        local_blocks: a.local_prefill_tp.map_or(0, |tp| {
            blocks(Parallel::from(tp), a.model.encoder_weight_bytes())
        }),
    }))
}

/// `[deployment.encoder_cache]`: its capacity, from one item's embeddings
/// to the GPU's memory.
fn encoder_cache(
    raw: &ScenarioFile,
    v: &V<'_>,
    a: &Against<'_>,
) -> Result<Option<EncoderCacheConfig>, ScenarioError> {
    let Some(e) = &raw.deployment.encoder_cache else {
        return Ok(None);
    };
    let cap = capacity(
        v,
        a,
        "deployment.encoder_cache.capacity_gib",
        e.capacity_gib,
        ("the GPU's memory", a.gpu.memory_gb * 1e9),
    )?;
    Ok(Some(EncoderCacheConfig {
        capacity_bytes: cap,
        bytes_per_token: a.model.embedding_bytes_per_token(),
        hash_raw_bytes: e.hash_raw_bytes.unwrap_or(false),
    }))
}

/// Largest store, GiB: a petabyte-scale pool is beyond any deployment here.
const MAX_STORE_GIB: f64 = 1_048_576.0;

/// `[deployment.encoder_store]`: its capacity, from one item's embeddings
/// to [`MAX_STORE_GIB`], and the link to it.
fn encoder_store(
    raw: &ScenarioFile,
    v: &V<'_>,
    a: &Against<'_>,
) -> Result<Option<EncoderStoreConfig>, ScenarioError> {
    let Some(e) = &raw.deployment.encoder_store else {
        return Ok(None);
    };
    let gib = (1u64 << 30) as f64;
    let cap = capacity(
        v,
        a,
        "deployment.encoder_store.capacity_gib",
        e.capacity_gib,
        ("the largest store allowed", MAX_STORE_GIB * gib),
    )?;
    let link = match &e.link {
        Some(l) => {
            let l = super::groups::link_of(v, "deployment.encoder_store.link", l)?;
            Some(StoreLink {
                bandwidth_gbs: l.bandwidth_gbs,
                latency_s: l.latency_s,
            })
        }
        None => None,
    };
    Ok(Some(EncoderStoreConfig {
        capacity_bytes: cap,
        bytes_per_token: a.model.embedding_bytes_per_token(),
        link,
    }))
}

/// A capacity of `gib` at `field`, bytes: at least the embeddings of the
/// workload's largest item, at most `max` (its name and bytes).
fn capacity(
    v: &V<'_>,
    a: &Against<'_>,
    field: &str,
    gib_cap: f64,
    max: (&str, f64),
) -> Result<u64, ScenarioError> {
    let bytes_per_token = a.model.embedding_bytes_per_token();
    // the largest item one request can draw must fit
    let one_item = match &a.workload.shapes {
        Shapes::Text => 0.0,
        s => s.max_mm_tokens(a.model) as f64 / s.max_items().max(1) as f64 * bytes_per_token,
    };
    let gib = (1u64 << 30) as f64;
    let bytes = gib_cap * gib;
    if !(gib_cap.is_finite() && bytes >= one_item && gib_cap > 0.0 && bytes <= max.1) {
        return Err(v.err(
            field,
            format!(
                "{}: allowed from one item's embeddings ({:.4} GiB: the workload's largest item, {} bytes a token) to {} ({:.1} GiB)",
                num(gib_cap),
                one_item / gib,
                num(bytes_per_token),
                max.0,
                max.1 / gib
            ),
        ));
    }
    Ok(bytes as u64)
}
