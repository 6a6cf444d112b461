//! The optional `[host_sharing]` table of a CPU profile: how much slower a
//! pass of the executor runs while the busy worker processes on one host of
//! `cores` cores ask `demand_threads` threads, measured by `easerve profile`
//! (`worker/src/profiler.rs`, `measure_host_sharing`).
//!
//! ```toml
//! [host_sharing]
//! cores = 2
//! method = "…"
//! columns = ["demand_threads", "slowdown"]
//! rows = [
//!   [2, 1.0],
//!   [4, 3.1],
//! ]
//! ```
//!
//! `slowdown` is the median pass time with `demand_threads` threads busy
//! over the same pass alone (≥ 1). Rows are sorted by `demand_threads`
//! (≥ 1, strictly ascending). [`HostSharing::slowdown`] reads the curve:
//! 1 up to `cores` threads, piecewise linear in the demand between the
//! point `(cores, 1)` and the rows above `cores`, and beyond the last row
//! `(d_n, s_n)` the fair-share line `D / cores` times the last row's
//! excess over it, `s_n · cores / d_n` (so the curve is continuous there).
//! A table with no row above `cores` reads as the fair share, `D / cores`.
//!
//! **Rank groups.** A tensor-parallel worker's `k` rank processes meet at an
//! all-reduce after every row-parallel projection, so a step goes at the
//! pace of whichever rank the OS left waiting; under oversubscription that
//! slows it more than an independent process of as many threads. The
//! optional `tp_rows` hold that curve per degree, measured the same way
//! with one TP `k` rank group (one thread per rank) among the busy
//! processes, its slowdown the group's median pass time over the group
//! alone:
//!
//! ```toml
//! tp_columns = ["tp", "demand_threads", "slowdown"]
//! tp_rows = [
//!   [2, 4, 2.4],
//!   [2, 5, 3.0],
//! ]
//! ```
//!
//! Rows are sorted by `tp` (≥ 2), then `demand_threads` strictly ascending
//! within a degree. [`HostSharing::slowdown_tp`] reads a degree's rows as
//! the main curve is read, anchored at `(max(cores, tp), 1)` (the group
//! alone); a degree without rows reads the main curve.
//!
//! **One-thread processes.** The main rows always hold one whole-host
//! process, whose fork-join pass either keeps its speed beside the others
//! or waits at every join for a descheduled thread. Where every busy pass
//! runs on one thread, that process is not there, and what remains is the
//! interference of independent processes below the core count as well
//! (shared caches and memory bandwidth, the hypervisor's scheduling of the
//! virtual cores). The optional `one_thread_rows` hold that curve: `D`
//! one-thread processes busy together, each one's median pass time over
//! the pass alone on one thread, averaged:
//!
//! ```toml
//! one_thread_columns = ["demand_threads", "slowdown"]
//! one_thread_rows = [
//!   [2, 1.12],
//!   [3, 1.6],
//! ]
//! ```
//!
//! Rows as the main ones; [`HostSharing::slowdown_one_thread`] reads them
//! anchored at `(1, 1)` (one process alone), beyond their last row the
//! fair-share line times that row's excess (as the main curve beyond its
//! own), and reads the main curve where the profile has none.

use super::ProfileError;

/// The columns of a `[host_sharing]` table, in order.
pub const HOST_SHARING_COLUMNS: [&str; 2] = ["demand_threads", "slowdown"];

/// The columns of a `[host_sharing]` table's rank-group rows, in order.
pub const HOST_SHARING_TP_COLUMNS: [&str; 3] = ["tp", "demand_threads", "slowdown"];

/// The slowdown at `demand` of a curve of `rows` on `cores` cores that is 1
/// up to `anchor` (module doc).
fn read_curve(rows: &[(f64, f64)], anchor: f64, cores: f64, demand: f64) -> f64 {
    if demand <= anchor {
        return 1.0;
    }
    let mut lo = (anchor, 1.0);
    for &(d, s) in rows.iter().filter(|r| r.0 > anchor) {
        if demand <= d {
            let w = (demand - lo.0) / (d - lo.0);
            return (lo.1 + w * (s - lo.1)).max(1.0);
        }
        lo = (d, s);
    }
    if lo.0 <= anchor {
        // no row above the anchor: fair share
        return (demand / cores).max(1.0);
    }
    let excess = lo.1 * cores / lo.0;
    (demand / cores * excess).max(1.0)
}

/// Validate one curve's rows: `(row index, message)` naming the field.
fn check_rows(rows: &[(f64, f64)]) -> Result<(), (Option<usize>, String)> {
    for (i, &(d, s)) in rows.iter().enumerate() {
        if !(d.is_finite() && d >= 1.0) {
            return Err((
                Some(i),
                format!("`demand_threads` = {d} must be finite and ≥ 1"),
            ));
        }
        if !(s.is_finite() && s >= 1.0) {
            return Err((
                Some(i),
                format!("`slowdown` = {s} must be finite and ≥ 1 (pass time busy over alone)"),
            ));
        }
        if i > 0 && d <= rows[i - 1].0 {
            return Err((
                Some(i),
                format!(
                    "`demand_threads` = {d} after {}: rows must be sorted by `demand_threads`, strictly ascending",
                    rows[i - 1].0
                ),
            ));
        }
    }
    Ok(())
}

/// A host's measured oversubscription curve (module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct HostSharing {
    /// Cores of the host that measured it.
    pub cores: u32,
    /// How it was measured (passes, processes, window, host load).
    pub method: String,
    /// `(demand_threads, slowdown)`, ascending in demand.
    rows: Vec<(f64, f64)>,
    /// Per TP degree (ascending, ≥ 2), a rank group's rows.
    tp_rows: Vec<(u32, Vec<(f64, f64)>)>,
    /// `(demand_threads, slowdown)` of one-thread processes only (empty:
    /// not measured).
    one_thread_rows: Vec<(f64, f64)>,
}

impl HostSharing {
    /// A curve from its rows, validated: at least one row, `cores` ≥ 1,
    /// every `demand_threads` finite and ≥ 1 and strictly ascending, every
    /// `slowdown` finite and ≥ 1.
    ///
    /// Errors: `(row index, message)` naming the field and the allowed
    /// values (`None` for the table as a whole).
    pub fn new(
        cores: u32,
        method: String,
        rows: Vec<(f64, f64)>,
    ) -> Result<HostSharing, (Option<usize>, String)> {
        if cores == 0 {
            return Err((None, "`cores` = 0 must be at least 1".into()));
        }
        if rows.is_empty() {
            return Err((None, "`rows` is empty (at least one row)".into()));
        }
        check_rows(&rows)?;
        Ok(HostSharing {
            cores,
            method,
            rows,
            tp_rows: Vec::new(),
            one_thread_rows: Vec::new(),
        })
    }

    /// The curve with one-thread rows `rows` (`(demand_threads, slowdown)`,
    /// validated as the main rows; empty: none).
    ///
    /// Errors: `(row index, message)` naming the field.
    pub fn with_one_thread_rows(
        mut self,
        rows: Vec<(f64, f64)>,
    ) -> Result<HostSharing, (Option<usize>, String)> {
        check_rows(&rows)?;
        self.one_thread_rows = rows;
        Ok(self)
    }

    /// The curve with the one-thread rows at the demands of `refit`
    /// (`(demand_threads, slowdown)`, e.g. from a run's passes,
    /// [`crate::alone::shared_levels`]) replaced or added, the others kept.
    ///
    /// Errors: `(row index, message)` for a refit row
    /// [`HostSharing::with_one_thread_rows`] refuses.
    pub fn with_refit_one_thread(
        self,
        refit: &[(f64, f64)],
    ) -> Result<HostSharing, (Option<usize>, String)> {
        let mut rows: Vec<(f64, f64)> = (self.one_thread_rows.iter())
            .filter(|r| refit.iter().all(|f| f.0 != r.0))
            .chain(refit)
            .copied()
            .collect();
        rows.sort_by(|a, b| a.0.total_cmp(&b.0));
        self.with_one_thread_rows(rows)
    }

    /// The one-thread rows, `(demand_threads, slowdown)` (empty: none).
    pub fn one_thread_rows(&self) -> &[(f64, f64)] {
        &self.one_thread_rows
    }

    /// How much slower a one-thread pass runs while busy one-thread passes
    /// (itself among them) ask `demand` threads (module doc, "One-thread
    /// processes"): the one-thread rows from `(1, 1)`, else
    /// [`HostSharing::slowdown`].
    pub fn slowdown_one_thread(&self, demand: f64) -> f64 {
        if self.one_thread_rows.is_empty() {
            return self.slowdown(demand);
        }
        read_curve(&self.one_thread_rows, 1.0, f64::from(self.cores), demand)
    }

    /// The curve with rank-group rows `tp_rows`: `(tp, demand_threads,
    /// slowdown)`, sorted by `tp` (≥ 2), then by demand strictly ascending.
    ///
    /// Errors: `(row index in tp_rows, message)` naming the field.
    pub fn with_tp_rows(
        mut self,
        tp_rows: &[(u32, f64, f64)],
    ) -> Result<HostSharing, (Option<usize>, String)> {
        let mut out: Vec<(u32, Vec<(f64, f64)>)> = Vec::new();
        let mut first = 0;
        for (i, &(tp, d, s)) in tp_rows.iter().enumerate() {
            if tp < 2 {
                return Err((
                    Some(i),
                    format!("`tp` = {tp} must be at least 2 (a rank group)"),
                ));
            }
            match out.last_mut() {
                Some((t, rows)) if *t == tp => rows.push((d, s)),
                Some((t, _)) if *t > tp => {
                    return Err((
                        Some(i),
                        format!("`tp` = {tp} after {t}: rank-group rows must be sorted by `tp`"),
                    ))
                }
                _ => {
                    first = i;
                    out.push((tp, vec![(d, s)]));
                }
            }
            if let Some((_, rows)) = out.last() {
                check_rows(rows).map_err(|(r, m)| (r.map(|r| first + r), m))?;
            }
        }
        self.tp_rows = out;
        Ok(self)
    }

    /// The rank-group rows, `(tp, demand_threads, slowdown)`.
    pub fn tp_rows(&self) -> Vec<(u32, f64, f64)> {
        (self.tp_rows.iter())
            .flat_map(|(t, rows)| rows.iter().map(move |&(d, s)| (*t, d, s)))
            .collect()
    }

    /// The rows, `(demand_threads, slowdown)`.
    pub fn rows(&self) -> &[(f64, f64)] {
        &self.rows
    }

    /// How much slower every pass runs while busy workers ask `demand`
    /// threads of this host's [`HostSharing::cores`] (module doc): 1 up to
    /// `cores`, the curve above it, the last row's excess over fair share
    /// beyond the last row.
    pub fn slowdown(&self, demand: f64) -> f64 {
        let c = f64::from(self.cores);
        read_curve(&self.rows, c, c, demand)
    }

    /// How much slower a TP `tp` rank group's pass runs while busy workers
    /// ask `demand` threads (module doc, "Rank groups"): its rows where the
    /// profile measured the degree, else [`HostSharing::slowdown`].
    pub fn slowdown_tp(&self, tp: u32, demand: f64) -> f64 {
        match self.tp_rows.iter().find(|(t, _)| *t == tp) {
            Some((t, rows)) => {
                let c = f64::from(self.cores);
                read_curve(rows, c.max(f64::from(*t)), c, demand)
            }
            None => self.slowdown(demand),
        }
    }

    /// Whether the curve has rank-group rows for `tp`.
    pub fn has_tp(&self, tp: u32) -> bool {
        self.tp_rows.iter().any(|(t, _)| *t == tp)
    }

    /// The table in the profile's canonical layout (after a blank line).
    pub(super) fn to_toml(&self) -> String {
        let q = |s: &str| toml::Value::String(s.to_string()).to_string();
        let mut o = format!(
            "\n[host_sharing]\ncores = {}\nmethod = {}\ncolumns = [{}]\nrows = [\n",
            self.cores,
            q(&self.method),
            HOST_SHARING_COLUMNS.map(q).join(", ")
        );
        let demand = |d: f64| match d.fract() == 0.0 {
            true => format!("{}", d as u64),
            false => format!("{d:?}"),
        };
        for (d, s) in &self.rows {
            o.push_str(&format!("  [{}, {s:?}],\n", demand(*d)));
        }
        o.push_str("]\n");
        if !self.tp_rows.is_empty() {
            o.push_str(&format!(
                "tp_columns = [{}]\ntp_rows = [\n",
                HOST_SHARING_TP_COLUMNS.map(q).join(", ")
            ));
            for (t, d, s) in self.tp_rows() {
                o.push_str(&format!("  [{t}, {}, {s:?}],\n", demand(d)));
            }
            o.push_str("]\n");
        }
        if !self.one_thread_rows.is_empty() {
            o.push_str(&format!(
                "one_thread_columns = [{}]\none_thread_rows = [\n",
                HOST_SHARING_COLUMNS.map(q).join(", ")
            ));
            for (d, s) in &self.one_thread_rows {
                o.push_str(&format!("  [{}, {s:?}],\n", demand(*d)));
            }
            o.push_str("]\n");
        }
        o
    }

    /// The `[host_sharing]` table `t` of profile file `file`.
    ///
    /// Errors: unknown keys, a missing or mistyped `cores`, `method`,
    /// `columns` or `rows`, and what [`HostSharing::new`] refuses, each
    /// naming the table, the row and the field.
    pub(super) fn from_toml(file: &str, t: &toml::Table) -> Result<HostSharing, ProfileError> {
        // `row`: 0-based in `rows` (or in `tp_rows` for `table` =
        // "host_sharing.tp_rows"); errors number rows from 1
        let at = |table: &str, row: Option<usize>, message: String| ProfileError {
            file: file.to_string(),
            table: Some(table.into()),
            row: row.map(|r| r + 1),
            message,
        };
        let err = |row: Option<usize>, message: String| at("host_sharing", row, message);
        let tp_err = |row: Option<usize>, message: String| at("host_sharing.tp_rows", row, message);
        let allowed = [
            "cores",
            "method",
            "columns",
            "rows",
            "tp_columns",
            "tp_rows",
            "one_thread_columns",
            "one_thread_rows",
        ];
        if let Some(k) = t.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(err(
                None,
                format!("unknown key `{k}` (allowed: {})", allowed.join(", ")),
            ));
        }
        let cores = match t.get("cores") {
            Some(toml::Value::Integer(c)) if (1..=1 << 20).contains(c) => *c as u32,
            other => {
                return Err(err(
                    None,
                    format!("`cores` must be an integer in 1 ..= 1048576, found {other:?}"),
                ))
            }
        };
        let method = match t.get("method") {
            Some(toml::Value::String(s)) => s.clone(),
            _ => return Err(err(None, "`method` must be a string".into())),
        };
        // the column list under `key` must be `want`
        let columns_are = |key: &str, want: &[&str]| {
            let got: Option<Vec<&str>> = (t.get(key).and_then(|v| v.as_array()))
                .map(|a| a.iter().filter_map(|v| v.as_str()).collect());
            match got.as_deref() == Some(want) {
                true => Ok(()),
                false => Err(err(None, format!("`{key}` must be {want:?}"))),
            }
        };
        columns_are("columns", &HOST_SHARING_COLUMNS)?;
        let Some(rows) = t.get("rows").and_then(|v| v.as_array()) else {
            return Err(err(None, "`rows` must be an array of rows".into()));
        };
        let cells = |r: &toml::Value| -> Option<Vec<f64>> {
            r.as_array().and_then(|a| {
                a.iter()
                    .map(|v| v.as_float().or_else(|| v.as_integer().map(|x| x as f64)))
                    .collect()
            })
        };
        // rows of [demand_threads, slowdown], errors by `fail`
        let pairs = |rows: &[toml::Value], fail: &dyn Fn(Option<usize>, String) -> ProfileError| {
            let mut out = Vec::with_capacity(rows.len());
            for (i, r) in rows.iter().enumerate() {
                match cells(r).as_deref() {
                    Some(&[d, s]) => out.push((d, s)),
                    _ => {
                        return Err(fail(
                            Some(i),
                            "a row must be two numbers, [demand_threads, slowdown]".into(),
                        ))
                    }
                }
            }
            Ok(out)
        };
        let out = pairs(rows, &err)?;
        let mut curve = HostSharing::new(cores, method, out).map_err(|(row, m)| err(row, m))?;
        match t.get("one_thread_rows") {
            None if t.contains_key("one_thread_columns") => {
                return Err(err(
                    None,
                    "`one_thread_columns` without `one_thread_rows`".into(),
                ))
            }
            None => {}
            Some(v) => {
                let one_err = |row: Option<usize>, message: String| {
                    at("host_sharing.one_thread_rows", row, message)
                };
                columns_are("one_thread_columns", &HOST_SHARING_COLUMNS)?;
                let Some(rows) = v.as_array().filter(|a| !a.is_empty()) else {
                    return Err(one_err(
                        None,
                        "`one_thread_rows` must be a non-empty array of rows (leave it out for none)".into(),
                    ));
                };
                let rows = pairs(rows, &one_err)?;
                curve = curve
                    .with_one_thread_rows(rows)
                    .map_err(|(row, m)| one_err(row, m))?;
            }
        }
        let Some(tp_rows) = t.get("tp_rows") else {
            if t.contains_key("tp_columns") {
                return Err(err(None, "`tp_columns` without `tp_rows`".into()));
            }
            return Ok(curve);
        };
        columns_are("tp_columns", &HOST_SHARING_TP_COLUMNS)?;
        let Some(tp_rows) = tp_rows.as_array().filter(|a| !a.is_empty()) else {
            return Err(err(
                None,
                "`tp_rows` must be a non-empty array of rows (leave it out for none)".into(),
            ));
        };
        let mut tps = Vec::with_capacity(tp_rows.len());
        for (i, r) in tp_rows.iter().enumerate() {
            match cells(r).as_deref() {
                Some(&[t, d, s]) if t.fract() == 0.0 && (2.0..=65536.0).contains(&t) => {
                    tps.push((t as u32, d, s))
                }
                _ => return Err(tp_err(
                    Some(i),
                    "a row must be [tp, demand_threads, slowdown], tp an integer in 2 ..= 65536"
                        .into(),
                )),
            }
        }
        curve.with_tp_rows(&tps).map_err(|(row, m)| tp_err(row, m))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(rows: &[(f64, f64)]) -> HostSharing {
        HostSharing::new(2, "test".into(), rows.to_vec()).unwrap()
    }

    #[test]
    fn the_curve_is_one_up_to_the_cores_linear_between_rows_and_scaled_fair_share_beyond() {
        let h = curve(&[(2.0, 1.0), (4.0, 3.0), (6.0, 4.2)]);
        assert_eq!(h.slowdown(1.0), 1.0);
        assert_eq!(h.slowdown(2.0), 1.0);
        // between (2, 1) and (4, 3)
        assert!((h.slowdown(3.0) - 2.0).abs() < 1e-12);
        assert!((h.slowdown(4.0) - 3.0).abs() < 1e-12);
        // between (4, 3) and (6, 4.2)
        assert!((h.slowdown(5.0) - 3.6).abs() < 1e-12);
        // beyond: D/2 × 4.2·2/6 = D × 0.7
        assert!((h.slowdown(6.0) - 4.2).abs() < 1e-12);
        assert!((h.slowdown(8.0) - 5.6).abs() < 1e-12);
        // the first row above the cores is reached from (cores, 1)
        let h = curve(&[(3.0, 2.5)]);
        assert!((h.slowdown(2.5) - 1.75).abs() < 1e-12);
        // rows at or below the cores only: fair share beyond them
        let h = curve(&[(1.0, 1.0), (2.0, 1.1)]);
        assert!((h.slowdown(5.0) - 2.5).abs() < 1e-12);
    }

    #[test]
    fn bad_rows_are_refused_naming_the_field() {
        let bad = |rows: &[(f64, f64)]| HostSharing::new(2, String::new(), rows.to_vec());
        let e = bad(&[(0.0, 1.0)]).unwrap_err();
        assert!(e.0 == Some(0) && e.1.contains("`demand_threads`"), "{e:?}");
        let e = bad(&[(2.0, 1.0), (3.0, 0.5)]).unwrap_err();
        assert!(e.0 == Some(1) && e.1.contains("`slowdown`"), "{e:?}");
        let e = bad(&[(2.0, f64::NAN)]).unwrap_err();
        assert!(e.1.contains("`slowdown`"), "{e:?}");
        let e = bad(&[(2.0, f64::INFINITY)]).unwrap_err();
        assert!(e.1.contains("finite"), "{e:?}");
        let e = bad(&[(4.0, 2.0), (3.0, 2.0)]).unwrap_err();
        assert!(e.0 == Some(1) && e.1.contains("sorted"), "{e:?}");
        let e = bad(&[]).unwrap_err();
        assert!(e.1.contains("empty"), "{e:?}");
        assert!(HostSharing::new(0, String::new(), vec![(2.0, 1.0)]).is_err());
    }

    #[test]
    fn rank_group_rows_read_from_the_group_alone_and_fall_back_to_the_main_curve() {
        let h = curve(&[(2.0, 1.0), (4.0, 1.5)])
            .with_tp_rows(&[(2, 4.0, 2.5), (2, 6.0, 4.5), (4, 6.0, 2.0)])
            .unwrap();
        // TP 2 on 2 cores: 1 up to 2, then (2, 1) to (4, 2.5)
        assert_eq!(h.slowdown_tp(2, 2.0), 1.0);
        assert!((h.slowdown_tp(2, 3.0) - 1.75).abs() < 1e-12);
        assert!((h.slowdown_tp(2, 5.0) - 3.5).abs() < 1e-12);
        // beyond: D/2 × 4.5·2/6
        assert!((h.slowdown_tp(2, 8.0) - 6.0).abs() < 1e-12);
        // TP 4: alone at demand 4, 1 there
        assert_eq!(h.slowdown_tp(4, 4.0), 1.0);
        assert!((h.slowdown_tp(4, 5.0) - 1.5).abs() < 1e-12);
        // no TP 8 rows: the main curve
        assert_eq!(h.slowdown_tp(8, 4.0), h.slowdown(4.0));
        assert!(h.has_tp(2) && !h.has_tp(8));
        assert_eq!(h.tp_rows().len(), 3);
        let bad = |rows: &[(u32, f64, f64)]| curve(&[(2.0, 1.0)]).with_tp_rows(rows).unwrap_err();
        let e = bad(&[(1, 4.0, 2.0)]);
        assert!(e.0 == Some(0) && e.1.contains("`tp`"), "{e:?}");
        let e = bad(&[(4, 6.0, 2.0), (2, 4.0, 2.0)]);
        assert!(e.0 == Some(1) && e.1.contains("sorted by `tp`"), "{e:?}");
        let e = bad(&[(2, 4.0, 2.0), (4, 6.0, 2.0), (4, 5.0, 2.0)]);
        assert!(
            e.0 == Some(2) && e.1.contains("strictly ascending"),
            "{e:?}"
        );
        let e = bad(&[(2, 4.0, 0.5)]);
        assert!(e.1.contains("`slowdown`"), "{e:?}");
    }

    #[test]
    fn one_thread_rows_read_from_one_process_alone_and_fall_back_to_the_main_curve() {
        let main = curve(&[(2.0, 1.0), (4.0, 3.0)]);
        // none: the main curve (1 up to the cores)
        assert_eq!(main.slowdown_one_thread(2.0), 1.0);
        assert_eq!(main.slowdown_one_thread(4.0), 3.0);
        let h = main
            .with_one_thread_rows(vec![(2.0, 1.2), (4.0, 2.4)])
            .unwrap();
        assert_eq!(h.slowdown_one_thread(1.0), 1.0);
        // from (1, 1) to (2, 1.2): interference below the core count
        assert!((h.slowdown_one_thread(1.5) - 1.1).abs() < 1e-12);
        assert!((h.slowdown_one_thread(2.0) - 1.2).abs() < 1e-12);
        assert!((h.slowdown_one_thread(3.0) - 1.8).abs() < 1e-12);
        // beyond: D/2 × 2.4·2/4
        assert!((h.slowdown_one_thread(6.0) - 3.6).abs() < 1e-12);
        // the main curve is untouched
        assert_eq!(h.slowdown(2.0), 1.0);
        assert_eq!(h.one_thread_rows().len(), 2);
        // a refit replaces the rows at its demands and keeps the others
        let r = h
            .clone()
            .with_refit_one_thread(&[(2.0, 1.1), (3.0, 1.3)])
            .unwrap();
        assert_eq!(r.one_thread_rows(), &[(2.0, 1.1), (3.0, 1.3), (4.0, 2.4)]);
        assert!(h.with_refit_one_thread(&[(3.0, 0.5)]).is_err());
        let e = curve(&[(2.0, 1.0)])
            .with_one_thread_rows(vec![(2.0, 1.2), (2.0, 1.3)])
            .unwrap_err();
        assert!(
            e.0 == Some(1) && e.1.contains("strictly ascending"),
            "{e:?}"
        );
    }

    /// `p`'s text after it reads back to the same curve and writes back
    /// byte-identical, and a reader of that text with `from` replaced by
    /// `to`, which must be refused: the error.
    fn round_trip(p: &crate::profile::Profile) -> (String, impl Fn(&str, &str) -> String) {
        use crate::profile::Profile;
        let text = p.to_toml_string();
        let q = Profile::from_toml_str(&text, "mem").unwrap();
        assert_eq!(q.host_sharing(), p.host_sharing());
        assert_eq!(q.to_toml_string(), text);
        let original = text.clone();
        let bad = move |from: &str, to: &str| {
            let t = original.replace(from, to);
            assert_ne!(t, original, "{from}");
            Profile::from_toml_str(&t, "bad.toml")
                .unwrap_err()
                .to_string()
        };
        (text, bad)
    }

    /// A profile file with a `[host_sharing]` table reads back to the same
    /// curve and writes back byte-identical; a bad row is refused naming
    /// the table, the row and the field.
    #[test]
    fn the_table_reads_back_and_bad_rows_name_the_field() {
        use crate::profile::tests::{roof, small_grid};
        use crate::profile::Profile;
        let p = Profile::from_roofline(
            &roof("tiny-image", "a100-sxm4-80gb"),
            &small_grid(),
            "2026-12-05",
        )
        .with_host_sharing(Some(curve(&[(2.0, 1.0), (3.0, 2.25), (7.0, 6.5)])));
        let (text, bad) = round_trip(&p);
        assert!(text.contains("[host_sharing]\ncores = 2\n"), "{text}");
        let e = bad("  [3, 2.25],", "  [0, 2.25],");
        assert!(
            e.contains("bad.toml")
                && e.contains("host_sharing")
                && e.contains("row 2")
                && e.contains("`demand_threads`"),
            "{e}"
        );
        let e = bad("  [3, 2.25],", "  [3, 0.5],");
        assert!(e.contains("`slowdown`") && e.contains("≥ 1"), "{e}");
        let e = bad("  [3, 2.25],", "  [9, 2.25],");
        assert!(e.contains("sorted"), "{e}");
        let e = bad("  [3, 2.25],", "  [3, nan],");
        assert!(e.contains("`slowdown`") && e.contains("finite"), "{e}");
        let e = bad("cores = 2\nmethod", "cores = 0\nmethod");
        assert!(e.contains("`cores`"), "{e}");
        let e = bad("\"slowdown\"]", "\"speed\"]");
        assert!(e.contains("`columns`"), "{e}");
        // with rank-group rows
        let p = p.with_host_sharing(Some(
            curve(&[(2.0, 1.0), (3.0, 2.25)])
                .with_tp_rows(&[(2, 4.0, 2.5), (2, 5.0, 3.25)])
                .unwrap(),
        ));
        let (text, bad) = round_trip(&p);
        assert!(
            text.contains("tp_rows = [\n  [2, 4, 2.5],\n  [2, 5, 3.25],\n]\n"),
            "{text}"
        );
        let e = bad("  [2, 5, 3.25],", "  [1, 5, 3.25],");
        assert!(
            e.contains("bad.toml") && e.contains("host_sharing.tp_rows") && e.contains("row 2"),
            "{e}"
        );
        let e = bad("  [2, 5, 3.25],", "  [2, 3, 3.25],");
        assert!(e.contains("strictly ascending"), "{e}");
        let e = bad("  [2, 5, 3.25],", "  [2, 5],");
        assert!(e.contains("[tp, demand_threads, slowdown]"), "{e}");
        let e = bad(
            "tp_rows = [\n  [2, 4, 2.5],\n  [2, 5, 3.25],\n]",
            "tp_rows = []",
        );
        assert!(e.contains("non-empty"), "{e}");
        let e = bad("tp_columns = [\"tp\", ", "tp_columns = [");
        assert!(e.contains("`tp_columns`"), "{e}");
        // with one-thread rows
        let p = p.with_host_sharing(Some(
            curve(&[(2.0, 1.0), (3.0, 2.25)])
                .with_one_thread_rows(vec![(2.0, 1.125), (3.0, 1.5)])
                .unwrap(),
        ));
        let (text, bad) = round_trip(&p);
        assert!(
            text.contains("one_thread_rows = [\n  [2, 1.125],\n  [3, 1.5],\n]\n"),
            "{text}"
        );
        let e = bad("  [3, 1.5],\n]", "  [3, 0.5],\n]");
        assert!(
            e.contains("host_sharing.one_thread_rows")
                && e.contains("row 2")
                && e.contains("`slowdown`"),
            "{e}"
        );
        let e = bad("  [3, 1.5],\n]", "  [3],\n]");
        assert!(e.contains("[demand_threads, slowdown]"), "{e}");
        let e = bad(
            "one_thread_columns = [\"demand_threads\", ",
            "one_thread_columns = [",
        );
        assert!(e.contains("`one_thread_columns`"), "{e}");
    }
}
