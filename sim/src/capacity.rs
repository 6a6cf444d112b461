//! Per-worker stage capacities of a scenario's model, GPU and workload, from
//! its cost model: what HAS's Stage 1 scores allocations with, and what the
//! report's explanation compares offered load against.

use easerve_calib::{Efficiency, Roofline, StageCost};
use easerve_model::{ItemTokens, Parallel};
use easerve_sched::{Request, SmSplit, TIME_SLICE_SHARE};
use easerve_workload::generate::{generate_with_tokens, median_by_encoder_tokens, ItemTokenTable};
use easerve_workload::Scenario;
use serde::{Deserialize, Serialize};

/// TP degrees capacities are computed for.
pub const TP_DEGREES: [u32; 4] = [1, 2, 4, 8];

/// Largest batch bound Stage 1 considers.
pub const MAX_B: u32 = 64;

/// Per-worker capacities of the stages, requests/s.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Capacities {
    /// One encode worker (at the TP [`capacities`] was asked for) at its
    /// best batch (`C_E`), found by doubling B until
    /// encode throughput saturates (gains < 5 %).
    pub encode: f64,
    /// The batch at which `encode` was reached.
    pub encode_batch: u32,
    /// Seconds between back-to-back passes of `B` typical requests on one
    /// encode worker, for `B = 1..=`[`MAX_B`]: `C_E(B) = B / T_enc(B)`. The
    /// pass's whole time when it preprocesses its own micro-batch; with
    /// preprocessing pipelined, the slower of its GPU side and its host side
    /// ([`easerve_calib::EncodeTime::cycle`]).
    pub encode_time: Vec<f64>,
    /// One remote prefill worker at layout `p` (a TP degree, or TP and EP)
    /// (`C_P`), as `(p, capacity)`.
    pub prefill: Vec<(Parallel, f64)>,
    /// One decode worker at layout `p` (`C_D`), as `(p, capacity)`.
    pub decode: Vec<(Parallel, f64)>,
    /// One local prefill worker at layout `p` with the whole encode GPU,
    /// when it runs on another GPU type than the remote prefill workers (a
    /// cluster of node groups, [`Scenario::local_prefill_cost`]); empty: as
    /// `prefill`.
    pub local_prefill: Vec<(Parallel, f64)>,
}

impl Capacities {
    fn at(table: &[(Parallel, f64)], par: Parallel) -> f64 {
        table
            .iter()
            .find(|(p, _)| *p == par)
            .map_or(0.0, |(_, c)| *c)
    }

    /// `C_P` at `par` (a TP degree, or [`Parallel`]; 0 when not profiled).
    pub fn prefill_at(&self, par: impl Into<Parallel>) -> f64 {
        Self::at(&self.prefill, par.into())
    }

    /// A local prefill worker's `C_P` at `par` on its encode GPU (0 when
    /// not profiled).
    pub fn local_prefill_at(&self, par: impl Into<Parallel>) -> f64 {
        match self.local_prefill.is_empty() {
            true => self.prefill_at(par),
            false => Self::at(&self.local_prefill, par.into()),
        }
    }

    /// `C_D` at `par` (0 when not profiled).
    pub fn decode_at(&self, par: impl Into<Parallel>) -> f64 {
        Self::at(&self.decode, par.into())
    }
}

/// The layout of one worker of a stage pool: its TP and EP.
pub fn pool_parallel(pool: &easerve_sched::StagePool) -> Parallel {
    Parallel::new(pool.tp, pool.ep)
}

/// The workload's typical request: the items of the median request by
/// encoder tokens, and the mean prompt (prefill tokens) and output.
#[derive(Clone, Debug, PartialEq)]
pub struct Typical {
    items: Vec<ItemTokens>,
    prefill_tokens: f64,
    output_tokens: f64,
    /// Expected encoder-cache hit rate (items) with the cache on, else 0.
    encode_hit: f64,
    /// The encoder cache's hits skip preprocessing too.
    raw_hash: bool,
    /// Expected prefix-cache hit rate (prompt tokens) with the cache on, else 0.
    prefix_hit: f64,
}

impl Typical {
    /// The typical request of the scenario's generated workload, with the
    /// hit rates its caches can expect ([`Typical::with_hits`]).
    pub fn of_scenario(sc: &Scenario) -> Typical {
        let (reqs, tokens) = generate_with_tokens(sc);
        Typical::of(&reqs, &tokens).with_hits(sc, &reqs)
    }

    /// The same request with the hit rates `sc`'s caches can expect on
    /// `reqs`: the reuse the workload offers
    /// ([`easerve_workload::reuse::offered_reuse`], what an unbounded cache
    /// that saw every earlier request finds) for each cache that is on.
    /// An upper bound: per-worker caches, their capacity and routing lower
    /// it (the report's per-cache hit rates say by how much).
    pub fn with_hits(self, sc: &Scenario, reqs: &[Request]) -> Typical {
        if sc.knobs.caches.is_off() {
            return self;
        }
        let offered = easerve_workload::reuse::offered_reuse(reqs, block_size(sc));
        self.with_offered(sc, &offered)
    }

    /// [`Typical::with_hits`] from the reuse already counted.
    pub fn with_offered(
        mut self,
        sc: &Scenario,
        offered: &easerve_workload::reuse::OfferedReuse,
    ) -> Typical {
        let c = sc.knobs.caches;
        // the shared store reaches the offered reuse from every encode
        // worker (its fetches are not priced here)
        if c.encoder.is_some() || c.store.is_some() {
            self.encode_hit = offered.items_seen_before;
            self.raw_hash = c.encoder.is_some_and(|e| e.hash_raw_bytes);
        }
        if c.prefix.is_some() {
            self.prefix_hit = offered.prompt_tokens_seen_before;
        }
        self
    }

    /// Seconds between back-to-back passes of `b` typical requests on one
    /// encode worker at TP `tp`: with the encoder cache, the GPU work (and, hashing raw
    /// bytes, the preprocessing) of the `⌈b·(1 − hit)⌉` requests' items that
    /// miss; the framework's terms of all `b`.
    fn encode_cycle(&self, cost: &dyn StageCost, b: u32, tp: u32, threads: Option<u32>) -> f64 {
        let full = cost.encode_tp(&batch_of(&self.items, b), 1.0, tp);
        if self.encode_hit <= 0.0 {
            return full.cycle(threads);
        }
        let misses = (f64::from(b) * (1.0 - self.encode_hit)).ceil() as u32;
        let miss = cost.encode_tp(&batch_of(&self.items, misses), 1.0, tp);
        easerve_calib::EncodeTime {
            t_pass: full.t_pass,
            t_pre: if self.raw_hash {
                miss.t_pre
            } else {
                full.t_pre
            },
            t_gpu: miss.t_gpu,
        }
        .cycle(threads)
    }

    /// The typical request of `reqs`, whose items have `tokens`.
    pub fn of(reqs: &[Request], tokens: &ItemTokenTable) -> Typical {
        typical(reqs, tokens)
    }
}

fn typical(reqs: &[Request], tokens: &ItemTokenTable) -> Typical {
    let n = reqs.len().max(1) as f64;
    Typical {
        items: median_by_encoder_tokens(reqs, |_| true)
            .map(|i| tokens[i].to_vec())
            .unwrap_or_default(),
        prefill_tokens: reqs.iter().map(|r| r.prefill_tokens() as f64).sum::<f64>() / n,
        output_tokens: reqs.iter().map(|r| r.output_tokens as f64).sum::<f64>() / n,
        encode_hit: 0.0,
        raw_hash: false,
        prefix_hit: 0.0,
    }
}

fn batch_of(items: &[ItemTokens], k: u32) -> Vec<ItemTokens> {
    items
        .iter()
        .copied()
        .cycle()
        .take(items.len() * k as usize)
        .collect()
}

/// Requests/s of one prefill worker at TP `tp` and SM share `share`, with
/// batches filled to the token budget at the workload's mean prompt.
fn prefill_capacity(
    cost: &dyn StageCost,
    sc: &Scenario,
    t: &Typical,
    par: Parallel,
    share: f64,
) -> f64 {
    // with the prefix cache, a batch computes each prompt's uncached part
    // attending over the whole prompt ([`StageCost::prefill_cached`])
    let whole = t.prefill_tokens.max(1.0);
    let per = (whole * (1.0 - t.prefix_hit)).max(1.0);
    let n = ((sc.knobs.prefill_token_budget as f64 / per).floor() as usize)
        .clamp(1, sc.knobs.prefill_max_seqs);
    let dur = if t.prefix_hit > 0.0 {
        let cached = (whole - per).round() as u64;
        cost.prefill_cached(&vec![per.round() as u64; n], &vec![cached; n], par, share)
    } else {
        cost.prefill(&vec![per.round() as u64; n], par, share)
    };
    if dur > 0.0 {
        n as f64 / dur
    } else {
        f64::INFINITY
    }
}

/// The `(TP, EP)` layouts a prefill or decode worker may take: every degree of
/// [`TP_DEGREES`] at EP1, and for an MoE model of `moe_experts` experts each
/// EP of 2, 4, 8 that divides them with `TP × EP` within one node
/// ([`easerve_workload::scenario::NODE_GPUS`]).
pub fn worker_layouts(moe_experts: Option<u32>) -> Vec<(u32, u32)> {
    let node = easerve_workload::scenario::NODE_GPUS;
    let mut out: Vec<(u32, u32)> = TP_DEGREES.iter().map(|&t| (t, 1)).collect();
    if let Some(experts) = moe_experts {
        for ep in [2u32, 4, 8] {
            for &tp in &TP_DEGREES {
                if tp * ep <= node && experts.is_multiple_of(ep) {
                    out.push((tp, ep));
                }
            }
        }
    }
    out
}

/// The block size reuse is counted in: the prefix cache's, or vLLM's 16.
pub fn block_size(sc: &Scenario) -> u32 {
    sc.knobs
        .caches
        .prefix
        .map_or(easerve_sched::cache::DEFAULT_BLOCK_SIZE, |p| p.block_size)
}

/// Per-stage capacities of the scenario's model, GPU and workload, with
/// encode workers at TP `encode_tp` ([`StageCost::encode_tp`]).
pub fn capacities(sc: &Scenario, cost: &dyn StageCost, t: &Typical, encode_tp: u32) -> Capacities {
    let threads = sc.knobs.preprocess_threads;
    // C_E: double B until throughput gains < 5 %
    let (mut encode, mut encode_batch) = (0.0, 1);
    if !t.items.is_empty() {
        let mut b = 1u32;
        loop {
            let thr = f64::from(b) / t.encode_cycle(cost, b, encode_tp, threads);
            if thr < encode * 1.05 || b > 1024 {
                if thr > encode {
                    (encode, encode_batch) = (thr, b);
                }
                break;
            }
            (encode, encode_batch) = (thr, b);
            b *= 2;
        }
    }
    let encode_time = if t.items.is_empty() {
        Vec::new()
    } else {
        (1..=MAX_B)
            .map(|b| t.encode_cycle(cost, b, encode_tp, threads))
            .collect()
    };
    let memory = Roofline::new(sc.model.clone(), sc.gpu.clone(), Efficiency::default());
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    // the usual degrees plus any the scenario's own deployment uses
    let a = &sc.deployment.allocation;
    let experts = sc.model.llm.moe.as_ref().map(|m| m.experts);
    let mut layouts: Vec<Parallel> = worker_layouts(experts)
        .into_iter()
        .map(|(t, e)| Parallel::new(t, e))
        .collect();
    layouts.extend([pool_parallel(&a.prefill), pool_parallel(&a.decode)]);
    layouts.extend(sc.knobs.local_prefill_tp.map(Parallel::from));
    layouts.sort_unstable_by_key(|p| (p.ep, p.tp));
    layouts.dedup();
    // on node groups prefill may be on another GPU type than decode
    // (`sc.gpu`): a prefill layout fits its own group's GPU
    let prefill_memory = sc.cluster.as_ref().map(|c| {
        let gpu = c.groups[c.stage_groups[1]].gpu.clone();
        Roofline::new(sc.model.clone(), gpu, Efficiency::default())
    });
    let util = sc.knobs.gpu_memory_utilization;
    for &par in &layouts {
        let fits = |m: &Roofline| m.kv_bytes_free_per_gpu(par, 0.0, util).is_some();
        if prefill_memory.as_ref().map_or(fits(&memory), fits) {
            prefill.push((par, prefill_capacity(cost, sc, t, par, 1.0)));
        }
        let Some(free) = memory.kv_bytes_free_per_gpu(par, 0.0, util) else {
            continue;
        };
        let per_seq = t.prefill_tokens + t.output_tokens;
        let kv_tokens = free * f64::from(par.gpus()) / sc.model.kv_bytes_per_token();
        let b = (kv_tokens / per_seq)
            .floor()
            .clamp(1.0, sc.knobs.decode_max_batch as f64);
        let ctx = b * (t.prefill_tokens + t.output_tokens / 2.0);
        let step = cost.decode_step(b as u64, ctx as u64, par);
        decode.push((par, b / (t.output_tokens.max(1.0) * step)));
    }
    let local_prefill = match sc.local_prefill_cost() {
        Some(lc) => layouts
            .iter()
            .map(|&par| (par, prefill_capacity(&*lc, sc, t, par, 1.0)))
            .collect(),
        None => Vec::new(),
    };
    Capacities {
        encode,
        encode_batch,
        encode_time,
        prefill,
        decode,
        local_prefill,
    }
}

/// One typical request's seconds from the start of its prefill to its last
/// token on an idle deployment: its prompt prefilled alone at layout
/// `prefill` ([`StageCost::prefill`]) plus its output tokens, each one decode
/// step at batch 1 over its mean context (prompt + half the output) at layout
/// `decode` ([`StageCost::decode_step`]). What separates allocations that
/// all carry the offered rate: their requests' latency, not their load.
pub fn unloaded_latency(
    cost: &dyn StageCost,
    t: &Typical,
    prefill: Parallel,
    decode: Parallel,
) -> f64 {
    let prompt = t.prefill_tokens.max(1.0).round() as u64;
    let context = (t.prefill_tokens + t.output_tokens / 2.0).round() as u64;
    cost.prefill(&[prompt], prefill, 1.0)
        + t.output_tokens.max(1.0) * cost.decode_step(1, context, decode)
}

/// `C_E(B)`: one encode worker's requests/s at micro-batch `B` (batches above
/// [`MAX_B`] are counted as `MAX_B`: the table ends there).
pub fn encode_capacity(caps: &Capacities, b: u32) -> f64 {
    let b = b.clamp(1, MAX_B);
    match caps.encode_time.get(b as usize - 1) {
        Some(&t) if t > 0.0 => f64::from(b) / t,
        _ => caps.encode,
    }
}

/// α for a local prefill worker sharing encode GPUs at rate `rate`: while an
/// encode pass holds its SMs (a duty `u` of the time) local prefill runs on the
/// rest (`1 − f` with the split's share `f` for a batch of `b_max`), otherwise
/// on all of them; α = that mean capacity over the capacity on a whole GPU.
pub fn alpha(
    sc: &Scenario,
    cost: &dyn StageCost,
    t: &Typical,
    local_tp: Option<u32>,
    n_e: u32,
    rate: f64,
) -> f64 {
    let Some(tp) = local_tp else {
        return 0.0;
    };
    if t.items.is_empty() {
        return 0.0;
    }
    let n_e = n_e.max(1);
    // the requests one worker sees in a second, but never more than a pass
    // can batch: the split and the pass below are priced at this size
    let b_max = sc.deployment.max_batch.max(1) as f64;
    let b = (rate / f64::from(n_e)).ceil().clamp(1.0, b_max) as u32;
    let items = batch_of(&t.items, b);
    let split = SmSplit::new(&sc.deployment.sm_policy, b as usize, |k, f| {
        cost.encode(&batch_of(&t.items, k as u32), f)
            .pass(sc.knobs.preprocess_threads)
    });
    let f = split.encode_share(b as usize).unwrap_or(TIME_SLICE_SHARE);
    let pass = cost.encode(&items, f);
    let (t_gpu, t_pass) = (pass.t_gpu, pass.cycle(sc.knobs.preprocess_threads));
    // passes per second per worker, at most back to back
    let passes = (rate / f64::from(n_e) / f64::from(b)).min(1.0 / t_pass.max(1e-9));
    let u = (passes * t_gpu).clamp(0.0, 1.0);
    let prefill_rest = match split.prefill_share(Some(b as usize)) {
        Some(x) => x,
        None => TIME_SLICE_SHARE / (1.0 + cost.time_slice_penalty()),
    };
    let idle = split.prefill_share(None).unwrap_or(1.0);
    let full = prefill_capacity(cost, sc, t, tp.into(), 1.0);
    if full <= 0.0 {
        return 0.0;
    }
    let mean = u * prefill_capacity(cost, sc, t, tp.into(), prefill_rest.max(1e-3))
        + (1.0 - u) * prefill_capacity(cost, sc, t, tp.into(), idle.max(1e-3));
    (mean / full).clamp(0.0, 1.0)
}
