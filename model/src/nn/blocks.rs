//! Building blocks shared by the encoders: normalisation, MLP and the pre-norm block.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{LayerNorm, LayerNormConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::activation::{gelu, silu};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::attention::{RopeAngles, Segments, SelfAttention, SelfAttentionConfig};
use super::tp::{
    allowed_tp, check_rank, columns, infallible, materialize, offset, rows, share, AllReduce, Solo,
    TpError,
};

/// Which normalisation a block uses.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum NormKind {
    /// LayerNorm (CLIP, Whisper), epsilon 1e-5.
    Layer,
    /// RMSNorm (Qwen2.5-VL vision, Llama-style LMs), epsilon 1e-6.
    Rms,
}

/// Configuration of [`Norm`].
#[derive(Config, Debug)]
pub struct NormConfig {
    /// Features normalised (the last dimension).
    pub d_model: usize,
    /// LayerNorm or RMSNorm.
    pub kind: NormKind,
}

impl NormConfig {
    /// A [`Norm`] on `device` (unit scale, zero shift).
    pub fn init<B: Backend>(&self, device: &B::Device) -> Norm<B> {
        match self.kind {
            NormKind::Layer => Norm {
                layer: Some(LayerNormConfig::new(self.d_model).init(device)),
                rms: None,
            },
            NormKind::Rms => Norm {
                layer: None,
                rms: Some(
                    RmsNormConfig::new(self.d_model)
                        .with_epsilon(1e-6)
                        .init(device),
                ),
            },
        }
    }
}

/// LayerNorm or RMSNorm over the last dimension.
#[derive(Module, Debug)]
pub struct Norm<B: Backend> {
    layer: Option<LayerNorm<B>>,
    rms: Option<RmsNorm<B>>,
}

impl<B: Backend> Norm<B> {
    /// # Shapes
    /// `[..., d]` -> `[..., d]`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        match (&self.layer, &self.rms) {
            (Some(l), _) => l.forward(x),
            (None, Some(r)) => r.forward(x),
            (None, None) => x,
        }
    }
}

/// Configuration of [`Mlp`].
#[derive(Config, Debug)]
pub struct MlpConfig {
    /// Input and output width.
    pub d_model: usize,
    /// Hidden width.
    pub d_ff: usize,
    /// SwiGLU (`silu(gate) * up`, as Qwen and Llama) instead of GELU.
    #[config(default = false)]
    pub gated: bool,
    /// Whether the projections carry biases.
    #[config(default = true)]
    pub bias: bool,
}

impl MlpConfig {
    /// A randomly initialised [`Mlp`] on `device`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Mlp<B> {
        let up_width = if self.gated { 2 * self.d_ff } else { self.d_ff };
        Mlp {
            up: LinearConfig::new(self.d_model, up_width)
                .with_bias(self.bias)
                .init(device),
            down: LinearConfig::new(self.d_ff, self.d_model)
                .with_bias(self.bias)
                .init(device),
            gated: self.gated,
            d_ff: self.d_ff,
        }
    }
}

/// Feed-forward network: GELU MLP or SwiGLU (gate and up fused in one matrix).
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    up: Linear<B>,
    down: Linear<B>,
    gated: bool,
    d_ff: usize,
}

impl<B: Backend> Mlp<B> {
    /// # Shapes
    /// `[..., d_model]` -> `[..., d_model]`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let h = self.up.forward(x);
        let h = if self.gated {
            let gate = h.clone().narrow(D - 1, 0, self.d_ff);
            let up = h.narrow(D - 1, self.d_ff, self.d_ff);
            silu(gate) * up
        } else {
            gelu(h)
        };
        self.down.forward(h)
    }

    /// Hidden width (of this rank's shard, for an [`Mlp::shard`]).
    pub fn d_ff(&self) -> usize {
        self.d_ff
    }

    /// Rank `rank`'s shard of `tp` (see [`super::tp`]): the up (and gate)
    /// projection's hidden features `rank*d_ff/tp ..` by columns, the down
    /// projection's by rows (bias on rank 0). Its output is a partial sum.
    ///
    /// Errors: `tp` does not divide `d_ff`, or `rank ≥ tp`.
    pub fn shard(&self, rank: usize, tp: usize) -> Result<Mlp<B>, TpError> {
        check_rank(rank, tp)?;
        if !self.d_ff.is_multiple_of(tp) {
            return Err(TpError::Indivisible {
                tp,
                what: "MLP hidden features",
                count: self.d_ff,
                allowed: allowed_tp(self.d_ff, 1, &[]),
            });
        }
        let mine = share(rank, tp, self.d_ff);
        let up = if self.gated {
            columns(&self.up, &[mine.clone(), offset(mine.clone(), self.d_ff)])
        } else {
            columns(&self.up, std::slice::from_ref(&mine))
        };
        Ok(Mlp {
            up,
            down: rows(&self.down, mine, rank),
            gated: self.gated,
            d_ff: self.d_ff / tp,
        })
    }
}

/// Configuration of [`EncoderBlock`].
#[derive(Config, Debug)]
pub struct EncoderBlockConfig {
    /// Model width `d`.
    pub d_model: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// MLP hidden width.
    pub d_ff: usize,
    /// SwiGLU MLP instead of GELU.
    #[config(default = false)]
    pub gated: bool,
    /// Normalisation kind.
    #[config(default = "NormKind::Layer")]
    pub norm: NormKind,
}

impl EncoderBlockConfig {
    /// A randomly initialised [`EncoderBlock`] on `device`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> EncoderBlock<B> {
        let norm = NormConfig::new(self.d_model, self.norm);
        EncoderBlock {
            norm1: norm.init(device),
            attn: SelfAttentionConfig::new(self.d_model, self.n_heads).init(device),
            norm2: norm.init(device),
            mlp: MlpConfig::new(self.d_model, self.d_ff)
                .with_gated(self.gated)
                .init(device),
        }
    }
}

/// Pre-norm transformer block: `x + attn(norm(x))`, then `x + mlp(norm(x))`.
#[derive(Module, Debug)]
pub struct EncoderBlock<B: Backend> {
    norm1: Norm<B>,
    attn: SelfAttention<B>,
    norm2: Norm<B>,
    mlp: Mlp<B>,
}

impl<B: Backend> EncoderBlock<B> {
    /// # Shapes
    /// * `x`: `[N, d]` (flat tokens of all segments)
    /// * `rope`: optional angles `[N, head_dim/2]`
    /// * output: `[N, d]`
    pub fn forward(
        &self,
        x: Tensor<B, 2>,
        seg: &Segments,
        rope: Option<&RopeAngles<B>>,
    ) -> Tensor<B, 2> {
        infallible(self.forward_with(x, seg, rope, &Solo))
    }

    /// [`EncoderBlock::forward`] on one rank of a tensor-parallel group (this
    /// block an [`EncoderBlock::shard`], `reduce` its group).
    ///
    /// # Shapes
    /// As [`EncoderBlock::forward`], the same output on every rank.
    ///
    /// # Errors
    /// An all-reduce failed.
    pub fn forward_with<R: AllReduce<B>>(
        &self,
        x: Tensor<B, 2>,
        seg: &Segments,
        rope: Option<&RopeAngles<B>>,
        reduce: &R,
    ) -> Result<Tensor<B, 2>, R::Error> {
        let x = x.clone() + reduce.sum(self.attn.forward(self.norm1.forward(x), seg, rope))?;
        Ok(x.clone() + reduce.sum(self.mlp.forward(self.norm2.forward(x)))?)
    }

    /// Rank `rank`'s shard of `tp`: attention by heads and the MLP by hidden
    /// features ([`SelfAttention::shard`], [`Mlp::shard`]), norms replicated.
    ///
    /// Errors: `tp` does not divide the heads or the MLP width, or `rank ≥ tp`.
    pub fn shard(&self, rank: usize, tp: usize) -> Result<EncoderBlock<B>, TpError> {
        materialize(self);
        Ok(EncoderBlock {
            norm1: self.norm1.clone(),
            attn: self.attn.shard(rank, tp)?,
            norm2: self.norm2.clone(),
            mlp: self.mlp.shard(rank, tp)?,
        })
    }
}
