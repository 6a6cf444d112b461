//! The file format's types: its version and monotonicity tolerance, where the
//! figures came from ([`Source`], [`Provenance`]), the stages and their axes
//! ([`Stage`]), the latency unit ([`TimeUnit`]), one [`Table`] and its lookup
//! grid, the [`Profile`] that holds them, how a prefill batch maps onto the
//! prefill table ([`PrefillBatching`]), and the [`ProfileError`] that names the
//! file, the table and the row.

use std::fmt;

use crate::interp::{ExtrapolationCounter, Grid};

/// Version of the file format written in the top-level `format` key.
pub const FORMAT_VERSION: i64 = 1;

/// Relative drop of a median latency along a work axis (batch, tokens, context,
/// bytes; not the decode table's batch, see `is_work_axis`) that a profile may
/// contain before it is rejected as non-monotone:
/// 5 %, so measurement noise at tiny sizes passes while a swapped row does not.
pub const MONOTONE_TOLERANCE: f64 = 0.05;

/// How a profile's figures were obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Computed from the roofline model (no measurement).
    Roofline,
    /// Measured on the named device (e.g. by `easerve profile`).
    Measured,
    /// Taken from third-party measurements (name them in `method`).
    Imported,
}

impl Source {
    /// The name used in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Roofline => "roofline",
            Source::Measured => "measured",
            Source::Imported => "imported",
        }
    }

    pub(super) fn parse(s: &str) -> Option<Source> {
        match s {
            "roofline" => Some(Source::Roofline),
            "measured" => Some(Source::Measured),
            "imported" => Some(Source::Imported),
            _ => None,
        }
    }
}

/// Unit of a table's latency columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeUnit {
    /// Seconds.
    S,
    /// Milliseconds.
    Ms,
    /// Microseconds.
    Us,
}

impl TimeUnit {
    /// Seconds per unit.
    pub fn seconds(self) -> f64 {
        match self {
            TimeUnit::S => 1.0,
            TimeUnit::Ms => 1e-3,
            TimeUnit::Us => 1e-6,
        }
    }

    /// The name used in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            TimeUnit::S => "s",
            TimeUnit::Ms => "ms",
            TimeUnit::Us => "us",
        }
    }

    pub(super) fn parse(s: &str) -> Option<TimeUnit> {
        match s {
            "s" => Some(TimeUnit::S),
            "ms" => Some(TimeUnit::Ms),
            "us" => Some(TimeUnit::Us),
            _ => None,
        }
    }
}

/// The stage a table times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// One encode pass over a micro-batch of items.
    Encode,
    /// One prefill batch.
    Prefill,
    /// One decode step.
    Decode,
    /// One transfer over a link.
    Transfer,
    /// One all-reduce (sum) of a message among a tensor-parallel worker's
    /// ranks.
    AllReduce,
    /// One encode pass over a micro-batch of items on an encode worker at
    /// TP > 1 (its rank processes, all of their SMs or cores).
    EncodeTp,
    /// Landing one sequence's KV cache on a decode worker at its first
    /// step: read from the wire and, at TP > 1, resharded by heads and sent
    /// to the follower ranks.
    KvLand,
}

impl Stage {
    /// Table name in the file.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Encode => "encode",
            Stage::Prefill => "prefill",
            Stage::Decode => "decode",
            Stage::Transfer => "transfer",
            Stage::AllReduce => "all_reduce",
            Stage::EncodeTp => "encode_tp",
            Stage::KvLand => "kv_land",
        }
    }

    /// Axis columns, in the order rows are sorted by.
    pub fn axes(self) -> &'static [&'static str] {
        match self {
            Stage::Encode => &["batch", "encoder_tokens", "sm_level"],
            Stage::Prefill => &["tokens", "tp", "sm_level"],
            Stage::Decode => &["batch", "context_tokens", "tp"],
            Stage::Transfer => &["bytes"],
            Stage::AllReduce => &["tp", "bytes"],
            Stage::EncodeTp => &["tp", "batch", "encoder_tokens"],
            Stage::KvLand => &["tp", "tokens"],
        }
    }

    /// Value columns besides the required `median`.
    pub fn optional_columns(self) -> &'static [&'static str] {
        match self {
            Stage::Encode | Stage::EncodeTp => &["p90", "t_pass", "t_pre"],
            _ => &["p90"],
        }
    }
}

/// Axes along which latency must not fall (more than [`MONOTONE_TOLERANCE`]).
const WORK_AXES: &[&str] = &[
    "batch",
    "encoder_tokens",
    "tokens",
    "context_tokens",
    "bytes",
];

/// Whether latency of `stage` must not fall along `axis`. A decode step's
/// `context_tokens` is the batch's *total* context, so at a fixed total more
/// sequences means shorter ones, and the step may get faster (measured kernels
/// show it: one long sequence gives flash-decoding fewer blocks than two half as
/// long); decode is monotone in its context only.
pub(super) fn is_work_axis(stage: Stage, axis: &str) -> bool {
    WORK_AXES.contains(&axis) && !(stage == Stage::Decode && axis == "batch")
}

pub(super) fn is_integer_axis(name: &str) -> bool {
    name != "sm_level"
}

/// Where a profile's figures came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Provenance {
    /// Model name (a `easerve-model` preset or a custom model's name).
    pub model: String,
    /// GPU preset name ([`GpuSpec::preset_names`](crate::GpuSpec::preset_names)), e.g. `"a100-sxm4-80gb"`.
    pub device: String,
    /// Link whose `[[transfer]]` table [`StageCost::transfer`](crate::StageCost::transfer) uses
    /// ([`LinkSpec::preset_names`](crate::LinkSpec::preset_names)).
    pub link: String,
    /// How the figures were obtained.
    pub source: Source,
    /// Serving engine / attention backend, e.g. `"vLLM 0.8.5, FLASH_ATTN"`.
    pub backend: String,
    /// Driver and CUDA versions, e.g. `"550.54.15, CUDA 12.4"`.
    pub driver: String,
    /// Library versions, e.g. `["torch 2.5.1", "flash-attn 2.7.0"]`.
    pub libraries: Vec<String>,
    /// Date of measurement or generation, ISO 8601 (`YYYY-MM-DD`).
    pub date: String,
    /// How it was measured (timer, warm-up, what a latency includes) or computed.
    pub method: String,
    /// Repetitions per table point (0 for computed profiles).
    pub repetitions: u32,
    /// CPU cores of the host that measured it, for a profile of the `cpu`
    /// device (its SM levels are shares of them); `None` elsewhere. The
    /// simulator's core sharing on a CPU host takes its core count from
    /// here when the scenario gives no `cluster.host_cores`.
    pub cores: Option<u32>,
}

/// Why a profile could not be used: names the file, the table and the row.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileError {
    /// The profile's path (or the origin given to [`Profile::from_toml_str`]).
    pub file: String,
    /// Table, e.g. `encode`, `transfer[2]`, `provenance`.
    pub table: Option<String>,
    /// 1-based row of the table's `rows`.
    pub row: Option<usize>,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl fmt::Display for ProfileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "profile {}", self.file)?;
        if let Some(t) = &self.table {
            write!(f, ", table [{t}]")?;
        }
        if let Some(r) = self.row {
            write!(f, ", row {r}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ProfileError {}

/// One stage table: the rows as written, and the lookup grid built from them.
#[derive(Debug)]
pub struct Table {
    pub(super) stage: Stage,
    pub(super) link: Option<String>,
    pub(super) unit: TimeUnit,
    pub(super) columns: Vec<String>,
    pub(super) rows: Vec<Vec<f64>>,
    /// Lookup columns in seconds: encode `[t_gpu, t_pass, t_pre]`, others `[median]`.
    pub(super) grid: Grid,
    pub(super) counter: ExtrapolationCounter,
}

impl Clone for Table {
    /// A copy with its own (zeroed) extrapolation counters.
    fn clone(&self) -> Self {
        Table {
            stage: self.stage,
            link: self.link.clone(),
            unit: self.unit,
            columns: self.columns.clone(),
            rows: self.rows.clone(),
            grid: self.grid.clone(),
            counter: ExtrapolationCounter::new(self.stage.axes().len()),
        }
    }
}

impl PartialEq for Table {
    /// Same stage, link, unit, columns and rows (counters are ignored).
    fn eq(&self, o: &Self) -> bool {
        self.stage == o.stage
            && self.link == o.link
            && self.unit == o.unit
            && self.columns == o.columns
            && self.rows == o.rows
    }
}

impl Table {
    /// Build a table from validated rows (axes first, then value columns). The
    /// caller guarantees the rows form a full sorted grid.
    pub(super) fn build(
        stage: Stage,
        link: Option<String>,
        unit: TimeUnit,
        columns: Vec<String>,
        rows: Vec<Vec<f64>>,
    ) -> Table {
        let n_axes = stage.axes().len();
        let mut axes: Vec<Vec<f64>> = vec![Vec::new(); n_axes];
        for r in &rows {
            for (d, a) in axes.iter_mut().enumerate() {
                if !a.contains(&r[d]) {
                    a.push(r[d]);
                }
            }
        }
        for a in &mut axes {
            a.sort_by(f64::total_cmp);
        }
        let col = |name: &str| columns.iter().position(|c| c == name);
        let s = unit.seconds();
        let get = |r: &Vec<f64>, c: Option<usize>| c.map_or(0.0, |i| r[i] * s);
        let median = col("median");
        let lookup_cols: Vec<Vec<f64>> = match stage {
            Stage::Encode | Stage::EncodeTp => {
                let (tp, tr) = (col("t_pass"), col("t_pre"));
                let mut gpu = Vec::with_capacity(rows.len());
                let mut pass = Vec::with_capacity(rows.len());
                let mut pre = Vec::with_capacity(rows.len());
                for r in &rows {
                    let (m, a, b) = (get(r, median), get(r, tp), get(r, tr));
                    gpu.push((m - a - b).max(0.0));
                    pass.push(a);
                    pre.push(b);
                }
                vec![gpu, pass, pre]
            }
            _ => vec![rows.iter().map(|r| get(r, median)).collect()],
        };
        Table {
            stage,
            link,
            unit,
            columns,
            grid: Grid::new(axes, lookup_cols),
            rows,
            counter: ExtrapolationCounter::new(n_axes),
        }
    }

    /// The stage this table times.
    pub fn stage(&self) -> Stage {
        self.stage
    }
    /// The link of a transfer table.
    pub fn link(&self) -> Option<&str> {
        self.link.as_deref()
    }
    /// Unit of the latency columns.
    pub fn unit(&self) -> TimeUnit {
        self.unit
    }
    /// Column names: axes, then value columns.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }
    /// Rows as written (latencies in [`Table::unit`]).
    pub fn rows(&self) -> &[Vec<f64>] {
        &self.rows
    }
    /// The rows with every value column (the columns after the stage's
    /// axes: latencies in [`Table::unit`]) mapped through `f`, the axes
    /// kept: what a refinement writes back.
    pub fn mapped_rows(&self, f: impl Fn(f64) -> f64) -> Vec<Vec<f64>> {
        let na = self.stage.axes().len();
        (self.rows.iter())
            .map(|r| {
                (r.iter().enumerate())
                    .map(|(i, v)| if i < na { *v } else { f(*v) })
                    .collect()
            })
            .collect()
    }
    /// Distinct values of each axis, ascending.
    pub fn axes(&self) -> &[Vec<f64>] {
        self.grid.axes()
    }

    /// Interpolated lookup columns (seconds) at `point`, counting extrapolation:
    /// encode `[t_gpu, t_pass, t_pre]`, other tables `[median]`.
    pub(crate) fn lookup(&self, point: &[f64]) -> Vec<f64> {
        let l = self.grid.lookup(point);
        self.counter.record(&l.sides);
        l.values
    }

    /// Table name in messages: `encode`, `transfer (nvlink3)`.
    pub(super) fn label(&self) -> String {
        match &self.link {
            Some(l) => format!("{} ({l})", self.stage.name()),
            None => self.stage.name().to_string(),
        }
    }
}

/// A profile: provenance, the two contention scalars and the stage tables.
///
/// `impl StageCost for Profile`: encode, prefill, decode and transfer durations
/// come from the tables; [`StageCost::notes`](crate::StageCost::notes) names the profile and reports, once
/// per call, how many lookups since the previous call had to extrapolate.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// The file it was read from (or `"<roofline>"` etc.), for notes and errors.
    pub origin: String,
    /// Where its figures came from.
    pub provenance: Provenance,
    /// [`StageCost::time_slice_penalty`](crate::StageCost::time_slice_penalty).
    pub time_slice_penalty: f64,
    /// [`StageCost::bandwidth_interference`](crate::StageCost::bandwidth_interference).
    pub bandwidth_interference: f64,
    /// Where the two scalars came from.
    pub scalars_note: String,
    /// How a prefill batch of several sequences maps onto the prefill table.
    pub prefill_batching: PrefillBatching,
    pub(super) encode: Option<Table>,
    pub(super) prefill: Table,
    pub(super) decode: Table,
    pub(super) transfer: Vec<Table>,
    /// The all-reduce table (`tp`, `bytes` → seconds), where one was measured.
    pub(super) all_reduce: Option<Table>,
    /// The encode table at TP > 1 (`tp`, `batch`, `encoder_tokens`), where
    /// one was measured.
    pub(super) encode_tp: Option<Table>,
    /// The KV landing table (`tp`, `tokens` → seconds), where one was
    /// measured.
    pub(super) kv_land: Option<Table>,
    /// The host's measured oversubscription curve (a CPU profile), where
    /// one was measured.
    pub(super) host_sharing: Option<super::HostSharing>,
    /// Encode lookups at a TP > 1 without rows (priced as at TP 1) since the
    /// last notes.
    pub(super) encode_tp_fallbacks: Counter,
    /// Prefill and decode lookups at a TP without rows since the last notes.
    pub(super) tp_fallbacks: Counter,
    /// Of them, those that added all-reduces from the all-reduce table.
    pub(super) tp_priced: Counter,
}

/// A lookup counter for notes: a copy starts at zero, and counters are equal
/// whatever they hold (as [`Table`]'s extrapolation counters).
#[derive(Debug, Default)]
pub(super) struct Counter(std::sync::atomic::AtomicU64);

impl Counter {
    /// Count one.
    pub(super) fn add(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    /// The count, reset to zero.
    pub(super) fn take(&self) -> u64 {
        self.0.swap(0, std::sync::atomic::Ordering::Relaxed)
    }
}

impl Clone for Counter {
    fn clone(&self) -> Self {
        Counter::default()
    }
}

impl PartialEq for Counter {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// How a prefill batch of several sequences maps onto the prefill table
/// (whose rows time one sequence of `tokens` tokens).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PrefillBatching {
    /// The engine packs the batch into one sequence of all its tokens (as
    /// vLLM's variable-length kernels do): one lookup at the total tokens.
    #[default]
    Packed,
    /// The engine pads every sequence to the longest and runs them side by
    /// side (as easerve's executor does): `batch × lookup(longest)`.
    Padded,
}

impl PrefillBatching {
    /// `packed` or `padded`, as in the file.
    pub fn as_str(self) -> &'static str {
        match self {
            PrefillBatching::Packed => "packed",
            PrefillBatching::Padded => "padded",
        }
    }
}
