//! The `[cluster]` section: the GPU (a preset or a custom file), its link,
//! the cost-source choice and the host's preprocessing speed, with the
//! figures a custom GPU or link must have; the `[model]` section is read
//! first (`model.rs`).

use super::model::model_section;
use super::{preset_or_file, V};
use crate::scenario::{num, Group, LinkChoice, ScenarioError, ScenarioFile};
use easerve_calib::{GpuSpec, LinkSpec};
use easerve_model::ModelArch;
use std::path::Path;

/// Smallest hardware figure accepted (TFLOPS, GB/s, GB): a thousandth of a
/// unit. Below it service times leave the span the clock resolves
/// ([`MAX_HORIZON_S`](crate::scenario::MAX_HORIZON_S)); the upper bounds are far above any device.
pub const HARDWARE_MIN: f64 = 1e-3;

const HARDWARE_WHY: &str =
    "far outside any device, service times would leave the span the simulator's clock resolves";

/// GPU presets without FP8 tensor cores (FP8 needs compute capability 8.9 or
/// later: Ada, Hopper, Blackwell; the A100 is 8.0, and the aiconfigurator
/// data has no FP8 GEMM or quantize rows for it), and the host CPU.
pub const NO_FP8_GPUS: &[&str] = &["a100-sxm4-80gb", "cpu"];

/// The `[model]` and `[cluster]` sections: the model and GPU (presets or
/// custom files next to the scenario, in `dir`), the link and cost-source
/// choices, and the GPU count; with node groups (`[[cluster.groups]]`),
/// the groups, the first one's GPU and their GPU total.
pub(super) fn cluster_section(
    raw: &ScenarioFile,
    v: &V<'_>,
    dir: &Path,
) -> Result<(ModelArch, GpuSpec, u32, Vec<Group>), ScenarioError> {
    let model = model_section(raw, v, dir)?;
    let groups = super::groups::groups_section(raw, v, dir)?;
    let fp8_field = if model.llm.dtype_bytes == 1 {
        Some("model.dtype")
    } else if model.llm.kv_bytes() == 1 {
        Some("model.kv_cache_dtype")
    } else {
        None
    };
    if !groups.is_empty() {
        check_cost_source(raw, v)?;
        let gpus = groups.iter().map(|g| g.node.gpus()).sum::<u32>();
        for (i, g) in groups.iter().enumerate() {
            check_fp8(v, fp8_field, &g.gpu).map_err(|e| ScenarioError {
                field: format!("{} (cluster.groups[{i}].gpu)", e.field),
                ..e
            })?;
        }
        let gpu = groups[0].gpu.clone();
        return Ok((model, gpu, gpus, groups));
    }
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
            check_link(link).map_err(|e| v.err(&format!("cluster.link.{}", e.field()), e))?;
            gpu.link = link.clone();
        }
        None => {}
    }
    check_cost_source(raw, v)?;
    let gpus = v.int("cluster.gpus", raw.cluster.gpus, 1, 4096)? as u32;
    check_fp8(v, fp8_field, &gpu)?;
    Ok((model, gpu, gpus, groups))
}

/// `cluster.kernels` and `cluster.host_cpu_scale`.
fn check_cost_source(raw: &ScenarioFile, v: &V<'_>) -> Result<(), ScenarioError> {
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
    Ok(())
}

/// An FP8 model (`fp8_field` names the field asking for it) needs FP8 units.
fn check_fp8(v: &V<'_>, fp8_field: Option<&str>, gpu: &GpuSpec) -> Result<(), ScenarioError> {
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
    Ok(())
}

/// What is wrong with a link's figures (an inline `cluster.link`, or a
/// custom GPU's `link`); [`LinkError::field`] names the field at fault.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub(super) enum LinkError {
    /// The name is empty or blank (it names the link in reports and profiles).
    #[error("must not be empty")]
    EmptyName,
    /// The bandwidth, GB/s, is outside `[HARDWARE_MIN, 1e5]` or not finite.
    #[error(
        "{} GB/s is not a plausible link: allowed [{HARDWARE_MIN}, 1e5] ({HARDWARE_WHY})",
        num(*.0)
    )]
    Bandwidth(f64),
    /// The latency, seconds per transfer, is outside `[0, 1]` or not finite.
    #[error("{} s per transfer is not a plausible link: allowed [0, 1]", num(*.0))]
    Latency(f64),
}

impl LinkError {
    /// The link's field at fault (`name`, `bandwidth_gbs`, `latency_s`).
    pub(super) fn field(&self) -> &'static str {
        match self {
            LinkError::EmptyName => "name",
            LinkError::Bandwidth(_) => "bandwidth_gbs",
            LinkError::Latency(_) => "latency_s",
        }
    }
}

/// What is wrong with a custom GPU file's figures.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub(super) enum GpuError {
    /// A throughput, bandwidth or memory figure outside `[HARDWARE_MIN, hi]`
    /// or not finite.
    #[error(
        "field `{field}` = {} is not a plausible figure: allowed [{HARDWARE_MIN}, {}] ({HARDWARE_WHY})",
        num(*.value),
        num(*.hi)
    )]
    Implausible {
        /// The field (`bf16_tflops`, `mem_bandwidth_gbs`, `memory_gb`).
        field: &'static str,
        /// Its value.
        value: f64,
        /// The largest value allowed.
        hi: f64,
    },
    /// The GPU's `link` is not a plausible link.
    #[error("field `link.{}`: {0}", .0.field())]
    Link(LinkError),
    /// `sms` is 0.
    #[error("field `sms` must be ≥ 1")]
    NoSms,
}

/// A link's figures: a name (it names the link in reports and profiles),
/// bandwidth positive and finite, latency finite and ≥ 0.
pub(super) fn check_link(l: &LinkSpec) -> Result<(), LinkError> {
    if l.name.trim().is_empty() {
        return Err(LinkError::EmptyName);
    }
    if !(HARDWARE_MIN..=1e5).contains(&l.bandwidth_gbs) {
        return Err(LinkError::Bandwidth(l.bandwidth_gbs));
    }
    if !(0.0..=1.0).contains(&l.latency_s) {
        return Err(LinkError::Latency(l.latency_s));
    }
    Ok(())
}

/// A custom GPU's figures must be positive and finite.
pub(super) fn check_gpu(g: &GpuSpec) -> Result<(), GpuError> {
    for (field, value, hi) in [
        ("bf16_tflops", g.bf16_tflops, 1e5),
        ("mem_bandwidth_gbs", g.mem_bandwidth_gbs, 1e6),
        ("memory_gb", g.memory_gb, 1e6),
    ] {
        if !(HARDWARE_MIN..=hi).contains(&value) {
            return Err(GpuError::Implausible { field, value, hi });
        }
    }
    check_link(&g.link).map_err(GpuError::Link)?;
    if g.sms == 0 {
        return Err(GpuError::NoSms);
    }
    Ok(())
}
