//! The request limits a CPU run derives from its host's memory: the most
//! tokens one prefill pass of the burn LM can take on a worker before its
//! activations exhaust the memory the run leaves it.
//!
//! A prefill pass of `n` prompt tokens in `easerve_model::nn` (f32 on the
//! CPU) holds at its peak, beyond its weights ([`prefill_peak_bytes`]):
//! * the causal bias `[n, n]` and, within one layer's attention, the scores
//!   `[h, n, n]` and softmax's output `[h, n, n]` at once
//!   (`grouped_attention` in `model/src/nn/lm.rs`): `4·n²·(1 + 2h)` bytes;
//! * per token, f32: the residual stream and its norm (`2·d`), the queries,
//!   keys and values (`(h + 2·kvh)·hd`), the attention context (`h·hd`), the
//!   MLP's fused gate and up projection and its product (`3·ffn`; the widest
//!   expert's for an MoE layer), and the KV cache every layer keeps
//!   (`2·layers·kvh·hd`).
//!
//! Each worker process gets an equal share of what the host has available
//! once every worker's f32 weights are loaded ([`cpu_limits`]). A request
//! whose prompt is longer than its worker's pass can take is refused with a
//! 400 before any work, instead of killing the worker that would run it.

use easerve_model::ModelArch;
use easerve_sched::Limits;
use easerve_workload::Scenario;

/// Bytes the weights of `arch` take in f32 (the CPU backend's float type).
pub fn f32_weight_bytes(arch: &ModelArch) -> f64 {
    4.0 * (arch.llm_params() + arch.encoder.as_ref().map_or(0.0, |e| e.params()))
}

/// Memory available to new processes (`MemAvailable` of `/proc/meminfo`), bytes.
pub fn available_memory() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024.0)
}

/// Worker processes a CPU run of `sc` starts: one per replica of the
/// aggregated system; else one per encode, prefill and decode worker, and
/// one per co-located local prefill worker.
pub fn worker_processes(sc: &Scenario) -> u32 {
    let alloc = sc.deployment.allocation;
    match sc.aggregated() {
        Some((replicas, _)) => replicas,
        None => {
            alloc.encode.workers
                + alloc.prefill.workers
                + alloc.decode.workers
                + if sc.deployment.has_local_prefill() {
                    alloc.encode.workers
                } else {
                    0
                }
        }
    }
}

/// Peak bytes beyond the weights of one f32 prefill pass of `n` tokens
/// through `arch`'s LM (module doc).
pub fn prefill_peak_bytes(arch: &ModelArch, n: u64) -> f64 {
    let l = &arch.llm;
    let (h, kvh, hd) = (
        f64::from(l.heads),
        f64::from(l.kv_heads),
        f64::from(l.head_dim),
    );
    let ffn = match &l.moe {
        Some(m) => f64::from(l.ffn.max(m.expert_ffn).max(m.shared_ffn)),
        None => f64::from(l.ffn),
    };
    let per_token = 2.0 * f64::from(l.hidden)
        + (h + 2.0 * kvh) * hd
        + h * hd
        + 3.0 * ffn
        + 2.0 * f64::from(l.layers) * kvh * hd;
    let n = n as f64;
    4.0 * (n * n * (1.0 + 2.0 * h) + n * per_token)
}

/// The most tokens one prefill pass of `arch` may take within `budget`
/// bytes of activations (0 when not even one fits).
pub fn max_prefill_tokens(arch: &ModelArch, budget: f64) -> u64 {
    if prefill_peak_bytes(arch, 1) > budget {
        return 0;
    }
    // the peak grows with n: the largest n within budget, by bisection
    let (mut lo, mut hi) = (1u64, 1u64 << 32);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if prefill_peak_bytes(arch, mid) <= budget {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

/// Bytes one token's K and V take in every layer in f32, as the CPU
/// backend's decode worker keeps them: `2 · layers · kv_heads · head_dim · 4`.
pub fn f32_kv_bytes_per_token(arch: &ModelArch) -> f64 {
    let l = &arch.llm;
    8.0 * f64::from(l.layers) * f64::from(l.kv_heads) * f64::from(l.head_dim)
}

/// The limits a CPU run of `sc` derives from `available` bytes of host
/// memory: each worker process's share of what the weights leave
/// ([`worker_processes`], [`f32_weight_bytes`]) bounds the tokens of one
/// prefill pass ([`max_prefill_tokens`]) and the tokens one sequence's KV
/// cache can hold on a decode worker (`max_model_len`: that share over
/// [`f32_kv_bytes_per_token`], plus the last token, whose KV is never
/// stored). Everything else is unbounded here; tighten the scenario's
/// limits with it.
pub fn cpu_limits(sc: &Scenario, available: f64) -> Limits {
    let workers = f64::from(worker_processes(sc).max(1));
    let left = available - f32_weight_bytes(&sc.model) * workers;
    let share = (left / workers).max(0.0);
    Limits {
        max_prefill_tokens: Some(max_prefill_tokens(&sc.model, share)),
        max_model_len: Some((share / f32_kv_bytes_per_token(&sc.model)).floor() as u64 + 1),
        ..Limits::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pass_limit_is_the_largest_prompt_within_budget() {
        let arch = easerve_model::ModelArch::preset("tiny-image").expect("a preset");
        let budget = 2e9;
        let n = max_prefill_tokens(&arch, budget);
        assert!(n > 100, "{n}");
        assert!(prefill_peak_bytes(&arch, n) <= budget);
        assert!(prefill_peak_bytes(&arch, n + 1) > budget);
        // quadratic: four times the memory, about twice the tokens
        let n4 = max_prefill_tokens(&arch, 4.0 * budget) as f64;
        assert!((1.8..2.1).contains(&(n4 / n as f64)), "{n} {n4}");
        assert_eq!(max_prefill_tokens(&arch, 0.0), 0);
    }
}
