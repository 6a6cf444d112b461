//! What `easerve bench` sends: the requests of a scenario (the same
//! generator, seed and streams as `easerve sim`, so one seed gives the same
//! requests), or `vllm bench serve`'s `random-mm` dataset from its flags.

use easerve_sched::{MmItem, Request};
use easerve_workload::generate::{arrival_times, uniform_around};
use easerve_workload::rng::stream;
use easerve_workload::scenario::Arrival;
use rand::distributions::WeightedIndex;
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
}

impl BenchRequest {
    /// The request a scenario's generator drew.
    pub fn from_request(r: &Request) -> BenchRequest {
        BenchRequest {
            id: r.id,
            arrival: r.arrival,
            items: r.items.clone(),
            prompt_words: r.prompt_tokens,
            output_tokens: r.output_tokens,
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
    let mut rng = stream(seed, &format!("bench-text/{id}"));
    let mut s = String::with_capacity(words as usize * 6);
    for i in 0..words {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(PROMPT_WORDS[rng.gen_range(0..PROMPT_WORDS.len())]);
    }
    s
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

    #[test]
    fn prompts_have_the_words_asked_for() {
        let p = prompt_text(1, 5, 40);
        assert_eq!(p.split(' ').count(), 40);
        assert_eq!(p, prompt_text(1, 5, 40));
        assert_ne!(p, prompt_text(1, 6, 40));
        assert_eq!(prompt_text(1, 5, 0), "");
    }
}
