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
}
// Arrivals stay out of the queue and go after same-instant completions and
// transfers (a pass that ends now has already re-polled its batcher without
// them); the controller's timeout, also kept outside, goes after every
// same-instant event, so same-instant arrivals come first.

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

/// Events in flight up to which the queue stays a sorted vector.
///
/// The EPD engine keeps few events in flight (the image scenario: 5 on
/// average, 23 at most), where a sorted vector pops in O(1) and inserts by a
/// short shift, cheaper than a heap's sift; a queue that grows past this
/// becomes a binary heap for good. Either way events leave in key order, so
/// the choice never changes a result.
const SORTED_MAX: usize = 64;

/// A min-queue of events: a vector sorted latest first while small, a binary
/// heap beyond [`SORTED_MAX`] events.
pub(crate) struct EventQueue<E> {
    store: Store<E>,
    seq: u64,
}

enum Store<E> {
    /// Sorted by key, latest first: the earliest is last.
    Sorted(Vec<Entry<E>>),
    Heap(BinaryHeap<Entry<E>>),
}

impl<E> EventQueue<E> {
    pub(crate) fn new() -> Self {
        EventQueue {
            store: Store::Sorted(Vec::with_capacity(SORTED_MAX)),
            seq: 0,
        }
    }

    pub(crate) fn push(&mut self, time: f64, priority: Priority, event: E) {
        self.seq += 1;
        debug_assert!(self.seq < 1 << 62, "sequence numbers fit in 62 bits");
        let entry = Entry {
            key: Entry::<E>::key(time, priority, self.seq),
            event,
        };
        match &mut self.store {
            Store::Sorted(v) if v.len() < SORTED_MAX => {
                // keys are unique (the sequence number): the first entry not
                // later than the new one is where it goes
                let at = v.partition_point(|e| e.key > entry.key);
                v.insert(at, entry);
            }
            Store::Sorted(v) => {
                let mut heap = BinaryHeap::from(std::mem::take(v));
                heap.push(entry);
                self.store = Store::Heap(heap);
            }
            Store::Heap(h) => h.push(entry),
        }
    }

    /// Time of the earliest event, if any.
    pub(crate) fn peek_time(&self) -> Option<f64> {
        match &self.store {
            Store::Sorted(v) => v.last().map(Entry::time),
            Store::Heap(h) => h.peek().map(Entry::time),
        }
    }

    /// The earliest event, if it is due at or before `limit` (seconds).
    pub(crate) fn pop_until(&mut self, limit: f64) -> Option<(f64, E)> {
        let first = match &self.store {
            Store::Sorted(v) => v.last(),
            Store::Heap(h) => h.peek(),
        };
        if first.map(Entry::time)? <= limit {
            self.pop()
        } else {
            None
        }
    }

    pub(crate) fn pop(&mut self) -> Option<(f64, E)> {
        let e = match &mut self.store {
            Store::Sorted(v) => v.pop(),
            Store::Heap(h) => h.pop(),
        };
        e.map(|e| (e.time(), e.event))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_then_priority_then_fifo() {
        let mut q = EventQueue::new();
        q.push(2.0, Priority::Completion, "late");
        q.push(1.0, Priority::Transfer, "landed1");
        q.push(1.0, Priority::Completion, "done1");
        q.push(1.0, Priority::Transfer, "landed2");
        q.push(1.0, Priority::Completion, "done2");
        assert_eq!(q.pop_until(0.5), None, "nothing is due by 0.5");
        assert_eq!(q.pop_until(1.0), Some((1.0, "done1")));
        let order: Vec<&str> = std::iter::from_fn(|| q.pop().map(|e| e.1)).collect();
        assert_eq!(order, ["done2", "landed1", "landed2", "late"]);
    }

    /// Pushes and pops interleaved, past the size where the sorted vector
    /// becomes a heap and back down: the order is a reference heap's.
    #[test]
    fn sorted_and_heap_forms_pop_in_the_same_order() {
        let mut q = EventQueue::new();
        let mut reference = BinaryHeap::new();
        let (mut seq, mut state) = (0u64, 0x2545_f491_4f6c_dd1du64);
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut popped = Vec::new();
        for round in 0..2000 {
            // grow to about 3 × SORTED_MAX, then drain
            let push = if round < 1200 {
                next() % 3 != 0
            } else {
                next() % 3 == 0
            };
            if push {
                let t = (next() % 50) as f64 * 0.5;
                let p = [Priority::Completion, Priority::Transfer][(next() % 2) as usize];
                seq += 1;
                q.push(t, p, seq);
                reference.push(Entry {
                    key: Entry::<u64>::key(t, p, seq),
                    event: seq,
                });
            } else {
                let want = reference.pop().map(|e| (e.time(), e.event));
                let got = q.pop();
                assert_eq!(got, want, "round {round}");
                popped.extend(got);
            }
            assert_eq!(
                q.peek_time(),
                reference.peek().map(Entry::time),
                "round {round}"
            );
        }
        assert!(matches!(q.store, Store::Heap(_)), "the queue became a heap");
        assert!(popped.len() > 500);
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
