//! Real inputs: decoding, resizing and patching as each model's preprocessor does,
//! and deterministic synthetic media when a workload names no files.
//!
//! * Images: PNG / JPEG through the `image` crate, bicubic (Catmull-Rom) resize,
//!   CLIP normalisation (mean 0.48145466, 0.4578275, 0.40821073; std 0.26862954,
//!   0.26130258, 0.27577711: `OPENAI_CLIP_MEAN/STD` in HF `image_utils`, used by both
//!   the LLaVA-NeXT and Qwen2-VL image processors).
//! * LLaVA-NeXT anyres: best pinpoint resolution, aspect-preserving resize, centred
//!   black padding, tiles in raster order after a base tile of the whole image.
//! * Qwen2.5-VL: `smart_resize` to multiples of 28, frames grouped in temporal
//!   patches of 2 (an image's frame duplicated, a video padded with its last frame).
//! * Audio: WAV through `hound`, mixed to mono, resampled linearly to 16 kHz, log-mel
//!   per [`crate::mel`], padded with silence to whole windows.
//! * Video: a folder of frames (sorted by file name) or a list of image files.

use std::path::{Path, PathBuf};

use easerve_model::tokens::{select_best_resolution, smart_resize, unpadded_crop};
use easerve_model::{EncoderKind, ItemTokens, ModelArch};
use easerve_sched::MmItem;
use image::imageops::FilterType;
use image::{Rgb, RgbImage};

use crate::mel::{log_mel, HOP, SAMPLE_RATE};

/// CLIP normalisation mean per RGB channel (HF `OPENAI_CLIP_MEAN`).
pub const CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
/// CLIP normalisation std per RGB channel (HF `OPENAI_CLIP_STD`).
#[allow(clippy::excessive_precision)] // the published 8-digit constants, as HF writes them
pub const CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_58, 0.275_777_11];

/// Why an input could not be used.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// A file could not be read or decoded.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The input does not suit the model (wrong modality, bad size).
    #[error("{0}")]
    Model(String),
}

/// What is wrong with media bytes: a request's WAV or image data
/// ([`Media::wav_bytes`], [`Media::rgb_bytes`]), or a WAV file's samples.
#[derive(Debug, thiserror::Error)]
pub enum MediaBytesError {
    /// Not a readable WAV stream (hound's message).
    #[error("{0}")]
    Wav(hound::Error),
    /// A WAV stream's sample rate outside 1000..384000 Hz.
    #[error("sample rate {0} Hz is outside 1000..384000 Hz")]
    SampleRate(u32),
    /// A WAV stream without samples.
    #[error("no samples")]
    NoSamples,
    /// Image bytes whose format cannot be told (the reader's message).
    #[error("{0}")]
    Format(std::io::Error),
    /// Image bytes that do not decode (the image crate's message).
    #[error("{0}")]
    Image(image::ImageError),
}

fn file_err(path: &Path, message: impl ToString) -> InputError {
    InputError::File {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

/// A decoded multimodal input.
#[derive(Clone, Debug)]
pub enum Media {
    /// An RGB image.
    Image(RgbImage),
    /// Video frames (all resized to the first frame's size when prepared).
    Video(Vec<RgbImage>),
    /// Mono audio at 16 kHz, samples in `[-1, 1]`.
    Audio(Vec<f32>),
}

impl Media {
    /// Decode an image file (PNG or JPEG).
    pub fn image(path: &Path) -> Result<Media, InputError> {
        Ok(Media::Image(read_rgb(path)?))
    }

    /// Decode a video: `path` is a folder of frame images (sorted by name).
    pub fn video_dir(path: &Path) -> Result<Media, InputError> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| file_err(path, format!("cannot list frames: {e}")))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension().and_then(|e| e.to_str()).is_some_and(|e| {
                    matches!(e.to_ascii_lowercase().as_str(), "png" | "jpg" | "jpeg")
                })
            })
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(file_err(path, "no .png/.jpg frames in the folder"));
        }
        Media::video_frames(&files)
    }

    /// Decode a video from a list of frame images.
    pub fn video_frames(files: &[PathBuf]) -> Result<Media, InputError> {
        let frames = files
            .iter()
            .map(|f| read_rgb(f))
            .collect::<Result<Vec<_>, _>>()?;
        if frames.is_empty() {
            return Err(InputError::Model("a video needs at least one frame".into()));
        }
        Ok(Media::Video(frames))
    }

    /// Decode a WAV file (PCM integer or float), mix to mono, resample to 16 kHz.
    pub fn wav(path: &Path) -> Result<Media, InputError> {
        let r = hound::WavReader::open(path).map_err(|e| file_err(path, e))?;
        wav_samples(r).map_err(|e| file_err(path, e))
    }

    /// [`Media::wav`] of WAV bytes held in memory (a request's `input_audio`);
    /// the error says what is wrong with them.
    pub fn wav_bytes(bytes: &[u8]) -> Result<Media, MediaBytesError> {
        let r = hound::WavReader::new(std::io::Cursor::new(bytes)).map_err(MediaBytesError::Wav)?;
        wav_samples(r)
    }

    /// An image (PNG or JPEG, told by its bytes) held in memory, as RGB; the
    /// error says what is wrong with it.
    pub fn rgb_bytes(bytes: &[u8]) -> Result<RgbImage, MediaBytesError> {
        image::ImageReader::new(std::io::Cursor::new(bytes))
            .with_guessed_format()
            .map_err(MediaBytesError::Format)?
            .decode()
            .map(|img| img.to_rgb8())
            .map_err(MediaBytesError::Image)
    }

    /// The shape of this input as the scheduler sees it: an image's pixels, a
    /// video's frames and the first frame's pixels (every frame is resized to
    /// it when prepared), audio's seconds at 16 kHz.
    pub fn item(&self) -> MmItem {
        match self {
            Media::Image(img) => MmItem::Image {
                height: img.height(),
                width: img.width(),
            },
            Media::Video(frames) => MmItem::Video {
                frames: frames.len() as u32,
                height: frames.first().map_or(0, |f| f.height()),
                width: frames.first().map_or(0, |f| f.width()),
            },
            Media::Audio(samples) => MmItem::Audio {
                seconds: samples.len() as f64 / SAMPLE_RATE as f64,
            },
        }
    }

    /// Decode `path` by its extension: `.wav` audio, `.png`/`.jpg`/`.jpeg` image, a
    /// folder of frames as video.
    pub fn open(path: &Path) -> Result<Media, InputError> {
        if path.is_dir() {
            return Media::video_dir(path);
        }
        match path
            .extension()
            .and_then(|e| e.to_str())
            .map(|e| e.to_ascii_lowercase())
            .as_deref()
        {
            Some("wav") => Media::wav(path),
            Some("png" | "jpg" | "jpeg") => Media::image(path),
            _ => Err(file_err(
                path,
                "unknown input kind: expected .png, .jpg, .jpeg, .wav or a folder of frames",
            )),
        }
    }

    /// Deterministic synthetic media with the shape of `item`: a test pattern image
    /// (colour gradients and a checkerboard shifted by `seed`), frames of that pattern
    /// moving one pixel per frame, or a tone sweep with a little seeded noise.
    pub fn synthetic(item: &MmItem, seed: u64) -> Media {
        match *item {
            MmItem::Image { height, width } => Media::Image(pattern(height, width, seed, 0)),
            MmItem::Video {
                frames,
                height,
                width,
            } => Media::Video(
                (0..frames.max(1))
                    .map(|f| pattern(height, width, seed, f))
                    .collect(),
            ),
            MmItem::Audio { seconds } => {
                let n = (seconds.max(0.0) * f64::from(SAMPLE_RATE)).round() as usize;
                let f0 = 200.0 + (seed % 7) as f32 * 50.0;
                let mut state = seed | 1;
                Media::Audio(
                    (0..n.max(1))
                        .map(|i| {
                            // xorshift noise at -40 dB.
                            state ^= state << 13;
                            state ^= state >> 7;
                            state ^= state << 17;
                            let noise = (state % 2001) as f32 / 1000.0 - 1.0;
                            let t = i as f32 / SAMPLE_RATE as f32;
                            0.5 * (2.0 * std::f32::consts::PI * (f0 + 100.0 * t) * t).sin()
                                + 0.01 * noise
                        })
                        .collect(),
                )
            }
        }
    }
}

/// Samples of a WAV stream (PCM integer or float), mixed to mono and
/// resampled to 16 kHz.
fn wav_samples<R: std::io::Read>(mut r: hound::WavReader<R>) -> Result<Media, MediaBytesError> {
    let spec = r.spec();
    if !(1_000..=384_000).contains(&spec.sample_rate) {
        return Err(MediaBytesError::SampleRate(spec.sample_rate));
    }
    let ch = usize::from(spec.channels.max(1));
    let raw: Vec<f32> = match spec.sample_format {
        hound::SampleFormat::Float => r
            .samples::<f32>()
            .collect::<Result<_, _>>()
            .map_err(MediaBytesError::Wav)?,
        hound::SampleFormat::Int => {
            let scale = 1.0 / (1u64 << (spec.bits_per_sample.clamp(1, 32) - 1)) as f32;
            r.samples::<i32>()
                .map(|s| s.map(|v| v as f32 * scale))
                .collect::<Result<_, _>>()
                .map_err(MediaBytesError::Wav)?
        }
    };
    let mono: Vec<f32> = raw
        .chunks(ch)
        .map(|c| c.iter().sum::<f32>() / ch as f32)
        .collect();
    if mono.is_empty() {
        return Err(MediaBytesError::NoSamples);
    }
    Ok(Media::Audio(resample(&mono, spec.sample_rate, SAMPLE_RATE)))
}

fn read_rgb(path: &Path) -> Result<RgbImage, InputError> {
    let img = image::ImageReader::open(path)
        .map_err(|e| file_err(path, e))?
        .with_guessed_format()
        .map_err(|e| file_err(path, e))?
        .decode()
        .map_err(|e| file_err(path, e))?;
    Ok(img.to_rgb8())
}

fn pattern(height: u32, width: u32, seed: u64, frame: u32) -> RgbImage {
    let (h, w) = (height.max(1), width.max(1));
    let shift = (seed % 97) as u32 + frame;
    RgbImage::from_fn(w, h, |x, y| {
        let checker = if ((x + shift) / 8 + y / 8).is_multiple_of(2) {
            40
        } else {
            0
        };
        Rgb([
            ((x * 215 / w) + checker) as u8,
            ((y * 215 / h) + checker) as u8,
            (((x + y + shift) % 256) as u8) / 2,
        ])
    })
}

/// Linear-interpolation resampling (adequate for timing; not band-limited).
fn resample(x: &[f32], from: u32, to: u32) -> Vec<f32> {
    if from == to || x.len() < 2 {
        return x.to_vec();
    }
    let n = (x.len() as f64 * f64::from(to) / f64::from(from)).round() as usize;
    (0..n)
        .map(|i| {
            let pos = i as f64 * f64::from(from) / f64::from(to);
            let j = (pos.floor() as usize).min(x.len() - 2);
            let frac = (pos - j as f64) as f32;
            x[j] * (1.0 - frac) + x[j + 1] * frac
        })
        .collect()
}

/// A preprocessed item on the host, ready to move to a device.
#[derive(Clone, Debug)]
pub enum HostItem {
    /// LLaVA-NeXT anyres tiles `[tiles, side^2, 3*patch^2]`.
    Anyres {
        /// Row-major values.
        data: Vec<f32>,
        /// `[tiles, side^2, 3*patch^2]`.
        shape: [usize; 3],
        /// Grid tiles per column.
        grid_h: usize,
        /// Grid tiles per row.
        grid_w: usize,
        /// Feature rows kept after unpadding.
        crop_rows: usize,
        /// Feature columns kept after unpadding.
        crop_cols: usize,
    },
    /// Qwen patches `[t*gh*gw, 3*tp*patch^2]`.
    Qwen {
        /// Row-major values.
        data: Vec<f32>,
        /// `[t*gh*gw, 3*tp*patch^2]`.
        shape: [usize; 2],
        /// Temporal patches.
        t: usize,
        /// Patch rows.
        grid_h: usize,
        /// Patch columns.
        grid_w: usize,
    },
    /// Whisper log-mel windows `[windows, mel_bins, 2*frames_per_window]`.
    Audio {
        /// Row-major values.
        data: Vec<f32>,
        /// `[windows, mel_bins, 2*frames_per_window]`.
        shape: [usize; 3],
        /// LLM tokens of the clip.
        llm_tokens: usize,
    },
}

/// A preprocessed item with its token counts (as `ModelArch` counts them).
#[derive(Clone, Debug)]
pub struct Prepared {
    /// Host tensors for the encoder.
    pub item: HostItem,
    /// Encoder and LLM tokens of the item.
    pub tokens: ItemTokens,
}

fn resize(img: &RgbImage, h: u32, w: u32) -> RgbImage {
    if img.height() == h && img.width() == w {
        return img.clone();
    }
    image::imageops::resize(img, w.max(1), h.max(1), FilterType::CatmullRom)
}

/// Normalised value of channel `c` at `(x, y)`.
fn norm_px(img: &RgbImage, x: u32, y: u32, c: usize) -> f32 {
    (f32::from(img.get_pixel(x, y)[c]) / 255.0 - CLIP_MEAN[c]) / CLIP_STD[c]
}

/// Patches of a square tile, raster order, each flattened `(c, y, x)`.
fn tile_patches(tile: &RgbImage, x0: u32, y0: u32, side: u32, patch: u32, out: &mut Vec<f32>) {
    let g = side / patch;
    for pr in 0..g {
        for pc in 0..g {
            for c in 0..3 {
                for y in 0..patch {
                    for x in 0..patch {
                        out.push(norm_px(tile, x0 + pc * patch + x, y0 + pr * patch + y, c));
                    }
                }
            }
        }
    }
}

/// Preprocess `media` for `arch`'s encoder.
///
/// Errors ([`InputError::Model`]): a text-only model, a modality the encoder does not
/// take (e.g. audio for an image model), or a size the token rules reject.
pub fn prepare(arch: &ModelArch, media: &Media) -> Result<Prepared, InputError> {
    let enc = arch
        .encoder
        .as_ref()
        .ok_or_else(|| InputError::Model(format!("model {} has no encoder", arch.name)))?;
    match (&enc.kind, media) {
        (
            EncoderKind::ClipAnyres {
                image_size,
                patch,
                grid_pinpoints,
            },
            Media::Image(img),
        ) => prepare_anyres(arch, img, *image_size, *patch, grid_pinpoints),
        (EncoderKind::QwenVit { .. }, Media::Image(_) | Media::Video(_)) => {
            prepare_qwen(arch, &enc.kind, media)
        }
        (
            EncoderKind::Whisper {
                mel_bins,
                window_s,
                frames_per_window,
                ..
            },
            Media::Audio(samples),
        ) => prepare_whisper(arch, samples, *mel_bins, *window_s, *frames_per_window),
        (_, m) => Err(InputError::Model(format!(
            "model {} cannot encode {}",
            arch.name,
            match m {
                Media::Image(_) => "an image",
                Media::Video(_) => "a video",
                Media::Audio(_) => "audio",
            }
        ))),
    }
}

fn model_err(e: easerve_model::ModelError) -> InputError {
    InputError::Model(e.to_string())
}

/// A CLIP anyres image (LLaVA-1.6): the base tile resized to the encoder's
/// `image_size`, then the tiles of the best grid resolution of
/// `grid_pinpoints`, the image resized into it preserving its aspect and
/// centred on black; `patch`-pixel patches, row-major.
fn prepare_anyres(
    arch: &ModelArch,
    img: &RgbImage,
    image_size: u32,
    patch: u32,
    grid_pinpoints: &[(u32, u32)],
) -> Result<Prepared, InputError> {
    let tokens = arch
        .image_tokens(img.height(), img.width())
        .map_err(model_err)?;
    let (is, p) = (image_size, patch);
    let (bh, bw) =
        select_best_resolution(img.height(), img.width(), grid_pinpoints).unwrap_or((is, is));
    let (gh, gw) = ((bh / is).max(1), (bw / is).max(1));
    // Aspect-preserving resize into (bh, bw), centred on black.
    let scale =
        (f64::from(bw) / f64::from(img.width())).min(f64::from(bh) / f64::from(img.height()));
    let nw = ((f64::from(img.width()) * scale).ceil() as u32).clamp(1, bw);
    let nh = ((f64::from(img.height()) * scale).ceil() as u32).clamp(1, bh);
    let mut canvas = RgbImage::new(gw * is, gh * is);
    image::imageops::overlay(
        &mut canvas,
        &resize(img, nh, nw),
        i64::from((gw * is - nw) / 2),
        i64::from((gh * is - nh) / 2),
    );
    let side = is / p;
    let n = (side * side) as usize;
    let tiles = 1 + (gh * gw) as usize;
    let mut data = Vec::with_capacity(tiles * n * (3 * p * p) as usize);
    tile_patches(&resize(img, is, is), 0, 0, is, p, &mut data);
    for r in 0..gh {
        for c in 0..gw {
            tile_patches(&canvas, c * is, r * is, is, p, &mut data);
        }
    }
    let (rows, cols) = unpadded_crop(
        img.height(),
        img.width(),
        u64::from(side),
        u64::from(gh),
        u64::from(gw),
    );
    Ok(Prepared {
        item: HostItem::Anyres {
            data,
            shape: [tiles, n, (3 * p * p) as usize],
            grid_h: gh as usize,
            grid_w: gw as usize,
            crop_rows: rows as usize,
            crop_cols: cols as usize,
        },
        tokens,
    })
}

/// A Qwen-ViT image or video (`kind` is [`EncoderKind::QwenVit`]): frames
/// resized by `smart_resize` within the image's or the video's pixel bounds,
/// then `temporal_patch` frames × `patch`² pixels per patch (a missing frame
/// of the last temporal patch repeats the last frame).
fn prepare_qwen(
    arch: &ModelArch,
    kind: &EncoderKind,
    media: &Media,
) -> Result<Prepared, InputError> {
    let EncoderKind::QwenVit {
        patch,
        temporal_patch,
        spatial_merge,
        min_pixels,
        max_pixels,
        video_min_pixels,
        video_max_pixels,
        ..
    } = kind
    else {
        return Err(InputError::Model(format!(
            "model {}: not a Qwen ViT encoder",
            arch.name
        )));
    };
    let (frames, tokens, (h, w)) = match media {
        Media::Image(img) => {
            let t = arch
                .image_tokens(img.height(), img.width())
                .map_err(model_err)?;
            let hw = smart_resize(
                img.height(),
                img.width(),
                patch * spatial_merge,
                *min_pixels,
                *max_pixels,
            )
            .map_err(model_err)?;
            (std::slice::from_ref(img), t, hw)
        }
        Media::Video(f) => {
            let first = f
                .first()
                .ok_or_else(|| InputError::Model("a video needs at least one frame".into()))?;
            let (fh, fw) = (first.height(), first.width());
            let t = arch
                .video_tokens(f.len() as u32, fh, fw)
                .map_err(model_err)?;
            let hw = smart_resize(
                fh,
                fw,
                patch * spatial_merge,
                *video_min_pixels,
                *video_max_pixels,
            )
            .map_err(model_err)?;
            (f.as_slice(), t, hw)
        }
        Media::Audio(_) => {
            return Err(InputError::Model(format!(
                "model {} cannot encode audio",
                arch.name
            )))
        }
    };
    let (h, w) = (h as u32, w as u32);
    let resized: Vec<RgbImage> = frames.iter().map(|f| resize(f, h, w)).collect();
    let tp = (*temporal_patch).max(1) as usize;
    let t = resized.len().div_ceil(tp).max(1);
    let p = *patch;
    let (gh, gw) = ((h / p) as usize, (w / p) as usize);
    let dim = 3 * tp * (p * p) as usize;
    let mut data = Vec::with_capacity(t * gh * gw * dim);
    for ti in 0..t {
        // Frames of this temporal patch; missing ones repeat the last frame.
        let fr: Vec<&RgbImage> = (0..tp)
            .map(|k| &resized[(ti * tp + k).min(resized.len() - 1)])
            .collect();
        for pr in 0..gh as u32 {
            for pc in 0..gw as u32 {
                for c in 0..3 {
                    for f in &fr {
                        for y in 0..p {
                            for x in 0..p {
                                data.push(norm_px(f, pc * p + x, pr * p + y, c));
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(Prepared {
        item: HostItem::Qwen {
            data,
            shape: [t * gh * gw, dim],
            t,
            grid_h: gh,
            grid_w: gw,
        },
        tokens,
    })
}

/// Whisper audio: log-mel spectrograms of `mel_bins` bins over windows of
/// `window_s` seconds, `2 · frames_per_window` frames each (10 ms hops).
fn prepare_whisper(
    arch: &ModelArch,
    samples: &[f32],
    mel_bins: u32,
    window_s: f64,
    frames_per_window: u32,
) -> Result<Prepared, InputError> {
    let seconds = samples.len() as f64 / f64::from(SAMPLE_RATE);
    let tokens = arch.audio_tokens(seconds).map_err(model_err)?;
    let mel_frames = 2 * frames_per_window as usize;
    let per_window = (window_s * f64::from(SAMPLE_RATE)).round() as usize;
    if per_window != mel_frames * HOP {
        return Err(InputError::Model(format!(
            "model {}: a {window_s}-s window has {} mel frames at 100 Hz, but the encoder takes 2 x {frames_per_window}",
            arch.name,
            per_window / HOP
        )));
    }
    let windows = samples.len().div_ceil(per_window).max(1);
    let bins = mel_bins as usize;
    let mut data = Vec::with_capacity(windows * bins * mel_frames);
    for wi in 0..windows {
        let chunk = &samples
            [(wi * per_window).min(samples.len())..((wi + 1) * per_window).min(samples.len())];
        data.extend(log_mel(chunk, bins, mel_frames));
    }
    Ok(Prepared {
        item: HostItem::Audio {
            data,
            shape: [windows, bins, mel_frames],
            llm_tokens: tokens.llm_tokens as usize,
        },
        tokens,
    })
}

/// How the front end keys a media item for the caches (vLLM's `mm_hash`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemKeying {
    /// Over the decoded item: its modality, shape and pixels (or samples);
    /// the same picture sent as PNG or JPEG of equal pixels is one item.
    Decoded,
    /// Over the bytes the client sent (the file, before decoding):
    /// `[deployment.encoder_cache] hash_raw_bytes = true`.
    Raw,
}

/// The first 8 bytes (little-endian) of the SHA-256 of `parts` in order,
/// each preceded by its length: a 64-bit content key, the width of the
/// twin's content ids (`easerve_sched::ContentItem::id`). SHA-256
/// (RustCrypto's `sha2`) rather than a faster non-cryptographic hash since
/// a client picks the bytes: a collision would serve one client's
/// embeddings to another (vLLM hashes with SHA-256 for the same reason).
pub fn content_key<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    let d = h.finalize();
    u64::from_le_bytes(d[..8].try_into().expect("32 bytes"))
}

impl Media {
    /// The item's content key over its decoded form ([`ItemKeying::Decoded`]):
    /// modality, dimensions and samples, so equal keys mean equal inputs to
    /// the encoder.
    pub fn content_key(&self) -> u64 {
        fn dims(img: &RgbImage) -> [u8; 8] {
            let mut d = [0u8; 8];
            d[..4].copy_from_slice(&img.width().to_le_bytes());
            d[4..].copy_from_slice(&img.height().to_le_bytes());
            d
        }
        match self {
            Media::Image(img) => {
                let d = dims(img);
                content_key([&b"image"[..], &d, img.as_raw()])
            }
            Media::Video(frames) => {
                let d: Vec<[u8; 8]> = frames.iter().map(dims).collect();
                let mut parts: Vec<&[u8]> = vec![b"video"];
                for (f, d) in frames.iter().zip(&d) {
                    parts.push(d);
                    parts.push(f.as_raw());
                }
                content_key(parts)
            }
            Media::Audio(s) => {
                let bytes: Vec<u8> = s.iter().flat_map(|x| x.to_le_bytes()).collect();
                content_key([&b"audio"[..], &bytes])
            }
        }
    }
}
