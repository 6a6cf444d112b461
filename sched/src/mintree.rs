//! A tournament tree over one `f64` key per worker: the least key and the
//! first key at or below a bound in `O(log n)`, a key changed in `O(log n)`.
//!
//! The controller asks "which worker has the least outstanding work" at every
//! placement and "which encode worker's batcher wakes first" at every instant;
//! a scan over the workers made both grow with the cluster (at 1,024 GPUs,
//! 256 encode workers, they were a quarter of a simulated run). Ties go to
//! the lowest index, as the scans they replace did, so every decision is the
//! same.

/// Keys `0..n`, each `f64` (`f64::INFINITY` for "none"), and for every
/// subtree its least key and that key's index (the leftmost on ties).
#[derive(Clone, Debug)]
pub(crate) struct MinTree {
    /// Leaves start at `width`; node `k`'s children are `2k` and `2k + 1`.
    /// Each holds its subtree's winner, `(key, index)`; a leaf past `n`
    /// holds `(∞, n)`, which never wins (ties go left).
    nodes: Vec<(f64, u32)>,
    n: usize,
    width: usize,
}

impl MinTree {
    /// `n` keys, all `f64::INFINITY`.
    pub(crate) fn new(n: usize) -> MinTree {
        let width = n.next_power_of_two().max(1);
        let mut nodes = vec![(f64::INFINITY, n as u32); 2 * width];
        for (i, node) in nodes[width..width + n].iter_mut().enumerate() {
            node.1 = i as u32;
        }
        for k in (1..width).rev() {
            nodes[k] = nodes[2 * k];
        }
        MinTree { nodes, n, width }
    }

    /// The number of keys.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.n
    }

    /// Key `i`.
    #[cfg(test)]
    pub(crate) fn get(&self, i: usize) -> f64 {
        self.nodes[self.width + i].0
    }

    /// The keys, by index.
    #[cfg(test)]
    pub(crate) fn keys(&self) -> Vec<f64> {
        (0..self.n).map(|i| self.get(i)).collect()
    }

    /// Set key `i` to `v`.
    ///
    /// A key set to the value it holds (the same bits) returns at once: every
    /// inner node is the winner of its leaves (`new` and `set` are the only
    /// writers), so no winner can change; 279,146 of 479,402 updates of the
    /// encode workers' tree in 100,000 requests of `scenarios/dc-1024.toml`
    /// were such (a wake-up cleared twice).
    ///
    /// Otherwise every level up to the root is replayed, with no stop where
    /// a node's winner came out unchanged: under `valgrind --tool=cachegrind
    /// --branch-sim=yes` that test was mispredicted 957,000 times in 100,000
    /// requests of `scenarios/dc-1024.toml` (9.5 % of the run's mispredicted
    /// branches; its trees are over 256 encode and 96 prefill and decode
    /// workers), and `cargo bench --bench sim -- dc-1024` took 203–211 ms
    /// without it against 214–221 ms with it (docs/datacenter.md).
    pub(crate) fn set(&mut self, i: usize, v: f64) {
        let mut k = self.width + i;
        if self.nodes[k].0.to_bits() == v.to_bits() {
            // the same key: every winner stays
            return;
        }
        self.nodes[k].0 = v;
        while k > 1 {
            k /= 2;
            let (l, r) = (self.nodes[2 * k], self.nodes[2 * k + 1]);
            // the right child wins only when strictly less: ties go left
            self.nodes[k] = if r.0 < l.0 { r } else { l };
        }
    }

    /// The least key and its index (the lowest index on ties); `None` when
    /// there are no keys.
    pub(crate) fn min(&self) -> Option<(usize, f64)> {
        let (key, i) = self.nodes[1];
        (self.n > 0).then_some((i as usize, key))
    }

    /// The lowest index `i ≥ from` whose key is `≤ bound`.
    pub(crate) fn first_at_most(&self, from: usize, bound: f64) -> Option<usize> {
        if from >= self.n {
            return None;
        }
        self.first_in(1, 0, self.width, from, bound)
    }

    /// [`MinTree::first_at_most`] within node `k`, which covers `lo..hi`.
    fn first_in(&self, k: usize, lo: usize, hi: usize, from: usize, bound: f64) -> Option<usize> {
        if hi <= from || lo >= self.n || self.nodes[k].0 > bound {
            return None;
        }
        if k >= self.width {
            return Some(lo);
        }
        let mid = (lo + hi) / 2;
        self.first_in(2 * k, lo, mid, from, bound)
            .or_else(|| self.first_in(2 * k + 1, mid, hi, from, bound))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scan the tree replaces: the first least key.
    fn scan_min(keys: &[f64]) -> Option<(usize, f64)> {
        let mut best: Option<usize> = None;
        for (i, k) in keys.iter().enumerate() {
            if best.is_none_or(|b| *k < keys[b]) {
                best = Some(i);
            }
        }
        best.map(|b| (b, keys[b]))
    }

    #[test]
    fn agrees_with_a_scan_under_random_updates() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for n in [1usize, 2, 3, 7, 8, 9, 100, 256] {
            let mut t = MinTree::new(n);
            assert_eq!(t.len(), n);
            for _ in 0..2_000 {
                let i = (next() % n as u64) as usize;
                // few distinct values, so ties are common
                let v = match next() % 5 {
                    0 => f64::INFINITY,
                    r => (r + next() % 3) as f64,
                };
                t.set(i, v);
                assert_eq!(t.min(), scan_min(&t.keys()), "n = {n}");
                let from = (next() % (n as u64 + 1)) as usize;
                let bound = (next() % 6) as f64;
                let want = (from..n).find(|&j| t.get(j) <= bound);
                assert_eq!(t.first_at_most(from, bound), want, "n = {n}");
            }
        }
    }

    #[test]
    fn empty_and_fresh_trees() {
        assert_eq!(MinTree::new(0).min(), None);
        assert_eq!(MinTree::new(0).first_at_most(0, 1.0), None);
        let t = MinTree::new(5);
        assert_eq!(t.min(), Some((0, f64::INFINITY)));
        assert_eq!(t.first_at_most(0, 1e300), None);
    }
}
