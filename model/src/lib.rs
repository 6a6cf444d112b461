//! MLLM architectures for easerve: presets with real shapes, the token count each
//! multimodal item adds, and FLOP / HBM-byte accounting for the three stages.
//!
//! This crate does **not** time anything: it says how much *work* a stage pass is
//! ([`Work`]: FLOPs and bytes, unsharded, TP = 1). Turning work into seconds on a GPU
//! is `easerve-calib`'s job (roofline + fitted efficiencies).
//!
//! Reading guide:
//! 1. [`arch`]: the architecture types ([`ModelArch`], [`EncoderArch`], [`LlmArch`]).
//! 2. [`presets`]: the real-size and tiny presets, each citing its checkpoint's `config.json`.
//! 3. [`tokens`]: how an image / video / audio clip becomes encoder and LLM tokens.
//! 4. [`work`]: FLOPs and bytes of an encode pass, a prefill pass, a decode step.
//! 5. [`import`]: a model file from a Hugging Face `config.json`.
//! 6. `nn` (feature `nn`): burn modules with these shapes, for real execution.
//!
//! ```
//! use easerve_model::ModelArch;
//! let m = ModelArch::preset("llava-v1.6-34b").unwrap();
//! let t = m.image_tokens(672, 672).unwrap();
//! assert_eq!(t.llm_tokens, 2928);
//! let w = m.encode_work(&[t]);
//! assert!(w.flops > 1e12);
//! ```
#![warn(missing_docs, unreachable_pub)]

pub mod arch;
pub mod import;
#[cfg(feature = "nn")]
pub mod nn;
pub mod ops;
pub mod presets;
pub mod tokens;
pub mod work;

pub use arch::{
    EncoderArch, EncoderKind, LlmArch, ModelArch, MoeArch, MoeRouting, PanAndScan, Tiling,
};
pub use ops::{AttnKind, CollectiveKind, Op, Parallel, PrefillShape};
pub use presets::hf_checkpoint;
pub use tokens::{QWEN_VIDEO_MAX_PIXELS, QWEN_VIDEO_MIN_PIXELS};
pub use work::Work;

/// Tokens of one multimodal item (one image, one sampled video, one audio clip).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct ItemTokens {
    /// Tokens the encoder's transformer processes (incl. CLS etc., all tiles / windows).
    pub encoder_tokens: u64,
    /// Embeddings handed to the LLM (after merge/stack/projector), i.e. the LLM prompt
    /// tokens this item adds.
    pub llm_tokens: u64,
    /// Attention span within the encoder: the sequence length each attention op sees
    /// (tile length for CLIP tiles, 1500 for a whisper window, full image tokens (per
    /// temporal patch) for Qwen full-attention layers; window layers are handled inside
    /// [`ModelArch::encode_work`]).
    pub attn_span: u64,
}

/// Why a token count could not be computed.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum ModelError {
    /// The model has no encoder for this modality (e.g. audio on LLaVA).
    #[error("model {model} has no {modality} encoder")]
    UnsupportedModality {
        /// Model name ([`ModelArch::name`]).
        model: String,
        /// `"image"`, `"video"` or `"audio"`.
        modality: &'static str,
    },
    /// Input outside the allowed range: zero-sized image, zero frames, non-positive
    /// or non-finite seconds, extreme aspect ratio.
    #[error("{0}")]
    InvalidInput(String),
}
