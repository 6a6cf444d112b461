//! Multi-linear interpolation over a full grid with log-spaced axes, and the
//! counters that record when a lookup had to extrapolate.
//!
//! A [`Grid`] holds `N` axes (each strictly increasing, all values > 0) and one or
//! more value columns given at every point of the Cartesian product of the axes.
//! A lookup finds, on each axis, the cell around the query in `ln(axis)` and blends
//! the `2^N` corner values with the usual multi-linear weights:
//!
//! * when every corner value is > 0 the blend is done on `ln(value)` (log-log
//!   interpolation: exact for power laws such as `t ∝ tokens` or `t ∝ 1/share`);
//! * otherwise (a column with zeros, e.g. an unknown `t_pre`) it is done on the
//!   values themselves, and the result is clamped at 0.
//!
//! Outside the table the edge cell is extended (a power-law extrapolation); an
//! axis with a single value is held constant. Either way the lookup reports which
//! axes it left the table on ([`Lookup::extrapolated`]), so the caller can count
//! and report it once per run ([`ExtrapolationCounter`]).

use std::sync::atomic::{AtomicU64, Ordering};

/// A full grid of value columns over log-spaced axes.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Grid {
    /// Axis values, each strictly increasing and > 0.
    axes: Vec<Vec<f64>>,
    /// `columns[c][flat index]`, row-major over the axes (last axis fastest).
    columns: Vec<Vec<f64>>,
    /// `ln` of every axis value (computed once: lookups are on the hot path).
    ln_axes: Vec<Vec<f64>>,
    /// `ln` of every value (`-inf` where the value is ≤ 0).
    ln_columns: Vec<Vec<f64>>,
    /// Flat-index stride of each axis.
    strides: Vec<usize>,
}

/// Most axes a grid may have (lookups keep their corners on the stack).
pub const MAX_AXES: usize = 8;

/// Where a query fell on one axis relative to the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Within `[first, last]` of the axis.
    Inside,
    /// Below the axis' first value.
    Below,
    /// Above the axis' last value.
    Above,
}

/// The result of one [`Grid::lookup`].
#[derive(Clone, Debug, PartialEq)]
pub struct Lookup {
    /// One interpolated value per column.
    pub values: Vec<f64>,
    /// Per axis: where the query fell.
    pub sides: Vec<Side>,
}

impl Lookup {
    /// Whether any axis was outside the table.
    pub fn extrapolated(&self) -> bool {
        self.sides.iter().any(|s| *s != Side::Inside)
    }
}

impl Grid {
    /// A grid with these axes and columns (row-major, last axis fastest).
    ///
    /// # Panics
    /// When there are more than [`MAX_AXES`] axes, an axis is empty, not strictly
    /// increasing or not > 0, or a column's
    /// length is not the product of the axis lengths. Callers validate user input
    /// first (see `profile/parse.rs`) and report errors there.
    pub fn new(axes: Vec<Vec<f64>>, columns: Vec<Vec<f64>>) -> Grid {
        let n: usize = axes.iter().map(Vec::len).product();
        assert!(axes.len() <= MAX_AXES, "more than {MAX_AXES} axes");
        for a in &axes {
            assert!(!a.is_empty(), "empty axis");
            assert!(a.iter().all(|x| *x > 0.0 && x.is_finite()), "axis ≤ 0");
            assert!(a.windows(2).all(|w| w[0] < w[1]), "axis not increasing");
        }
        for c in &columns {
            assert_eq!(c.len(), n, "column length");
        }
        let ln_axes = axes
            .iter()
            .map(|a| a.iter().map(|x| x.ln()).collect())
            .collect();
        let ln_columns = columns
            .iter()
            .map(|c| {
                c.iter()
                    .map(|v| if *v > 0.0 { v.ln() } else { f64::NEG_INFINITY })
                    .collect()
            })
            .collect();
        let mut strides = vec![1usize; axes.len()];
        for d in (0..axes.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * axes[d + 1].len();
        }
        Grid {
            axes,
            columns,
            ln_axes,
            ln_columns,
            strides,
        }
    }

    /// Whether the grid holds what [`Grid::new`] asserts, and its derived fields
    /// (logarithms, strides) have the shapes `new` gives them: a check for a grid
    /// that was deserialized rather than built (the startup cache,
    /// `grid_cache.rs`), so a damaged entry is rebuilt instead of panicking in a
    /// lookup.
    pub fn is_consistent(&self) -> bool {
        let n: usize = self.axes.iter().map(Vec::len).product();
        self.axes.len() <= MAX_AXES
            && self.axes.iter().all(|a| {
                !a.is_empty()
                    && a.iter().all(|x| *x > 0.0 && x.is_finite())
                    && a.windows(2).all(|w| w[0] < w[1])
            })
            && self.columns.iter().all(|c| c.len() == n)
            && self.ln_axes.len() == self.axes.len()
            && self
                .ln_axes
                .iter()
                .zip(&self.axes)
                .all(|(l, a)| l.len() == a.len())
            && self.ln_columns.len() == self.columns.len()
            && self.ln_columns.iter().all(|c| c.len() == n)
            && self.strides.len() == self.axes.len()
            && self
                .strides
                .iter()
                .enumerate()
                .all(|(d, &s)| s == self.axes[d + 1..].iter().map(Vec::len).product::<usize>())
    }

    /// The axes.
    pub fn axes(&self) -> &[Vec<f64>] {
        &self.axes
    }

    /// The value columns (row-major over the axes).
    pub fn columns(&self) -> &[Vec<f64>] {
        &self.columns
    }

    /// Interpolate every column at `point` (one coordinate per axis, each > 0;
    /// non-positive coordinates are treated as the axis' first value and reported
    /// as [`Side::Below`]).
    pub fn lookup(&self, point: &[f64]) -> Lookup {
        debug_assert_eq!(point.len(), self.axes.len());
        let mut cells = Vec::with_capacity(self.axes.len());
        let mut sides = Vec::with_capacity(self.axes.len());
        for (d, &q) in point.iter().enumerate() {
            let (lo, w, side) = self.locate(d, q);
            cells.push((lo, w));
            sides.push(side);
        }
        let values = (0..self.columns.len())
            .map(|c| self.blend(c, &cells))
            .collect();
        Lookup { values, sides }
    }

    /// Column `col` at `point` and whether any axis was outside the table: the
    /// same value as [`Grid::lookup`], without allocating (the hot path of
    /// measured-kernel pricing).
    pub fn lookup_one(&self, col: usize, point: &[f64]) -> (f64, bool) {
        debug_assert_eq!(point.len(), self.axes.len());
        let mut cells = [(0usize, 0.0f64); MAX_AXES];
        let mut outside = false;
        for (d, &q) in point.iter().enumerate() {
            let (lo, w, side) = self.locate(d, q);
            cells[d] = (lo, w);
            outside |= side != Side::Inside;
        }
        (self.blend(col, &cells[..point.len()]), outside)
    }

    /// Cell of `q` on axis `d` in log space: (lower index, weight of upper, side).
    /// The weight may be < 0 or > 1 outside the table (extension of the edge
    /// cell); an axis of one value gives weight 0.
    fn locate(&self, d: usize, q: f64) -> (usize, f64, Side) {
        let axis = &self.axes[d];
        let first = axis[0];
        let last = axis[axis.len() - 1];
        let side = if q.is_nan() {
            Side::Inside
        } else if q < first {
            // also q <= 0
            Side::Below
        } else if q > last {
            Side::Above
        } else {
            Side::Inside
        };
        if axis.len() == 1 {
            return (0, 0.0, side);
        }
        let q = if q > 0.0 { q } else { first };
        let lo = match axis.partition_point(|&a| a <= q) {
            0 => 0,
            i if i >= axis.len() => axis.len() - 2,
            i => i - 1,
        };
        let (a, b) = (self.ln_axes[d][lo], self.ln_axes[d][lo + 1]);
        (lo, (q.ln() - a) / (b - a), side)
    }

    /// Blend the `2^N` weighted corners of column `col` around `cells`:
    /// geometric when every weighted corner is > 0, else arithmetic clamped at 0;
    /// at a grid point, the corner itself (bit-exact).
    fn blend(&self, col: usize, cells: &[(usize, f64)]) -> f64 {
        let (values, lns) = (&self.columns[col], &self.ln_columns[col]);
        let n = cells.len();
        // per axis: flat offset and weight of the lower and the upper corner (an
        // axis of one value has no upper corner: weight 0)
        let mut off = [[0usize; 2]; MAX_AXES];
        let mut wt = [[0.0f64; 2]; MAX_AXES];
        for (d, &(lo, w)) in cells.iter().enumerate() {
            let single = self.axes[d].len() == 1;
            off[d] = [
                lo * self.strides[d],
                (lo + usize::from(!single)) * self.strides[d],
            ];
            wt[d] = [1.0 - w, if single { 0.0 } else { w }];
        }
        // tables of up to five axes (the common case) blend in small arrays
        if n <= 5 {
            Self::blend_corners::<32>(values, lns, &off[..n], &wt[..n])
        } else {
            Self::blend_corners::<{ 1 << MAX_AXES }>(values, lns, &off[..n], &wt[..n])
        }
    }

    /// [`Grid::blend`] over the `2^n` corners of `n = off.len()` axes
    /// (`2^n ≤ C`): each corner's flat offset and weight built axis by axis
    /// (corner `mask`'s weight is `1 · wt[0][b0] · wt[1][b1] · …`, multiplied
    /// in axis order as a per-corner loop over the axes would), then summed
    /// in corner order.
    fn blend_corners<const C: usize>(
        values: &[f64],
        lns: &[f64],
        off: &[[usize; 2]],
        wt: &[[f64; 2]],
    ) -> f64 {
        let n = off.len();
        let mut flats = [0usize; C];
        let mut weights = [0.0f64; C];
        weights[0] = 1.0;
        for d in 0..n {
            let half = 1usize << d;
            for m in 0..half {
                flats[m | half] = flats[m] + off[d][1];
                weights[m | half] = weights[m] * wt[d][1];
                flats[m] += off[d][0];
                weights[m] *= wt[d][0];
            }
        }
        let mut weighted = 0usize;
        let mut only = (0.0, 0.0);
        let mut all_positive = true;
        let (mut sum_ln, mut sum) = (0.0, 0.0);
        for (&flat, &weight) in flats.iter().zip(&weights).take(1 << n) {
            if weight != 0.0 {
                let v = values[flat];
                weighted += 1;
                only = (v, weight);
                all_positive &= v > 0.0;
                sum_ln += weight * lns[flat];
                sum += weight * v;
            }
        }
        Self::finish(weighted, only, all_positive, sum_ln, sum)
    }

    fn finish(weighted: usize, only: (f64, f64), all_positive: bool, sum_ln: f64, sum: f64) -> f64 {
        // outside the table weights can reach 1 with other corners still
        // weighted, so the corner is returned only when it is the sole one
        if weighted == 1 && only.1 == 1.0 {
            return only.0;
        }
        if all_positive {
            sum_ln.exp()
        } else {
            sum.max(0.0)
        }
    }
}

/// Lookups and extrapolations of one table, per axis and side; safe to share
/// between threads (a [`crate::StageCost`] is `Send + Sync`).
#[derive(Debug)]
pub struct ExtrapolationCounter {
    lookups: AtomicU64,
    extrapolated: AtomicU64,
    /// `[axis][0 = below, 1 = above]`
    outside: Vec<[AtomicU64; 2]>,
}

/// A snapshot of an [`ExtrapolationCounter`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExtrapolationCounts {
    /// Lookups made.
    pub lookups: u64,
    /// Lookups with at least one axis outside the table.
    pub extrapolated: u64,
    /// Per axis: lookups below the first value, above the last value.
    pub per_axis: Vec<(u64, u64)>,
}

impl ExtrapolationCounter {
    /// A counter for a table with `axes` axes, all zero.
    pub fn new(axes: usize) -> Self {
        ExtrapolationCounter {
            lookups: AtomicU64::new(0),
            extrapolated: AtomicU64::new(0),
            outside: (0..axes)
                .map(|_| [AtomicU64::new(0), AtomicU64::new(0)])
                .collect(),
        }
    }

    /// Count one lookup and where it fell on each axis.
    pub fn record(&self, sides: &[Side]) {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let mut any = false;
        for (c, s) in self.outside.iter().zip(sides) {
            let slot = match s {
                Side::Inside => continue,
                Side::Below => &c[0],
                Side::Above => &c[1],
            };
            slot.fetch_add(1, Ordering::Relaxed);
            any = true;
        }
        if any {
            self.extrapolated.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Read and reset the counts, so each run reports only its own lookups.
    pub fn take(&self) -> ExtrapolationCounts {
        ExtrapolationCounts {
            lookups: self.lookups.swap(0, Ordering::Relaxed),
            extrapolated: self.extrapolated.swap(0, Ordering::Relaxed),
            per_axis: self
                .outside
                .iter()
                .map(|c| {
                    (
                        c[0].swap(0, Ordering::Relaxed),
                        c[1].swap(0, Ordering::Relaxed),
                    )
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_at_grid_points_and_log_log_between() {
        // t = 2 * x * y: a power law, so log-log interpolation is exact everywhere
        let ax = vec![1.0, 2.0, 4.0, 8.0];
        let ay = vec![10.0, 100.0];
        let col: Vec<f64> = ax
            .iter()
            .flat_map(|x| ay.iter().map(move |y| 2.0 * x * y))
            .collect();
        let g = Grid::new(vec![ax, ay], vec![col]);
        let l = g.lookup(&[4.0, 100.0]);
        assert_eq!(l.values[0], 800.0);
        assert!(!l.extrapolated());
        let l = g.lookup(&[3.0, 31.0]);
        assert!((l.values[0] - 2.0 * 3.0 * 31.0).abs() < 1e-9, "{:?}", l);
        // beyond the table: extended, and reported per axis
        let l = g.lookup(&[16.0, 5.0]);
        assert!((l.values[0] - 160.0).abs() < 1e-9, "{:?}", l);
        assert_eq!(l.sides, vec![Side::Above, Side::Below]);
    }

    #[test]
    fn zeros_blend_linearly_and_single_axes_hold() {
        let g = Grid::new(vec![vec![1.0, 4.0], vec![2.0]], vec![vec![0.0, 2.0]]);
        // halfway in log space between 1 and 4 is 2
        let l = g.lookup(&[2.0, 2.0]);
        assert!((l.values[0] - 1.0).abs() < 1e-12);
        let l = g.lookup(&[2.0, 8.0]);
        assert!((l.values[0] - 1.0).abs() < 1e-12);
        assert_eq!(l.sides, vec![Side::Inside, Side::Above]);
        // extension below clamps at zero
        assert_eq!(g.lookup(&[0.25, 2.0]).values[0], 0.0);
    }

    #[test]
    fn counter_counts_once_per_lookup_and_resets() {
        let c = ExtrapolationCounter::new(2);
        c.record(&[Side::Inside, Side::Inside]);
        c.record(&[Side::Above, Side::Below]);
        c.record(&[Side::Above, Side::Inside]);
        let t = c.take();
        assert_eq!(t.lookups, 3);
        assert_eq!(t.extrapolated, 2);
        assert_eq!(t.per_axis, vec![(0, 2), (1, 0)]);
        assert_eq!(c.take().lookups, 0);
    }
}
