//! Self-attention over flat, variable-length token segments, and rotary embeddings.
//!
//! Encoders here work on a *flat* token sequence `[N, d]` (all items of a micro-batch
//! concatenated) split into [`Segments`]: attention never crosses a segment boundary.
//! One mechanism covers CLIP tiles, Qwen windows and temporal slices, Whisper windows,
//! and batching items of different sizes. Segments of unequal length are packed into a
//! padded `[S, L_max, ·]` block with a key-padding bias.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use super::tp::{allowed_tp, check_rank, columns, offset, rows, scaled, share, TpError};

/// Large negative score added to masked keys (finite, so a row never becomes NaN).
pub(crate) const MASKED: f32 = -1.0e9;

/// Lengths of consecutive, non-overlapping segments of a flat token sequence.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Segments {
    lens: Vec<usize>,
}

impl Segments {
    /// Segments of the given lengths, in order; zero lengths are dropped.
    pub fn new(lens: impl IntoIterator<Item = usize>) -> Self {
        Segments {
            lens: lens.into_iter().filter(|&l| l > 0).collect(),
        }
    }

    /// `count` segments of `len` tokens each.
    pub fn uniform(count: usize, len: usize) -> Self {
        Segments::new(std::iter::repeat_n(len, count))
    }

    /// This followed by `other`.
    pub fn concat(mut self, other: &Segments) -> Self {
        self.lens.extend_from_slice(&other.lens);
        self
    }

    /// Segment lengths in tokens.
    pub fn lens(&self) -> &[usize] {
        &self.lens
    }

    /// Total tokens `N`.
    pub fn total(&self) -> usize {
        self.lens.iter().sum()
    }

    /// Longest segment.
    pub fn max_len(&self) -> usize {
        self.lens.iter().copied().max().unwrap_or(0)
    }

    fn is_uniform(&self) -> bool {
        self.lens.windows(2).all(|w| w[0] == w[1])
    }
}

/// Index tensor from host indices.
pub(crate) fn index_tensor<B: Backend>(idx: &[usize], device: &B::Device) -> Tensor<B, 1, Int> {
    let v: Vec<i64> = idx.iter().map(|&i| i as i64).collect();
    Tensor::from_data(TensorData::new(v, [idx.len()]), device)
}

/// Float tensor of rank `D` from host values in row-major order.
pub(crate) fn float_tensor<B: Backend, const D: usize>(
    values: Vec<f32>,
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// How a flat `[N, ·]` sequence maps onto a padded `[S, L, ·]` block.
struct Packing<B: Backend> {
    segments: usize,
    len: usize,
    /// `None` when all segments have equal length (a plain reshape).
    padded: Option<PaddedIndex<B>>,
}

struct PaddedIndex<B: Backend> {
    /// `[S*L]`: row of the zero-extended `[N+1, ·]` input for each packed slot.
    gather: Tensor<B, 1, Int>,
    /// `[N]`: packed slot of each token.
    scatter: Tensor<B, 1, Int>,
    /// `[S, 1, 1, L]`: 0 for real keys, [`MASKED`] for padding.
    key_bias: Tensor<B, 4>,
}

impl<B: Backend> Packing<B> {
    fn new(seg: &Segments, device: &B::Device) -> Self {
        let s = seg.lens().len();
        let l = seg.max_len();
        if seg.is_uniform() {
            return Packing {
                segments: s,
                len: l,
                padded: None,
            };
        }
        let n = seg.total();
        let mut gather = vec![n; s * l];
        let mut scatter = Vec::with_capacity(n);
        let mut bias = vec![MASKED; s * l];
        let mut tok = 0;
        for (i, &len) in seg.lens().iter().enumerate() {
            for j in 0..len {
                gather[i * l + j] = tok;
                scatter.push(i * l + j);
                bias[i * l + j] = 0.0;
                tok += 1;
            }
        }
        Packing {
            segments: s,
            len: l,
            padded: Some(PaddedIndex {
                gather: index_tensor(&gather, device),
                scatter: index_tensor(&scatter, device),
                key_bias: float_tensor(bias, [s, 1, 1, l], device),
            }),
        }
    }

    /// `[N, w]` -> `[S, L, w]`.
    fn pack(&self, x: Tensor<B, 2>) -> Tensor<B, 3> {
        let [_, w] = x.dims();
        match &self.padded {
            None => x.reshape([self.segments, self.len, w]),
            Some(p) => {
                let zero = Tensor::zeros([1, w], &x.device());
                Tensor::cat(vec![x, zero], 0)
                    .select(0, p.gather.clone())
                    .reshape([self.segments, self.len, w])
            }
        }
    }

    /// `[S, L, w]` -> `[N, w]`.
    fn unpack(&self, x: Tensor<B, 3>) -> Tensor<B, 2> {
        let [s, l, w] = x.dims();
        let flat = x.reshape([s * l, w]);
        match &self.padded {
            None => flat,
            Some(p) => flat.select(0, p.scatter.clone()),
        }
    }
}

/// Per-token rotary angles: `cos` and `sin` of shape `[N, head_dim/2]` (one row per
/// token, in the order of the flat sequence).
#[derive(Clone, Debug)]
pub struct RopeAngles<B: Backend> {
    /// `[N, head_dim/2]`.
    pub cos: Tensor<B, 2>,
    /// `[N, head_dim/2]`.
    pub sin: Tensor<B, 2>,
}

impl<B: Backend> RopeAngles<B> {
    /// 1-D RoPE (RoFormer, arXiv:2104.09864): angle `pos * theta^(-2i/head_dim)` for
    /// frequency `i < head_dim/2`.
    pub fn positions_1d(
        positions: &[usize],
        head_dim: usize,
        theta: f64,
        device: &B::Device,
    ) -> Self {
        let half = head_dim / 2;
        let inv: Vec<f64> = (0..half)
            .map(|i| theta.powf(-2.0 * i as f64 / head_dim as f64))
            .collect();
        Self::from_fn(positions.len(), half, device, |n, i| {
            positions[n] as f64 * inv[i]
        })
    }

    /// 2-D RoPE as in the Qwen2-VL vision tower: the first half of the frequencies
    /// rotate by the token's row, the second half by its column; frequencies
    /// `theta^(-2i/(head_dim/2))`, `i < head_dim/4`.
    pub fn positions_2d(
        rows_cols: &[(usize, usize)],
        head_dim: usize,
        theta: f64,
        device: &B::Device,
    ) -> Self {
        let half = head_dim / 2;
        let quarter = half / 2;
        let inv: Vec<f64> = (0..quarter.max(1))
            .map(|i| theta.powf(-2.0 * i as f64 / half as f64))
            .collect();
        Self::from_fn(rows_cols.len(), half, device, |n, i| {
            let (r, c) = rows_cols[n];
            if i < quarter {
                r as f64 * inv[i]
            } else {
                c as f64 * inv[(i - quarter).min(inv.len() - 1)]
            }
        })
    }

    fn from_fn(
        n: usize,
        half: usize,
        device: &B::Device,
        angle: impl Fn(usize, usize) -> f64,
    ) -> Self {
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for t in 0..n {
            for i in 0..half {
                let a = angle(t, i);
                cos.push(a.cos() as f32);
                sin.push(a.sin() as f32);
            }
        }
        RopeAngles {
            cos: float_tensor(cos, [n, half], device),
            sin: float_tensor(sin, [n, half], device),
        }
    }

    /// Rows `idx` of these angles.
    pub fn select(&self, idx: Tensor<B, 1, Int>) -> Self {
        RopeAngles {
            cos: self.cos.clone().select(0, idx.clone()),
            sin: self.sin.clone().select(0, idx),
        }
    }
}

/// Rotate-half RoPE on `x` of shape `[N, heads, head_dim]` with angles `[N, head_dim/2]`.
pub(crate) fn apply_rope<B: Backend>(x: Tensor<B, 3>, r: &RopeAngles<B>) -> Tensor<B, 3> {
    let [n, h, d] = x.dims();
    let half = d / 2;
    let cos = r.cos.clone().reshape([n, 1, half]);
    let sin = r.sin.clone().reshape([n, 1, half]);
    let x1 = x.clone().narrow(2, 0, half);
    let x2 = x.narrow(2, half, half);
    let out = Tensor::cat(
        vec![
            x1.clone() * cos.clone() - x2.clone() * sin.clone(),
            x2 * cos + x1 * sin,
        ],
        2,
    );
    debug_assert_eq!(out.dims(), [n, h, d]);
    out
}

/// Configuration of [`SelfAttention`].
#[derive(Config, Debug)]
pub struct SelfAttentionConfig {
    /// Model width `d` (input and output features).
    pub d_model: usize,
    /// Attention heads; `d_model` must be a multiple.
    pub n_heads: usize,
    /// Whether the projections carry biases (CLIP, Whisper: yes).
    #[config(default = true)]
    pub bias: bool,
}

impl SelfAttentionConfig {
    /// A randomly initialised [`SelfAttention`] on `device`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> SelfAttention<B> {
        SelfAttention {
            qkv: LinearConfig::new(self.d_model, 3 * self.d_model)
                .with_bias(self.bias)
                .init(device),
            out: LinearConfig::new(self.d_model, self.d_model)
                .with_bias(self.bias)
                .init(device),
            n_heads: self.n_heads,
            head_dim: self.d_model / self.n_heads,
        }
    }
}

/// Bidirectional multi-head self-attention within segments (encoders).
#[derive(Module, Debug)]
pub struct SelfAttention<B: Backend> {
    qkv: Linear<B>,
    out: Linear<B>,
    n_heads: usize,
    head_dim: usize,
}

impl<B: Backend> SelfAttention<B> {
    /// Attention of each token over the tokens of its own segment.
    ///
    /// # Shapes
    /// * `x`: `[N, d]`, `N = seg.total()`
    /// * `rope`: optional angles `[N, head_dim/2]`
    /// * output: `[N, d]`
    pub fn forward(
        &self,
        x: Tensor<B, 2>,
        seg: &Segments,
        rope: Option<&RopeAngles<B>>,
    ) -> Tensor<B, 2> {
        let [n, _] = x.dims();
        let (h, hd) = (self.n_heads, self.head_dim);
        // this rank's heads' width (the model width at TP 1)
        let d = h * hd;
        let qkv = self.qkv.forward(x).reshape([n, 3, h, hd]);
        let mut q = qkv.clone().narrow(1, 0, 1).reshape([n, h, hd]);
        let mut k = qkv.clone().narrow(1, 1, 1).reshape([n, h, hd]);
        let v = qkv.narrow(1, 2, 1).reshape([n, h, hd]);
        if let Some(r) = rope {
            q = apply_rope(q, r);
            k = apply_rope(k, r);
        }
        let pack = Packing::new(seg, &v.device());
        let (s, l) = (pack.segments, pack.len);
        let heads = |t: Tensor<B, 3>| {
            pack.pack(t.reshape([n, d]))
                .reshape([s, l, h, hd])
                .swap_dims(1, 2)
        };
        let (q, k, v) = (heads(q), heads(k), heads(v));
        let mut scores = q
            .matmul(k.swap_dims(2, 3))
            .mul_scalar(1.0 / (hd as f64).sqrt());
        if let Some(p) = &pack.padded {
            scores = scores + p.key_bias.clone();
        }
        let ctx = softmax(scores, 3)
            .matmul(v)
            .swap_dims(1, 2)
            .reshape([s, l, d]);
        self.out.forward(pack.unpack(ctx))
    }

    /// Rank `rank`'s shard of `tp` (see [`super::tp`]): the heads
    /// `rank*h/tp ..` of the fused QKV projection by columns, the output
    /// projection by rows (bias on rank 0). Its output is a partial sum.
    ///
    /// Errors: `tp` does not divide the heads, or `rank ≥ tp`.
    pub fn shard(&self, rank: usize, tp: usize) -> Result<SelfAttention<B>, TpError> {
        check_rank(rank, tp)?;
        let (h, hd) = (self.n_heads, self.head_dim);
        if !h.is_multiple_of(tp) {
            return Err(TpError::Indivisible {
                tp,
                what: "encoder heads",
                count: h,
                allowed: allowed_tp(h, h, &[]),
            });
        }
        let mine = scaled(share(rank, tp, h), hd);
        Ok(SelfAttention {
            qkv: columns(
                &self.qkv,
                &[
                    mine.clone(),
                    offset(mine.clone(), h * hd),
                    offset(mine.clone(), 2 * h * hd),
                ],
            ),
            out: rows(&self.out, mine, rank),
            n_heads: h / tp,
            head_dim: hd,
        })
    }
}
