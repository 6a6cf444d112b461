//! Profiles: per-stage latency tables of one model × device, with provenance.
//!
//! One format for every source (DESIGN.md "Cost"): a profile written from the
//! roofline ([`Profile::from_roofline`]), measured on hardware (the executor's
//! `easerve profile`), or imported. The file format is TOML, documented with an
//! example in `calib/README.md`; [`Profile::to_toml_string`] writes it in one
//! canonical layout, so written → read → written is byte-identical.
//!
//! Tables (latencies in the table's `unit`, stored as written):
//!
//! | table        | axes (in this order)                      | value columns                           |
//! |--------------|-------------------------------------------|-----------------------------------------|
//! | `encode`     | `batch`, `encoder_tokens`, `sm_level`     | `median`, optional `p90`, `t_pass`, `t_pre` |
//! | `prefill`    | `tokens`, `tp`, `sm_level`                | `median`, optional `p90`                |
//! | `decode`     | `batch`, `context_tokens`, `tp`           | `median`, optional `p90`                |
//! | `[[transfer]]` (one per `link`) | `bytes`                | `median`, optional `p90`                |
//!
//! `batch` of encode counts items (images, videos, audio clips) in one pass;
//! `encoder_tokens` is tokens per item; `tokens` of prefill is the batch's
//! total prompt tokens; `context_tokens` of decode is the total over the batch.
//! Lookups interpolate multi-linearly in `ln(axis)` ([`crate::interp`]) and count
//! lookups outside the table, reported once per run by [`StageCost::notes`].

use std::fmt;
use std::fmt::Write as _;
use std::path::Path;

use easerve_model::{ItemTokens, Parallel};

use crate::gpu::{GpuSpec, LinkSpec};
use crate::interp::{ExtrapolationCounter, Grid};
use crate::roofline::{EncodeTime, Roofline, MIN_SM_SHARE};
use crate::StageCost;

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

    fn parse(s: &str) -> Option<Source> {
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

    fn parse(s: &str) -> Option<TimeUnit> {
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
}

impl Stage {
    /// Table name in the file.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Encode => "encode",
            Stage::Prefill => "prefill",
            Stage::Decode => "decode",
            Stage::Transfer => "transfer",
        }
    }

    /// Axis columns, in the order rows are sorted by.
    pub fn axes(self) -> &'static [&'static str] {
        match self {
            Stage::Encode => &["batch", "encoder_tokens", "sm_level"],
            Stage::Prefill => &["tokens", "tp", "sm_level"],
            Stage::Decode => &["batch", "context_tokens", "tp"],
            Stage::Transfer => &["bytes"],
        }
    }

    /// Value columns besides the required `median`.
    pub fn optional_columns(self) -> &'static [&'static str] {
        match self {
            Stage::Encode => &["p90", "t_pass", "t_pre"],
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
fn is_work_axis(stage: Stage, axis: &str) -> bool {
    WORK_AXES.contains(&axis) && !(stage == Stage::Decode && axis == "batch")
}

/// Where a profile's figures came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Provenance {
    /// Model name (a `easerve-model` preset or a custom model's name).
    pub model: String,
    /// GPU preset name ([`GpuSpec::preset_names`]), e.g. `"a100-sxm4-80gb"`.
    pub device: String,
    /// Link whose `[[transfer]]` table [`StageCost::transfer`] uses
    /// ([`LinkSpec::preset_names`]).
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
    stage: Stage,
    link: Option<String>,
    unit: TimeUnit,
    columns: Vec<String>,
    rows: Vec<Vec<f64>>,
    /// Lookup columns in seconds: encode `[t_gpu, t_pass, t_pre]`, others `[median]`.
    grid: Grid,
    counter: ExtrapolationCounter,
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
    fn build(
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
            Stage::Encode => {
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
    fn label(&self) -> String {
        match &self.link {
            Some(l) => format!("{} ({l})", self.stage.name()),
            None => self.stage.name().to_string(),
        }
    }
}

/// A profile: provenance, the two contention scalars and the stage tables.
///
/// `impl StageCost for Profile`: encode, prefill, decode and transfer durations
/// come from the tables; [`StageCost::notes`] names the profile and reports, once
/// per call, how many lookups since the previous call had to extrapolate.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// The file it was read from (or `"<roofline>"` etc.), for notes and errors.
    pub origin: String,
    /// Where its figures came from.
    pub provenance: Provenance,
    /// [`StageCost::time_slice_penalty`].
    pub time_slice_penalty: f64,
    /// [`StageCost::bandwidth_interference`].
    pub bandwidth_interference: f64,
    /// Where the two scalars came from.
    pub scalars_note: String,
    /// How a prefill batch of several sequences maps onto the prefill table.
    pub prefill_batching: PrefillBatching,
    encode: Option<Table>,
    prefill: Table,
    decode: Table,
    transfer: Vec<Table>,
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

/// Axis values of a profile written from the roofline.
#[derive(Clone, Debug, PartialEq)]
pub struct GridSpec {
    /// Items per encode pass.
    pub encode_batch: Vec<u64>,
    /// Encoder tokens per item.
    pub encode_tokens: Vec<u64>,
    /// SM levels (fraction of the GPU's SMs) for encode and prefill.
    pub sm_levels: Vec<f64>,
    /// Prefill batch tokens.
    pub prefill_tokens: Vec<u64>,
    /// TP degrees for prefill and decode.
    pub tp: Vec<u32>,
    /// Sequences per decode step.
    pub decode_batch: Vec<u64>,
    /// Total context tokens of a decode batch.
    pub decode_context: Vec<u64>,
    /// Bytes per transfer.
    pub transfer_bytes: Vec<u64>,
}

fn pow2(lo: u32, hi: u32) -> Vec<u64> {
    (lo..=hi).map(|e| 1u64 << e).collect()
}

/// Powers of √2 from `2^lo` to `2^hi`, rounded to integers.
fn pow_sqrt2(lo: u32, hi: u32) -> Vec<u64> {
    let mut v: Vec<u64> = (2 * lo..=2 * hi)
        .map(|e| (2f64.powf(f64::from(e) / 2.0)).round() as u64)
        .collect();
    v.dedup();
    v
}

impl Default for GridSpec {
    /// Five SM levels 0.2, 0.4, 0.6, 0.8, 1.0; encode batches 1..64 (powers of 2)
    /// × 32..65536 encoder tokens per item (powers of √2); prefill 16..131072
    /// tokens (powers of √2) × TP 1, 2, 4, 8; decode batches 1..512 (powers of √2:
    /// the compute/memory switch lies in this range) × 256..2^24 total context
    /// tokens (powers of 2); transfers 1 KiB..64 GiB (powers of 2).
    fn default() -> Self {
        GridSpec {
            encode_batch: pow2(0, 6),
            encode_tokens: pow_sqrt2(5, 16),
            sm_levels: vec![0.2, 0.4, 0.6, 0.8, 1.0],
            prefill_tokens: pow_sqrt2(4, 17),
            tp: vec![1, 2, 4, 8],
            decode_batch: pow_sqrt2(0, 9),
            decode_context: pow2(8, 24),
            transfer_bytes: pow2(10, 36),
        }
    }
}

/// A representative item of `n` encoder tokens for `model`'s encoder family, used
/// to time encode grid points from the roofline:
/// * CLIP anyres: tiles of `(image_size/patch)^2 + 1` tokens, span one tile;
/// * Qwen ViT: one image, span = all its tokens, `n / merge^2` LLM tokens;
/// * Whisper: 30 s windows of `frames_per_window` frames, `n / stack` LLM tokens;
/// * tiled ViT: tiles of `(image_size/patch)^2 + 1` tokens, a quarter (pixel
///   shuffle 2) of the patches as LLM tokens;
/// * Qwen3-Omni audio: one token per LLM token, windows of 104.
pub fn synthetic_item(model: &easerve_model::ModelArch, n: u64) -> ItemTokens {
    use easerve_model::EncoderKind;
    let n = n.max(1);
    match model.encoder.as_ref().map(|e| &e.kind) {
        Some(EncoderKind::ClipAnyres {
            image_size, patch, ..
        }) => {
            let side = u64::from(image_size / patch.max(&1));
            let tile = side * side + 1;
            ItemTokens {
                encoder_tokens: n,
                llm_tokens: n,
                attn_span: n.min(tile),
            }
        }
        Some(EncoderKind::Siglip {
            image_size,
            patch,
            pooled_side,
            ..
        }) => {
            let side = u64::from(image_size / patch.max(&1)).max(1);
            let per = (side * side) / u64::from(*pooled_side).pow(2).max(1);
            ItemTokens {
                encoder_tokens: n,
                llm_tokens: (n / per.max(1)).max(1),
                attn_span: n.min(side * side),
            }
        }
        Some(EncoderKind::TiledVit {
            image_size,
            patch,
            pixel_shuffle,
            ..
        }) => {
            let side = u64::from(image_size / patch.max(&1)).max(1);
            let tile = side * side + 1;
            let per = side * side / u64::from(*pixel_shuffle).pow(2).max(1);
            ItemTokens {
                encoder_tokens: n,
                llm_tokens: (n * per / tile).max(1),
                attn_span: n.min(tile),
            }
        }
        Some(EncoderKind::OmniAudio {
            chunk_frames,
            window_chunks,
            ..
        }) => {
            let per =
                easerve_model::tokens::omni_audio_tokens(u64::from(*chunk_frames), *chunk_frames);
            ItemTokens {
                encoder_tokens: n,
                llm_tokens: n,
                attn_span: n.min(u64::from(*window_chunks) * per).max(1),
            }
        }
        Some(EncoderKind::QwenVit { spatial_merge, .. }) => {
            let m = u64::from(*spatial_merge).pow(2).max(1);
            ItemTokens {
                encoder_tokens: n,
                llm_tokens: (n / m).max(1),
                attn_span: n,
            }
        }
        Some(EncoderKind::Whisper {
            frames_per_window,
            stack,
            ..
        }) => ItemTokens {
            encoder_tokens: n,
            llm_tokens: (n / u64::from(*stack).max(1)).max(1),
            attn_span: n.min(u64::from(*frames_per_window)),
        },
        None => ItemTokens {
            encoder_tokens: n,
            llm_tokens: n,
            attn_span: n,
        },
    }
}

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

    /// Write the profile to `path` in the canonical layout.
    pub fn save(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        std::fs::write(path, self.to_toml_string())
    }

    /// The encode table (absent for a text-only model).
    pub fn encode_table(&self) -> Option<&Table> {
        self.encode.as_ref()
    }
    /// The prefill table.
    pub fn prefill_table(&self) -> &Table {
        &self.prefill
    }
    /// The decode table.
    pub fn decode_table(&self) -> &Table {
        &self.decode
    }
    /// The transfer tables, one per link.
    pub fn transfer_tables(&self) -> &[Table] {
        &self.transfer
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
            Stage::Transfer => None,
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

    /// A profile of the roofline `r` on the grid `g`, dated `date` (`YYYY-MM-DD`).
    ///
    /// Each grid point is timed by `r` exactly: encode over `batch` copies of
    /// [`synthetic_item`] with `encoder_tokens` tokens, split into `t_pass`, `t_pre`
    /// and the GPU rest (`p90 = median`: the roofline is deterministic); prefill of
    /// **one** sequence of `tokens` tokens (so a lookup for several shorter
    /// sequences slightly overstates attention: a few % at 34B sizes); decode and
    /// transfer as [`Roofline::decode_step`] and [`Roofline::transfer`]. Latencies
    /// are written in seconds. A model without encoder gets no encode table.
    pub fn from_roofline(r: &Roofline, g: &GridSpec, date: &str) -> Profile {
        let e = &r.eff;
        let provenance = Provenance {
            model: r.model.name.clone(),
            device: r.gpu.name.clone(),
            link: r.gpu.link.name.clone(),
            source: Source::Roofline,
            backend: "none (computed)".into(),
            driver: "none (computed)".into(),
            libraries: vec![format!("easerve-calib {}", env!("CARGO_PKG_VERSION"))],
            date: date.into(),
            method: format!(
                "roofline max(flops/(peak*gemm_eff*usable), bytes/(bw*mem_eff)) + per-layer overhead + TP ring all-reduce; gemm_eff {} (fitted A100 curve of tokens and TP: {}), mem_eff {}, layer_overhead_s {}, {}, prefill_batch_s {}, decode_step_s {}, tokens_to_fill_gpu {}",
                e.gemm_eff, e.gemm_eff_from_fit, e.mem_eff, e.layer_overhead_s,
                match &r.terms {
                    Some(t) => format!("encode {}", t.note()),
                    None => format!(
                        "encode_pass_s {}, preprocess_item_s {}, preprocess_per_token_s {}",
                        e.encode_pass_s, e.preprocess_item_s, e.preprocess_per_token_s
                    ),
                },
                e.prefill_batch_s, e.decode_step_s, e.tokens_to_fill_gpu
            ),
            repetitions: 0,
        };
        Profile::from_cost(
            r,
            &r.model,
            &r.gpu,
            provenance,
            g,
            (
                e.time_slice_penalty,
                e.bandwidth_interference,
                "easerve-calib Efficiency defaults (assumptions, see calib/src/eff.rs)",
            ),
        )
    }

    /// A profile of any stage cost `r` of `model` on `gpu` on the grid `g`, timed at
    /// each grid point exactly as [`Profile::from_roofline`] describes, with the
    /// given provenance and `(time_slice_penalty, bandwidth_interference, note)`.
    /// The sampled latencies are made non-decreasing along the work axes
    /// ([`monotone_envelope`]): a cost priced from measured kernels can dip between
    /// grid points where the tables switch kernels, and a profile may not; when
    /// that raises a value, `provenance.method` says how many.
    pub fn from_cost(
        r: &dyn StageCost,
        model: &easerve_model::ModelArch,
        gpu: &GpuSpec,
        mut provenance: Provenance,
        g: &GridSpec,
        scalars: (f64, f64, &str),
    ) -> Profile {
        let s = |v: &[u64]| -> Vec<f64> { v.iter().map(|&x| x as f64).collect() };
        let cols = |c: &[&str]| -> Vec<String> { c.iter().map(|x| x.to_string()).collect() };
        let mut raised = 0;
        let encode = model.encoder.as_ref().map(|_| {
            let mut rows = Vec::new();
            for &b in &g.encode_batch {
                for &n in &g.encode_tokens {
                    let items = vec![synthetic_item(model, n); b as usize];
                    for &sm in &g.sm_levels {
                        let t = r.encode(&items, sm);
                        let m = t.total();
                        rows.push(vec![b as f64, n as f64, sm, m, m, t.t_pass, t.t_pre]);
                    }
                }
            }
            raised += monotone_envelope(Stage::Encode, &mut rows);
            Table::build(
                Stage::Encode,
                None,
                TimeUnit::S,
                cols(&[
                    "batch",
                    "encoder_tokens",
                    "sm_level",
                    "median",
                    "p90",
                    "t_pass",
                    "t_pre",
                ]),
                rows,
            )
        });
        let mut rows = Vec::new();
        for &n in &g.prefill_tokens {
            for &tp in &g.tp {
                for &sm in &g.sm_levels {
                    rows.push(vec![
                        n as f64,
                        f64::from(tp),
                        sm,
                        r.prefill(&[n], tp.into(), sm),
                    ]);
                }
            }
        }
        raised += monotone_envelope(Stage::Prefill, &mut rows);
        let prefill = Table::build(
            Stage::Prefill,
            None,
            TimeUnit::S,
            cols(&["tokens", "tp", "sm_level", "median"]),
            rows,
        );
        let mut rows = Vec::new();
        for &b in &g.decode_batch {
            for &c in &g.decode_context {
                for &tp in &g.tp {
                    rows.push(vec![
                        b as f64,
                        c as f64,
                        f64::from(tp),
                        r.decode_step(b, c, tp.into()),
                    ]);
                }
            }
        }
        raised += monotone_envelope(Stage::Decode, &mut rows);
        if raised > 0 {
            provenance.method.push_str(&format!(
                "; {raised} sampled latencies raised to make them non-decreasing along work axes (running max)"
            ));
        }
        let decode = Table::build(
            Stage::Decode,
            None,
            TimeUnit::S,
            cols(&["batch", "context_tokens", "tp", "median"]),
            rows,
        );
        let rows = s(&g.transfer_bytes)
            .into_iter()
            .map(|b| vec![b, r.transfer(b)])
            .collect();
        let transfer = vec![Table::build(
            Stage::Transfer,
            Some(gpu.link.name.clone()),
            TimeUnit::S,
            cols(&["bytes", "median"]),
            rows,
        )];
        Profile {
            origin: format!(
                "<{} {} on {}>",
                provenance.source.as_str(),
                model.name,
                gpu.name
            ),
            provenance,
            time_slice_penalty: scalars.0,
            bandwidth_interference: scalars.1,
            scalars_note: scalars.2.into(),
            prefill_batching: PrefillBatching::Packed,
            encode,
            prefill,
            decode,
            transfer,
        }
    }

    /// A profile from measured rows, validated exactly as a file would be (full grid,
    /// axes sorted, latency non-decreasing along work axes within
    /// [`MONOTONE_TOLERANCE`]). Rows use the standard columns in seconds: encode
    /// `[batch, encoder_tokens, sm_level, median, p90, t_pass, t_pre]`, prefill
    /// `[tokens, tp, sm_level, median, p90]`, decode `[batch, context_tokens, tp,
    /// median, p90]`, transfer `[bytes, median, p90]` over `provenance.link`. Rows may
    /// come in any order; pass them through [`monotone_envelope`] first to remove
    /// timing noise along work axes.
    ///
    /// Errors: what [`Profile::from_toml_str`] reports for the same tables.
    pub fn from_measurements(
        provenance: Provenance,
        scalars: (f64, f64, String),
        encode: Option<Vec<Vec<f64>>>,
        prefill: Vec<Vec<f64>>,
        decode: Vec<Vec<f64>>,
        transfer: Vec<Vec<f64>>,
    ) -> Result<Profile, ProfileError> {
        let cols = |stage: Stage| -> Vec<String> {
            let mut c: Vec<String> = stage.axes().iter().map(|a| a.to_string()).collect();
            c.push("median".into());
            c.extend(stage.optional_columns().iter().map(|a| a.to_string()));
            c
        };
        let sorted = |mut rows: Vec<Vec<f64>>, axes: usize| {
            rows.sort_by(|a, b| {
                a[..axes]
                    .iter()
                    .zip(&b[..axes])
                    .map(|(x, y)| x.total_cmp(y))
                    .find(|o| o.is_ne())
                    .unwrap_or(std::cmp::Ordering::Equal)
            });
            rows
        };
        let table = |stage: Stage, link: Option<String>, rows: Vec<Vec<f64>>| {
            let n = stage.axes().len();
            Table::build(stage, link, TimeUnit::S, cols(stage), sorted(rows, n))
        };
        let link = provenance.link.clone();
        let p = Profile {
            origin: format!("<measured {} on {}>", provenance.model, provenance.device),
            time_slice_penalty: scalars.0,
            bandwidth_interference: scalars.1,
            scalars_note: scalars.2,
            prefill_batching: PrefillBatching::Padded,
            encode: encode.map(|r| table(Stage::Encode, None, r)),
            prefill: table(Stage::Prefill, None, prefill),
            decode: table(Stage::Decode, None, decode),
            transfer: vec![table(Stage::Transfer, Some(link.clone()), transfer)],
            provenance,
        };
        let extra_dev = [p.provenance.device.clone()];
        let checked = Profile::from_toml_str_with_devices(
            &p.to_toml_string(),
            &p.origin,
            &extra_dev,
            &[link],
        )?;
        Ok(checked)
    }

    /// The profile in the canonical TOML layout (see `calib/README.md`).
    pub fn to_toml_string(&self) -> String {
        let q = |s: &str| toml::Value::String(s.to_string()).to_string();
        let p = &self.provenance;
        let mut o = String::new();
        let _ = writeln!(o, "# easerve profile (format: calib/README.md)");
        let _ = writeln!(o, "format = {FORMAT_VERSION}");
        let _ = writeln!(o, "\n[provenance]");
        let _ = writeln!(o, "model = {}", q(&p.model));
        let _ = writeln!(o, "device = {}", q(&p.device));
        let _ = writeln!(o, "link = {}", q(&p.link));
        let _ = writeln!(o, "source = {}", q(p.source.as_str()));
        let _ = writeln!(o, "backend = {}", q(&p.backend));
        let _ = writeln!(o, "driver = {}", q(&p.driver));
        let libs: Vec<String> = p.libraries.iter().map(|l| q(l)).collect();
        let _ = writeln!(o, "libraries = [{}]", libs.join(", "));
        let _ = writeln!(o, "date = {}", q(&p.date));
        let _ = writeln!(o, "method = {}", q(&p.method));
        let _ = writeln!(o, "repetitions = {}", p.repetitions);
        let _ = writeln!(o, "\n[scalars]");
        let _ = writeln!(o, "time_slice_penalty = {:?}", self.time_slice_penalty);
        let _ = writeln!(
            o,
            "bandwidth_interference = {:?}",
            self.bandwidth_interference
        );
        let _ = writeln!(o, "note = {}", q(&self.scalars_note));
        if self.prefill_batching != PrefillBatching::Packed {
            let _ = writeln!(
                o,
                "prefill_batching = {}",
                q(self.prefill_batching.as_str())
            );
        }
        let mut tables: Vec<&Table> = Vec::new();
        tables.extend(self.encode.as_ref());
        tables.push(&self.prefill);
        tables.push(&self.decode);
        tables.extend(self.transfer.iter());
        for t in tables {
            if t.stage == Stage::Transfer {
                let _ = writeln!(o, "\n[[transfer]]");
                let _ = writeln!(o, "link = {}", q(t.link.as_deref().unwrap_or("")));
            } else {
                let _ = writeln!(o, "\n[{}]", t.stage.name());
            }
            let _ = writeln!(o, "unit = {}", q(t.unit.as_str()));
            let cols: Vec<String> = t.columns.iter().map(|c| q(c)).collect();
            let _ = writeln!(o, "columns = [{}]", cols.join(", "));
            let _ = writeln!(o, "rows = [");
            let n_axes = t.stage.axes().len();
            for r in &t.rows {
                let cells: Vec<String> = r
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        if i < n_axes && is_integer_axis(t.stage.axes()[i]) {
                            format!("{}", *v as u64)
                        } else {
                            format!("{v:?}")
                        }
                    })
                    .collect();
                let _ = writeln!(o, "  [{}],", cells.join(", "));
            }
            let _ = writeln!(o, "]");
        }
        o
    }

    /// The transfer table [`StageCost::transfer`] uses (the provenance's link).
    fn link_table(&self) -> &Table {
        self.transfer
            .iter()
            .find(|t| t.link.as_deref() == Some(self.provenance.link.as_str()))
            .unwrap_or(&self.transfer[0])
    }

    /// All tables, for reports.
    fn tables(&self) -> impl Iterator<Item = &Table> {
        self.encode
            .iter()
            .chain([&self.prefill, &self.decode])
            .chain(self.transfer.iter())
    }
}

fn is_integer_axis(name: &str) -> bool {
    name != "sm_level"
}

fn clamp_share(sm_share: f64) -> f64 {
    if sm_share.is_finite() {
        sm_share.clamp(MIN_SM_SHARE, 1.0)
    } else {
        1.0
    }
}

impl StageCost for Profile {
    /// Encode: `batch = items.len()`, `encoder_tokens` = their mean; `t_gpu` is
    /// the table's `median − t_pass − t_pre` (all of `median` when the split is
    /// unknown). Empty batches cost nothing.
    fn encode(&self, items: &[ItemTokens], sm_share: f64) -> EncodeTime {
        let Some(t) = self.encode.as_ref() else {
            return EncodeTime::default();
        };
        if items.is_empty() {
            return EncodeTime::default();
        }
        let total: u64 = items.iter().map(|i| i.encoder_tokens).sum();
        let per_item = (total as f64 / items.len() as f64).max(1.0);
        let v = t.lookup(&[items.len() as f64, per_item, clamp_share(sm_share)]);
        EncodeTime {
            t_gpu: v[0],
            t_pass: v[1],
            t_pre: v[2],
        }
    }

    /// Prefill: looked up at the batch's total tokens and the worker's TP (a
    /// profile is measured per TP degree; an EP degree is not a key of it).
    fn prefill(&self, seq_lens: &[u64], par: Parallel, sm_share: f64) -> f64 {
        let tp = par.tp;
        let tokens: u64 = seq_lens.iter().sum();
        if tokens == 0 {
            return 0.0;
        }
        let at = |n: u64| {
            self.prefill
                .lookup(&[n as f64, f64::from(tp.max(1)), clamp_share(sm_share)])[0]
        };
        match self.prefill_batching {
            PrefillBatching::Packed => at(tokens),
            PrefillBatching::Padded => {
                let longest = seq_lens.iter().copied().max().unwrap_or(0);
                seq_lens.iter().filter(|&&l| l > 0).count() as f64 * at(longest)
            }
        }
    }

    fn decode_step(&self, batch: u64, total_context_tokens: u64, par: Parallel) -> f64 {
        let tp = par.tp;
        if batch == 0 {
            return 0.0;
        }
        self.decode.lookup(&[
            batch as f64,
            total_context_tokens.max(1) as f64,
            f64::from(tp.max(1)),
        ])[0]
    }

    fn transfer(&self, bytes: f64) -> f64 {
        if bytes.is_nan() || bytes <= 0.0 {
            return 0.0;
        }
        self.link_table().lookup(&[bytes])[0]
    }

    fn time_slice_penalty(&self) -> f64 {
        self.time_slice_penalty
    }

    fn bandwidth_interference(&self) -> f64 {
        self.bandwidth_interference
    }

    /// The profile's provenance, then one line per table whose lookups left the
    /// table since the previous call (counters are reset by this call).
    fn notes(&self) -> Vec<String> {
        let p = &self.provenance;
        let mut notes = vec![format!(
            "costs from profile {} ({} {} on {}, {}; backend {}; driver {}; {} repetitions; {}); contention scalars: {}",
            self.origin,
            p.source.as_str(),
            p.model,
            p.device,
            p.date,
            p.backend,
            p.driver,
            p.repetitions,
            p.method,
            self.scalars_note
        )];
        for t in self.tables() {
            let c = t.counter.take();
            if c.extrapolated == 0 {
                continue;
            }
            let mut parts = Vec::new();
            for (d, &(below, above)) in c.per_axis.iter().enumerate() {
                let name = t.stage.axes()[d];
                let axis = &t.axes()[d];
                if below > 0 {
                    parts.push(format!("{name} below {} ({below})", axis[0]));
                }
                if above > 0 {
                    parts.push(format!("{name} above {} ({above})", axis[axis.len() - 1]));
                }
            }
            notes.push(format!(
                "profile {}: {} of {} {} lookups ({:.1} %) extrapolated beyond the table: {}",
                self.origin,
                c.extrapolated,
                c.lookups,
                t.label(),
                100.0 * c.extrapolated as f64 / c.lookups.max(1) as f64,
                parts.join(", ")
            ));
        }
        notes
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
    fn err(&self, table: Option<&str>, row: Option<usize>, message: String) -> ProfileError {
        ProfileError {
            file: self.file.to_string(),
            table: table.map(str::to_string),
            row,
            message,
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
        let encode = match doc.get("encode") {
            None => None,
            Some(v) => Some(self.table("encode", Stage::Encode, self.as_table("encode", v)?)?),
        };
        let prefill = self.table("prefill", Stage::Prefill, self.sub_table(&doc, "prefill")?)?;
        let decode = self.table("decode", Stage::Decode, self.sub_table(&doc, "decode")?)?;
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
        if !transfer
            .iter()
            .any(|t| t.link.as_deref() == Some(provenance.link.as_str()))
        {
            return Err(self.err(
                Some("transfer"),
                None,
                format!(
                    "no [[transfer]] table for the provenance's link `{}`",
                    provenance.link
                ),
            ));
        }
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
        })
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
            Some(toml::Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str().map(str::to_string).ok_or_else(|| {
                        self.err(Some(n), None, "`libraries` must be strings".into())
                    })
                })
                .collect::<Res<_>>()?,
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
            Some(toml::Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str().map(str::to_string).ok_or_else(|| {
                        self.err(Some(name), None, "`columns` must be strings".into())
                    })
                })
                .collect::<Res<_>>()?,
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

/// Make the `median` and `p90` of measured rows of `stage` non-decreasing along its
/// work axes (a running maximum over the grid), so timing noise between neighbouring
/// points does not make a table non-monotone. Rows are `[axes..., median, p90, ...]`
/// as for [`Profile::from_measurements`]; other columns are left as measured.
/// Returns how many values (medians and p90s) it raised.
pub fn monotone_envelope(stage: Stage, rows: &mut [Vec<f64>]) -> usize {
    let na = stage.axes().len();
    envelope_at(stage, &[na, na + 1], rows)
}

/// [`monotone_envelope`] for rows laid out as `columns` (the axes first, then value
/// columns in any order, e.g. a table read from a file): raises the `median` and
/// `p90` columns wherever they are, and leaves every other column as measured.
pub fn monotone_envelope_columns(stage: Stage, columns: &[String], rows: &mut [Vec<f64>]) -> usize {
    let at: Vec<usize> = ["median", "p90"]
        .iter()
        .filter_map(|name| columns.iter().position(|c| c == name))
        .collect();
    envelope_at(stage, &at, rows)
}

fn envelope_at(stage: Stage, value_cols: &[usize], rows: &mut [Vec<f64>]) -> usize {
    let before: Vec<Vec<f64>> = rows.to_vec();
    let axes = stage.axes();
    let na = axes.len();
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by(|&i, &j| {
        rows[i][..na]
            .iter()
            .zip(&rows[j][..na])
            .map(|(x, y)| x.total_cmp(y))
            .find(|o| o.is_ne())
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    // Lexicographic order visits every lower point along each axis first.
    for _ in 0..na {
        for a in 0..na {
            if !is_work_axis(stage, axes[a]) {
                continue;
            }
            for (pos, &i) in order.iter().enumerate() {
                let prev = order[..pos].iter().rev().find(|&&j| {
                    (0..na).all(|d| d == a || rows[j][d] == rows[i][d]) && rows[j][a] < rows[i][a]
                });
                if let Some(&j) = prev {
                    for &c in value_cols {
                        if c < rows[i].len() && rows[i][c] < rows[j][c] {
                            rows[i][c] = rows[j][c];
                        }
                    }
                }
            }
        }
    }
    rows.iter()
        .zip(&before)
        .map(|(r, b)| r.iter().zip(b).filter(|(x, y)| x != y).count())
        .sum()
}

fn number(v: &toml::Value) -> Option<f64> {
    match v {
        toml::Value::Integer(i) => Some(*i as f64),
        toml::Value::Float(f) => Some(*f),
        _ => None,
    }
}

/// Today's date (UTC) as `YYYY-MM-DD`, from the system clock.
pub fn today_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Days since 1970-01-01 → (year, month, day) in the proleptic Gregorian
/// calendar (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roof(model: &str, gpu: &str) -> Roofline {
        crate::roofline::preset_roofline(model, gpu)
    }

    fn small_grid() -> GridSpec {
        GridSpec {
            encode_batch: vec![1, 2, 4],
            encode_tokens: vec![256, 1024],
            sm_levels: vec![0.5, 1.0],
            prefill_tokens: vec![128, 1024],
            tp: vec![1, 2],
            decode_batch: vec![1, 8],
            decode_context: vec![1024, 8192],
            transfer_bytes: vec![1024, 1 << 20],
        }
    }

    fn rel(a: f64, b: f64) -> f64 {
        (a - b).abs() / b.abs().max(1e-300)
    }

    #[test]
    fn the_envelope_finds_median_and_p90_by_name() {
        // Prefill rows laid out [tokens, tp, sm_level, p90, t_extra, median]: the
        // 1024-token point dips below the 128-token point in median and p90.
        let columns: Vec<String> = ["tokens", "tp", "sm_level", "p90", "t_extra", "median"]
            .iter()
            .map(|c| c.to_string())
            .collect();
        let mut rows = vec![
            vec![128.0, 1.0, 1.0, 0.012, 5.0, 0.010],
            vec![1024.0, 1.0, 1.0, 0.011, 1.0, 0.009],
        ];
        let raised = monotone_envelope_columns(Stage::Prefill, &columns, &mut rows);
        assert_eq!(raised, 2);
        assert_eq!(rows[1], vec![1024.0, 1.0, 1.0, 0.012, 1.0, 0.010]);
        // The positional form would have raised column 3 and 4 (p90, t_extra).
        let mut positional = vec![
            vec![128.0, 1.0, 1.0, 0.012, 5.0, 0.010],
            vec![1024.0, 1.0, 1.0, 0.011, 1.0, 0.009],
        ];
        monotone_envelope(Stage::Prefill, &mut positional);
        assert_eq!(positional[1][4], 5.0);
    }

    #[test]
    fn written_read_written_is_byte_identical() {
        for model in ["llava-v1.6-34b", "qwen2.5-vl-32b", "text-lm-tiny"] {
            let p = Profile::from_roofline(
                &roof(model, "a100-sxm4-80gb"),
                &GridSpec::default(),
                "2025-01-02",
            );
            let a = p.to_toml_string();
            let q = Profile::from_toml_str(&a, "mem").unwrap();
            let b = q.to_toml_string();
            assert!(a == b, "{model}: second write differs");
            assert_eq!(q.encode_table(), p.encode_table());
            assert_eq!(q.provenance, p.provenance);
        }
    }

    #[test]
    fn save_and_load_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        let p = Profile::from_roofline(
            &roof("llava-v1.6-34b", "rtx-6000-ada"),
            &small_grid(),
            "2025-01-02",
        );
        p.save(&path).unwrap();
        let q = Profile::load(&path).unwrap();
        assert_eq!(q.to_toml_string(), p.to_toml_string());
        assert_eq!(q.origin, path.display().to_string());
        let e = Profile::load(dir.path().join("missing.toml")).unwrap_err();
        assert!(e.to_string().contains("missing.toml"), "{e}");
    }

    /// Errors between grid points: the median must stay under 1 % and the worst
    /// under `max_allowed`. The worst cases sit where the roofline has a kink
    /// inside a cell (no smooth measured curve has one): `max(compute, memory)`
    /// switching, e.g. a ~100-token prefill at 28 % of the SMs (up to ~17 % with
    /// the fitted GEMM efficiency), and the
    /// encode SM-share knee `min(share, tokens / tokens_to_fill_gpu)`, which
    /// moves `t_gpu` alone by up to ~21 % (the pass total, dominated by `t_pass`,
    /// far less).
    fn check_between(what: &str, mut errs: Vec<f64>, max_allowed: f64) {
        errs.sort_by(f64::total_cmp);
        let med = errs[errs.len() / 2];
        let max = errs[errs.len() - 1];
        println!(
            "{what}: {} points between the grid, median error {:.3} %, max {:.2} %",
            errs.len(),
            med * 100.0,
            max * 100.0
        );
        assert!(
            med < 0.01 && max < max_allowed,
            "{what}: median {med}, max {max}"
        );
    }

    /// At grid points the profile returns the roofline's figures (to rounding);
    /// at the geometric midpoints of every cell within a few % ([`check_between`]).
    #[test]
    fn roofline_profile_agrees_with_roofline() {
        let g = GridSpec::default();
        for (model, gpu) in [
            ("llava-v1.6-34b", "rtx-6000-ada"),
            ("qwen2.5-vl-32b", "h100-sxm"),
            ("ultravox-v0.6-27b", "a100-sxm4-80gb"),
        ] {
            let r = roof(model, gpu);
            let p = Profile::from_roofline(&r, &g, "2025-01-02");
            let mid = |v: &[u64], i: usize| ((v[i] as f64 * v[i + 1] as f64).sqrt()).round() as u64;
            let smid = |i: usize| (g.sm_levels[i] * g.sm_levels[i + 1]).sqrt();
            let (mut errs, mut gpu_errs) = (Vec::new(), Vec::new());
            for bi in 0..g.encode_batch.len() - 1 {
                for ti in 0..g.encode_tokens.len() - 1 {
                    for si in 0..g.sm_levels.len() - 1 {
                        let (b, n, s) = (g.encode_batch[bi], g.encode_tokens[ti], g.sm_levels[si]);
                        let items = vec![synthetic_item(&r.model, n); b as usize];
                        let want = r.encode(&items, s);
                        let got = StageCost::encode(&p, &items, s);
                        assert!(
                            rel(got.total(), want.total()) < 1e-9,
                            "{model} encode {b} {n} {s}"
                        );
                        assert!(
                            rel(got.t_gpu, want.t_gpu) < 1e-9,
                            "{model} encode {b} {n} {s}"
                        );
                        assert!(rel(got.t_pre, want.t_pre) < 1e-12);
                        assert_eq!(got.t_pass, want.t_pass);
                        let (b, n, s) = (
                            mid(&g.encode_batch, bi),
                            mid(&g.encode_tokens, ti),
                            smid(si),
                        );
                        let items = vec![synthetic_item(&r.model, n); b as usize];
                        let want = r.encode(&items, s);
                        let got = StageCost::encode(&p, &items, s);
                        errs.push(rel(got.total(), want.total()));
                        gpu_errs.push(rel(got.t_gpu, want.t_gpu));
                    }
                }
            }
            check_between(&format!("{model} encode"), errs, 0.10);
            check_between(&format!("{model} encode t_gpu"), gpu_errs, 0.25);
            let mut errs = Vec::new();
            for ni in 0..g.prefill_tokens.len() - 1 {
                for &tp in &g.tp {
                    for si in 0..g.sm_levels.len() - 1 {
                        let (n, s) = (g.prefill_tokens[ni], g.sm_levels[si]);
                        let (got, want) = (
                            StageCost::prefill(&p, &[n], tp.into(), s),
                            r.prefill(&[n], tp, s),
                        );
                        assert!(rel(got, want) < 1e-12);
                        let (n, s) = (mid(&g.prefill_tokens, ni), smid(si));
                        errs.push(rel(
                            StageCost::prefill(&p, &[n], tp.into(), s),
                            r.prefill(&[n], tp, s),
                        ));
                    }
                }
            }
            check_between(&format!("{model} prefill"), errs, 0.20);
            let mut errs = Vec::new();
            for bi in 0..g.decode_batch.len() - 1 {
                for ci in 0..g.decode_context.len() - 1 {
                    for &tp in &g.tp {
                        let (b, c) = (g.decode_batch[bi], g.decode_context[ci]);
                        assert!(
                            rel(p.decode_step(b, c, tp.into()), r.decode_step(b, c, tp)) < 1e-12
                        );
                        let (b, c) = (mid(&g.decode_batch, bi), mid(&g.decode_context, ci));
                        errs.push(rel(p.decode_step(b, c, tp.into()), r.decode_step(b, c, tp)));
                    }
                }
            }
            check_between(&format!("{model} decode"), errs, 0.15);
            let mut errs = Vec::new();
            for i in 0..g.transfer_bytes.len() - 1 {
                let b = g.transfer_bytes[i] as f64;
                assert!(rel(StageCost::transfer(&p, b), r.transfer(b)) < 1e-12);
                let b = mid(&g.transfer_bytes, i) as f64;
                errs.push(rel(StageCost::transfer(&p, b), r.transfer(b)));
            }
            check_between(&format!("{model} transfer"), errs, 0.10);
            assert_eq!(p.time_slice_penalty(), r.eff.time_slice_penalty);
            assert_eq!(p.bandwidth_interference(), r.eff.bandwidth_interference);
            // nothing above extrapolated: only the provenance note
            assert_eq!(p.notes().len(), 1, "{:?}", p.notes());
        }
    }

    #[test]
    fn extrapolation_is_reported_once_with_counts_and_then_reset() {
        let p = Profile::from_roofline(
            &roof("llava-v1.6-34b", "rtx-6000-ada"),
            &small_grid(),
            "2025-01-02",
        );
        for _ in 0..3 {
            p.prefill(&[4096], 2.into(), 1.0); // tokens above 1024
        }
        p.prefill(&[512], 2.into(), 1.0);
        p.decode_step(4, 4096, 8.into()); // tp above 2
        let notes = p.notes();
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(
            notes[1].contains("3 of 4 prefill lookups")
                && notes[1].contains("tokens above 1024 (3)"),
            "{}",
            notes[1]
        );
        assert!(
            notes[2].contains("1 of 1 decode lookups") && notes[2].contains("tp above 2 (1)"),
            "{}",
            notes[2]
        );
        // extrapolating tokens extends the edge cell (grows), never clamps
        assert!(p.prefill(&[4096], 2.into(), 1.0) > p.prefill(&[1024], 2.into(), 1.0));
        let _ = p.notes();
        assert_eq!(p.notes().len(), 1);
    }

    #[test]
    fn empty_work_costs_nothing() {
        let p = Profile::from_roofline(
            &roof("llava-v1.6-34b", "rtx-6000-ada"),
            &small_grid(),
            "2025-01-02",
        );
        assert_eq!(StageCost::encode(&p, &[], 1.0), EncodeTime::default());
        assert_eq!(StageCost::prefill(&p, &[], 2.into(), 1.0), 0.0);
        assert_eq!(p.decode_step(0, 0, 2.into()), 0.0);
        assert_eq!(StageCost::transfer(&p, 0.0), 0.0);
        let t = Profile::from_roofline(
            &roof("text-lm-tiny", "rtx-6000-ada"),
            &small_grid(),
            "2025-01-02",
        );
        assert!(t.encode_table().is_none());
        let item = ItemTokens {
            encoder_tokens: 100,
            llm_tokens: 10,
            attn_span: 100,
        };
        assert_eq!(StageCost::encode(&t, &[item], 1.0), EncodeTime::default());
    }

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

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(today_utc().len(), 10);
    }
}
