//! Content-keyed reuse: what a request's prompt is made of ([`Content`]),
//! the hash chain that keys its KV blocks ([`block_keys`]), and the
//! encoder cache's directory ([`EncoderCache`]): which item embeddings an
//! encode worker holds, with least-recently-used eviction ([`Lru`]).
//!
//! The keys are 64-bit content ids, not cryptographic hashes: the workload
//! derives them from the seed and a pool index (or reads them from a trace),
//! so two items share a key exactly when they are the same content.

use std::collections::HashMap;

/// KV block size of the prefix cache, tokens: vLLM's default `--block-size`
/// (16) on CUDA.
pub const DEFAULT_BLOCK_SIZE: u32 = 16;

/// One piece of a prompt in order: a content id, its LLM tokens, and what
/// it is — one of the request's items (its embeddings) or text (a shared
/// system prompt, one turn's text, one turn's answer). The kind is stated,
/// never inferred from the id: a text segment whose id equals an item's is
/// still text ([`Content::pieces`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Segment {
    /// Content id: equal ids mean equal tokens.
    pub id: u64,
    /// LLM tokens of the segment.
    pub tokens: u32,
    /// The request's item this segment is, by its index in the request's
    /// `items` order; `None` for text. Absent in JSON written before the
    /// field existed (read as `None`; see [`ContentParts`] for how such
    /// content finds its items).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<u32>,
}

impl Segment {
    /// A text segment of content id `id` and `tokens` LLM tokens.
    pub const fn text(id: u64, tokens: u32) -> Segment {
        Segment {
            id,
            tokens,
            item: None,
        }
    }

    /// The embeddings of the request's item `k` (index in its `items`
    /// order), of content id `id` and `tokens` LLM tokens.
    pub const fn item(k: u32, id: u64, tokens: u32) -> Segment {
        Segment {
            id,
            tokens,
            item: Some(k),
        }
    }
}

/// One segment of a prompt as a driver builds it ([`Content::pieces`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    /// The request's item of this index (in its `items` order) and the LLM
    /// tokens of its embeddings.
    Item(usize, u32),
    /// A text segment: equal content ids are equal tokens.
    Text(Segment),
}

/// One media item of a request as the caches see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContentItem {
    /// Content id: equal ids mean equal content (vLLM's `mm_hash`).
    pub id: u64,
    /// Tokens the encoder's transformer processes for it.
    pub encoder_tokens: u32,
    /// Embeddings it contributes to the LLM prompt (what the cache holds).
    pub llm_tokens: u32,
}

/// What a request's prompt is made of, for the caches: the content id and
/// tokens of each item, the prompt's segments in order, and the prompt's
/// hash chain ([`chain_keys`]), computed once when the content is built and
/// kept, so the offered-reuse count, placement, lookup and release all read
/// the same links. Absent (`None` in [`crate::Request::content`]) for a
/// workload with no reuse: every item and prompt is then unique.
///
/// The whole content is one heap block of 16-byte words (a run keeps one per
/// request): a header (items, segments), each item (content id, encoder
/// tokens `<< 32 |` LLM tokens), each segment (content id, item index + 1
/// `<< 32 |` tokens, 0 above for text), then the chain's links. It
/// serialises as `{ items, segments }` ([`ContentParts`]).
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "ContentParts", into = "ContentParts")]
pub struct Content {
    words: Box<[ChainKey]>,
}

/// [`Content`] as its parts: how it is written and read.
///
/// Reading: a segment's `item` must be below the number of `items`. Parts
/// written before segments named their kind (items present, no segment
/// with an `item`) are read by the rule of that time: a segment is the
/// next item not yet met when their ids are equal
/// ([`ContentParts::with_items_by_id`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContentParts {
    /// Each of the request's items, in `items` order: its content id and
    /// its tokens.
    pub items: Vec<ContentItem>,
    /// The prompt in order; the tokens sum to the request's prefill tokens.
    pub segments: Vec<Segment>,
}

impl std::fmt::Debug for Content {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = self.parts();
        f.debug_struct("Content")
            .field("items", &p.items)
            .field("segments", &p.segments)
            .finish()
    }
}

impl TryFrom<ContentParts> for Content {
    type Error = String;

    /// Errors: a segment naming an item the parts do not have.
    fn try_from(p: ContentParts) -> Result<Content, String> {
        let legacy = !p.items.is_empty() && p.segments.iter().all(|s| s.item.is_none());
        let p = if legacy { p.with_items_by_id() } else { p };
        let n = p.items.len();
        if let Some((j, k)) = p
            .segments
            .iter()
            .enumerate()
            .find_map(|(j, s)| s.item.filter(|&k| k as usize >= n).map(|k| (j, k)))
        {
            return Err(format!(
                "segments[{j}].item: {k}, but the content has {n} items (0..{n})"
            ));
        }
        Ok(Content::new(p.items.into_iter(), &p.segments))
    }
}

impl ContentParts {
    /// The parts with each segment whose id is that of the next item not
    /// yet met (in `items` order) marked as that item, every other segment
    /// as text: how segments were told apart before they named their kind
    /// (a text segment with the next item's id is taken for it; kept only
    /// to read such parts).
    pub fn with_items_by_id(mut self) -> ContentParts {
        let mut next = self.items.iter().enumerate().peekable();
        for s in &mut self.segments {
            s.item = match next.peek() {
                Some(&(k, i)) if i.id == s.id => {
                    next.next();
                    Some(k as u32)
                }
                _ => None,
            };
        }
        self
    }
}

impl From<Content> for ContentParts {
    fn from(c: Content) -> ContentParts {
        c.parts()
    }
}

impl Content {
    /// The content of a prompt of `segments` (in order; their tokens sum to
    /// the request's prefill tokens) whose media items are `items` (in the
    /// request's `items` order), with its hash chain. A segment's `item`
    /// indexes `items`.
    ///
    /// # Panics
    /// In debug builds, when a segment's `item` is not below `items.len()`
    /// (read parts with `Content::try_from`, which says so as an error).
    pub fn new(items: impl ExactSizeIterator<Item = ContentItem>, segments: &[Segment]) -> Content {
        let links = segments.iter().filter(|s| s.tokens > 0).count();
        let mut words = Vec::with_capacity(1 + items.len() + segments.len() + links);
        words.push(ChainKey {
            key: items.len() as u64,
            end: segments.len() as u64,
        });
        words.extend(items.map(|i| ChainKey {
            key: i.id,
            end: (i.encoder_tokens as u64) << 32 | i.llm_tokens as u64,
        }));
        debug_assert!(
            segments
                .iter()
                .all(|s| s.item.is_none_or(|k| (k as u64) < words[0].key)),
            "a segment names an item the content does not have"
        );
        words.extend(segments.iter().map(|s| ChainKey {
            key: s.id,
            end: s.item.map_or(0, |k| k as u64 + 1) << 32 | s.tokens as u64,
        }));
        chain_keys(segments, &mut words);
        Content {
            words: words.into_boxed_slice(),
        }
    }

    /// Items and segments in the block.
    fn counts(&self) -> (usize, usize) {
        (self.words[0].key as usize, self.words[0].end as usize)
    }

    /// Each item, in the request's `items` order: its content id and tokens.
    pub fn items(&self) -> impl ExactSizeIterator<Item = ContentItem> + Clone + '_ {
        let (n, _) = self.counts();
        self.words[1..1 + n].iter().map(|w| ContentItem {
            id: w.key,
            encoder_tokens: (w.end >> 32) as u32,
            llm_tokens: w.end as u32,
        })
    }

    /// The prompt's segments, in order.
    pub fn segments(&self) -> impl ExactSizeIterator<Item = Segment> + Clone + '_ {
        let (n, s) = self.counts();
        self.words[1 + n..1 + n + s].iter().map(|w| Segment {
            id: w.key,
            tokens: w.end as u32,
            item: ((w.end >> 32) as u32).checked_sub(1),
        })
    }

    /// The prompt's hash chain: link `j` covers its first `j + 1` segments
    /// of any tokens ([`chain_keys`]).
    pub fn keys(&self) -> &[ChainKey] {
        let (n, s) = self.counts();
        &self.words[1 + n + s..]
    }

    /// The prompt's segments in order, each as one of the request's items
    /// (its index in `items`) or text (a system prompt, a turn's text, an
    /// earlier answer), as its [`Segment::item`] says — never by its id, so
    /// text whose id equals an item's stays text. Text segments of no
    /// tokens are left out. What a driver builds a prompt from: `bench`'s
    /// request bodies and the executor's prompt tokens.
    pub fn pieces(&self) -> impl Iterator<Item = Piece> + '_ {
        self.segments().filter_map(|s| match s.item {
            Some(k) => Some(Piece::Item(k as usize, s.tokens)),
            None if s.tokens > 0 => Some(Piece::Text(s)),
            None => None,
        })
    }

    /// The items and segments, as owned vectors (to change and rebuild).
    pub fn parts(&self) -> ContentParts {
        ContentParts {
            items: self.items().collect(),
            segments: self.segments().collect(),
        }
    }
}

/// SplitMix64's finaliser (Steele, Lea and Flood, OOPSLA 2014): a bijection
/// on 64 bits that spreads every input bit over the output.
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Combine a running hash with one more word (order matters).
pub fn mix(h: u64, x: u64) -> u64 {
    splitmix64(h.rotate_left(17) ^ splitmix64(x))
}

/// One link of a prompt's hash chain: the key of its first segments and
/// the tokens they hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainKey {
    /// Hash of the key before and this segment's content id and tokens.
    pub key: u64,
    /// Prompt tokens up to the end of this segment.
    pub end: u64,
}

/// The hash chain of a prompt, appended to `out`: link `j` hashes link
/// `j − 1` with segment `j`'s content id and tokens, so two prompts share
/// link `j` exactly when their first `j + 1` segments are the same
/// content. The KV blocks of `block_size` tokens that end within the first
/// `j + 1` segments (`⌊end_j / block_size⌋` of them) are then the same —
/// vLLM's prefix-caching hash chain (parent block hash, token ids,
/// multimodal hashes) taken a segment at a time rather than a block at a
/// time, so a prompt costs a hash per segment, not per block; a last
/// partial block is never shared (vLLM caches full blocks only).
pub fn chain_keys(segments: &[Segment], out: &mut Vec<ChainKey>) {
    let (mut key, mut end) = (0u64, 0u64);
    for s in segments.iter().filter(|s| s.tokens > 0) {
        key = mix(mix(key, s.id), s.tokens as u64);
        end += s.tokens as u64;
        out.push(ChainKey { key, end });
    }
}

/// Full blocks of `block_size` tokens up to link `j` of `keys` (0 for `j`
/// before the first).
pub fn blocks_before(keys: &[ChainKey], j: usize, block_size: u32) -> u64 {
    j.checked_sub(1)
        .map_or(0, |i| keys[i].end / block_size.max(1) as u64)
}

/// A hasher for keys that are hashes already (content ids and chain keys
/// come out of SplitMix64): the key itself.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = x;
    }
}

/// A map keyed by a content hash.
pub type HashKeyed<V> = HashMap<u64, V, std::hash::BuildHasherDefault<IdHasher>>;

const NIL: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct Node {
    key: u64,
    size: u64,
    prev: u32,
    next: u32,
    /// Holders that keep it from eviction ([`Lru::pin`]).
    pins: u32,
    /// In the recency order (so counted in `used` and evictable).
    linked: bool,
}

/// A least-recently-used set of keys, each with a size, under a capacity in
/// the same unit: inserting past the capacity evicts from the least recently
/// used end. `O(1)` per operation (a hash map into a doubly linked list
/// kept in one vector).
///
/// A held key may be pinned ([`Lru::pin`]): it stays held but leaves the
/// recency order and the capacity's count until its last pin is taken off
/// ([`Lru::unpin`]) and it is inserted again ([`Lru::insert`]), as the
/// prefix cache keeps the blocks a request references.
#[derive(Clone, Debug)]
pub struct Lru {
    map: HashKeyed<u32>,
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// Most recently used.
    head: u32,
    /// Least recently used.
    tail: u32,
    used: u64,
    capacity: u64,
    evictions: u64,
    /// Keys evicted since last taken, when kept ([`Lru::log_evictions`]).
    log: Option<Vec<u64>>,
}

impl Lru {
    /// An empty set holding at most `capacity` (units of the sizes).
    pub fn new(capacity: u64) -> Lru {
        Lru {
            map: HashKeyed::default(),
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            used: 0,
            capacity,
            evictions: 0,
            log: None,
        }
    }

    /// Keep the keys evicted from now on, for [`Lru::take_evicted`].
    pub fn log_evictions(&mut self) {
        self.log.get_or_insert_with(Vec::new);
    }

    /// The keys evicted since last taken (none unless
    /// [`Lru::log_evictions`]), in eviction order.
    pub fn take_evicted(&mut self) -> Vec<u64> {
        self.log.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Whether `key` is held (does not touch its recency).
    pub fn contains(&self, key: u64) -> bool {
        self.map.contains_key(&key)
    }

    /// Look `key` up: when held, make it the most recently used (unless
    /// pinned or unpinned and not inserted again) and return true.
    pub fn touch(&mut self, key: u64) -> bool {
        match self.map.get(&key) {
            Some(&i) => {
                if self.nodes[i as usize].linked {
                    self.unlink(i);
                    self.push_front(i);
                }
                true
            }
            None => false,
        }
    }

    /// Pin `key` when held: it leaves the recency order and the units
    /// counted against the capacity, so it is not evicted. Returns the
    /// units it takes out of the count (its size on its first pin, 0 when
    /// it was pinned already); `None` when it is not held.
    pub fn pin(&mut self, key: u64) -> Option<u64> {
        let i = *self.map.get(&key)?;
        if self.nodes[i as usize].linked {
            self.unlink(i);
            self.used -= self.nodes[i as usize].size;
        }
        let n = &mut self.nodes[i as usize];
        n.pins += 1;
        Some(if n.pins == 1 { n.size } else { 0 })
    }

    /// Take one pin off `key`. Returns its size when that was its last
    /// pin: it is then still held but outside the recency order until
    /// [`Lru::insert`] places it (most recently used, or drops it when it
    /// does not fit); `None` when pins remain or it was not pinned.
    pub fn unpin(&mut self, key: u64) -> Option<u64> {
        let i = *self.map.get(&key)?;
        let n = &mut self.nodes[i as usize];
        if n.pins == 0 {
            return None;
        }
        n.pins -= 1;
        (n.pins == 0).then_some(n.size)
    }

    /// Insert `key` of `size` as the most recently used (or touch it when
    /// held; a pinned key stays as it is), evicting least recently used keys
    /// until it fits. A key larger than the whole capacity is not inserted
    /// (returns false).
    pub fn insert(&mut self, key: u64, size: u64) -> bool {
        self.insert_evicting(key, size, None)
    }

    /// [`Lru::insert`], appending the keys it evicts to `evicted` when given.
    pub fn insert_evicting(
        &mut self,
        key: u64,
        size: u64,
        mut evicted: Option<&mut Vec<u64>>,
    ) -> bool {
        // a key unpinned and not yet placed again keeps its node
        let unpinned = match self.map.get(&key) {
            Some(&i) if self.nodes[i as usize].linked || self.nodes[i as usize].pins > 0 => {
                return self.touch(key);
            }
            held => held.copied(),
        };
        if size > self.capacity {
            if let Some(i) = unpinned {
                self.map.remove(&key);
                self.free.push(i);
            }
            return false;
        }
        while self.used + size > self.capacity && self.tail != NIL {
            if let (Some(k), Some(out)) = (self.evict_lru(), evicted.as_deref_mut()) {
                out.push(k);
            }
        }
        let node = Node {
            key,
            size,
            prev: NIL,
            next: NIL,
            pins: 0,
            linked: false,
        };
        let i = match unpinned.or_else(|| self.free.pop()) {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        if unpinned.is_none() {
            self.map.insert(key, i);
        }
        self.push_front(i);
        self.used += size;
        true
    }

    /// Remove `key` when held (pinned or not); whether it was.
    pub fn remove(&mut self, key: u64) -> bool {
        match self.map.remove(&key) {
            Some(i) => {
                if self.nodes[i as usize].linked {
                    self.unlink(i);
                    self.used -= self.nodes[i as usize].size;
                }
                self.free.push(i);
                true
            }
            None => false,
        }
    }

    /// Evict least recently used keys until at most `limit` is held.
    pub fn evict_to(&mut self, limit: u64) {
        while self.used > limit && self.evict_lru().is_some() {}
    }

    /// Change the capacity (evicting down to it).
    pub fn set_capacity(&mut self, capacity: u64) {
        self.capacity = capacity;
        self.evict_to(capacity);
    }

    /// Remove the least recently used key; its key, or `None` when empty.
    pub fn evict_lru(&mut self) -> Option<u64> {
        let i = self.tail;
        if i == NIL {
            return None;
        }
        self.unlink(i);
        let n = &self.nodes[i as usize];
        let key = n.key;
        self.used -= n.size;
        self.map.remove(&key);
        self.free.push(i);
        self.evictions += 1;
        if let Some(log) = self.log.as_mut() {
            log.push(key);
        }
        Some(key)
    }

    /// Units held, pinned keys excluded.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Keys held, pinned keys included.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Keys evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    fn unlink(&mut self, i: u32) {
        let (prev, next) = {
            let n = &mut self.nodes[i as usize];
            n.linked = false;
            (n.prev, n.next)
        };
        match prev {
            NIL => self.head = next,
            p => self.nodes[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.nodes[n as usize].prev = prev,
        }
    }

    fn push_front(&mut self, i: u32) {
        let old = self.head;
        {
            let n = &mut self.nodes[i as usize];
            n.prev = NIL;
            n.next = old;
            n.linked = true;
        }
        match old {
            NIL => self.tail = i,
            o => self.nodes[o as usize].prev = i,
        }
        self.head = i;
    }
}

/// Hits and lookups of one cache, for the report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounters {
    /// Lookups (items for the encoder cache, prompt tokens for the prefix cache).
    pub queries: u64,
    /// Of which found in the cache.
    pub hits: u64,
    /// Entries evicted.
    pub evictions: u64,
}

impl CacheCounters {
    /// `hits / queries`, 0 without a query.
    pub fn hit_rate(&self) -> f64 {
        if self.queries == 0 {
            0.0
        } else {
            self.hits as f64 / self.queries as f64
        }
    }
}

/// The caches a deployment runs (all off by default, which changes nothing).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CacheConfig {
    /// The encoder cache of each encode worker (`[deployment.encoder_cache]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoder: Option<EncoderCacheConfig>,
    /// The prefix cache of each prefill worker (`[deployment.prefix_cache]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<PrefixCacheConfig>,
    /// Cache-aware placement on encode and prefill workers
    /// (`[deployment.cache_routing]`); `None`: least outstanding work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<CacheRouting>,
    /// The encoder-output store shared by every encode worker
    /// (`[deployment.encoder_store]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<EncoderStoreConfig>,
}

/// Cache-aware placement, as Dynamo's KV router weighs a worker: the cost
/// of sending a request to worker `w` is
/// `overlap_weight × new(w) + outstanding(w)`, where `new(w)` is the work
/// the request brings that `w`'s cache does not already hold (encoder
/// tokens of the items it misses; prompt tokens past its cached prefix)
/// and `outstanding(w)` the work already placed there (Dynamo's
/// `kv_overlap_score_weight × potential_prefill_blocks +
/// potential_active_blocks`, lower is better). At weight 1 it places on
/// the worker with the least work after placement; larger weights favour
/// hits over balance, 0 ignores the caches. Ties go to the lowest index.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CacheRouting {
    /// Weight of the new work against the outstanding work (Dynamo's
    /// `--kv-overlap-score-weight`, default 1).
    pub overlap_weight: f64,
}

/// The one worker of `0..n` that `open` allows, when exactly one is (no
/// choice to weigh, so no cache to look up); `None` otherwise.
pub fn sole_open(n: usize, open: impl Fn(usize) -> bool) -> Option<usize> {
    let mut ws = (0..n).filter(|&w| open(w));
    let first = ws.next()?;
    ws.next().is_none().then_some(first)
}

/// The worker of least `overlap_weight × new(w) + outstanding(w)` among
/// those `open` allows ([`CacheRouting`]); `None` when none is open. With a
/// single open worker `new` is not called.
pub fn cache_aware_pick(
    outstanding: &[f64],
    open: impl Fn(usize) -> bool,
    new: impl Fn(usize) -> f64,
    overlap_weight: f64,
) -> Option<usize> {
    if let Some(w) = sole_open(outstanding.len(), &open) {
        return Some(w);
    }
    let mut best: Option<(usize, f64)> = None;
    for (w, &load) in outstanding.iter().enumerate() {
        if !open(w) {
            continue;
        }
        let cost = overlap_weight * new(w) + load;
        if best.is_none_or(|(_, c)| cost < c) {
            best = Some((w, cost));
        }
    }
    best.map(|b| b.0)
}

/// The prefix cache's knobs (scenario `[deployment.prefix_cache]`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PrefixCacheConfig {
    /// Tokens per KV block (a power of two; vLLM's default 16).
    pub block_size: u32,
    /// KV blocks of a remote prefill worker's pool: the memory its GPUs
    /// have left after the weights.
    pub remote_blocks: u64,
    /// KV blocks of a local prefill worker's pool (its encode GPUs hold
    /// the encoder's weights too).
    pub local_blocks: u64,
}

impl CacheConfig {
    /// Whether every cache is off.
    pub fn is_off(&self) -> bool {
        *self == CacheConfig::default()
    }
}

/// The encoder cache's knobs (scenario `[deployment.encoder_cache]`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EncoderCacheConfig {
    /// Bytes of embeddings each encode worker keeps.
    pub capacity_bytes: u64,
    /// Bytes of one embedding token: the LLM's hidden size × the embedding
    /// dtype's bytes (`ModelArch::embedding_bytes_per_token`).
    pub bytes_per_token: f64,
    /// The front end hashes each item's raw bytes, so a hit skips its
    /// preprocessing too; off (vLLM's way: `mm_hash` is taken over the
    /// processed item), a hit still costs its preprocessing.
    pub hash_raw_bytes: bool,
}

/// The shared encoder-output store's knobs (scenario
/// `[deployment.encoder_store]`): one store every encode worker reads and
/// writes, as vLLM's EC connectors (`ECSharedStorageConnector`'s shared
/// folder, `ECCPUConnector`'s `/dev/shm` tier) or a Mooncake Store keep
/// encoder outputs by `mm_hash` across instances.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EncoderStoreConfig {
    /// Bytes of embeddings the store keeps.
    pub capacity_bytes: u64,
    /// Bytes of one embedding token, as [`EncoderCacheConfig::bytes_per_token`].
    pub bytes_per_token: f64,
    /// The link a worker on the store's node reaches it over; `None`: that
    /// node's intra-node link (what the embeddings cross). Workers on other
    /// nodes reach it over the NICs. Only the drivers price it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<StoreLink>,
}

/// A link to the store: its bandwidth and per-transfer latency.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StoreLink {
    /// GB/s (1e9 bytes/s) per direction.
    pub bandwidth_gbs: f64,
    /// Seconds of setup per transfer.
    pub latency_s: f64,
}

impl StoreLink {
    /// Seconds to move `bytes` over the link (`latency + bytes / bandwidth`).
    pub fn transfer_time(&self, bytes: f64) -> f64 {
        self.latency_s + bytes / (self.bandwidth_gbs * 1e9)
    }
}

/// The shared store's lookups, hits and traffic over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreCounters {
    /// Items looked up (those the worker's own cache missed; every item
    /// with that cache off).
    pub queries: u64,
    /// Of which held: fetched, not encoded.
    pub hits: u64,
    /// Items evicted.
    pub evictions: u64,
    /// Bytes fetched by the hits.
    pub fetched_bytes: u64,
    /// Items written (encoded outputs the store did not hold).
    pub writes: u64,
    /// Bytes written.
    pub written_bytes: u64,
}

impl StoreCounters {
    /// The lookups, hits and evictions as one cache's counters.
    pub fn cache(&self) -> CacheCounters {
        CacheCounters {
            queries: self.queries,
            hits: self.hits,
            evictions: self.evictions,
        }
    }
}

/// What an encode worker does with one item's embeddings, as the
/// controller's [`EncoderCache`] decided when it placed the request there.
/// Applied in placement order, these keep the worker's store equal to the
/// directory: the worker only stores and drops.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ItemOp {
    /// The item's content key (vLLM's `mm_hash`).
    pub key: u64,
    /// Held: reuse the stored embeddings, skip the encode.
    pub hit: bool,
    /// Held by the shared store, not the worker (with `hit`): fetch the
    /// embeddings from the store first.
    #[serde(default)]
    pub fetched: bool,
    /// A miss the directory entered: store its embeddings once encoded
    /// (false for an item larger than the whole cache).
    pub stored: bool,
    /// Keys evicted to make room for this item: drop them first.
    pub evicted: Vec<u64>,
}

/// Each placed request's [`ItemOp`]s until its driver takes them (when its
/// pass goes out), with a count per key of the placed requests among them
/// that fetch it from the shared store: an item the store evicts while one
/// of them still waits must outlive the eviction until then.
#[derive(Clone, Debug, Default)]
pub(crate) struct PendingOps {
    by_request: HashMap<crate::RequestId, Vec<ItemOp>>,
    /// Per key, the fetches of it among `by_request` (none is zero).
    fetching: HashMap<u64, u32>,
}

impl PendingOps {
    /// Request `id` was placed with `ops`; those of an earlier placement
    /// (its worker died before its pass went out) are replaced.
    pub(crate) fn put(&mut self, id: crate::RequestId, ops: Vec<ItemOp>) {
        self.take(id);
        for o in ops.iter().filter(|o| o.fetched) {
            *self.fetching.entry(o.key).or_insert(0) += 1;
        }
        self.by_request.insert(id, ops);
    }

    /// Request `id`'s operations, no longer pending (empty when none are).
    pub(crate) fn take(&mut self, id: crate::RequestId) -> Vec<ItemOp> {
        let ops = self.by_request.remove(&id).unwrap_or_default();
        for o in ops.iter().filter(|o| o.fetched) {
            if let Some(n) = self.fetching.get_mut(&o.key) {
                *n -= 1;
                if *n == 0 {
                    self.fetching.remove(&o.key);
                }
            }
        }
        ops
    }

    /// Fetches of `key` by pending requests (an item a request holds twice
    /// counts twice).
    pub(crate) fn fetching(&self, key: u64) -> u32 {
        self.fetching.get(&key).copied().unwrap_or(0)
    }
}

/// The encoder cache's directory over every encode worker: for each, the
/// items whose embeddings it holds (an [`Lru`] in bytes), as vLLM's
/// `EncoderCacheManager` keeps them keyed by `mm_hash`; and, when on, the
/// shared store's ([`EncoderStoreConfig`]). The controller consults it when
/// it places a request on an encode worker, item by item: the worker's own
/// cache first (a hit: its encode is skipped), then the store (a hit: its
/// embeddings are fetched, not encoded, and enter the worker's cache), else
/// it is encoded. A miss enters the worker's cache at once, since the
/// worker's passes run in order and the pass that encodes it ends before
/// any later pass that reuses it starts; it enters the store only when its
/// pass ends ([`EncoderCache::write_back`]), since another worker's pass
/// may start before then.
#[derive(Clone, Debug)]
pub struct EncoderCache {
    /// Each worker's cache; empty with the per-worker cache off.
    workers: Vec<Lru>,
    store: Option<Lru>,
    bytes_per_token: f64,
    counters: CacheCounters,
    store_counters: StoreCounters,
}

impl EncoderCache {
    /// A cache of `cfg.capacity_bytes` on each of `workers` encode workers.
    pub fn new(workers: usize, cfg: EncoderCacheConfig) -> EncoderCache {
        EncoderCache {
            workers: (0..workers).map(|_| Lru::new(cfg.capacity_bytes)).collect(),
            store: None,
            bytes_per_token: cfg.bytes_per_token,
            counters: CacheCounters::default(),
            store_counters: StoreCounters::default(),
        }
    }

    /// The directory of `workers` encode workers' caches (`cache`, `None`:
    /// off) and the shared store (`store`, `None`: off); `None` when both
    /// are off.
    pub fn with(
        workers: usize,
        cache: Option<EncoderCacheConfig>,
        store: Option<EncoderStoreConfig>,
    ) -> Option<EncoderCache> {
        let bytes_per_token = match (cache, store) {
            (Some(c), _) => c.bytes_per_token,
            (None, Some(s)) => s.bytes_per_token,
            (None, None) => return None,
        };
        Some(EncoderCache {
            workers: cache.map_or_else(Vec::new, |c| {
                (0..workers).map(|_| Lru::new(c.capacity_bytes)).collect()
            }),
            store: store.map(|s| Lru::new(s.capacity_bytes)),
            bytes_per_token,
            counters: CacheCounters::default(),
            store_counters: StoreCounters::default(),
        })
    }

    /// Whether the per-worker caches are on.
    fn local(&self) -> bool {
        !self.workers.is_empty()
    }

    /// Bytes of an item of `llm_tokens` embeddings.
    pub fn item_bytes(&self, llm_tokens: u64) -> u64 {
        (llm_tokens as f64 * self.bytes_per_token).ceil() as u64
    }

    /// How many of `ids` worker `w` holds, without touching them (for
    /// cache-aware placement).
    pub fn held(&self, w: usize, ids: &[u64]) -> usize {
        ids.iter().filter(|&&k| self.holds(w, k)).count()
    }

    /// Whether worker `w`'s own cache holds `key` (false with it off).
    fn holds(&self, w: usize, key: u64) -> bool {
        self.workers.get(w).is_some_and(|l| l.contains(key))
    }

    /// Encoder tokens of the `items` worker `w` does not hold: the encode
    /// work a request would bring there.
    pub fn missed_tokens(&self, w: usize, items: impl Iterator<Item = ContentItem>) -> u64 {
        items
            .filter(|i| {
                !self.holds(w, i.id) && !self.store.as_ref().is_some_and(|s| s.contains(i.id))
            })
            .map(|i| i.encoder_tokens as u64)
            .sum()
    }

    /// Look each item up on worker `w` (ids with their LLM tokens) and
    /// enter the misses: bit `k` of the result is set when item `k` hit
    /// (items beyond the 64th are always misses).
    pub fn lookup(&mut self, w: usize, items: impl Iterator<Item = (u64, u64)>) -> u64 {
        self.lookup_ops(w, items, None)
    }

    /// [`EncoderCache::lookup`], appending to `ops` (when given) what the
    /// worker must do with each item's embeddings, in order, so that what it
    /// holds stays what this directory says it holds ([`ItemOp`]). An item
    /// the store holds sets its bit too (it is not encoded); which of the
    /// hits came from the store is [`EncoderCache::lookup_store`]'s.
    pub fn lookup_ops(
        &mut self,
        w: usize,
        items: impl Iterator<Item = (u64, u64)>,
        ops: Option<&mut Vec<ItemOp>>,
    ) -> u64 {
        self.lookup_store(w, items, ops).0
    }

    /// [`EncoderCache::lookup_ops`]: the hit mask (the worker's cache or the
    /// store) and the mask of the hits the store gave (fetched).
    pub fn lookup_store(
        &mut self,
        w: usize,
        items: impl Iterator<Item = (u64, u64)>,
        mut ops: Option<&mut Vec<ItemOp>>,
    ) -> (u64, u64) {
        let (mut mask, mut fetched) = (0u64, 0u64);
        let local = self.local();
        for (k, (id, llm_tokens)) in items.enumerate() {
            let bytes = self.item_bytes(llm_tokens);
            let mut evicted = Vec::new();
            let own = local && k < 64 && self.workers[w].touch(id);
            if !own && self.store.is_some() {
                self.store_counters.queries += 1;
            }
            let from_store = !own && k < 64 && self.store.as_mut().is_some_and(|s| s.touch(id));
            if local {
                self.counters.queries += 1;
                self.counters.hits += u64::from(own);
            }
            if from_store {
                fetched |= 1 << k;
                self.store_counters.hits += 1;
                self.store_counters.fetched_bytes += bytes;
            }
            if own || from_store {
                mask |= 1 << k;
            }
            // a fetched or encoded item enters the worker's cache
            let stored = own
                || (local && {
                    let log = ops.is_some().then_some(&mut evicted);
                    self.workers[w].insert_evicting(id, bytes, log)
                });
            if let Some(ops) = ops.as_deref_mut() {
                ops.push(ItemOp {
                    key: id,
                    hit: own || from_store,
                    fetched: from_store,
                    stored,
                    evicted,
                });
            }
        }
        self.counters.evictions = self.workers.iter().map(Lru::evictions).sum();
        (mask, fetched)
    }

    /// Take back from the counters a lookup that did not stand: a request
    /// placed again (its worker died before its pass ran) is looked up
    /// again, so its earlier lookup of `items` items, `own` of which hit the
    /// worker's cache and `fetched` (of `fetched_bytes`) the store, is
    /// withdrawn and each item counts once, in the lookup its pass ran with.
    pub fn withdraw(&mut self, items: usize, own: u32, fetched: u32, fetched_bytes: u64) {
        if self.local() {
            self.counters.queries -= items as u64;
            self.counters.hits -= u64::from(own);
        }
        if self.store.is_some() {
            let s = &mut self.store_counters;
            s.queries -= (items - own as usize) as u64;
            s.hits -= u64::from(fetched);
            s.fetched_bytes -= fetched_bytes;
        }
    }

    /// Bytes of the items (ids with their LLM tokens) the store would be
    /// written: those it does not hold (0 with the store off). What the
    /// producing worker sends it when its pass ends.
    pub fn unwritten_bytes(&self, items: impl Iterator<Item = (u64, u64)>) -> u64 {
        let Some(s) = &self.store else {
            return 0;
        };
        items
            .filter(|&(id, _)| !s.contains(id))
            .map(|(_, t)| self.item_bytes(t))
            .sum()
    }

    /// A pass ended: write its encoded items (ids with their LLM tokens) to
    /// the store, least recently used evicted first; an item the store
    /// already holds (another worker wrote it meanwhile) is only touched.
    /// The keys written (nothing with the store off).
    pub fn write_back(&mut self, items: impl Iterator<Item = (u64, u64)>) -> Vec<u64> {
        let mut written = Vec::new();
        let bpt = self.bytes_per_token;
        let Some(s) = self.store.as_mut() else {
            return written;
        };
        for (id, tokens) in items {
            if s.touch(id) {
                continue;
            }
            let bytes = (tokens as f64 * bpt).ceil() as u64;
            if s.insert(id, bytes) {
                self.store_counters.writes += 1;
                self.store_counters.written_bytes += bytes;
                written.push(id);
            }
        }
        self.store_counters.evictions = s.evictions();
        written
    }

    /// The store's counters, when it is on.
    pub fn store_counters(&self) -> Option<StoreCounters> {
        self.store.as_ref().map(|_| self.store_counters)
    }

    /// Bytes the store holds (0 with it off).
    pub fn store_bytes(&self) -> u64 {
        self.store.as_ref().map_or(0, Lru::used)
    }

    /// Keep the keys the store evicts from now on, for
    /// [`EncoderCache::take_store_evicted`] (a driver that holds the
    /// store's embeddings drops them).
    pub fn log_store_evictions(&mut self) {
        if let Some(s) = self.store.as_mut() {
            s.log_evictions();
        }
    }

    /// The keys the store evicted since last taken, in order (none unless
    /// [`EncoderCache::log_store_evictions`]).
    pub fn take_store_evicted(&mut self) -> Vec<u64> {
        self.store
            .as_mut()
            .map(Lru::take_evicted)
            .unwrap_or_default()
    }

    /// Whether the store holds `key` (does not touch it).
    pub fn store_holds(&self, key: u64) -> bool {
        self.store.as_ref().is_some_and(|s| s.contains(key))
    }

    /// Worker `w` lost what it held (its process died): forget it, so a
    /// later lookup there misses (evictions are not counted).
    /// The store is not the worker's: it keeps what it holds.
    pub fn clear(&mut self, w: usize) {
        let Some(old) = self.workers.get(w) else {
            return;
        };
        let mut fresh = Lru::new(old.capacity);
        fresh.evictions = old.evictions;
        self.workers[w] = fresh;
    }

    /// Bytes of embeddings worker `w` holds.
    pub fn used_bytes(&self, w: usize) -> u64 {
        self.workers.get(w).map_or(0, Lru::used)
    }

    /// Count `items` lookups of items without content ids (unique, so
    /// misses that are never entered); the hit mask, 0.
    pub fn miss(&mut self, items: usize) -> u64 {
        if self.local() {
            self.counters.queries += items as u64;
        }
        if self.store.is_some() {
            self.store_counters.queries += items as u64;
        }
        0
    }

    /// Hits, queries and evictions so far (of the per-worker caches).
    pub fn counters(&self) -> CacheCounters {
        self.counters
    }

    /// Whether the per-worker caches are on (not the store alone).
    pub fn per_worker(&self) -> bool {
        self.local()
    }
}

/// One prefill worker's KV pool as the prefix cache sees it.
#[derive(Clone, Debug)]
struct PrefixPool {
    /// Cached links, each sized by the blocks that end within its segment
    /// (at least 1): those no request references in least-recently-used
    /// order, evicted first from its tail; those referenced by requests
    /// queued or running here pinned, never evicted.
    free: Lru,
    /// Blocks the pinned links hold.
    pinned_blocks: u64,
    /// Blocks of the pool.
    blocks: u64,
}

impl PrefixPool {
    fn holds(&self, key: u64) -> bool {
        self.free.contains(key)
    }
}

/// What a prefill worker does with the KV caches it computed, as the
/// controller's [`PrefixCache`] directory decided, in the directory's order
/// ([`PrefixCache::keep_ops`]): applied in that order, the worker holds
/// exactly the links the directory says it holds. The worker only stores
/// and drops.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PrefixOp {
    /// Request `id`'s prefill ended: keep its KV cache under each of its
    /// prompt's chain links (`(key, end)`: the link's key and the prompt
    /// tokens up to its end).
    Keep {
        /// The request.
        id: u64,
        /// Its prompt's links.
        links: Vec<(u64, u64)>,
    },
    /// Links evicted: drop what is kept under them.
    Drop {
        /// Their keys.
        keys: Vec<u64>,
    },
}

/// The prefix cache's directory over every prefill worker: the KV blocks
/// each holds, keyed by the hash chain of their content ([`chain_keys`]),
/// as vLLM's prefix caching keeps them. Cached blocks live in the worker's
/// KV pool: a request's hit blocks are referenced (pinned) from when it is
/// queued until its prefill ends, the running batch's new blocks take room
/// first, and the blocks no request references are evicted least recently
/// used first when room is needed (a segment's blocks at a time). When a
/// prefill ends, every full block of its prompt stays cached, unreferenced.
#[derive(Clone, Debug)]
pub struct PrefixCache {
    pools: Vec<PrefixPool>,
    block_size: u32,
    counters: CacheCounters,
    /// Each worker's [`PrefixOp`]s since last taken, when kept.
    ops: Option<Vec<Vec<PrefixOp>>>,
}

impl PrefixCache {
    /// A cache over prefill workers whose pools hold `blocks[p]` blocks of
    /// `block_size` tokens.
    pub fn new(blocks: impl Iterator<Item = u64>, block_size: u32) -> PrefixCache {
        PrefixCache {
            pools: blocks
                .map(|b| PrefixPool {
                    free: Lru::new(b),
                    pinned_blocks: 0,
                    blocks: b,
                })
                .collect(),
            block_size: block_size.max(1),
            counters: CacheCounters::default(),
            ops: None,
        }
    }

    /// Keep each worker's [`PrefixOp`]s from now on, for a driver whose
    /// workers hold the KV blocks ([`PrefixCache::take_ops`]).
    pub fn keep_ops(&mut self) {
        for pool in &mut self.pools {
            pool.free.log_evictions();
        }
        self.ops
            .get_or_insert_with(|| vec![Vec::new(); self.pools.len()]);
    }

    /// Worker `p` lost its KV pool (its process died): forget what it
    /// held and pinned (a later lookup there misses), and the operations
    /// not yet sent to it.
    pub fn clear(&mut self, p: usize) {
        let old = &self.pools[p];
        let mut free = Lru::new(old.blocks);
        free.evictions = old.free.evictions;
        if old.free.log.is_some() {
            free.log_evictions();
        }
        self.pools[p] = PrefixPool {
            free,
            pinned_blocks: 0,
            blocks: old.blocks,
        };
        if let Some(ops) = self.ops.as_mut() {
            ops[p].clear();
        }
    }

    /// Worker `p`'s [`PrefixOp`]s since last taken, in order (none unless
    /// [`PrefixCache::keep_ops`]).
    pub fn take_ops(&mut self, p: usize) -> Vec<PrefixOp> {
        self.flush(p);
        self.ops
            .as_mut()
            .map(|o| std::mem::take(&mut o[p]))
            .unwrap_or_default()
    }

    /// Move worker `p`'s evictions so far into its operations.
    fn flush(&mut self, p: usize) {
        if let Some(ops) = self.ops.as_mut() {
            let keys = self.pools[p].free.take_evicted();
            if !keys.is_empty() {
                ops[p].push(PrefixOp::Drop { keys });
            }
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Size of link `j` of `keys` in the pool: the blocks that end within
    /// its segment, at least 1 (a segment shorter than a block still takes
    /// a directory entry).
    fn size(&self, keys: &[ChainKey], j: usize) -> u64 {
        (blocks_before(keys, j + 1, self.block_size) - blocks_before(keys, j, self.block_size))
            .max(1)
    }

    /// Worker `p`'s cached links at the head of `keys` and the prompt
    /// tokens they cover for a prompt of `tokens` tokens: whole blocks, at
    /// most `(tokens − 1) / block_size` of them, since the last token is
    /// always computed to emit the first output token (as in vLLM).
    pub fn held(&self, p: usize, keys: &[ChainKey], tokens: u64) -> (usize, u64) {
        let pool = &self.pools[p];
        let links = keys.iter().take_while(|k| pool.holds(k.key)).count();
        (links, self.covered(keys, links, tokens))
    }

    /// The prompt tokens the first `links` links of `keys` cover for a
    /// prompt of `tokens` tokens ([`PrefixCache::held`]).
    fn covered(&self, keys: &[ChainKey], links: usize, tokens: u64) -> u64 {
        let bs = self.block_size as u64;
        let most = tokens.saturating_sub(1) / bs;
        blocks_before(keys, links, self.block_size).min(most) * bs
    }

    /// A request of `tokens` prompt tokens whose chain is `keys` is queued
    /// at worker `p`: its held links are pinned until [`PrefixCache::release`].
    /// Returns the links pinned and the prompt tokens they save.
    pub fn acquire(&mut self, p: usize, keys: &[ChainKey], tokens: u64) -> (usize, u64) {
        let pool = &mut self.pools[p];
        let mut links = 0;
        // the held links at the head of the chain, each pinned as found (a
        // link's size is its node's: equal keys, equal segments)
        while let Some(units) = keys.get(links).and_then(|k| pool.free.pin(k.key)) {
            pool.pinned_blocks += units;
            links += 1;
        }
        let hit = self.covered(keys, links, tokens);
        let pool = &mut self.pools[p];
        pool.free
            .set_capacity(pool.blocks.saturating_sub(pool.pinned_blocks));
        self.counters.queries += tokens;
        self.counters.hits += hit;
        self.count_evictions();
        (links, hit)
    }

    /// A batch of `blocks` new blocks starts on worker `p`: evict
    /// unreferenced blocks until they fit beside the pinned ones.
    pub fn make_room(&mut self, p: usize, blocks: u64) {
        let pool = &mut self.pools[p];
        let room = pool.blocks.saturating_sub(pool.pinned_blocks + blocks);
        pool.free.evict_to(room);
        self.count_evictions();
    }

    /// The prefill of the request with chain `keys`, `links` of which were
    /// pinned, ended on worker `p`: they are unpinned and every link of
    /// its prompt stays cached, most recently used.
    pub fn release(&mut self, p: usize, keys: &[ChainKey], links: usize) {
        self.release_request(p, u64::MAX, keys, links);
    }

    /// [`PrefixCache::release`] of request `id`, whose KV cache the worker
    /// keeps under its links ([`PrefixOp::Keep`]) when operations are kept.
    pub fn release_request(&mut self, p: usize, id: u64, keys: &[ChainKey], links: usize) {
        let pool = &mut self.pools[p];
        for k in &keys[..links.min(keys.len())] {
            // unreferenced now; placed again in the order below
            pool.pinned_blocks -= pool.free.unpin(k.key).unwrap_or(0);
        }
        let room = {
            let pool = &self.pools[p];
            pool.blocks.saturating_sub(pool.pinned_blocks)
        };
        self.pools[p].free.set_capacity(room);
        self.flush(p);
        if let Some(ops) = self.ops.as_mut() {
            ops[p].push(PrefixOp::Keep {
                id,
                links: keys.iter().map(|k| (k.key, k.end)).collect(),
            });
        }
        for j in 0..keys.len() {
            let size = self.size(keys, j);
            // a link another request still pins stays pinned
            self.pools[p].free.insert(keys[j].key, size);
        }
        self.count_evictions();
    }

    fn count_evictions(&mut self) {
        self.counters.evictions = self.pools.iter().map(|p| p.free.evictions()).sum();
    }

    /// Prompt tokens looked up and found so far (vLLM's
    /// `prefix_cache_queries` and `prefix_cache_hits`), entries evicted.
    pub fn counters(&self) -> CacheCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(id: u64, tokens: u32) -> Segment {
        Segment::text(id, tokens)
    }

    /// Issue 29: `pieces()` took a segment for the next item when their
    /// ids were equal, so text whose id a client chose to equal an item's
    /// (its SHA-256 prefix, given enough work) became that item.
    #[test]
    fn text_with_the_next_items_id_stays_text() {
        let item = ContentItem {
            id: 7,
            encoder_tokens: 600,
            llm_tokens: 576,
        };
        // the system prompt's id is the image's; then the image, then text
        let segments = [seg(7, 24), Segment::item(0, 7, 576), seg(9, 12)];
        let c = Content::new([item].into_iter(), &segments);
        assert_eq!(
            c.pieces().collect::<Vec<_>>(),
            [
                Piece::Text(seg(7, 24)),
                Piece::Item(0, 576),
                Piece::Text(seg(9, 12))
            ]
        );
        assert_eq!(c.segments().collect::<Vec<_>>(), segments);
        // the chain keys read ids and tokens only: as for all-text segments
        let mut plain = Vec::new();
        chain_keys(&[seg(7, 24), seg(7, 576), seg(9, 12)], &mut plain);
        assert_eq!(c.keys(), &plain[..]);
        // an item of no tokens is still the item; empty text is left out
        let segments = [seg(7, 0), Segment::item(0, 7, 0), seg(9, 12)];
        let c = Content::new([item].into_iter(), &segments);
        assert_eq!(
            c.pieces().collect::<Vec<_>>(),
            [Piece::Item(0, 0), Piece::Text(seg(9, 12))]
        );
    }

    #[test]
    fn content_reads_its_parts_back_and_old_parts_by_id() {
        let item = |id| ContentItem {
            id,
            encoder_tokens: 10,
            llm_tokens: 8,
        };
        let c = Content::new(
            [item(7), item(8)].into_iter(),
            &[seg(7, 4), Segment::item(0, 7, 8), Segment::item(1, 8, 8)],
        );
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains(r#"{"id":7,"tokens":4}"#), "{json}");
        assert!(json.contains(r#"{"id":7,"tokens":8,"item":0}"#), "{json}");
        assert_eq!(serde_json::from_str::<Content>(&json).unwrap(), c);
        // written before segments said their kind: ids tell the items
        let old = r#"{"items":[{"id":7,"encoder_tokens":10,"llm_tokens":8}],
            "segments":[{"id":3,"tokens":4},{"id":7,"tokens":8},{"id":7,"tokens":2}]}"#;
        let c: Content = serde_json::from_str(old).unwrap();
        assert_eq!(
            c.pieces().collect::<Vec<_>>(),
            [
                Piece::Text(seg(3, 4)),
                Piece::Item(0, 8),
                Piece::Text(seg(7, 2))
            ]
        );
        // an item the content does not have is an error naming the field
        let bad = r#"{"items":[{"id":7,"encoder_tokens":10,"llm_tokens":8}],
            "segments":[{"id":7,"tokens":8,"item":1}]}"#;
        let e = serde_json::from_str::<Content>(bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("segments[0].item: 1"), "{e}");
    }

    #[test]
    fn chain_keys_share_a_prefix_and_part_at_the_first_difference() {
        let keys = |segs: &[Segment]| {
            let mut out = Vec::new();
            chain_keys(segs, &mut out);
            out
        };
        let a = keys(&[seg(1, 40), seg(2, 24), seg(3, 8)]);
        let b = keys(&[seg(1, 40), seg(2, 24), seg(4, 8)]);
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        // blocks of 16 that end within the shared first two segments: 4
        assert_eq!(blocks_before(&a, 2, 16), 4);
        assert_eq!(blocks_before(&a, 1, 16), 2);
        assert_eq!(blocks_before(&a, 0, 16), 0);
        // the same content after a different prefix gets other keys
        let c = keys(&[seg(9, 40), seg(2, 24)]);
        assert!(a.iter().zip(&c).all(|(x, y)| x.key != y.key));
        // a segment's length is part of its key; empty segments are skipped
        assert_ne!(keys(&[seg(1, 41)])[0], a[0]);
        assert_eq!(keys(&[seg(7, 0), seg(1, 40)])[0], a[0]);
    }

    #[test]
    fn lru_evicts_the_least_recently_used_first() {
        let mut l = Lru::new(10);
        assert!(l.insert(1, 4) && l.insert(2, 4));
        assert!(l.touch(1));
        // 3 needs room: 2 is the least recently used
        assert!(l.insert(3, 4));
        assert!(l.contains(1) && !l.contains(2) && l.contains(3));
        assert_eq!((l.used(), l.evictions()), (8, 1));
        // larger than the whole capacity: not inserted, nothing evicted
        assert!(!l.insert(4, 11));
        assert_eq!(l.len(), 2);
        assert_eq!(l.evict_lru(), Some(1));
    }

    #[test]
    fn a_pinned_key_is_held_but_never_evicted_until_placed_again() {
        let mut l = Lru::new(10);
        assert!(l.insert(1, 4) && l.insert(2, 4));
        // pinned: out of the count; a second pin takes nothing more
        assert_eq!((l.pin(1), l.pin(1), l.pin(9)), (Some(4), Some(0), None));
        assert_eq!(l.used(), 4);
        // 3 and 4 need room: only 2 can go, the pinned 1 stays held
        assert!(l.insert(3, 4) && l.insert(4, 4));
        assert!(l.contains(1) && !l.contains(2));
        assert_eq!(l.evict_lru(), Some(3));
        // its last pin off, it is placed again as the most recently used
        assert_eq!((l.unpin(1), l.unpin(1), l.unpin(1)), (None, Some(4), None));
        assert!(l.insert(1, 4));
        assert_eq!(
            (l.used(), l.evict_lru(), l.evict_lru()),
            (8, Some(4), Some(1))
        );
    }

    #[test]
    fn prefix_cache_pins_hits_and_evicts_unreferenced_blocks_lru() {
        let chain = |ids: &[u64]| {
            let segs: Vec<Segment> = ids.iter().map(|&i| seg(i, 16)).collect();
            let mut out = Vec::new();
            chain_keys(&segs, &mut out);
            out
        };
        let mut c = PrefixCache::new([4].into_iter(), 16);
        // a first prompt of 3 blocks: no hit; its blocks stay cached
        let first = chain(&[1, 2, 3]);
        assert_eq!(c.acquire(0, &first, 48), (0, 0));
        c.make_room(0, 3);
        c.release(0, &first, 0);
        // the same prompt: all 3 links held, hits stop a block short
        assert_eq!(c.acquire(0, &first, 48), (3, 32));
        // a batch of 2 new blocks beside the 3 pinned: nothing to evict
        c.make_room(0, 2);
        c.release(0, &first, 3);
        // a prompt sharing the first link; room for 3 new blocks evicts
        // the unreferenced links, least recently used first (2, then 3)
        let other = chain(&[1, 9, 9]);
        assert_eq!(c.acquire(0, &other, 48), (1, 16));
        c.make_room(0, 3);
        assert_eq!(c.held(0, &first, 48), (1, 16));
        c.release(0, &other, 1);
        let n = c.counters();
        assert_eq!((n.queries, n.hits, n.evictions), (144, 48, 2));
    }

    #[test]
    fn cache_aware_pick_weighs_new_work_against_load() {
        // worker 0 holds the request's prefix (new work 100), worker 1 is
        // idle but would compute all 1000 tokens
        let new = |w: usize| if w == 0 { 100.0 } else { 1000.0 };
        let open = |_| true;
        assert_eq!(cache_aware_pick(&[500.0, 0.0], open, new, 1.0), Some(0));
        // enough load outweighs the hit
        assert_eq!(cache_aware_pick(&[1000.0, 0.0], open, new, 1.0), Some(1));
        // a larger weight favours the hit; 0 ignores the caches
        assert_eq!(cache_aware_pick(&[1000.0, 0.0], open, new, 2.0), Some(0));
        assert_eq!(cache_aware_pick(&[1.0, 0.0], open, new, 0.0), Some(1));
        // a closed worker is skipped
        assert_eq!(cache_aware_pick(&[0.0, 0.0], |w| w == 1, new, 1.0), Some(1));
    }

    #[test]
    fn encoder_cache_hits_what_a_worker_holds_and_evicts_past_its_bytes() {
        let cfg = EncoderCacheConfig {
            capacity_bytes: 2_000,
            bytes_per_token: 1.0,
            hash_raw_bytes: false,
        };
        let mut c = EncoderCache::new(2, cfg);
        assert_eq!(c.lookup(0, [(7, 1_000)].into_iter()), 0);
        assert_eq!(c.lookup(0, [(7, 1_000), (8, 1_000)].into_iter()), 0b01);
        // another worker holds nothing
        assert_eq!(c.lookup(1, [(7, 1_000)].into_iter()), 0);
        // a third item evicts 7 (used before 8)
        c.lookup(0, [(9, 1_000)].into_iter());
        assert_eq!(c.held(0, &[7, 8, 9]), 2);
        let n = c.counters();
        assert_eq!((n.queries, n.hits, n.evictions), (5, 1, 1));
    }

    #[test]
    fn the_store_serves_what_another_worker_encoded_and_evicts_lru() {
        let cache = EncoderCacheConfig {
            capacity_bytes: 1_000,
            bytes_per_token: 1.0,
            hash_raw_bytes: false,
        };
        let store = EncoderStoreConfig {
            capacity_bytes: 2_000,
            bytes_per_token: 1.0,
            link: None,
        };
        let mut c = EncoderCache::with(2, Some(cache), Some(store)).expect("on");
        // worker 0 encodes 7; until its pass ends the store does not hold it
        assert_eq!(c.lookup_store(0, [(7, 1_000)].into_iter(), None), (0, 0));
        assert_eq!(c.lookup_store(1, [(7, 1_000)].into_iter(), None), (0, 0));
        assert_eq!(c.write_back([(7, 1_000)].into_iter()), vec![7]);
        // worker 1's second writer only touches it
        assert!(c.write_back([(7, 1_000)].into_iter()).is_empty());
        // worker 0 holds 7 itself: its own cache first, the store not asked
        let queried = c.store_counters().unwrap().queries;
        assert_eq!(c.lookup_store(0, [(7, 1_000)].into_iter(), None), (1, 0));
        assert_eq!(c.store_counters().unwrap().queries, queried);
        // worker 1 misses 8 and writes it; worker 0 then fetches it, which
        // evicts 7 from worker 0's own cache (1,000 bytes)
        c.lookup_store(1, [(8, 1_000)].into_iter(), None);
        c.write_back([(8, 1_000)].into_iter());
        let mut ops = Vec::new();
        assert_eq!(
            c.lookup_store(0, [(8, 1_000)].into_iter(), Some(&mut ops)),
            (1, 1)
        );
        assert!(ops[0].hit && ops[0].fetched && ops[0].stored, "{ops:?}");
        assert_eq!(ops[0].evicted, vec![7]);
        // a third item evicts the store's least recently used: 7 (8 was
        // fetched since)
        c.lookup_store(1, [(9, 1_000)].into_iter(), None);
        c.write_back([(9, 1_000)].into_iter());
        assert!(!c.store_holds(7) && c.store_holds(8) && c.store_holds(9));
        assert_eq!(c.lookup_store(0, [(7, 1_000)].into_iter(), None), (0, 0));
        let s = c.store_counters().unwrap();
        assert_eq!((s.queries, s.hits, s.evictions), (6, 1, 1));
        assert_eq!(
            (s.writes, s.written_bytes, s.fetched_bytes),
            (3, 3_000, 1_000)
        );
        assert_eq!(c.store_bytes(), 2_000);
        // a worker's death leaves the store as it was
        c.clear(1);
        assert!(c.store_holds(8) && c.store_holds(9));
        // the store alone: no per-worker counts, every item asks the store
        let mut alone = EncoderCache::with(2, None, Some(store)).expect("on");
        alone.write_back([(5, 500)].into_iter());
        assert_eq!(
            alone.lookup_store(1, [(5, 500), (6, 500)].into_iter(), None),
            (1, 1)
        );
        assert_eq!(alone.counters().queries, 0);
        assert_eq!(alone.store_counters().unwrap().queries, 2);
        assert!(EncoderCache::with(2, None, None).is_none());
    }

    #[test]
    fn replaying_the_item_ops_keeps_a_store_equal_to_the_directory() {
        let cfg = EncoderCacheConfig {
            capacity_bytes: 3_000,
            bytes_per_token: 1.0,
            hash_raw_bytes: false,
        };
        let mut c = EncoderCache::new(1, cfg);
        let mut store = std::collections::BTreeSet::new();
        let mut hits = 0;
        // a request per line: (content id, LLM tokens) of its items; 99 is
        // larger than the whole cache and never stored
        let requests: [&[(u64, u64)]; 6] = [
            &[(1, 1_000), (2, 1_000)],
            &[(1, 1_000), (3, 1_000)],
            &[(4, 1_000), (4, 1_000)],
            &[(99, 5_000), (2, 1_000)],
            &[(1, 1_000)],
            &[(5, 2_000)],
        ];
        for items in requests {
            let mut ops = Vec::new();
            c.lookup_ops(0, items.iter().copied(), Some(&mut ops));
            assert_eq!(ops.len(), items.len());
            for op in ops {
                assert_eq!(op.hit, store.contains(&op.key), "{op:?}");
                hits += u64::from(op.hit);
                for k in &op.evicted {
                    assert!(store.remove(k), "{k} evicted but not held");
                }
                if !op.hit && op.stored {
                    store.insert(op.key);
                }
            }
            let held: Vec<u64> = store.iter().copied().collect();
            assert_eq!(c.held(0, &held), held.len());
            assert_eq!(c.workers[0].len(), held.len());
        }
        let n = c.counters();
        assert_eq!((n.hits, n.queries), (hits, 10));
        assert!(n.evictions > 0);
    }

    #[test]
    fn replaying_the_prefix_ops_keeps_what_the_directory_holds() {
        let chain = |ids: &[u64]| {
            let segs: Vec<Segment> = ids.iter().map(|&i| seg(i, 16)).collect();
            let mut out = Vec::new();
            chain_keys(&segs, &mut out);
            out
        };
        let mut c = PrefixCache::new([5].into_iter(), 16);
        c.keep_ops();
        // the worker's side: request id -> its links once kept
        let mut held = std::collections::BTreeSet::new();
        let mut replay = |c: &mut PrefixCache| {
            for op in c.take_ops(0) {
                match op {
                    PrefixOp::Keep { links, .. } => held.extend(links.iter().map(|l| l.0)),
                    PrefixOp::Drop { keys } => {
                        for k in keys {
                            assert!(held.remove(&k), "{k} dropped but not kept");
                        }
                    }
                }
            }
            held.clone()
        };
        let prompts = [&[1, 2, 3][..], &[1, 2, 4], &[7, 8, 9], &[1, 5, 6], &[7, 8]];
        for (id, ids) in prompts.iter().enumerate() {
            let keys = chain(ids);
            let tokens = 16 * ids.len() as u64;
            let (links, _) = c.acquire(0, &keys, tokens);
            // every link a hit reuses is kept by the worker
            let now = replay(&mut c);
            assert!(keys[..links].iter().all(|k| now.contains(&k.key)));
            c.make_room(0, keys.len() as u64);
            c.release_request(0, id as u64, &keys, links);
            let now = replay(&mut c);
            let all: Vec<u64> = now.iter().copied().collect();
            // the worker keeps exactly the directory's links
            for k in &all {
                assert!(c.pools[0].holds(*k));
            }
            assert_eq!(c.pools[0].free.len(), all.len());
        }
        assert!(c.counters().evictions > 0);
    }
}
