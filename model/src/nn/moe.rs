//! A mixture-of-experts feed-forward layer (Qwen3-MoE / Llama 4 style): a
//! router scores every expert per token, each token runs through its `top_k`
//! experts (SwiGLU MLPs) weighted by the router's softmax renormalised over
//! the chosen ones, plus optional shared experts every token takes.
//!
//! Routing is decided on the host (the scores are read back), then each
//! expert runs once over the rows routed to it (gathered with `select`) and
//! its weighted output is added back in place (`select_assign` with
//! [`IndexingUpdateOp::Add`]): the grouped computation the twin prices, not a
//! dense pass over every expert.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{IndexingUpdateOp, Tensor};

use super::attention::{float_tensor, index_tensor};
use super::blocks::{Mlp, MlpConfig};

/// Configuration of [`Moe`].
#[derive(Config, Debug)]
pub struct MoeConfig {
    /// Input and output width.
    pub d_model: usize,
    /// Routed experts.
    pub experts: usize,
    /// Experts each token takes (1 ..= `experts`).
    pub top_k: usize,
    /// Hidden width of one routed expert (SwiGLU).
    pub expert_ffn: usize,
    /// Shared experts every token takes (0 for none).
    #[config(default = 0)]
    pub shared_experts: usize,
    /// Hidden width of a shared expert.
    #[config(default = 0)]
    pub shared_ffn: usize,
}

impl MoeConfig {
    /// A randomly initialised [`Moe`] on `device`.
    ///
    /// # Panics
    /// When `top_k` is 0 or above `experts`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Moe<B> {
        assert!(
            self.top_k >= 1 && self.top_k <= self.experts,
            "top_k {} must be in 1..={} (the experts)",
            self.top_k,
            self.experts
        );
        let mlp = |ffn: usize| {
            MlpConfig::new(self.d_model, ffn)
                .with_gated(true)
                .with_bias(false)
                .init(device)
        };
        Moe {
            router: LinearConfig::new(self.d_model, self.experts)
                .with_bias(false)
                .init(device),
            experts: (0..self.experts).map(|_| mlp(self.expert_ffn)).collect(),
            shared: (0..self.shared_experts)
                .map(|_| mlp(self.shared_ffn))
                .collect(),
            top_k: self.top_k,
        }
    }
}

/// Mixture-of-experts feed-forward layer.
#[derive(Module, Debug)]
pub struct Moe<B: Backend> {
    router: Linear<B>,
    experts: Vec<Mlp<B>>,
    shared: Vec<Mlp<B>>,
    top_k: usize,
}

/// Per token, its chosen experts and their weights: the router's softmax over
/// all experts, the `top_k` highest (ties to the lower index), renormalised to
/// sum to 1 (Qwen3-MoE's `norm_topk_prob`).
pub fn route(scores: &[f32], experts: usize, top_k: usize) -> Vec<Vec<(usize, f32)>> {
    scores
        .chunks(experts)
        .map(|row| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exp: Vec<f32> = row.iter().map(|s| (s - max).exp()).collect();
            let total: f32 = exp.iter().sum();
            let mut order: Vec<usize> = (0..experts).collect();
            order.sort_by(|&a, &b| exp[b].total_cmp(&exp[a]).then(a.cmp(&b)));
            let chosen: Vec<(usize, f32)> = order[..top_k]
                .iter()
                .map(|&e| (e, exp[e] / total))
                .collect();
            let kept: f32 = chosen.iter().map(|c| c.1).sum();
            chosen.into_iter().map(|(e, w)| (e, w / kept)).collect()
        })
        .collect()
}

impl<B: Backend> Moe<B> {
    /// Routed experts.
    pub fn experts(&self) -> usize {
        self.experts.len()
    }

    /// The router's scores (logits) of `x`.
    ///
    /// # Shapes
    /// `x` `[n, d]` -> `[n, experts]`.
    pub fn scores(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.router.forward(x)
    }

    /// Routed expert `e`'s MLP (for tests and the dense reference).
    pub fn expert(&self, e: usize) -> &Mlp<B> {
        &self.experts[e]
    }

    /// # Shapes
    /// `[n, d]` -> `[n, d]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let device = x.device();
        let [n, _] = x.dims();
        let e = self.experts.len();
        let scores = self.scores(x.clone());
        let host: Vec<f32> = scores.into_data().iter::<f32>().collect();
        let routes = route(&host, e, self.top_k);
        // rows and weights per expert
        let mut rows: Vec<Vec<usize>> = vec![Vec::new(); e];
        let mut weights: Vec<Vec<f32>> = vec![Vec::new(); e];
        for (t, chosen) in routes.iter().enumerate() {
            for &(ex, w) in chosen {
                rows[ex].push(t);
                weights[ex].push(w);
            }
        }
        let mut out = x.zeros_like();
        for (ex, mlp) in self.experts.iter().enumerate() {
            if rows[ex].is_empty() {
                continue;
            }
            let idx = index_tensor::<B>(&rows[ex], &device);
            let m = rows[ex].len();
            let y = mlp.forward(x.clone().select(0, idx.clone()));
            let w = float_tensor::<B, 2>(std::mem::take(&mut weights[ex]), [m, 1], &device);
            out = out.select_assign(0, idx, y * w, IndexingUpdateOp::Add);
        }
        for s in &self.shared {
            out = out + s.forward(x.clone());
        }
        debug_assert_eq!(out.dims()[0], n);
        out
    }

    /// The same layer computed densely, token by token: each token's chosen
    /// experts run on that token alone and their outputs are summed with the
    /// routing weights (the reference [`Moe::forward`] is tested against).
    ///
    /// # Shapes
    /// `[n, d]` -> `[n, d]`.
    pub fn forward_dense(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let [n, d] = x.dims();
        let e = self.experts.len();
        let host: Vec<f32> = self.scores(x.clone()).into_data().iter::<f32>().collect();
        let routes = route(&host, e, self.top_k);
        let rows: Vec<Tensor<B, 2>> = (0..n)
            .map(|t| {
                let xt = x.clone().narrow(0, t, 1);
                let mut y = xt.zeros_like();
                for &(ex, w) in &routes[t] {
                    y = y + self.experts[ex].forward(xt.clone()) * w;
                }
                for s in &self.shared {
                    y = y + s.forward(xt.clone());
                }
                y
            })
            .collect();
        Tensor::cat(rows, 0).reshape([n, d])
    }
}
