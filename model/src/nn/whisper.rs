//! Whisper-style audio encoder with the Ultravox stacking projector.

use burn::config::Config;
use burn::module::Module;
use burn::nn::conv::{Conv1d, Conv1dConfig};
use burn::nn::PaddingConfig1d;
use burn::tensor::activation::gelu;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::attention::{float_tensor, Segments};
use super::blocks::{EncoderBlock, EncoderBlockConfig, Norm, NormConfig, NormKind};
use super::projector::{Projector, ProjectorAct, ProjectorConfig};

/// Configuration of [`WhisperAudio`].
#[derive(Config, Debug)]
pub struct WhisperAudioConfig {
    /// Log-mel bins (`num_mel_bins`: 80 or 128).
    pub mel_bins: usize,
    /// Encoder frames per window after the stride-2 convolution (`max_source_positions`
    /// 1500 for 30 s); the input has twice as many mel frames.
    pub frames_per_window: usize,
    /// Frames stacked into one LLM token (Ultravox `stack_factor` 8).
    pub stack: usize,
    /// Model width `d`.
    pub d_model: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// Transformer blocks.
    pub n_layers: usize,
    /// MLP hidden width.
    pub d_ff: usize,
    /// Projector hidden width (before SwiGLU halves it).
    pub d_proj_hidden: usize,
    /// The LLM's embedding width.
    pub d_llm: usize,
}

impl WhisperAudioConfig {
    /// A randomly initialised [`WhisperAudio`] on `device`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> WhisperAudio<B> {
        let d = self.d_model;
        WhisperAudio {
            conv1: Conv1dConfig::new(self.mel_bins, d, 3)
                .with_padding(PaddingConfig1d::Explicit(1, 1))
                .init(device),
            conv2: Conv1dConfig::new(d, d, 3)
                .with_stride(2)
                .with_padding(PaddingConfig1d::Explicit(1, 1))
                .init(device),
            pos: sinusoids(self.frames_per_window, d, device),
            blocks: (0..self.n_layers)
                .map(|_| EncoderBlockConfig::new(d, self.n_heads, self.d_ff).init(device))
                .collect(),
            ln_post: NormConfig::new(d, NormKind::Layer).init(device),
            projector: ProjectorConfig::new(self.stack * d, self.d_proj_hidden, self.d_llm)
                .with_act(ProjectorAct::SwiGlu)
                .with_pre_norm(true)
                .init(device),
            stack: self.stack,
        }
    }
}

/// Whisper's fixed sinusoidal positions (`sinusoids(length, channels)` in the
/// reference encoder: log-spaced timescales up to 10000, sin then cos halves).
fn sinusoids<B: Backend>(len: usize, d: usize, device: &B::Device) -> Tensor<B, 2> {
    let half = d / 2;
    let inc = (10_000f64).ln() / (half.max(2) - 1) as f64;
    let mut v = Vec::with_capacity(len * d);
    for t in 0..len {
        let row: Vec<f64> = (0..half)
            .map(|i| t as f64 * (-inc * i as f64).exp())
            .collect();
        v.extend(row.iter().map(|a| a.sin() as f32));
        v.extend(row.iter().map(|a| a.cos() as f32));
        v.extend(std::iter::repeat_n(0.0, d - 2 * half));
    }
    float_tensor(v, [len, d], device)
}

/// One audio clip prepared for the encoder.
#[derive(Clone, Debug)]
pub struct AudioClip<B: Backend> {
    /// `[windows, mel_bins, 2*frames_per_window]`: log-mel spectrogram, zero-padded
    /// (Whisper pads with silence) to whole windows.
    pub mel: Tensor<B, 3>,
    /// LLM tokens of the clip (`ModelArch::audio_tokens(..).llm_tokens`): the first
    /// `llm_tokens * stack` encoder frames are kept (zero-padded if beyond the windows).
    pub llm_tokens: usize,
}

/// Whisper encoder (two conv1d + GELU, sinusoidal positions, pre-norm blocks within
/// each window, final LayerNorm) and the Ultravox projector over stacked frames.
#[derive(Module, Debug)]
pub struct WhisperAudio<B: Backend> {
    conv1: Conv1d<B>,
    conv2: Conv1d<B>,
    pos: Tensor<B, 2>,
    blocks: Vec<EncoderBlock<B>>,
    ln_post: Norm<B>,
    projector: Projector<B>,
    stack: usize,
}

impl<B: Backend> WhisperAudio<B> {
    /// Encode a micro-batch of clips in one pass (all windows together).
    ///
    /// # Shapes
    /// * clip `i`: see [`AudioClip`]
    /// * output `i`: `[llm_tokens_i, d_llm]`
    pub fn forward(&self, clips: &[AudioClip<B>]) -> Vec<Tensor<B, 2>> {
        if clips.is_empty() {
            return Vec::new();
        }
        let windows: Vec<usize> = clips.iter().map(|c| c.mel.dims()[0]).collect();
        let mel = Tensor::cat(clips.iter().map(|c| c.mel.clone()).collect(), 0);
        let x = gelu(self.conv2.forward(gelu(self.conv1.forward(mel))));
        let [w, d, f] = x.dims();
        let x = x.swap_dims(1, 2) + self.pos.clone().reshape([1, f, d]);
        let mut x = x.reshape([w * f, d]);
        let seg = Segments::uniform(w, f);
        for block in &self.blocks {
            x = block.forward(x, &seg, None);
        }
        let x = self.ln_post.forward(x);
        let mut out = Vec::with_capacity(clips.len());
        let mut start = 0;
        for (clip, &nw) in clips.iter().zip(&windows) {
            let frames = nw * f;
            let want = clip.llm_tokens * self.stack;
            let mut h = x.clone().narrow(0, start * f, frames.min(want));
            if want > frames {
                h = Tensor::cat(vec![h, Tensor::zeros([want - frames, d], &x.device())], 0);
            }
            start += nw;
            out.push(
                self.projector
                    .forward(h.reshape([clip.llm_tokens, self.stack * d])),
            );
        }
        out
    }
}
