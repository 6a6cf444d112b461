//! Measured kernel tables: NVIDIA aiconfigurator's vLLM kernel latencies.
//!
//! Source: github.com/ai-dynamo/aiconfigurator, `aic-core/src/aiconfigurator_core/systems/`
//! (Apache-2.0), kept outside this repository in `../shared/data/aiconfigurator/`
//! (commit [`AIC_COMMIT`]). Layout `data/<gpu>/<op family>/<framework>/<version>/<table>.parquet`
//! plus `<gpu>.yaml`; every table has a `latency` column in **milliseconds per kernel
//! call**. [`KernelTables::load`] reads, per GPU:
//!
//! | table | kept rows | trie axes |
//! |---|---|---|
//! | `gemm_perf` | `gemm_dtype` = the requested dtype | `m, n, k` |
//! | `context_attention_perf` | bf16 KV cache, no sliding window, the most-measured kernel source | `head_dim, kv_heads, heads, batch, isl` |
//! | `generation_attention_perf` | same | `head_dim, kv_heads, heads, batch, context` (`isl + step`) |
//! | `encoder_attention_perf` | bf16 (absent on the A100) | `head_dim, heads, batch, isl` |
//! | `custom_allreduce_perf` | bf16, `vllm_graph` and `vllm_eager` backends | `num_gpus, message_size` (elements) |
//!
//! Each table's points become a [`Trie`] (holes bridged by log-log interpolation),
//! sampled on a dense grid made monotone along every axis ([`Trie::densify`]) and
//! interpolated multi-linearly on log axes ([`crate::interp::Grid`], edge cells
//! extended outside it and flagged). NCCL
//! tables are not read: vLLM's custom all-reduce is measured up to 2^29 elements,
//! beyond any activation here.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use parquet::file::reader::{FileReader, SerializedFileReader};

use crate::interp::Grid;
use crate::trie::Trie;

/// Upstream commit of the aiconfigurator data (from `../shared/data/aiconfigurator/README.md`).
pub const AIC_COMMIT: &str = "095f58a51c4c (2026-08-21)";

/// GPUs with aiconfigurator tables: `(easerve GPU preset, aiconfigurator system name)`.
pub const AIC_GPUS: &[(&str, &str)] = &[
    ("h100-sxm", "h100_sxm"),
    ("h200-sxm", "h200_sxm"),
    ("b200-sxm", "b200_sxm"),
    ("l40s", "l40s"),
    ("rtx-pro-6000", "rtx_pro_6000_server"),
    ("a100-sxm4-80gb", "a100_sxm"),
];

/// GEMM dtypes the tables hold (aiconfigurator's names); easerve's models are BF16.
pub const AIC_DTYPES: &[&str] = &["bfloat16", "fp8", "fp8_block"];

/// A bad or missing kernel table: the file and what is wrong.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelError {
    /// The file or directory.
    pub file: String,
    /// What is wrong, and what is allowed.
    pub message: String,
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel tables {}: {}", self.file, self.message)
    }
}

impl std::error::Error for KernelError {}

fn err(file: &Path, message: impl Into<String>) -> KernelError {
    KernelError {
        file: file.display().to_string(),
        message: message.into(),
    }
}

/// Where the tables came from (into every report's notes and imported profiles).
#[derive(Clone, Debug, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct KernelProvenance {
    /// aiconfigurator system name (`h100_sxm`).
    pub system: String,
    /// `device` column (`NVIDIA H100 80GB HBM3`).
    pub device: String,
    /// Framework and version per table (`gemm: vLLM 0.24.0`).
    pub versions: BTreeMap<String, String>,
    /// Kernel source per table (`gemm: torch.nn.functional.linear`).
    pub kernel_sources: BTreeMap<String, String>,
    /// The data directory read.
    pub dir: String,
}

/// The GPU's figures from `<gpu>.yaml` that the cost model uses.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SystemSpec {
    /// HBM bandwidth, bytes/s (`gpu.mem_bw`).
    pub mem_bw: f64,
    /// aiconfigurator's empirical fraction of `mem_bw` that memory-bound kernels reach
    /// (`gpu.mem_bw_empirical_scaling_factor`).
    pub mem_bw_scaling: f64,
    /// Fixed seconds per memory-bound kernel (`gpu.mem_empirical_constant_latency`).
    pub mem_latency_s: f64,
    /// Dense BF16 tensor FLOP/s (`gpu.bfloat16_tc_flops`).
    pub bf16_flops: f64,
    /// Memory capacity, bytes (`gpu.mem_capacity`).
    pub mem_capacity: f64,
    /// `gpu.sm_version` (90 = Hopper).
    pub sm_version: u32,
}

/// Every measured table of one GPU, as tries of seconds per call.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct KernelTables {
    /// Where they came from.
    pub provenance: KernelProvenance,
    /// The system YAML's figures.
    pub system: SystemSpec,
    /// GEMM seconds over `(m, n, k)`.
    pub gemm: Grid,
    /// Causal prefill attention seconds over `(head_dim, kv_heads, heads, batch, isl)`.
    pub context: Grid,
    /// Decode attention seconds over `(head_dim, kv_heads, heads, batch, context)`.
    pub generation: Grid,
    /// Non-causal encoder attention seconds over `(head_dim, heads, batch, isl)`; `None`
    /// where the GPU has no such table (A100).
    pub encoder: Option<Grid>,
    /// All-reduce seconds over `(num_gpus, elements)`, CUDA-graph backend.
    pub allreduce_graph: Grid,
    /// All-reduce seconds over `(num_gpus, elements)`, eager backend.
    pub allreduce_eager: Grid,
    /// NCCL all-gather and reduce-scatter seconds over `(num_gpus, elements)`
    /// (`comm/nccl/<version>/nccl_perf.parquet`, `half` rows; `message_size`
    /// read as elements, as the custom all-reduce table's); `None` where the
    /// GPU has no NCCL table.
    pub nccl: Option<[Grid; 2]>,
    /// FP8 activation quantization seconds over `(m, k)`: the dynamic scale
    /// (`computescale_perf`, measured as dynamic minus static quant) and the
    /// scaled quant (`scale_matrix_perf`); read for an FP8 GEMM dtype only.
    pub quant: Option<[Grid; 2]>,
    /// The GEMM dtype read (`bfloat16`, `fp8`).
    pub gemm_dtype: String,
    /// The attention tables' KV-cache dtype read.
    pub kv_dtype: String,
    /// Points raised by the monotone envelope, per table (reported once).
    pub raised: BTreeMap<String, usize>,
}

/// The aiconfigurator system name of an easerve GPU preset, if it has tables.
pub fn aic_system(gpu: &str) -> Option<&'static str> {
    AIC_GPUS.iter().find(|(g, _)| *g == gpu).map(|(_, s)| *s)
}

/// `../shared/data/aiconfigurator` relative to the workspace root (where the tests
/// and a checkout find it).
pub fn default_data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/aiconfigurator")
}

/// The data directory to use: [`locate_data_dir`] without a scenario.
pub fn find_data_dir() -> Option<PathBuf> {
    locate_data_dir(None).map(|f| f.dir)
}

/// Where [`locate_data_dir`] found the aiconfigurator data, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FoundData {
    /// The folder that holds `data/` (or `$EASERVE_AICONFIGURATOR_DIR` as given).
    pub dir: PathBuf,
    /// Which rule found it, for a report's notes: `through $EASERVE_AICONFIGURATOR_DIR`,
    /// `beside the scenario's folder (…)`, `beside the working directory (…)`
    /// or `in the checkout easerve was built from`. No absolute path, so the
    /// same run reports the same note on every machine.
    pub how: String,
}

/// The aiconfigurator data, looked for in this order (the first that holds
/// `data/`, except the variable, which is taken as given):
/// 1. `$EASERVE_AICONFIGURATOR_DIR`;
/// 2. beside the scenario's folder: `shared/data/aiconfigurator` next to the
///    folder `scenario` sits in, or next to that folder's parent (a scenario
///    in a checkout's `scenarios/`, the checkout beside `shared/`);
/// 3. beside the working directory: `../shared/data/aiconfigurator`;
/// 4. the checkout easerve was built from ([`default_data_dir`]), so an
///    installed binary still finds the data its build saw.
///
/// `None` when none holds `data/`.
pub fn locate_data_dir(scenario: Option<&Path>) -> Option<FoundData> {
    const REL: &str = "shared/data/aiconfigurator";
    if let Some(d) = std::env::var_os("EASERVE_AICONFIGURATOR_DIR") {
        return Some(FoundData {
            dir: PathBuf::from(d),
            how: "through $EASERVE_AICONFIGURATOR_DIR".into(),
        });
    }
    let mut candidates: Vec<(PathBuf, String)> = Vec::new();
    if let Some(folder) = scenario.and_then(Path::parent) {
        let folder = if folder.as_os_str().is_empty() {
            Path::new(".")
        } else {
            folder
        };
        candidates.push((
            folder.join("..").join(REL),
            format!("beside the scenario's folder (../{REL})"),
        ));
        candidates.push((
            folder.join("../..").join(REL),
            format!("beside the scenario's folder (../../{REL})"),
        ));
    }
    candidates.push((
        PathBuf::from("..").join(REL),
        format!("beside the working directory (../{REL})"),
    ));
    candidates.push((
        default_data_dir(),
        "in the checkout easerve was built from".into(),
    ));
    candidates
        .into_iter()
        .find(|(d, _)| d.join("data").is_dir())
        .map(|(dir, how)| FoundData { dir, how })
}

/// One column of a table: numbers (integers read as `f64`) or text interned in a
/// per-column dictionary; `None` where the file stores a null.
enum Col {
    Num(Vec<Option<f64>>),
    Text(Vec<Option<u32>>, Vec<String>),
}

/// A parquet table read column by column (typed column readers: no per-row
/// allocation), with its path for error messages.
struct Table {
    path: PathBuf,
    len: usize,
    columns: Vec<(String, Col)>,
}

/// Spread `values` (the non-null ones) over `defs` (definition levels; a value
/// where the level is `max_def`), or take them as they are for a required column.
fn spread<T: Copy>(values: &[T], defs: &[i16], max_def: i16, n: usize) -> Vec<Option<T>> {
    if max_def == 0 {
        return values.iter().take(n).map(|v| Some(*v)).collect();
    }
    let mut it = values.iter();
    defs.iter()
        .take(n)
        .map(|d| {
            if *d == max_def {
                it.next().copied()
            } else {
                None
            }
        })
        .collect()
}

impl Table {
    fn read(path: PathBuf) -> Result<Table, KernelError> {
        use parquet::column::reader::ColumnReader;
        crate::input::check_regular(&path).map_err(|e| err(&path, format!("cannot open: {e}")))?;
        let file = File::open(&path).map_err(|e| err(&path, format!("cannot open: {e}")))?;
        let reader = SerializedFileReader::new(file)
            .map_err(|e| err(&path, format!("not a readable parquet file: {e}")))?;
        let meta = reader.metadata();
        let schema = meta.file_metadata().schema_descr();
        let mut columns: Vec<(String, Col)> = Vec::with_capacity(schema.num_columns());
        let mut len = 0usize;
        for g in 0..reader.num_row_groups() {
            let group = reader
                .get_row_group(g)
                .map_err(|e| err(&path, format!("cannot read row group {g}: {e}")))?;
            let n = usize::try_from(group.metadata().num_rows()).unwrap_or(0);
            for c in 0..schema.num_columns() {
                let desc = schema.column(c);
                let max_def = desc.max_def_level();
                let cname = desc.name().to_string();
                let corrupt = |e: parquet::errors::ParquetError| {
                    err(
                        &path,
                        format!("column `{cname}`, row group {g}: corrupt: {e}"),
                    )
                };
                // every column of a row group must give all its rows, or the
                // columns would no longer line up
                let check = |res: parquet::errors::Result<(usize, usize, usize)>| {
                    let (records, _, _) = res.map_err(corrupt)?;
                    if records == n {
                        Ok(())
                    } else {
                        Err(err(
                            &path,
                            format!("column `{cname}`, row group {g}: {records} of {n} rows (truncated file?)"),
                        ))
                    }
                };
                let mut defs: Vec<i16> = Vec::new();
                let defs_opt = (max_def > 0).then_some(&mut defs);
                // a numeric column of physical type `$t`, as `f64`
                macro_rules! numbers {
                    ($r:ident, $t:ty, $to_f64:expr) => {{
                        let mut $r = $r;
                        let mut v: Vec<$t> = Vec::new();
                        check($r.read_records(n, defs_opt, None, &mut v))?;
                        let v: Vec<f64> = v.into_iter().map($to_f64).collect();
                        Col::Num(spread(&v, &defs, max_def, n))
                    }};
                }
                let col = match group.get_column_reader(c).map_err(corrupt)? {
                    ColumnReader::Int32ColumnReader(r) => numbers!(r, i32, f64::from),
                    ColumnReader::Int64ColumnReader(r) => numbers!(r, i64, |x| x as f64),
                    ColumnReader::FloatColumnReader(r) => numbers!(r, f32, f64::from),
                    ColumnReader::DoubleColumnReader(r) => numbers!(r, f64, |x| x),
                    ColumnReader::ByteArrayColumnReader(mut r) => {
                        let mut v = Vec::new();
                        check(r.read_records(n, defs_opt, None, &mut v))?;
                        let mut dict: Vec<String> = Vec::new();
                        let mut ids: Vec<u32> = Vec::with_capacity(v.len());
                        for b in &v {
                            let text = b.as_utf8().map_err(corrupt)?;
                            let id = match dict.iter().position(|d| d == text) {
                                Some(i) => i,
                                None => {
                                    dict.push(text.to_string());
                                    dict.len() - 1
                                }
                            };
                            ids.push(id as u32);
                        }
                        Col::Text(spread(&ids, &defs, max_def, n), dict)
                    }
                    // booleans and fixed-size binaries are not used by any table
                    _ => continue,
                };
                let name = desc.name().to_string();
                match columns.iter_mut().find(|(k, _)| *k == name) {
                    None => columns.push((name, col)),
                    Some((_, have)) => have.append(col, &path)?,
                }
            }
            len += n;
        }
        if len == 0 {
            return Err(err(&path, "the table has no rows"));
        }
        Ok(Table { path, len, columns })
    }

    fn len(&self) -> usize {
        self.len
    }

    fn column(&self, i: usize, name: &str) -> Result<&Col, KernelError> {
        self.columns
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| c)
            .ok_or_else(|| err(&self.path, format!("row {i}: no column `{name}`")))
    }

    fn has(&self, name: &str) -> bool {
        self.columns.iter().any(|(n, _)| n == name)
    }

    fn num(&self, i: usize, name: &str) -> Result<f64, KernelError> {
        match self.column(i, name)? {
            Col::Num(v) => v.get(i).copied().flatten().ok_or_else(|| {
                err(
                    &self.path,
                    format!("row {i}: column `{name}` is null, not a number"),
                )
            }),
            Col::Text(..) => Err(err(
                &self.path,
                format!("row {i}: column `{name}` is text, not a number"),
            )),
        }
    }

    fn text(&self, i: usize, name: &str) -> Result<&str, KernelError> {
        match self.column(i, name)? {
            Col::Text(ids, dict) => ids
                .get(i)
                .copied()
                .flatten()
                .map(|id| dict[id as usize].as_str())
                .ok_or_else(|| {
                    err(
                        &self.path,
                        format!("row {i}: column `{name}` is null, not text"),
                    )
                }),
            Col::Num(_) => Err(err(
                &self.path,
                format!("row {i}: column `{name}` is a number, not text"),
            )),
        }
    }

    /// Latency in seconds (the column is milliseconds), checked finite and > 0.
    fn latency_s(&self, i: usize) -> Result<f64, KernelError> {
        let ms = self.num(i, "latency")?;
        if ms.is_finite() && ms > 0.0 {
            Ok(ms * 1e-3)
        } else {
            Err(err(
                &self.path,
                format!("row {i}: latency {ms} ms (allowed: finite and > 0)"),
            ))
        }
    }

    fn first_text(&self, name: &str) -> String {
        self.text(0, name).map(str::to_string).unwrap_or_default()
    }
}

impl Col {
    /// Append the next row group's values of the same column.
    fn append(&mut self, other: Col, path: &Path) -> Result<(), KernelError> {
        match (self, other) {
            (Col::Num(a), Col::Num(b)) => a.extend(b),
            (Col::Text(a, dict), Col::Text(b, d2)) => {
                for id in b {
                    a.push(match id {
                        None => None,
                        Some(j) => {
                            let t = &d2[j as usize];
                            Some(match dict.iter().position(|d| d == t) {
                                Some(k) => k as u32,
                                None => {
                                    dict.push(t.clone());
                                    (dict.len() - 1) as u32
                                }
                            })
                        }
                    });
                }
            }
            _ => return Err(err(path, "a column changes type between row groups")),
        }
        Ok(())
    }
}

/// The single `<version>` directory under `dir` (`gemm/vllm/0.24.0`), or an error.
fn version_dir(dir: &Path) -> Result<(PathBuf, String), KernelError> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| err(dir, format!("missing ({e})")))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    versions.sort();
    let v = versions
        .pop()
        .ok_or_else(|| err(dir, "no version directory"))?;
    let name = v
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok((v, name))
}

/// The measured points as a dense monotone grid ([`Trie::densify`]), after
/// dropping outliers ([`drop_outliers`]), and how many points were dropped
/// plus how many grid points the envelope raised.
fn trie(
    path: &Path,
    points: Vec<(Vec<f64>, f64)>,
    what: &str,
) -> Result<(Grid, usize), KernelError> {
    if points.is_empty() {
        return Err(err(path, format!("no rows for {what}")));
    }
    let (points, dropped) = drop_outliers(points);
    Trie::new(points)
        .map(|t| t.densify())
        .map(|(g, raised)| (g, raised + dropped))
        .ok_or_else(|| err(path, format!("{what}: a key is not finite and > 0")))
}

/// A measured kernel is an outlier when the next measured point along some
/// axis — the same kernel with more work in one dimension and no less in
/// any — took less than half as long ([`OUTLIER_RATIO`]): more work cannot
/// take less time, so the point is a glitch of the measurement (e.g. H100
/// fp8 GEMM `m 17, n 2048, k 768`: 56.6 µs where `k 1024` took 8 µs). Left in,
/// the monotone envelope would raise every larger shape to it. Returns the
/// points kept and how many were dropped.
fn drop_outliers(points: Vec<(Vec<f64>, f64)>) -> (Vec<(Vec<f64>, f64)>, usize) {
    let dims = points.first().map_or(0, |(k, _)| k.len());
    // the sorted distinct values of every axis, and each point by its key
    let mut axes: Vec<Vec<u64>> = vec![Vec::new(); dims];
    let mut at: std::collections::HashMap<Vec<u64>, f64> =
        std::collections::HashMap::with_capacity(points.len());
    for (k, v) in &points {
        let bits: Vec<u64> = k.iter().map(|x| x.to_bits()).collect();
        for (a, b) in axes.iter_mut().zip(&bits) {
            a.push(*b);
        }
        at.insert(bits, *v);
    }
    for a in &mut axes {
        a.sort_by(|x, y| f64::from_bits(*x).total_cmp(&f64::from_bits(*y)));
        a.dedup();
    }
    let before = points.len();
    let kept: Vec<(Vec<f64>, f64)> = points
        .into_iter()
        .filter(|(k, v)| {
            let bits: Vec<u64> = k.iter().map(|x| x.to_bits()).collect();
            !(0..dims).any(|d| {
                let i = axes[d].partition_point(|x| f64::from_bits(*x) <= k[d]);
                axes[d].get(i).is_some_and(|next| {
                    let mut nb = bits.clone();
                    nb[d] = *next;
                    at.get(&nb).is_some_and(|w| *w * OUTLIER_RATIO < *v)
                })
            })
        })
        .collect();
    let dropped = before - kept.len();
    (kept, dropped)
}

/// How much faster a point with more work must be for the smaller one to
/// count as an outlier ([`drop_outliers`]): 2×, well above the few-percent
/// run-to-run noise of the tables' repeated measurements.
pub const OUTLIER_RATIO: f64 = 2.0;

/// The most frequent value of `col` among `rows` passing `keep`.
fn most_common(t: &Table, col: &str, keep: impl Fn(usize) -> bool) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..t.len() {
        if keep(i) {
            *counts
                .entry(t.text(i, col).unwrap_or_default().to_string())
                .or_default() += 1;
        }
    }
    counts
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(s, _)| s)
        .unwrap_or_default()
}

/// The state of one [`KernelTables::load_with`]: the GPU's data folder, the
/// dtypes asked for, and the provenance and raised-row counts gathered so far.
struct Loader<'a> {
    data: PathBuf,
    dtype: &'a str,
    kv_dtype: &'a str,
    prov: KernelProvenance,
    raised: BTreeMap<String, usize>,
}

impl Loader<'_> {
    /// The GEMM table's rows of the asked dtype (also records the device).
    fn gemm(&mut self) -> Result<Grid, KernelError> {
        let dtype = self.dtype;
        let (gdir, gver) = version_dir(&self.data.join("gemm").join("vllm"))?;
        let gt = Table::read(gdir.join("gemm_perf.parquet"))?;
        let mut dtypes = std::collections::BTreeSet::new();
        let mut pts = Vec::new();
        for i in 0..gt.len() {
            let d = gt.text(i, "gemm_dtype")?;
            if d == dtype {
                let key = vec![gt.num(i, "m")?, gt.num(i, "n")?, gt.num(i, "k")?];
                pts.push((key, gt.latency_s(i)?));
            }
            dtypes.insert(d);
        }
        if pts.is_empty() {
            return Err(err(
                &gt.path,
                format!(
                    "no GEMMs of dtype `{dtype}` (allowed: {})",
                    dtypes.into_iter().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        let prov = &mut self.prov;
        prov.device = gt.first_text("device");
        prov.versions.insert(
            "gemm".into(),
            format!("{} {gver}", gt.first_text("framework")),
        );
        prov.kernel_sources.insert(
            "gemm".into(),
            most_common(&gt, "kernel_source", |i| {
                gt.text(i, "gemm_dtype").is_ok_and(|d| d == dtype)
            }),
        );
        let (gemm, r) = trie(&gt.path, pts, "GEMM")?;
        self.raised.insert("gemm".into(), r);
        Ok(gemm)
    }

    /// One attention table (`file` in `adir`, of version `aver`): the rows of
    /// the asked KV dtype, no window, and the most common kernel source;
    /// `generation` keys by `isl + step` rather than `isl`.
    fn attention(
        &mut self,
        adir: &Path,
        aver: &str,
        file: &str,
        name: &str,
        generation: bool,
    ) -> Result<Grid, KernelError> {
        let kv_dtype = self.kv_dtype;
        let t = Table::read(adir.join(file))?;
        let windowed = t.has("window_size");
        let plain = |i: usize| {
            t.text(i, "kv_cache_dtype").is_ok_and(|d| d == kv_dtype)
                && (!windowed || t.num(i, "window_size").is_ok_and(|w| w == 0.0))
        };
        let source = most_common(&t, "kernel_source", plain);
        let mut pts = Vec::new();
        for i in 0..t.len() {
            if !plain(i) || t.text(i, "kernel_source")? != source {
                continue;
            }
            let len = if generation {
                t.num(i, "isl")? + t.num(i, "step")?
            } else {
                t.num(i, "isl")?
            };
            let key = vec![
                t.num(i, "head_dim")?,
                t.num(i, "num_key_value_heads")?,
                t.num(i, "num_heads")?,
                t.num(i, "batch_size")?,
                len,
            ];
            pts.push((key, t.latency_s(i)?));
        }
        self.prov
            .versions
            .insert(name.into(), format!("{} {aver}", t.first_text("framework")));
        self.prov.kernel_sources.insert(
            name.into(),
            if kv_dtype == "bfloat16" {
                source
            } else {
                format!("{source}, {kv_dtype} KV cache")
            },
        );
        if pts.is_empty() {
            return Err(err(
                &t.path,
                format!("no rows with a `{kv_dtype}` KV cache (kv_cache_dtype)"),
            ));
        }
        let (g, r) = trie(&t.path, pts, name)?;
        self.raised.insert(name.into(), r);
        Ok(g)
    }

    /// The encoder-attention table's BF16 rows, if the GPU has one.
    fn encoder(&mut self) -> Result<Option<Grid>, KernelError> {
        let edir = self.data.join("encoder_attention").join("vllm");
        if !edir.is_dir() {
            return Ok(None);
        }
        let (edir, ever) = version_dir(&edir)?;
        let t = Table::read(edir.join("encoder_attention_perf.parquet"))?;
        let mut pts = Vec::new();
        for i in 0..t.len() {
            if t.text(i, "attn_dtype")? != "bfloat16" {
                continue;
            }
            let key = vec![
                t.num(i, "head_dim")?,
                t.num(i, "num_heads")?,
                t.num(i, "batch_size")?,
                t.num(i, "isl")?,
            ];
            pts.push((key, t.latency_s(i)?));
        }
        self.prov.versions.insert(
            "encoder_attention".into(),
            format!("{} {ever}", t.first_text("framework")),
        );
        self.prov
            .kernel_sources
            .insert("encoder_attention".into(), t.first_text("kernel_source"));
        let (g, r) = trie(&t.path, pts, "encoder attention")?;
        self.raised.insert("encoder_attention".into(), r);
        Ok(Some(g))
    }

    /// vLLM's custom all-reduce, BF16: the graph-mode and eager grids.
    fn allreduce(&mut self) -> Result<(Grid, Grid), KernelError> {
        let (cdir, cver) = version_dir(&self.data.join("comm").join("vllm"))?;
        let ct = Table::read(cdir.join("custom_allreduce_perf.parquet"))?;
        let mut graph = Vec::new();
        let mut eager = Vec::new();
        for i in 0..ct.len() {
            if ct.text(i, "allreduce_dtype")? != "bfloat16" {
                continue;
            }
            let key = vec![ct.num(i, "num_gpus")?, ct.num(i, "message_size")?];
            let v = ct.latency_s(i)?;
            match ct.text(i, "backend")? {
                "vllm_graph" => graph.push((key, v)),
                "vllm_eager" => eager.push((key, v)),
                _ => {}
            }
        }
        self.prov.versions.insert(
            "allreduce".into(),
            format!("{} {cver}", ct.first_text("framework")),
        );
        self.prov
            .kernel_sources
            .insert("allreduce".into(), "vLLM custom all-reduce".into());
        let (allreduce_graph, r1) = trie(&ct.path, graph, "all-reduce (vllm_graph)")?;
        let (allreduce_eager, r2) = trie(&ct.path, eager, "all-reduce (vllm_eager)")?;
        self.raised.insert("allreduce".into(), r1 + r2);
        Ok((allreduce_graph, allreduce_eager))
    }

    /// FP8 activation quantization (for FP8 GEMMs): dynamic scale + scaled quant
    /// (per-tensor FP8 only: the block-scaled path quantizes per token
    /// group inside its GEMM's timing); `None` for other GEMM dtypes.
    fn quant(&mut self, system: &str) -> Result<Option<[Grid; 2]>, KernelError> {
        if self.dtype != "fp8" {
            return Ok(None);
        }
        let qdir = self.data.join("quantize").join("vllm");
        if !qdir.is_dir() {
            return Err(err(
                &qdir,
                format!(
                    "missing: `{system}` has no FP8 quantize tables (no FP8 units); use bfloat16"
                ),
            ));
        }
        let (qdir, qver) = version_dir(&qdir)?;
        let mut grids = Vec::with_capacity(2);
        for file in ["computescale_perf.parquet", "scale_matrix_perf.parquet"] {
            let t = Table::read(qdir.join(file))?;
            let mut pts = Vec::new();
            for i in 0..t.len() {
                if t.text(i, "quant_dtype")? == "fp8" {
                    pts.push((vec![t.num(i, "m")?, t.num(i, "k")?], t.latency_s(i)?));
                }
            }
            let (g, r) = trie(&t.path, pts, "FP8 quantize")?;
            *self.raised.entry("quantize".into()).or_default() += r;
            grids.push(g);
        }
        self.prov
            .versions
            .insert("quantize".into(), format!("VLLM {qver}"));
        self.prov.kernel_sources.insert(
            "quantize".into(),
            "dynamic per-token scale + static scaled FP8 quant".into(),
        );
        let scale_matrix = grids.pop();
        let compute_scale = grids.pop();
        Ok(compute_scale.zip(scale_matrix).map(|(a, b)| [a, b]))
    }

    /// NCCL collectives (optional): all-gather and reduce-scatter, 16-bit.
    fn nccl(&mut self) -> Result<Option<[Grid; 2]>, KernelError> {
        let ndir = self.data.join("comm").join("nccl");
        if !ndir.is_dir() {
            return Ok(None);
        }
        let (ndir, nver) = version_dir(&ndir)?;
        let t = Table::read(ndir.join("nccl_perf.parquet"))?;
        let mut by: [Vec<(Vec<f64>, f64)>; 2] = [Vec::new(), Vec::new()];
        for i in 0..t.len() {
            if t.text(i, "nccl_dtype")? != "half" {
                continue;
            }
            let k = match t.text(i, "op_name")? {
                "all_gather" => 0,
                "reduce_scatter" => 1,
                _ => continue,
            };
            let key = vec![t.num(i, "num_gpus")?, t.num(i, "message_size")?];
            by[k].push((key, t.latency_s(i)?));
        }
        self.prov
            .versions
            .insert("nccl".into(), format!("NCCL {nver}"));
        self.prov
            .kernel_sources
            .insert("nccl".into(), "all_gather, reduce_scatter".into());
        let [ag, rs] = by;
        let (ag, r1) = trie(&t.path, ag, "NCCL all_gather")?;
        let (rs, r2) = trie(&t.path, rs, "NCCL reduce_scatter")?;
        self.raised.insert("nccl".into(), r1 + r2);
        Ok(Some([ag, rs]))
    }
}

impl KernelTables {
    /// Read the tables of `system` (an aiconfigurator system name, e.g. `h100_sxm`)
    /// from `dir` (the folder holding `data/` and the system YAMLs), GEMMs of `dtype`.
    ///
    /// # Errors
    /// A missing or unreadable directory, YAML or parquet file, a row without a
    /// needed column or with a latency that is not finite and > 0, or a dtype the
    /// GEMM table lacks: the error names the file and what is allowed.
    pub fn load(dir: &Path, system: &str, dtype: &str) -> Result<KernelTables, KernelError> {
        KernelTables::load_with(dir, system, dtype, "bfloat16")
    }

    /// [`KernelTables::load`] with the attention tables' rows of KV-cache dtype
    /// `kv_dtype` (`bfloat16` or `fp8`), and, for an FP8 GEMM dtype, the FP8
    /// activation-quantization tables (`quantize/`: `computescale_perf`,
    /// `scale_matrix_perf`).
    ///
    /// # Errors
    /// As [`KernelTables::load`]; also a KV dtype the attention tables lack, or
    /// an FP8 GEMM dtype on a GPU without quantize tables.
    pub fn load_with(
        dir: &Path,
        system: &str,
        dtype: &str,
        kv_dtype: &str,
    ) -> Result<KernelTables, KernelError> {
        let known: Vec<&str> = AIC_GPUS.iter().map(|(_, s)| *s).collect();
        let data = dir.join("data").join(system);
        if !data.is_dir() {
            return Err(err(
                &data,
                format!(
                    "no kernel data for `{system}` (allowed: {})",
                    known.join(", ")
                ),
            ));
        }
        let system_spec = read_system_yaml(&dir.join(format!("{system}.yaml")))?;
        let mut l = Loader {
            data,
            dtype,
            kv_dtype,
            prov: KernelProvenance {
                system: system.to_string(),
                dir: dir.display().to_string(),
                ..Default::default()
            },
            raised: BTreeMap::new(),
        };
        let gemm = l.gemm()?;
        let (adir, aver) = version_dir(&l.data.join("attention").join("vllm"))?;
        let context = l.attention(
            &adir,
            &aver,
            "context_attention_perf.parquet",
            "context_attention",
            false,
        )?;
        let generation = l.attention(
            &adir,
            &aver,
            "generation_attention_perf.parquet",
            "generation_attention",
            true,
        )?;
        let encoder = l.encoder()?;
        let (allreduce_graph, allreduce_eager) = l.allreduce()?;
        let quant = l.quant(system)?;
        let nccl = l.nccl()?;

        Ok(KernelTables {
            nccl,
            quant,
            gemm_dtype: dtype.to_string(),
            kv_dtype: kv_dtype.to_string(),
            provenance: l.prov,
            system: system_spec,
            gemm,
            context,
            generation,
            encoder,
            allreduce_graph,
            allreduce_eager,
            raised: l.raised,
        })
    }

    /// One line naming the tables (for notes and profiles' provenance).
    pub fn describe(&self) -> String {
        let p = &self.provenance;
        let tables: Vec<String> = p
            .versions
            .iter()
            .map(|(t, v)| {
                format!(
                    "{t} ({v}, {})",
                    p.kernel_sources.get(t).map(String::as_str).unwrap_or("?")
                )
            })
            .collect();
        format!(
            "aiconfigurator {AIC_COMMIT} measured kernels of {} [{}]: {}",
            p.system,
            p.device,
            tables.join("; ")
        )
    }
}

/// One measured fused-MoE shape of `moe_perf.parquet` (all its keys but the
/// token count and the dtype).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct MoeShape {
    /// `hidden_size`.
    pub hidden: u32,
    /// `inter_size`: one expert's MLP width, unsharded.
    pub inter: u32,
    /// `topk`.
    pub top_k: u32,
    /// `num_experts`.
    pub experts: u32,
    /// `moe_tp_size`.
    pub moe_tp: u32,
    /// `moe_ep_size`.
    pub moe_ep: u32,
    /// `distribution`.
    pub routing: easerve_model::MoeRouting,
}

/// The fused-MoE latencies of one GPU and dtype: per measured shape, seconds
/// per layer over `num_tokens` (a monotone 1-D grid).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct MoeTables {
    /// The `moe_dtype` kept (`bfloat16`, `fp8`, `fp8_block`, ...).
    pub dtype: String,
    /// Seconds over `(num_tokens)`, by shape.
    pub shapes: std::collections::HashMap<MoeShape, Grid>,
    /// The most frequent `kernel_source` of the kept rows
    /// (`vllm_unquantizedfusedmoe_triton_tritonexperts`).
    pub kernel_source: String,
    /// `framework version` of the table (`VLLM 0.24.0`).
    pub version: String,
    /// The file read.
    pub file: String,
}

impl MoeTables {
    /// Read `data/<system>/moe/vllm/<version>/moe_perf.parquet` under `dir`,
    /// the rows of `dtype` (aiconfigurator's `moe_dtype` names).
    ///
    /// # Errors
    /// A missing or corrupt file, a row without a needed column, a latency
    /// that is not finite and > 0, an unknown `distribution`, or no row of
    /// `dtype` (the error lists the dtypes the table has).
    pub fn load(dir: &Path, system: &str, dtype: &str) -> Result<MoeTables, KernelError> {
        let (mdir, ver) = version_dir(&dir.join("data").join(system).join("moe").join("vllm"))?;
        let t = Table::read(mdir.join("moe_perf.parquet"))?;
        let mut dtypes = std::collections::BTreeSet::new();
        let mut by: std::collections::HashMap<MoeShape, Vec<(Vec<f64>, f64)>> = Default::default();
        let int = |i: usize, c: &str| -> Result<u32, KernelError> {
            let v = t.num(i, c)?;
            if v.is_finite() && v >= 1.0 && v <= f64::from(u32::MAX) {
                Ok(v as u32)
            } else {
                Err(err(
                    &t.path,
                    format!("row {i}: column `{c}` is {v} (allowed: a whole number ≥ 1)"),
                ))
            }
        };
        for i in 0..t.len() {
            let d = t.text(i, "moe_dtype")?;
            dtypes.insert(d.to_string());
            if d != dtype {
                continue;
            }
            let dist = t.text(i, "distribution")?;
            let routing = easerve_model::MoeRouting::from_name(dist).ok_or_else(|| {
                err(
                    &t.path,
                    format!(
                        "row {i}: distribution `{dist}` (allowed: {})",
                        easerve_model::MoeRouting::ALL.map(|r| r.name()).join(", ")
                    ),
                )
            })?;
            let shape = MoeShape {
                hidden: int(i, "hidden_size")?,
                inter: int(i, "inter_size")?,
                top_k: int(i, "topk")?,
                experts: int(i, "num_experts")?,
                moe_tp: int(i, "moe_tp_size")?,
                moe_ep: int(i, "moe_ep_size")?,
                routing,
            };
            by.entry(shape)
                .or_default()
                .push((vec![f64::from(int(i, "num_tokens")?)], t.latency_s(i)?));
        }
        if by.is_empty() {
            return Err(err(
                &t.path,
                format!(
                    "no MoE rows of dtype `{dtype}` (allowed: {})",
                    dtypes.into_iter().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        let mut shapes = std::collections::HashMap::with_capacity(by.len());
        for (shape, pts) in by {
            let (g, _) = trie(&t.path, pts, "MoE")?;
            shapes.insert(shape, g);
        }
        Ok(MoeTables {
            dtype: dtype.to_string(),
            shapes,
            kernel_source: most_common(&t, "kernel_source", |i| {
                t.text(i, "moe_dtype").is_ok_and(|d| d == dtype)
            }),
            version: format!("{} {ver}", t.first_text("framework")),
            file: t.path.display().to_string(),
        })
    }
}

/// One value of a one-column grid at `point`, and whether the lookup left the table.
pub fn look(g: &Grid, point: &[f64]) -> (f64, bool) {
    g.lookup_one(0, point)
}

fn read_system_yaml(path: &Path) -> Result<SystemSpec, KernelError> {
    let text = crate::input::read_text(path).map_err(|e| err(path, format!("cannot read: {e}")))?;
    let v: serde_yaml::Value =
        serde_yaml::from_str(&text).map_err(|e| err(path, format!("not valid YAML: {e}")))?;
    let get = |key: &str| -> Result<f64, KernelError> {
        v.get("gpu")
            .and_then(|g| g.get(key))
            .and_then(serde_yaml::Value::as_f64)
            .filter(|x| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| err(path, format!("`gpu.{key}` missing or not a number ≥ 0")))
    };
    Ok(SystemSpec {
        mem_bw: get("mem_bw")?,
        mem_bw_scaling: get("mem_bw_empirical_scaling_factor")?,
        mem_latency_s: get("mem_empirical_constant_latency")?,
        bf16_flops: get("bfloat16_tc_flops")?,
        mem_capacity: get("mem_capacity")?,
        sm_version: get("sm_version")? as u32,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The data directory, or `None` with a message (the data is third-party and
    /// lives outside the repository).
    pub(crate) fn data() -> Option<PathBuf> {
        let d = default_data_dir();
        if d.join("data").is_dir() {
            Some(d)
        } else {
            println!(
                "SKIPPED: aiconfigurator data not found at {} (../shared/data/aiconfigurator relative to the repository root)",
                d.display()
            );
            None
        }
    }

    #[test]
    fn reads_h100_tables_and_matches_grid_points() {
        let Some(dir) = data() else { return };
        let t = KernelTables::load(&dir, "h100_sxm", "bfloat16").unwrap();
        assert_eq!(t.provenance.device, "NVIDIA H100 80GB HBM3");
        assert_eq!(t.system.sm_version, 90);
        // a measured point (first row of the file): m 32768, n 65536, k 12288: 60.32 ms
        let (v, ext) = look(&t.gemm, &[32768.0, 65536.0, 12288.0]);
        assert!((v - 60.324e-3).abs() < 1e-3 * 60.324e-3, "{v}");
        assert!(!ext);
        let (_, ext) = look(&t.gemm, &[65536.0, 4096.0, 4096.0]);
        assert!(ext, "m beyond 32768 must be flagged");
        assert!(t.encoder.is_some());
        assert!(
            t.describe().contains("vllm_flash_attn_fa3"),
            "{}",
            t.describe()
        );
    }

    #[test]
    fn gemm_is_monotone_between_grid_points() {
        let Some(dir) = data() else { return };
        let t = KernelTables::load(&dir, "a100_sxm", "bfloat16").unwrap();
        assert!(t.encoder.is_none());
        let mut prev = 0.0;
        for m in (1..=8192).step_by(37) {
            let (v, _) = look(&t.gemm, &[m as f64, 7168.0, 7168.0]);
            assert!(v >= prev, "m {m}: {v} < {prev}");
            prev = v;
        }
    }

    #[test]
    fn bad_input_names_the_file() {
        let Some(dir) = data() else { return };
        let e = KernelTables::load(&dir, "rtx_4090", "bfloat16").unwrap_err();
        assert!(e.message.contains("allowed: h100_sxm"), "{e}");
        let e = KernelTables::load(&dir, "a100_sxm", "fp4").unwrap_err();
        assert!(
            e.file.ends_with("gemm_perf.parquet") && e.message.contains("bfloat16"),
            "{e}"
        );
        // a corrupt parquet file
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let g = root.join("data/x_gpu/gemm/vllm/0.1.0");
        std::fs::create_dir_all(&g).unwrap();
        std::fs::copy(dir.join("a100_sxm.yaml"), root.join("x_gpu.yaml")).unwrap();
        std::fs::write(g.join("gemm_perf.parquet"), b"not parquet").unwrap();
        let e = KernelTables::load(root, "x_gpu", "bfloat16").unwrap_err();
        assert!(e.file.ends_with("gemm_perf.parquet"), "{e}");
        assert!(e.message.contains("parquet"), "{e}");
        // a missing YAML
        std::fs::remove_file(root.join("x_gpu.yaml")).unwrap();
        let e = KernelTables::load(root, "x_gpu", "bfloat16").unwrap_err();
        assert!(e.file.ends_with("x_gpu.yaml"), "{e}");
    }

    #[test]
    fn moe_tables_read_measured_shapes_and_name_bad_files() {
        let Some(dir) = data() else { return };
        let t = MoeTables::load(&dir, "h100_sxm", "bfloat16").unwrap();
        let qwen3_30b = MoeShape {
            hidden: 2048,
            inter: 768,
            top_k: 8,
            experts: 128,
            moe_tp: 1,
            moe_ep: 8,
            routing: easerve_model::MoeRouting::PowerLaw12,
        };
        let (v, ext) = look(&t.shapes[&qwen3_30b], &[64.0]);
        assert!(v > 0.0 && !ext);
        assert!(t.kernel_source.contains("fusedmoe"), "{}", t.kernel_source);
        let e = MoeTables::load(&dir, "h100_sxm", "fp4").unwrap_err();
        assert!(e.file.ends_with("moe_perf.parquet"), "{e}");
        assert!(e.message.contains("fp8_block"), "{e}");
        // a corrupt table names its file
        let tmp = tempfile::tempdir().unwrap();
        let m = tmp.path().join("data/x_gpu/moe/vllm/0.1.0");
        std::fs::create_dir_all(&m).unwrap();
        std::fs::write(m.join("moe_perf.parquet"), b"PAR1 truncated").unwrap();
        let e = MoeTables::load(tmp.path(), "x_gpu", "bfloat16").unwrap_err();
        assert!(
            e.file.ends_with("moe_perf.parquet") && e.message.contains("parquet"),
            "{e}"
        );
        let e = MoeTables::load(tmp.path(), "y_gpu", "bfloat16").unwrap_err();
        assert!(e.message.contains("missing"), "{e}");
    }
}
