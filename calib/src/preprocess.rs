//! Measured CPU preprocessing and per-pass framework terms of the encode stage.
//!
//! **Preprocessing** (`t_pre`) is a cost per item, per processed megapixel, per video
//! frame and per second of audio, measured on the build machine for two
//! implementations (the figures and how they were taken: `calib/preprocess/`):
//!
//! * [`Implementation::Rust`]: easerve's own decoding and preprocessing
//!   (`exec/src/input.rs`), measured by `easerve calib measure-preprocess`;
//! * [`Implementation::Python`]: Hugging Face transformers' image processors and
//!   feature extractors, what vLLM, SGLang and Dynamo front ends run, measured by
//!   `calib/preprocess/measure.py`.
//!
//! A scenario scales the figures by its host's `cluster.host_cpu_scale` (seconds on
//! the deployment's host per second on the measuring machine).
//!
//! **Framework overhead** (`t_pass`) belongs to the serving system, not to the GPU
//! ([`FrameworkTerms::for_system`]).

use easerve_model::{EncoderKind, ItemTokens, ModelArch};

/// Which preprocessing code runs in front of the encoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Implementation {
    /// easerve's Rust preprocessing (`exec/src/input.rs`).
    Rust,
    /// Hugging Face transformers' processors (Python serving front ends).
    Python,
}

impl Implementation {
    /// The name used in the measured files (`rust`, `hf-transformers`).
    pub fn as_str(self) -> &'static str {
        match self {
            Implementation::Rust => "rust",
            Implementation::Python => "hf-transformers",
        }
    }
}

/// Linear preprocessing cost of one item of one encoder family (seconds).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Deserialize, serde::Serialize)]
pub struct PreprocessTerms {
    /// Fixed seconds per item.
    #[serde(default)]
    pub per_item_s: f64,
    /// Seconds per megapixel of image (or video frame) pixels.
    #[serde(default)]
    pub per_megapixel_s: f64,
    /// Seconds per video frame (on top of its megapixels).
    #[serde(default)]
    pub per_frame_s: f64,
    /// Seconds per second of audio.
    #[serde(default)]
    pub per_audio_second_s: f64,
}

#[derive(serde::Deserialize)]
struct MeasuredFile {
    host: Host,
    term: Vec<MeasuredTerm>,
}

#[derive(serde::Deserialize)]
struct Host {
    cpu: String,
    threads: u32,
}

#[derive(serde::Deserialize)]
struct MeasuredTerm {
    family: String,
    /// The term's id in the Python file (`decode-jpeg+processor-torch`).
    #[serde(default)]
    term: Option<String>,
    #[serde(flatten)]
    terms: PreprocessTerms,
}

/// The Python terms a server runs per item, `(kind family, file family, term id)`:
/// JPEG decode plus the torch ("fast") processors that transformers uses once torch
/// is installed, as it is in every vLLM and SGLang server; video frames decoded
/// then the torch video processor (both fitted per clip megapixel); WAV decode plus
/// the log-mel over the audio's own length (`padding='longest'`, as Ultravox's
/// processor calls it).
pub const SERVED_PYTHON: &[(&str, &str, &str)] = &[
    ("llava-next", "llava-next", "decode-jpeg+processor-torch"),
    ("qwen2.5-vl", "qwen2.5-vl", "decode-jpeg+processor-torch"),
    ("qwen2.5-vl-video", "qwen2.5-vl", "frame-decode-jpeg"),
    ("qwen2.5-vl-video", "qwen2.5-vl", "video-processor-torch"),
    ("whisper", "whisper", "decode-wav"),
    ("whisper", "whisper", "log-mel-unpadded-torch"),
];

/// The measured Python figures (`calib/preprocess/measured-python.toml`).
pub const MEASURED_PYTHON: &str = include_str!("../preprocess/measured-python.toml");
/// The measured Rust figures (`calib/preprocess/measured-rust.toml`).
pub const MEASURED_RUST: &str = include_str!("../preprocess/measured-rust.toml");

/// A model's measured preprocessing: one linear term per input kind.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Preprocess {
    /// Images (family `llava-next` or `qwen2.5-vl`).
    pub image: PreprocessTerms,
    /// Video (family `qwen2.5-vl-video`).
    pub video: PreprocessTerms,
    /// Audio (family `whisper`).
    pub audio: PreprocessTerms,
    /// The measuring host: `"CPU model, N thread(s)"`.
    pub host: String,
}

/// The measured-file family names of a model's encoder: `(image, video, audio)`.
pub fn families(model: &ModelArch) -> Option<[&'static str; 3]> {
    Some(match model.encoder.as_ref()?.kind {
        EncoderKind::ClipAnyres { .. } => ["llava-next", "", ""],
        EncoderKind::QwenVit { .. } => ["qwen2.5-vl", "qwen2.5-vl-video", ""],
        // Gemma 3's processor resizes to a fixed side and normalizes, as the
        // LLaVA-NeXT one does per tile: its measured terms stand in (the notes
        // name the family measured)
        EncoderKind::Siglip { .. } => ["llava-next", "", ""],
        // InternVL and Llama 4 resize and normalize fixed-size tiles, as
        // LLaVA-NeXT does; InternVL's video frames are such tiles too
        EncoderKind::TiledVit { .. } => ["llava-next", "llava-next", ""],
        // the Qwen3-Omni processor runs Whisper's feature extractor (128 bins)
        EncoderKind::OmniAudio { .. } => ["", "", "whisper"],
        EncoderKind::Whisper { .. } => ["", "", "whisper"],
    })
}

/// Sum of the served-path terms of one family and implementation, and the host line.
pub fn measured_terms(family: &str, imp: Implementation) -> Option<(PreprocessTerms, String)> {
    use std::sync::OnceLock;
    static RUST: OnceLock<Option<MeasuredFile>> = OnceLock::new();
    static PYTHON: OnceLock<Option<MeasuredFile>> = OnceLock::new();
    // each compiled-in file is parsed once per process (a search builds many costs)
    let f = match imp {
        Implementation::Rust => RUST.get_or_init(|| toml::from_str(MEASURED_RUST).ok()),
        Implementation::Python => PYTHON.get_or_init(|| toml::from_str(MEASURED_PYTHON).ok()),
    }
    .as_ref()?;
    let mut sum = PreprocessTerms::default();
    let mut any = false;
    let served = |t: &MeasuredTerm| match imp {
        Implementation::Rust => t.family == family,
        Implementation::Python => SERVED_PYTHON
            .iter()
            .any(|(k, fam, id)| *k == family && t.family == *fam && t.term.as_deref() == Some(*id)),
    };
    for t in f.term.iter().filter(|t| served(t)) {
        any = true;
        sum.per_item_s += t.terms.per_item_s;
        sum.per_megapixel_s += t.terms.per_megapixel_s;
        sum.per_frame_s += t.terms.per_frame_s;
        sum.per_audio_second_s += t.terms.per_audio_second_s;
    }
    any.then(|| (sum, format!("{}, {} thread(s)", f.host.cpu, f.host.threads)))
}

/// The measured preprocessing of `model`'s encoder by `imp`; `None` for a text-only
/// model or when a kind it takes has no measured term.
pub fn measured(model: &ModelArch, imp: Implementation) -> Option<Preprocess> {
    let fams = families(model)?;
    let mut p = Preprocess::default();
    for (i, fam) in fams.iter().enumerate() {
        if fam.is_empty() {
            continue;
        }
        let (t, host) = measured_terms(fam, imp)?;
        p.host = host;
        match i {
            0 => p.image = t,
            1 => p.video = t,
            _ => p.audio = t,
        }
    }
    Some(p)
}

impl Preprocess {
    /// Seconds to preprocess `item` of `model`, scaled by `host_scale`. The item's
    /// size is recovered from its token counts: pixels = encoder tokens × patch²
    /// (the pixels the patch embedding sees), frames = temporal slices × temporal
    /// patch, audio seconds = LLM tokens × stack / encoder frame rate. A fitted
    /// line with a negative intercept is clamped at 0.
    pub fn item_seconds(&self, model: &ModelArch, item: &ItemTokens, host_scale: f64) -> f64 {
        let Some(e) = model.encoder.as_ref() else {
            return 0.0;
        };
        let t = match &e.kind {
            EncoderKind::ClipAnyres { patch, .. } => {
                let px = item.encoder_tokens as f64 * f64::from(*patch).powi(2);
                self.image.per_item_s + self.image.per_megapixel_s * px / 1e6
            }
            EncoderKind::QwenVit {
                patch,
                temporal_patch,
                ..
            } => {
                let slices = item.encoder_tokens / item.attn_span.max(1);
                let frame_px = item.attn_span as f64 * f64::from(*patch).powi(2);
                if slices > 1 {
                    let frames = (slices * u64::from(*temporal_patch)) as f64;
                    let v = &self.video;
                    v.per_item_s
                        + v.per_frame_s * frames
                        + v.per_megapixel_s * frame_px * frames / 1e6
                } else {
                    self.image.per_item_s + self.image.per_megapixel_s * frame_px / 1e6
                }
            }
            // every crop is resized to image_size² and normalized
            EncoderKind::Siglip { patch, .. } => {
                let px = item.encoder_tokens as f64 * f64::from(*patch).powi(2);
                self.image.per_item_s + self.image.per_megapixel_s * px / 1e6
            }
            // every tile (or frame) is resized and normalized: its pixels
            EncoderKind::TiledVit { patch, .. } => {
                let px = item.encoder_tokens as f64 * f64::from(*patch).powi(2);
                self.image.per_item_s + self.image.per_megapixel_s * px / 1e6
            }
            EncoderKind::OmniAudio { chunk_frames, .. } => {
                // tokens per whole chunk of `chunk_frames` 10-ms frames
                let per_chunk = easerve_model::tokens::omni_audio_tokens(
                    u64::from(*chunk_frames),
                    *chunk_frames,
                )
                .max(1) as f64;
                let secs = item.llm_tokens as f64 / per_chunk
                    * f64::from(*chunk_frames)
                    * easerve_model::tokens::OMNI_MEL_HOP as f64
                    / easerve_model::tokens::OMNI_MEL_SAMPLE_RATE as f64;
                self.audio.per_item_s + self.audio.per_audio_second_s * secs
            }
            EncoderKind::Whisper {
                window_s,
                frames_per_window,
                stack,
                ..
            } => {
                let hz = f64::from(*frames_per_window) / window_s.max(1e-9);
                let secs = item.llm_tokens as f64 * f64::from(*stack) / hz;
                self.audio.per_item_s + self.audio.per_audio_second_s * secs
            }
        };
        t.max(0.0) * host_scale
    }
}

/// The serving system's fixed encode-stage costs (seconds), with their source.
#[derive(Clone, Debug, PartialEq)]
pub struct FrameworkTerms {
    /// Fixed seconds per encode pass (dispatch, launch, hand-off).
    pub per_pass_s: f64,
    /// Fixed seconds per request in a pass.
    pub per_request_s: f64,
    /// Which preprocessing implementation the system runs.
    pub preprocess: Implementation,
    /// Where the figures come from.
    pub source: String,
}

/// The serving frameworks with encode terms ([`FrameworkTerms::for_system`]), as
/// scenarios and `--system` name them.
pub const FRAMEWORKS: [&str; 5] = [
    "easerve",
    "passthrough",
    "aggregated",
    "epd-serve",
    "hydrainfer",
];

/// easerve's per-pass framework cost: two loopback messages (the dispatch command
/// and the embedding envelope with its acknowledgement), 24.5 µs each — the
/// smallest-message median of the `[[transfer]]` tables `easerve profile` measured
/// on the build machine (`scenarios/profiles/tiny-*.cpu.toml`, 1 KiB: 2.4545e-5 s).
pub const EASERVE_PASS_S: f64 = 2.0 * 2.4545e-5;

impl FrameworkTerms {
    /// The terms of a serving system by its scenario name (`easerve`,
    /// `passthrough`, `aggregated`, `epd-serve`, `hydrainfer`); `paper_pass_s` is the pass-through value
    /// calibrated from the EAServe paper ([`crate::Efficiency::encode_pass_s`]).
    pub fn for_system(system: &str, paper_pass_s: f64) -> FrameworkTerms {
        match system {
            // both run Hugging Face processors in Python in front of their
            // encoders; neither has a measured per-pass cost to charge
            "epd-serve" => FrameworkTerms {
                per_pass_s: 0.0,
                per_request_s: 0.0,
                preprocess: Implementation::Python,
                source: "epd-serve (Python on vLLM 0.6, Ray actors): no per-pass term (none measured or published; not calibrated to the EAServe paper); each pass maps its shards' images through vLLM's multimodal processor (`epdserve/worker.py`), priced as the measured HF processors, in series with its GPU phase".into(),
            },
            "hydrainfer" => FrameworkTerms {
                per_pass_s: 0.0,
                per_request_s: 0.0,
                preprocess: Implementation::Python,
                source: "hydrainfer (Python, its own engine): no per-step term (none measured or published; not calibrated to the EAServe paper); its request processor runs the HF image processor on a thread pool as requests arrive (`hydrainfer/engine/request_processor.py`), priced as the measured HF processors, pipelined ahead of the passes".into(),
            },
            "passthrough" => FrameworkTerms {
                per_pass_s: paper_pass_s,
                per_request_s: 0.0,
                preprocess: Implementation::Python,
                source: format!(
                    "passthrough (Dynamo-like): {paper_pass_s} s per pass, calibrated from the EAServe paper's pass-through saturation point (≈1 req/s with the GPU < 10 % busy, §2.2, Fig. 11), not measured"
                ),
            },
            "aggregated" => FrameworkTerms {
                per_pass_s: 0.0,
                per_request_s: 0.0,
                preprocess: Implementation::Python,
                source: "aggregated (vLLM-like): the encoder runs inside the engine step, so its fixed cost is the step's own `prefill_batch_s`; no per-pass term; preprocessing in the API server".into(),
            },
            _ => FrameworkTerms {
                per_pass_s: EASERVE_PASS_S,
                per_request_s: 0.0,
                preprocess: Implementation::Rust,
                source: format!(
                    "easerve executor: {:.1} µs per pass (two loopback messages, measured by `easerve profile` on the build machine)",
                    EASERVE_PASS_S * 1e6
                ),
            },
        }
    }
}

/// The CPU-side terms of one encode pass as a serving system runs it: its
/// [`FrameworkTerms`] and the measured [`Preprocess`] of the implementation it
/// runs, scaled to the deployment's host. Shared by every cost source
/// ([`crate::KernelCost`], and [`crate::Roofline`] when it is given them).
#[derive(Clone, Debug, PartialEq)]
pub struct EncodeTerms {
    /// Fixed per-pass and per-request seconds of the serving system.
    pub framework: FrameworkTerms,
    /// Measured preprocessing of the implementation the system runs.
    pub preprocess: Preprocess,
    /// Multiplier on the measured preprocessing (`cluster.host_cpu_scale`: the
    /// deployment host's CPU time per item over the build machine's).
    pub host_scale: f64,
    /// When another family's measured terms stand in for this model's
    /// processor: which, and why (for the notes).
    pub stand_in: Option<&'static str>,
}

impl EncodeTerms {
    /// The terms of `system` (`easerve`, `passthrough`, `aggregated`) for `model`:
    /// [`FrameworkTerms::for_system`] with `paper_pass_s` as the pass-through value,
    /// and [`measured`] preprocessing (zero for a model without an encoder family).
    pub fn for_system(model: &ModelArch, system: &str, paper_pass_s: f64, host_scale: f64) -> Self {
        let framework = FrameworkTerms::for_system(system, paper_pass_s);
        let preprocess = measured(model, framework.preprocess).unwrap_or_default();
        let stand_in = match model.encoder.as_ref().map(|e| &e.kind) {
            Some(EncoderKind::Siglip { .. }) => Some(
                "LLaVA-NeXT's measured image terms per megapixel stand in for Gemma 3's resize-and-normalize processor, not measured itself",
            ),
            Some(EncoderKind::TiledVit { .. }) => Some(
                "LLaVA-NeXT's measured image terms per megapixel of tiles stand in for the InternVL / Llama 4 tiling processor, not measured itself",
            ),
            Some(EncoderKind::OmniAudio { .. }) => Some(
                "Whisper's measured feature-extraction terms per second of audio stand in for the Qwen3-Omni processor (the same extractor at 128 bins), not measured itself",
            ),
            _ => None,
        };
        EncodeTerms {
            framework,
            preprocess,
            host_scale,
            stand_in,
        }
    }

    /// Fixed seconds of a pass over `n_items` items: per pass + per request × items.
    pub fn pass_s(&self, n_items: usize) -> f64 {
        self.framework.per_pass_s + self.framework.per_request_s * n_items as f64
    }

    /// CPU seconds to preprocess `items` of `model` ([`Preprocess::item_seconds`]).
    pub fn pre_s(&self, model: &ModelArch, items: &[ItemTokens]) -> f64 {
        items
            .iter()
            .map(|i| self.preprocess.item_seconds(model, i, self.host_scale))
            .sum()
    }

    /// One line naming both sources, for a cost model's notes.
    pub fn note(&self) -> String {
        if self.preprocess.host.is_empty() {
            return format!(
                "framework: {}; preprocessing: none measured for this model (0 s)",
                self.framework.source
            );
        }
        let stand_in = self.stand_in.map(|s| format!("; {s}")).unwrap_or_default();
        format!(
            "framework: {}; preprocessing: {} (measured on {}, × {} host scale){stand_in}",
            self.framework.source,
            self.framework.preprocess.as_str(),
            self.preprocess.host,
            self.host_scale
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_files_parse_and_cover_every_family() {
        for imp in [Implementation::Rust, Implementation::Python] {
            for fam in ["llava-next", "qwen2.5-vl", "qwen2.5-vl-video", "whisper"] {
                let (t, host) = measured_terms(fam, imp).unwrap_or_else(|| panic!("{fam} {imp:?}"));
                assert!(!host.is_empty());
                let total = t.per_item_s + t.per_megapixel_s + t.per_frame_s + t.per_audio_second_s;
                assert!(total > 0.0 && total < 10.0, "{fam} {imp:?}: {t:?}");
            }
        }
        for name in ["llava-v1.6-34b", "qwen2.5-vl-32b", "ultravox-v0.6-27b"] {
            let m = ModelArch::preset(name).unwrap();
            assert!(measured(&m, Implementation::Rust).is_some(), "{name}");
        }
        assert!(measured(
            &ModelArch::preset("text-lm-tiny").unwrap(),
            Implementation::Rust
        )
        .is_none());
    }

    #[test]
    fn item_seconds_grow_with_size() {
        let m = ModelArch::preset("qwen2.5-vl-32b").unwrap();
        let t = Preprocess {
            video: PreprocessTerms {
                per_item_s: 1e-3,
                per_frame_s: 1e-3,
                ..Default::default()
            },
            audio: PreprocessTerms {
                per_audio_second_s: 1e-3,
                ..Default::default()
            },
            ..Default::default()
        };
        let small = m.video_tokens(8, 448, 448).unwrap();
        let big = m.video_tokens(16, 448, 448).unwrap();
        let a = t.item_seconds(&m, &small, 1.0);
        let b = t.item_seconds(&m, &big, 1.0);
        assert!(
            (a - 9e-3).abs() < 1e-9 && (b - 17e-3).abs() < 1e-9,
            "{a} {b}"
        );
        assert_eq!(t.item_seconds(&m, &big, 2.0), 2.0 * b);
        let u = ModelArch::preset("ultravox-v0.6-27b").unwrap();
        let s = t.item_seconds(&u, &u.audio_tokens(10.0).unwrap(), 1.0);
        assert!((s - 10e-3).abs() < 0.5e-3, "{s}");
    }

    #[test]
    fn systems_carry_their_own_terms() {
        let e = FrameworkTerms::for_system("easerve", 1.5);
        let p = FrameworkTerms::for_system("passthrough", 1.5);
        assert!(e.per_pass_s < 1e-3 && p.per_pass_s == 1.5);
        assert_eq!(e.preprocess, Implementation::Rust);
        assert!(p.source.contains("calibrated from the EAServe paper"));
    }
}
