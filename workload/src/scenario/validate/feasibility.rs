//! The allocation against the cluster, the model and the workload: enough
//! GPUs, encode workers where there are items to encode, expert parallelism
//! the model allows, prefill and decode TP that splits the LLM's heads, and
//! memory: each prefill and decode worker holds the
//! LLM's weights and the KV cache of one longest sequence, an encode GPU its
//! encoder; the aggregated system's TP and the local prefill workers' TP are
//! the smallest degrees that fit.

use super::model::check_expert_parallel;
use super::workload::max_sequence_tokens;
use super::V;
use crate::scenario::{Arrival, ScenarioError, ServingKnobs, System, Workload};
use easerve_calib::{Efficiency, GpuSpec, Roofline};
use easerve_model::{ModelArch, Parallel};
use easerve_sched::{Allocation, Deployment, Modality};

/// The allocation's shape against the cluster (`gpus`), the model's experts,
/// the workload's `modality` and the `system`: GPUs enough, encode workers
/// at TP1 (or a TP their encoder splits into) and only for a multimodal
/// workload, a decode worker, and remote
/// prefill workers where `s` or the pass-through system sends requests.
pub(super) fn check_allocation(
    v: &V<'_>,
    system: System,
    gpus: u32,
    model: &ModelArch,
    modality: Modality,
    dep: &Deployment,
) -> Result<(), ScenarioError> {
    let allocation = &dep.allocation;
    let offload = dep.offload;
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
    let encoder_tp = model.encoder.as_ref().map_or(vec![1], |e| e.executor_tp());
    if allocation.encode.workers > 0 && !encoder_tp.contains(&(allocation.encode.tp as usize)) {
        return Err(v.err(
            fa,
            format!(
                "encode workers run at TP1 (each encoder fits on one GPU; more encode GPUs means more workers), or at a TP that splits the encoder's heads and MLP width (the LLaVA-NeXT CLIP tower; this model's encoder: TP {encoder_tp:?}): use {}E(TP1) instead of {}E(TP{})",
                allocation.encode.gpus(),
                allocation.encode.workers,
                allocation.encode.tp
            ),
        ));
    }
    check_expert_parallel(allocation, model).map_err(|m| v.err(fa, m))?;
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
    if matches!(system, System::Passthrough | System::EpdServe) && allocation.prefill.workers == 0 {
        return Err(v.err(
            "deployment.system",
            format!("{system} runs every prefill on remote P workers, but `{allocation}` has none; add nP(TPk)"),
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
    Ok(())
}

/// The prefill and decode workers' TP splits the LLM's attention heads
/// ([`easerve_model::LlmArch::serving_tp`], vLLM's rule): `Err` names the
/// stage, the model's heads and the degrees allowed up to `gpus` (the
/// cluster's). Checked after the placement on node groups, so a TP larger
/// than a node is refused as that.
pub(super) fn check_llm_tp(
    v: &V<'_>,
    allocation: &Allocation,
    model: &ModelArch,
    gpus: u32,
) -> Result<(), ScenarioError> {
    let serving = model.llm.serving_tp();
    for (stage, pool) in [
        ("prefill", allocation.prefill),
        ("decode", allocation.decode),
    ] {
        if pool.workers > 0 && !serving.contains(&(pool.tp as usize)) {
            return Err(v.err(
                "deployment.allocation",
                tp_does_not_split(&format!("{stage} at TP{}", pool.tp), model, &serving, gpus),
            ));
        }
    }
    Ok(())
}

/// Why `what` (a worker at a TP outside `serving`, the LLM's
/// [`easerve_model::LlmArch::serving_tp`]) cannot be served, and the degrees
/// allowed up to `gpus`.
fn tp_does_not_split(what: &str, model: &ModelArch, serving: &[usize], gpus: u32) -> String {
    let allowed: Vec<usize> = serving
        .iter()
        .copied()
        .filter(|&t| t <= gpus as usize)
        .collect();
    format!(
        "{what} does not split {}'s {} attention heads and {} KV heads (a serving engine refuses a TP that does not divide the heads; KV heads are replicated when TP is a multiple of them); allowed TP up to the cluster's {gpus} GPUs: {allowed:?}",
        model.name, model.llm.heads, model.llm.kv_heads
    )
}

/// What a worker's GPUs must hold: the LLM's weights (and the encoder's,
/// where it shares them) and the KV cache of one longest sequence the
/// workload can draw, within the usable fraction of GPU memory.
pub(super) struct Fit<'a> {
    model: &'a ModelArch,
    gpu: &'a GpuSpec,
    roof: Roofline,
    /// Tokens of one longest sequence (prompt + multimodal + output).
    max_seq_tokens: u64,
    kv_per_token: f64,
    kv_block_size: u64,
    mem_util: f64,
}

impl<'a> Fit<'a> {
    /// The memory `workload` needs of `model` on `gpu` under `knobs`.
    pub(super) fn new(
        model: &'a ModelArch,
        gpu: &'a GpuSpec,
        workload: &Workload,
        knobs: &ServingKnobs,
    ) -> Fit<'a> {
        let roof = Roofline::new(model.clone(), gpu.clone(), Efficiency::default());
        // a trace brings its own lengths; the shapes add multimodal tokens
        let trace_max = match &workload.arrival {
            Arrival::Trace { rows, .. } => rows
                .iter()
                .map(|r| r.prompt_tokens as u64 + r.output_tokens as u64)
                .max()
                .unwrap_or(0),
            _ => 0,
        };
        let w = workload;
        let max_seq_tokens = trace_max
            + max_sequence_tokens(model, w.input_len, w.output_len, w.range_ratio, &w.shapes);
        Fit {
            model,
            gpu,
            roof,
            max_seq_tokens,
            kv_per_token: model.kv_bytes_per_token(),
            kv_block_size: knobs.kv_block_size,
            mem_util: knobs.gpu_memory_utilization,
        }
    }

    /// The KV-cache bytes free on the GPUs of `par` with `extra` bytes of
    /// other weights on each, if they hold one longest sequence.
    fn fits(&self, par: Parallel, extra: f64) -> Option<f64> {
        self.roof
            .kv_bytes_free_per_gpu(par, extra, self.mem_util)
            .map(|free| free * par.gpus() as f64)
            // whole blocks: the engine rounds capacity down and need up
            .filter(|total| {
                *total >= (self.max_seq_tokens + 2 * self.kv_block_size) as f64 * self.kv_per_token
            })
    }

    /// Each prefill and decode worker of `allocation` holds the LLM and one
    /// longest sequence; an encode GPU holds the encoder.
    pub(super) fn check_workers(
        &self,
        v: &V<'_>,
        allocation: &Allocation,
        modality: Modality,
    ) -> Result<(), ScenarioError> {
        let (model, gpu) = (self.model, self.gpu);
        let (max_seq_tokens, kv_per_token, mem_util) =
            (self.max_seq_tokens, self.kv_per_token, self.mem_util);
        let fa = "deployment.allocation";
        let multimodal = modality != Modality::Text;
        for (field, pool, stage) in [
            ("P", allocation.prefill, "prefill"),
            ("D", allocation.decode, "decode"),
        ] {
            let par = easerve_model::Parallel::new(pool.tp, pool.ep);
            if pool.workers > 0 && self.fits(par, 0.0).is_none() {
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
        if multimodal
            && allocation.encode.workers > 0
            && model.encoder_weight_bytes() > mem_util * gpu.memory_bytes()
        {
            return Err(v.err(
                fa,
                format!(
                    "the encoder of {} does not fit on one {}",
                    model.name, gpu.name
                ),
            ));
        }
        Ok(())
    }

    /// The TP degree of each replica of the `aggregated` system: the one
    /// asked for (`deployment.aggregated_tp`, checked), else the smallest
    /// at which the LLM, its encoder and one longest sequence fit; `None`
    /// for another system, which must not ask for one.
    pub(super) fn aggregated_tp(
        &self,
        v: &V<'_>,
        asked_tp: Option<i64>,
        system: System,
        gpus: u32,
    ) -> Result<Option<u32>, ScenarioError> {
        let (model, gpu) = (self.model, self.gpu);
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
            let serving = model.llm.serving_tp();
            if !serving.contains(&(tp as usize)) {
                return Err(v.err(
                    "deployment.aggregated_tp",
                    tp_does_not_split(&format!("a replica at TP{tp}"), model, &serving, gpus),
                ));
            }
            if self.fits(tp.into(), model.encoder_weight_bytes()).is_none() {
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
            let serving = model.llm.serving_tp();
            let tp = [1u32, 2, 4, 8, 16, 32]
                .into_iter()
                .filter(|tp| *tp <= gpus && serving.contains(&(*tp as usize)))
                .find(|&tp| self.fits(tp.into(), model.encoder_weight_bytes()).is_some())
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
        Ok(aggregated_tp)
    }

    /// The TP degree of each local prefill worker when `s < 1`: the smallest
    /// at which the LLM fits next to the encoder on the encode GPUs, dividing
    /// the encode workers; `None` when `s = 1`.
    pub(super) fn local_prefill_tp(
        &self,
        v: &V<'_>,
        dep: &Deployment,
    ) -> Result<Option<u32>, ScenarioError> {
        let model = self.model;
        let allocation = &dep.allocation;
        let offload = dep.offload;
        let local_prefill_tp = if offload < 1.0 {
            let e_gpus = allocation.encode.gpus();
            let serving = model.llm.serving_tp();
            let tp = [1u32, 2, 4, 8, 16]
                .into_iter()
                .filter(|tp| *tp <= e_gpus && serving.contains(&(*tp as usize)))
                .find(|&tp| self.fits(tp.into(), model.encoder_weight_bytes()).is_some())
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
        Ok(local_prefill_tp)
    }
}
