//! How an engine runs a pass: eagerly, every kernel dispatched from the host,
//! or by replaying a captured CUDA graph; and the launch floor that follows.
//!
//! * **Eager.** The host dispatches the pass's kernels one by one
//!   ([`easerve_model::Op::launches`]) and the GPU runs them as they arrive, so a
//!   pass cannot end before its last kernel has been dispatched:
//!   `max(Σ kernel seconds, launches · per_launch_s)`. A pass whose kernels
//!   finish faster than they can be launched costs about the same whatever its
//!   input; a large pass is its kernels' time. (The host runs ahead of the GPU
//!   through the launch queue, so the bound is per pass, not per kernel.)
//! * **Graph.** A captured graph is replayed with one launch and its kernels
//!   run back to back: the pass is its kernels' time, as the tables measured
//!   them. Engines capture graphs only up to a size — tokens per pass for
//!   encode and prefill, sequences per step for decode — and run a larger pass
//!   eagerly ([`StageLaunch::graph_max`]).
//!
//! The per-launch cost is measured: [`EAGER_LAUNCH_S`], from aiconfigurator's
//! vLLM custom all-reduce tables, which time the same kernel both ways
//! ([`measured_per_launch_s`]). A scenario may set its own
//! (`deployment.launch.per_launch_us`).
//!
//! The engines' defaults ([`Launch::of_engine`]), with their sources:
//!
//! | engine | encode | prefill | decode |
//! |---|---|---|---|
//! | `vllm` | eager | graph ≤ 512 tokens | graph ≤ 512 sequences |
//! | `sglang` | eager | graph ≤ 4096 tokens | graph ≤ 256 sequences |
//! | `easerve` | eager | eager | eager |
//!
//! * vLLM runs the multimodal encoder eagerly unless
//!   `--compilation-config '{"cudagraph_mm_encoder": true}'` is given
//!   (docs.vllm.ai, design/cuda_graphs_multimodal); its decoder runs piecewise and
//!   full CUDA graphs up to `max_cudagraph_capture_size`, 512 by default
//!   (docs.vllm.ai, design/cuda_graphs). Piecewise graphs leave the attention
//!   kernels eager between pieces; those few launches are not floored here.
//! * SGLang runs the ViT eagerly unless `SGLANG_VIT_ENABLE_CUDA_GRAPH=1`
//!   (docs.sglang.io, advanced_features/cuda_graph_for_multi_modal_encoder);
//!   piecewise CUDA graphs for extend/prefill are on by default
//!   (advanced_features/piecewise_cuda_graph) up to
//!   `piecewise_cuda_graph_max_tokens` = 4096 (`server_args.py`); decode graphs
//!   up to `cuda_graph_max_bs`, auto-set to 256 for TP < 4 on 80–160 GB GPUs
//!   (`server_args.py`; 512 at TP ≥ 4, not distinguished here).
//! * easerve's executor (burn 0.21's CUDA backend) captures no graphs: every
//!   stage is eager. Its per-launch cost is not measured; the vLLM figure stands
//!   in for it.

use easerve_model::Op;

use crate::aic::{look, KernelTables};

/// A launch mode or engine name that is not one (the message lists what is
/// allowed).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    /// Not `eager` or `graph` ([`LaunchMode::parse`]).
    #[error("unknown launch mode `{0}`; allowed: eager, graph")]
    UnknownMode(String),
    /// Not one of [`ENGINES`] ([`Engine::parse`]).
    #[error("unknown engine `{0}`; allowed: {}", ENGINES.join(", "))]
    UnknownEngine(String),
}

/// Whether a stage's engine replays captured CUDA graphs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchMode {
    /// Every kernel dispatched from the host.
    Eager,
    /// Captured graphs replayed, up to [`StageLaunch::graph_max`].
    Graph,
}

impl LaunchMode {
    /// The scenario name (`eager`, `graph`).
    pub fn name(self) -> &'static str {
        match self {
            LaunchMode::Eager => "eager",
            LaunchMode::Graph => "graph",
        }
    }

    /// Parse a scenario name; the error lists what is allowed.
    ///
    /// # Errors
    /// Anything but `eager` or `graph`.
    pub fn parse(s: &str) -> Result<LaunchMode, LaunchError> {
        match s {
            "eager" => Ok(LaunchMode::Eager),
            "graph" => Ok(LaunchMode::Graph),
            _ => Err(LaunchError::UnknownMode(s.to_string())),
        }
    }
}

/// How one stage's engine runs its passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageLaunch {
    /// Eager or graphed.
    pub mode: LaunchMode,
    /// The largest pass the captured graphs cover: tokens per pass (encode,
    /// prefill) or sequences per step (decode); a larger pass runs eagerly.
    /// Unused when eager.
    pub graph_max: u64,
}

impl StageLaunch {
    /// Every pass eager.
    pub const EAGER: StageLaunch = StageLaunch {
        mode: LaunchMode::Eager,
        graph_max: 0,
    };

    /// Graphed up to `graph_max`.
    pub const fn graph(graph_max: u64) -> StageLaunch {
        StageLaunch {
            mode: LaunchMode::Graph,
            graph_max,
        }
    }

    /// Whether a pass of `size` (tokens, or sequences for decode) runs eagerly.
    pub fn eager(&self, size: u64) -> bool {
        self.mode == LaunchMode::Eager || size > self.graph_max
    }

    fn describe(&self, unit: &str) -> String {
        match self.mode {
            LaunchMode::Eager => "eager".into(),
            LaunchMode::Graph => format!("graph ≤ {} {unit}", self.graph_max),
        }
    }
}

/// The serving engine whose launch defaults apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// vLLM.
    Vllm,
    /// SGLang.
    Sglang,
    /// easerve's own executor.
    Easerve,
}

/// The engine names a scenario may give (`deployment.launch.engine`).
pub const ENGINES: [&str; 3] = ["vllm", "sglang", "easerve"];

impl Engine {
    /// Its scenario name.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
            Engine::Easerve => "easerve",
        }
    }

    /// Parse a scenario name; the error lists [`ENGINES`].
    ///
    /// # Errors
    /// An unknown name.
    pub fn parse(s: &str) -> Result<Engine, LaunchError> {
        match s {
            "vllm" => Ok(Engine::Vllm),
            "sglang" => Ok(Engine::Sglang),
            "easerve" => Ok(Engine::Easerve),
            _ => Err(LaunchError::UnknownEngine(s.to_string())),
        }
    }
}

/// Seconds of host time per eagerly dispatched kernel: 16.35 µs, the median over
/// the four GPUs aiconfigurator measured with vLLM 0.24.0 (H100 SXM 16.3,
/// H200 SXM 16.4, B200 SXM 13.6, RTX PRO 6000 16.8 µs) of the custom
/// all-reduce's eager latency minus its CUDA-graph latency at TP 2 and the
/// smallest message (128 elements), where the kernel itself takes 4–7 µs
/// (`comm/vllm/0.24.0/custom_allreduce_perf.parquet`,
/// [`measured_per_launch_s`]). The L40S (vLLM 0.22.0, 83 µs) and A100
/// (vLLM 0.14.0, 39.5 µs) tables are other vLLM versions whose eager path
/// includes the ranks' launch skew over PCIe or an older host path; they are
/// left out, not averaged in. Secondary sources put one PyTorch op's
/// dispatch at 5–25 µs.
pub const EAGER_LAUNCH_S: f64 = 16.35e-6;

/// The eager-minus-graph latency of vLLM's custom all-reduce at TP 2 and the
/// table's smallest message, seconds: one eagerly launched kernel's host cost
/// on the machine that measured `t` (module doc). `None` when the tables have
/// no TP-2 rows.
pub fn measured_per_launch_s(t: &KernelTables) -> Option<f64> {
    let axes = t.allreduce_eager.axes();
    if !axes.first()?.contains(&2.0) {
        return None;
    }
    let smallest = *axes.get(1)?.first()?;
    let (eager, _) = look(&t.allreduce_eager, &[2.0, smallest]);
    let (graph, _) = look(&t.allreduce_graph, &[2.0, smallest]);
    Some(eager - graph)
}

/// Which stage a pass belongs to, for [`Launch::floor`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchStage {
    /// An encode pass (size: encoder tokens).
    Encode,
    /// A prefill batch (size: tokens).
    Prefill,
    /// A decode step (size: sequences).
    Decode,
}

/// The capture size a stage gets when a scenario graphs it where its engine's
/// default is eager: 13,824 encoder tokens for encode (the largest of the
/// token budgets vLLM's encoder CUDA graphs capture in its documented example,
/// `[2048, 4096, 8192, 13824]`, design/cuda_graphs_multimodal); 512 tokens
/// for prefill and 512 sequences for decode (vLLM's `max_cudagraph_capture_size`).
pub fn default_graph_max(stage: LaunchStage) -> u64 {
    match stage {
        LaunchStage::Encode => 13_824,
        LaunchStage::Prefill | LaunchStage::Decode => 512,
    }
}

/// How the engine runs each stage's passes, and what one eager launch costs.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    /// The engine whose defaults were taken.
    pub engine: Engine,
    /// The encode stage.
    pub encode: StageLaunch,
    /// The prefill stage.
    pub prefill: StageLaunch,
    /// The decode stage.
    pub decode: StageLaunch,
    /// Host seconds per eagerly launched kernel.
    pub per_launch_s: f64,
    /// Where `per_launch_s` comes from.
    pub per_launch_source: String,
}

impl Default for Launch {
    /// vLLM's defaults.
    fn default() -> Self {
        Launch::of_engine(Engine::Vllm)
    }
}

impl Launch {
    /// The defaults of `engine` (module doc) at [`EAGER_LAUNCH_S`].
    pub fn of_engine(engine: Engine) -> Launch {
        let (encode, prefill, decode) = match engine {
            Engine::Vllm => (
                StageLaunch::EAGER,
                StageLaunch::graph(512),
                StageLaunch::graph(512),
            ),
            Engine::Sglang => (
                StageLaunch::EAGER,
                StageLaunch::graph(4096),
                StageLaunch::graph(256),
            ),
            Engine::Easerve => (StageLaunch::EAGER, StageLaunch::EAGER, StageLaunch::EAGER),
        };
        Launch {
            engine,
            encode,
            prefill,
            decode,
            per_launch_s: EAGER_LAUNCH_S,
            per_launch_source: "measured: aiconfigurator vLLM 0.24.0 custom all-reduce, eager − CUDA graph at TP 2, median of four GPUs".into(),
        }
    }

    /// The stage's settings.
    pub fn stage(&self, stage: LaunchStage) -> &StageLaunch {
        match stage {
            LaunchStage::Encode => &self.encode,
            LaunchStage::Prefill => &self.prefill,
            LaunchStage::Decode => &self.decode,
        }
    }

    /// The launch floor of a pass of `stage` over `size` (tokens, or sequences
    /// for decode) dispatching `launches` kernels, seconds: `launches ·
    /// per_launch_s` when it runs eagerly, else 0.
    pub fn floor(&self, stage: LaunchStage, size: u64, launches: u64) -> f64 {
        if self.stage(stage).eager(size) {
            launches as f64 * self.per_launch_s
        } else {
            0.0
        }
    }

    /// The floor of a pass made of `ops` ([`Launch::floor`] with their
    /// [`Op::launches`]).
    pub fn floor_of(&self, stage: LaunchStage, size: u64, ops: &[Op]) -> f64 {
        if !self.stage(stage).eager(size) {
            return 0.0;
        }
        self.floor(stage, size, ops.iter().map(Op::launches).sum())
    }

    /// One line for a cost model's notes.
    pub fn note(&self) -> String {
        format!(
            "launch ({} defaults): encode {}, prefill {}, decode {}; an eager pass takes at least its kernel launches × {:.2} µs ({})",
            self.engine.name(),
            self.encode.describe("tokens"),
            self.prefill.describe("tokens"),
            self.decode.describe("sequences"),
            self.per_launch_s * 1e6,
            self.per_launch_source
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aic::tests::data;

    #[test]
    fn the_per_launch_constant_is_the_tables_median() {
        let Some(dir) = data() else { return };
        let mut v: Vec<f64> = ["h100_sxm", "h200_sxm", "b200_sxm", "rtx_pro_6000_server"]
            .iter()
            .map(|g| {
                let t = KernelTables::load(&dir, g, "bfloat16").unwrap();
                measured_per_launch_s(&t).unwrap()
            })
            .collect();
        v.sort_by(f64::total_cmp);
        let median = (v[1] + v[2]) / 2.0;
        assert!(
            (median - EAGER_LAUNCH_S).abs() < 0.1e-6,
            "{v:?}: median {median}"
        );
        for x in v {
            assert!(x > 10e-6 && x < 20e-6, "{x}");
        }
    }

    #[test]
    fn engines_state_their_modes() {
        let v = Launch::of_engine(Engine::Vllm);
        assert!(v.encode.eager(1));
        assert!(!v.prefill.eager(512) && v.prefill.eager(513));
        assert!(!v.decode.eager(64));
        let s = Launch::of_engine(Engine::Sglang);
        assert!(!s.prefill.eager(4096) && s.decode.eager(257));
        let e = Launch::of_engine(Engine::Easerve);
        assert!(e.decode.eager(1) && e.prefill.eager(1));
        assert_eq!(
            v.floor(LaunchStage::Encode, 100, 1000),
            1000.0 * EAGER_LAUNCH_S
        );
        assert_eq!(v.floor(LaunchStage::Decode, 8, 1000), 0.0);
        assert!(Engine::parse("tgi")
            .unwrap_err()
            .to_string()
            .contains("vllm, sglang, easerve"));
        assert!(LaunchMode::parse("graphs")
            .unwrap_err()
            .to_string()
            .contains("eager, graph"));
        assert!(v.note().contains("16.35 µs"));
    }
}
