//! Decoder-only language model (Llama / Qwen2 style): RMSNorm, RoPE, grouped-query
//! attention, SwiGLU; the KV cache lives outside the module.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use super::attention::{apply_rope, float_tensor, index_tensor, RopeAngles, MASKED};
use super::blocks::{Mlp, MlpConfig, Norm, NormConfig, NormKind};

/// Configuration of [`DecoderLm`].
#[derive(Config, Debug)]
pub struct DecoderLmConfig {
    /// Vocabulary size.
    pub vocab: usize,
    /// Hidden width `d`.
    pub d_model: usize,
    /// Decoder layers.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention; `n_heads` must be a multiple).
    pub n_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// SwiGLU hidden width.
    pub d_ff: usize,
    /// RoPE base (Llama 2: 10000; Qwen2.5: 1000000).
    #[config(default = 10000.0)]
    pub rope_theta: f64,
}

impl DecoderLmConfig {
    /// A randomly initialised [`DecoderLm`] on `device`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> DecoderLm<B> {
        DecoderLm {
            embed: EmbeddingConfig::new(self.vocab, self.d_model).init(device),
            layers: (0..self.n_layers)
                .map(|_| DecoderLayer {
                    norm1: NormConfig::new(self.d_model, NormKind::Rms).init(device),
                    q: LinearConfig::new(self.d_model, self.n_heads * self.head_dim)
                        .with_bias(false)
                        .init(device),
                    kv: LinearConfig::new(self.d_model, 2 * self.n_kv_heads * self.head_dim)
                        .with_bias(false)
                        .init(device),
                    o: LinearConfig::new(self.n_heads * self.head_dim, self.d_model)
                        .with_bias(false)
                        .init(device),
                    norm2: NormConfig::new(self.d_model, NormKind::Rms).init(device),
                    mlp: MlpConfig::new(self.d_model, self.d_ff)
                        .with_gated(true)
                        .with_bias(false)
                        .init(device),
                })
                .collect(),
            norm: NormConfig::new(self.d_model, NormKind::Rms).init(device),
            lm_head: LinearConfig::new(self.d_model, self.vocab)
                .with_bias(false)
                .init(device),
            n_heads: self.n_heads,
            n_kv_heads: self.n_kv_heads,
            head_dim: self.head_dim,
            rope_theta: self.rope_theta,
        }
    }
}

/// The KV cache of one sequence: per layer, keys and values of every position so far.
#[derive(Clone, Debug)]
pub struct KvCache<B: Backend> {
    /// Per layer `[n_kv_heads, len, head_dim]`.
    pub k: Vec<Tensor<B, 3>>,
    /// Per layer `[n_kv_heads, len, head_dim]`.
    pub v: Vec<Tensor<B, 3>>,
    /// Positions cached.
    pub len: usize,
}

impl<B: Backend> KvCache<B> {
    /// Elements held (keys and values of every layer); bytes = elements x the
    /// backend's float size (4 for f32, 2 for BF16).
    pub fn elements(&self) -> usize {
        self.k
            .iter()
            .chain(&self.v)
            .map(|t| t.dims().iter().product::<usize>())
            .sum()
    }
}

/// One decoder layer.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    norm1: Norm<B>,
    q: Linear<B>,
    kv: Linear<B>,
    o: Linear<B>,
    norm2: Norm<B>,
    mlp: Mlp<B>,
}

/// Decoder-only LM whose forward takes input embeddings, so image / video / audio
/// embeddings and text-token embeddings mix in one sequence.
#[derive(Module, Debug)]
pub struct DecoderLm<B: Backend> {
    embed: Embedding<B>,
    layers: Vec<DecoderLayer<B>>,
    norm: Norm<B>,
    lm_head: Linear<B>,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    rope_theta: f64,
}

/// Keys and values computed by one pass: per layer `[b, n_kv_heads, L, head_dim]`.
struct NewKv<B: Backend> {
    k: Vec<Tensor<B, 4>>,
    v: Vec<Tensor<B, 4>>,
}

impl<B: Backend> DecoderLm<B> {
    /// Embeddings of text tokens.
    ///
    /// # Shapes
    /// `ids`: `n` token ids (< vocab) -> `[n, d]`.
    pub fn embed_tokens(&self, ids: &[u32], device: &B::Device) -> Tensor<B, 2> {
        let v: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(v, [1, ids.len()]), device);
        let e = self.embed.forward(ids);
        let [_, n, d] = e.dims();
        e.reshape([n, d])
    }

    /// Hidden width `d`.
    pub fn d_model(&self) -> usize {
        self.embed.weight.dims()[1]
    }

    /// Prefill a batch of sequences of different lengths in one pass (right-padded,
    /// causal + key-padding mask). Returns the logits at each sequence's last position
    /// and each sequence's KV cache.
    ///
    /// # Shapes
    /// * `seqs[i]`: `[len_i, d]` input embeddings (`len_i >= 1`)
    /// * logits: `[b, vocab]`
    ///
    /// # Panics
    /// With no sequences or an empty one (callers batch at least one token).
    pub fn prefill(&self, seqs: &[Tensor<B, 2>]) -> (Tensor<B, 2>, Vec<KvCache<B>>) {
        assert!(
            !seqs.is_empty() && seqs.iter().all(|s| s.dims()[0] > 0),
            "prefill needs at least one sequence of at least one token"
        );
        let device = seqs[0].device();
        let b = seqs.len();
        let lens: Vec<usize> = seqs.iter().map(|s| s.dims()[0]).collect();
        let l = lens.iter().copied().max().unwrap_or(0);
        let d = self.d_model();
        let padded: Vec<Tensor<B, 2>> = seqs
            .iter()
            .zip(&lens)
            .map(|(s, &n)| {
                if n < l {
                    Tensor::cat(vec![s.clone(), Tensor::zeros([l - n, d], &device)], 0)
                } else {
                    s.clone()
                }
            })
            .collect();
        let x: Tensor<B, 3> = Tensor::stack(padded, 0);
        let positions: Vec<usize> = (0..b).flat_map(|_| 0..l).collect();
        let mut bias = vec![0f32; b * l * l];
        for (i, &n) in lens.iter().enumerate() {
            for q in 0..l {
                for k in 0..l {
                    if k > q || k >= n {
                        bias[(i * l + q) * l + k] = MASKED;
                    }
                }
            }
        }
        let bias = float_tensor(bias, [b, 1, l, l], &device);
        let (h, new) = self.run(x, &positions, None, bias);
        let last: Vec<usize> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| i * l + n - 1)
            .collect();
        let h = h
            .reshape([b * l, d])
            .select(0, index_tensor(&last, &device));
        let logits = self.lm_head.forward(self.norm.forward(h));
        let caches = (0..b)
            .map(|i| {
                let take = |t: &Tensor<B, 4>| {
                    let [_, kvh, _, hd] = t.dims();
                    t.clone()
                        .narrow(0, i, 1)
                        .narrow(2, 0, lens[i])
                        .reshape([kvh, lens[i], hd])
                };
                KvCache {
                    k: new.k.iter().map(take).collect(),
                    v: new.v.iter().map(take).collect(),
                    len: lens[i],
                }
            })
            .collect();
        (logits, caches)
    }

    /// One decode step for a batch of sequences at different positions: each
    /// sequence's next input embedding attends over its own cache, and its cache grows
    /// by one position.
    ///
    /// # Shapes
    /// * `x`: `[b, d]`, `b = caches.len()`
    /// * logits: `[b, vocab]`
    pub fn decode(&self, x: Tensor<B, 2>, caches: &mut [KvCache<B>]) -> Tensor<B, 2> {
        let device = x.device();
        let [b, d] = x.dims();
        let p = caches.iter().map(|c| c.len).max().unwrap_or(0);
        let positions: Vec<usize> = caches.iter().map(|c| c.len).collect();
        let mut bias = vec![0f32; b * (p + 1)];
        for (i, c) in caches.iter().enumerate() {
            for k in c.len..p {
                bias[i * (p + 1) + k] = MASKED;
            }
        }
        let bias = float_tensor(bias, [b, 1, 1, p + 1], &device);
        let pad = |t: &Tensor<B, 3>| -> Tensor<B, 3> {
            let [kvh, n, hd] = t.dims();
            if n < p {
                Tensor::cat(vec![t.clone(), Tensor::zeros([kvh, p - n, hd], &device)], 1)
            } else {
                t.clone()
            }
        };
        let past: Vec<(Tensor<B, 4>, Tensor<B, 4>)> = (0..self.layers.len())
            .map(|l| {
                let k = Tensor::stack(caches.iter().map(|c| pad(&c.k[l])).collect(), 0);
                let v = Tensor::stack(caches.iter().map(|c| pad(&c.v[l])).collect(), 0);
                (k, v)
            })
            .collect();
        let (h, new) = self.run(x.reshape([b, 1, d]), &positions, Some(past), bias);
        for (i, c) in caches.iter_mut().enumerate() {
            for l in 0..self.layers.len() {
                let take = |t: &Tensor<B, 4>| {
                    let [_, kvh, _, hd] = t.dims();
                    t.clone().narrow(0, i, 1).reshape([kvh, 1, hd])
                };
                c.k[l] = Tensor::cat(vec![c.k[l].clone(), take(&new.k[l])], 1);
                c.v[l] = Tensor::cat(vec![c.v[l].clone(), take(&new.v[l])], 1);
            }
            c.len += 1;
        }
        self.lm_head.forward(self.norm.forward(h.reshape([b, d])))
    }

    /// Full causal forward over one sequence without a cache: logits at every
    /// position (the reference the cached path must match).
    ///
    /// # Shapes
    /// `x`: `[L, d]` -> `[L, vocab]`.
    pub fn forward_all(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let device = x.device();
        let [l, d] = x.dims();
        let mut bias = vec![0f32; l * l];
        for q in 0..l {
            for k in q + 1..l {
                bias[q * l + k] = MASKED;
            }
        }
        let bias = float_tensor(bias, [1, 1, l, l], &device);
        let positions: Vec<usize> = (0..l).collect();
        let (h, _) = self.run(x.reshape([1, l, d]), &positions, None, bias);
        self.lm_head.forward(self.norm.forward(h.reshape([l, d])))
    }

    /// The layers over `x` `[b, L, d]` with per-token positions (`b*L`, row-major),
    /// optional past keys/values per layer `[b, kvh, P, hd]`, and an additive
    /// attention bias `[b, 1, L, P + L]`.
    fn run(
        &self,
        x: Tensor<B, 3>,
        positions: &[usize],
        past: Option<Vec<(Tensor<B, 4>, Tensor<B, 4>)>>,
        bias: Tensor<B, 4>,
    ) -> (Tensor<B, 3>, NewKv<B>) {
        let device = x.device();
        let [b, l, d] = x.dims();
        let (h, kvh, hd) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let group = h / kvh;
        let rope = RopeAngles::positions_1d(positions, hd, self.rope_theta, &device);
        let mut new = NewKv {
            k: Vec::with_capacity(self.layers.len()),
            v: Vec::with_capacity(self.layers.len()),
        };
        let mut x = x;
        for (li, layer) in self.layers.iter().enumerate() {
            let xn = layer.norm1.forward(x.clone()).reshape([b * l, d]);
            let q = apply_rope(layer.q.forward(xn.clone()).reshape([b * l, h, hd]), &rope);
            let kv = layer.kv.forward(xn).reshape([b * l, 2, kvh, hd]);
            let k = apply_rope(kv.clone().narrow(1, 0, 1).reshape([b * l, kvh, hd]), &rope);
            let v = kv.narrow(1, 1, 1).reshape([b * l, kvh, hd]);
            let q = q.reshape([b, l, h, hd]).swap_dims(1, 2);
            let k = k.reshape([b, l, kvh, hd]).swap_dims(1, 2);
            let v = v.reshape([b, l, kvh, hd]).swap_dims(1, 2);
            new.k.push(k.clone());
            new.v.push(v.clone());
            let (k_all, v_all) = match &past {
                Some(p) => (
                    Tensor::cat(vec![p[li].0.clone(), k], 2),
                    Tensor::cat(vec![p[li].1.clone(), v], 2),
                ),
                None => (k, v),
            };
            let t = k_all.dims()[2];
            let expand = |t4: Tensor<B, 4>| -> Tensor<B, 4> {
                if group == 1 {
                    t4
                } else {
                    let t5: Tensor<B, 5> = t4.unsqueeze_dim(2);
                    t5.repeat_dim(2, group).reshape([b, h, t, hd])
                }
            };
            let scores = q
                .matmul(expand(k_all).swap_dims(2, 3))
                .mul_scalar(1.0 / (hd as f64).sqrt())
                + bias.clone();
            let ctx = softmax(scores, 3)
                .matmul(expand(v_all))
                .swap_dims(1, 2)
                .reshape([b * l, h * hd]);
            x = x + layer.o.forward(ctx).reshape([b, l, d]);
            x = x.clone() + layer.mlp.forward(layer.norm2.forward(x));
        }
        (x, new)
    }
}
