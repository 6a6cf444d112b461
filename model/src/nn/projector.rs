//! MLP projector from encoder features into the LLM's embedding space.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::{gelu, silu};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::blocks::{Norm, NormConfig, NormKind};

/// The projector's activation.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum ProjectorAct {
    /// `Linear -> GELU -> Linear` (LLaVA `mlp2x_gelu`, the Qwen2.5-VL merger).
    Gelu,
    /// `Linear -> SwiGLU (halves the width) -> Linear` (Ultravox projector).
    SwiGlu,
}

/// Configuration of [`Projector`].
#[derive(Config, Debug)]
pub struct ProjectorConfig {
    /// Input features per row (encoder width, times merged/stacked rows).
    pub d_input: usize,
    /// Hidden width of the first linear map (halved by SwiGLU).
    pub d_hidden: usize,
    /// Output features: the LLM's embedding width.
    pub d_output: usize,
    /// Activation between the two linear maps.
    #[config(default = "ProjectorAct::Gelu")]
    pub act: ProjectorAct,
    /// RMSNorm over the whole input row first (Ultravox's stacked frames).
    #[config(default = false)]
    pub pre_norm: bool,
}

impl ProjectorConfig {
    /// A randomly initialised [`Projector`] on `device`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Projector<B> {
        let mid = match self.act {
            ProjectorAct::Gelu => self.d_hidden,
            ProjectorAct::SwiGlu => self.d_hidden / 2,
        };
        Projector {
            norm: self
                .pre_norm
                .then(|| NormConfig::new(self.d_input, NormKind::Rms).init(device)),
            fc1: LinearConfig::new(self.d_input, self.d_hidden).init(device),
            fc2: LinearConfig::new(mid, self.d_output).init(device),
            swiglu: self.act == ProjectorAct::SwiGlu,
        }
    }
}

/// Two-layer MLP projector.
#[derive(Module, Debug)]
pub struct Projector<B: Backend> {
    norm: Option<Norm<B>>,
    fc1: Linear<B>,
    fc2: Linear<B>,
    swiglu: bool,
}

impl<B: Backend> Projector<B> {
    /// # Shapes
    /// `[N, d_input]` -> `[N, d_output]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let x = match &self.norm {
            Some(n) => n.forward(x),
            None => x,
        };
        let h = self.fc1.forward(x);
        let h = if self.swiglu {
            let half = h.dims()[1] / 2;
            silu(h.clone().narrow(1, 0, half)) * h.narrow(1, half, half)
        } else {
            gelu(h)
        };
        self.fc2.forward(h)
    }
}
