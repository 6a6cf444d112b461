//! The `[model]` section and what a model file must hold: a custom model's
//! shapes ([`check_model`]: sizes, MoE, encoder token rules, projector), the
//! dtypes a scenario may name, and expert parallelism in an allocation
//! against the model's experts and a node's GPUs ([`NODE_GPUS`]).

use super::{preset_or_file, V};
use crate::scenario::{ScenarioError, ScenarioFile};
use easerve_model::ModelArch;
use easerve_sched::Allocation;
use std::path::Path;

/// The LLM dtypes a scenario may name, with their bytes per element: BF16;
/// FP8 with per-tensor scales (vLLM's `--quantization fp8`, ModelOpt FP8
/// checkpoints); FP8 with 128x128 block scales (the format of Qwen's and
/// DeepSeek's FP8 checkpoints). Each is priced from its own aiconfigurator
/// rows (`gemm_dtype`, `moe_dtype`).
pub const LLM_DTYPES: &[(&str, u32)] = &[("bfloat16", 2), ("fp8", 1), ("fp8_block", 1)];

/// The KV-cache dtypes a scenario may name, with their bytes per element.
pub const KV_DTYPES: &[(&str, u32)] = &[("bfloat16", 2), ("fp8", 1)];

/// The `[model]` section: a preset or a custom file next to the scenario
/// (in `dir`), with its MoE routing, pan-and-scan and LLM and KV-cache
/// dtypes as the scenario sets them.
pub(super) fn model_section(
    raw: &ScenarioFile,
    v: &V<'_>,
    dir: &Path,
) -> Result<ModelArch, ScenarioError> {
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
    Ok(model)
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
pub(super) fn check_expert_parallel(a: &Allocation, model: &ModelArch) -> Result<(), String> {
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
        } => tiled_vit_sizes(*image_size, *patch, *pixel_shuffle, tiling, projector)?,
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

/// Token-rule sizes of a custom tiled ViT (InternVL, Llama 4): the tile a
/// whole number of patches whose side folds by the pixel shuffle, 1 to 64
/// tiles, a projector chain; the sizes used as divisors.
fn tiled_vit_sizes(
    image_size: u32,
    patch: u32,
    pixel_shuffle: u32,
    tiling: &easerve_model::Tiling,
    projector: &[u32],
) -> Result<Vec<(&'static str, u64)>, String> {
    if image_size < patch {
        return Err("field `encoder.kind.TiledVit.image_size` must be ≥ `patch`".into());
    }
    if patch > 0
        && pixel_shuffle > 0
        && (!image_size.is_multiple_of(patch)
            || !(image_size / patch).is_multiple_of(pixel_shuffle))
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
            "field `encoder.kind.TiledVit.tiling` needs 1 ≤ `min_tiles` ≤ `max_tiles` ≤ 64".into(),
        );
    }
    check_projector("TiledVit", projector)?;
    Ok(vec![
        ("TiledVit.patch", u64::from(patch)),
        ("TiledVit.pixel_shuffle", u64::from(pixel_shuffle)),
    ])
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
