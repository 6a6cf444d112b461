//! HAS Stage 1: per-stage capacities, per-allocation load ratios at the target
//! rate, the bottleneck-balance score, pruning, and the seeds of Stage 2
//! (EAServe §3.1, Algorithm 1 lines 1–12).

use crate::space::{FeasibleAllocation, StageGroups};
use easerve_calib::StageCost;
use easerve_sched::Allocation;
pub use easerve_sim::capacity::{
    alpha, capacities, encode_capacity, pool_parallel, unloaded_latency, Capacities, Typical, MAX_B,
};
use easerve_workload::Scenario;
use serde::{Deserialize, Serialize};

/// Allocations whose score exceeds the best score by more than this factor are
/// pruned (EAServe §3.1: "pruning factor 1.2×").
pub const PRUNE_FACTOR: f64 = 1.2;
/// Survivors kept (EAServe §3.1: top-K = 3).
pub const TOP_K: usize = 3;
/// Rows of Stage 1's table `easerve search` prints by default (beside the
/// survivors): the lowest scores first ([`stage1_rows`]).
pub const TABLE_ROWS: usize = 100;
/// Half-width of the offload window around `s*` (EAServe §3.1: ±0.2).
pub const S_WINDOW: f64 = 0.2;
/// Stage 1's verdict on one allocation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stage1Row {
    /// The allocation.
    pub allocation: Allocation,
    /// Encode load ratio at Λ: `Λ / (nE · C_E)`.
    pub encode_load: f64,
    /// Prefill load ratio at Λ with the offload split at `s*`:
    /// `Λ / (C_remote + C_local)`.
    pub prefill_load: f64,
    /// Decode load ratio at Λ: `Λ / (nD · C_D)`.
    pub decode_load: f64,
    /// Bottleneck-balance score: the largest load ratio.
    pub score: f64,
    /// `C_remote = nP · C_P`, requests/s.
    pub c_remote: f64,
    /// `C_local = nL · α · C_P(TP_L)`, requests/s.
    pub c_local: f64,
    /// α: the share of a prefill worker's capacity a local prefill worker
    /// gets from the SMs encode leaves it at Λ.
    pub alpha: f64,
    /// `s* = C_remote / (C_remote + C_local)`, clamped to the allocation's range.
    pub s_star: f64,
    /// The offload window Stage 2 searches: `s* ± 0.2` within the range.
    pub s_range: (f64, f64),
    /// Largest B Stage 2 tries: `⌈2 · λ_w · max(1 s, T_enc(⌈λ_w⌉))⌉` with
    /// `λ_w = Λ / nE` (see [`b_max`]).
    pub b_max: u32,
    /// One typical request's seconds from its prefill to its last token
    /// on the idle allocation ([`unloaded_latency`] at its prefill and
    /// decode layouts); 0 when not computed.
    #[serde(default)]
    pub latency_s: f64,
    /// On node groups, the group of each stage (encode, prefill, decode),
    /// whose GPU types priced the capacities above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<StageGroups>,
    /// Kept for Stage 2.
    pub kept: bool,
    /// Why kept or pruned.
    pub reason: String,
}

/// `s* = C_remote/(C_remote + C_local)` (1 when both are 0).
pub fn s_star(c_remote: f64, c_local: f64) -> f64 {
    if c_remote + c_local > 0.0 {
        c_remote / (c_remote + c_local)
    } else {
        1.0
    }
}

/// The largest batch bound worth trying for `n_e` encode workers at `rate`.
///
/// The EAServe paper caps B at `⌈Λ / nE⌉` ("a worker is unlikely to fill
/// batches much larger than its arrival rate", §3.1), which counts the
/// arrivals of one second. A worker's batches fill during one encode pass,
/// which here can take longer (its per-pass overhead is calibrated at 1.5 s),
/// and Poisson bursts reach about twice the mean; so the cap used is
/// `⌈2 · λ_w · max(1 s, T_enc(⌈λ_w⌉))⌉` with `λ_w = Λ / nE`, at most
/// [`crate::search::B_CAP`] (the B range every method searches). It equals twice the paper's value when a pass takes ≤ 1 s.
pub fn b_max(caps: &Capacities, n_e: u32, rate: f64) -> u32 {
    let lw = rate / f64::from(n_e.max(1));
    let b0 = (lw.ceil() as usize).clamp(1, MAX_B as usize);
    let t = caps
        .encode_time
        .get(b0 - 1)
        .copied()
        .unwrap_or(1.0)
        .max(1.0);
    ((2.0 * lw * t).ceil() as u32).clamp(1, crate::search::B_CAP)
}

/// Load ratios, score and seeds of one allocation at rate `rate`.
pub fn assess(fa: &FeasibleAllocation, caps: &Capacities, alpha: f64, rate: f64) -> Stage1Row {
    Stage1Row {
        groups: fa.groups.clone(),
        ..assess_ungrouped(fa, caps, alpha, rate)
    }
}

/// [`assess`] without the row's groups (`None`): the same figures, for
/// scoring many allocations without copying their group names.
fn assess_ungrouped(
    fa: &FeasibleAllocation,
    caps: &Capacities,
    alpha: f64,
    rate: f64,
) -> Stage1Row {
    let a = fa.allocation;
    let c_p = caps.prefill_at(pool_parallel(&a.prefill));
    let c_remote = f64::from(a.prefill.workers) * c_p;
    let c_local = match fa.local_tp {
        Some(tp) if fa.local_workers > 0 => {
            f64::from(fa.local_workers) * alpha * caps.local_prefill_at(tp)
        }
        _ => 0.0,
    };
    let (lo, hi) = fa.offload_range;
    let s = s_star(c_remote, c_local).clamp(lo, hi);
    let ratio = |load: f64, cap: f64| {
        if cap > 0.0 {
            load / cap
        } else if load > 0.0 {
            f64::INFINITY
        } else {
            0.0
        }
    };
    let bm = b_max(caps, a.encode.workers, rate);
    // a worker runs batches of at most B_max: its capacity there
    let encode_load = if a.encode.workers == 0 {
        0.0 // text-only: no encode stage
    } else {
        ratio(
            rate,
            f64::from(a.encode.workers) * encode_capacity(caps, bm),
        )
    };
    // the split sends s·Λ remote and (1−s)·Λ local; the stage is as loaded as its busier side
    let prefill_load = ratio(s * rate, c_remote).max(ratio((1.0 - s) * rate, c_local));
    let decode_load = ratio(
        rate,
        f64::from(a.decode.workers) * caps.decode_at(pool_parallel(&a.decode)),
    );
    let score = encode_load.max(prefill_load).max(decode_load);
    Stage1Row {
        allocation: a,
        encode_load,
        prefill_load,
        decode_load,
        score,
        c_remote,
        c_local,
        alpha,
        s_star: s,
        s_range: ((s - S_WINDOW).max(lo), (s + S_WINDOW).min(hi)),
        b_max: bm,
        latency_s: 0.0,
        groups: None,
        kept: false,
        reason: String::new(),
    }
}

/// Of the allocations [`prune`] did not keep whose every stage carries the
/// rate `rate` (score < 1), keep the [`TOP_K`] with the lowest
/// [`Stage1Row::latency_s`]; of equal latencies (allocations that differ
/// only in their worker counts), the least loaded (lowest score: the least
/// queueing), then by allocation text. Below saturation the load score
/// does not rank: every such allocation serves the offered rate, and what
/// separates their goodput is how long each request takes (its TTFT and
/// TPOT against the SLO; in a finite run, the last requests' end). Rows
/// without a latency (0) are not considered. Such a row whose remote
/// prefill workers alone carry the rate (`rate < C_remote`) is seeded at the
/// top of its offload range (`offload_hi` of its row): sending
/// prompts to a local prefill worker then only adds the latency of a worker
/// that shares its GPU with the encoder.
pub fn keep_fastest(
    mut rows: Vec<Stage1Row>,
    rate: f64,
    offload_hi: &dyn Fn(&Stage1Row) -> f64,
) -> Vec<Stage1Row> {
    let fast: Vec<usize> = (0..rows.len())
        .filter(|&i| !rows[i].kept && rows[i].score < 1.0 && rows[i].latency_s > 0.0)
        .collect();
    // equal latencies are common at scale (every count of one layout pair
    // shares it); the text alone used to pick the most loaded of them
    let mut fast: Vec<(String, usize)> = fast
        .into_iter()
        .map(|i| (rows[i].allocation.to_string(), i))
        .collect();
    fast.sort_by(|(ta, a), (tb, b)| {
        let (x, y) = (&rows[*a], &rows[*b]);
        x.latency_s
            .total_cmp(&y.latency_s)
            .then_with(|| x.score.total_cmp(&y.score))
            .then_with(|| ta.cmp(tb))
            .then_with(|| x.groups.cmp(&y.groups))
    });
    let fast: Vec<usize> = fast.into_iter().map(|(_, i)| i).collect();
    for &i in fast.iter().take(TOP_K) {
        let r = &mut rows[i];
        r.kept = true;
        r.reason = format!(
            "kept: carries the rate (score {:.2}) with one of the {TOP_K} lowest request latencies ({:.2} s unloaded)",
            r.score, r.latency_s
        );
        if rate < r.c_remote {
            let hi = offload_hi(r);
            r.s_star = hi;
            r.s_range = ((hi - S_WINDOW).max(r.s_range.0.min(hi)), hi);
        }
    }
    rows
}

/// Keep allocations within [`PRUNE_FACTOR`] of the best score, at most
/// [`TOP_K`] of them (best scores first; ties by allocation text), and say why
/// each was kept or pruned. Rows come back sorted by score.
pub fn prune(mut rows: Vec<Stage1Row>) -> Vec<Stage1Row> {
    // ties (common: several allocations share a bottleneck stage and its load)
    // are broken by the allocation's text, which is arbitrary but deterministic;
    // Stage 2 seeds every survivor, so the order only decides which is tried first
    // each row's text once, not once per comparison
    let mut keyed: Vec<(String, Stage1Row)> = rows
        .into_iter()
        .map(|r| (r.allocation.to_string(), r))
        .collect();
    keyed.sort_by(|(ta, a), (tb, b)| {
        a.score
            .total_cmp(&b.score)
            .then_with(|| ta.cmp(tb))
            .then_with(|| a.groups.cmp(&b.groups))
    });
    rows = keyed.into_iter().map(|(_, r)| r).collect();
    let best = rows.first().map_or(f64::INFINITY, |r| r.score);
    let mut kept = 0;
    for r in &mut rows {
        let stage = [
            ("encode", r.encode_load),
            ("prefill", r.prefill_load),
            ("decode", r.decode_load),
        ]
        .into_iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map_or("", |x| x.0);
        if r.score > PRUNE_FACTOR * best {
            r.reason = format!(
                "pruned: {stage} load {:.2} > {PRUNE_FACTOR}× best score {best:.2}",
                r.score
            );
        } else if kept >= TOP_K {
            r.reason = format!("pruned: within {PRUNE_FACTOR}× but not in the top {TOP_K}");
        } else {
            kept += 1;
            r.kept = true;
            r.reason = format!("kept: bottleneck {stage} at {:.2}", r.score);
        }
    }
    rows
}

/// Stage 1 over every feasible allocation at rate `rate`: each scored on
/// the capacities of its stages' GPU types (on node groups, the groups
/// its [`FeasibleAllocation::groups`] names; `sc` and `cost` price the
/// scenario's own groups), then pruned across all of them; on several
/// assignments the rows Stage 1 keeps of the scenario's own groups alone
/// are kept too. The capacities returned are the scenario's own groups'.
/// One row per allocation of `space` ([`stage1_rows`] with `None`).
pub fn stage1(
    sc: &Scenario,
    cost: &dyn StageCost,
    space: &[FeasibleAllocation],
    rate: f64,
) -> (Capacities, Vec<Stage1Row>) {
    stage1_rows(sc, cost, space, rate, None)
}

/// [`stage1`], with rows for only some of `space` when `top` is
/// `Some(n)`: every allocation is scored, and rows are built (and
/// pruned) for the [`LOWEST_PER_LAYOUT`] lowest of each assignment's
/// prefill and decode layouts and the `n` lowest of all (by score, then
/// allocation text, then groups). The rows kept, their reasons and seeds, and the
/// first `n` rows are those of [`stage1`]: within one layout pair of one
/// assignment every row shares its unloaded latency and groups, so both
/// of Stage 1's rankings order its rows by score then text, and what they
/// keep ([`TOP_K`] by score, then [`TOP_K`] more by latency) is among its
/// first `2 · TOP_K` (tested in
/// `rows_for_the_lowest_of_each_layout_keep_what_every_row_keeps`). On
/// `dc-1024.toml` with `--all-groups`: at most 1,060 rows of 1,069,527
/// feasible allocations (docs/datacenter.md).
pub fn stage1_rows(
    sc: &Scenario,
    cost: &dyn StageCost,
    space: &[FeasibleAllocation],
    rate: f64,
    top: Option<usize>,
) -> (Capacities, Vec<Stage1Row>) {
    let typical = Typical::of_scenario(sc);
    // the search space's encode workers run at TP 1
    let caps = capacities(sc, cost, &typical, 1);
    let own = crate::space::stage_assignments(&sc.raw).into_iter().next();
    let runs = assignment_runs(space);
    let price = Pricing {
        sc,
        cost,
        caps: &caps,
        typical: &typical,
        own: &own,
    };
    let chosen: Option<Vec<bool>> = top.map(|n| {
        let mut chosen = vec![false; space.len()];
        let mut scored: Vec<(f64, usize)> = Vec::with_capacity(space.len());
        for run in &runs {
            let Some(scores) = price.on(space, run, &mut |s, c, k, fas| {
                scores(s, c, k, &typical, fas, rate)
            }) else {
                continue;
            };
            let mut by_layout: std::collections::HashMap<_, Vec<(f64, usize)>> = Default::default();
            for (i, score) in run.clone().zip(scores) {
                let a = &space[i].allocation;
                let key = (
                    (a.prefill.workers > 0).then(|| pool_parallel(&a.prefill)),
                    pool_parallel(&a.decode),
                );
                by_layout.entry(key).or_default().push((score, i));
                scored.push((score, i));
            }
            for members in by_layout.into_values() {
                for i in lowest(members, LOWEST_PER_LAYOUT, space) {
                    chosen[i] = true;
                }
            }
        }
        for i in lowest(scored, n, space) {
            chosen[i] = true;
        }
        chosen
    });
    let mut rows = Vec::with_capacity(chosen.as_ref().map_or(space.len(), |_| 0));
    for run in &runs {
        let picked: Vec<FeasibleAllocation> = match &chosen {
            Some(c) => run
                .clone()
                .filter(|&i| c[i])
                .map(|i| space[i].clone())
                .collect(),
            None => Vec::new(),
        };
        let built = price.on(space, run, &mut |s, c, k, all| {
            let fas = if chosen.is_some() { &picked[..] } else { all };
            assess_all(s, c, k, &typical, fas, rate).collect::<Vec<_>>()
        });
        rows.extend(built.into_iter().flatten());
    }
    let hi = |r: &Stage1Row| {
        space
            .iter()
            .find(|fa| fa.allocation == r.allocation && fa.groups == r.groups)
            .map_or(1.0, |fa| fa.offload_range.1)
    };
    (caps, select(rows, rate, &own, &hi))
}

/// Rows of one assignment, of each prefill and decode layout pair, that
/// [`stage1_rows`] builds at least (`2 ·` [`TOP_K`]: what Stage 1's two
/// rankings can keep of one such pair).
pub const LOWEST_PER_LAYOUT: usize = 2 * TOP_K;

/// The ranges of `space` that hold one stage assignment each (the space
/// comes in runs of one assignment).
fn assignment_runs(space: &[FeasibleAllocation]) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut start = 0;
    while start < space.len() {
        let groups = &space[start].groups;
        let end = space[start..]
            .iter()
            .position(|fa| fa.groups != *groups)
            .map_or(space.len(), |n| start + n);
        runs.push(start..end);
        start = end;
    }
    runs
}

/// What prices the rows of one assignment: the scenario's own groups
/// (`sc`, `cost`, `caps`), or another assignment's, validated on its
/// first allocation.
struct Pricing<'a> {
    sc: &'a Scenario,
    cost: &'a dyn StageCost,
    caps: &'a Capacities,
    typical: &'a Typical,
    own: &'a Option<StageGroups>,
}

/// A computation on one assignment's allocations, given its scenario,
/// cost model and capacities.
type OnRun<'f, R> =
    dyn FnMut(&Scenario, &dyn StageCost, &Capacities, &[FeasibleAllocation]) -> R + 'f;

impl Pricing<'_> {
    /// `f` on the run `run` of `space`, priced on its groups' GPUs; `None`
    /// when the assignment does not validate.
    fn on<R>(
        &self,
        space: &[FeasibleAllocation],
        run: &std::ops::Range<usize>,
        f: &mut OnRun<'_, R>,
    ) -> Option<R> {
        let fas = &space[run.clone()];
        let groups = &fas.first()?.groups;
        if groups.is_none() || groups == self.own {
            return Some(f(self.sc, self.cost, self.caps, fas));
        }
        // another assignment: its stages priced on their groups' GPUs
        let other = on_groups(self.sc, &fas[0])?;
        let other_cost = other.cost();
        let other_caps = capacities(&other, other_cost.as_ref(), self.typical, 1);
        Some(f(&other, other_cost.as_ref(), &other_caps, fas))
    }
}

/// Stage 1's verdicts on `rows`: [`prune`] then [`keep_fastest`] across all
/// of them; on several assignments also what they keep of the scenario's
/// own groups (`own`) alone, so enumerating the groups never drops the
/// seeds a search on the file's groups would run. `hi`: a row's highest
/// offload ratio.
fn select(
    mut rows: Vec<Stage1Row>,
    rate: f64,
    own: &Option<StageGroups>,
    hi: &dyn Fn(&Stage1Row) -> f64,
) -> Vec<Stage1Row> {
    let mut all = keep_fastest(prune(rows.clone()), rate, hi);
    if all.iter().any(|r| r.groups != *own) {
        rows.retain(|r| r.groups == *own);
        for k in keep_fastest(prune(rows), rate, hi)
            .into_iter()
            .filter(|r| r.kept)
        {
            if let Some(r) = all
                .iter_mut()
                .find(|r| !r.kept && r.allocation == k.allocation && r.groups == k.groups)
            {
                *r = Stage1Row {
                    reason: format!("{} (of the scenario's own groups)", k.reason),
                    ..k
                };
            }
        }
    }
    all
}

/// The indices of the `k` lowest of `items` (score, index into `space`) by
/// score, then allocation text, then groups (the order of [`prune`]); the
/// text is formatted only for the scores tied at the `k`-th.
fn lowest(mut items: Vec<(f64, usize)>, k: usize, space: &[FeasibleAllocation]) -> Vec<usize> {
    if items.len() <= k {
        return items.into_iter().map(|(_, i)| i).collect();
    }
    if k == 0 {
        return Vec::new();
    }
    items.select_nth_unstable_by(k - 1, |a, b| a.0.total_cmp(&b.0));
    let bound = items[k - 1].0;
    let below: Vec<(f64, usize)> = items
        .into_iter()
        .filter(|(s, _)| s.total_cmp(&bound).is_le())
        .collect();
    if below.len() == k {
        return below.into_iter().map(|(_, i)| i).collect();
    }
    let mut keyed: Vec<(f64, String, usize)> = below
        .into_iter()
        .map(|(s, i)| (s, space[i].allocation.to_string(), i))
        .collect();
    keyed.sort_by(|(sa, ta, a), (sb, tb, b)| {
        sa.total_cmp(sb)
            .then_with(|| ta.cmp(tb))
            .then_with(|| space[*a].groups.cmp(&space[*b].groups))
    });
    keyed.into_iter().take(k).map(|(_, _, i)| i).collect()
}

/// The score [`assess`] gives each of `space` on `sc`'s cost model (α once
/// per distinct local prefill TP and encode count, as [`assess_all`]).
fn scores(
    sc: &Scenario,
    cost: &dyn StageCost,
    caps: &Capacities,
    typical: &Typical,
    space: &[FeasibleAllocation],
    rate: f64,
) -> Vec<f64> {
    let mut alphas: std::collections::HashMap<(Option<u32>, u32), f64> = Default::default();
    space
        .iter()
        .map(|fa| {
            let n_e = fa.allocation.encode.workers;
            let alpha = *alphas
                .entry((fa.local_tp, n_e))
                .or_insert_with(|| alpha(sc, cost, typical, fa.local_tp, n_e, rate));
            assess_ungrouped(fa, caps, alpha, rate).score
        })
        .collect()
}

/// `sc` on the stage groups of `fa`, with its allocation (which validates).
fn on_groups(sc: &Scenario, fa: &FeasibleAllocation) -> Option<Scenario> {
    let c = crate::space::Candidate {
        allocation: fa.allocation,
        batch: 1,
        offload: fa.offload_range.1,
        groups: fa.groups.clone(),
    };
    crate::space::validate(&sc.raw, &sc.file, &c.overrides(&Default::default()))
}

/// [`assess`] of each of `space` on `sc`'s cost model, with its unloaded
/// request latency. α depends on the allocation only through its local
/// prefill TP and encode count, and the latency only through its prefill and
/// decode layouts: each is computed once per distinct value (the same
/// figures as computing them per row; on `dc-256.toml` with `--all-groups`,
/// 68,247 rows share a few hundred of each).
fn assess_all<'a>(
    sc: &'a Scenario,
    cost: &'a dyn StageCost,
    caps: &'a Capacities,
    typical: &'a Typical,
    space: &'a [FeasibleAllocation],
    rate: f64,
) -> impl Iterator<Item = Stage1Row> + 'a {
    use std::collections::HashMap;
    let mut alphas: HashMap<(Option<u32>, u32), f64> = HashMap::new();
    let mut latencies: HashMap<(easerve_model::Parallel, easerve_model::Parallel), f64> =
        HashMap::new();
    space.iter().map(move |fa| {
        let a = &fa.allocation;
        let alpha = *alphas
            .entry((fa.local_tp, a.encode.workers))
            .or_insert_with(|| alpha(sc, cost, typical, fa.local_tp, a.encode.workers, rate));
        let mut row = assess(fa, caps, alpha, rate);
        row.latency_s = match a.prefill.workers {
            0 => 0.0, // no remote prefill: every prompt prefills locally
            _ => {
                let layouts = (pool_parallel(&a.prefill), pool_parallel(&a.decode));
                *latencies
                    .entry(layouts)
                    .or_insert_with(|| unloaded_latency(cost, typical, layouts.0, layouts.1))
            }
        };
        row
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fa(alloc: &str, local: u32) -> FeasibleAllocation {
        FeasibleAllocation {
            allocation: alloc.parse().unwrap(),
            local_workers: local,
            local_tp: (local > 0).then_some(2),
            offload_range: if local > 0 { (0.0, 1.0) } else { (1.0, 1.0) },
            groups: None,
        }
    }

    fn caps() -> Capacities {
        Capacities {
            encode: 1.0,
            encode_batch: 8,
            encode_time: vec![],
            prefill: vec![(2.into(), 2.0), (4.into(), 3.0)],
            decode: vec![(2.into(), 2.0), (4.into(), 4.0)],
            local_prefill: vec![],
        }
    }

    #[test]
    fn s_star_is_the_capacity_share_of_remote() {
        assert_eq!(s_star(3.0, 1.0), 0.75);
        assert_eq!(s_star(0.0, 2.0), 0.0);
        assert_eq!(s_star(0.0, 0.0), 1.0);
        let r = assess(&fa("2E(TP1)+1P(TP2)+1D(TP4)", 1), &caps(), 0.5, 2.0);
        // C_remote = 1·2, C_local = 1·0.5·2 = 1 → s* = 2/3
        assert!((r.s_star - 2.0 / 3.0).abs() < 1e-12);
        assert!((r.s_range.0 - (2.0 / 3.0 - 0.2)).abs() < 1e-12 && r.s_range.1 == 2.0 / 3.0 + 0.2);
        // prefill split at s*: Λ / (C_remote + C_local) = 2/3
        assert!((r.prefill_load - 2.0 / 3.0).abs() < 1e-12);
        // λ_w = 1 req/s, no encode table (T taken as 1 s): B_max = ⌈2·1·1⌉
        assert_eq!(r.b_max, 2);
    }

    #[test]
    fn pruning_keeps_the_balanced_top_three() {
        let c = caps();
        let rate = 4.0;
        let rows: Vec<Stage1Row> = [
            fa("4E(TP1)+1P(TP2)+1D(TP2)", 2), // E 1.0, P 4/(2+2·0.5·2)=1.0, D 2.0 → 2.0
            fa("2E(TP1)+1P(TP2)+1D(TP4)", 1), // E 2.0, P 4/3, D 1.0 → 2.0
            fa("2E(TP1)+1P(TP4)+1D(TP2)", 0), // E 2.0, P 4/3, D 2.0 → 2.0
            fa("1E(TP1)+1P(TP2)+1D(TP4)", 0), // E 4.0 → pruned (> 1.2 × 2.0)
            fa("3E(TP1)+1P(TP4)+1D(TP1)", 0), // D cap 0 → ∞ → pruned
            fa("2E(TP1)+2P(TP2)+1D(TP2)", 0), // E 2, P 1, D 2 → 2.0 (4th within 1.2×)
        ]
        .iter()
        .map(|f| assess(f, &c, 0.5, rate))
        .collect();
        let out = prune(rows);
        let kept: Vec<String> = out
            .iter()
            .filter(|r| r.kept)
            .map(|r| r.allocation.to_string())
            .collect();
        assert_eq!(kept.len(), 3);
        assert!(!kept.contains(&"1E(TP1)+1P(TP2)+1D(TP4)".to_string()));
        assert!(!kept.contains(&"3E(TP1)+1P(TP4)+1D(TP1)".to_string()));
        let by = |a: &str| out.iter().find(|r| r.allocation.to_string() == a).unwrap();
        assert!(by("1E(TP1)+1P(TP2)+1D(TP4)")
            .reason
            .starts_with("pruned: encode"));
        assert!(by("3E(TP1)+1P(TP4)+1D(TP1)")
            .reason
            .starts_with("pruned: decode"));
        assert_eq!(
            out.iter()
                .filter(|r| r.reason.contains("not in the top"))
                .count(),
            1
        );
        assert!(out.windows(2).all(|w| w[0].score <= w[1].score));
    }

    /// Rows built for the lowest scores of each layout pair only keep the
    /// rows, reasons and seeds that a row per allocation keeps, and the
    /// first rows are the same: on every stage assignment of
    /// `two-group.toml` (146 allocations) and `dc-64.toml` (4,587), at
    /// the file's rate and at a quarter of it (where rows are also kept for
    /// their latency), showing no row or 5 (a few seconds in release).
    #[test]
    fn rows_for_the_lowest_of_each_layout_keep_what_every_row_keeps() {
        let mut by_latency = 0;
        for name in ["two-group.toml", "dc-64.toml"] {
            let path = format!("{}/../scenarios/{name}", env!("CARGO_MANIFEST_DIR"));
            let sc = Scenario::load(std::path::Path::new(&path), &Default::default()).unwrap();
            let cost = easerve_sim::scenario_cost(&sc);
            let space = crate::space::feasible_allocations_across_groups(&sc);
            for rate in [sc.workload.rate, sc.workload.rate / 4.0] {
                let (caps, every) = stage1(&sc, cost.as_ref(), &space, rate);
                let kept = |rows: &[Stage1Row]| -> Vec<Stage1Row> {
                    rows.iter().filter(|r| r.kept).cloned().collect()
                };
                assert_eq!(every.len(), space.len());
                for top in [0, 5] {
                    let (caps_few, few) = stage1_rows(&sc, cost.as_ref(), &space, rate, Some(top));
                    assert_eq!(caps_few, caps);
                    assert!(few.len() < every.len(), "{name}: {} rows", few.len());
                    assert_eq!(kept(&few), kept(&every), "{name} at {rate}");
                    assert_eq!(few[..top], every[..top], "{name} at {rate}");
                }
                by_latency += kept(&every)
                    .iter()
                    .filter(|r| r.reason.contains("request latencies"))
                    .count();
            }
        }
        // the second ranking kept rows too (else half the claim is untested)
        assert!(by_latency > 0);
    }

    /// Rows that carry the rate at one unloaded latency (every count of one
    /// layout pair shares it, as on `dc-256.toml` scaled to 1,024 GPUs,
    /// where the allocation text used to keep the three most loaded): the
    /// least loaded are kept.
    #[test]
    fn of_equally_fast_allocations_the_least_loaded_are_kept() {
        let c = caps();
        let rows: Vec<Stage1Row> = [
            ("1E(TP1)+1P(TP2)+4D(TP2)", 0.9),
            ("1E(TP1)+2P(TP2)+3D(TP2)", 0.5),
            ("1E(TP1)+3P(TP2)+2D(TP2)", 0.3),
            ("1E(TP1)+4P(TP2)+1D(TP2)", 0.4),
        ]
        .iter()
        .map(|&(a, score)| {
            let mut r = assess(&fa(a, 0), &c, 0.5, 0.1);
            (r.score, r.latency_s) = (score, 1.0);
            r
        })
        .collect();
        let kept: Vec<String> = keep_fastest(rows, 0.1, &|_| 1.0)
            .iter()
            .filter(|r| r.kept)
            .map(|r| r.allocation.to_string())
            .collect();
        assert_eq!(kept.len(), 3);
        assert!(
            !kept.contains(&"1E(TP1)+1P(TP2)+4D(TP2)".to_string()),
            "{kept:?}"
        );
    }
}
