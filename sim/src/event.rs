//! The event queue: events leave by `(time, priority, sequence)`, so ties are
//! FIFO and deterministic.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Tie-break order of events at the same instant (lower first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Priority {
    /// A pass, batch or step ends: free the resource before new work is considered.
    Completion = 0,
    /// Data (embeddings, KV cache) lands: it can join the batch about to start.
    Transfer = 1,
    /// A request arrives, after same-instant completions and transfers (a pass
    /// that ends now has already re-polled its batcher without it). The
    /// controller's timeout, which the engine keeps outside this queue, goes
    /// after every same-instant event, so same-instant arrivals are queued.
    Arrival = 2,
}

struct Entry<E> {
    time: f64,
    priority: Priority,
    seq: u64,
    event: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    /// Reversed: `BinaryHeap` is a max-heap and we pop the earliest.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .time
            .total_cmp(&self.time)
            .then(other.priority.cmp(&self.priority))
            .then(other.seq.cmp(&self.seq))
    }
}

/// A min-queue of events.
pub(crate) struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    seq: u64,
}

impl<E> EventQueue<E> {
    pub(crate) fn new() -> Self {
        EventQueue {
            heap: BinaryHeap::new(),
            seq: 0,
        }
    }

    pub(crate) fn push(&mut self, time: f64, priority: Priority, event: E) {
        self.seq += 1;
        self.heap.push(Entry {
            time,
            priority,
            seq: self.seq,
            event,
        });
    }

    /// Time of the earliest event, if any.
    pub(crate) fn peek_time(&self) -> Option<f64> {
        self.heap.peek().map(|e| e.time)
    }

    pub(crate) fn pop(&mut self) -> Option<(f64, E)> {
        self.heap.pop().map(|e| (e.time, e.event))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_then_priority_then_fifo() {
        let mut q = EventQueue::new();
        q.push(2.0, Priority::Arrival, "late");
        q.push(1.0, Priority::Transfer, "landed");
        q.push(1.0, Priority::Arrival, "a1");
        q.push(1.0, Priority::Arrival, "a2");
        q.push(1.0, Priority::Completion, "done");
        let order: Vec<&str> = std::iter::from_fn(|| q.pop().map(|e| e.1)).collect();
        assert_eq!(order, ["done", "landed", "a1", "a2", "late"]);
    }
}
