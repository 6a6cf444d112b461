//! The event queue: events leave by `(time, priority, sequence)`, so ties are
//! FIFO and deterministic.

use easerve_workload::report::{from_total_order_key, total_order_key};

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

/// Bits of an event's key below the priority: the sequence number above,
/// the event's slot in the queue's store below.
const SEQ_BITS: u32 = 38;
const SLOT_BITS: u32 = 24;

/// An event's order and place packed into one integer: the time's bits mapped
/// to an unsigned integer in `f64::total_cmp`'s order (high 64 bits), then
/// the priority (2 bits), the sequence number (38 bits) and the slot of the
/// store that holds the event (24 bits). Keys are unique (the sequence
/// number), so the slot never decides an order; the heap moves these 16
/// bytes, not the events.
fn key(time: f64, priority: Priority, seq: u64, slot: u32) -> u128 {
    let ordered = total_order_key(time);
    (u128::from(ordered) << 64)
        | (u128::from(priority as u8) << (SEQ_BITS + SLOT_BITS))
        | (u128::from(seq) << SLOT_BITS)
        | u128::from(slot)
}

fn time_of(key: u128) -> f64 {
    from_total_order_key((key >> 64) as u64)
}

fn slot_of(key: u128) -> usize {
    (key as u32 & ((1 << SLOT_BITS) - 1)) as usize
}

/// Events in flight up to which the queue stays a sorted vector.
///
/// The EPD engine keeps few events in flight (the image scenario: 5 on
/// average, 23 at most), where a sorted vector pops in O(1) and inserts by a
/// short shift, cheaper than a heap's sift; a queue that grows past this
/// becomes a four-ary heap for good. Either way events leave in key order, so
/// the choice never changes a result.
const SORTED_MAX: usize = 64;

/// A min-queue of events: their keys in a vector sorted latest first while
/// small, a four-ary heap beyond [`SORTED_MAX`] events; the events themselves
/// in a store of slots, reused as events leave.
pub(crate) struct EventQueue<E> {
    keys: Keys,
    events: Vec<Option<E>>,
    free: Vec<u32>,
    seq: u64,
}

enum Keys {
    /// Sorted, latest first: the earliest is last.
    Sorted(Vec<u128>),
    Heap(QuadHeap),
}

/// A min-heap of unique `u128` keys with four children per node: node `i`'s
/// children are `4i + 1 ..= 4i + 4`.
///
/// Against a binary heap, a pop goes down half as many levels, each level's
/// four children lie side by side (64 bytes, over one or two cache lines),
/// and the least of them is chosen by data-dependent moves rather than
/// branches (which child wins is a coin toss the branch predictor cannot
/// learn). Past the `len` keys the vector holds at least four [`PAST`], so
/// every node's four children can be read and compared without asking how
/// many there are. Keys are unique, so the order of pops is the keys' order
/// whatever the heap's shape.
struct QuadHeap {
    keys: Vec<u128>,
    len: usize,
}

/// The filler past a [`QuadHeap`]'s keys: later than any key, as a key's
/// two priority bits are never both set (checked below).
const PAST: u128 = u128::MAX;
const _: () = assert!((Priority::Transfer as u8) < 3 && (Priority::Completion as u8) < 3);

impl QuadHeap {
    fn from_vec(keys: Vec<u128>) -> QuadHeap {
        let mut heap = QuadHeap {
            keys: vec![PAST; 4 * SORTED_MAX],
            len: 0,
        };
        for k in keys {
            heap.push(k);
        }
        heap
    }

    fn peek(&self) -> Option<u128> {
        (self.len > 0).then(|| self.keys[0])
    }

    fn push(&mut self, key: u128) {
        debug_assert!(key < PAST);
        let mut i = self.len;
        self.len += 1;
        if self.keys.len() < self.len + 4 {
            self.keys.resize(2 * self.keys.len(), PAST);
        }
        while i > 0 {
            let parent = (i - 1) / 4;
            let p = self.keys[parent];
            if p < key {
                break;
            }
            self.keys[i] = p;
            i = parent;
        }
        self.keys[i] = key;
    }

    fn pop(&mut self) -> Option<u128> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        let (n, v) = (self.len, &mut self.keys[..]);
        let top = v[0];
        let last = std::mem::replace(&mut v[n], PAST);
        if n == 0 {
            return Some(last);
        }
        // the hole at the root goes down to where `last` belongs; children
        // at or past `n` are `PAST` and never win over `last`
        let mut i = 0;
        loop {
            let c = 4 * i + 1;
            if c >= n {
                break;
            }
            // the least of the four by arithmetic on the comparisons' bits
            let a = c + usize::from(v[c + 1] < v[c]);
            let b = c + 2 + usize::from(v[c + 3] < v[c + 2]);
            let m = a ^ ((a ^ b) & usize::from(v[b] < v[a]).wrapping_neg());
            if last < v[m] {
                break;
            }
            v[i] = v[m];
            i = m;
        }
        v[i] = last;
        Some(top)
    }
}

impl<E> EventQueue<E> {
    pub(crate) fn new() -> Self {
        EventQueue {
            keys: Keys::Sorted(Vec::with_capacity(SORTED_MAX)),
            events: Vec::new(),
            free: Vec::new(),
            seq: 0,
        }
    }

    /// Add `event`, due at `time` (seconds): it leaves after every event due
    /// earlier, and after those due at the same time with a lower
    /// [`Priority`] or pushed before it with the same one.
    ///
    /// # Panics
    /// On the 2^38-th push of a run (the sequence number would reach the
    /// priority's bits), and on a push with 2^24 events in flight already
    /// (the slot would reach the sequence number's bits).
    pub(crate) fn push(&mut self, time: f64, priority: Priority, event: E) {
        self.seq += 1;
        assert!(
            self.seq < 1 << SEQ_BITS,
            "2^38 events pushed in one run: more than the key's SEQ_BITS hold"
        );
        let slot = match self.free.pop() {
            Some(s) => {
                self.events[s as usize] = Some(event);
                s
            }
            None => {
                let s = self.events.len() as u32;
                assert!(
                    s < 1 << SLOT_BITS,
                    "more than 2^24 events in flight at once (the key's SLOT_BITS)"
                );
                self.events.push(Some(event));
                s
            }
        };
        let k = key(time, priority, self.seq, slot);
        match &mut self.keys {
            Keys::Sorted(v) if v.len() < SORTED_MAX => {
                // keys are unique: the first key not later than the new one
                // is where it goes
                let at = v.partition_point(|&e| e > k);
                v.insert(at, k);
            }
            Keys::Sorted(v) => {
                let mut heap = QuadHeap::from_vec(std::mem::take(v));
                heap.push(k);
                self.keys = Keys::Heap(heap);
            }
            Keys::Heap(h) => h.push(k),
        }
    }

    fn first(&self) -> Option<u128> {
        match &self.keys {
            Keys::Sorted(v) => v.last().copied(),
            Keys::Heap(h) => h.peek(),
        }
    }

    /// Time of the earliest event, if any.
    pub(crate) fn peek_time(&self) -> Option<f64> {
        self.first().map(time_of)
    }

    /// The earliest event, if it is due at or before `limit` (seconds).
    /// Marked for inlining into the driver's loop, which calls it once per
    /// event, as is [`EventQueue::pop`]: the release build then inlines both
    /// (`valgrind --tool=cachegrind`, 100,000 requests of
    /// `image-reuse.toml`: 35 M instructions more with `pop` called).
    #[inline]
    pub(crate) fn pop_until(&mut self, limit: f64) -> Option<(f64, E)> {
        if time_of(self.first()?) <= limit {
            self.pop()
        } else {
            None
        }
    }

    #[inline]
    pub(crate) fn pop(&mut self) -> Option<(f64, E)> {
        let k = match &mut self.keys {
            Keys::Sorted(v) => v.pop(),
            Keys::Heap(h) => h.pop(),
        }?;
        let slot = slot_of(k);
        self.free.push(slot as u32);
        let event = self.events[slot]
            .take()
            .expect("a key's slot holds its event");
        Some((time_of(k), event))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

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
                reference.push(Reverse((total_order_key(t), p as u8, seq)));
            } else {
                let want = reference
                    .pop()
                    .map(|Reverse((k, _, seq))| (from_total_order_key(k), seq));
                let got = q.pop();
                assert_eq!(got, want, "round {round}");
                popped.extend(got);
            }
            assert_eq!(
                q.peek_time(),
                reference.peek().map(|r| from_total_order_key(r.0 .0)),
                "round {round}"
            );
        }
        assert!(matches!(q.keys, Keys::Heap(_)), "the queue became a heap");
        assert!(popped.len() > 500);
        // drained to empty in order, then nothing; then used again
        while let Some(Reverse((k, _, seq))) = reference.pop() {
            assert_eq!(q.pop(), Some((from_total_order_key(k), seq)));
        }
        assert_eq!((q.pop(), q.peek_time()), (None, None));
        q.push(1.0, Priority::Completion, 7);
        q.push(0.5, Priority::Transfer, 8);
        assert_eq!(q.pop(), Some((0.5, 8)));
        assert_eq!(q.pop(), Some((1.0, 7)));
        assert_eq!(q.pop(), None);
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
