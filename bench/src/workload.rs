//! What `easerve bench` sends: the requests of a scenario (the same
//! generator, seed and streams as `easerve sim`, so one seed gives the same
//! requests), or `vllm bench serve`'s `random-mm` or `prefix_repetition`
//! dataset from its flags.

use easerve_sched::cache::mix;
use easerve_sched::{Content, MmItem, Request, Segment};
use easerve_workload::generate::{arrival_times, uniform_around};
use easerve_workload::rng::{stream, subseed};
use easerve_workload::scenario::Arrival;
use rand::distributions::WeightedIndex;
use rand::seq::SliceRandom;
use rand::Rng;
use rand_distr::Distribution;

/// One request to send.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchRequest {
    /// Index in the run (0, 1, 2, … in arrival order).
    pub id: u64,
    /// When to send it, seconds after the start of the run.
    pub arrival: f64,
    /// Multimodal items, in prompt order.
    pub items: Vec<MmItem>,
    /// Text prompt length asked for, in words of [`PROMPT_WORDS`] (the
    /// server's `usage` counts the real prompt tokens).
    pub prompt_words: u32,
    /// Output tokens asked for (`max_tokens`, with `min_tokens` and
    /// `ignore_eos` so the server generates exactly this many).
    pub output_tokens: u32,
    /// What the prompt is made of when the scenario repeats content (a
    /// media pool, shared system prompts, conversations): each item's
    /// content id and the prompt's segments in order. The body is then
    /// built from it ([`crate::client::request_body`]): equal ids give equal
    /// bytes, so a server's caches see the repeats the twin sees. `None`:
    /// every item and prompt is unique.
    pub content: Option<Content>,
}

impl BenchRequest {
    /// The request a scenario's generator drew.
    pub fn from_request(r: &Request) -> BenchRequest {
        BenchRequest {
            id: r.id,
            arrival: r.arrival,
            items: r.items.to_vec(),
            prompt_words: r.prompt_tokens,
            output_tokens: r.output_tokens,
            content: r.content.clone(),
        }
    }
}

/// Words the text prompts are made of: short, common English words, most of
/// them one token in common BPE vocabularies when preceded by a space (not
/// checked against any tokenizer here: a prompt's real length is the
/// server's `usage.prompt_tokens`, which the result reports).
pub const PROMPT_WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be",
    "at", "by", "this", "had", "not", "are", "but", "from", "or", "have", "an", "they", "which",
    "one", "you", "were", "all", "we", "her", "she", "there", "would", "their", "will", "when",
    "who", "him", "been", "has", "more", "if", "no", "out", "so", "said", "what", "up", "its",
    "about", "into", "than", "them", "can", "only", "other", "new", "some", "could", "time",
    "these", "two", "may", "then", "do", "first", "any", "my", "now", "such", "like", "our",
    "over", "man", "me", "even", "most", "made", "after", "also", "did", "many", "before", "must",
    "through", "back", "years", "where", "much", "your", "way", "well", "down", "should",
    "because", "each", "just", "those", "people",
];

/// The text prompt of request `id`: `words` words drawn from
/// [`PROMPT_WORDS`] on the named stream `bench-text/{id}`.
pub fn prompt_text(seed: u64, id: u64, words: u32) -> String {
    words_text(&mut stream(seed, &format!("bench-text/{id}")), words)
}

/// `words` words of [`PROMPT_WORDS`] drawn from `rng`, one space between.
fn words_text<R: Rng>(rng: &mut R, words: u32) -> String {
    let mut s = String::with_capacity(words as usize * 6);
    for i in 0..words {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(PROMPT_WORDS[rng.gen_range(0..PROMPT_WORDS.len())]);
    }
    s
}

/// The text of one prompt segment of content id `id` (a system prompt, a
/// turn's text, an earlier turn's answer): `words` words drawn from
/// [`PROMPT_WORDS`] on the named stream `bench-segment/{id:016x}`, so equal
/// ids give equal text in every request (the twin's prefix cache keys a
/// segment by its id).
pub fn segment_text(seed: u64, id: u64, words: u32) -> String {
    words_text(
        &mut stream(seed, &format!("bench-segment/{id:016x}")),
        words,
    )
}

/// One bucket of `--random-mm-bucket-config`: `(height, width, frames)` and
/// its probability (frames 1 is an image, more a video of that many frames).
pub type Bucket = ((u32, u32, u32), f64);

/// `vllm bench serve --dataset-name random-mm` and its flags.
#[derive(Clone, Debug, PartialEq)]
pub struct RandomMm {
    /// `--random-input-len`: text prompt tokens.
    pub input_len: u32,
    /// `--random-output-len`: output tokens.
    pub output_len: u32,
    /// `--random-range-ratio`: lengths uniform in `[len·(1−r), len·(1+r)]`.
    pub range_ratio: f64,
    /// `--random-mm-base-items-per-request`.
    pub base_items: u32,
    /// `--random-mm-num-mm-items-range-ratio`.
    pub items_range_ratio: f64,
    /// `--random-mm-bucket-config`: `(height, width, frames)` → probability
    /// (frames 1 is an image, more a video of that many sampled frames).
    pub buckets: Vec<Bucket>,
}

impl RandomMm {
    /// `n` requests of this dataset with arrivals from `arrivals` (seconds),
    /// lengths on the `lengths` stream and shapes on the `shapes` stream of
    /// `seed`, as the scenario generator draws them.
    ///
    /// # Panics
    /// Never for buckets from [`parse_bucket_config`] (weights ≥ 0, one > 0,
    /// a finite sum).
    pub fn requests(&self, arrivals: &[f64], seed: u64) -> Vec<BenchRequest> {
        let mut lengths = stream(seed, "lengths");
        let mut shapes = stream(seed, "shapes");
        let pick = (!self.buckets.is_empty()).then(|| {
            WeightedIndex::new(self.buckets.iter().map(|b| b.1)).expect("positive weights")
        });
        arrivals
            .iter()
            .enumerate()
            .map(|(i, &arrival)| {
                let prompt_words =
                    uniform_around(&mut lengths, self.input_len, self.range_ratio, 0);
                let output_tokens =
                    uniform_around(&mut lengths, self.output_len, self.range_ratio, 1);
                let items = match &pick {
                    Some(pick) if self.base_items > 0 => {
                        let n =
                            uniform_around(&mut shapes, self.base_items, self.items_range_ratio, 0);
                        (0..n)
                            .map(|_| {
                                let ((height, width, frames), _) =
                                    self.buckets[pick.sample(&mut shapes)];
                                if frames <= 1 {
                                    MmItem::Image { height, width }
                                } else {
                                    MmItem::Video {
                                        frames,
                                        height,
                                        width,
                                    }
                                }
                            })
                            .collect()
                    }
                    _ => Vec::new(),
                };
                BenchRequest {
                    id: i as u64,
                    arrival,
                    items,
                    prompt_words,
                    output_tokens,
                    content: None,
                }
            })
            .collect()
    }
}

/// `vllm bench serve --dataset-name prefix_repetition` and its
/// `--prefix-repetition-*` flags, as vLLM's `PrefixRepetitionRandomDataset`
/// (`vllm/benchmarks/datasets.py`) draws it: `num_prefixes` prefixes of
/// `prefix_len` random tokens, each followed in `⌊n / num_prefixes⌋`
/// requests by a suffix of `suffix_len` random tokens of its own, every
/// request asking for `output_len` tokens, the requests shuffled. Here a
/// token is a word of [`PROMPT_WORDS`]; a prefix is one text segment the
/// requests that share it send as the same words ([`segment_text`]), a
/// suffix another, unique.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixRepetition {
    /// `--prefix-repetition-prefix-len`: words of each shared prefix.
    pub prefix_len: u32,
    /// `--prefix-repetition-suffix-len`: words of each request's own suffix.
    pub suffix_len: u32,
    /// `--prefix-repetition-num-prefixes`: distinct prefixes (≥ 1).
    pub num_prefixes: u32,
    /// `--prefix-repetition-output-len`: output tokens of every request.
    pub output_len: u32,
}

impl PrefixRepetition {
    /// Requests the dataset holds when `num_prompts` are asked for:
    /// `num_prefixes × ⌊num_prompts / num_prefixes⌋`, as vLLM (0 when
    /// `num_prompts < num_prefixes`, which vLLM refuses).
    pub fn count(&self, num_prompts: usize) -> usize {
        let k = self.num_prefixes.max(1) as usize;
        num_prompts / k * k
    }

    /// The requests, one per send time of `arrivals` (`arrivals.len()` from
    /// [`PrefixRepetition::count`]): prefix `p`'s requests drawn in order,
    /// then shuffled on the `prefix-repetition` stream of `seed`; request
    /// `i` goes at `arrivals[i]`. Prefix `p`'s content id is
    /// `mix(subseed(seed, "prefix-repetition-prefixes"), p)`, request `j`'s
    /// suffix's `mix(subseed(seed, "prefix-repetition-suffixes"), j)`.
    pub fn requests(&self, arrivals: &[f64], seed: u64) -> Vec<BenchRequest> {
        let per_prefix = arrivals.len() / self.num_prefixes.max(1) as usize;
        let (prefix_salt, suffix_salt) = (
            subseed(seed, "prefix-repetition-prefixes"),
            subseed(seed, "prefix-repetition-suffixes"),
        );
        let mut drawn: Vec<(u64, u64)> = (0..arrivals.len() as u64)
            .map(|j| (j / per_prefix.max(1) as u64, j))
            .collect();
        drawn.shuffle(&mut stream(seed, "prefix-repetition"));
        drawn
            .iter()
            .zip(arrivals)
            .enumerate()
            .map(|(i, (&(p, j), &arrival))| {
                let segments = [
                    Segment::text(mix(prefix_salt, p), self.prefix_len),
                    Segment::text(mix(suffix_salt, j), self.suffix_len),
                ];
                BenchRequest {
                    id: i as u64,
                    arrival,
                    items: Vec::new(),
                    prompt_words: self.prefix_len + self.suffix_len,
                    output_tokens: self.output_len,
                    content: Some(Content::new(std::iter::empty(), &segments)),
                }
            })
            .collect()
    }
}

/// Send times for `n` requests at `rate` requests/s: all at once when the
/// rate is infinite, else Poisson for `burstiness` 1 and gamma gaps of shape
/// `burstiness` otherwise (`vllm bench serve`'s `--burstiness`: coefficient of
/// variation `1/√burstiness`), on the `arrivals` stream of `seed`.
pub fn send_times(rate: f64, burstiness: f64, n: usize, seed: u64) -> Vec<f64> {
    if rate.is_infinite() {
        return vec![0.0; n];
    }
    let arrival = if burstiness == 1.0 {
        Arrival::Poisson
    } else {
        Arrival::Gamma {
            cv: 1.0 / burstiness.sqrt(),
        }
    };
    arrival_times(&arrival, rate, n, seed)
}

/// Parse `--random-mm-bucket-config` as `vllm bench serve` writes it:
/// `{(256, 256, 1): 0.5, (720, 1280, 1): 0.4}` (spaces optional). Probabilities
/// need not sum to 1 (they are normalised), but each must be ≥ 0, one > 0,
/// and their sum finite.
///
/// # Errors
/// Says what is malformed.
pub fn parse_bucket_config(text: &str) -> Result<Vec<Bucket>, String> {
    let shape = "expected `{(HEIGHT, WIDTH, FRAMES): PROBABILITY, …}`, e.g. `{(336, 336, 1): 0.5, (672, 672, 1): 0.5}`";
    let body = text
        .trim()
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .ok_or_else(|| format!("`{text}`: {shape}"))?;
    let mut out = Vec::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let open = rest
            .strip_prefix('(')
            .ok_or_else(|| format!("`{text}`: {shape}"))?;
        let (tuple, after) = open
            .split_once(')')
            .ok_or_else(|| format!("`{text}`: an unclosed `(`; {shape}"))?;
        let dims: Vec<u32> = tuple
            .split(',')
            .map(|d| d.trim().parse::<u32>())
            .collect::<Result<_, _>>()
            .map_err(|_| {
                format!("`({tuple})`: three whole numbers (height, width, frames); {shape}")
            })?;
        let [h, w, f] = dims[..] else {
            return Err(format!(
                "`({tuple})`: three numbers (height, width, frames); {shape}"
            ));
        };
        if h == 0 || w == 0 || f == 0 {
            return Err(format!("`({tuple})`: height, width and frames must be ≥ 1"));
        }
        let after = after
            .trim_start()
            .strip_prefix(':')
            .ok_or_else(|| format!("`({tuple})` needs `: PROBABILITY`; {shape}"))?;
        let (p, next) = after.split_once(',').unwrap_or((after, ""));
        let p: f64 = p
            .trim()
            .parse()
            .map_err(|_| format!("`{}`: a probability must be a number", p.trim()))?;
        if !(p.is_finite() && p >= 0.0) {
            return Err(format!("probability {p} of ({tuple}): must be ≥ 0"));
        }
        out.push(((h, w, f), p));
        rest = next.trim();
    }
    if !out.iter().any(|b| b.1 > 0.0) {
        return Err(format!(
            "`{text}`: at least one bucket needs a probability > 0"
        ));
    }
    let sum: f64 = out.iter().map(|b| b.1).sum();
    if !sum.is_finite() {
        return Err(format!(
            "`{text}`: the probabilities sum to {sum}; give finite probabilities whose sum is finite too (they are normalised, e.g. 0.5 and 0.5)"
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_repetition_has_vllms_count_and_shuffles_requests_sharing_a_prefix() {
        let d = PrefixRepetition {
            prefix_len: 40,
            suffix_len: 8,
            num_prefixes: 3,
            output_len: 5,
        };
        // 3 × ⌊14 / 3⌋, as vLLM; fewer prompts than prefixes: none
        assert_eq!((d.count(14), d.count(2)), (12, 0));
        let times: Vec<f64> = (0..12).map(f64::from).collect();
        let reqs = d.requests(&times, 9);
        assert_eq!(reqs, d.requests(&times, 9));
        let segs =
            |r: &BenchRequest| -> Vec<Segment> { r.content.as_ref().unwrap().segments().collect() };
        let mut by_prefix = std::collections::HashMap::new();
        let mut suffixes = std::collections::HashSet::new();
        for (i, r) in reqs.iter().enumerate() {
            assert_eq!((r.id, r.arrival), (i as u64, i as f64));
            assert_eq!((r.prompt_words, r.output_tokens), (48, 5));
            let s = segs(r);
            assert_eq!((s[0].tokens, s[1].tokens), (40, 8));
            *by_prefix.entry(s[0].id).or_insert(0) += 1;
            assert!(suffixes.insert(s[1].id), "a suffix is the request's own");
        }
        assert_eq!(by_prefix.values().copied().collect::<Vec<_>>(), [4, 4, 4]);
        // shuffled: the requests of a prefix are not sent as one run
        let runs = 1 + reqs
            .windows(2)
            .filter(|w| segs(&w[0])[0].id != segs(&w[1])[0].id)
            .count();
        assert!(runs > 3, "{runs} runs");
        assert_ne!(reqs, d.requests(&times, 10));
    }

    #[test]
    fn bucket_configs_parse_as_vllm_writes_them_and_bad_ones_say_why() {
        let b = parse_bucket_config("{(256, 256, 1): 0.5, (720, 1280, 1): 0.4, (720,1280,16):0.1}")
            .unwrap();
        assert_eq!(
            b,
            vec![
                ((256, 256, 1), 0.5),
                ((720, 1280, 1), 0.4),
                ((720, 1280, 16), 0.1)
            ]
        );
        for bad in [
            "(1,1,1): 1",
            "{(1, 1): 1}",
            "{(1, 1, 1) 1}",
            "{(0, 1, 1): 1}",
            "{(1, 1, 1): -1}",
            "{(1, 1, 1): 0}",
            "{(256, 256, 1): 1e308, (512, 512, 1): 1e308}",
        ] {
            assert!(parse_bucket_config(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn random_mm_draws_lengths_items_and_videos_reproducibly() {
        let d = RandomMm {
            input_len: 100,
            output_len: 20,
            range_ratio: 0.5,
            base_items: 2,
            items_range_ratio: 0.0,
            buckets: vec![((336, 336, 1), 1.0), ((224, 224, 8), 1.0)],
        };
        let t = send_times(4.0, 1.0, 200, 7);
        let a = d.requests(&t, 7);
        assert_eq!(a, d.requests(&t, 7));
        assert!(a.iter().all(|r| r.items.len() == 2));
        assert!(a
            .iter()
            .all(|r| (50..=150).contains(&r.prompt_words) && (10..=30).contains(&r.output_tokens)));
        assert!(a.iter().any(|r| r
            .items
            .iter()
            .any(|i| matches!(i, MmItem::Video { frames: 8, .. }))));
        assert_eq!(send_times(f64::INFINITY, 1.0, 3, 7), vec![0.0; 3]);
    }

    /// A scenario with a pool, system prompts and conversations: the
    /// requests carry its content, the same seed gives the same bodies, a
    /// repeated image is the same bytes and a later turn's body opens with
    /// the earlier turn's parts (under 1 s).
    #[test]
    fn a_scenario_that_repeats_sends_equal_bytes_for_equal_content() {
        use crate::client::request_body;
        use easerve_workload::scenario::{Overrides, Scenario};
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let text = std::fs::read_to_string(root.join("scenarios/cpu-image-reuse.toml"))
            .unwrap()
            .replace("requests = 60", "requests = 12")
            + "\n[workload.system_prompt]\ntokens = 20\ncount = 2\n";
        let dir = std::env::temp_dir().join(format!("easerve-bench-reuse-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.toml");
        std::fs::write(
            &path,
            text.replace(
                "profile = \"",
                &format!("profile = \"{}/scenarios/", root.display()),
            ),
        )
        .unwrap();
        let sc = Scenario::load(&path, &Overrides::default()).unwrap();
        let reqs: Vec<BenchRequest> = easerve_workload::generate::generate_requests(&sc)
            .iter()
            .map(BenchRequest::from_request)
            .collect();
        let cfg = crate::client::offline_config(sc.seed);
        let parts = |r: &BenchRequest| -> Vec<serde_json::Value> {
            let v: serde_json::Value =
                serde_json::from_slice(&request_body(r, &cfg).unwrap()).unwrap();
            v["messages"][0]["content"].as_array().unwrap().clone()
        };
        assert!(reqs.iter().all(|r| r.content.is_some()));
        let bodies: Vec<Vec<serde_json::Value>> = reqs.iter().map(parts).collect();
        assert_eq!(bodies, reqs.iter().map(parts).collect::<Vec<_>>());
        // text words add up to the prompt's text tokens
        for (r, b) in reqs.iter().zip(&bodies) {
            let words: usize = b
                .iter()
                .filter_map(|p| p["text"].as_str())
                .map(|t| t.split(' ').filter(|w| !w.is_empty()).count())
                .sum();
            assert_eq!(words as u32, r.prompt_words, "request {}", r.id);
            assert_eq!(
                b.iter().filter(|p| p["type"] == "image_url").count(),
                r.items.len()
            );
        }
        // equal content ids, equal image bytes; a second turn opens with its first
        let c = |r: &BenchRequest| r.content.clone().unwrap();
        let mut seen = std::collections::HashMap::new();
        let mut repeats = 0;
        for (r, b) in reqs.iter().zip(&bodies) {
            let imgs = b.iter().filter(|p| p["type"] == "image_url");
            for (item, part) in c(r).items().zip(imgs) {
                if let Some(prev) = seen.insert(item.id, part.clone()) {
                    assert_eq!(&prev, part);
                    repeats += 1;
                }
            }
        }
        assert!(repeats > 0);
        let turn2 = reqs.iter().zip(&bodies).find(|(r, b)| {
            bodies.iter().zip(&reqs).any(|(a, q)| {
                q.id != r.id && a.len() < b.len() && b[..a.len()] == a[..] && a.len() > 1
            })
        });
        assert!(turn2.is_some(), "no turn resends an earlier one");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn prompts_have_the_words_asked_for() {
        let p = prompt_text(1, 5, 40);
        assert_eq!(p.split(' ').count(), 40);
        assert_eq!(p, prompt_text(1, 5, 40));
        assert_ne!(p, prompt_text(1, 6, 40));
        assert_eq!(prompt_text(1, 5, 0), "");
    }
}
