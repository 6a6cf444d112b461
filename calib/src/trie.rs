//! Interpolation over measured points that need not form a full grid.
//!
//! Measured kernel tables (aiconfigurator's, for one) cover a Cartesian grid only in
//! part: attention is measured at some `(heads, kv_heads)` pairs and not others, a
//! few GEMM shapes are missing. A [`Trie`] keeps the points as nested sorted axes —
//! the first axis at the root, each child holding the points with that first
//! coordinate — and a lookup brackets the query on each axis *among the values that
//! exist under the current node*, so a hole never makes a lookup fail:
//!
//! * at each level the query is bracketed by two neighbouring keys `a ≤ q ≤ b`; the
//!   two sub-lookups blend with weight `w = ln(q/a)/ln(b/a)` on `ln(value)`
//!   (log-log interpolation: exact for power laws, e.g. `t ∝ m` or `t ∝ isl²`);
//!   values ≤ 0 blend linearly instead;
//! * outside an axis' range the edge cell is extended (a power law through its two
//!   points, slope held ≥ 0 so a table that grows keeps growing) and the lookup says
//!   it extrapolated; an axis with one key is held;
//! * at a measured point the lookup returns the measurement (after the envelope).
//!
//! **Dense, monotone grid** ([`Trie::densify`]): measured latencies are noisy, and a
//! cost that falls when work grows would let a scheduler gain by adding work. The
//! trie is sampled on the full grid of every key seen on each axis and a running
//! maximum makes it non-decreasing along every axis; multi-linear interpolation of
//! such a grid ([`crate::interp::Grid`]) is non-decreasing along every axis too.

use crate::interp::Grid;

/// A node: sorted keys of one axis and, per key, the sub-table or the value.
#[derive(Clone, Debug, PartialEq)]
enum Node {
    Branch { keys: Vec<f64>, kids: Vec<Node> },
    Leaf { keys: Vec<f64>, vals: Vec<f64> },
}

/// Measured points over `axes` coordinates (each > 0), interpolated on log axes.
#[derive(Clone, Debug, PartialEq)]
pub struct Trie {
    root: Node,
    axes: usize,
    points: usize,
}

/// How a lookup treats a query outside an axis' keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Edge {
    /// Power-law extension of the edge cell (slope ≥ 0).
    Extend,
    /// Hold the edge value.
    Hold,
}

impl Trie {
    /// A trie over `points` (`(coordinates, value)`, every coordinate finite and > 0,
    /// all of the same length ≥ 1). Duplicate coordinates keep their mean value.
    /// `None` when there is no point or a coordinate is invalid.
    pub fn new(mut points: Vec<(Vec<f64>, f64)>) -> Option<Trie> {
        let axes = points.first()?.0.len();
        if axes == 0
            || points.iter().any(|(k, v)| {
                k.len() != axes || !v.is_finite() || k.iter().any(|x| !(x.is_finite() && *x > 0.0))
            })
        {
            return None;
        }
        points.sort_by(|a, b| {
            a.0.iter()
                .zip(&b.0)
                .map(|(x, y)| x.total_cmp(y))
                .find(|o| o.is_ne())
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        // mean of duplicates
        let mut merged: Vec<(Vec<f64>, f64, u32)> = Vec::with_capacity(points.len());
        for (k, v) in points {
            match merged.last_mut() {
                Some(last) if last.0 == k => {
                    last.1 += v;
                    last.2 += 1;
                }
                _ => merged.push((k, v, 1)),
            }
        }
        let rows: Vec<(Vec<f64>, f64)> = merged
            .into_iter()
            .map(|(k, v, n)| (k, v / f64::from(n)))
            .collect();
        let points = rows.len();
        Some(Trie {
            root: build(&rows, 0),
            axes,
            points,
        })
    }

    /// Coordinates per point.
    pub fn axes(&self) -> usize {
        self.axes
    }

    /// Distinct measured points.
    pub fn len(&self) -> usize {
        self.points
    }

    /// Whether the trie has no point (never: [`Trie::new`] refuses that).
    pub fn is_empty(&self) -> bool {
        self.points == 0
    }

    /// The interpolated value at `point` (one coordinate per axis; coordinates ≤ 0
    /// are taken as the axis' smallest key) and whether any axis was outside the
    /// measured range.
    pub fn lookup(&self, point: &[f64]) -> (f64, bool) {
        debug_assert_eq!(point.len(), self.axes);
        let mut ext = false;
        let v = eval(&self.root, point, Edge::Extend, &mut ext);
        (v, ext)
    }

    /// The full grid over every key any point has on each axis, each grid point
    /// valued by the trie's lookup (holes bridged by interpolation, held at the
    /// edges), then made non-decreasing along every axis by a running maximum (axis
    /// by axis; a running max along one axis keeps the others non-decreasing).
    /// Returns the grid and how many grid points the envelope raised.
    pub fn densify(&self) -> (Grid, usize) {
        let mut axes: Vec<Vec<f64>> = vec![Vec::new(); self.axes];
        collect_keys(&self.root, 0, &mut axes);
        for a in &mut axes {
            a.sort_by(f64::total_cmp);
            a.dedup();
        }
        let mut vals = Vec::with_capacity(axes.iter().map(Vec::len).product());
        for_each_point(&axes, |p| {
            let mut ext = false;
            vals.push(eval(&self.root, p, Edge::Hold, &mut ext));
        });
        let mut raised = 0;
        let lens: Vec<usize> = axes.iter().map(Vec::len).collect();
        for d in 0..lens.len() {
            let stride: usize = lens[d + 1..].iter().product();
            let outer: usize = lens[..d].iter().product();
            for o in 0..outer {
                for inner in 0..stride {
                    let base = o * lens[d] * stride + inner;
                    for i in 1..lens[d] {
                        let (prev, cur) = (base + (i - 1) * stride, base + i * stride);
                        if vals[cur] < vals[prev] {
                            vals[cur] = vals[prev];
                            raised += 1;
                        }
                    }
                }
            }
        }
        (Grid::new(axes, vec![vals]), raised)
    }
}

fn collect_keys(node: &Node, d: usize, axes: &mut [Vec<f64>]) {
    match node {
        Node::Leaf { keys, .. } => axes[d].extend_from_slice(keys),
        Node::Branch { keys, kids } => {
            axes[d].extend_from_slice(keys);
            for k in kids {
                collect_keys(k, d + 1, axes);
            }
        }
    }
}

fn build(rows: &[(Vec<f64>, f64)], d: usize) -> Node {
    let last = rows[0].0.len() - 1;
    let mut keys = Vec::new();
    if d == last {
        let vals = rows
            .iter()
            .map(|(k, v)| {
                keys.push(k[d]);
                *v
            })
            .collect();
        return Node::Leaf { keys, vals };
    }
    let mut kids = Vec::new();
    let mut start = 0;
    while start < rows.len() {
        let key = rows[start].0[d];
        let end = start + rows[start..].iter().take_while(|r| r.0[d] == key).count();
        keys.push(key);
        kids.push(build(&rows[start..end], d + 1));
        start = end;
    }
    Node::Branch { keys, kids }
}

/// `(lower index, upper index, weight of upper)` of `q` among `keys`, and whether
/// `q` is outside them.
fn bracket(keys: &[f64], q: f64, edge: Edge) -> (usize, usize, f64, bool) {
    let n = keys.len();
    let q = if q > 0.0 && q.is_finite() { q } else { keys[0] };
    if n == 1 {
        return (0, 0, 0.0, q != keys[0]);
    }
    let outside = q < keys[0] || q > keys[n - 1];
    if outside && edge == Edge::Hold {
        let i = if q < keys[0] { 0 } else { n - 1 };
        return (i, i, 0.0, true);
    }
    // first index with key > q, kept inside [1, n-1]
    let hi = keys.partition_point(|&k| k <= q).clamp(1, n - 1);
    let lo = hi - 1;
    let w = (q / keys[lo]).ln() / (keys[hi] / keys[lo]).ln();
    (lo, hi, w, outside)
}

fn blend(a: f64, b: f64, w: f64, extrapolating: bool) -> f64 {
    if w == 0.0 || a == b {
        return a;
    }
    if w == 1.0 {
        return b;
    }
    if a > 0.0 && b > 0.0 {
        // slope held ≥ 0 outside the table
        let lb = if extrapolating { b.max(a).ln() } else { b.ln() };
        let la = if extrapolating { a.min(b).ln() } else { a.ln() };
        ((1.0 - w) * la + w * lb).exp()
    } else {
        ((1.0 - w) * a + w * b).max(0.0)
    }
}

fn eval(node: &Node, point: &[f64], edge: Edge, ext: &mut bool) -> f64 {
    match node {
        Node::Leaf { keys, vals } => {
            let (lo, hi, w, out) = bracket(keys, point[0], edge);
            *ext |= out;
            blend(vals[lo], vals[hi], w, out)
        }
        Node::Branch { keys, kids } => {
            let (lo, hi, w, out) = bracket(keys, point[0], edge);
            *ext |= out;
            let a = eval(&kids[lo], &point[1..], edge, ext);
            if lo == hi || w == 0.0 {
                return a;
            }
            let b = eval(&kids[hi], &point[1..], edge, ext);
            blend(a, b, w, out)
        }
    }
}

/// Visit every point of the Cartesian product of `axes` (row-major, last axis
/// fastest).
fn for_each_point(axes: &[Vec<f64>], mut f: impl FnMut(&[f64])) {
    let n: usize = axes.iter().map(Vec::len).product();
    let mut idx = vec![0usize; axes.len()];
    let mut p: Vec<f64> = axes.iter().map(|a| a[0]).collect();
    for _ in 0..n {
        f(&p);
        for d in (0..axes.len()).rev() {
            idx[d] += 1;
            if idx[d] < axes[d].len() {
                p[d] = axes[d][idx[d]];
                break;
            }
            idx[d] = 0;
            p[d] = axes[d][0];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn grid(f: impl Fn(f64, f64) -> f64) -> Trie {
        let mut pts = Vec::new();
        for a in [1.0, 2.0, 4.0, 8.0] {
            for b in [16.0, 64.0, 256.0] {
                pts.push((vec![a, b], f(a, b)));
            }
        }
        Trie::new(pts).unwrap()
    }

    #[test]
    fn exact_at_points_and_power_laws_between() {
        let t = grid(|a, b| 3.0 * a * b * b);
        assert_eq!(t.len(), 12);
        assert_eq!(t.lookup(&[2.0, 64.0]), (3.0 * 2.0 * 64.0 * 64.0, false));
        let (v, ext) = t.lookup(&[3.0, 100.0]);
        assert!((v - 3.0 * 3.0 * 1e4).abs() < 1e-6 * v && !ext);
        // extension of the edge cell: the power law continues
        let (v, ext) = t.lookup(&[16.0, 512.0]);
        assert!((v - 3.0 * 16.0 * 512.0 * 512.0).abs() < 1e-6 * v && ext);
    }

    #[test]
    fn holes_are_bridged_by_what_exists() {
        // point (2, 64) missing: a lookup there blends its neighbours on axis 0
        let mut pts = Vec::new();
        for a in [1.0, 2.0, 4.0] {
            for b in [16.0, 64.0, 256.0] {
                if !(a == 2.0 && b == 64.0) {
                    pts.push((vec![a, b], a * b));
                }
            }
        }
        let t = Trie::new(pts).unwrap();
        let (v, ext) = t.lookup(&[2.0, 64.0]);
        assert!((v - 128.0).abs() < 1e-9, "{v}");
        assert!(!ext);
    }

    #[test]
    fn densify_removes_dips_and_keeps_rising_data() {
        let (_, raised) = grid(|a, b| a * b).densify();
        assert_eq!(raised, 0);
        let pts: Vec<(Vec<f64>, f64)> = vec![
            (vec![1.0, 1.0], 5.0),
            (vec![1.0, 2.0], 4.0), // dip along axis 1
            (vec![2.0, 1.0], 3.0), // dip along axis 0
            (vec![2.0, 2.0], 6.0),
        ];
        let (g, raised) = Trie::new(pts).unwrap().densify();
        assert_eq!(raised, 2);
        assert_eq!(g.lookup(&[1.0, 2.0]).values[0], 5.0);
        assert_eq!(g.lookup(&[2.0, 1.0]).values[0], 5.0);
        assert_eq!(g.lookup(&[2.0, 2.0]).values[0], 6.0);
    }

    #[test]
    fn refuses_bad_points() {
        assert!(Trie::new(vec![]).is_none());
        assert!(Trie::new(vec![(vec![0.0], 1.0)]).is_none());
        assert!(Trie::new(vec![(vec![1.0], f64::NAN)]).is_none());
        assert!(Trie::new(vec![(vec![1.0], 1.0), (vec![1.0, 2.0], 1.0)]).is_none());
    }

    proptest! {
        /// On the dense grid, lookups are non-decreasing along each axis, for noisy
        /// data with holes.
        #[test]
        fn monotone_between_points(
            noise in proptest::collection::vec(0.5f64..1.5, 27),
            holes in proptest::collection::vec(any::<bool>(), 27),
            q in (1.0f64..9.0, 1.0f64..9.0, 1.0f64..9.0),
            step in 1.0f64..3.0,
            axis in 0usize..3,
        ) {
            let keys = [1.0, 3.0, 9.0];
            let mut pts = Vec::new();
            let mut i = 0;
            for a in keys { for b in keys { for c in keys {
                if !holes[i] || i == 0 {
                    pts.push((vec![a, b, c], a * b * c * noise[i]));
                }
                i += 1;
            }}}
            let (g, _) = Trie::new(pts).unwrap().densify();
            // holes can remove a key from an axis altogether: the claim holds inside
            // the grid (outside, the edge cell is extended and the lookup says so)
            let inside = |d: usize, x: f64| {
                let a = &g.axes()[d];
                x.clamp(a[0], a[a.len() - 1])
            };
            let p = [inside(0, q.0), inside(1, q.1), inside(2, q.2)];
            let mut p2 = p;
            p2[axis] = inside(axis, p2[axis] * step);
            let v1 = g.lookup(&p).values[0];
            let v2 = g.lookup(&p2).values[0];
            prop_assert!(v2 >= v1 * (1.0 - 1e-12), "{v1} then {v2} at {p:?} -> {p2:?}");
        }
    }
}
