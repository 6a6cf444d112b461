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

/// What is wrong with a custom model file ([`check_model`]); each message
/// names the field at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// A size that must be at least 1 is 0.
    #[error("field `{field}` must be ≥ 1")]
    Zero {
        /// The field, e.g. `llm.heads` or `encoder.kind.QwenVit.patch`.
        field: String,
    },
    /// A head count that does not divide the count or width it splits.
    #[error("field `{field}` ({value}) must divide `{of}` ({total})")]
    NotDivisor {
        /// The divisor's field (`llm.kv_heads`, `encoder.heads`).
        field: &'static str,
        /// Its value.
        value: u32,
        /// The field it must divide (`llm.heads`, `encoder.hidden`).
        of: &'static str,
        /// That field's value.
        total: u32,
    },
    /// Weights of other than 1, 2 or 4 bytes.
    #[error("field `{field}` must be 1, 2 or 4")]
    DtypeBytes {
        /// `llm.dtype_bytes` or `encoder.dtype_bytes`.
        field: &'static str,
    },
    /// The model's name is empty or blank.
    #[error("field `name` must not be empty")]
    EmptyName,
    /// A field that breaks a fixed rule between the fields of its table
    /// (e.g. `image_size` ≥ `patch`), the rule stated in words.
    #[error("field `{field}` {rule}")]
    Rule {
        /// The field.
        field: &'static str,
        /// What it must be or needs, e.g. "must be ≥ `patch`".
        rule: &'static str,
    },
    /// MoE routing to more experts than there are.
    #[error("field `llm.moe.top_k` ({top_k}) must be ≤ `llm.moe.experts` ({experts})")]
    TopK {
        /// Experts per token.
        top_k: u32,
        /// Experts per layer.
        experts: u32,
    },
    /// An MoE model whose leading dense layers are all its layers.
    #[error(
        "field `llm.moe.first_dense_layers` ({dense}) must be < `llm.layers` ({layers}): a model whose layers are all dense has no `moe` table"
    )]
    AllDense {
        /// `llm.moe.first_dense_layers`.
        dense: u32,
        /// `llm.layers`.
        layers: u32,
    },
    /// A projector chain that does not end at the LLM's width.
    #[error(
        "field `encoder.kind.*.projector` must end at the LLM's width `llm.hidden` = {hidden}, got {projector:?}"
    )]
    ProjectorEnd {
        /// `llm.hidden`.
        hidden: u32,
        /// The projector's widths.
        projector: Vec<u32>,
    },
    /// A projector chain that does not start at the width of the features it reads.
    #[error(
        "field `encoder.kind.*.projector` must start at {why} = {first} (the features it reads), got {projector:?}"
    )]
    ProjectorStart {
        /// How the features' width is made, in words.
        why: &'static str,
        /// That width.
        first: u64,
        /// The projector's widths.
        projector: Vec<u32>,
    },
    /// `encoder.projector_params` other than the projector chain's weights.
    #[error(
        "field `encoder.projector_params` ({given}) must equal the projector's weights, the sum of its widths' products ({params})"
    )]
    ProjectorParams {
        /// `encoder.projector_params`.
        given: u64,
        /// The chain's weights.
        params: u64,
    },
    /// A projector chain of fewer than two widths, or with a width 0.
    #[error(
        "field `encoder.kind.{family}.projector` must list at least two widths ≥ 1 (input first, the LLM's hidden last), got {widths:?}"
    )]
    Projector {
        /// The encoder kind (`TiledVit`, `OmniAudio`).
        family: &'static str,
        /// The widths given.
        widths: Vec<u32>,
    },
    /// A DeepStack tap past the encoder's last block.
    #[error(
        "field `encoder.kind.QwenVit.deepstack` names block {block}; allowed: 0 ..= {last} (encoder.layers − 1)"
    )]
    Deepstack {
        /// The block named.
        block: u32,
        /// The last block, `encoder.layers − 1`.
        last: u32,
    },
    /// A tiled ViT's tile that is not a whole number of patches folding by
    /// the pixel shuffle.
    #[error(
        "field `encoder.kind.TiledVit.image_size` ({image_size}) must be a multiple of `patch` ({patch}) whose patch side {} is a multiple of `pixel_shuffle` ({pixel_shuffle})",
        .image_size / .patch
    )]
    Tile {
        /// `image_size`, pixels.
        image_size: u32,
        /// `patch`, pixels.
        patch: u32,
        /// `pixel_shuffle`.
        pixel_shuffle: u32,
    },
}

/// Shapes a custom model must have: every size positive, heads dividing the
/// width, KV heads dividing the heads, 1-, 2- or 4-byte weights.
pub fn check_model(m: &ModelArch) -> Result<(), ModelError> {
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
    if let Some((field, _)) = positive.iter().find(|(_, x)| *x == 0) {
        return Err(zero(field));
    }
    if !l.heads.is_multiple_of(l.kv_heads) {
        return Err(ModelError::NotDivisor {
            field: "llm.kv_heads",
            value: l.kv_heads,
            of: "llm.heads",
            total: l.heads,
        });
    }
    if ![1, 2, 4].contains(&l.dtype_bytes) {
        return Err(ModelError::DtypeBytes {
            field: "llm.dtype_bytes",
        });
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
                return Err(zero(name));
            }
        }
        if !e.hidden.is_multiple_of(e.heads) {
            return Err(ModelError::NotDivisor {
                field: "encoder.heads",
                value: e.heads,
                of: "encoder.hidden",
                total: e.hidden,
            });
        }
        if ![1, 2, 4].contains(&e.dtype_bytes) {
            return Err(ModelError::DtypeBytes {
                field: "encoder.dtype_bytes",
            });
        }
        check_encoder_kind(&e.kind)?;
        if let easerve_model::EncoderKind::TiledVit { projector, .. }
        | easerve_model::EncoderKind::OmniAudio { projector, .. } = &e.kind
        {
            if projector.last() != Some(&l.hidden) {
                return Err(ModelError::ProjectorEnd {
                    hidden: l.hidden,
                    projector: projector.clone(),
                });
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
                return Err(ModelError::ProjectorStart {
                    why,
                    first,
                    projector: projector.clone(),
                });
            }
            let params: u64 = projector
                .windows(2)
                .map(|w| u64::from(w[0]) * u64::from(w[1]))
                .sum();
            if params != e.projector_params {
                return Err(ModelError::ProjectorParams {
                    given: e.projector_params,
                    params,
                });
            }
        }
        if let easerve_model::EncoderKind::QwenVit { deepstack, .. } = &e.kind {
            if let Some(&block) = deepstack.iter().find(|&&t| t >= e.layers) {
                return Err(ModelError::Deepstack {
                    block,
                    last: e.layers - 1,
                });
            }
        }
    }
    if m.name.trim().is_empty() {
        return Err(ModelError::EmptyName);
    }
    Ok(())
}

/// `field` is 0 where it must be at least 1.
fn zero(field: &str) -> ModelError {
    ModelError::Zero {
        field: field.to_string(),
    }
}

/// `field` breaks `rule` (stated in words, after the field's name).
fn rule(field: &'static str, rule: &'static str) -> ModelError {
    ModelError::Rule { field, rule }
}

/// GPUs of one node: one worker's `TP × EP` must stay within it. Every GPU
/// system of the aiconfigurator data is an 8-GPU node (HGX H100/H200/B200,
/// 8-GPU A100, L40S and RTX PRO 6000 servers) and its NCCL tables stop at 8
/// GPUs; cross-node expert parallelism is not modelled.
pub const NODE_GPUS: u32 = 8;

/// Why an allocation's expert parallelism does not suit the model
/// ([`check_expert_parallel`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum ExpertParallelError {
    /// EP asked of encode workers.
    #[error(
        "encode workers take no expert parallelism (the encoder has no experts): use {workers}E(TP1)"
    )]
    Encode {
        /// Encode workers.
        workers: u32,
    },
    /// EP asked of a dense model's workers.
    #[error(
        "{stage} at EP{ep}: {model} is a dense model (no experts to split); use {workers}{letter}(TP{tp})"
    )]
    Dense {
        /// `prefill` or `decode`.
        stage: &'static str,
        /// `P` or `D`.
        letter: char,
        /// The EP degree asked.
        ep: u32,
        /// The model's name.
        model: String,
        /// The stage's workers.
        workers: u32,
        /// Their TP degree.
        tp: u32,
    },
    /// An EP degree that does not divide the experts.
    #[error(
        "{stage} at EP{ep}: EP must divide the {experts} experts of {model} (allowed up to {NODE_GPUS}: {})",
        list(.allowed)
    )]
    NotDivisor {
        /// `prefill` or `decode`.
        stage: &'static str,
        /// The EP degree asked.
        ep: u32,
        /// Experts per layer.
        experts: u32,
        /// The model's name.
        model: String,
        /// The degrees that divide the experts, up to [`NODE_GPUS`].
        allowed: Vec<u32>,
    },
    /// A worker's `TP × EP` GPUs past one node.
    #[error(
        "{stage} at TP{tp} × EP{ep} = {gpus} GPUs spans more than one {NODE_GPUS}-GPU node (a worker's TP × EP must be at most {NODE_GPUS})"
    )]
    SpansNodes {
        /// `prefill` or `decode`.
        stage: &'static str,
        /// The TP degree.
        tp: u32,
        /// The EP degree.
        ep: u32,
        /// GPUs per worker, `TP × EP`.
        gpus: u32,
    },
}

/// `1, 2, 4` (numbers as an error message lists them).
fn list(xs: &[u32]) -> String {
    xs.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

/// Expert parallelism in an allocation: only an MoE model's prefill and
/// decode workers take `EP > 1`; EP must divide the experts, and one worker's
/// `TP × EP` GPUs must fit in a node ([`NODE_GPUS`]).
pub(super) fn check_expert_parallel(
    a: &Allocation,
    model: &ModelArch,
) -> Result<(), ExpertParallelError> {
    if a.encode.ep > 1 {
        return Err(ExpertParallelError::Encode {
            workers: a.encode.workers,
        });
    }
    for (stage, letter, pool) in [("prefill", 'P', a.prefill), ("decode", 'D', a.decode)] {
        if pool.workers == 0 {
            continue;
        }
        if pool.ep > 1 {
            let Some(moe) = &model.llm.moe else {
                return Err(ExpertParallelError::Dense {
                    stage,
                    letter,
                    ep: pool.ep,
                    model: model.name.clone(),
                    workers: pool.workers,
                    tp: pool.tp,
                });
            };
            if !moe.experts.is_multiple_of(pool.ep) {
                return Err(ExpertParallelError::NotDivisor {
                    stage,
                    ep: pool.ep,
                    experts: moe.experts,
                    model: model.name.clone(),
                    allowed: (1..=moe.experts.min(NODE_GPUS))
                        .filter(|e| moe.experts.is_multiple_of(*e))
                        .collect(),
                });
            }
        }
        if pool.ep > 1 && pool.gpus_per_worker() > NODE_GPUS {
            return Err(ExpertParallelError::SpansNodes {
                stage,
                tp: pool.tp,
                ep: pool.ep,
                gpus: pool.gpus_per_worker(),
            });
        }
    }
    Ok(())
}

/// The MoE fields of a model file: experts, top-k and widths ≥ 1, top-k at
/// most the experts, the dense leading layers fewer than the layers.
fn check_moe(m: &easerve_model::MoeArch, layers: u32) -> Result<(), ModelError> {
    for (name, x) in [
        ("llm.moe.experts", m.experts),
        ("llm.moe.top_k", m.top_k),
        ("llm.moe.expert_ffn", m.expert_ffn),
        ("llm.moe.router", m.router),
    ] {
        if x == 0 {
            return Err(zero(name));
        }
    }
    if m.top_k > m.experts {
        return Err(ModelError::TopK {
            top_k: m.top_k,
            experts: m.experts,
        });
    }
    if m.shared_experts > 0 && m.shared_ffn == 0 {
        return Err(rule(
            "llm.moe.shared_ffn",
            "must be ≥ 1 when `llm.moe.shared_experts` ≥ 1",
        ));
    }
    if m.first_dense_layers >= layers {
        return Err(ModelError::AllDense {
            dense: m.first_dense_layers,
            layers,
        });
    }
    Ok(())
}

/// Token-rule sizes of a custom encoder: every size used as a divisor ≥ 1.
fn check_encoder_kind(kind: &easerve_model::EncoderKind) -> Result<(), ModelError> {
    use easerve_model::EncoderKind;
    let sizes: Vec<(&str, u64)> = match kind {
        EncoderKind::ClipAnyres {
            image_size,
            patch,
            grid_pinpoints,
        } => {
            if grid_pinpoints.is_empty() || grid_pinpoints.iter().any(|&(h, w)| h == 0 || w == 0) {
                return Err(rule(
                    "encoder.kind.ClipAnyres.grid_pinpoints",
                    "must list [height, width] pairs ≥ 1",
                ));
            }
            if image_size < patch {
                return Err(rule(
                    "encoder.kind.ClipAnyres.image_size",
                    "must be ≥ `patch`",
                ));
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
                return Err(rule(
                    "encoder.kind.QwenVit.video_min_pixels",
                    "must be ≤ `video_max_pixels`",
                ));
            }
            if min_pixels > max_pixels {
                return Err(rule(
                    "encoder.kind.QwenVit.min_pixels",
                    "must be ≤ `max_pixels`",
                ));
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
                return Err(rule("encoder.kind.Siglip.image_size", "must be ≥ `patch`"));
            }
            if pooled_side > &(image_size / patch.max(&1)) {
                return Err(rule(
                    "encoder.kind.Siglip.pooled_side",
                    "must be at most `image_size / patch` (the patches per side)",
                ));
            }
            if let Some(p) = pan_and_scan {
                if p.min_crop == 0
                    || p.max_crops < 2
                    || !(p.min_ratio.is_finite() && p.min_ratio >= 1.0)
                {
                    return Err(rule(
                        "encoder.kind.Siglip.pan_and_scan",
                        "needs `min_crop` ≥ 1, `max_crops` ≥ 2 and `min_ratio` ≥ 1",
                    ));
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
                return Err(rule(
                    "encoder.kind.Whisper.window_s",
                    "must be a number > 0",
                ));
            }
            vec![
                ("Whisper.mel_bins", u64::from(*mel_bins)),
                ("Whisper.frames_per_window", u64::from(*frames_per_window)),
                ("Whisper.stack", u64::from(*stack)),
            ]
        }
    };
    match sizes.iter().find(|(_, x)| *x == 0) {
        Some((name, _)) => Err(zero(&format!("encoder.kind.{name}"))),
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
) -> Result<Vec<(&'static str, u64)>, ModelError> {
    if image_size < patch {
        return Err(rule(
            "encoder.kind.TiledVit.image_size",
            "must be ≥ `patch`",
        ));
    }
    if patch > 0
        && pixel_shuffle > 0
        && (!image_size.is_multiple_of(patch)
            || !(image_size / patch).is_multiple_of(pixel_shuffle))
    {
        return Err(ModelError::Tile {
            image_size,
            patch,
            pixel_shuffle,
        });
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
        return Err(rule(
            "encoder.kind.TiledVit.tiling",
            "needs 1 ≤ `min_tiles` ≤ `max_tiles` ≤ 64",
        ));
    }
    check_projector("TiledVit", projector)?;
    Ok(vec![
        ("TiledVit.patch", u64::from(patch)),
        ("TiledVit.pixel_shuffle", u64::from(pixel_shuffle)),
    ])
}

/// A projector chain of `family`: at least two widths (one linear layer), none 0.
fn check_projector(family: &'static str, widths: &[u32]) -> Result<(), ModelError> {
    if widths.len() < 2 || widths.contains(&0) {
        return Err(ModelError::Projector {
            family,
            widths: widths.to_vec(),
        });
    }
    Ok(())
}
