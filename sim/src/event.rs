//! The event queue: events leave by `(time, priority, sequence)`, so ties are
//! FIFO and deterministic.

use easerve_workload::report::{from_total_order_key, total_order_key};
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
    /// that ends now has already re-polled its batcher without it). The EPD
    /// engine keeps its arrivals outside the queue in this same order (the
    /// aggregated baseline queues them); the controller's timeout, also kept
    /// outside, goes after every same-instant event, so same-instant arrivals
    /// are queued.
    Arrival = 2,
}

/// An event with its order packed into one integer: the time's bits mapped to
/// an unsigned integer in `f64::total_cmp`'s order (high 64 bits), then the
/// priority (2 bits) and the sequence number (62 bits).
struct Entry<E> {
    key: u128,
    event: E,
}

impl<E> Entry<E> {
    fn key(time: f64, priority: Priority, seq: u64) -> u128 {
        let ordered = total_order_key(time);
        (u128::from(ordered) << 64) | (u128::from(priority as u8) << 62) | u128::from(seq)
    }

    fn time(&self) -> f64 {
        from_total_order_key((self.key >> 64) as u64)
    }
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
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
        other.key.cmp(&self.key)
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
        debug_assert!(self.seq < 1 << 62, "sequence numbers fit in 62 bits");
        self.heap.push(Entry {
            key: Entry::<E>::key(time, priority, self.seq),
            event,
        });
    }

    /// Time of the earliest event, if any.
    pub(crate) fn peek_time(&self) -> Option<f64> {
        self.heap.peek().map(Entry::time)
    }

    pub(crate) fn pop(&mut self) -> Option<(f64, E)> {
        self.heap.pop().map(|e| (e.time(), e.event))
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

    #[test]
    fn times_come_back_exactly_in_total_order() {
        let times = [-1.5, -0.0, 0.0, 1e-300, 0.25, 3.0, 1e300, f64::INFINITY];
        let mut q = EventQueue::new();
        for &t in times.iter().rev() {
            q.push(t, Priority::Completion, ());
        }
        let back: Vec<u64> = std::iter::from_fn(|| q.pop().map(|e| e.0.to_bits())).collect();
        let want: Vec<u64> = times.iter().map(|t| t.to_bits()).collect();
        assert_eq!(back, want);
    }
}
