//! Decoder-only language model (Llama / Qwen2 style): RMSNorm, RoPE, grouped-query
//! attention, SwiGLU or a mixture of experts ([`super::moe`]); the KV cache lives outside the module, preallocated and
//! written in place ([`KvCache`]).

use std::ops::Range;

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use super::attention::{apply_rope, float_tensor, index_tensor, RopeAngles, MASKED};
use super::blocks::{Mlp, MlpConfig, Norm, NormConfig, NormKind};
use super::moe::{Moe, MoeConfig};
use super::tp::{
    allowed_tp, check_rank, columns, infallible, kv_heads_of, materialize, offset, rows, scaled,
    share, AllReduce, Solo, TpError,
};

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
    /// The mixture-of-experts layers (`None`: every layer's MLP is the dense
    /// SwiGLU of `d_ff`).
    #[config(default = "None")]
    pub moe: Option<MoeConfig>,
    /// Leading layers with the dense MLP when `moe` is set.
    #[config(default = 0)]
    pub first_dense_layers: usize,
}

impl DecoderLmConfig {
    /// A randomly initialised [`DecoderLm`] on `device`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> DecoderLm<B> {
        DecoderLm {
            embed: EmbeddingConfig::new(self.vocab, self.d_model).init(device),
            layers: (0..self.n_layers)
                .map(|li| DecoderLayer {
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
                    mlp: match &self.moe {
                        Some(m) if li >= self.first_dense_layers => {
                            FeedForward::Moe(m.init(device))
                        }
                        _ => FeedForward::Dense(
                            MlpConfig::new(self.d_model, self.d_ff)
                                .with_gated(true)
                                .with_bias(false)
                                .init(device),
                        ),
                    },
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

/// Positions a KV cache reserves at a time: capacities are multiples of this.
pub const KV_BLOCK: usize = 64;

/// The KV cache of one sequence, preallocated: per layer, keys and values of
/// `capacity` positions, of which the first `len` are filled. A decode step
/// writes its position in place (`slice_assign` on a buffer this cache alone
/// holds, so the cache itself is not copied) and the buffers grow by
/// doubling, in whole [`KV_BLOCK`]s, only when full. At batch 1 attention
/// reads a view of the filled positions; at batch > 1, `DecoderLm::decode`
/// stacks the batch's caches into one `[batch, n_kv_heads, P, head_dim]`
/// tensor per layer and step (P the longest filled length), a copy of the
/// batch's positions that a paged-attention kernel would not make.
#[derive(Clone, Debug)]
pub struct KvCache<B: Backend> {
    /// Per layer `[n_kv_heads, capacity, head_dim]`; positions `len..` are zeros
    /// or stale, and masked out of attention.
    pub k: Vec<Tensor<B, 3>>,
    /// Per layer `[n_kv_heads, capacity, head_dim]`, as `k`.
    pub v: Vec<Tensor<B, 3>>,
    /// Positions filled.
    pub len: usize,
}

impl<B: Backend> KvCache<B> {
    /// A cache holding `k` and `v` (per layer `[n_kv_heads, len, head_dim]`, all
    /// layers the same `len`) with room for at least `reserve` more positions
    /// before it grows.
    ///
    /// # Panics
    /// If `k` and `v` differ in layer count or the layers in shape.
    pub fn from_positions(k: Vec<Tensor<B, 3>>, v: Vec<Tensor<B, 3>>, reserve: usize) -> Self {
        assert_eq!(k.len(), v.len(), "keys and values have the same layers");
        let len = k.first().map_or(0, |t| t.dims()[1]);
        let capacity = (len + reserve.max(1)).div_ceil(KV_BLOCK) * KV_BLOCK;
        let room = |t: Tensor<B, 3>| -> Tensor<B, 3> {
            let [kvh, n, hd] = t.dims();
            assert_eq!(n, len, "every layer caches the same positions");
            Tensor::cat(
                vec![
                    t.clone(),
                    Tensor::zeros([kvh, capacity - n, hd], &t.device()),
                ],
                1,
            )
        };
        KvCache {
            k: k.into_iter().map(room).collect(),
            v: v.into_iter().map(room).collect(),
            len,
        }
    }

    /// Positions the buffers hold before they must grow.
    pub fn capacity(&self) -> usize {
        self.k.first().map_or(0, |t| t.dims()[1])
    }

    /// Make room for `additional` more positions: the buffers double (at least
    /// to the next [`KV_BLOCK`] multiple that fits), one copy of the cache
    /// amortised over the positions it makes room for.
    pub fn reserve(&mut self, additional: usize) {
        let need = self.len + additional;
        let cap = self.capacity();
        if need <= cap {
            return;
        }
        let new_cap = (2 * cap).max(need.div_ceil(KV_BLOCK) * KV_BLOCK);
        for t in self.k.iter_mut().chain(self.v.iter_mut()) {
            let [kvh, _, hd] = t.dims();
            let zeros = Tensor::zeros([kvh, new_cap - cap, hd], &t.device());
            *t = Tensor::cat(vec![t.clone(), zeros], 1);
        }
    }

    /// Layer `layer`'s filled keys `[n_kv_heads, len, head_dim]` (a view).
    pub fn keys(&self, layer: usize) -> Tensor<B, 3> {
        self.k[layer].clone().narrow(1, 0, self.len)
    }

    /// Layer `layer`'s filled values `[n_kv_heads, len, head_dim]` (a view).
    pub fn values(&self, layer: usize) -> Tensor<B, 3> {
        self.v[layer].clone().narrow(1, 0, self.len)
    }

    /// Key/value heads this cache holds.
    pub fn kv_heads(&self) -> usize {
        self.k.first().map_or(0, |t| t.dims()[0])
    }

    /// The filled positions of the key/value heads `heads` (a copy, with room
    /// for one more position).
    ///
    /// # Panics
    /// If `heads` is not within `0..kv_heads()`.
    pub fn select_heads(&self, heads: Range<usize>) -> KvCache<B> {
        let pick = |ts: &[Tensor<B, 3>]| -> Vec<Tensor<B, 3>> {
            ts.iter()
                .map(|t| {
                    t.clone()
                        .narrow(0, heads.start, heads.len())
                        .narrow(1, 0, self.len)
                })
                .collect()
        };
        KvCache::from_positions(pick(&self.k), pick(&self.v), 1)
    }

    /// One cache of the heads of `parts` in order (each part's filled
    /// positions; all parts of one sequence, so the same length and layers).
    ///
    /// # Panics
    /// With no parts, or parts of different lengths or layer counts.
    pub fn concat_heads(parts: &[KvCache<B>]) -> KvCache<B> {
        let len = parts[0].len;
        assert!(
            parts
                .iter()
                .all(|p| p.len == len && p.k.len() == parts[0].k.len()),
            "the parts of one cache hold the same positions and layers"
        );
        let join = |pick: fn(&KvCache<B>, usize) -> Tensor<B, 3>| -> Vec<Tensor<B, 3>> {
            (0..parts[0].k.len())
                .map(|l| Tensor::cat(parts.iter().map(|p| pick(p, l)).collect(), 0))
                .collect()
        };
        KvCache::from_positions(join(KvCache::keys), join(KvCache::values), 1)
    }

    /// Reshard one sequence's cache from the ranks of TP `from` (`shards[r]` rank
    /// `r`'s, as [`DecoderLm::shard`] splits KV heads) to the ranks of TP `to`,
    /// for a model of `kv_heads` KV heads: the whole cache is the heads of the
    /// distinct shards in order (a head replicated on several ranks is taken
    /// once), and rank `r` of `to` takes [`kv_heads_of`]`(r, to, kv_heads)`.
    ///
    /// # Panics
    /// If `shards.len() != from` or the shards do not cover `kv_heads` heads.
    pub fn reshard(shards: &[KvCache<B>], from: usize, to: usize, kv_heads: usize) -> Vec<Self> {
        assert_eq!(shards.len(), from, "one shard per rank");
        let distinct: Vec<KvCache<B>> = (0..from)
            .filter(|&r| {
                r == 0 || kv_heads_of(r, from, kv_heads) != kv_heads_of(r - 1, from, kv_heads)
            })
            .map(|r| shards[r].clone())
            .collect();
        let whole = KvCache::concat_heads(&distinct);
        assert_eq!(
            whole.kv_heads(),
            kv_heads,
            "the shards hold every KV head once"
        );
        (0..to)
            .map(|r| whole.select_heads(kv_heads_of(r, to, kv_heads)))
            .collect()
    }

    /// Elements of the filled positions (keys and values of every layer); bytes
    /// = elements x the backend's float size (4 for f32, 2 for BF16).
    pub fn elements(&self) -> usize {
        self.k
            .iter()
            .chain(&self.v)
            .map(|t| {
                let [kvh, _, hd] = t.dims();
                kvh * self.len * hd
            })
            .sum()
    }
}

/// Write `value` `[kvh, 1, hd]` at position `pos` of `slot` `[kvh, cap, hd]`
/// in place: `slot`'s buffer is moved out (a placeholder takes its place) so
/// the write sees the only handle to it and does not copy.
fn write_position<B: Backend>(
    slot: &mut Tensor<B, 3>,
    pos: usize,
    value: Tensor<B, 3>,
    placeholder: &Tensor<B, 3>,
) {
    let [kvh, _, hd] = value.dims();
    let buffer = std::mem::replace(slot, placeholder.clone());
    *slot = buffer.slice_assign([0..kvh, pos..pos + 1, 0..hd], value);
}

/// A decoder layer's feed-forward part: the dense SwiGLU MLP or a
/// mixture of experts.
#[derive(Module, Debug)]
pub enum FeedForward<B: Backend> {
    /// Dense SwiGLU MLP.
    Dense(Mlp<B>),
    /// Router, routed experts and shared experts.
    Moe(Moe<B>),
}

impl<B: Backend> FeedForward<B> {
    /// # Shapes
    /// `[b, L, d]` -> `[b, L, d]`.
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        match self {
            FeedForward::Dense(m) => m.forward(x),
            FeedForward::Moe(m) => {
                let [b, l, d] = x.dims();
                m.forward(x.reshape([b * l, d])).reshape([b, l, d])
            }
        }
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
    mlp: FeedForward<B>,
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

    /// Layers whose feed-forward part is a mixture of experts.
    pub fn moe_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| matches!(l.mlp, FeedForward::Moe(_)))
            .count()
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
        infallible(self.prefill_with(seqs, &Solo))
    }

    /// [`DecoderLm::prefill`] on one rank of a tensor-parallel group (this
    /// module a [`DecoderLm::shard`], `reduce` its group): the logits are the
    /// whole vocabulary's on every rank, the caches hold this rank's KV heads.
    ///
    /// # Shapes
    /// As [`DecoderLm::prefill`]; caches `[kv_heads / tp, len_i, head_dim]` per layer.
    ///
    /// # Errors
    /// An all-reduce failed.
    ///
    /// # Panics
    /// As [`DecoderLm::prefill`].
    #[allow(clippy::type_complexity)]
    pub fn prefill_with<R: AllReduce<B>>(
        &self,
        seqs: &[Tensor<B, 2>],
        reduce: &R,
    ) -> Result<(Tensor<B, 2>, Vec<KvCache<B>>), R::Error> {
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
        let (mut new_k, mut new_v) = (Vec::new(), Vec::new());
        let h = self.run(x, &positions, bias, reduce, &mut |_, k, v| {
            new_k.push(k.clone());
            new_v.push(v.clone());
            (k, v)
        })?;
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
                KvCache::from_positions(
                    new_k.iter().map(take).collect(),
                    new_v.iter().map(take).collect(),
                    1,
                )
            })
            .collect();
        Ok((logits, caches))
    }

    /// One decode step for a batch of sequences at different positions: each
    /// sequence's next input embedding attends over its own cache, and its cache grows
    /// by one position, written in place (see [`KvCache`]).
    ///
    /// Sequence `i` writes its keys and values at position `len_i` and attends
    /// over positions `0..=len_i`; a batch reads `[b, kvh, P, hd]` per layer
    /// (`P` = the longest `len_i + 1`), gathered from each cache's buffer
    /// without padding (a sequence whose buffer is shorter than `P` is padded
    /// for this step). A batch of one reads its own buffer, with no gather.
    ///
    /// # Shapes
    /// * `x`: `[b, d]`, `b = caches.len()`
    /// * logits: `[b, vocab]`
    pub fn decode(&self, x: Tensor<B, 2>, caches: &mut [KvCache<B>]) -> Tensor<B, 2> {
        infallible(self.decode_with(x, caches, &Solo))
    }

    /// [`DecoderLm::decode`] on one rank of a tensor-parallel group, over the
    /// caches of this rank's KV heads (see [`DecoderLm::prefill_with`]).
    ///
    /// # Shapes
    /// As [`DecoderLm::decode`].
    ///
    /// # Errors
    /// An all-reduce failed (the caches may then hold a partial step).
    pub fn decode_with<R: AllReduce<B>>(
        &self,
        x: Tensor<B, 2>,
        caches: &mut [KvCache<B>],
        reduce: &R,
    ) -> Result<Tensor<B, 2>, R::Error> {
        let device = x.device();
        let [b, d] = x.dims();
        for c in caches.iter_mut() {
            c.reserve(1);
        }
        let p = caches.iter().map(|c| c.len + 1).max().unwrap_or(1);
        let positions: Vec<usize> = caches.iter().map(|c| c.len).collect();
        let mut bias = vec![0f32; b * p];
        for (i, c) in caches.iter().enumerate() {
            for k in c.len + 1..p {
                bias[i * p + k] = MASKED;
            }
        }
        let bias = float_tensor(bias, [b, 1, 1, p], &device);
        let placeholder = Tensor::<B, 3>::zeros([1, 1, 1], &device);
        // keys or values of one layer over the batch: [b, kvh, p, hd]
        let gather = |bufs: Vec<Tensor<B, 3>>| -> Tensor<B, 4> {
            let read = |t: Tensor<B, 3>| -> Tensor<B, 3> {
                let [kvh, cap, hd] = t.dims();
                if cap >= p {
                    t.narrow(1, 0, p)
                } else {
                    Tensor::cat(vec![t, Tensor::zeros([kvh, p - cap, hd], &device)], 1)
                }
            };
            if bufs.len() == 1 {
                read(bufs.into_iter().next().expect("one buffer")).unsqueeze_dim(0)
            } else {
                Tensor::stack(bufs.into_iter().map(read).collect(), 0)
            }
        };
        let h = self.run(
            x.reshape([b, 1, d]),
            &positions,
            bias,
            reduce,
            &mut |l, k, v| {
                let [_, kvh, _, hd] = k.dims();
                for (i, c) in caches.iter_mut().enumerate() {
                    let row = |t: &Tensor<B, 4>| t.clone().narrow(0, i, 1).reshape([kvh, 1, hd]);
                    write_position(&mut c.k[l], c.len, row(&k), &placeholder);
                    write_position(&mut c.v[l], c.len, row(&v), &placeholder);
                }
                (
                    gather(caches.iter().map(|c| c.k[l].clone()).collect()),
                    gather(caches.iter().map(|c| c.v[l].clone()).collect()),
                )
            },
        )?;
        for c in caches.iter_mut() {
            c.len += 1;
        }
        Ok(self.lm_head.forward(self.norm.forward(h.reshape([b, d]))))
    }

    /// Prefill of a sequence whose first `past.len` positions are cached
    /// (a prefix-cache hit): only the suffix `x` runs through the layers, its
    /// queries attending over the cached keys and values and its own
    /// (causally), at positions `past.len..`. The same logits and cache as a
    /// prefill of the whole sequence, up to float rounding (the test below
    /// states the tolerance).
    ///
    /// # Shapes
    /// * `x`: `[n, d]` input embeddings of the uncached suffix (`n >= 1`)
    /// * `past`: the prefix's cache (`len` positions)
    /// * logits: `[1, vocab]` at the last position; the cache holds all
    ///   `len + n` positions
    ///
    /// # Panics
    /// With an empty suffix (the last token is always computed).
    pub fn prefill_cached(&self, x: Tensor<B, 2>, past: &KvCache<B>) -> (Tensor<B, 2>, KvCache<B>) {
        let device = x.device();
        let [n, d] = x.dims();
        assert!(n > 0, "a cached prefill computes at least the last token");
        let m = past.len;
        let t = m + n;
        let mut bias = vec![0f32; n * t];
        for q in 0..n {
            for k in m + q + 1..t {
                bias[q * t + k] = MASKED;
            }
        }
        let bias = float_tensor(bias, [1, 1, n, t], &device);
        let positions: Vec<usize> = (m..t).collect();
        let (mut all_k, mut all_v) = (Vec::new(), Vec::new());
        let attend = &mut |l, k, v| {
            let k = Tensor::cat(vec![past.keys(l).unsqueeze_dim(0), k], 2);
            let v = Tensor::cat(vec![past.values(l).unsqueeze_dim(0), v], 2);
            all_k.push(k.clone());
            all_v.push(v.clone());
            (k, v)
        };
        let h = infallible(self.run(x.reshape([1, n, d]), &positions, bias, &Solo, attend));
        let last = h.narrow(1, n - 1, 1).reshape([1, d]);
        let logits = self.lm_head.forward(self.norm.forward(last));
        let squeeze = |t: Tensor<B, 4>| {
            let [_, kvh, len, hd] = t.dims();
            t.reshape([kvh, len, hd])
        };
        let cache = KvCache::from_positions(
            all_k.into_iter().map(squeeze).collect(),
            all_v.into_iter().map(squeeze).collect(),
            1,
        );
        (logits, cache)
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
        let h = infallible(self.run(
            x.reshape([1, l, d]),
            &positions,
            bias,
            &Solo,
            &mut |_, k, v| (k, v),
        ));
        self.lm_head.forward(self.norm.forward(h.reshape([l, d])))
    }

    /// The layers over `x` `[b, L, d]` with per-token positions (`b*L`, row-major)
    /// and an additive attention bias `[b, 1, L, T]`. `attend(layer, k, v)` takes
    /// the pass's keys and values `[b, kvh, L, hd]` and returns those attended
    /// over, `[b, kvh, T, hd]` (the same for a pass without a cache; the cache's
    /// for a decode step, which it writes them into).
    /// On a shard, `h` and `kvh` are this rank's heads and `reduce` sums the
    /// row-parallel outputs over the group.
    #[allow(clippy::type_complexity)]
    fn run<R: AllReduce<B>>(
        &self,
        x: Tensor<B, 3>,
        positions: &[usize],
        bias: Tensor<B, 4>,
        reduce: &R,
        attend: &mut dyn FnMut(usize, Tensor<B, 4>, Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>),
    ) -> Result<Tensor<B, 3>, R::Error> {
        let device = x.device();
        let [b, l, d] = x.dims();
        let (h, kvh, hd) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let rope = RopeAngles::positions_1d(positions, hd, self.rope_theta, &device);
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
            let (k_all, v_all) = attend(li, k, v);
            let ctx = grouped_attention(q, k_all, v_all, bias.clone())
                .swap_dims(1, 2)
                .reshape([b * l, h * hd]);
            x = x + reduce.sum(layer.o.forward(ctx).reshape([b, l, d]))?;
            x = x.clone() + reduce.sum(layer.mlp.forward(layer.norm2.forward(x)))?;
        }
        Ok(x)
    }

    /// Query heads, key/value heads and head width of this module (of this
    /// rank's shard, for a [`DecoderLm::shard`]).
    pub fn heads(&self) -> (usize, usize, usize) {
        (self.n_heads, self.n_kv_heads, self.head_dim)
    }

    /// Rank `rank`'s shard of a `tp`-way tensor-parallel split (see
    /// [`super::tp`]): per layer, the query heads `rank*h/tp ..` and the KV heads
    /// [`kv_heads_of`] (Q and the fused KV projection by columns, the output
    /// projection by rows), the MLP's hidden features `rank*d_ff/tp ..`; the
    /// embedding, the norms and the LM head replicated. Call it on the
    /// unsharded module every rank builds from the same seed.
    ///
    /// # Errors
    /// [`TpError::Indivisible`] if `tp` does not divide the heads or the MLP
    /// width, or the KV heads and `tp` do not divide one another;
    /// [`TpError::Unsupported`] for mixture-of-experts layers;
    /// [`TpError::BadRank`] if `rank ≥ tp`.
    pub fn shard(&self, rank: usize, tp: usize) -> Result<DecoderLm<B>, TpError> {
        check_rank(rank, tp)?;
        materialize(self);
        let (h, kvh, hd) = (self.n_heads, self.n_kv_heads, self.head_dim);
        let d_ff: Vec<usize> = self
            .layers
            .first()
            .and_then(|l| match &l.mlp {
                FeedForward::Dense(m) => Some(m.d_ff()),
                FeedForward::Moe(_) => None,
            })
            .into_iter()
            .collect();
        let allowed = allowed_tp(h, kvh, &d_ff);
        let bad = |what, count| TpError::Indivisible {
            tp,
            what,
            count,
            allowed: allowed.clone(),
        };
        if !h.is_multiple_of(tp) {
            return Err(bad("LLM attention heads", h));
        }
        if !(kvh.is_multiple_of(tp) || tp.is_multiple_of(kvh)) {
            return Err(bad("LLM KV heads (nor do they divide it)", kvh));
        }
        let q = scaled(share(rank, tp, h), hd);
        let kv = scaled(kv_heads_of(rank, tp, kvh), hd);
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(DecoderLayer {
                    norm1: l.norm1.clone(),
                    q: columns(&l.q, std::slice::from_ref(&q)),
                    kv: columns(&l.kv, &[kv.clone(), offset(kv.clone(), kvh * hd)]),
                    o: rows(&l.o, q.clone(), rank),
                    norm2: l.norm2.clone(),
                    mlp: match &l.mlp {
                        FeedForward::Dense(m) => FeedForward::Dense(m.shard(rank, tp)?),
                        FeedForward::Moe(_) if tp > 1 => {
                            return Err(TpError::Unsupported("a mixture-of-experts layer"))
                        }
                        FeedForward::Moe(m) => FeedForward::Moe(m.clone()),
                    },
                })
            })
            .collect::<Result<Vec<_>, TpError>>()?;
        Ok(DecoderLm {
            embed: self.embed.clone(),
            layers,
            norm: self.norm.clone(),
            lm_head: self.lm_head.clone(),
            n_heads: h / tp,
            n_kv_heads: kv.len() / hd,
            head_dim: hd,
            rope_theta: self.rope_theta,
        })
    }
}

/// Grouped-query attention without copying keys and values per query head:
/// query head `kv * (h / kvh) + g` attends with key/value head `kv` (the
/// layout of Llama's and Qwen's `repeat_kv`), so the queries are regrouped
/// `[b, kvh, (h / kvh) * L, hd]` and each key/value head serves its group in
/// one matmul. Scores are scaled by `1/sqrt(hd)`.
///
/// # Shapes
/// `q` `[b, h, L, hd]`; `k`, `v` `[b, kvh, T, hd]`; `bias` additive,
/// broadcast to `[b, h, L, T]` (e.g. `[b, 1, L, T]`) -> `[b, h, L, hd]`.
///
/// # Panics
/// If `h` is not a multiple of `kvh`.
pub fn grouped_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    bias: Tensor<B, 4>,
) -> Tensor<B, 4> {
    let [b, h, l, hd] = q.dims();
    let [_, kvh, t, _] = k.dims();
    assert!(
        kvh > 0 && h % kvh == 0,
        "{h} query heads are not a multiple of {kvh} key/value heads"
    );
    let group = h / kvh;
    let scores = q
        .reshape([b, kvh, group * l, hd])
        .matmul(k.swap_dims(2, 3))
        .reshape([b, h, l, t])
        .mul_scalar(1.0 / (hd as f64).sqrt())
        + bias;
    softmax(scores, 3)
        .reshape([b, kvh, group * l, t])
        .matmul(v)
        .reshape([b, h, l, hd])
}
