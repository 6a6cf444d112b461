//! How a multimodal item becomes tokens, following each model's own preprocessor:
//!
//! * LLaVA-NeXT anyres (HF `LlavaNextProcessor`): best pinpoint resolution, one base
//!   tile + grid tiles through CLIP, unpadded grid features + one newline per row + 576
//!   base features to the LLM.
//! * Qwen2.5-VL (HF `Qwen2VLImageProcessor.smart_resize`): resize to multiples of 28
//!   within pixel bounds; 14-px patches, 2 frames per temporal patch, 2x2 merge.
//! * Ultravox (Whisper feature extractor + `StackAudioFrames`): 30-s windows of 1500
//!   encoder frames, 50 frames/s stacked by 8 into LLM tokens.

use crate::arch::{EncoderKind, ModelArch};
use crate::{ItemTokens, ModelError};

/// Lower per-frame pixel bound for Qwen2.5-VL video frames: 128*28*28 = 100352
/// (HF `Qwen2VLVideoProcessor` `size.shortest_edge`; `qwen-vl-utils` `VIDEO_MIN_PIXELS`).
pub const QWEN_VIDEO_MIN_PIXELS: u64 = 128 * 28 * 28;
/// Upper per-frame pixel bound for Qwen2.5-VL video frames: 768*28*28 = 602112
/// (HF `Qwen2VLVideoProcessor` `size.longest_edge`; `qwen-vl-utils` `VIDEO_MAX_PIXELS`).
/// The clip-wide `total_pixels` cap of `qwen-vl-utils` is not modelled.
pub const QWEN_VIDEO_MAX_PIXELS: u64 = 768 * 28 * 28;

/// Largest aspect ratio `smart_resize` accepts (it raises above 200).
const QWEN_MAX_ASPECT: f64 = 200.0;

/// `(height, width)` of the best anyres resolution for an image of `height x width`
/// (HF `select_best_resolution`): maximise the effective (downscaled, capped at
/// original) resolution, then minimise the wasted area; ties keep the first pinpoint.
pub fn select_best_resolution(
    height: u32,
    width: u32,
    pinpoints: &[(u32, u32)],
) -> Option<(u32, u32)> {
    let (oh, ow) = (f64::from(height), f64::from(width));
    let mut best: Option<(u32, u32)> = None;
    let (mut best_eff, mut best_waste) = (0u64, u64::MAX);
    for &(ph, pw) in pinpoints {
        let scale = (f64::from(pw) / ow).min(f64::from(ph) / oh);
        let dw = (ow * scale) as u64;
        let dh = (oh * scale) as u64;
        let eff = (dw * dh).min(u64::from(height) * u64::from(width));
        let waste = u64::from(ph) * u64::from(pw) - eff;
        if eff > best_eff || (eff == best_eff && waste < best_waste) {
            best = Some((ph, pw));
            best_eff = eff;
            best_waste = waste;
        }
    }
    best
}

/// `(features, newlines)` of the unpadded anyres grid (HF `_get_unpadded_features`):
/// the `(grid_h*side) x (grid_w*side)` feature map is cropped back to the original
/// aspect ratio, then one newline token is added per remaining row.
fn unpadded_features(height: u32, width: u32, side: u64, grid_h: u64, grid_w: u64) -> (u64, u64) {
    let (rows, cols) = unpadded_crop(height, width, side, grid_h, grid_w);
    (rows * cols, rows)
}

/// `(rows, cols)` of the anyres feature map of an `height x width` image after the
/// `(grid_h*side) x (grid_w*side)` map is cropped back to the original aspect ratio
/// (HF `unpad_image`); the crop is centred.
pub fn unpadded_crop(height: u32, width: u32, side: u64, grid_h: u64, grid_w: u64) -> (u64, u64) {
    let (oh, ow) = (f64::from(height), f64::from(width));
    let mut cur_h = side * grid_h;
    let mut cur_w = side * grid_w;
    let orig_aspect = ow / oh;
    let cur_aspect = cur_w as f64 / cur_h as f64;
    if orig_aspect > cur_aspect {
        let new_h = round7(oh * (cur_w as f64 / ow)) as u64;
        let pad = cur_h.saturating_sub(new_h) / 2;
        cur_h -= 2 * pad;
    } else {
        let new_w = round7(ow * (cur_h as f64 / oh)) as u64;
        let pad = cur_w.saturating_sub(new_w) / 2;
        cur_w -= 2 * pad;
    }
    (cur_h, cur_w)
}

/// Python's `round(x, 7)` (HF rounds before truncating, to absorb float noise).
fn round7(x: f64) -> f64 {
    (x * 1e7).round_ties_even() / 1e7
}

/// Qwen2-VL `smart_resize`: `(h', w')`, both multiples of `factor`, close to
/// `(height, width)`, with `min_pixels <= h'*w' <= max_pixels`.
pub fn smart_resize(
    height: u32,
    width: u32,
    factor: u32,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(u64, u64), ModelError> {
    let (h, w, f) = (f64::from(height), f64::from(width), f64::from(factor));
    if h.max(w) / h.min(w) > QWEN_MAX_ASPECT {
        return Err(ModelError::InvalidInput(format!(
            "aspect ratio of {height}x{width} exceeds {QWEN_MAX_ASPECT}"
        )));
    }
    let mut hb = f.max((h / f).round_ties_even() * f);
    let mut wb = f.max((w / f).round_ties_even() * f);
    if hb * wb > max_pixels as f64 {
        let beta = (h * w / max_pixels as f64).sqrt();
        hb = f.max((h / beta / f).floor() * f);
        wb = f.max((w / beta / f).floor() * f);
    } else if hb * wb < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        hb = (h * beta / f).ceil() * f;
        wb = (w * beta / f).ceil() * f;
    }
    Ok((hb as u64, wb as u64))
}

/// Crops Gemma 3's pan-and-scan adds to an image of `height x width` (the
/// whole image is encoded besides): along the long side
/// `clamp(min(⌊long/short + 0.5⌋, ⌊long/min_crop⌋), 2, max_crops)` crops, none
/// when the aspect ratio is below `min_ratio` or a crop would be narrower
/// than `min_crop` (HF `Gemma3ImageProcessor.pan_and_scan`).
pub fn pan_and_scan_crops(height: u32, width: u32, p: &crate::PanAndScan) -> u64 {
    let (long, short) = (height.max(width), height.min(width).max(1));
    let (l, sh) = (f64::from(long), f64::from(short));
    if l / sh < p.min_ratio {
        return 0;
    }
    let n = ((l / sh + 0.5).floor() as u32)
        .min(long / p.min_crop.max(1))
        .max(2)
        .min(p.max_crops);
    let crop = long.div_ceil(n.max(1));
    if crop.min(short) < p.min_crop {
        return 0;
    }
    u64::from(n)
}

/// Qwen3-VL's video `smart_resize` (HF `Qwen3VLVideoProcessor`): each frame
/// resized to `(h', w')`, multiples of `factor`, such that the clip's pixels
/// `t'·h'·w'` (`t'` = frames rounded up to whole temporal patches) stay within
/// `min_pixels ..= max_pixels`; the scale `beta` is taken over the unrounded
/// `frames·height·width`, as the processor does.
pub fn smart_resize_clip(
    frames: u32,
    height: u32,
    width: u32,
    temporal_patch: u32,
    factor: u32,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(u64, u64), ModelError> {
    let (h, w, f) = (f64::from(height), f64::from(width), f64::from(factor));
    if h.max(w) / h.min(w) > QWEN_MAX_ASPECT {
        return Err(ModelError::InvalidInput(format!(
            "aspect ratio of {height}x{width} exceeds {QWEN_MAX_ASPECT}"
        )));
    }
    let tp = temporal_patch.max(1);
    let t = f64::from(frames.div_ceil(tp) * tp);
    let n = f64::from(frames);
    let mut hb = f.max((h / f).round_ties_even() * f);
    let mut wb = f.max((w / f).round_ties_even() * f);
    if t * hb * wb > max_pixels as f64 {
        let beta = (n * h * w / max_pixels as f64).sqrt();
        hb = f.max((h / beta / f).floor() * f);
        wb = f.max((w / beta / f).floor() * f);
    } else if t * hb * wb < min_pixels as f64 {
        let beta = (min_pixels as f64 / (n * h * w)).sqrt();
        hb = (h * beta / f).ceil() * f;
        wb = (w * beta / f).ceil() * f;
    }
    Ok((hb as u64, wb as u64))
}

/// `(cols, rows)` of InternVL's `dynamic_preprocess` grid for an image of
/// `width x height` pixels cut into `size`-px tiles: among the grids with
/// `min_tiles ≤ cols·rows ≤ max_tiles`, visited by area (then by columns),
/// the one whose `cols/rows` is closest to `width/height`; on an equal
/// distance the later (larger) grid wins when the image has more than half
/// of its `size²·cols·rows` pixels (OpenGVLab/InternVL
/// `find_closest_aspect_ratio`). 1024x768 -> (4, 3); 800x800 -> (2, 2).
pub fn internvl_grid(
    width: u32,
    height: u32,
    min_tiles: u32,
    max_tiles: u32,
    size: u32,
) -> (u32, u32) {
    let lo = min_tiles.max(1);
    let hi = max_tiles.max(lo);
    let mut grids: Vec<(u32, u32)> = (1..=hi)
        .flat_map(|i| (1..=hi).map(move |j| (i, j)))
        .filter(|&(i, j)| (lo..=hi).contains(&(i * j)))
        .collect();
    grids.sort_by_key(|&(i, j)| (i * j, i));
    let ar = f64::from(width) / f64::from(height.max(1));
    let area = f64::from(width) * f64::from(height);
    let (mut best, mut best_diff) = ((1, 1), f64::INFINITY);
    for (i, j) in grids {
        let d = (ar - f64::from(i) / f64::from(j)).abs();
        if d < best_diff {
            best_diff = d;
            best = (i, j);
        } else if d == best_diff && area > 0.5 * f64::from(size).powi(2) * f64::from(i * j) {
            best = (i, j);
        }
    }
    best
}

/// `(rows, cols)` of Llama 4's `get_best_fit` canvas for an image of
/// `height x width` pixels in `size`-px tiles: every `rows x cols` with
/// `rows·cols ≤ max_tiles` is scaled by `min(rows·size/height, cols·size/width)`;
/// the smallest scale ≥ 1 wins (no canvas upscales more than needed), else the
/// largest scale below 1; among canvases of that scale the smallest
/// (HF `Llama4ImageProcessorFast`, `resize_to_max_canvas` false). Scales are
/// compared as exact fractions. 768x1024 -> (3, 4). HF computes the scales as
/// float32, so two different scales that round to the same float32 are a tie
/// there (broken by the smaller canvas) and ordered by exact value here: such
/// an image can get a different canvas than HF gives it.
pub fn llama4_canvas(height: u32, width: u32, max_tiles: u32, size: u32) -> (u32, u32) {
    let (h, w, p) = (
        u64::from(height.max(1)),
        u64::from(width.max(1)),
        u64::from(size),
    );
    // scale as the fraction (num, den), the smaller of the two sides' ratios
    let scale = |r: u64, c: u64| -> (u64, u64) {
        let (a, b) = ((r * p, h), (c * p, w));
        if a.0 * b.1 <= b.0 * a.1 {
            a
        } else {
            b
        }
    };
    let lt = |x: (u64, u64), y: (u64, u64)| x.0 * y.1 < y.0 * x.1;
    // (scale, area, (rows, cols)) of the best canvas so far
    type Best = ((u64, u64), u64, (u32, u32));
    let mut best: Option<Best> = None;
    for r in 1..=max_tiles.max(1) {
        for c in 1..=max_tiles.max(1) / r {
            let s = scale(u64::from(r), u64::from(c));
            let up = s.0 >= s.1;
            let area = u64::from(r * c);
            let better = match best {
                None => true,
                Some((bs, barea, _)) => {
                    let bup = bs.0 >= bs.1;
                    match (up, bup) {
                        (true, false) => true,
                        (false, true) => false,
                        // both upscale: the smaller scale; both down: the larger
                        (true, true) if lt(s, bs) => true,
                        (false, false) if lt(bs, s) => true,
                        _ => s.0 * bs.1 == bs.0 * s.1 && area < barea,
                    }
                }
            };
            if better {
                best = Some((s, area, (r, c)));
            }
        }
    }
    best.map_or((1, 1), |b| b.2)
}

/// Audio tokens of the Qwen3-Omni encoder for `frames` log-mel frames: each
/// whole chunk of `chunk` frames gives `⌈⌈⌈chunk/2⌉/2⌉/2⌉` tokens (13 for
/// 100), the remainder the same rule over its own frames (HF
/// `Qwen3OmniMoe`'s `_get_feat_extract_output_lengths`: 1 s -> 13, 10 s -> 130).
pub fn omni_audio_tokens(frames: u64, chunk: u32) -> u64 {
    use crate::arch::omni_conv_out;
    let c = u64::from(chunk.max(1));
    let out3 = |n: u64| -> u64 {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        u64::from(omni_conv_out(omni_conv_out(omni_conv_out(n))))
    };
    (frames / c) * out3(c) + out3(frames % c)
}

/// Mel frames per second of the Whisper feature extractor the Qwen3-Omni
/// processor runs: 16 kHz audio, hop 160 samples (`WhisperFeatureExtractor`
/// `sampling_rate`, `hop_length`).
pub const OMNI_MEL_SAMPLE_RATE: u64 = 16_000;
/// Samples per mel frame (`hop_length`).
pub const OMNI_MEL_HOP: u64 = 160;

fn check_image(height: u32, width: u32) -> Result<(), ModelError> {
    if height == 0 || width == 0 {
        return Err(ModelError::InvalidInput(format!(
            "image size {height}x{width} must be positive"
        )));
    }
    Ok(())
}

impl ModelArch {
    fn unsupported(&self, modality: &'static str) -> ModelError {
        ModelError::UnsupportedModality {
            model: self.name.clone(),
            modality,
        }
    }

    /// Tokens of one image of `height x width` pixels.
    ///
    /// * LLaVA-NeXT (672x672): 5 tiles * 577 = 2885 encoder tokens, span 577,
    ///   576 + 48*48 + 48 = 2928 LLM tokens.
    /// * Qwen2.5-VL (448x448): 32*32 = 1024 encoder tokens (one temporal patch of a
    ///   duplicated frame), 16*16 = 256 LLM tokens, span 1024.
    ///
    /// Errors: zero side -> `InvalidInput`; audio-only model or no encoder ->
    /// `UnsupportedModality`.
    pub fn image_tokens(&self, height: u32, width: u32) -> Result<ItemTokens, ModelError> {
        let enc = self
            .encoder
            .as_ref()
            .ok_or_else(|| self.unsupported("image"))?;
        check_image(height, width)?;
        match &enc.kind {
            EncoderKind::ClipAnyres {
                image_size,
                patch,
                grid_pinpoints,
            } => {
                let side = u64::from(image_size / patch);
                let tile_tokens = side * side;
                let (bh, bw) = select_best_resolution(height, width, grid_pinpoints)
                    .unwrap_or((*image_size, *image_size));
                let grid_h = u64::from(bh / image_size).max(1);
                let grid_w = u64::from(bw / image_size).max(1);
                let tiles = 1 + grid_h * grid_w;
                let (feat, newlines) = unpadded_features(height, width, side, grid_h, grid_w);
                Ok(ItemTokens {
                    encoder_tokens: tiles * (tile_tokens + 1),
                    llm_tokens: tile_tokens + feat + newlines,
                    attn_span: tile_tokens + 1,
                })
            }
            EncoderKind::QwenVit {
                patch,
                spatial_merge,
                min_pixels,
                max_pixels,
                ..
            } => {
                let factor = patch * spatial_merge;
                let (h, w) = smart_resize(height, width, factor, *min_pixels, *max_pixels)?;
                Ok(qwen_tokens(1, h, w, *patch, *spatial_merge))
            }
            EncoderKind::Siglip {
                image_size,
                patch,
                pooled_side,
                pan_and_scan,
            } => {
                let crops = 1 + pan_and_scan.map_or(0, |p| pan_and_scan_crops(height, width, &p));
                let side = u64::from(image_size / patch.max(&1));
                Ok(ItemTokens {
                    encoder_tokens: crops * side * side,
                    llm_tokens: crops * u64::from(*pooled_side).pow(2),
                    attn_span: side * side,
                })
            }
            EncoderKind::TiledVit {
                image_size,
                patch,
                pixel_shuffle,
                tiling,
                ..
            } => {
                let grid = match *tiling {
                    crate::arch::Tiling::InternVl {
                        min_tiles,
                        max_tiles,
                        thumbnail,
                    } => {
                        let (c, r) =
                            internvl_grid(width, height, min_tiles, max_tiles, *image_size);
                        let n = u64::from(c * r);
                        n + u64::from(thumbnail && n > 1)
                    }
                    crate::arch::Tiling::Llama4 { max_tiles } => {
                        let (r, c) = llama4_canvas(height, width, max_tiles, *image_size);
                        let n = u64::from(r * c);
                        n + u64::from(n > 1)
                    }
                };
                Ok(tiled_tokens(grid, *image_size, *patch, *pixel_shuffle))
            }
            EncoderKind::Whisper { .. } | EncoderKind::OmniAudio { .. } => {
                Err(self.unsupported("image"))
            }
        }
    }

    /// Tokens of one video: `frames` = frames already sampled (at 2 fps for Qwen2.5-VL),
    /// each `height x width` pixels. Only Qwen2.5-VL takes video: frames are resized with
    /// the arch's video pixel bounds (Qwen2.5-VL: [`QWEN_VIDEO_MIN_PIXELS`]..[`QWEN_VIDEO_MAX_PIXELS`]), padded
    /// to whole temporal patches; LLM tokens = ceil(frames/2) * (h'/28) * (w'/28)
    /// (16 frames of 448x448 -> 8*16*16 = 2048), encoder tokens 4x that, span = one
    /// temporal patch's (h'/14)*(w'/14) (full-attention layers attend per temporal patch,
    /// `cu_seqlens` from `grid_thw`).
    pub fn video_tokens(
        &self,
        frames: u32,
        height: u32,
        width: u32,
    ) -> Result<ItemTokens, ModelError> {
        let enc = self
            .encoder
            .as_ref()
            .ok_or_else(|| self.unsupported("video"))?;
        match &enc.kind {
            EncoderKind::QwenVit {
                patch,
                temporal_patch,
                spatial_merge,
                video_min_pixels,
                video_max_pixels,
                video_bounds_per_clip,
                ..
            } => {
                check_image(height, width)?;
                if frames == 0 {
                    return Err(ModelError::InvalidInput(
                        "video must have at least one frame".into(),
                    ));
                }
                let factor = patch * spatial_merge;
                let (h, w) = if *video_bounds_per_clip {
                    smart_resize_clip(
                        frames,
                        height,
                        width,
                        *temporal_patch,
                        factor,
                        *video_min_pixels,
                        *video_max_pixels,
                    )?
                } else {
                    smart_resize(height, width, factor, *video_min_pixels, *video_max_pixels)?
                };
                let t = u64::from(frames.div_ceil((*temporal_patch).max(1)));
                Ok(qwen_tokens(t, h, w, *patch, *spatial_merge))
            }
            // InternVL: each sampled frame is one tile, resized whole (the
            // model card's `load_video`, `max_num=1`)
            EncoderKind::TiledVit {
                image_size,
                patch,
                pixel_shuffle,
                tiling: crate::arch::Tiling::InternVl { .. },
                ..
            } => {
                check_image(height, width)?;
                if frames == 0 {
                    return Err(ModelError::InvalidInput(
                        "video must have at least one frame".into(),
                    ));
                }
                Ok(tiled_tokens(
                    u64::from(frames),
                    *image_size,
                    *patch,
                    *pixel_shuffle,
                ))
            }
            _ => Err(self.unsupported("video")),
        }
    }

    /// Tokens of one audio clip of `seconds`. Whisper pads each 30-s window, so encoder
    /// tokens = ceil(seconds/30) * 1500 (span 1500); LLM tokens = ceil(seconds * 50 / 8)
    /// (10 s -> 63). Errors: non-positive or non-finite seconds -> `InvalidInput`.
    pub fn audio_tokens(&self, seconds: f64) -> Result<ItemTokens, ModelError> {
        let enc = self
            .encoder
            .as_ref()
            .ok_or_else(|| self.unsupported("audio"))?;
        match &enc.kind {
            EncoderKind::Whisper {
                window_s,
                frames_per_window,
                stack,
                ..
            } => {
                if !(seconds.is_finite() && seconds > 0.0) {
                    return Err(ModelError::InvalidInput(format!(
                        "audio length {seconds} s must be positive and finite"
                    )));
                }
                let windows = (seconds / window_s).ceil() as u64;
                let fpw = u64::from(*frames_per_window);
                let frames_per_s = f64::from(*frames_per_window) / window_s;
                // Round away float noise before ceil (10 s * 50 / 8 is exactly 62.5).
                let llm =
                    (round7(seconds * frames_per_s / f64::from((*stack).max(1)))).ceil() as u64;
                Ok(ItemTokens {
                    encoder_tokens: windows * fpw,
                    llm_tokens: llm,
                    attn_span: fpw,
                })
            }
            EncoderKind::OmniAudio {
                chunk_frames,
                window_chunks,
                ..
            } => {
                if !(seconds.is_finite() && seconds > 0.0) {
                    return Err(ModelError::InvalidInput(format!(
                        "audio length {seconds} s must be positive and finite"
                    )));
                }
                let samples = (seconds * OMNI_MEL_SAMPLE_RATE as f64 + 1e-6).floor() as u64;
                let frames = samples / OMNI_MEL_HOP;
                if frames == 0 {
                    return Err(ModelError::InvalidInput(format!(
                        "audio of {seconds} s is shorter than one mel frame (10 ms)"
                    )));
                }
                let tokens = omni_audio_tokens(frames, *chunk_frames);
                let window = u64::from(*window_chunks)
                    * omni_audio_tokens(u64::from(*chunk_frames), *chunk_frames);
                Ok(ItemTokens {
                    encoder_tokens: tokens,
                    llm_tokens: tokens,
                    attn_span: window.clamp(1, tokens),
                })
            }
            _ => Err(self.unsupported("audio")),
        }
    }
}

/// Tokens of `tiles` tiles of a [`EncoderKind::TiledVit`]: each tile
/// `(size/patch)² + 1` encoder tokens (patches and the class token) attending
/// within the tile, and `(size/patch)² / shuffle²` LLM tokens (InternVL 448 px:
/// 1025 and 256; Llama 4 336 px: 577 and 144).
fn tiled_tokens(tiles: u64, size: u32, patch: u32, shuffle: u32) -> ItemTokens {
    let side = u64::from(size / patch.max(1));
    let s2 = u64::from(shuffle.max(1)).pow(2);
    ItemTokens {
        encoder_tokens: tiles * (side * side + 1),
        llm_tokens: tiles * (side * side / s2),
        attn_span: side * side + 1,
    }
}

/// Qwen ViT tokens for `t` temporal patches of an `h x w` (already resized) frame.
fn qwen_tokens(t: u64, h: u64, w: u64, patch: u32, merge: u32) -> ItemTokens {
    let p = u64::from(patch);
    let per_slice = (h / p) * (w / p);
    let m2 = u64::from(merge) * u64::from(merge);
    ItemTokens {
        encoder_tokens: t * per_slice,
        llm_tokens: t * per_slice / m2,
        attn_span: per_slice,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llava() -> ModelArch {
        ModelArch::preset("llava-v1.6-34b").unwrap()
    }
    fn qwen() -> ModelArch {
        ModelArch::preset("qwen2.5-vl-32b").unwrap()
    }
    fn ultravox() -> ModelArch {
        ModelArch::preset("ultravox-v0.6-27b").unwrap()
    }

    #[test]
    fn llava_672_square_gives_2928_llm_tokens() {
        let t = llava().image_tokens(672, 672).unwrap();
        assert_eq!(t.llm_tokens, 2928);
        assert_eq!(t.encoder_tokens, 5 * 577);
        assert_eq!(t.attn_span, 577);
    }

    #[test]
    fn llava_small_square_uses_a_two_tile_grid() {
        // 336x336: (336,672) and (672,336) both have full effective resolution and the
        // least waste; the first wins -> grid 1x2, 3 tiles. Unpad crops the 24x48 map to
        // 24x24: 576 + 576 + 24 newlines.
        let t = llava().image_tokens(336, 336).unwrap();
        assert_eq!(t.encoder_tokens, 3 * 577);
        assert_eq!(t.llm_tokens, 576 + 576 + 24);
    }

    #[test]
    fn llava_wide_image_picks_wide_grid_and_unpads() {
        // 1000x3000 (h x w): (336,1008) keeps 336*1008 effective -> grid 1x3.
        assert_eq!(
            select_best_resolution(
                1000,
                3000,
                &[(336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008)]
            ),
            Some((336, 1008))
        );
        let t = llava().image_tokens(1000, 3000).unwrap();
        assert_eq!(t.encoder_tokens, 4 * 577);
        // map 24x72, aspect 3 == 3: width branch keeps 72, no crop -> 24*72 + 24 + 576.
        assert_eq!(t.llm_tokens, 24 * 72 + 24 + 576);
    }

    #[test]
    fn llava_rejects_zero_and_other_modalities() {
        assert!(matches!(
            llava().image_tokens(0, 10),
            Err(ModelError::InvalidInput(_))
        ));
        assert!(matches!(
            llava().audio_tokens(3.0),
            Err(ModelError::UnsupportedModality {
                modality: "audio",
                ..
            })
        ));
        assert!(matches!(
            llava().video_tokens(4, 336, 336),
            Err(ModelError::UnsupportedModality {
                modality: "video",
                ..
            })
        ));
    }

    #[test]
    fn tiny_vit_tile_is_256_patches_plus_cls() {
        let m = ModelArch::preset("tiny-vit-lm").unwrap();
        let t = m.image_tokens(448, 448).unwrap();
        assert_eq!(t.attn_span, 257);
        assert_eq!(t.encoder_tokens, 5 * 257);
        assert_eq!(t.llm_tokens, 256 + 32 * 32 + 32);
    }

    #[test]
    fn qwen_video_16_frames_448_gives_2048_llm_tokens() {
        let t = qwen().video_tokens(16, 448, 448).unwrap();
        assert_eq!(t.llm_tokens, 8 * 16 * 16);
        assert_eq!(t.encoder_tokens, 8 * 32 * 32);
        assert_eq!(t.attn_span, 32 * 32);
        // odd frame counts pad to a whole temporal patch
        assert_eq!(qwen().video_tokens(15, 448, 448).unwrap().llm_tokens, 2048);
    }

    #[test]
    fn qwen_image_smart_resize() {
        // 448x448 is already a multiple of 28.
        let t = qwen().image_tokens(448, 448).unwrap();
        assert_eq!((t.encoder_tokens, t.llm_tokens), (1024, 256));
        // 1080x1920 -> round to 1092x1932 (39x69 merged) = 2691 LLM tokens.
        assert_eq!(
            smart_resize(1080, 1920, 28, 3136, 12_845_056).unwrap(),
            (1092, 1932)
        );
        assert_eq!(qwen().image_tokens(1080, 1920).unwrap().llm_tokens, 39 * 69);
        // tiny image is scaled up to min_pixels: 20x20 -> 56x56 -> 4 LLM tokens.
        assert_eq!(qwen().image_tokens(20, 20).unwrap().llm_tokens, 4);
        // huge image is capped at max_pixels
        let big = qwen().image_tokens(8000, 8000).unwrap();
        assert!(big.encoder_tokens * 14 * 14 <= 12_845_056);
        assert!(qwen().image_tokens(1, 300).is_err());
    }

    #[test]
    fn qwen_video_frames_are_capped_by_video_bounds() {
        let t = qwen().video_tokens(2, 1080, 1920).unwrap();
        assert!(t.encoder_tokens * 14 * 14 <= QWEN_VIDEO_MAX_PIXELS);
        assert!(qwen().video_tokens(0, 448, 448).is_err());
    }

    #[test]
    fn ultravox_10_s_gives_63_llm_tokens_one_window() {
        let t = ultravox().audio_tokens(10.0).unwrap();
        assert_eq!(t.llm_tokens, 63);
        assert_eq!(t.encoder_tokens, 1500);
        assert_eq!(t.attn_span, 1500);
        let t = ultravox().audio_tokens(31.0).unwrap();
        assert_eq!(t.encoder_tokens, 3000);
        assert_eq!(t.llm_tokens, 194); // ceil(31*6.25) = ceil(193.75)
        assert_eq!(ultravox().audio_tokens(8.0).unwrap().llm_tokens, 50);
    }

    #[test]
    fn ultravox_rejects_bad_seconds_and_images() {
        for s in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                ultravox().audio_tokens(s),
                Err(ModelError::InvalidInput(_))
            ));
        }
        assert!(matches!(
            ultravox().image_tokens(10, 10),
            Err(ModelError::UnsupportedModality { .. })
        ));
    }

    #[test]
    fn text_model_supports_no_modality() {
        let m = ModelArch::preset("text-lm-tiny").unwrap();
        assert!(m.image_tokens(10, 10).is_err());
        assert!(m.video_tokens(2, 10, 10).is_err());
        assert!(m.audio_tokens(1.0).is_err());
    }

    /// Qwen3-VL's rules, against the processors' own arithmetic
    /// (`Qwen2VLImageProcessorFast.smart_resize` with factor 32 and
    /// `Qwen3VLVideoProcessor.smart_resize`, replayed in Python 3.11 with
    /// the presets' bounds): `(input, resized, encoder tokens, LLM tokens)`.
    #[test]
    fn qwen3_vl_tokens_follow_its_processors() {
        let m = ModelArch::preset("qwen3-vl-30b-a3b").unwrap();
        for ((h, w), enc, llm) in [
            ((448, 448), 784, 196),
            ((224, 224), 256, 64), // below 65536 pixels: scaled up to 256x256
            ((1080, 1920), 8160, 2040),
            ((5000, 5000), 65536, 16384), // above 16777216: down to 4096x4096
            ((100, 300), 280, 70),
        ] {
            let t = m.image_tokens(h, w).unwrap();
            assert_eq!((t.encoder_tokens, t.llm_tokens), (enc, llm), "{h}x{w}");
            assert_eq!(t.attn_span, enc);
        }
        // the clip-wide bound: 64 frames of 720p exceed 25165824 pixels, so
        // each frame shrinks to 448x832 (beta over 64*720*1280)
        for ((f, h, w), enc, llm) in [
            ((16, 448, 448), 6272, 1568),
            ((64, 720, 1280), 46592, 11648),
            ((1, 32, 32), 16, 4),
            ((7, 360, 640), 3520, 880),
        ] {
            let t = m.video_tokens(f, h, w).unwrap();
            assert_eq!((t.encoder_tokens, t.llm_tokens), (enc, llm), "{f}x{h}x{w}");
        }
        assert!(m.audio_tokens(1.0).is_err());
    }

    /// Gemma 3: 256 tokens per image whatever its size (SigLIP at 896 px,
    /// 64x64 patches pooled 4x4), and with pan-and-scan one more image's worth
    /// per crop, by the processor's rule (HF `Gemma3ImageProcessor.pan_and_scan`,
    /// replayed in Python 3.11: 1800x600 -> 3 crops, 900x800 -> none below ratio
    /// 1.2, 1000x200 -> crops 200 px high, below 256 -> none).
    #[test]
    fn gemma3_images_are_256_tokens_and_pan_and_scan_adds_crops() {
        let mut m = ModelArch::preset("gemma-3-27b").unwrap();
        for (h, w) in [(224, 224), (1080, 1920), (4000, 100)] {
            let t = m.image_tokens(h, w).unwrap();
            assert_eq!(
                (t.encoder_tokens, t.llm_tokens, t.attn_span),
                (4096, 256, 4096)
            );
        }
        let p = crate::PanAndScan::default();
        assert_eq!(pan_and_scan_crops(600, 1800, &p), 3);
        assert_eq!(pan_and_scan_crops(1800, 600, &p), 3);
        assert_eq!(pan_and_scan_crops(800, 900, &p), 0);
        assert_eq!(pan_and_scan_crops(300, 1000, &p), 3);
        assert_eq!(pan_and_scan_crops(200, 1000, &p), 0);
        assert_eq!(pan_and_scan_crops(1000, 5000, &p), 4);
        assert_eq!(pan_and_scan_crops(600, 1000, &p), 2);
        if let Some(crate::EncoderArch {
            kind: EncoderKind::Siglip { pan_and_scan, .. },
            ..
        }) = m.encoder.as_mut()
        {
            *pan_and_scan = Some(p);
        }
        let t = m.image_tokens(600, 1800).unwrap();
        assert_eq!((t.encoder_tokens, t.llm_tokens), (4 * 4096, 4 * 256));
        assert!(m.video_tokens(8, 448, 448).is_err());
        assert!(m.audio_tokens(1.0).is_err());
    }

    /// InternVL's tiles (OpenGVLab/InternVL `dynamic_preprocess`, worked
    /// through its arithmetic): 1024x768 -> 4x3 + thumbnail = 13 tiles; 448²
    /// -> 1 (no thumbnail); 800² -> 2x2 (the tie with 1x1 goes to the larger
    /// grid: 640,000 px > half of 4·448²) + thumbnail; 1920x1080 -> 4x2 + 1.
    #[test]
    fn internvl_tiles_follow_dynamic_preprocess() {
        assert_eq!(internvl_grid(1024, 768, 1, 12, 448), (4, 3));
        assert_eq!(internvl_grid(800, 800, 1, 12, 448), (2, 2));
        assert_eq!(internvl_grid(1920, 1080, 1, 12, 448), (4, 2));
        // aspect 4.44: 4x1 (4.0) is nearer than 5x1 (5.0); 9x2 would need 18 tiles
        assert_eq!(internvl_grid(3200, 720, 1, 12, 448), (4, 1));
        let m = ModelArch::preset("internvl3-38b").unwrap();
        for ((h, w), tiles) in [
            ((768, 1024), 13),
            ((448, 448), 1),
            ((800, 800), 5),
            ((1080, 1920), 9),
        ] {
            let t = m.image_tokens(h, w).unwrap();
            assert_eq!(
                (t.encoder_tokens, t.llm_tokens, t.attn_span),
                (tiles * 1025, tiles * 256, 1025),
                "{w}x{h}"
            );
        }
        // video: one tile per frame
        let v = m.video_tokens(8, 720, 1280).unwrap();
        assert_eq!((v.encoder_tokens, v.llm_tokens), (8 * 1025, 8 * 256));
        assert!(m.audio_tokens(1.0).is_err());
    }

    /// Llama 4's canvas (HF `Llama4ImageProcessorFast.get_best_fit`, worked
    /// through): 1024x768 -> 3 rows x 4 cols (scale 1.3125 on both sides, the
    /// smallest such canvas) + a global tile = 13 x 144 tokens; portrait
    /// 768x1024 -> 4x3; 1920x1080 -> 3x5 + 1 = 16 tiles; 336² -> 1 tile.
    #[test]
    fn llama4_tiles_follow_get_best_fit() {
        assert_eq!(llama4_canvas(768, 1024, 16, 336), (3, 4));
        assert_eq!(llama4_canvas(1024, 768, 16, 336), (4, 3));
        assert_eq!(llama4_canvas(1080, 1920, 16, 336), (3, 5));
        assert_eq!(llama4_canvas(336, 336, 16, 336), (1, 1));
        let m = ModelArch::preset("llama-4-scout-17b-16e").unwrap();
        for ((h, w), tiles) in [
            ((768, 1024), 13),
            ((1024, 768), 13),
            ((1080, 1920), 16),
            ((336, 336), 1),
        ] {
            let t = m.image_tokens(h, w).unwrap();
            assert_eq!(
                (t.encoder_tokens, t.llm_tokens, t.attn_span),
                (tiles * 577, tiles * 144, 577),
                "{w}x{h}"
            );
        }
        assert!(m.video_tokens(8, 336, 336).is_err());
    }

    /// Qwen3-Omni's audio tokens (HF `_get_feat_extract_output_lengths`,
    /// evaluated with Python's floor division): 13 per whole 100-frame chunk
    /// plus the remainder's own three halvings.
    #[test]
    fn omni_audio_tokens_follow_the_feature_lengths() {
        for (frames, tokens) in [
            (1, 1),
            (50, 7),
            (99, 13),
            (100, 13),
            (101, 14),
            (200, 26),
            (1000, 130),
            (3000, 390),
            (6000, 780),
        ] {
            assert_eq!(omni_audio_tokens(frames, 100), tokens, "{frames} frames");
        }
        let m = ModelArch::preset("qwen3-omni-30b-a3b").unwrap();
        let t = m.audio_tokens(10.0).unwrap();
        assert_eq!(
            (t.encoder_tokens, t.llm_tokens, t.attn_span),
            (130, 130, 104)
        );
        let short = m.audio_tokens(0.5).unwrap();
        assert_eq!((short.llm_tokens, short.attn_span), (7, 7));
        assert!(m.audio_tokens(0.005).is_err());
        assert!(m.image_tokens(448, 448).is_err());
    }
}
