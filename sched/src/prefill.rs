//! Prefill batching under a token budget.

use crate::RequestId;
use std::collections::VecDeque;

/// One request waiting for prefill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillItem {
    /// Request id.
    pub id: RequestId,
    /// Prompt tokens to prefill (text + multimodal).
    pub tokens: u64,
}

/// The FCFS prefill queue of one prefill worker.
///
/// A batch takes requests in arrival order while their tokens fit the budget
/// (vLLM's `max_num_batched_tokens`) and the sequence cap (`max_num_seqs`). A
/// prompt longer than the whole budget runs alone, unless the queue chunks
/// ([`PrefillQueue::chunked`]).
#[derive(Clone, Debug)]
pub struct PrefillQueue {
    token_budget: u64,
    max_seqs: usize,
    queue: VecDeque<PrefillItem>,
    queued_tokens: u64,
    chunked: bool,
}

impl PrefillQueue {
    /// A queue with a per-batch token budget and sequence cap (both ≥ 1).
    pub fn new(token_budget: u64, max_seqs: usize) -> Self {
        PrefillQueue {
            token_budget: token_budget.max(1),
            max_seqs: max_seqs.max(1),
            queue: VecDeque::new(),
            queued_tokens: 0,
            chunked: false,
        }
    }

    /// A queue that chunks prompts (Sarathi-style chunked prefill, as
    /// HydraInfer's scheduler does): a batch that has room left takes the
    /// part of the next prompt that fills its budget, and the rest of that
    /// prompt stays first in line ([`PrefillQueue::holds_rest_of`]).
    pub fn chunked(token_budget: u64, max_seqs: usize) -> Self {
        PrefillQueue {
            chunked: true,
            ..PrefillQueue::new(token_budget, max_seqs)
        }
    }

    /// Whether the rest of request `id`'s prompt waits first in line: the
    /// last batch took only a chunk of it.
    pub fn holds_rest_of(&self, id: RequestId) -> bool {
        self.queue.front().is_some_and(|i| i.id == id)
    }

    /// Enqueue a request whose embeddings have arrived.
    pub fn push(&mut self, item: PrefillItem) {
        self.queued_tokens += item.tokens;
        self.queue.push_back(item);
    }

    /// Remove and return everything queued, FCFS (its worker died).
    pub fn drain_all(&mut self) -> Vec<PrefillItem> {
        self.queued_tokens = 0;
        self.queue.drain(..).collect()
    }

    /// Take request `id` out of the queue (its client left before its
    /// prefill started, or before the rest of a chunked prompt ran); returns
    /// the tokens it still had queued, `None` when it was not queued.
    pub fn remove(&mut self, id: RequestId) -> Option<u64> {
        let at = self.queue.iter().position(|i| i.id == id)?;
        let item = self.queue.remove(at)?;
        self.queued_tokens -= item.tokens;
        Some(item.tokens)
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Tokens waiting.
    pub fn queued_tokens(&self) -> u64 {
        self.queued_tokens
    }

    /// Remove and return the next batch (empty when nothing waits).
    pub fn next_batch(&mut self) -> Vec<PrefillItem> {
        let mut batch = Vec::new();
        self.next_batch_into(&mut batch);
        batch
    }

    /// [`PrefillQueue::next_batch`] into `batch`, cleared first (a caller's
    /// vector, kept from batch to batch).
    pub fn next_batch_into(&mut self, batch: &mut Vec<PrefillItem>) {
        batch.clear();
        let mut tokens = 0u64;
        while let Some(item) = self.queue.front_mut() {
            let fits = tokens + item.tokens <= self.token_budget;
            if batch.len() < self.max_seqs && !fits && self.chunked && tokens < self.token_budget {
                // a chunk fills the budget; the rest stays first in line
                let part = self.token_budget - tokens;
                item.tokens -= part;
                tokens += part;
                batch.push(PrefillItem {
                    id: item.id,
                    tokens: part,
                });
                break;
            }
            if batch.len() >= self.max_seqs || (!batch.is_empty() && !fits) {
                break;
            }
            tokens += item.tokens;
            batch.push(*item);
            self.queue.pop_front();
        }
        self.queued_tokens -= tokens;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_and_fcfs() {
        let mut q = PrefillQueue::new(1000, 8);
        for (id, tokens) in [(0, 400), (1, 500), (2, 200), (3, 3000), (4, 10)] {
            q.push(PrefillItem { id, tokens });
        }
        let ids = |b: Vec<PrefillItem>| b.into_iter().map(|i| i.id).collect::<Vec<_>>();
        assert_eq!(ids(q.next_batch()), vec![0, 1]);
        assert_eq!(ids(q.next_batch()), vec![2]);
        assert_eq!(ids(q.next_batch()), vec![3]); // over-budget prompt runs alone
        assert_eq!(ids(q.next_batch()), vec![4]);
        assert!(q.next_batch().is_empty());
        assert_eq!(q.queued_tokens(), 0);
    }

    #[test]
    fn a_removed_request_leaves_with_its_tokens() {
        let mut q = PrefillQueue::chunked(1000, 8);
        for (id, tokens) in [(0, 400), (1, 2500), (2, 10)] {
            q.push(PrefillItem { id, tokens });
        }
        q.next_batch(); // 0 whole, 600 of 1
        assert_eq!(q.remove(1), Some(1900));
        assert_eq!(q.remove(1), None);
        assert_eq!(q.queued_tokens(), 10);
        assert_eq!(q.next_batch(), vec![PrefillItem { id: 2, tokens: 10 }]);
    }

    #[test]
    fn a_chunked_queue_fills_its_budget_and_keeps_the_rest_first() {
        let mut q = PrefillQueue::chunked(1000, 8);
        for (id, tokens) in [(0, 400), (1, 2500), (2, 10)] {
            q.push(PrefillItem { id, tokens });
        }
        let b = q.next_batch();
        assert_eq!(
            b,
            vec![
                PrefillItem { id: 0, tokens: 400 },
                PrefillItem { id: 1, tokens: 600 }
            ]
        );
        assert!(q.holds_rest_of(1));
        assert_eq!(
            q.next_batch(),
            vec![PrefillItem {
                id: 1,
                tokens: 1000
            }]
        );
        assert_eq!(
            q.next_batch(),
            vec![
                PrefillItem { id: 1, tokens: 900 },
                PrefillItem { id: 2, tokens: 10 }
            ]
        );
        assert!(!q.holds_rest_of(2) && q.is_empty());
        assert_eq!(q.queued_tokens(), 0);
    }
}
