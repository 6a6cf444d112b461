//! Import of Vidur's per-operator A100 timings and the fits made from them.
//!
//! Vidur (github.com/microsoft/vidur, `data/profiling/`, MIT) publishes per-layer
//! operator timings measured with CUDA events: `*_mlp.csv` (the non-attention ops of
//! one transformer layer vs `num_tokens`, at TP 1/2/4/8; columns
//! `time_stats.<op>.{min,max,mean,median,std}` in milliseconds) and
//! `*_all_reduce.csv` (NCCL all-reduce; `size` = number of fp16 elements). The data
//! sits outside the repository (`../shared/data/vidur-a100/`); only the fitted
//! numbers are copied into [`crate::fitted`].
//!
//! Two fits:
//!
//! * **GEMM efficiency** per TP degree: the four projections of a layer
//!   (`attn_pre_proj` = QKV, `attn_post_proj` = O, `mlp_up_proj` = gate+up,
//!   `mlp_down_proj`) take `t = flops / (peak · eff(n))` with
//!   `flops = 2 · params / tp · n` and `eff(n) = e_max · n / (n + k)`, i.e.
//!   `t = 2 · params / tp / (peak · e_max) · (n + k)`: a line in `n` whose intercept
//!   (the weight-streaming / launch floor of a small GEMM) scales with the matrix.
//!   `1/e_max` and `k/e_max` are found by least squares on the **relative** error
//!   (weights `1/y²`), over every row of the fitting file.
//! * **All-reduce** per TP degree on one node (`num_workers == devices_per_node`):
//!   `t = latency + bytes / bandwidth`, also by relative least squares.
//!
//! [`cross_model_error`] then predicts another model's CSV (same device) with the
//! curves and gives the median absolute relative error per TP degree.

use std::path::Path;

use crate::fitted::{AllReduceCurve, GemmEffCurve};

/// A CSV that could not be read: names the file, the row and the field.
#[derive(Debug, Clone, PartialEq)]
pub struct VidurError {
    /// The file.
    pub file: String,
    /// 1-based data row (after the header), when one is at fault.
    pub row: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for VidurError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Vidur CSV {}", self.file)?;
        if let Some(r) = self.row {
            write!(f, ", row {r}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for VidurError {}

/// The GEMM operators of one layer that the efficiency fit uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmOp {
    /// Q, K, V projections: `hidden × (heads + 2·kv_heads) · head_dim`.
    AttnPreProj,
    /// Output projection: `heads · head_dim × hidden`.
    AttnPostProj,
    /// Gate + up projections (gated MLP): `hidden × 2 · ffn`.
    MlpUpProj,
    /// Down projection: `ffn × hidden`.
    MlpDownProj,
}

/// All [`GemmOp`]s.
pub const GEMM_OPS: [GemmOp; 4] = [
    GemmOp::AttnPreProj,
    GemmOp::AttnPostProj,
    GemmOp::MlpUpProj,
    GemmOp::MlpDownProj,
];

impl GemmOp {
    /// Vidur's operator name (`time_stats.<name>.median`).
    pub fn name(self) -> &'static str {
        match self {
            GemmOp::AttnPreProj => "attn_pre_proj",
            GemmOp::AttnPostProj => "attn_post_proj",
            GemmOp::MlpUpProj => "mlp_up_proj",
            GemmOp::MlpDownProj => "mlp_down_proj",
        }
    }
}

/// One row of a Vidur `*_mlp.csv`: model shape, tokens, TP and the GEMM medians.
#[derive(Clone, Debug, PartialEq)]
pub struct MlpRow {
    /// `num_tokens`.
    pub tokens: u64,
    /// `num_tensor_parallel_workers`.
    pub tp: u32,
    /// `n_embd`.
    pub hidden: u64,
    /// `n_expanded_embd` (FFN width).
    pub ffn: u64,
    /// `n_head`.
    pub heads: u64,
    /// `n_kv_head`.
    pub kv_heads: u64,
    /// `use_gated_mlp`.
    pub gated: bool,
    /// Median seconds of each [`GEMM_OPS`] operator, same order.
    pub median_s: [f64; 4],
}

impl MlpRow {
    /// Weight parameters of `op`, unsharded.
    pub fn params(&self, op: GemmOp) -> f64 {
        let h = self.hidden as f64;
        let hd = h / self.heads.max(1) as f64;
        let q = self.heads as f64 * hd;
        let kv = self.kv_heads as f64 * hd;
        let up = if self.gated { 2.0 } else { 1.0 };
        match op {
            GemmOp::AttnPreProj => h * (q + 2.0 * kv),
            GemmOp::AttnPostProj => q * h,
            GemmOp::MlpUpProj => h * up * self.ffn as f64,
            GemmOp::MlpDownProj => self.ffn as f64 * h,
        }
    }
}

/// One row of a Vidur all-reduce CSV.
#[derive(Clone, Debug, PartialEq)]
pub struct AllReduceRow {
    /// `num_workers`.
    pub tp: u32,
    /// `devices_per_node`.
    pub devices_per_node: u32,
    /// Bytes reduced: `2 · size` (fp16 elements).
    pub bytes: f64,
    /// Median seconds.
    pub median_s: f64,
}

struct Csv {
    file: String,
    header: csv::StringRecord,
    records: Vec<csv::StringRecord>,
}

impl Csv {
    fn read(path: &Path) -> Result<Csv, VidurError> {
        let file = path.display().to_string();
        let err = |row: Option<usize>, message: String| VidurError {
            file: file.clone(),
            row,
            message,
        };
        let mut r =
            csv::Reader::from_path(path).map_err(|e| err(None, format!("cannot read: {e}")))?;
        let header = r
            .headers()
            .map_err(|e| err(None, format!("no header: {e}")))?
            .clone();
        let records = r
            .records()
            .enumerate()
            .map(|(i, rec)| rec.map_err(|e| err(Some(i + 1), e.to_string())))
            .collect::<Result<_, _>>()?;
        Ok(Csv {
            file,
            header,
            records,
        })
    }

    fn col(&self, name: &str) -> Result<usize, VidurError> {
        self.header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| VidurError {
                file: self.file.clone(),
                row: None,
                message: format!("missing column `{name}`"),
            })
    }

    fn num(&self, row: usize, col: usize, name: &str) -> Result<f64, VidurError> {
        let s = self.records[row].get(col).unwrap_or("");
        match s.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
            _ => Err(VidurError {
                file: self.file.clone(),
                row: Some(row + 1),
                message: format!("`{name}` = {s:?} is not a finite number ≥ 0"),
            }),
        }
    }
}

/// Read a Vidur `*_mlp.csv` (per-layer non-attention operators).
pub fn read_mlp_csv(path: impl AsRef<Path>) -> Result<Vec<MlpRow>, VidurError> {
    let c = Csv::read(path.as_ref())?;
    let names = [
        "num_tokens",
        "num_tensor_parallel_workers",
        "n_embd",
        "n_expanded_embd",
        "n_head",
        "n_kv_head",
    ];
    let cols = names.map(|n| c.col(n));
    let cols: Vec<usize> = cols.into_iter().collect::<Result<_, _>>()?;
    let gated = c.col("use_gated_mlp")?;
    let op_cols: Vec<(usize, String)> = GEMM_OPS
        .iter()
        .map(|op| {
            let n = format!("time_stats.{}.median", op.name());
            c.col(&n).map(|i| (i, n))
        })
        .collect::<Result<_, _>>()?;
    let mut out = Vec::with_capacity(c.records.len());
    for i in 0..c.records.len() {
        let v: Vec<f64> = cols
            .iter()
            .zip(names)
            .map(|(&k, n)| c.num(i, k, n))
            .collect::<Result<_, _>>()?;
        let mut median_s = [0.0; 4];
        for (m, (k, n)) in median_s.iter_mut().zip(&op_cols) {
            *m = c.num(i, *k, n)? * 1e-3;
        }
        out.push(MlpRow {
            tokens: v[0] as u64,
            tp: v[1] as u32,
            hidden: v[2] as u64,
            ffn: v[3] as u64,
            heads: v[4] as u64,
            kv_heads: v[5] as u64,
            gated: c.records[i].get(gated).is_some_and(|s| s.trim() == "True"),
            median_s,
        });
    }
    Ok(out)
}

/// Read a Vidur all-reduce CSV.
pub fn read_all_reduce_csv(path: impl AsRef<Path>) -> Result<Vec<AllReduceRow>, VidurError> {
    let c = Csv::read(path.as_ref())?;
    let (w, d, s, t) = (
        c.col("num_workers")?,
        c.col("devices_per_node")?,
        c.col("size")?,
        c.col("time_stats.all_reduce.median")?,
    );
    (0..c.records.len())
        .map(|i| {
            Ok(AllReduceRow {
                tp: c.num(i, w, "num_workers")? as u32,
                devices_per_node: c.num(i, d, "devices_per_node")? as u32,
                bytes: 2.0 * c.num(i, s, "size")?,
                median_s: c.num(i, t, "time_stats.all_reduce.median")? * 1e-3,
            })
        })
        .collect()
}

/// Least squares of `y ≈ a·x + b` minimising Σ ((a·x + b − y) / y)²; `None`
/// with fewer than two distinct `x` or a non-positive `y`.
pub fn fit_line_relative(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let (mut sxx, mut sx, mut s1, mut sxy, mut sy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(x, y) in points {
        if y.is_nan() || y <= 0.0 {
            return None;
        }
        let w = 1.0 / (y * y);
        sxx += w * x * x;
        sx += w * x;
        s1 += w;
        sxy += w * x * y;
        sy += w * y;
    }
    let det = sxx * s1 - sx * sx;
    if det.is_nan() || det == 0.0 || points.len() < 2 {
        return None;
    }
    let a = (sxy * s1 - sy * sx) / det;
    let b = (sxx * sy - sx * sxy) / det;
    Some((a, b))
}

/// Fit `eff(n) = e_max · n / (n + k)` per TP degree on `rows` (all four GEMMs of
/// every row), against `peak_flops` (dense BF16/FP16 FLOP/s of the device).
/// Rows with TPs that give a degenerate fit are skipped.
pub fn fit_gemm(rows: &[MlpRow], peak_flops: f64) -> Vec<GemmEffCurve> {
    let mut tps: Vec<u32> = rows.iter().map(|r| r.tp).collect();
    tps.sort_unstable();
    tps.dedup();
    tps.into_iter()
        .filter_map(|tp| {
            // y = t · peak · tp / (2 · params) = n / e_max + k / e_max
            let pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.tp == tp)
                .flat_map(|r| {
                    GEMM_OPS.iter().enumerate().map(move |(i, &op)| {
                        let y = r.median_s[i] * peak_flops * f64::from(tp) / (2.0 * r.params(op));
                        (r.tokens as f64, y)
                    })
                })
                .collect();
            let (a, b) = fit_line_relative(&pts)?;
            (a > 0.0).then(|| GemmEffCurve {
                tp,
                e_max: 1.0 / a,
                k_tokens: b / a,
            })
        })
        .collect()
}

/// Predicted seconds of `op` in `row` with `curve` on a device of `peak_flops`.
pub fn predict_gemm(curve: &GemmEffCurve, row: &MlpRow, op: GemmOp, peak_flops: f64) -> f64 {
    let n = row.tokens as f64;
    let flops = 2.0 * row.params(op) / f64::from(row.tp) * n;
    flops / (peak_flops * curve.eff(n))
}

/// Per TP degree: (TP, median absolute relative error, points) of predicting every
/// GEMM of `rows` with `tokens ≥ min_tokens` by the curve of that TP.
pub fn cross_model_error(
    curves: &[GemmEffCurve],
    rows: &[MlpRow],
    peak_flops: f64,
    min_tokens: u64,
) -> Vec<(u32, f64, usize)> {
    curves
        .iter()
        .map(|c| {
            let mut errs: Vec<f64> = rows
                .iter()
                .filter(|r| r.tp == c.tp && r.tokens >= min_tokens)
                .flat_map(|r| {
                    GEMM_OPS.iter().enumerate().map(move |(i, &op)| {
                        let want = r.median_s[i];
                        (predict_gemm(c, r, op, peak_flops) - want).abs() / want
                    })
                })
                .collect();
            errs.sort_by(f64::total_cmp);
            let n = errs.len();
            let med = match n {
                0 => f64::NAN,
                n if n % 2 == 1 => errs[n / 2],
                n => 0.5 * (errs[n / 2 - 1] + errs[n / 2]),
            };
            (c.tp, med, n)
        })
        .collect()
}

/// Fit `t = latency + bytes / bandwidth` per TP degree on the rows whose
/// workers all sit on one node (`tp == devices_per_node`, NVLink).
pub fn fit_all_reduce(rows: &[AllReduceRow]) -> Vec<AllReduceCurve> {
    let mut tps: Vec<u32> = rows
        .iter()
        .filter(|r| r.tp == r.devices_per_node)
        .map(|r| r.tp)
        .collect();
    tps.sort_unstable();
    tps.dedup();
    tps.into_iter()
        .filter_map(|tp| {
            let pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.tp == tp && r.devices_per_node == tp)
                .map(|r| (r.bytes, r.median_s))
                .collect();
            let (a, b) = fit_line_relative(&pts)?;
            (a > 0.0).then(|| AllReduceCurve {
                tp,
                latency_s: b,
                bandwidth_gbs: 1.0 / a / 1e9,
            })
        })
        .collect()
}

/// Median absolute relative error of `curves` over the one-node rows, per TP.
pub fn all_reduce_error(curves: &[AllReduceCurve], rows: &[AllReduceRow]) -> Vec<(u32, f64)> {
    curves
        .iter()
        .map(|c| {
            let mut e: Vec<f64> = rows
                .iter()
                .filter(|r| r.tp == c.tp && r.devices_per_node == c.tp)
                .map(|r| (c.time(r.bytes) - r.median_s).abs() / r.median_s)
                .collect();
            e.sort_by(f64::total_cmp);
            (c.tp, e.get(e.len() / 2).copied().unwrap_or(f64::NAN))
        })
        .collect()
}

/// File names inside a Vidur A100 directory.
pub const FIT_FILE: &str = "a100_codellama34b_mlp.csv";
/// The other model the GEMM curves are checked against.
pub const CHECK_FILE: &str = "a100_llama2_70b_mlp.csv";
/// NCCL all-reduce timings.
pub const ALL_REDUCE_FILE: &str = "a100_dgx_all_reduce.csv";
/// Token floor of the cross-model check (the done-when of issue 3).
pub const CHECK_MIN_TOKENS: u64 = 64;

/// Everything `easerve calib import-vidur DIR` computes.
#[derive(Clone, Debug, PartialEq)]
pub struct Import {
    /// Peak FLOP/s the efficiencies are relative to (A100: 312e12).
    pub peak_flops: f64,
    /// GEMM efficiency per TP, fitted on [`FIT_FILE`].
    pub gemm: Vec<GemmEffCurve>,
    /// (TP, median abs. relative error, points) on [`CHECK_FILE`], tokens ≥ 64.
    pub cross_model: Vec<(u32, f64, usize)>,
    /// (TP, median abs. relative error, points) on [`FIT_FILE`] itself, tokens ≥ 64.
    pub in_sample: Vec<(u32, f64, usize)>,
    /// All-reduce per TP (one node).
    pub all_reduce: Vec<AllReduceCurve>,
    /// (TP, median abs. relative error) of the all-reduce fit.
    pub all_reduce_error: Vec<(u32, f64)>,
}

/// Read the three files of a Vidur A100 directory, fit and cross-check.
pub fn import_dir(dir: impl AsRef<Path>) -> Result<Import, VidurError> {
    let dir = dir.as_ref();
    let peak_flops = crate::GpuSpec::preset("a100-sxm4-80gb")
        .map(|g| g.peak_flops())
        .unwrap_or(312e12);
    let fit_rows = read_mlp_csv(dir.join(FIT_FILE))?;
    let check_rows = read_mlp_csv(dir.join(CHECK_FILE))?;
    let ar_rows = read_all_reduce_csv(dir.join(ALL_REDUCE_FILE))?;
    let gemm = fit_gemm(&fit_rows, peak_flops);
    if gemm.is_empty() {
        return Err(VidurError {
            file: dir.join(FIT_FILE).display().to_string(),
            row: None,
            message: "no TP degree had enough rows to fit".into(),
        });
    }
    let all_reduce = fit_all_reduce(&ar_rows);
    Ok(Import {
        peak_flops,
        cross_model: cross_model_error(&gemm, &check_rows, peak_flops, CHECK_MIN_TOKENS),
        in_sample: cross_model_error(&gemm, &fit_rows, peak_flops, CHECK_MIN_TOKENS),
        all_reduce_error: all_reduce_error(&all_reduce, &ar_rows),
        gemm,
        all_reduce,
    })
}

/// `../shared/data/vidur-a100` relative to the workspace root.
pub fn default_data_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/vidur-a100")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_line_fit_recovers_a_line() {
        let pts: Vec<(f64, f64)> = (1..20).map(|x| (x as f64, 3.0 * x as f64 + 7.0)).collect();
        let (a, b) = fit_line_relative(&pts).unwrap();
        assert!((a - 3.0).abs() < 1e-9 && (b - 7.0).abs() < 1e-9);
        assert!(fit_line_relative(&[(1.0, 1.0)]).is_none());
        assert!(fit_line_relative(&[(1.0, 1.0), (2.0, -1.0)]).is_none());
    }

    fn data() -> Option<std::path::PathBuf> {
        let d = default_data_dir();
        if d.join(FIT_FILE).exists() {
            Some(d)
        } else {
            println!(
                "SKIPPED: Vidur data not found at {} (../shared/data/vidur-a100 relative to the repository root)",
                d.display()
            );
            None
        }
    }

    /// Done-when of issue 3: the curves fitted on CodeLlama-34B predict the
    /// Llama-2-70B CSV (another model, same A100) with a median absolute relative
    /// error ≤ 15 % over num_tokens ≥ 64, per TP degree.
    #[test]
    fn codellama_fit_predicts_llama2_70b_within_15_percent_per_tp() {
        let Some(dir) = data() else { return };
        let imp = import_dir(&dir).unwrap();
        assert_eq!(
            imp.gemm.iter().map(|c| c.tp).collect::<Vec<_>>(),
            vec![1, 2, 4, 8]
        );
        for ((tp, err, n), c) in imp.cross_model.iter().zip(&imp.gemm) {
            println!(
                "TP {tp}: e_max {:.4}, k {:.1} tokens; Llama-2-70B median |rel err| {:.2} % over {n} GEMMs with ≥ 64 tokens",
                c.e_max,
                c.k_tokens,
                err * 100.0
            );
            assert!(*n > 100, "TP {tp}: only {n} points");
            assert!(*err <= 0.15, "TP {tp}: {err}");
        }
    }

    /// The numbers in `fitted.rs` are what this data gives (to the digits written).
    #[test]
    fn fitted_constants_match_a_refit() {
        let Some(dir) = data() else { return };
        let imp = import_dir(&dir).unwrap();
        for (c, f) in imp.gemm.iter().zip(crate::fitted::A100_GEMM_EFF.iter()) {
            assert_eq!(c.tp, f.tp);
            assert!((c.e_max - f.e_max).abs() < 5e-4, "{c:?} vs {f:?}");
            assert!((c.k_tokens - f.k_tokens).abs() < 0.006, "{c:?} vs {f:?}");
        }
        for (c, f) in imp
            .all_reduce
            .iter()
            .zip(crate::fitted::A100_NVLINK_ALL_REDUCE.iter())
        {
            println!(
                "all-reduce TP {}: {:.2} µs + bytes / {:.1} GB/s",
                c.tp,
                c.latency_s * 1e6,
                c.bandwidth_gbs
            );
            assert_eq!(c.tp, f.tp);
            assert!((c.latency_s - f.latency_s).abs() < 5e-9, "{c:?} vs {f:?}");
            assert!(
                (c.bandwidth_gbs - f.bandwidth_gbs).abs() < 0.05,
                "{c:?} vs {f:?}"
            );
        }
        for ((tp, e, _), (ftp, fe)) in imp
            .cross_model
            .iter()
            .zip(crate::fitted::A100_GEMM_CROSS_MODEL_ERROR.iter())
        {
            assert_eq!(tp, ftp);
            assert!((e - fe).abs() < 5e-5, "TP {tp}: {e} vs {fe}");
        }
        for (tp, e) in &imp.all_reduce_error {
            assert!(*e < 0.15, "all-reduce TP {tp}: {e}");
        }
    }

    #[test]
    fn bad_csv_names_file_row_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.csv");
        std::fs::write(&p, "num_workers,devices_per_node,size,time_stats.all_reduce.median\n2,2,100,0.5\n2,2,abc,0.5\n").unwrap();
        let e = read_all_reduce_csv(&p).unwrap_err().to_string();
        assert!(e.contains("x.csv, row 2: `size` = \"abc\""), "{e}");
        std::fs::write(&p, "num_workers,size\n").unwrap();
        let e = read_all_reduce_csv(&p).unwrap_err().to_string();
        assert!(e.contains("missing column `devices_per_node`"), "{e}");
    }
}
