//! Workloads that repeat themselves: a pool of media items drawn by
//! popularity, multi-turn conversations whose turns resend the earlier
//! ones, and shared system prompts ([`crate::scenario::Reuse`]); and the
//! reuse a workload offers ([`offered_reuse`]).
//!
//! The generator draws a run as without reuse ([`crate::generate`]) and then
//! rewrites it:
//! * **pool**: each item becomes pool item `k`, drawn Zipf(α) (rand_distr's
//!   `Zipf` over `1..=size`, rank 1 the most popular) or uniformly on the
//!   `pool` stream; item `k`'s shape is drawn once from the bucket table on
//!   the `pool-shapes` stream, and its content id is
//!   `mix(subseed(seed, "pool-ids"), k)`: stable for a seed and an index.
//! * **conversations** of `turns` turns: conversations start as the arrival
//!   process draws them at `rate / turns` (so requests still arrive at
//!   `rate` on average); turn `t + 1` arrives an exponential think time
//!   (mean `think_time_s`, on the `think` stream) after turn `t` arrived —
//!   open loop, since the generator does not know when turn `t` is answered.
//!   Turn `t`'s prompt is the system prompt, then every earlier turn's
//!   media, text and answer (the answer's length is that turn's output
//!   tokens), then its own media and text (media first, as LLaVA's
//!   `<image>\n{question}` template puts them): the prompt grows. Request `c·turns + t`
//!   of the plain draw supplies turn `t` of conversation `c`'s own text,
//!   answer length and media.
//! * **system prompts**: a request (or a conversation) starts with one of
//!   `count` prompts of `tokens` tokens, drawn uniformly on the `prompts`
//!   stream; its tokens count as text prompt tokens.

use crate::generate::{arrival_times, ItemTokenTable};
use crate::rng::{stream, subseed};
use crate::scenario::{Popularity, Reuse, Scenario, Shapes};
use easerve_model::ItemTokens;
use easerve_sched::cache::{blocks_before, mix, HashKeyed};
use easerve_sched::{Content, ContentItem, MmItem, Request, Segment};
use rand::distributions::WeightedIndex;
use rand::Rng;
use rand_distr::{Distribution, Exp, Zipf};
use serde::{Deserialize, Serialize};

/// One item of a turn: its shape, tokens and content id.
type Item = (MmItem, ItemTokens, u64);

/// The pool: each item's bucket (drawn once) and the popularity draw.
struct Pool<'a> {
    buckets: Vec<u32>,
    shapes: &'a [(MmItem, f64)],
    tokens: Vec<ItemTokens>,
    salt: u64,
    /// Zipf(α) over `1..=size`, built once (`None`: uniform).
    zipf: Option<Zipf<f64>>,
}

impl Pool<'_> {
    fn draw<R: Rng>(&self, rng: &mut R) -> Item {
        let size = self.buckets.len() as u64;
        let k = match &self.zipf {
            None => rng.gen_range(0..size),
            Some(z) => (z.sample(rng) as u64).clamp(1, size) - 1,
        };
        let b = self.buckets[k as usize] as usize;
        (self.shapes[b].0, self.tokens[b], mix(self.salt, k))
    }
}

/// Rewrite the plain draw of `sc` (`requests` and their item `tokens`) as
/// its [`Reuse`] says; the requests come back in arrival order, ids equal
/// to their index, each with its [`Content`].
///
/// # Panics
/// Never for a scenario that passed validation.
pub fn apply(
    sc: &Scenario,
    reuse: &Reuse,
    requests: Vec<Request>,
    tokens: &ItemTokenTable,
) -> (Vec<Request>, ItemTokenTable) {
    let w = &sc.workload;
    let pool = reuse.pool.map(|(size, popularity)| {
        let Shapes::Items { buckets, .. } = &w.shapes else {
            unreachable!("validated: a pool holds images or videos")
        };
        let pick = WeightedIndex::new(buckets.iter().map(|b| b.1)).expect("validated weights");
        let mut rng = stream(sc.seed, "pool-shapes");
        Pool {
            buckets: (0..size).map(|_| pick.sample(&mut rng) as u32).collect(),
            shapes: buckets,
            tokens: buckets
                .iter()
                .map(|b| crate::generate::item_tokens(&sc.model, &b.0).expect("validated"))
                .collect(),
            salt: subseed(sc.seed, "pool-ids"),
            zipf: match popularity {
                Popularity::Uniform => None,
                Popularity::Zipf(alpha) => {
                    Some(Zipf::new(size, alpha).expect("validated: size ≥ 1, α ≥ 0"))
                }
            },
        }
    });
    let (turns, think) = reuse.conversation.unwrap_or((1, 0.0));
    let n = requests.len();
    let conversations = n.div_ceil(turns as usize);
    let starts = if turns > 1 {
        arrival_times(&w.arrival, w.rate / turns as f64, conversations, sc.seed)
    } else {
        requests.iter().map(|r| r.arrival).collect()
    };
    let think = (think > 0.0).then(|| Exp::new(1.0 / think).expect("validated think time"));
    let (mut pool_rng, mut think_rng, mut prompt_rng) = (
        stream(sc.seed, "pool"),
        stream(sc.seed, "think"),
        stream(sc.seed, "prompts"),
    );
    let (text_salt, item_salt, prompt_salt) = (
        subseed(sc.seed, "text-ids"),
        subseed(sc.seed, "item-ids"),
        subseed(sc.seed, "prompt-ids"),
    );
    // each request's item tokens go to one arena, as (start, len)
    let mut out: Vec<Request> = Vec::with_capacity(n);
    let mut ranges: Vec<(usize, usize)> = Vec::with_capacity(n);
    let mut arena: Vec<ItemTokens> = Vec::new();
    // the plain draw is taken in index order (request `c·turns + t`), each
    // turn built in its plain request (its items' vector reused)
    let mut plain = requests.into_iter();
    // a conversation's prompt and items so far, reused by every conversation
    let (mut segments, mut items): (Vec<Segment>, Vec<Item>) = (Vec::new(), Vec::new());
    for (c, &start) in starts.iter().enumerate() {
        segments.clear();
        items.clear();
        let mut text = 0u32;
        if let Some((p, count)) = reuse.system_prompt {
            let id = mix(prompt_salt, prompt_rng.gen_range(0..count) as u64);
            segments.push(Segment::text(id, p));
            text = p;
        }
        let mut arrival = start;
        for t in 0..turns as usize {
            let i = c * turns as usize + t;
            let Some(base) = plain.next() else { break };
            if t > 0 {
                arrival += think.map_or(0.0, |d| d.sample(&mut think_rng));
            }
            let own = base.prompt_tokens;
            // a turn's media, then its text (LLaVA's `<image>\n{question}`)
            for (k, (&shape, &tok)) in base.items.iter().zip(&tokens[i]).enumerate() {
                let item = match &pool {
                    Some(pool) => pool.draw(&mut pool_rng),
                    None => (shape, tok, mix(mix(item_salt, i as u64), k as u64)),
                };
                segments.push(Segment::item(
                    items.len() as u32,
                    item.2,
                    item.1.llm_tokens as u32,
                ));
                items.push(item);
            }
            segments.push(Segment::text(mix(text_salt, 2 * i as u64), own));
            text = text.saturating_add(own);
            ranges.push((arena.len(), items.len()));
            arena.extend(items.iter().map(|i| i.1));
            let answer = base.output_tokens;
            out.push(turn_request(arrival, &items, &segments, text, base));
            segments.push(Segment::text(mix(text_salt, 2 * i as u64 + 1), answer));
            text = text.saturating_add(answer);
        }
    }
    drop(plain);
    // conversations interleave: arrival order, ties by generation order (a
    // run of one-turn requests is in that order already)
    let in_order = |a: &Request, b: &Request| a.arrival.total_cmp(&b.arrival).is_le();
    if !out.windows(2).all(|w| in_order(&w[0], &w[1])) {
        let mut order: Vec<usize> = (0..out.len()).collect();
        order.sort_by(|&a, &b| out[a].arrival.total_cmp(&out[b].arrival));
        let mut slots: Vec<Option<Request>> = out.into_iter().map(Some).collect();
        out = order
            .iter()
            .map(|&j| slots[j].take().expect("each once"))
            .collect();
        ranges = order.iter().map(|&j| ranges[j]).collect();
    }
    let mut table = ItemTokenTable::with_capacity(n, arena.len());
    for (i, (r, &(start, len))) in out.iter_mut().zip(&ranges).enumerate() {
        r.id = i as u64;
        table.push(&arena[start..start + len]);
    }
    (out, table)
}

/// Give a replayed trace's requests the content its `ItemHashes` and
/// `ConversationId` columns say ([`crate::trace::TraceContent`]): a row's
/// hashes are its items' content ids (each item's shape picked from the
/// bucket table by its hash, so equal hashes are equal items; a row without
/// hashes keeps its drawn items, unique); its prompt is its items, then the
/// conversation so far (each earlier turn's new text and answer) and its own
/// new text — the part of its `ContextTokens` beyond the previous turn's
/// context and answer (the whole of it when the trace's contexts do not
/// grow, and for a row without a conversation).
///
/// # Panics
/// Never for a scenario that passed validation.
pub fn apply_trace(
    sc: &Scenario,
    content: &crate::trace::TraceContent,
    requests: Vec<Request>,
    tokens: &ItemTokenTable,
) -> (Vec<Request>, ItemTokenTable) {
    let buckets: &[(MmItem, f64)] = match &sc.workload.shapes {
        Shapes::Items { buckets, .. } => buckets,
        _ => &[],
    };
    let total: f64 = buckets.iter().map(|b| b.1).sum();
    let bucket_tokens: Vec<ItemTokens> = buckets
        .iter()
        .map(|b| crate::generate::item_tokens(&sc.model, &b.0).expect("validated"))
        .collect();
    // the bucket of a hash: its top 53 bits as a uniform draw in [0, 1)
    let pick = |h: u64| {
        let u = (h >> 11) as f64 / (1u64 << 53) as f64 * total;
        let mut acc = 0.0;
        buckets
            .iter()
            .position(|b| {
                acc += b.1;
                u < acc
            })
            .unwrap_or(buckets.len().saturating_sub(1))
    };
    let (text_salt, item_salt) = (subseed(sc.seed, "text-ids"), subseed(sc.seed, "item-ids"));
    let mut history: HashKeyed<(Vec<Segment>, u64)> = HashKeyed::default();
    let mut table = ItemTokenTable::with_capacity(requests.len(), 0);
    let mut out = Vec::with_capacity(requests.len());
    for (i, r) in requests.into_iter().enumerate() {
        let hashes = content.items(i);
        let mut items: Vec<Item> = Vec::new();
        if hashes.is_empty() || buckets.is_empty() {
            for (k, (&shape, &tok)) in r.items.iter().zip(&tokens[i]).enumerate() {
                items.push((shape, tok, mix(mix(item_salt, i as u64), k as u64)));
            }
        } else {
            for &h in hashes {
                let b = pick(h);
                items.push((buckets[b].0, bucket_tokens[b], h));
            }
        }
        let mut segments: Vec<Segment> = items
            .iter()
            .enumerate()
            .map(|(k, i)| Segment::item(k as u32, i.2, i.1.llm_tokens as u32))
            .collect();
        let prompt = r.prompt_tokens as u64;
        let conv = content.conversations.get(i).copied().flatten();
        let (past, past_tokens) = match conv {
            Some(c) => history.entry(c).or_default().clone(),
            None => (Vec::new(), 0),
        };
        let (own, past) = if prompt >= past_tokens && !past.is_empty() {
            (prompt - past_tokens, past)
        } else {
            (prompt, Vec::new())
        };
        let mut text = past;
        text.push(Segment::text(mix(text_salt, 2 * i as u64), own as u32));
        segments.extend_from_slice(&text);
        if let Some(c) = conv {
            text.push(Segment::text(
                mix(text_salt, 2 * i as u64 + 1),
                r.output_tokens,
            ));
            history.insert(c, (text, prompt + r.output_tokens as u64));
        }
        let toks: Vec<ItemTokens> = items.iter().map(|i| i.1).collect();
        table.push(&toks);
        out.push(turn_request(
            r.arrival,
            &items,
            &segments,
            r.prompt_tokens,
            r,
        ));
    }
    (out, table)
}

/// One turn's request: `base` (the plain draw's request, its id and output
/// tokens kept, its items' vector reused) with every item so far and the
/// prompt so far.
fn turn_request(
    arrival: f64,
    items: &[Item],
    segments: &[Segment],
    text: u32,
    mut base: Request,
) -> Request {
    base.items.clear();
    base.items.extend(items.iter().map(|i| i.0));
    base.arrival = arrival;
    base.prompt_tokens = text;
    base.encoder_tokens = items.iter().map(|i| i.1.encoder_tokens).sum();
    base.mm_tokens = items.iter().map(|i| i.1.llm_tokens).sum();
    let content = items.iter().map(|i| ContentItem {
        id: i.2,
        encoder_tokens: i.1.encoder_tokens as u32,
        llm_tokens: i.1.llm_tokens as u32,
    });
    base.content = Some(Content::new(content, segments));
    base
}

/// The reuse a workload offers, whatever the caches: what an unbounded
/// cache that saw every earlier request would find.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OfferedReuse {
    /// Media items in the run.
    pub items: u64,
    /// Fraction of them whose content an earlier item (of any request) had.
    pub items_seen_before: f64,
    /// Prompt tokens (text + multimodal) in the run.
    pub prompt_tokens: u64,
    /// Fraction of them in full KV blocks of an earlier prompt's prefix
    /// ([`easerve_sched::cache::chain_keys`], blocks of `block_size` tokens).
    pub prompt_tokens_seen_before: f64,
    /// The block size the prompt tokens were counted in, tokens.
    pub block_size: u32,
}

/// The reuse `requests` offer in arrival order (module doc), counting
/// prompt tokens in blocks of `block_size`. Requests without [`Content`]
/// count as unique.
///
/// The prompt links seen so far are a [`SeenSet`]; a run of a million
/// requests holds about a million distinct links, so each probe is a cache
/// miss, and the requests are taken in chunks of [`AHEAD`] whose links are
/// first touched together (the misses overlap) and then entered in order.
pub fn offered_reuse(requests: &[Request], block_size: u32) -> OfferedReuse {
    // a prompt typically brings at least one link of its own (its text)
    let mut links = SeenSet::with_capacity(requests.len());
    let mut items = SeenSet::with_capacity(0);
    let (mut n_items, mut seen_items, mut toks, mut seen_toks) = (0u64, 0u64, 0u64, 0u64);
    for chunk in requests.chunks(AHEAD) {
        for r in chunk {
            if let Some(c) = &r.content {
                c.keys().iter().for_each(|k| links.touch(k.key));
            }
        }
        for r in chunk {
            n_items += r.items.len() as u64;
            toks += r.prefill_tokens();
            let Some(c) = &r.content else { continue };
            seen_items += c.items().filter(|i| items.insert(i.id)).count() as u64;
            let keys = c.keys();
            // a link is seen only while every link before it was (the
            // chain); each is entered as it is looked up (one probe a link)
            let seen = keys.iter().take_while(|k| links.insert(k.key)).count();
            seen_toks += blocks_before(keys, seen, block_size) * block_size as u64;
            for k in keys.iter().skip(seen + 1) {
                links.insert(k.key);
            }
        }
    }
    let frac = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    OfferedReuse {
        items: n_items,
        items_seen_before: frac(seen_items, n_items),
        prompt_tokens: toks,
        prompt_tokens_seen_before: frac(seen_toks, toks),
        block_size,
    }
}

/// Requests whose links [`offered_reuse`] touches before entering them.
const AHEAD: usize = 64;

/// A set of 64-bit content keys, open addressing with linear probing in a
/// power-of-two table kept at most half full; the key 0, which marks an
/// empty slot, is held apart. A key's first slot is the top bits of the key
/// times 2^64/φ (Fibonacci hashing), so keys that are not hashes already
/// (a trace's `ItemHashes` may be `1`, `2`, `3`, …) spread as well as
/// SplitMix64 links do.
struct SeenSet {
    slots: Vec<u64>,
    len: usize,
    zero: bool,
}

impl SeenSet {
    /// A set sized for about `n` keys before it grows.
    fn with_capacity(n: usize) -> SeenSet {
        SeenSet {
            slots: vec![0; (2 * n).next_power_of_two().max(16)],
            len: 0,
            zero: false,
        }
    }

    /// The first slot of `key` (the table's size is a power of two).
    fn home(&self, key: u64) -> usize {
        let bits = self.slots.len().trailing_zeros();
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize
    }

    /// Read `key`'s first slot, so that a later probe finds it in the cache.
    fn touch(&self, key: u64) {
        std::hint::black_box(self.slots[self.home(key)]);
    }

    /// The slot holding `key` (≠ 0), else the empty slot where it goes:
    /// linear probing from its first slot.
    fn slot(&self, key: u64) -> usize {
        let mask = self.slots.len() - 1;
        let mut i = self.home(key);
        while self.slots[i] != 0 && self.slots[i] != key {
            i = (i + 1) & mask;
        }
        i
    }

    /// Enter `key`; whether it was in the set already.
    fn insert(&mut self, key: u64) -> bool {
        if key == 0 {
            return std::mem::replace(&mut self.zero, true);
        }
        let i = self.slot(key);
        if self.slots[i] == key {
            return true;
        }
        self.slots[i] = key;
        self.len += 1;
        if 2 * self.len > self.slots.len() {
            self.grow();
        }
        false
    }

    /// Double the table and enter every key again.
    fn grow(&mut self) {
        let bigger = vec![0; 2 * self.slots.len()];
        let old = std::mem::replace(&mut self.slots, bigger);
        for key in old.into_iter().filter(|&k| k != 0) {
            let i = self.slot(key);
            self.slots[i] = key;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::generate::generate_with_tokens;
    use crate::scenario::Overrides;

    fn image(sets: &[(&str, &str)]) -> Result<Scenario, crate::ScenarioError> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/image.toml");
        let sets: Vec<(String, String)> = [("workload.requests", "3000")]
            .iter()
            .chain(sets)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Scenario::load_with(&path, &sets, &Overrides::default())
    }

    #[test]
    fn a_pool_is_deterministic_and_zipf_repeats_more_than_uniform() {
        let zipf = image(&[
            ("workload.pool.size", "500"),
            ("workload.pool.alpha", "1.2"),
        ])
        .expect("valid");
        let (a, ta) = generate_with_tokens(&zipf);
        let (b, tb) = generate_with_tokens(&zipf);
        assert_eq!((&a, &ta), (&b, &tb));
        // the plain draw's arrivals and lengths stay as they were
        let plain = crate::generate_requests(&image(&[]).expect("valid"));
        for (x, y) in a.iter().zip(&plain) {
            assert_eq!((x.arrival, x.prompt_tokens), (y.arrival, y.prompt_tokens));
        }
        let uniform = image(&[
            ("workload.pool.size", "500"),
            ("workload.pool.popularity", "uniform"),
        ])
        .expect("valid");
        let (u, _) = generate_with_tokens(&uniform);
        let (oz, ou) = (offered_reuse(&a, 16), offered_reuse(&u, 16));
        // 3000 draws from 500 items: a uniform pool repeats all but the
        // first sighting of each item (≈ 1 − 500·(1 − e^−6)/3000 ≈ 0.83);
        // Zipf(1.2) concentrates on the head and repeats more
        assert!((ou.items_seen_before - 0.834).abs() < 0.02, "{ou:?}");
        assert!(oz.items_seen_before > ou.items_seen_before + 0.05, "{oz:?}");
        // equal ids carry equal shapes
        let mut shapes = std::collections::HashMap::new();
        for r in &a {
            let c = r.content.as_ref().expect("content");
            for (item, ci) in r.items.iter().zip(c.items()) {
                assert_eq!(*shapes.entry(ci.id).or_insert(*item), *item);
            }
        }
        // another seed draws other ids
        let other = image(&[("workload.pool.size", "500"), ("seed", "7")]).expect("valid");
        let ids = |rs: &[Request]| -> std::collections::HashSet<u64> {
            rs.iter()
                .flat_map(|r| r.content.as_ref().unwrap().items().map(|i| i.id))
                .collect()
        };
        assert!(ids(&a).is_disjoint(&ids(&generate_requests_of(&other))));
    }

    fn generate_requests_of(sc: &Scenario) -> Vec<Request> {
        crate::generate_requests(sc)
    }

    /// A trace's `ItemHashes` and `ConversationId` columns: equal hashes
    /// are the same item, a conversation's turns share its earlier text, and
    /// a hash of the wrong width names the trace and the row.
    #[test]
    fn a_trace_says_what_repeats() {
        let dir = tempfile::tempdir().unwrap();
        let image = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/image.toml"),
        )
        .unwrap()
        .replace(
            "requests = 500\nrate = 2.0",
            "requests = 3\narrival = \"trace\"\ntrace = \"t.csv\"",
        );
        std::fs::write(dir.path().join("s.toml"), image).unwrap();
        let h = "00000000000000aa";
        let rows = format!(
            "TIMESTAMP,ContextTokens,GeneratedTokens,ItemHashes,ConversationId\n\
             2023-11-16 18:15:46.5,100,40,{h},c\n\
             2023-11-16 18:15:47.5,300,10,{h},c\n\
             2023-11-16 18:15:48.5,50,10,,\n"
        );
        std::fs::write(dir.path().join("t.csv"), rows).unwrap();
        let sc = Scenario::load(&dir.path().join("s.toml"), &Overrides::default()).expect("valid");
        let (reqs, tokens) = generate_with_tokens(&sc);
        let ids = |r: &Request| {
            r.content
                .as_ref()
                .unwrap()
                .items()
                .map(|i| i.id)
                .collect::<Vec<_>>()
        };
        assert_eq!((ids(&reqs[0]), ids(&reqs[1])), (vec![0xaa], vec![0xaa]));
        assert_eq!(reqs[0].items, reqs[1].items);
        assert_eq!(tokens[1].len(), 1);
        // turn 2's prompt: the image, turn 1's 100 + 40 tokens, 160 new
        let segs: Vec<Segment> = reqs[1].content.as_ref().unwrap().segments().collect();
        let text: Vec<u32> = segs[1..].iter().map(|s| s.tokens).collect();
        assert_eq!(text, [100, 40, 160]);
        let first: Vec<Segment> = reqs[0].content.as_ref().unwrap().segments().collect();
        assert_eq!(segs[..2], first[..]);
        // the third row keeps its drawn image (no hash): 1 of 3 items repeats
        let o = offered_reuse(&reqs, 16);
        assert!((o.items_seen_before - 1.0 / 3.0).abs() < 1e-9, "{o:?}");
        std::fs::write(
            dir.path().join("t.csv"),
            "TIMESTAMP,ContextTokens,GeneratedTokens,ItemHashes\n2023-11-16 18:15:46.5,100,40,aa\n",
        )
        .unwrap();
        let e = Scenario::load(&dir.path().join("s.toml"), &Overrides::default()).unwrap_err();
        assert_eq!(e.field, "workload.trace");
        assert!(
            e.message.contains("row 2") && e.message.contains("16 hexadecimal"),
            "{e}"
        );
    }

    #[test]
    fn conversation_turns_resend_earlier_turns_and_their_media() {
        let sc = image(&[
            ("workload.conversation.turns", "3"),
            ("workload.conversation.think_time_s", "30"),
            ("workload.system_prompt.tokens", "256"),
            ("workload.system_prompt.count", "2"),
        ])
        .expect("valid");
        let (reqs, tokens) = generate_with_tokens(&sc);
        assert_eq!(reqs.len(), 3000);
        assert!(reqs.windows(2).all(|w| w[0].arrival <= w[1].arrival));
        assert!(reqs.iter().enumerate().all(|(i, r)| r.id == i as u64));
        assert_eq!(tokens.len(), 3000);
        // requests still arrive at the scenario's rate (2/s): 3000 in ≈ 1500 s
        let span = reqs.last().unwrap().arrival;
        assert!((span / 1500.0 - 1.0).abs() < 0.1, "{span}");
        // a turn's prompt starts with the whole of an earlier turn's
        let by_items: Vec<usize> = (1..=3)
            .map(|n| reqs.iter().filter(|r| r.items.len() == n).count())
            .collect();
        assert_eq!(by_items, [1000, 1000, 1000]);
        for r in reqs.iter().filter(|r| r.items.len() == 3) {
            assert!(r.prompt_tokens > 256 + 2 * 64, "{}", r.prompt_tokens);
            let c = r.content.as_ref().unwrap();
            let sum: u64 = c.segments().map(|s| s.tokens as u64).sum();
            assert_eq!(sum, r.prefill_tokens());
        }
        let o = offered_reuse(&reqs, 16);
        // unique images (no pool): only the resent ones repeat, 3 of 6 per
        // conversation; two system prompts and every resent turn repeat
        assert!((o.items_seen_before - 0.5).abs() < 1e-9, "{o:?}");
        assert!(o.prompt_tokens_seen_before > 0.4, "{o:?}");
    }

    #[test]
    fn the_seen_set_agrees_with_a_hash_set_through_growth() {
        let mut set = SeenSet::with_capacity(0);
        let mut reference = std::collections::HashSet::new();
        let mut state = 0x853c_49e6_748f_ea9bu64;
        for i in 0..20_000u64 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            // the key 0, small consecutive ids (a trace's hashes may be 1,
            // 2, 3, …), keys alike in their low or their high bits,
            // repeats, and uniform 64-bit keys
            let key = match i % 7 {
                0 => 0,
                1 => i % 4_000,
                2 => (i % 50) << 40,
                3 => (i % 60) << 58,
                4 => state % 3_000,
                _ => state,
            };
            assert_eq!(set.insert(key), !reference.insert(key), "key {key}");
        }
        assert_eq!(set.len + usize::from(set.zero), reference.len());
        assert!(set.slots.len() >= 2 * set.len);
        // consecutive ids do not cluster: each is found within a few probes
        let mut ids = SeenSet::with_capacity(0);
        for k in 1..=100_000u64 {
            ids.insert(k);
        }
        let mask = ids.slots.len() - 1;
        let longest = (1..=100_000u64)
            .map(|k| {
                let mut i = ids.home(k);
                let mut probes = 1;
                while ids.slots[i] != k {
                    i = (i + 1) & mask;
                    probes += 1;
                }
                probes
            })
            .max();
        assert!(longest.is_some_and(|p| p < 64), "{longest:?}");
    }
}
