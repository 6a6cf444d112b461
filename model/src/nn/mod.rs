//! burn modules of the MLLMs (feature `nn`): the encoders, the projector and a
//! decoder LM with an external KV cache, built from a [`ModelArch`] so the real
//! executor runs the same shapes the cost model accounts for.
//!
//! * [`vit`]: CLIP-style ViT with optional window attention; LLaVA-NeXT anyres path.
//! * [`qwen_vit`]: Qwen2.5-VL style video/image tower (temporal patches, 2-D RoPE,
//!   window + full attention, 2x2 merger).
//! * [`whisper`]: Whisper-style audio encoder + Ultravox stacking projector.
//! * [`lm`]: decoder LM (RMSNorm, RoPE, GQA, SwiGLU) taking input embeddings.
//! * [`tp`]: tensor parallelism: how weights split across ranks, and the
//!   all-reduce a rank's forward takes.
//! * [`moe`]: the mixture-of-experts feed-forward layer (router, top-k experts,
//!   shared experts) of an MoE LLM's layers.
//!
//! Weights are random (seeded by the caller through `B::seed`): timing does not depend
//! on weight values. All tensors are f32 on the backend's default float type.
//!
//! ```
//! use burn::backend::NdArray;
//! use easerve_model::nn::MultimodalModel;
//! use easerve_model::ModelArch;
//! let arch = ModelArch::preset("tiny-image").unwrap();
//! let model = MultimodalModel::<NdArray>::from_arch(&arch, &Default::default()).unwrap();
//! assert_eq!(model.lm.d_model(), 256);
//! ```

pub mod attention;
pub mod blocks;
pub mod lm;
pub mod moe;
pub mod projector;
pub mod qwen_vit;
pub mod tp;
pub mod vit;
pub mod whisper;

use burn::module::Module;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use crate::arch::{EncoderKind, ModelArch};
pub use attention::{RopeAngles, Segments};
pub use lm::{DecoderLm, DecoderLmConfig, FeedForward, KvCache, KV_BLOCK};
pub use moe::{Moe, MoeConfig};
pub use projector::{Projector, ProjectorAct, ProjectorConfig};
pub use qwen_vit::{QwenPatches, QwenVision, QwenVisionConfig};
pub use tp::{AllReduce, LocalGroup, LocalRank, Solo, TpError};
pub use vit::{AnyresImage, AnyresVision, AnyresVisionConfig, Vit, VitConfig};
pub use whisper::{AudioClip, WhisperAudio, WhisperAudioConfig};

/// RoPE base of the LM: Llama-2's 10000 (the tiny presets); real presets use their
/// checkpoint's `rope_theta` (Qwen2.5: 1e6, Yi-34B: 5e6, Gemma-3: 1e6).
fn rope_theta(arch: &ModelArch) -> f64 {
    match arch.name.as_str() {
        "qwen2.5-vl-32b" | "ultravox-v0.6-27b" => 1.0e6,
        "llava-v1.6-34b" => 5.0e6,
        _ => 10_000.0,
    }
}

/// The encoder of a model, by family.
#[derive(Module, Debug)]
pub struct Encoders<B: Backend> {
    /// LLaVA-NeXT anyres image path.
    pub anyres: Option<AnyresVision<B>>,
    /// Qwen2.5-VL image/video path.
    pub qwen: Option<QwenVision<B>>,
    /// Whisper + Ultravox audio path.
    pub whisper: Option<WhisperAudio<B>>,
}

/// One multimodal item ready for its encoder.
#[derive(Clone, Debug)]
pub enum EncoderItem<B: Backend> {
    /// An image for the anyres path.
    Anyres(AnyresImage<B>),
    /// An image or video for the Qwen path.
    Qwen(QwenPatches<B>),
    /// An audio clip for the Whisper path.
    Audio(AudioClip<B>),
}

/// Why a model or an input does not fit.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum NnError {
    /// The item's family does not match the model's encoder.
    #[error("model {model} cannot encode a {kind} item")]
    WrongEncoder {
        /// Model name.
        model: String,
        /// `"anyres image"`, `"qwen patches"` or `"audio"`.
        kind: &'static str,
    },
    /// A shape the modules cannot be built with.
    #[error("model {model}: {message}")]
    BadShape {
        /// Model name.
        model: String,
        /// What is wrong.
        message: String,
    },
}

/// An MLLM: optional encoder (+ projector) and the decoder LM.
#[derive(Module, Debug)]
pub struct MultimodalModel<B: Backend> {
    /// The multimodal encoder (all `None` for a text-only model).
    pub encoders: Encoders<B>,
    /// The decoder LM.
    pub lm: DecoderLm<B>,
    name: String,
}

impl<B: Backend> MultimodalModel<B> {
    /// Build the modules for `arch` with random weights on `device` (seed the
    /// backend with `B::seed` first for reproducible weights).
    ///
    /// Projector widths follow the checkpoints' structure: LLaVA `mlp2x_gelu`
    /// `(d_vit -> d_llm -> d_llm)`, Qwen merger `(4 d_vit -> 4 d_vit -> d_llm)`,
    /// Ultravox `(stack*d -> hidden -> SwiGLU -> d_llm)` with hidden solved from
    /// `projector_params`.
    ///
    /// Errors: heads not dividing the width, zero layers or widths -> [`NnError::BadShape`].
    pub fn from_arch(arch: &ModelArch, device: &B::Device) -> Result<Self, NnError> {
        let bad = |m: String| NnError::BadShape {
            model: arch.name.clone(),
            message: m,
        };
        let l = &arch.llm;
        if l.heads == 0
            || l.kv_heads == 0
            || !l.heads.is_multiple_of(l.kv_heads)
            || !l.head_dim.is_multiple_of(2)
        {
            return Err(bad(format!(
                "LLM heads {} must be a positive multiple of KV heads {} and head_dim {} even",
                l.heads, l.kv_heads, l.head_dim
            )));
        }
        let d_llm = l.hidden as usize;
        let mut encoders = Encoders {
            anyres: None,
            qwen: None,
            whisper: None,
        };
        if let Some(e) = &arch.encoder {
            let (d, heads) = (e.hidden as usize, e.heads as usize);
            if heads == 0
                || !d.is_multiple_of(heads)
                || !(d / heads).is_multiple_of(2)
                || e.layers == 0
            {
                return Err(bad(format!(
                    "encoder width {d} must split into {heads} heads of even width, with ≥ 1 layer"
                )));
            }
            let (layers, ff) = (e.layers as usize, e.ffn as usize);
            match &e.kind {
                EncoderKind::ClipAnyres {
                    image_size, patch, ..
                } => {
                    let vit =
                        VitConfig::new(*image_size as usize, *patch as usize, d, heads, layers, ff);
                    let proj = ProjectorConfig::new(d, d_llm, d_llm);
                    encoders.anyres = Some(AnyresVisionConfig::new(vit, proj).init(device));
                }
                EncoderKind::QwenVit {
                    patch,
                    temporal_patch,
                    spatial_merge,
                    window_px,
                    fullatt_every,
                    ..
                } => {
                    if !(d / heads).is_multiple_of(4) {
                        return Err(bad(format!(
                            "2-D RoPE needs an encoder head width divisible by 4, got {}",
                            d / heads
                        )));
                    }
                    let cfg = QwenVisionConfig::new(
                        *patch as usize,
                        *temporal_patch as usize,
                        *spatial_merge as usize,
                        (*window_px / (*patch).max(1)) as usize,
                        *fullatt_every as usize,
                        d,
                        heads,
                        layers,
                        ff,
                        d_llm,
                    );
                    encoders.qwen = Some(cfg.init(device));
                }
                EncoderKind::Siglip { .. } => {
                    return Err(bad(
                        "the SigLIP encoder family (Gemma 3) has no burn module yet: the simulator prices it, the executor cannot run it".into(),
                    ));
                }
                EncoderKind::TiledVit { .. } => {
                    return Err(bad(
                        "the tiled ViT encoder family (InternVL, Llama 4) has no burn module yet: the simulator prices it, the executor cannot run it".into(),
                    ));
                }
                EncoderKind::OmniAudio { .. } => {
                    return Err(bad(
                        "the Qwen3-Omni audio encoder family has no burn module yet: the simulator prices it, the executor cannot run it".into(),
                    ));
                }
                EncoderKind::Whisper {
                    mel_bins,
                    frames_per_window,
                    stack,
                    ..
                } => {
                    let stacked = *stack as usize * d;
                    // projector_params = stacked*h + (h/2)*d_llm  ->  h.
                    let h = (e.projector_params as f64 / (stacked as f64 + d_llm as f64 / 2.0))
                        .round() as usize;
                    let h = (h.max(2) / 2) * 2;
                    let cfg = WhisperAudioConfig::new(
                        *mel_bins as usize,
                        *frames_per_window as usize,
                        *stack as usize,
                        d,
                        heads,
                        layers,
                        ff,
                        h,
                        d_llm,
                    );
                    encoders.whisper = Some(cfg.init(device));
                }
            }
        }
        let lm = DecoderLmConfig::new(
            l.vocab as usize,
            d_llm,
            l.layers as usize,
            l.heads as usize,
            l.kv_heads as usize,
            l.head_dim as usize,
            l.ffn as usize,
        )
        .with_rope_theta(rope_theta(arch))
        .with_moe(l.moe.as_ref().map(|m| {
            MoeConfig::new(
                d_llm,
                m.experts as usize,
                m.top_k as usize,
                m.expert_ffn as usize,
            )
            .with_shared_experts(m.shared_experts as usize)
            .with_shared_ffn(m.shared_ffn as usize)
        }))
        .with_first_dense_layers(l.moe.as_ref().map_or(0, |m| m.first_dense_layers as usize))
        .init(device);
        Ok(MultimodalModel {
            encoders,
            lm,
            name: arch.name.clone(),
        })
    }

    /// Encode a micro-batch of items in one pass of the model's encoder.
    ///
    /// # Shapes
    /// Output `i`: `[llm_tokens_i, d_llm]`, in the order of `items`.
    ///
    /// Errors: an item of another family than the model's encoder ->
    /// [`NnError::WrongEncoder`].
    pub fn encode(&self, items: &[EncoderItem<B>]) -> Result<Vec<Tensor<B, 2>>, NnError> {
        let wrong = |kind| NnError::WrongEncoder {
            model: self.name.clone(),
            kind,
        };
        let mut anyres = Vec::new();
        let mut qwen = Vec::new();
        let mut audio = Vec::new();
        for it in items {
            match it {
                EncoderItem::Anyres(x) if self.encoders.anyres.is_some() => anyres.push(x.clone()),
                EncoderItem::Anyres(_) => return Err(wrong("anyres image")),
                EncoderItem::Qwen(x) if self.encoders.qwen.is_some() => qwen.push(x.clone()),
                EncoderItem::Qwen(_) => return Err(wrong("qwen patches")),
                EncoderItem::Audio(x) if self.encoders.whisper.is_some() => audio.push(x.clone()),
                EncoderItem::Audio(_) => return Err(wrong("audio")),
            }
        }
        // One family per model, so the outputs are already in item order.
        Ok(
            match (
                &self.encoders.anyres,
                &self.encoders.qwen,
                &self.encoders.whisper,
            ) {
                (Some(m), _, _) => m.forward(&anyres),
                (_, Some(m), _) => m.forward(&qwen),
                (_, _, Some(m)) => m.forward(&audio),
                _ => Vec::new(),
            },
        )
    }

    /// Rank `rank`'s shard of a `tp`-way tensor-parallel split for one stage
    /// (see [`tp`]): for an encode stage (`encoder`), the encoder split by
    /// heads and MLP features ([`AnyresVision::shard`]) and the LM kept whole
    /// (an encode worker does not run it); otherwise the LM split
    /// ([`DecoderLm::shard`]) and no encoder. Every rank builds the unsharded
    /// model from the same seed, then takes its shard.
    ///
    /// Errors: [`TpError`] when the split does not divide, or the model's
    /// encoder family has no split (Qwen2.5-VL and Whisper towers, TP > 1).
    pub fn shard(&self, rank: usize, tp: usize, encoder: bool) -> Result<Self, TpError> {
        if !encoder {
            return Ok(MultimodalModel {
                encoders: Encoders {
                    anyres: None,
                    qwen: None,
                    whisper: None,
                },
                lm: self.lm.shard(rank, tp)?,
                name: self.name.clone(),
            });
        }
        tp::check_rank(rank, tp)?;
        tp::materialize(self);
        let e = &self.encoders;
        if tp > 1 && (e.qwen.is_some() || e.whisper.is_some()) {
            return Err(TpError::Unsupported(
                "the Qwen2.5-VL and Whisper encoder towers",
            ));
        }
        Ok(MultimodalModel {
            encoders: Encoders {
                anyres: e.anyres.as_ref().map(|a| a.shard(rank, tp)).transpose()?,
                qwen: e.qwen.clone(),
                whisper: e.whisper.clone(),
            },
            lm: self.lm.clone(),
            name: self.name.clone(),
        })
    }

    /// [`MultimodalModel::encode`] on one rank of a tensor-parallel group
    /// (this a [`MultimodalModel::shard`] for the encode stage, `reduce` its
    /// group).
    ///
    /// # Shapes
    /// As [`MultimodalModel::encode`].
    ///
    /// # Errors
    /// `Err(Ok(_))`: as [`MultimodalModel::encode`]; `Err(Err(_))`: an
    /// all-reduce failed.
    #[allow(clippy::type_complexity)]
    pub fn encode_with<R: AllReduce<B>>(
        &self,
        items: &[EncoderItem<B>],
        reduce: &R,
    ) -> Result<Vec<Tensor<B, 2>>, Result<NnError, R::Error>> {
        if reduce.world() <= 1 {
            return self.encode(items).map_err(Ok);
        }
        let images = items
            .iter()
            .map(|it| match it {
                EncoderItem::Anyres(x) => Ok(x.clone()),
                _ => Err(NnError::WrongEncoder {
                    model: self.name.clone(),
                    kind: "non-anyres item at TP > 1",
                }),
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(Ok)?;
        match &self.encoders.anyres {
            Some(m) => m.forward_with(&images, reduce).map_err(Err),
            None => Err(Ok(NnError::WrongEncoder {
                model: self.name.clone(),
                kind: "anyres image",
            })),
        }
    }

    /// Model name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tp_tests;
