//! Reading a profile: [`Profile::load`] and [`Profile::from_toml_str`] parse
//! the TOML and validate every table (known keys, devices and links, axes and
//! columns, finite values in range, a full sorted grid, latency that does not
//! fall along work axes), naming the file, the table and the row of the first
//! error; [`Profile::set_rows`] re-validates replaced rows the same way.

use std::path::Path;

use super::format::{is_integer_axis, is_work_axis};
use super::{
    PrefillBatching, Profile, ProfileError, Provenance, Source, Stage, Table, TimeUnit,
    FORMAT_VERSION, MONOTONE_TOLERANCE,
};
use crate::gpu::{GpuSpec, LinkSpec};

impl Profile {
    /// Read and validate the profile at `path` (devices and links must be presets).
    pub fn load(path: impl AsRef<Path>) -> Result<Profile, ProfileError> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let text = crate::input::read_text(path).map_err(|e| ProfileError {
            file: file.clone(),
            table: None,
            row: None,
            message: format!("cannot read: {e}"),
        })?;
        Profile::from_toml_str(&text, &file)
    }

    /// Parse and validate profile text; `origin` names it in errors and notes.
    /// Devices and links must be [`GpuSpec::preset_names`] / [`LinkSpec::preset_names`].
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Profile, ProfileError> {
        Profile::from_toml_str_with_devices(text, origin, &[], &[])
    }

    /// As [`Profile::from_toml_str`], also accepting the custom device and link
    /// names given (e.g. from a user's GPU definitions file).
    pub fn from_toml_str_with_devices(
        text: &str,
        origin: &str,
        extra_devices: &[String],
        extra_links: &[String],
    ) -> Result<Profile, ProfileError> {
        let p = Parser {
            file: origin,
            extra_devices,
            extra_links,
        };
        p.profile(text)
    }

    /// Replace the encode table's rows (same columns, unit and axes), e.g. after
    /// refinement. Rows are re-validated.
    pub fn set_encode_rows(&mut self, rows: Vec<Vec<f64>>) -> Result<(), ProfileError> {
        self.set_rows(Stage::Encode, rows)
    }

    /// Replace the rows of the encode, prefill or decode table (same columns,
    /// unit and axes), e.g. after refinement. Rows are re-validated.
    ///
    /// Errors: the stage has no table here (encode of a text-only model, or
    /// `Stage::Transfer`, which has one table per link), or a row is invalid.
    pub fn set_rows(&mut self, stage: Stage, rows: Vec<Vec<f64>>) -> Result<(), ProfileError> {
        let name = stage.name();
        let t = match stage {
            Stage::Encode => self.encode.as_ref(),
            Stage::Prefill => Some(&self.prefill),
            Stage::Decode => Some(&self.decode),
            Stage::Transfer | Stage::AllReduce | Stage::EncodeTp | Stage::KvLand => None,
        };
        let Some(t) = t else {
            return Err(ProfileError {
                file: self.origin.clone(),
                table: Some(name.into()),
                row: None,
                message: format!("the profile has no single {name} table to replace"),
            });
        };
        let p = Parser {
            file: &self.origin,
            extra_devices: &[],
            extra_links: &[],
        };
        p.check_rows(name, stage, &t.columns, &rows)?;
        let table = Table::build(stage, None, t.unit, t.columns.clone(), rows);
        match stage {
            Stage::Encode => self.encode = Some(table),
            Stage::Prefill => self.prefill = table,
            _ => self.decode = table,
        }
        Ok(())
    }

    /// Map every value (median and P90, seconds) of the `[[transfer]]`
    /// table of `link` through `f`, keeping the byte axis (the other links'
    /// tables as they are): how `calib refine` folds a measured run's
    /// transfers into the link table the run used.
    ///
    /// # Errors
    /// A mapped row that is not valid (a value not finite or negative, or a
    /// table no longer non-decreasing in bytes), naming the table.
    pub fn map_transfer_seconds(
        &mut self,
        link: &str,
        f: impl Fn(f64) -> f64,
    ) -> Result<(), ProfileError> {
        let p = Parser {
            file: &self.origin,
            extra_devices: &[],
            extra_links: &[],
        };
        let mut out = Vec::with_capacity(self.transfer.len());
        for t in &self.transfer {
            if t.link.as_deref() != Some(link) {
                out.push(t.clone());
                continue;
            }
            let unit = t.unit.seconds();
            let rows = t.mapped_rows(|v| f(v * unit) / unit);
            let name = format!("transfer ({})", t.link.as_deref().unwrap_or("?"));
            p.check_rows(&name, Stage::Transfer, &t.columns, &rows)?;
            out.push(Table::build(
                Stage::Transfer,
                t.link.clone(),
                t.unit,
                t.columns.clone(),
                rows,
            ));
        }
        self.transfer = out;
        Ok(())
    }
}

/// Validation of profile text, with the file name for errors.
struct Parser<'a> {
    file: &'a str,
    extra_devices: &'a [String],
    extra_links: &'a [String],
}

type Res<T> = Result<T, ProfileError>;

impl Parser<'_> {
    /// The array `key` of table `table` as strings.
    fn strings(&self, table: &str, a: &[toml::Value], key: &str) -> Res<Vec<String>> {
        a.iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| self.err(Some(table), None, format!("`{key}` must be strings")))
            })
            .collect()
    }

    fn err(&self, table: Option<&str>, row: Option<usize>, message: String) -> ProfileError {
        ProfileError {
            file: self.file.to_string(),
            table: table.map(str::to_string),
            row,
            message,
        }
    }

    /// The optional table `name` of `doc` (`[encode]`, `[all_reduce]`),
    /// checked as [`Self::table`] does, or `None` when absent.
    fn optional_table(&self, doc: &toml::Table, name: &str, stage: Stage) -> Res<Option<Table>> {
        match doc.get(name) {
            None => Ok(None),
            Some(v) => Ok(Some(self.table(name, stage, self.as_table(name, v)?)?)),
        }
    }

    fn profile(&self, text: &str) -> Res<Profile> {
        let doc: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| self.err(None, None, format!("not valid TOML: {e}")))?;
        let allowed = [
            "format",
            "provenance",
            "scalars",
            "encode",
            "prefill",
            "decode",
            "transfer",
            "all_reduce",
            "encode_tp",
            "kv_land",
            "host_sharing",
        ];
        for k in doc.keys() {
            if !allowed.contains(&k.as_str()) {
                return Err(self.err(
                    None,
                    None,
                    format!(
                        "unknown top-level key `{k}` (allowed: {})",
                        allowed.join(", ")
                    ),
                ));
            }
        }
        match doc.get("format") {
            Some(toml::Value::Integer(FORMAT_VERSION)) => {}
            other => {
                return Err(self.err(
                    None,
                    None,
                    format!("`format` must be {FORMAT_VERSION}, found {other:?}"),
                ))
            }
        }
        let prov = self.sub_table(&doc, "provenance")?;
        let provenance = self.provenance(prov)?;
        let sc = self.sub_table(&doc, "scalars")?;
        self.only_keys(
            "scalars",
            sc,
            &[
                "time_slice_penalty",
                "bandwidth_interference",
                "note",
                "prefill_batching",
            ],
        )?;
        let scalar = |k: &str| -> Res<f64> {
            let v = sc
                .get(k)
                .ok_or_else(|| self.err(Some("scalars"), None, format!("missing `{k}`")))?;
            let x = number(v).ok_or_else(|| {
                self.err(Some("scalars"), None, format!("`{k}` must be a number"))
            })?;
            if !(x.is_finite() && x >= 0.0) {
                return Err(self.err(
                    Some("scalars"),
                    None,
                    format!("`{k}` = {x} must be finite and ≥ 0"),
                ));
            }
            Ok(x)
        };
        let time_slice_penalty = scalar("time_slice_penalty")?;
        let bandwidth_interference = scalar("bandwidth_interference")?;
        let scalars_note = self.opt_string("scalars", sc, "note")?.unwrap_or_default();
        let prefill_batching = match self
            .opt_string("scalars", sc, "prefill_batching")?
            .as_deref()
        {
            None | Some("packed") => PrefillBatching::Packed,
            Some("padded") => PrefillBatching::Padded,
            Some(other) => {
                return Err(self.err(
                    Some("scalars"),
                    None,
                    format!("`prefill_batching` = `{other}`: expected `packed` or `padded`"),
                ))
            }
        };
        let encode = self.optional_table(&doc, "encode", Stage::Encode)?;
        let prefill = self.table("prefill", Stage::Prefill, self.sub_table(&doc, "prefill")?)?;
        let decode = self.table("decode", Stage::Decode, self.sub_table(&doc, "decode")?)?;
        let all_reduce = self.optional_table(&doc, "all_reduce", Stage::AllReduce)?;
        let encode_tp = self.optional_table(&doc, "encode_tp", Stage::EncodeTp)?;
        let kv_land = self.optional_table(&doc, "kv_land", Stage::KvLand)?;
        if encode_tp
            .as_ref()
            .is_some_and(|t| t.axes()[0].contains(&1.0))
        {
            return Err(self.err(
                Some("encode_tp"),
                None,
                "rows at tp = 1: TP 1 passes belong in [encode] (allowed tp: 2 and more)".into(),
            ));
        }
        let transfer = self.transfers(&doc, &provenance.link)?;
        let host_sharing = match doc.get("host_sharing") {
            None => None,
            Some(v) => Some(super::HostSharing::from_toml(
                self.file,
                self.as_table("host_sharing", v)?,
            )?),
        };
        Ok(Profile {
            origin: self.file.to_string(),
            provenance,
            time_slice_penalty,
            bandwidth_interference,
            scalars_note,
            prefill_batching,
            encode,
            prefill,
            decode,
            transfer,
            all_reduce,
            encode_tp,
            kv_land,
            host_sharing,
            encode_tp_fallbacks: Default::default(),
            tp_fallbacks: Default::default(),
            tp_priced: Default::default(),
        })
    }

    /// The `[[transfer]]` tables, one per link, one of them for the
    /// provenance's `link`.
    fn transfers(&self, doc: &toml::Table, link: &str) -> Res<Vec<Table>> {
        let arr = match doc.get("transfer") {
            Some(toml::Value::Array(a)) if !a.is_empty() => a,
            _ => {
                return Err(self.err(
                    Some("transfer"),
                    None,
                    "missing: at least one [[transfer]] table (link, unit, columns, rows)".into(),
                ))
            }
        };
        let mut transfer = Vec::new();
        for (i, v) in arr.iter().enumerate() {
            let name = format!("transfer[{}]", i + 1);
            let t = self.table(&name, Stage::Transfer, self.as_table(&name, v)?)?;
            if transfer.iter().any(|o: &Table| o.link == t.link) {
                return Err(self.err(
                    Some(&name),
                    None,
                    format!(
                        "second table for link `{}`",
                        t.link.as_deref().unwrap_or("")
                    ),
                ));
            }
            transfer.push(t);
        }
        if !transfer.iter().any(|t| t.link.as_deref() == Some(link)) {
            return Err(self.err(
                Some("transfer"),
                None,
                format!("no [[transfer]] table for the provenance's link `{}`", link),
            ));
        }
        Ok(transfer)
    }

    fn as_table<'v>(&self, name: &str, v: &'v toml::Value) -> Res<&'v toml::Table> {
        v.as_table()
            .ok_or_else(|| self.err(Some(name), None, "must be a table".into()))
    }

    fn sub_table<'v>(&self, doc: &'v toml::Table, name: &str) -> Res<&'v toml::Table> {
        match doc.get(name) {
            Some(v) => self.as_table(name, v),
            None => Err(self.err(Some(name), None, "missing table".into())),
        }
    }

    fn only_keys(&self, name: &str, t: &toml::Table, allowed: &[&str]) -> Res<()> {
        for k in t.keys() {
            if !allowed.contains(&k.as_str()) {
                return Err(self.err(
                    Some(name),
                    None,
                    format!("unknown key `{k}` (allowed: {})", allowed.join(", ")),
                ));
            }
        }
        Ok(())
    }

    fn opt_string(&self, name: &str, t: &toml::Table, key: &str) -> Res<Option<String>> {
        match t.get(key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(self.err(Some(name), None, format!("`{key}` must be a string"))),
        }
    }

    fn string(&self, name: &str, t: &toml::Table, key: &str) -> Res<String> {
        self.opt_string(name, t, key)?
            .ok_or_else(|| self.err(Some(name), None, format!("missing `{key}`")))
    }

    fn provenance(&self, t: &toml::Table) -> Res<Provenance> {
        let n = "provenance";
        self.only_keys(
            n,
            t,
            &[
                "model",
                "device",
                "link",
                "source",
                "backend",
                "driver",
                "libraries",
                "date",
                "method",
                "repetitions",
                "cores",
            ],
        )?;
        let device = self.string(n, t, "device")?;
        let known_device = GpuSpec::preset_names().contains(&device.as_str())
            || self.extra_devices.contains(&device);
        if !known_device {
            return Err(self.err(
                Some(n),
                None,
                format!(
                    "unknown device `{device}` (known: {})",
                    GpuSpec::preset_names().join(", ")
                ),
            ));
        }
        let link = self.string(n, t, "link")?;
        self.check_link(n, &link)?;
        let source_s = self.string(n, t, "source")?;
        let source = Source::parse(&source_s).ok_or_else(|| {
            self.err(
                Some(n),
                None,
                format!("unknown source `{source_s}` (allowed: roofline, measured, imported)"),
            )
        })?;
        let libraries = match t.get("libraries") {
            None => Vec::new(),
            Some(toml::Value::Array(a)) => self.strings(n, a, "libraries")?,
            Some(_) => {
                return Err(self.err(
                    Some(n),
                    None,
                    "`libraries` must be an array of strings".into(),
                ))
            }
        };
        let date = self.string(n, t, "date")?;
        let b = date.as_bytes();
        let iso = b.len() >= 10
            && b[..10].iter().enumerate().all(|(i, c)| {
                if i == 4 || i == 7 {
                    *c == b'-'
                } else {
                    c.is_ascii_digit()
                }
            });
        if !iso {
            return Err(self.err(
                Some(n),
                None,
                format!("`date` = \"{date}\" must start with YYYY-MM-DD"),
            ));
        }
        let repetitions = match t.get("repetitions") {
            Some(toml::Value::Integer(r)) if *r >= 0 && *r <= i64::from(u32::MAX) => *r as u32,
            _ => {
                return Err(self.err(
                    Some(n),
                    None,
                    "`repetitions` must be an integer ≥ 0 (0 for computed profiles)".into(),
                ))
            }
        };
        let cores =
            match t.get("cores") {
                None => None,
                Some(toml::Value::Integer(c)) if *c >= 1 && *c <= 1 << 20 => Some(*c as u32),
                Some(_) => return Err(self.err(
                    Some(n),
                    None,
                    "`cores` must be an integer from 1 to 1048576 (the measuring host's CPU cores)"
                        .into(),
                )),
            };
        let model = self.string(n, t, "model")?;
        if model.is_empty() {
            return Err(self.err(Some(n), None, "`model` must not be empty".into()));
        }
        Ok(Provenance {
            model,
            device,
            link,
            source,
            backend: self.opt_string(n, t, "backend")?.unwrap_or_default(),
            driver: self.opt_string(n, t, "driver")?.unwrap_or_default(),
            libraries,
            date,
            method: self.string(n, t, "method")?,
            repetitions,
            cores,
        })
    }

    fn check_link(&self, name: &str, link: &str) -> Res<()> {
        if LinkSpec::preset_names().contains(&link) || self.extra_links.iter().any(|l| l == link) {
            Ok(())
        } else {
            Err(self.err(
                Some(name),
                None,
                format!(
                    "unknown link `{link}` (known: {})",
                    LinkSpec::preset_names().join(", ")
                ),
            ))
        }
    }

    fn table(&self, name: &str, stage: Stage, t: &toml::Table) -> Res<Table> {
        let mut keys = vec!["unit", "columns", "rows"];
        if stage == Stage::Transfer {
            keys.push("link");
        }
        self.only_keys(name, t, &keys)?;
        let link = if stage == Stage::Transfer {
            let l = self.string(name, t, "link")?;
            self.check_link(name, &l)?;
            Some(l)
        } else {
            None
        };
        let unit_s = self.string(name, t, "unit")?;
        let unit = TimeUnit::parse(&unit_s).ok_or_else(|| {
            self.err(
                Some(name),
                None,
                format!("unknown unit `{unit_s}` (allowed: s, ms, us)"),
            )
        })?;
        let columns: Vec<String> = match t.get("columns") {
            Some(toml::Value::Array(a)) => self.strings(name, a, "columns")?,
            _ => {
                return Err(self.err(
                    Some(name),
                    None,
                    "missing `columns` (an array of column names)".into(),
                ))
            }
        };
        let axes = stage.axes();
        for (i, a) in axes.iter().enumerate() {
            if columns.get(i).map(String::as_str) != Some(*a) {
                return Err(self.err(
                    Some(name),
                    None,
                    format!(
                        "missing axis `{a}`: columns must start with {} (found {:?})",
                        axes.join(", "),
                        columns
                    ),
                ));
            }
        }
        let mut seen: Vec<&str> = Vec::new();
        for c in &columns[axes.len()..] {
            if c != "median" && !stage.optional_columns().contains(&c.as_str()) {
                return Err(self.err(
                    Some(name),
                    None,
                    format!(
                        "unknown column `{c}` (after the axes: median, {})",
                        stage.optional_columns().join(", ")
                    ),
                ));
            }
            if seen.contains(&c.as_str()) {
                return Err(self.err(Some(name), None, format!("column `{c}` given twice")));
            }
            seen.push(c);
        }
        if !seen.contains(&"median") {
            return Err(self.err(Some(name), None, "missing column `median`".into()));
        }
        let raw = match t.get("rows") {
            Some(toml::Value::Array(a)) if !a.is_empty() => a,
            _ => {
                return Err(self.err(
                    Some(name),
                    None,
                    "missing `rows` (a non-empty array of rows)".into(),
                ))
            }
        };
        let mut rows = Vec::with_capacity(raw.len());
        for (i, r) in raw.iter().enumerate() {
            let row = Some(i + 1);
            let cells = r
                .as_array()
                .ok_or_else(|| self.err(Some(name), row, "must be an array of numbers".into()))?;
            if cells.len() != columns.len() {
                return Err(self.err(
                    Some(name),
                    row,
                    format!(
                        "has {} values, the columns are {} ({})",
                        cells.len(),
                        columns.len(),
                        columns.join(", ")
                    ),
                ));
            }
            let vals = cells
                .iter()
                .zip(&columns)
                .map(|(v, c)| {
                    number(v).ok_or_else(|| {
                        self.err(
                            Some(name),
                            row,
                            format!("`{c}` must be a number, found {v}"),
                        )
                    })
                })
                .collect::<Res<Vec<f64>>>()?;
            rows.push(vals);
        }
        self.check_rows(name, stage, &columns, &rows)?;
        Ok(Table::build(stage, link, unit, columns, rows))
    }

    /// Values in range, rows sorted strictly ascending by the axes, a full grid,
    /// latencies that do not fall along work axes.
    fn check_rows(
        &self,
        name: &str,
        stage: Stage,
        columns: &[String],
        rows: &[Vec<f64>],
    ) -> Res<()> {
        self.check_cells(name, stage, columns, rows)?;
        let uniq = self.check_full_grid(name, stage, rows)?;
        self.check_monotone(name, stage, columns, rows, &uniq)
    }

    /// Each row: finite values, axes in range, `p90` not below `median`,
    /// `t_pass + t_pre` within `median`, and the axes strictly after the
    /// previous row's.
    fn check_cells(
        &self,
        name: &str,
        stage: Stage,
        columns: &[String],
        rows: &[Vec<f64>],
    ) -> Res<()> {
        let axes = stage.axes();
        let na = axes.len();
        let col = |c: &str| columns.iter().position(|x| x == c);
        for (i, r) in rows.iter().enumerate() {
            let row = Some(i + 1);
            for (j, (v, c)) in r.iter().zip(columns).enumerate() {
                if !v.is_finite() {
                    return Err(self.err(
                        Some(name),
                        row,
                        format!("`{c}` = {v} is not a finite number"),
                    ));
                }
                if j < na {
                    let ok = if is_integer_axis(c) {
                        *v >= 1.0 && v.fract() == 0.0 && *v < 9.0e15
                    } else {
                        *v > 0.0 && *v <= 1.0
                    };
                    if !ok {
                        let allowed = if is_integer_axis(c) {
                            "an integer ≥ 1"
                        } else {
                            "in (0, 1]"
                        };
                        return Err(self.err(
                            Some(name),
                            row,
                            format!("axis `{c}` = {v} must be {allowed}"),
                        ));
                    }
                } else if *v < 0.0 {
                    return Err(self.err(
                        Some(name),
                        row,
                        format!("latency `{c}` = {v} is negative"),
                    ));
                }
            }
            let m = col("median").map(|k| r[k]).unwrap_or(0.0);
            if let Some(k) = col("p90") {
                if r[k] < m {
                    return Err(self.err(
                        Some(name),
                        row,
                        format!("p90 {} is below median {m}", r[k]),
                    ));
                }
            }
            let split: f64 = ["t_pass", "t_pre"]
                .iter()
                .filter_map(|c| col(c).map(|k| r[k]))
                .sum();
            if split > m * (1.0 + 1e-9) {
                return Err(self.err(
                    Some(name),
                    row,
                    format!("t_pass + t_pre = {split} exceeds median {m}"),
                ));
            }
            if i > 0 {
                let prev = &rows[i - 1];
                if r[..na].partial_cmp(&prev[..na]) != Some(std::cmp::Ordering::Greater) {
                    return Err(self.err(
                        Some(name),
                        row,
                        format!(
                            "axes ({}) = {:?} do not come after row {} {:?}: rows must be sorted strictly ascending by ({})",
                            axes.join(", "),
                            &r[..na],
                            i,
                            &prev[..na],
                            axes.join(", ")
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The rows are the full grid of their distinct axis values, in order;
    /// returns those values per axis, ascending.
    fn check_full_grid(&self, name: &str, stage: Stage, rows: &[Vec<f64>]) -> Res<Vec<Vec<f64>>> {
        let na = stage.axes().len();
        // full grid: the rows must be exactly the product of the distinct axis values
        let mut uniq: Vec<Vec<f64>> = vec![Vec::new(); na];
        for r in rows {
            for (d, u) in uniq.iter_mut().enumerate() {
                if !u.contains(&r[d]) {
                    u.push(r[d]);
                }
            }
        }
        for u in &mut uniq {
            u.sort_by(f64::total_cmp);
        }
        let mut idx = vec![0usize; na];
        for (i, r) in rows.iter().enumerate() {
            let want: Vec<f64> = idx.iter().enumerate().map(|(d, &k)| uniq[d][k]).collect();
            if r[..na] != want[..] {
                return Err(self.err(
                    Some(name),
                    Some(i + 1),
                    format!(
                        "expected the axis point {want:?} here: a table must give every combination of its axis values ({}), sorted",
                        uniq.iter().map(|u| format!("{u:?}")).collect::<Vec<_>>().join(" × ")
                    ),
                ));
            }
            for d in (0..na).rev() {
                idx[d] += 1;
                if idx[d] < uniq[d].len() {
                    break;
                }
                idx[d] = 0;
            }
        }
        let total: usize = uniq.iter().map(Vec::len).product();
        if rows.len() != total {
            let want: Vec<f64> = idx.iter().enumerate().map(|(d, &k)| uniq[d][k]).collect();
            return Err(self.err(
                Some(name),
                None,
                format!(
                    "missing the rows from axis point {want:?} on: {} of {total} grid points given",
                    rows.len()
                ),
            ));
        }
        Ok(uniq)
    }

    /// Latency (`median`) does not fall along a work axis by more than
    /// [`MONOTONE_TOLERANCE`]; `uniq` is each axis's distinct values.
    fn check_monotone(
        &self,
        name: &str,
        stage: Stage,
        columns: &[String],
        rows: &[Vec<f64>],
        uniq: &[Vec<f64>],
    ) -> Res<()> {
        let axes = stage.axes();
        let na = axes.len();
        let col = |c: &str| columns.iter().position(|x| x == c);
        // monotone along work axes
        let Some(mc) = col("median") else {
            return Ok(());
        };
        let mut strides = vec![1usize; na];
        for d in (0..na.saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * uniq[d + 1].len();
        }
        for (d, a) in axes.iter().enumerate() {
            if !is_work_axis(stage, a) {
                continue;
            }
            for (i, r) in rows.iter().enumerate() {
                let k = (i / strides[d]) % uniq[d].len();
                if k == 0 {
                    continue;
                }
                let p = &rows[i - strides[d]];
                if r[mc] < p[mc] * (1.0 - MONOTONE_TOLERANCE) {
                    return Err(self.err(
                        Some(name),
                        Some(i + 1),
                        format!(
                            "non-monotone latency: median {} at {a} = {} is below {} at {a} = {} (row {}); latency may not fall as {a} grows (tolerance {} %)",
                            r[mc], r[d], p[mc], p[d], i + 1 - strides[d], MONOTONE_TOLERANCE * 100.0
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

fn number(v: &toml::Value) -> Option<f64> {
    match v {
        toml::Value::Integer(i) => Some(*i as f64),
        toml::Value::Float(f) => Some(*f),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::StageCost;
    use easerve_model::ItemTokens;

    /// A hand-written measured profile in ms without the t_pass/t_pre split.
    const MEASURED: &str = r#"format = 1

[provenance]
model = "llava-v1.6-34b"
device = "rtx-6000-ada"
link = "pcie4-x16"
source = "measured"
backend = "vLLM 0.8.5"
driver = "550.54, CUDA 12.4"
libraries = ["torch 2.5.1"]
date = "2025-03-01"
method = "CUDA events around the forward pass, 3 warm-up runs"
repetitions = 20

[scalars]
time_slice_penalty = 0.1
bandwidth_interference = 0.05

[encode]
unit = "ms"
columns = ["batch", "encoder_tokens", "sm_level", "median", "p90"]
rows = [
  [1, 576, 0.5, 20.0, 22.0],
  [1, 576, 1.0, 12.0, 13.0],
  [4, 576, 0.5, 60.0, 70.0],
  [4, 576, 1.0, 35.0, 40.0],
]

[prefill]
unit = "ms"
columns = ["tokens", "tp", "sm_level", "median"]
rows = [
  [512, 2, 1.0, 40.0],
  [4096, 2, 1.0, 200.0],
]

[decode]
unit = "ms"
columns = ["batch", "context_tokens", "tp", "median"]
rows = [
  [1, 1024, 4, 20.0],
  [1, 65536, 4, 24.0],
  [64, 1024, 4, 22.0],
  [64, 65536, 4, 30.0],
]

[[transfer]]
link = "pcie4-x16"
unit = "us"
columns = ["bytes", "median"]
rows = [
  [1024, 15.0],
  [1048576, 57.0],
]
"#;

    #[test]
    fn measured_profile_reads_units_and_without_split_times_all_as_gpu() {
        let p = Profile::from_toml_str(MEASURED, "m.toml").unwrap();
        let item = ItemTokens {
            encoder_tokens: 576,
            llm_tokens: 576,
            attn_span: 576,
        };
        let t = StageCost::encode(&p, &[item; 4], 0.5);
        assert!((t.t_gpu - 0.060).abs() < 1e-12 && t.t_pass == 0.0 && t.t_pre == 0.0);
        assert!((p.prefill(&[512], 2.into(), 1.0) - 0.040).abs() < 1e-12);
        assert!((StageCost::transfer(&p, 1024.0) - 15e-6).abs() < 1e-15);
        // geometric midpoint of a power law in batch: 2 items between 12 and 35 ms
        let t2 = StageCost::encode(&p, &[item; 2], 1.0).total();
        assert!((t2 - (12.0f64 * 35.0).sqrt() * 1e-3).abs() < 1e-12, "{t2}");
        assert_eq!(p.provenance.source, Source::Measured);
        assert_eq!(p.provenance.repetitions, 20);
        let again = Profile::from_toml_str(&p.to_toml_string(), "x").unwrap();
        assert_eq!(again.to_toml_string(), p.to_toml_string());
    }

    /// A CPU profile's measuring host's cores: read, written back, and a
    /// bad count refused naming the field.
    #[test]
    fn the_measuring_hosts_cores_round_trip() {
        let p = Profile::from_toml_str(MEASURED, "m.toml").unwrap();
        assert_eq!(p.provenance.cores, None);
        let with = MEASURED.replacen("repetitions = 20", "repetitions = 20\ncores = 2", 1);
        let p = Profile::from_toml_str(&with, "c.toml").unwrap();
        assert_eq!(p.provenance.cores, Some(2));
        let again = Profile::from_toml_str(&p.to_toml_string(), "x").unwrap();
        assert_eq!(again.provenance.cores, Some(2));
        let e = bad("repetitions = 20", "repetitions = 20\ncores = 0");
        assert!(e.contains("[provenance]") && e.contains("`cores`"), "{e}");
    }

    fn bad(from: &str, to: &str) -> String {
        assert!(MEASURED.contains(from), "{from}");
        Profile::from_toml_str(&MEASURED.replacen(from, to, 1), "bad.toml")
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn bad_profiles_name_the_file_table_and_row() {
        let cases = [
            // missing axis
            (
                r#"columns = ["batch", "encoder_tokens", "sm_level", "median", "p90"]"#,
                r#"columns = ["batch", "sm_level", "median", "p90"]"#,
                "table [encode]: missing axis `encoder_tokens`",
            ),
            // non-monotone axis (rows out of order)
            (
                "[4, 576, 0.5, 60.0, 70.0],\n  [4, 576, 1.0, 35.0, 40.0]",
                "[4, 576, 1.0, 35.0, 40.0],\n  [4, 576, 0.5, 60.0, 70.0]",
                "table [encode], row 4: axes",
            ),
            // non-monotone latency along a work axis
            (
                "[4096, 2, 1.0, 200.0]",
                "[4096, 2, 1.0, 20.0]",
                "table [prefill], row 2: non-monotone latency",
            ),
            // negative latency
            (
                "[64, 65536, 4, 30.0]",
                "[64, 65536, 4, -30.0]",
                "table [decode], row 4: latency `median` = -30 is negative",
            ),
            // NaN
            (
                "[1, 576, 1.0, 12.0, 13.0]",
                "[1, 576, 1.0, nan, 13.0]",
                "table [encode], row 2: `median` = NaN is not a finite number",
            ),
            // unknown unit
            (
                "unit = \"us\"",
                "unit = \"ns\"",
                "table [transfer[1]]: unknown unit `ns` (allowed: s, ms, us)",
            ),
            // unknown device
            (
                "device = \"rtx-6000-ada\"",
                "device = \"rtx-4090\"",
                "table [provenance]: unknown device `rtx-4090`",
            ),
            // missing grid point
            (
                "  [4, 576, 0.5, 60.0, 70.0],\n",
                "",
                "table [encode], row 3: expected the axis point [4.0, 576.0, 0.5] here",
            ),
            // wrong row length
            (
                "[512, 2, 1.0, 40.0]",
                "[512, 2, 40.0]",
                "table [prefill], row 1: has 3 values",
            ),
            // p90 below median
            (
                "[1, 576, 0.5, 20.0, 22.0]",
                "[1, 576, 0.5, 20.0, 2.0]",
                "table [encode], row 1: p90 2 is below median 20",
            ),
            // sm level out of range
            (
                "[512, 2, 1.0, 40.0]",
                "[512, 2, 1.5, 40.0]",
                "table [prefill], row 1: axis `sm_level` = 1.5 must be in (0, 1]",
            ),
            // unknown source
            (
                "source = \"measured\"",
                "source = \"guessed\"",
                "unknown source `guessed`",
            ),
        ];
        for (from, to, want) in cases {
            let e = bad(from, to);
            assert!(e.starts_with("profile bad.toml"), "{e}");
            assert!(e.contains(want), "want {want:?} in {e}");
        }
        let e = Profile::from_toml_str("format = 1\n", "x.toml").unwrap_err();
        assert_eq!(
            e.to_string(),
            "profile x.toml, table [provenance]: missing table"
        );
    }
}
