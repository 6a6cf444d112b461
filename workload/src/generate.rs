//! Seeded arrivals and request shapes.
//!
//! Shapes follow `vllm bench serve`'s random multimodal dataset: text lengths
//! uniform in `[len·(1−r), len·(1+r)]` (`--random-range-ratio`), image sizes
//! drawn from a bucket table with probabilities (`--random-mm-bucket-config`),
//! items per request uniform around a base count (`--random-mm-num-mm-items-range-ratio`).
//! Audio durations are log-normal with the given mean and σ, capped (one
//! Whisper window is 30 s). Each draw comes from its own named stream
//! ([`crate::rng`]): `arrivals`, `lengths`, `shapes`.

use crate::rng::stream;
use crate::scenario::{Arrival, Scenario, Shapes};
use easerve_model::{ItemTokens, ModelArch};
use easerve_sched::{Items, MmItem, Request};
use rand::distributions::WeightedIndex;
use rand::Rng;
use rand_distr::{Distribution, Exp, Gamma, LogNormal};

/// Per request, the tokens of each of its items (what the encoder and the LLM
/// see), in one flat table: request `i`'s items are `table[i]`, a slice in
/// prompt order (empty for a text-only request). One allocation for the run
/// instead of one per request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ItemTokenTable {
    /// `starts[i]..starts[i + 1]` indexes request `i`'s items in `items`;
    /// `starts.len()` is the number of requests plus one.
    starts: Vec<usize>,
    items: Vec<ItemTokens>,
}

impl ItemTokenTable {
    /// An empty table with room for `requests` requests of `items` items in all.
    pub fn with_capacity(requests: usize, items: usize) -> ItemTokenTable {
        let mut starts = Vec::with_capacity(requests + 1);
        starts.push(0);
        ItemTokenTable {
            starts,
            items: Vec::with_capacity(items),
        }
    }

    /// Append the next request's items.
    pub fn push(&mut self, items: &[ItemTokens]) {
        self.items.extend_from_slice(items);
        self.close_request();
    }

    /// Append one item to the request being built (closed by
    /// [`ItemTokenTable::close_request`]).
    fn push_item(&mut self, item: ItemTokens) {
        self.items.push(item);
    }

    /// End the request being built: the items pushed since the last close are
    /// its own.
    fn close_request(&mut self) {
        if self.starts.is_empty() {
            self.starts.push(0);
        }
        self.starts.push(self.items.len());
    }

    /// Drop the items of the request being built.
    fn drop_open(&mut self) {
        let start = self.starts.last().copied().unwrap_or(0);
        self.items.truncate(start);
    }

    /// The items of the request being built (pushed since the last close).
    fn open_request(&self) -> &[ItemTokens] {
        &self.items[self.starts.last().copied().unwrap_or(0)..]
    }

    /// Requests in the table.
    pub fn len(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    /// Whether the table holds no request.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl std::ops::Index<usize> for ItemTokenTable {
    type Output = [ItemTokens];

    /// Request `i`'s items.
    ///
    /// # Panics
    /// When `i` is not below [`ItemTokenTable::len`].
    fn index(&self, i: usize) -> &[ItemTokens] {
        &self.items[self.starts[i]..self.starts[i + 1]]
    }
}

impl FromIterator<Vec<ItemTokens>> for ItemTokenTable {
    fn from_iter<I: IntoIterator<Item = Vec<ItemTokens>>>(iter: I) -> Self {
        let mut t = ItemTokenTable::with_capacity(0, 0);
        for items in iter {
            t.push(&items);
        }
        t
    }
}

/// Arrival times (seconds, ascending, first gap drawn from the process).
pub fn arrival_times(arrival: &Arrival, rate: f64, n: usize, seed: u64) -> Vec<f64> {
    let mut rng = stream(seed, "arrivals");
    let mut t = 0.0;
    let mut out = Vec::with_capacity(n);
    match *arrival {
        Arrival::Trace { ref rows, .. } => return rows.iter().take(n).map(|r| r.t).collect(),
        Arrival::Poisson => {
            let exp = Exp::new(rate).expect("rate validated > 0");
            for _ in 0..n {
                t += exp.sample(&mut rng);
                out.push(t);
            }
        }
        Arrival::Gamma { cv } => {
            // shape k = 1/cv², scale θ = 1/(rate·k): mean gap 1/rate, CV = cv
            let k = 1.0 / (cv * cv);
            let g = Gamma::new(k, 1.0 / (rate * k)).expect("cv, rate validated > 0");
            for _ in 0..n {
                t += g.sample(&mut rng);
                out.push(t);
            }
        }
    }
    out
}

/// The arrival times of a workload (seconds, ascending): its rate schedule's
/// non-homogeneous process when it has one (time rescaling,
/// [`crate::schedule`]), else [`arrival_times`] at its one rate. Both draw
/// from the `arrivals` stream.
pub fn workload_arrivals(w: &crate::scenario::Workload, seed: u64) -> Vec<f64> {
    match (&w.schedule, &w.arrival) {
        (Some(s), Arrival::Poisson) => s.arrivals(&mut stream(seed, "arrivals"), None, w.requests),
        (Some(s), Arrival::Gamma { cv }) => {
            s.arrivals(&mut stream(seed, "arrivals"), Some(*cv), w.requests)
        }
        _ => arrival_times(&w.arrival, w.rate, w.requests, seed),
    }
}

/// How `vllm bench serve --ramp-up-strategy` moves the rate from
/// `--ramp-up-start-rps` to `--ramp-up-end-rps`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RampUp {
    /// `start + (end − start)·p`.
    Linear,
    /// `start·(end/start)^p`.
    Exponential,
}

impl std::str::FromStr for RampUp {
    type Err = String;
    fn from_str(s: &str) -> Result<RampUp, String> {
        match s {
            "linear" => Ok(RampUp::Linear),
            "exponential" => Ok(RampUp::Exponential),
            other => Err(format!("`{other}`: allowed linear, exponential")),
        }
    }
}

/// Send times of `n` requests under a vLLM ramp-up (seconds, ascending), as
/// `vllm bench serve` paces them (`vllm/benchmarks/serve.py`,
/// `_get_current_request_rate` and `get_request`): request `i` of `n` is
/// sent a gap after the one before, drawn at the rate `r_i` of its progress
/// `p = i/(n − 1)` (by request index, not by time) from Gamma(shape
/// `burstiness`, scale `1/(r_i·burstiness)`) — exponential at burstiness 1 —
/// on the `arrivals` stream of `seed`. A rate of 0 (a linear ramp's first
/// request) sends at once. Callers check vLLM's rules first: `0 ≤ start ≤
/// end`, `start > 0` for exponential, `burstiness > 0`.
pub fn ramp_up_times(
    strategy: RampUp,
    (start, end): (f64, f64),
    burstiness: f64,
    n: usize,
    seed: u64,
) -> Vec<f64> {
    let mut rng = stream(seed, "arrivals");
    let mut t = 0.0;
    (0..n)
        .map(|i| {
            let p = i as f64 / (n.max(2) - 1) as f64;
            let rate = match strategy {
                RampUp::Linear => start + (end - start) * p,
                RampUp::Exponential => start * (end / start).powf(p),
            };
            if rate > 0.0 && rate.is_finite() {
                let g = Gamma::new(burstiness, 1.0 / (rate * burstiness))
                    .expect("burstiness and rate checked > 0");
                t += g.sample(&mut rng);
            }
            t
        })
        .collect()
}

/// A length drawn uniformly from `[⌊mean·(1−r)⌋, ⌈mean·(1+r)⌉]`, at least
/// `min`: `vllm bench serve`'s `--random-range-ratio` rule.
pub fn uniform_around<R: Rng>(rng: &mut R, mean: u32, r: f64, min: u32) -> u32 {
    let lo = ((mean as f64) * (1.0 - r)).floor().max(min as f64) as u32;
    let hi = ((mean as f64) * (1.0 + r)).ceil().max(lo as f64) as u32;
    rng.gen_range(lo..=hi)
}

/// Encoder and LLM tokens of one item under `model`.
///
/// # Errors
/// When the model has no encoder for the item's modality or the shape is invalid.
pub fn item_tokens(
    model: &ModelArch,
    item: &MmItem,
) -> Result<ItemTokens, easerve_model::ModelError> {
    match *item {
        MmItem::Image { height, width } => model.image_tokens(height, width),
        MmItem::Video {
            frames,
            height,
            width,
        } => model.video_tokens(frames, height, width),
        MmItem::Audio { seconds } => model.audio_tokens(seconds),
    }
}

/// The requests of a validated scenario, reproducible from its seed.
///
/// # Panics
/// Never for a scenario that passed validation (shapes were checked against the model).
pub fn generate_requests(sc: &Scenario) -> Vec<Request> {
    generate_with_tokens(sc).0
}

/// The requests of a validated scenario and, per request, the tokens of each
/// of its items (what the encoder and the LLM see), computed once.
///
/// # Panics
/// Never for a scenario that passed validation.
pub fn generate_with_tokens(sc: &Scenario) -> (Vec<Request>, ItemTokenTable) {
    let w = &sc.workload;
    let arrivals = workload_arrivals(w, sc.seed);
    let mut lengths = stream(sc.seed, "lengths");
    let mut shapes = stream(sc.seed, "shapes");
    let pick = match &w.shapes {
        Shapes::Items { buckets, .. } => Some(
            WeightedIndex::new(buckets.iter().map(|b| b.1))
                .expect("validated: a positive probability"),
        ),
        _ => None,
    };
    // an item's tokens depend only on its bucket: priced once per bucket
    let bucket_tokens: Vec<ItemTokens> = match &w.shapes {
        Shapes::Items { buckets, .. } => buckets
            .iter()
            .map(|b| item_tokens(&sc.model, &b.0).expect("shapes validated against the model"))
            .collect(),
        _ => Vec::new(),
    };
    let mut out = Vec::with_capacity(w.requests);
    let per_request = match &w.shapes {
        Shapes::Items { items, .. } => *items as usize,
        Shapes::Audio { .. } => 1,
        Shapes::Text => 0,
    };
    let mut tokens =
        ItemTokenTable::with_capacity(w.requests, w.requests.saturating_mul(per_request));
    // a modality mix by phase: a request of a phase whose media share is
    // below 1 is text-only with that probability, from its own `mix` stream
    // (its shapes are still drawn, so the other streams stay aligned)
    let mix = w.schedule.as_ref().filter(|s| s.mixes());
    let mut mix_rng = stream(sc.seed, "mix");
    for (i, &arrival) in arrivals.iter().enumerate() {
        let (prompt_tokens, output_tokens) = match &w.arrival {
            Arrival::Trace { rows, .. } => (rows[i].prompt_tokens, rows[i].output_tokens),
            _ => (
                uniform_around(&mut lengths, w.input_len, w.range_ratio, 0),
                uniform_around(&mut lengths, w.output_len, w.range_ratio, 1),
            ),
        };
        let items: Items = match &w.shapes {
            Shapes::Items {
                items,
                items_range_ratio,
                buckets,
            } => {
                let n = uniform_around(&mut shapes, *items, *items_range_ratio, 1);
                let pick = pick.as_ref().expect("bucket table");
                (0..n)
                    .map(|_| {
                        let b = pick.sample(&mut shapes);
                        tokens.push_item(bucket_tokens[b]);
                        buckets[b].0
                    })
                    .collect()
            }
            Shapes::Audio {
                mean_s,
                sigma,
                max_s,
            } => {
                let mu = mean_s.ln() - sigma * sigma / 2.0;
                let d = LogNormal::new(mu, *sigma).expect("validated σ ≥ 0");
                let secs: f64 = d.sample(&mut shapes);
                Items::from_buf([MmItem::Audio {
                    seconds: secs.clamp(0.1, *max_s),
                }])
            }
            Shapes::Text => Items::new(),
        };
        let text_only = mix.is_some_and(|s| mix_rng.gen::<f64>() >= s.media_share_at(arrival));
        let items = if text_only {
            tokens.drop_open();
            Items::new()
        } else {
            items
        };
        if tokens.open_request().len() != items.len() {
            for item in &items {
                tokens.push_item(
                    item_tokens(&sc.model, item).expect("shapes validated against the model"),
                );
            }
        }
        let item_toks = tokens.open_request();
        let encoder_tokens = item_toks.iter().map(|t| t.encoder_tokens).sum();
        let mm_tokens = item_toks.iter().map(|t| t.llm_tokens).sum();
        tokens.close_request();
        out.push(Request {
            id: i as u64,
            arrival,
            items,
            prompt_tokens,
            output_tokens,
            encoder_tokens,
            mm_tokens,
            content: None,
        });
    }
    match (&w.reuse, &w.arrival) {
        (
            _,
            Arrival::Trace {
                content: Some(c), ..
            },
        ) => crate::reuse::apply_trace(sc, c, out, &tokens),
        (Some(reuse), _) => crate::reuse::apply(sc, reuse, out, &tokens),
        (None, _) => (out, tokens),
    }
}

/// The items of a typical request of the run (the one with the median encoder
/// tokens; empty when no request has items). They stand for "a request" where
/// a policy needs the encode time of `k` requests: the batcher's
/// `W(k) = T_enc(k)` and the SM table.
pub fn typical_items(requests: &[Request], tokens: &ItemTokenTable) -> Vec<ItemTokens> {
    median_by_encoder_tokens(requests, |i| !tokens[i].is_empty())
        .map(|i| tokens[i].to_vec())
        .unwrap_or_default()
}

/// The index of the median request by `(encoder_tokens, index)` among those
/// `keep` selects (the `⌊n/2⌋`-th, from 0, in that order; `None` when none is
/// kept). The keys are unique, so this is the request a full sort puts there.
pub fn median_by_encoder_tokens(
    requests: &[Request],
    keep: impl Fn(usize) -> bool,
) -> Option<usize> {
    // packed as one integer (encoder tokens above, index below) when both fit:
    // selection on plain integers, without looking the request up per comparison
    const INDEX_BITS: u32 = 24;
    let packable = requests.len() <= 1 << INDEX_BITS
        && requests
            .iter()
            .all(|r| r.encoder_tokens < 1 << (64 - INDEX_BITS));
    if packable {
        let mut keys: Vec<u64> = (0..requests.len())
            .filter(|&i| keep(i))
            .map(|i| requests[i].encoder_tokens << INDEX_BITS | i as u64)
            .collect();
        let mid = keys.len() / 2;
        (mid < keys.len()).then(|| {
            let (_, &mut k, _) = keys.select_nth_unstable(mid);
            (k & ((1 << INDEX_BITS) - 1)) as usize
        })
    } else {
        let mut idx: Vec<usize> = (0..requests.len()).filter(|&i| keep(i)).collect();
        let mid = idx.len() / 2;
        (mid < idx.len()).then(|| {
            let (_, &mut i, _) =
                idx.select_nth_unstable_by_key(mid, |&i| (requests[i].encoder_tokens, i));
            i
        })
    }
}

/// The items of `k` typical requests (see [`typical_items`]).
pub fn typical_batch(typical: &[ItemTokens], k: usize) -> Vec<ItemTokens> {
    typical
        .iter()
        .copied()
        .cycle()
        .take(k * typical.len())
        .collect()
}

#[cfg(test)]
mod ramp_tests {
    use super::*;

    #[test]
    fn ramp_up_gaps_follow_the_rate_of_each_request() {
        let n = 20_000;
        let t = ramp_up_times(RampUp::Linear, (1.0, 9.0), 1.0, n, 3);
        assert!(t.windows(2).all(|w| w[0] <= w[1]));
        // the mean gap of the last tenth ≈ 1/(rate there ≈ 8.6) and of the first ≈ 1/1.4
        let gap = |a: usize, b: usize| (t[b] - t[a]) / (b - a) as f64;
        let (first, last) = (gap(0, n / 10), gap(n - n / 10, n - 1));
        let harmonic = |lo: f64, hi: f64| (hi / lo).ln() / (hi - lo);
        assert!((first / harmonic(1.0, 1.8) - 1.0).abs() < 0.05, "{first}");
        assert!((last / harmonic(8.2, 9.0) - 1.0).abs() < 0.05, "{last}");
        let e = ramp_up_times(RampUp::Exponential, (1.0, 16.0), 1.0, n, 3);
        // halfway through, an exponential ramp runs at √(1·16) = 4 req/s
        let mid = (e[n / 2 + 500] - e[n / 2 - 500]) / 1000.0;
        assert!((mid * 4.0 - 1.0).abs() < 0.1, "{mid}");
        assert_eq!(ramp_up_times(RampUp::Linear, (0.0, 2.0), 1.0, 3, 1)[0], 0.0);
    }

    #[test]
    fn a_phase_media_share_makes_that_share_of_its_arrivals_carry_media() {
        use crate::scenario::{Overrides, Scenario};
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../scenarios/demand/image-step.toml");
        let with_items = |sets: &[(String, String)]| {
            let sc = Scenario::load_with(&path, sets, &Overrides::default()).expect("valid");
            let reqs = generate_requests(&sc);
            let phase2: Vec<&Request> = reqs.iter().filter(|r| r.arrival >= 600.0).collect();
            let media = phase2.iter().filter(|r| !r.items.is_empty()).count();
            (media as f64 / phase2.len() as f64, reqs)
        };
        let (all, plain) = with_items(&[]);
        assert_eq!(all, 1.0);
        let set = |v: &str| vec![("workload.phases.media_share".to_string(), v.to_string())];
        let (quarter, mixed) = with_items(&set("0.25"));
        // ~1080 requests in the second phase: σ of the share ≈ 1.3 %
        assert!((quarter - 0.25).abs() < 0.05, "{quarter}");
        // arrivals, lengths and the shapes of media requests are unchanged
        for (a, b) in plain.iter().zip(&mixed) {
            assert_eq!((a.arrival, a.prompt_tokens), (b.arrival, b.prompt_tokens));
            assert!(b.items.is_empty() || a.items == b.items);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_and_gamma_hit_rate_and_cv() {
        for (arrival, cv) in [
            (Arrival::Poisson, 1.0),
            (Arrival::Gamma { cv: 0.5 }, 0.5),
            (Arrival::Gamma { cv: 2.0 }, 2.0),
        ] {
            let t = arrival_times(&arrival, 4.0, 40_000, 9);
            let gaps: Vec<f64> = t.windows(2).map(|w| w[1] - w[0]).collect();
            let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
            let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
            assert!((mean - 0.25).abs() < 0.01, "{arrival:?} mean gap {mean}");
            assert!(
                (var.sqrt() / mean - cv).abs() < 0.08 * cv,
                "{arrival:?} cv {}",
                var.sqrt() / mean
            );
            assert!(t.windows(2).all(|w| w[1] >= w[0]));
        }
    }
}
