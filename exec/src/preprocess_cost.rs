//! Measure easerve's own CPU preprocessing per item (`easerve calib measure-preprocess`).
//!
//! For each encoder family the served path is timed end to end on this host: decode
//! the file (JPEG images and frames, 16-bit PCM WAV) with [`Media::open`], then
//! [`prepare`] (resize, normalise, patchify / tile; log-mel for audio). Inputs are
//! the deterministic test patterns of [`Media::synthetic`] written to a temporary
//! folder. Each point is the median of `reps` runs after one warm-up, timed as this
//! process's CPU time (`getrusage`), so a busy machine changes the figure little.
//! A least-squares line over the sizes gives the per-item intercept and the slope per
//! megapixel (images), per frame (video) or per second of audio; a negative
//! intercept or slope is written as 0 (the fitted points are written beside it, so
//! the raw line can be recomputed). The output is the
//! TOML format of `calib/preprocess/` (read by `easerve_calib::preprocess`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use easerve_model::ModelArch;
use easerve_sched::MmItem;

use crate::input::{prepare, InputError, Media};

/// Why the preprocessing could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum PreprocessCostError {
    /// The temporary folder, or an input in it, cannot be written.
    #[error("{}: {error}", .dir.display())]
    Temp {
        /// The temporary folder.
        dir: PathBuf,
        /// Why not.
        error: std::io::Error,
    },
    /// A model the measurement times is not a preset of this build.
    #[error("no preset {0}")]
    NoPreset(String),
    /// An input cannot be decoded or prepared.
    #[error("{0}")]
    Input(InputError),
}

/// CPU seconds used by this process so far (user + system).
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the struct we pass; RUSAGE_SELF is always valid.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Least-squares `y = a + b x`.
fn fit(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let b = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    (my - b * mx, b)
}

fn write_item(dir: &Path, item: &MmItem, tag: &str) -> std::io::Result<std::path::PathBuf> {
    let to_io = |e: image::ImageError| std::io::Error::other(e.to_string());
    match Media::synthetic(item, 7) {
        Media::Image(img) => {
            let p = dir.join(format!("{tag}.jpg"));
            img.save(&p).map_err(to_io)?;
            Ok(p)
        }
        Media::Video(frames) => {
            let d = dir.join(tag);
            std::fs::create_dir_all(&d)?;
            for (i, f) in frames.iter().enumerate() {
                f.save(d.join(format!("{i:04}.jpg"))).map_err(to_io)?;
            }
            Ok(d)
        }
        Media::Audio(samples) => {
            let p = dir.join(format!("{tag}.wav"));
            let spec = hound::WavSpec {
                channels: 1,
                sample_rate: 16_000,
                bits_per_sample: 16,
                sample_format: hound::SampleFormat::Int,
            };
            let mut w = hound::WavWriter::create(&p, spec).map_err(std::io::Error::other)?;
            for s in samples {
                w.write_sample((s.clamp(-1.0, 1.0) * 32767.0) as i16)
                    .map_err(std::io::Error::other)?;
            }
            w.finalize().map_err(std::io::Error::other)?;
            Ok(p)
        }
    }
}

/// Median CPU seconds of decode + prepare of the file at `path` for `arch`.
fn time_path(arch: &ModelArch, path: &Path, reps: usize) -> Result<f64, PreprocessCostError> {
    let once = || -> Result<f64, PreprocessCostError> {
        let t0 = cpu_seconds();
        let media = Media::open(path).map_err(PreprocessCostError::Input)?;
        prepare(arch, &media).map_err(PreprocessCostError::Input)?;
        Ok(cpu_seconds() - t0)
    };
    once()?;
    let mut v = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        v.push(once()?);
    }
    Ok(easerve_calib::refine::median(&mut v))
}

/// Measure every family and return the TOML text (see the module doc).
///
/// # Errors
/// A temporary folder that cannot be written, or a preprocessing error.
pub fn measure(reps: usize, date: &str) -> Result<String, PreprocessCostError> {
    let tmp = std::env::temp_dir().join(format!("easerve-preprocess-{}", std::process::id()));
    let temp = |error| PreprocessCostError::Temp {
        dir: tmp.clone(),
        error,
    };
    std::fs::create_dir_all(&tmp).map_err(temp)?;
    let cpu = crate::device::cpu_name();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# measured by `easerve calib measure-preprocess` (exec/src/preprocess_cost.rs)\n\n[host]\ncpu = {cpu:?}\nthreads = 1\ndate = {date:?}\nclock = \"process CPU time (getrusage), median of {reps} after 1 warm-up\"\n"
    );
    let preset =
        |n: &str| ModelArch::preset(n).ok_or_else(|| PreprocessCostError::NoPreset(n.to_string()));
    let families: [(&str, ModelArch, Vec<MmItem>, &str); 4] = [
        (
            "llava-next",
            preset("llava-v1.6-34b")?,
            [(336, 336), (672, 672), (768, 1024), (1008, 1008)]
                .iter()
                .map(|&(h, w)| MmItem::Image {
                    height: h,
                    width: w,
                })
                .collect(),
            "JPEG decode + anyres resize, tiling, normalise, patchify",
        ),
        (
            "qwen2.5-vl",
            preset("qwen2.5-vl-32b")?,
            [(336, 336), (672, 672), (768, 1024), (1344, 1344)]
                .iter()
                .map(|&(h, w)| MmItem::Image {
                    height: h,
                    width: w,
                })
                .collect(),
            "JPEG decode + smart_resize, normalise, patchify",
        ),
        (
            "qwen2.5-vl-video",
            preset("qwen2.5-vl-32b")?,
            [4u32, 8, 16]
                .iter()
                .map(|&f| MmItem::Video {
                    frames: f,
                    height: 448,
                    width: 448,
                })
                .collect(),
            "video: JPEG decode per frame + resize, normalise, patchify (448x448 frames)",
        ),
        (
            "whisper",
            preset("ultravox-v0.6-27b")?,
            [2.0, 5.0, 10.0, 20.0]
                .iter()
                .map(|&s| MmItem::Audio { seconds: s })
                .collect(),
            "WAV decode (16-bit PCM, 16 kHz) + log-mel (128 bins)",
        ),
    ];
    for (i, (family, arch, items, what)) in families.iter().enumerate() {
        let mut pts = Vec::new();
        for (j, it) in items.iter().enumerate() {
            let p = write_item(&tmp, it, &format!("f{i}-{j}")).map_err(temp)?;
            let t = time_path(arch, &p, reps)?;
            let x = match *it {
                MmItem::Image { height, width } => f64::from(height) * f64::from(width) / 1e6,
                MmItem::Video { frames, .. } => f64::from(frames),
                MmItem::Audio { seconds } => seconds,
            };
            pts.push((x, t));
        }
        let (a, b) = fit(&pts);
        let slope = match items[0] {
            MmItem::Image { .. } => "per_megapixel_s",
            MmItem::Video { .. } => "per_frame_s",
            MmItem::Audio { .. } => "per_audio_second_s",
        };
        let _ = writeln!(
            out,
            "[[term]]\nfamily = {family:?}\nimplementation = \"rust\"\nwhat = {what:?}\nper_item_s = {:.6}\n{slope} = {:.6}\npoints = [{}]\n",
            a.max(0.0),
            b.max(0.0),
            pts.iter()
                .map(|(x, y)| format!("[{x:.4}, {y:.6}]"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_fit_and_cpu_clock() {
        let (a, b) = fit(&[(1.0, 3.0), (2.0, 5.0), (4.0, 9.0)]);
        assert!((a - 1.0).abs() < 1e-12 && (b - 2.0).abs() < 1e-12);
        assert!(cpu_seconds() > 0.0);
    }
}
