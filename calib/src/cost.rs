//! The one interface through which the simulator and the executor's
//! controller (its batcher and SM policy, in `easerve exec` and `easerve
//! serve`) ask for stage durations, whatever their source: the roofline
//! ([`crate::Roofline`]), a profile, measured or imported ([`crate::Profile`]),
//! or measured kernel tables ([`crate::KernelCost`]).

use crate::EncodeTime;
use easerve_model::{ItemTokens, Parallel};

/// Durations of every stage of an EPD pipeline on one model × device.
///
/// All durations are seconds. `sm_share ∈ (0, 1]` is the fraction of the GPU's SMs
/// a pass runs on; `par` the worker's layout over its GPUs (TP, and EP for an
/// MoE model; a `u32` TP degree converts with `.into()`).
pub trait StageCost: Send + Sync {
    /// One encode pass over a micro-batch of items on one GPU (TP 1), split
    /// into its terms: [`StageCost::encode_tp`] at TP 1.
    fn encode(&self, items: &[ItemTokens], sm_share: f64) -> EncodeTime {
        self.encode_tp(items, sm_share, 1)
    }
    /// One encode pass over a micro-batch of items on an encode worker at TP
    /// `tp` (the pass split Megatron-style over `tp` GPUs, as the executor
    /// splits the encoders of `EncoderArch::executor_tp`), split into its
    /// terms. A source without a tensor-parallel term for the encoder
    /// prices it as at TP 1 and its notes say so.
    fn encode_tp(&self, items: &[ItemTokens], sm_share: f64, tp: u32) -> EncodeTime;
    /// Host seconds, on one thread, to preprocess `items`: the `t_pre` of
    /// [`StageCost::encode`], which a pipelined preprocessing stage charges
    /// item by item on the encode worker's threads instead of in the pass.
    /// Sources that price it without the GPU phase override it; the figure is
    /// the same.
    fn preprocess(&self, items: &[ItemTokens]) -> f64 {
        self.encode(items, 1.0).t_pre
    }
    /// One prefill batch of sequences with these prompt lengths (tokens).
    fn prefill(&self, seq_lens: &[u64], par: Parallel, sm_share: f64) -> f64;
    /// One prefill batch whose sequence `i` computes its last `new[i]`
    /// tokens after `cached[i]` tokens a prefix cache held: prefill of the
    /// new tokens, attending over the whole context. Sources whose prefill
    /// has no context-length term (a measured profile, keyed by a batch's
    /// tokens) price the new tokens alone, which is this default.
    fn prefill_cached(&self, new: &[u64], cached: &[u64], par: Parallel, sm_share: f64) -> f64 {
        let _ = cached;
        self.prefill(new, par, sm_share)
    }
    /// One decode iteration of `batch` sequences holding `total_context_tokens`.
    fn decode_step(&self, batch: u64, total_context_tokens: u64, par: Parallel) -> f64;
    /// A run of `steps` decode iterations over an unchanged batch, appended to
    /// `out`: the `i`-th (from 0) is [`StageCost::decode_step`]`(batch,
    /// total_context_tokens + i · batch, par)`, since every sequence holds one
    /// more token after each iteration. Sources with a memo override it to
    /// look a run up at once; the figures are the same.
    fn decode_steps(
        &self,
        batch: u64,
        total_context_tokens: u64,
        par: Parallel,
        steps: u64,
        out: &mut Vec<f64>,
    ) {
        out.extend(
            (0..steps).map(|i| self.decode_step(batch, total_context_tokens + i * batch, par)),
        );
    }
    /// Moving `bytes` once over the GPU's link (embeddings, KV cache).
    fn transfer(&self, bytes: f64) -> f64;
    /// Seconds a decode worker at TP `tp` spends landing one sequence's KV
    /// cache of `tokens` positions at its first step (the executor reads it
    /// from the wire and, at TP > 1, reshards it by heads and sends the
    /// followers theirs): a measured CPU profile's `kv_land` table; 0 for
    /// every other source (on GPUs the KV lands by the transfer itself).
    fn kv_land(&self, _tp: u32, _tokens: u64) -> f64 {
        0.0
    }
    /// While two processes time-slice one GPU with no SM partition, each
    /// progresses at `0.5 / (1 + penalty)` of its exclusive rate.
    fn time_slice_penalty(&self) -> f64;
    /// Fraction by which an encode pass's GPU time grows while a co-located
    /// prefill runs under an SM partition (SM masks do not isolate bandwidth).
    fn bandwidth_interference(&self) -> f64;
    /// Where the figures came from, and anything a run should report once
    /// (e.g. lookups that extrapolated beyond a measured table).
    fn notes(&self) -> Vec<String>;
}
