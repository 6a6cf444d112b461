//! Step budgets set by a TPOT SLO (HydraInfer, Dong et al., 2025): the most
//! images one step of an instance encodes and the most tokens one step
//! prefills (or decodes), each the largest whose step still fits the SLO.
//!
//! HydraInfer's profiler (`hydrainfer/engine/profiler.py`) binary-searches
//! each budget on the instance's own GPU: images of 336 × 336 pixels up to 8
//! for the image budget, prompts of 16 tokens up to 2048 tokens for the
//! token budget, keeping a size whose measured step is under `SLO − 10 ms`.
//! The SLO is a per-instance setting (`batch_scheduler_profiler.tpot_slo`):
//! 1 s for E, P and EP instances and 0.4 s for the others
//! (`hydrainfer/config/node/*.yaml`). Here the step times come from the cost
//! model, as closures.

/// Largest image budget HydraInfer's profiler tries (images per step).
pub const MAX_IMAGE_BUDGET: u64 = 8;
/// Largest token budget HydraInfer's profiler tries (tokens per step).
pub const MAX_TOKEN_BUDGET: u64 = 2048;
/// Seconds a budgeted step stays under the SLO by.
pub const SLO_MARGIN_S: f64 = 0.01;
/// HydraInfer's TPOT SLO of an instance that encodes or prefills but does
/// not decode (E, P, EP), seconds.
pub const NO_DECODE_TPOT_SLO_S: f64 = 1.0;
/// HydraInfer's TPOT SLO of an instance that decodes (D, and its default), seconds.
pub const DECODE_TPOT_SLO_S: f64 = 0.4;
/// Tokens of each prompt in the token-budget probe.
pub const PROBE_PROMPT_TOKENS: u64 = 16;

/// The largest `n` in `1..=max` whose step takes under `slo − `[`SLO_MARGIN_S`]
/// seconds (`step(n)`, non-decreasing in `n`); 1 when even one does not.
///
/// HydraInfer's own search steps past the boundary (it keeps `mid + 1` after
/// a size passes, so it can return one size more than the largest that
/// passes); this returns the largest that passes.
pub fn largest_within(max: u64, slo: f64, step: impl Fn(u64) -> f64) -> u64 {
    let limit = slo - SLO_MARGIN_S;
    let (mut lo, mut hi) = (1u64, max.max(1));
    if step(lo) >= limit {
        return 1;
    }
    // invariant: step(lo) fits; everything above hi does not
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if step(mid) < limit {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// The budgets of a HydraInfer deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepBudgets {
    /// Images (requests) an encoding step takes at most: the encode batch bound B.
    pub images: u64,
    /// Tokens a prefilling step takes at most (chunked at the edge).
    pub prefill_tokens: u64,
    /// Sequences a decoding step takes at most (one token each).
    pub decode_tokens: u64,
}

impl StepBudgets {
    /// The budgets from the step times of the instances that would run them:
    /// `encode(n)` seconds for `n` probe images on an encoding instance,
    /// `prefill(n)` for `n` tokens of 16-token prompts on a prefilling one
    /// (both under [`NO_DECODE_TPOT_SLO_S`]), `decode(n)` for the same on a
    /// decoding one (under [`DECODE_TPOT_SLO_S`]).
    pub fn from_step_times(
        encode: impl Fn(u64) -> f64,
        prefill: impl Fn(u64) -> f64,
        decode: impl Fn(u64) -> f64,
    ) -> StepBudgets {
        StepBudgets {
            images: largest_within(MAX_IMAGE_BUDGET, NO_DECODE_TPOT_SLO_S, encode),
            prefill_tokens: largest_within(MAX_TOKEN_BUDGET, NO_DECODE_TPOT_SLO_S, prefill),
            decode_tokens: largest_within(MAX_TOKEN_BUDGET, DECODE_TPOT_SLO_S, decode),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_size_under_the_slo_less_its_margin() {
        // 0.1 s a unit: 9 units take 0.9 s < 0.99 s, 10 take 1 s
        assert_eq!(largest_within(2048, 1.0, |n| 0.1 * n as f64), 9);
        assert_eq!(largest_within(8, 1.0, |n| 0.01 * n as f64), 8);
        assert_eq!(largest_within(8, 1.0, |_| 2.0), 1);
        let b = StepBudgets::from_step_times(|n| 0.2 * n as f64, |n| 1e-3 * n as f64, |_| 0.1);
        assert_eq!(
            (b.images, b.prefill_tokens, b.decode_tokens),
            (4, 989, 2048)
        );
    }
}
