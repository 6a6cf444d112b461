//! Decode continuous batching with paged KV-cache accounting.

use crate::RequestId;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Paged KV-cache blocks of one decode worker (vLLM's PagedAttention
/// accounting): `total` blocks of `block_size` tokens each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvBlocks {
    block_size: u64,
    total: u64,
    used: u64,
}

impl KvBlocks {
    /// `total` blocks of `block_size` tokens (block_size ≥ 1).
    pub fn new(total: u64, block_size: u64) -> Self {
        KvBlocks {
            block_size: block_size.max(1),
            total,
            used: 0,
        }
    }

    /// Blocks from the bytes left for KV cache: `⌊kv_bytes / (block_size ·
    /// kv_bytes_per_token)⌋`.
    pub fn from_memory(kv_bytes: f64, kv_bytes_per_token: f64, block_size: u64) -> Self {
        let per_block = block_size.max(1) as f64 * kv_bytes_per_token;
        let total = if per_block > 0.0 && kv_bytes > 0.0 {
            (kv_bytes / per_block).floor() as u64
        } else {
            0
        };
        KvBlocks::new(total, block_size)
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: u64) -> u64 {
        tokens.div_ceil(self.block_size)
    }

    /// Try to take `n` blocks; false (and nothing taken) when not enough are free.
    pub fn try_alloc(&mut self, n: u64) -> bool {
        if self.used + n <= self.total {
            self.used += n;
            true
        } else {
            false
        }
    }

    /// Return `n` blocks.
    pub fn free(&mut self, n: u64) {
        debug_assert!(n <= self.used);
        self.used -= n.min(self.used);
    }

    /// Blocks in use.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Blocks in all.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Tokens per block.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }
}

/// A decode run ([`crate::Command::DecodeRun`]) as a driver that runs it
/// iteration by iteration tracks it (the executor, `harness::Cluster`): which
/// iteration comes next, and when the run ends — after its last iteration,
/// or after the one in progress once told to yield
/// ([`crate::Command::DecodeYield`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeRunProgress {
    batch: u64,
    context: u64,
    steps: u64,
    done: u64,
    yielded: bool,
}

impl DecodeRunProgress {
    /// A run of `steps` iterations over `batch` sequences holding `context`
    /// tokens at the first; its first iteration is about to start.
    pub fn new(batch: u64, context: u64, steps: u64) -> Self {
        DecodeRunProgress {
            batch,
            context,
            steps,
            done: 0,
            yielded: false,
        }
    }

    /// The run ends after the iteration in progress.
    pub fn yield_now(&mut self) {
        self.yielded = true;
    }

    /// Shape of the next iteration: (sequences, total context tokens).
    pub fn next_shape(&self) -> (u64, u64) {
        (self.batch, self.context + self.done * self.batch)
    }

    /// The iteration in progress ended: `Some(iterations run)` when the run
    /// ends with it (report [`crate::Event::DecodeRunDone`]), `None` when the
    /// next iteration ([`DecodeRunProgress::next_shape`]) should start.
    pub fn iteration_done(&mut self) -> Option<u64> {
        self.done += 1;
        (self.done >= self.steps || self.yielded).then_some(self.done)
    }
}

/// One sequence handed to decode (its KV cache arrived from prefill).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeSeq {
    /// Request id.
    pub id: RequestId,
    /// Prompt tokens whose KV came from prefill.
    pub prompt_tokens: u64,
    /// Tokens still to generate in decode (output − 1: prefill emitted the first).
    pub remaining: u32,
}

/// A running sequence, ordered by the iteration in which it finishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Running {
    /// Iteration count at which its last token is produced.
    finish_step: u64,
    /// Admission order (ties finish FCFS).
    order: u64,
    id: RequestId,
    blocks: u64,
    /// Prompt + generated tokens when it finishes.
    final_context: u64,
}

/// Continuous batching on one decode worker (Orca/vLLM style).
///
/// # Driving it
/// [`DecodeScheduler::enqueue`] each sequence whose KV cache arrived; when the
/// worker is idle call [`DecodeScheduler::admit`] and, if [`Self::step_shape`]
/// shows a non-empty batch, run the [`DecodeScheduler::steps_to_finish`]
/// iterations until the first sequence finishes (the `i`-th over `context +
/// i · batch` tokens); when they complete call
/// [`DecodeScheduler::complete_steps`], which returns the finished requests,
/// then admit again. A sequence enqueued meanwhile can change the batch only
/// if [`DecodeScheduler::can_admit_next`] says so; then end the run early,
/// after the iteration in progress, and complete the iterations run.
/// ([`DecodeScheduler::complete_step`] is one iteration.)
///
/// Admission is FCFS and reserves the blocks for a sequence's whole final
/// context (prompt + all output tokens) at once, so a running sequence never
/// needs a block that is not there and no preemption occurs; a sequence is
/// admitted only when its blocks are free and the batch is below `max_batch`.
/// This is conservative against vLLM's incremental allocation with recompute
/// preemption (it can admit fewer sequences under memory pressure) and exact
/// when memory is not the limit.
///
/// Tokens are accounted lazily: an iteration costs `O(finished · log batch)`,
/// not `O(batch)` — each sequence's finishing iteration is known at admission.
#[derive(Clone, Debug)]
pub struct DecodeScheduler {
    kv: KvBlocks,
    max_batch: usize,
    waiting: VecDeque<DecodeSeq>,
    running: BinaryHeap<Reverse<Running>>,
    context_tokens: u64,
    steps: u64,
    admitted: u64,
}

impl DecodeScheduler {
    /// A scheduler over `kv` with at most `max_batch` running sequences.
    pub fn new(kv: KvBlocks, max_batch: usize) -> Self {
        DecodeScheduler {
            kv,
            max_batch: max_batch.max(1),
            waiting: VecDeque::new(),
            running: BinaryHeap::new(),
            context_tokens: 0,
            steps: 0,
            admitted: 0,
        }
    }

    /// Whether a sequence of this size could ever be admitted (its whole
    /// context fits in an empty cache).
    pub fn can_ever_fit(&self, seq: &DecodeSeq) -> bool {
        seq.prompt_tokens + seq.remaining as u64 <= self.max_context_tokens()
    }

    /// The longest context, in tokens, that [`DecodeScheduler::can_ever_fit`]
    /// admits: every block of an empty cache. A request of `p` prompt tokens
    /// (text + multimodal) and `o` output tokens holds `p + o − 1` (the last
    /// token's KV is never stored).
    pub fn max_context_tokens(&self) -> u64 {
        self.kv.total() * self.kv.block_size()
    }

    /// Forget every sequence, waiting or running, and free every block (the
    /// worker died with their caches).
    pub fn reset(&mut self) {
        self.kv = KvBlocks::new(self.kv.total(), self.kv.block_size());
        self.waiting.clear();
        self.running.clear();
        self.context_tokens = 0;
    }

    /// A sequence's KV cache has arrived; it waits for admission.
    pub fn enqueue(&mut self, seq: DecodeSeq) {
        self.waiting.push_back(seq);
    }

    /// Admit waiting sequences (FCFS) while blocks and batch slots allow;
    /// returns the ids admitted.
    pub fn admit(&mut self) -> Vec<RequestId> {
        let mut admitted = Vec::new();
        self.admit_into(&mut admitted);
        admitted
    }

    /// [`DecodeScheduler::admit`] into `admitted`, cleared first (a caller's
    /// vector, kept from call to call).
    pub fn admit_into(&mut self, admitted: &mut Vec<RequestId>) {
        admitted.clear();
        while let Some(seq) = self.waiting.front().copied() {
            if self.running.len() >= self.max_batch {
                break;
            }
            let blocks = self.kv.blocks_for(seq.prompt_tokens + seq.remaining as u64);
            if !self.kv.try_alloc(blocks) {
                break;
            }
            self.waiting.pop_front();
            self.context_tokens += seq.prompt_tokens;
            // a sequence produces at least one token per admission
            let steps = seq.remaining.max(1) as u64;
            self.admitted += 1;
            self.running.push(Reverse(Running {
                finish_step: self.steps + steps,
                order: self.admitted,
                id: seq.id,
                blocks,
                final_context: seq.prompt_tokens + steps,
            }));
            admitted.push(seq.id);
        }
    }

    /// Take request `id` out, waiting or running, and free its KV blocks
    /// (its client left). Returns whether it was here. A running sequence
    /// leaves between iterations: call this only while no iteration is in
    /// flight (the controller ends a run early first, with a yield). Costs
    /// `O(batch)`: an abort is rare next to an iteration.
    pub fn remove(&mut self, id: RequestId) -> bool {
        if let Some(at) = self.waiting.iter().position(|s| s.id == id) {
            self.waiting.remove(at);
            return true;
        }
        let before = self.running.len();
        let steps = self.steps;
        let mut freed = (0, 0);
        self.running.retain(|Reverse(r)| {
            if r.id != id {
                return true;
            }
            // its context now: its final context less the tokens still to come
            freed = (r.blocks, r.final_context - (r.finish_step - steps));
            false
        });
        if self.running.len() == before {
            return false;
        }
        self.kv.free(freed.0);
        self.context_tokens -= freed.1;
        true
    }

    /// Ids of the running batch, in no particular order.
    pub fn batch(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.running.iter().map(|r| r.0.id)
    }

    /// Shape of the next iteration: (running sequences, total context tokens).
    pub fn step_shape(&self) -> (u64, u64) {
        (self.running.len() as u64, self.context_tokens)
    }

    /// Sequences waiting for admission.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The KV blocks (for inspection).
    pub fn kv(&self) -> &KvBlocks {
        &self.kv
    }

    /// Iterations until the next running sequence generates its last token
    /// (at least 1), or `None` with nothing running. Until then the batch
    /// cannot change except by admission, and admission cannot change either
    /// unless a sequence arrives while a slot and its blocks are free
    /// ([`DecodeScheduler::can_admit_next`]).
    pub fn steps_to_finish(&self) -> Option<u64> {
        self.running
            .peek()
            .map(|Reverse(top)| top.finish_step.saturating_sub(self.steps).max(1))
    }

    /// Whether [`DecodeScheduler::admit`] would admit the first waiting
    /// sequence now (a batch slot and the blocks for its whole context free).
    pub fn can_admit_next(&self) -> bool {
        self.waiting.front().is_some_and(|seq| {
            self.running.len() < self.max_batch
                && self.kv.used() + self.kv.blocks_for(seq.prompt_tokens + seq.remaining as u64)
                    <= self.kv.total()
        })
    }

    /// One iteration finished: every running sequence generated one token.
    /// Returns the ids that generated their last token (their blocks are
    /// freed), in admission order among those finishing together.
    pub fn complete_step(&mut self) -> Vec<RequestId> {
        self.complete_steps(1)
    }

    /// `n` iterations of an unchanged batch finished (`n` ≤
    /// [`DecodeScheduler::steps_to_finish`]; a larger `n` is clamped to it,
    /// since the batch changes there): every running sequence generated `n`
    /// tokens. Returns the ids that generated their last token, as
    /// [`DecodeScheduler::complete_step`] does.
    pub fn complete_steps(&mut self, n: u64) -> Vec<RequestId> {
        let mut done = Vec::new();
        self.complete_steps_into(n, &mut done);
        done
    }

    /// [`DecodeScheduler::complete_steps`] into `done`, cleared first (a
    /// caller's vector, kept from call to call).
    pub fn complete_steps_into(&mut self, n: u64, done: &mut Vec<RequestId>) {
        done.clear();
        let n = self.steps_to_finish().map_or(n, |k| n.min(k));
        self.steps += n;
        self.context_tokens += n * self.running.len() as u64;
        while let Some(Reverse(top)) = self.running.peek().copied() {
            if top.finish_step > self.steps {
                break;
            }
            self.running.pop();
            self.kv.free(top.blocks);
            self.context_tokens -= top.final_context;
            done.push(top.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn blocks_from_memory() {
        // 1 GiB for KV, 128 KiB per token, 16-token blocks → 8192 tokens → 512 blocks
        let kv = KvBlocks::from_memory(1024.0 * 1024.0 * 1024.0, 131072.0, 16);
        assert_eq!(kv.total(), 512);
        assert_eq!(kv.blocks_for(17), 2);
    }

    /// A sequence taken out mid-run frees its blocks and its context now,
    /// and the others finish when they would have; one waiting leaves the
    /// queue; an unknown id changes nothing.
    #[test]
    fn a_removed_sequence_frees_its_blocks_and_context() {
        let mut d = DecodeScheduler::new(KvBlocks::new(100, 16), 2);
        for (id, remaining) in [(0, 10), (1, 4), (2, 6)] {
            d.enqueue(DecodeSeq {
                id,
                prompt_tokens: 20,
                remaining,
            });
        }
        assert_eq!(d.admit(), vec![0, 1]);
        assert!(d.complete_steps(2).is_empty());
        // 0 and 1 hold 22 tokens each after two iterations
        assert_eq!(d.step_shape(), (2, 44));
        let used = d.kv().used();
        assert!(d.remove(0));
        assert_eq!(d.step_shape(), (1, 22));
        assert_eq!(d.kv().used(), used - d.kv().blocks_for(30));
        assert!(d.remove(2) && d.waiting() == 0);
        assert!(!d.remove(7));
        assert_eq!(d.complete_steps(2), vec![1]);
        assert_eq!((d.kv().used(), d.step_shape()), (0, (0, 0)));
    }

    #[test]
    fn admits_only_when_blocks_are_free() {
        let mut d = DecodeScheduler::new(KvBlocks::new(10, 16), 64);
        // each needs 100 + 60 = 160 tokens = 10 blocks
        for id in 0..2 {
            d.enqueue(DecodeSeq {
                id,
                prompt_tokens: 100,
                remaining: 60,
            });
        }
        assert_eq!(d.admit(), vec![0]);
        assert_eq!(d.admit(), Vec::<RequestId>::new());
        for _ in 0..59 {
            assert!(d.complete_step().is_empty());
        }
        assert_eq!(d.step_shape(), (1, 159));
        assert_eq!(d.complete_step(), vec![0]);
        assert_eq!(d.kv().used(), 0);
        assert_eq!(d.admit(), vec![1]);
    }

    proptest! {
        /// A run of `steps_to_finish` iterations completed at once leaves the
        /// scheduler as completing them one by one does, and nothing finishes
        /// before the run's last iteration; `can_admit_next` says what `admit`
        /// then does.
        #[test]
        fn a_run_completes_as_its_iterations_one_by_one(
            seqs in proptest::collection::vec((0u64..500, 0u32..40), 1..30),
            total in 1u64..200,
        ) {
            let mut runs = DecodeScheduler::new(KvBlocks::new(total, 16), 8);
            for (i, &(p, r)) in seqs.iter().enumerate() {
                runs.enqueue(DecodeSeq { id: i as u64, prompt_tokens: p, remaining: r });
            }
            let mut steps = runs.clone();
            let mut guard = 0;
            loop {
                let could = runs.can_admit_next();
                let admitted = runs.admit();
                prop_assert_eq!(could, !admitted.is_empty());
                prop_assert_eq!(&admitted, &steps.admit());
                let Some(k) = runs.steps_to_finish() else { break };
                for i in 1..=k {
                    let done = steps.complete_step();
                    prop_assert_eq!(done.is_empty(), i < k);
                    if i == k {
                        prop_assert_eq!(&done, &runs.complete_steps(k));
                    }
                }
                prop_assert_eq!(runs.step_shape(), steps.step_shape());
                prop_assert_eq!(runs.kv().used(), steps.kv().used());
                guard += 1;
                prop_assert!(guard < 10_000, "no progress");
            }
        }

        #[test]
        fn kv_blocks_never_exceed_capacity(
            total in 1u64..400,
            seqs in proptest::collection::vec((1u64..2000, 1u32..300), 1..80),
            steps_between in 0usize..5,
        ) {
            let mut d = DecodeScheduler::new(KvBlocks::new(total, 16), 32);
            let mut pending: VecDeque<DecodeSeq> = seqs.iter().enumerate()
                .map(|(i, &(p, r))| DecodeSeq { id: i as u64, prompt_tokens: p, remaining: r })
                .filter(|s| d.can_ever_fit(s))
                .collect();
            let n = pending.len();
            let mut finished = 0;
            let mut guard = 0;
            while finished < n {
                if let Some(s) = pending.pop_front() { d.enqueue(s); }
                d.admit();
                prop_assert!(d.kv().used() <= d.kv().total());
                for _ in 0..=steps_between {
                    finished += d.complete_step().len();
                    prop_assert!(d.kv().used() <= d.kv().total());
                }
                guard += 1;
                prop_assert!(guard < 100_000, "no progress");
            }
            prop_assert_eq!(d.kv().used(), 0);
            prop_assert_eq!(d.step_shape(), (0, 0));
        }
    }
}
