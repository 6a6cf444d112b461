//! Every efficiency / overhead constant of the roofline in one place.
//!
//! Each value here is an **assumption**, except `encode_pass_s` (an input taken
//! from the EAServe paper) and the GEMM efficiency `gemm_eff_from_fit` selects
//! (fitted on Vidur's A100 timings, [`crate::fitted`]); each field's doc says
//! which. Measurements do not refit them: a measured or imported profile
//! ([`crate::Profile`]) or the measured kernel tables ([`crate::KernelCost`])
//! price the stages in place of the roofline. The kernel tables still take
//! `encode_pass_s` (the pass-through system's cost per encode pass), the fixed
//! per-batch and per-step overheads and the time-slicing penalty from here,
//! and a profile made by `easerve profile` records the two contention figures
//! (`time_slice_penalty`, `bandwidth_interference`) it was made with.

/// Efficiency factors and fixed overheads that turn [`easerve_model::Work`] into seconds.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Efficiency {
    /// Fraction of peak dense BF16 FLOPS that large GEMMs reach. Default 0.65:
    /// assumption (cuBLAS BF16 GEMMs of LLM sizes typically reach 60-75 % of peak).
    pub gemm_eff: f64,
    /// Use the GEMM compute efficiency fitted on Vidur's measured A100 timings
    /// (`crate::fitted`: the asymptote `e_max` of `e_max·n/(n+k)` per TP, 0.76–0.78)
    /// instead of the scalar `gemm_eff`. Default true: fitted, with the assumption
    /// that the A100's efficiency carries over to the other GPUs.
    pub gemm_eff_from_fit: bool,
    /// Fraction of peak memory bandwidth that streaming kernels reach. Default 0.8:
    /// assumption (typical STREAM-like / decode-GEMV efficiency).
    pub mem_eff: f64,
    /// Seconds of launch overhead per transformer layer. Default 30 µs: assumption
    /// (a layer is ~10 kernels of a few µs launch each, without CUDA graphs).
    pub layer_overhead_s: f64,
    /// Seconds fixed per encode forward pass (framework + launch + scheduling + transfer
    /// setup). Default 1.5 s: calibrated from the EAServe paper's pass-through
    /// saturation point on its RTX 6000 Ada testbed — a pass-through (B = 1) encode
    /// stage saturates near 1 req/s while its GPU stays under 10 % busy (§2.2, §4.2,
    /// Fig. 11); with two encode workers (the most an 8-GPU `E+1P(TP2)+1D(TP4)`
    /// allocation has) that is ≈ 2 s per request, of which ~0.05–0.1 s is
    /// preprocessing and GPU time here. An input, not a validated prediction.
    pub encode_pass_s: f64,
    /// CPU preprocessing seconds per item (image decode/resize, audio load). Default
    /// 0.02 s: assumption.
    pub preprocess_item_s: f64,
    /// CPU preprocessing seconds per encoder token (patchify, normalise, log-mel).
    /// Default 2 µs: assumption.
    pub preprocess_per_token_s: f64,
    /// Seconds fixed per prefill batch (scheduling, sampling). Default 10 ms: assumption.
    pub prefill_batch_s: f64,
    /// Seconds fixed per decode step (scheduling, sampling, detokenise). Default 4 ms:
    /// assumption.
    pub decode_step_s: f64,
    /// Tokens needed to fill all SMs of the GPU: below it an encode pass cannot use
    /// every SM (the knee of the encode latency-vs-SM curve, EAServe paper §3.4 and Fig. 7). Default 4096:
    /// assumption (a GEMM needs roughly one 128x128 output tile per SM per wave:
    /// 142 SMs * 128 rows / hidden-width tiling ~ a few thousand rows).
    pub tokens_to_fill_gpu: f64,
    /// Extra slowdown when two processes time-slice one GPU without SM partitioning
    /// (default CUDA scheduling): while both have work, each progresses at
    /// `0.5 / (1 + time_slice_penalty)` of its exclusive rate. Default 0.1: assumption
    /// (context-switch and cache-thrash cost; EAServe §4.4 reports uncontrolled
    /// contention costs 9 % throughput against the dynamic split).
    pub time_slice_penalty: f64,
    /// Fraction by which an encode pass's GPU time grows while a co-located prefill
    /// runs under an SM partition: SM masks do not isolate HBM bandwidth (EAServe
    /// §2.3). Default 0.05: assumption.
    pub bandwidth_interference: f64,
}

impl Default for Efficiency {
    /// The values listed on each field.
    fn default() -> Self {
        Efficiency {
            gemm_eff: 0.65,
            gemm_eff_from_fit: true,
            mem_eff: 0.8,
            layer_overhead_s: 30e-6,
            encode_pass_s: 1.5,
            preprocess_item_s: 0.02,
            preprocess_per_token_s: 2e-6,
            prefill_batch_s: 0.01,
            decode_step_s: 0.004,
            tokens_to_fill_gpu: 4096.0,
            time_slice_penalty: 0.1,
            bandwidth_interference: 0.05,
        }
    }
}

/// vLLM's default `gpu_memory_utilization`: the fraction of GPU memory a worker may use
/// for weights + KV cache + activations.
pub const DEFAULT_MEM_UTIL: f64 = 0.9;
