//! Checks of the measured-kernel cost model against independent measurements.
//!
//! * [`vidur_gemm_check`]: the four GEMMs of one layer of CodeLlama-34B and
//!   Llama-2-70B at TP 1, 2, 4, 8, predicted from aiconfigurator's A100 GEMM table,
//!   against Vidur's CUDA-event timings on an A100 (`../shared/data/vidur-a100/`).
//! * [`Fixture`]: published single-request latencies of real multimodal models
//!   (`calib/fidelity/measurements.toml`, one source link per row), each predicted
//!   by [`crate::KernelCost`] for its model, GPU, input and TP.

use std::path::Path;

use easerve_model::{ItemTokens, ModelArch};

use crate::aic::{look, KernelTables};
use crate::vidur::{read_mlp_csv, GemmOp, GEMM_OPS};

/// `(model, TP, median |rel err|, P90 |rel err|, GEMMs compared, median signed
/// error (predicted − measured)/measured)` per Vidur CSV and TP.
pub type GemmCheck = Vec<(String, u32, f64, f64, usize, f64)>;

fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// Predict every GEMM of Vidur's `*_mlp.csv` rows with `num_tokens ≥ min_tokens` from
/// the A100 GEMM table and report the error per model and TP. The GEMM shapes per
/// rank: QKV `n = (heads + 2·kv_heads)·head_dim / tp, k = hidden`; O `n = hidden,
/// k = heads·head_dim / tp`; gate+up `n = 2·ffn / tp, k = hidden`; down `n = hidden,
/// k = ffn / tp`; `m = num_tokens`.
///
/// # Errors
/// A Vidur CSV that cannot be read (the error names it).
pub fn vidur_gemm_check(
    a100: &KernelTables,
    vidur_dir: &Path,
    min_tokens: u64,
) -> Result<GemmCheck, crate::vidur::VidurError> {
    let mut out = Vec::new();
    for (name, file) in [
        ("CodeLlama-34B", "a100_codellama34b_mlp.csv"),
        ("Llama-2-70B", "a100_llama2_70b_mlp.csv"),
    ] {
        let rows = read_mlp_csv(vidur_dir.join(file))?;
        for tp in [1u32, 2, 4, 8] {
            let mut errs = Vec::new();
            let mut signed = Vec::new();
            for r in rows.iter().filter(|r| r.tp == tp && r.tokens >= min_tokens) {
                let t = u64::from(tp);
                let hd = r.hidden / r.heads.max(1);
                let up = if r.gated { 2 } else { 1 };
                for (i, op) in GEMM_OPS.iter().enumerate() {
                    let (n, k) = match op {
                        GemmOp::AttnPreProj => ((r.heads + 2 * r.kv_heads) * hd / t, r.hidden),
                        GemmOp::AttnPostProj => (r.hidden, r.heads * hd / t),
                        GemmOp::MlpUpProj => (up * r.ffn / t, r.hidden),
                        GemmOp::MlpDownProj => (r.hidden, r.ffn / t),
                    };
                    let (pred, _) = look(&a100.gemm, &[r.tokens as f64, n as f64, k as f64]);
                    let want = r.median_s[i];
                    if want > 0.0 {
                        errs.push((pred - want).abs() / want);
                        signed.push((pred - want) / want);
                    }
                }
            }
            let n = errs.len();
            out.push((
                name.to_string(),
                tp,
                quantile(errs.clone(), 0.5),
                quantile(errs, 0.9),
                n,
                quantile(signed, 0.5),
            ));
        }
    }
    Ok(out)
}

/// One published measurement (`calib/fidelity/measurements.toml`).
#[derive(Clone, Debug, serde::Deserialize)]
pub struct FixtureRow {
    /// Unique id.
    pub id: String,
    /// A model preset or a file under `scenarios/custom/` (without `.toml`).
    pub model: String,
    /// GPU preset.
    pub gpu: String,
    /// Serving framework as the source names it.
    pub framework: String,
    /// Its version (`unknown` when not stated).
    pub version: String,
    /// `encode`, `encode+pre`, `prefill` or `ttft`.
    pub stage: String,
    /// The published latency, milliseconds.
    pub measured_ms: f64,
    /// Tensor-parallel degree of the LLM.
    pub tp: u32,
    /// Items (images) or requests in the measured pass.
    pub batch: u32,
    /// `image`, `video`, `audio` or `text`.
    pub modality: String,
    /// Image / frame height, pixels.
    #[serde(default)]
    pub height: u32,
    /// Image / frame width, pixels.
    #[serde(default)]
    pub width: u32,
    /// Images per request.
    #[serde(default)]
    pub images: u32,
    /// Video frames.
    #[serde(default)]
    pub frames: u32,
    /// Audio seconds.
    #[serde(default)]
    pub audio_s: f64,
    /// Prompt text tokens.
    #[serde(default)]
    pub text_tokens: u64,
    /// Source link.
    pub source: String,
    /// How the measured engine launched the pass: `eager` or `graph` (every
    /// stage of the row), or an engine's defaults by name (`vllm`, `sglang`,
    /// `easerve`); unset: vLLM's defaults ([`crate::Launch::default`]).
    #[serde(default)]
    pub launch: Option<String>,
}

/// The fixture file.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Fixture {
    /// Its rows.
    pub row: Vec<FixtureRow>,
}

/// `calib/fidelity/measurements.toml`, compiled in.
pub const FIXTURE: &str = include_str!("../fidelity/measurements.toml");

/// A prediction for one row: `(predicted seconds, what was summed)`.
pub type Prediction = (f64, String);

/// Why a fixture row cannot be predicted; each message starts with the row's id.
#[derive(Debug, thiserror::Error)]
pub enum FidelityError {
    /// The model cannot count the tokens of the row's input.
    #[error("{id}: {error}")]
    Tokens {
        /// The row.
        id: String,
        /// Why not.
        error: easerve_model::ModelError,
    },
    /// A `launch` that is neither a launch mode nor an engine.
    #[error("{id}: {error}, or an engine: vllm, sglang, easerve")]
    Launch {
        /// The row.
        id: String,
        /// The launch-mode error, which lists the modes.
        error: crate::LaunchError,
    },
    /// A `stage` other than `encode`, `encode+pre`, `prefill` or `ttft`.
    #[error("{id}: unknown stage `{stage}`")]
    Stage {
        /// The row.
        id: String,
        /// The stage given.
        stage: String,
    },
}

impl FixtureRow {
    /// The row's items (one per image / video / audio clip), token counts by `model`.
    pub fn items(&self, model: &ModelArch) -> Result<Vec<ItemTokens>, FidelityError> {
        let e = |error| FidelityError::Tokens {
            id: self.id.clone(),
            error,
        };
        Ok(match self.modality.as_str() {
            "image" => {
                let one = model.image_tokens(self.height, self.width).map_err(e)?;
                vec![one; (self.images.max(1) * self.batch.max(1)) as usize]
            }
            "video" => vec![
                model
                    .video_tokens(self.frames, self.height, self.width)
                    .map_err(e)?;
                self.batch.max(1) as usize
            ],
            "audio" => {
                vec![model.audio_tokens(self.audio_s).map_err(e)?; self.batch.max(1) as usize]
            }
            _ => Vec::new(),
        })
    }

    /// How the row's engine launched its passes: every stage eager, or every
    /// stage graphed at any size, or an engine's defaults, as its `launch`
    /// says; else vLLM's defaults.
    ///
    /// # Errors
    /// A `launch` other than `eager`, `graph` or an engine name.
    pub fn launch(&self) -> Result<crate::Launch, FidelityError> {
        use crate::launch::{Engine, LaunchMode, StageLaunch};
        let mut l = crate::Launch::default();
        if let Some(m) = &self.launch {
            if let Ok(engine) = Engine::parse(m) {
                return Ok(crate::Launch::of_engine(engine));
            }
            let stage = match LaunchMode::parse(m).map_err(|error| FidelityError::Launch {
                id: self.id.clone(),
                error,
            })? {
                LaunchMode::Eager => StageLaunch::EAGER,
                LaunchMode::Graph => StageLaunch::graph(u64::MAX),
            };
            (l.encode, l.prefill, l.decode) = (stage, stage, stage);
        }
        Ok(l)
    }

    /// Predict the row with `cost` (a [`crate::KernelCost`] for its model and GPU):
    /// `encode` = the encoder pass's GPU phase; `encode+pre` adds preprocessing;
    /// `prefill` = the LLM prefill of text + multimodal tokens at the row's TP;
    /// `ttft` = preprocessing + encode GPU phase + prefill.
    pub fn predict(
        &self,
        model: &ModelArch,
        cost: &crate::KernelCost,
    ) -> Result<Prediction, FidelityError> {
        use crate::StageCost;
        let items = self.items(model)?;
        let enc = cost.encode(&items, 1.0);
        let mm: u64 = items.iter().map(|i| i.llm_tokens).sum();
        let prompt = self.text_tokens + mm;
        let prefill = || cost.prefill(&[prompt.max(1)], self.tp.max(1).into(), 1.0);
        Ok(match self.stage.as_str() {
            "encode" => (enc.t_gpu, "encode GPU".into()),
            "encode+pre" => (enc.t_gpu + enc.t_pre, "encode GPU + preprocessing".into()),
            "prefill" => (prefill(), format!("prefill of {prompt} tokens")),
            "ttft" => (
                enc.t_pre + enc.t_gpu + prefill(),
                format!("preprocessing + encode GPU + prefill of {prompt} tokens"),
            ),
            s => {
                return Err(FidelityError::Stage {
                    id: self.id.clone(),
                    stage: s.to_string(),
                })
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aic::tests::data;
    use crate::{GpuSpec, KernelCost};

    fn vidur_dir() -> Option<std::path::PathBuf> {
        let d = crate::vidur::default_data_dir();
        if d.join("a100_codellama34b_mlp.csv").exists() {
            Some(d)
        } else {
            println!("SKIPPED: Vidur data not found at {}", d.display());
            None
        }
    }

    /// Part 2 of the kernel-model issue: aiconfigurator's A100 GEMMs against Vidur's
    /// A100 per-layer timings, num_tokens ≥ 64. Prints the figures. The aim is a
    /// median ≤ 10 %; measured 18.1 % (README), so the test guards against a
    /// regression past 25 %.
    #[test]
    fn aiconfigurator_a100_gemms_predict_vidur_timings() {
        let (Some(dir), Some(vd)) = (data(), vidur_dir()) else {
            return;
        };
        let a100 = KernelTables::load(&dir, "a100_sxm", "bfloat16").unwrap();
        let check = vidur_gemm_check(&a100, &vd, 64).unwrap();
        let mut all = Vec::new();
        for (m, tp, med, p90, n, bias) in &check {
            println!(
                "{m} TP {tp}: median |rel err| {:.1} %, P90 {:.1} % over {n} GEMMs (median signed {:+.1} %)",
                med * 100.0,
                p90 * 100.0,
                bias * 100.0
            );
            all.push(*med);
        }
        let overall = quantile(all, 0.5);
        println!("median of the per-TP medians: {:.1} %", overall * 100.0);
        assert!(overall <= 0.25, "{overall}");
    }

    fn model(name: &str) -> ModelArch {
        if let Some(m) = ModelArch::preset(name) {
            return m;
        }
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../scenarios/custom")
            .join(format!("{name}.toml"));
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    /// Part 4: every fixture row through the kernel model, predicted against
    /// measured. Prints the table; the aims (median ≤ 25 %, none worse than 2×) are
    /// reported, not asserted, so the table stays honest; the test fails only when a
    /// row cannot be predicted or a prediction is not finite and > 0.
    #[test]
    fn fixture_rows_predicted_against_measured() {
        let Some(dir) = data() else { return };
        let f: Fixture = toml::from_str(FIXTURE).unwrap();
        assert!(f.row.len() >= 10, "{} rows", f.row.len());
        let mut errs = Vec::new();
        println!("| id | stage | measured ms | predicted ms | error |");
        for r in &f.row {
            let m = model(&r.model);
            let gpu = GpuSpec::preset(&r.gpu).unwrap();
            let cost = KernelCost::from_data(&dir, &m, &gpu, "aggregated", "bfloat16", 1.0, false)
                .unwrap()
                .unwrap_or_else(|| panic!("{}: no tables for {}", r.id, r.gpu))
                .with_launch(r.launch().unwrap());
            let (p, what) = r.predict(&m, &cost).unwrap();
            assert!(p.is_finite() && p > 0.0, "{}: {p}", r.id);
            let e = (p * 1e3 - r.measured_ms) / r.measured_ms;
            errs.push((r.stage.clone(), e.abs(), p * 1e3 / r.measured_ms));
            println!(
                "| {} | {} | {:.1} | {:.1} ({what}) | {:+.0} % |",
                r.id,
                r.stage,
                r.measured_ms,
                p * 1e3,
                e * 100.0
            );
        }
        for stage in ["encode", "ttft"] {
            let v: Vec<f64> = errs.iter().filter(|e| e.0 == stage).map(|e| e.1).collect();
            if !v.is_empty() {
                println!(
                    "{stage}: median |error| {:.0} % over {} rows",
                    quantile(v, 0.5) * 100.0,
                    errs.iter().filter(|e| e.0 == stage).count()
                );
            }
        }
        let worst = errs
            .iter()
            .map(|e| e.2.max(1.0 / e.2))
            .fold(1.0f64, f64::max);
        println!("worst ratio {worst:.2}x");
    }
}
