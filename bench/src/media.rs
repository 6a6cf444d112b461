//! Real media files of the shapes a workload asks for: PNG or JPEG images,
//! frame lists for video, 16-bit PCM WAV for audio, each as the content part
//! of an OpenAI chat message.
//!
//! The pixels and samples are seeded noise (one RNG stream per request), so
//! an encoder sees content that does not compress away and the same seed
//! gives the same bytes.

use base64::Engine as _;
use easerve_sched::MmItem;
use image::{ImageFormat, RgbImage};
use rand::{Rng, RngCore};
use serde_json::{json, Value};
use std::io::Cursor;

/// Encoding of the images (and video frames) sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageCodec {
    /// Lossless PNG.
    Png,
    /// Baseline JPEG at quality 75 (PIL's default, which `vllm bench serve`'s
    /// random-mm dataset encodes with).
    Jpeg,
}

impl ImageCodec {
    /// The MIME type in the data URL.
    pub fn mime(self) -> &'static str {
        match self {
            ImageCodec::Png => "image/png",
            ImageCodec::Jpeg => "image/jpeg",
        }
    }
}

/// Audio sample rate of the WAV files, Hz (Whisper's input rate).
pub const AUDIO_SAMPLE_RATE: u32 = 16_000;

/// Largest image side the generator encodes, pixels (what `image` handles
/// without trouble; larger requests are a mistake in the workload).
pub const MAX_SIDE: u32 = 16_384;

/// Most frames of one video the generator encodes.
pub const MAX_FRAMES: u32 = 10_000;

/// Longest audio clip the generator encodes, seconds.
pub const MAX_AUDIO_S: f64 = 3600.0;

/// Whether the generator can encode `item`; else what is wrong with it.
///
/// # Errors
/// A side of 0 or above [`MAX_SIDE`], more than [`MAX_FRAMES`] frames, or a
/// clip that is not in (0, [`MAX_AUDIO_S`]] seconds.
pub fn check_item(item: &MmItem) -> Result<(), String> {
    let side = |h: u32, w: u32| {
        if h == 0 || w == 0 || h > MAX_SIDE || w > MAX_SIDE {
            Err(format!(
                "image {h}×{w}: sides must be in 1..={MAX_SIDE} pixels"
            ))
        } else {
            Ok(())
        }
    };
    match *item {
        MmItem::Image { height, width } => side(height, width),
        MmItem::Video {
            frames,
            height,
            width,
        } => {
            if frames == 0 || frames > MAX_FRAMES {
                return Err(format!(
                    "video of {frames} frames: allowed 1..={MAX_FRAMES}"
                ));
            }
            side(height, width)
        }
        MmItem::Audio { seconds } => {
            if seconds.is_finite() && seconds > 0.0 && seconds <= MAX_AUDIO_S {
                Ok(())
            } else {
                Err(format!(
                    "audio of {seconds} s: allowed (0, {MAX_AUDIO_S}] seconds"
                ))
            }
        }
    }
}

/// An encoded image of `height × width` seeded noise.
///
/// # Errors
/// A side of 0 or above [`MAX_SIDE`], or an encoder failure.
pub fn image_bytes<R: RngCore>(
    rng: &mut R,
    height: u32,
    width: u32,
    codec: ImageCodec,
) -> Result<Vec<u8>, String> {
    check_item(&MmItem::Image { height, width })?;
    let mut pixels = vec![0u8; height as usize * width as usize * 3];
    rng.fill_bytes(&mut pixels);
    let img = RgbImage::from_raw(width, height, pixels).ok_or("image buffer size")?;
    let mut out = Cursor::new(Vec::new());
    match codec {
        ImageCodec::Png => img.write_to(&mut out, ImageFormat::Png),
        ImageCodec::Jpeg => {
            let enc = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 75);
            img.write_with_encoder(enc)
        }
    }
    .map_err(|e| format!("encoding a {height}×{width} image: {e}"))?;
    Ok(out.into_inner())
}

/// A mono 16-bit PCM WAV of `seconds` of seeded noise at [`AUDIO_SAMPLE_RATE`].
///
/// # Errors
/// A duration that is not finite and positive, or above an hour.
pub fn wav_bytes<R: RngCore>(rng: &mut R, seconds: f64) -> Result<Vec<u8>, String> {
    check_item(&MmItem::Audio { seconds })?;
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: AUDIO_SAMPLE_RATE,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut out = Cursor::new(Vec::new());
    let mut w = hound::WavWriter::new(&mut out, spec).map_err(|e| e.to_string())?;
    let n = (seconds * f64::from(AUDIO_SAMPLE_RATE)).round() as u64;
    for _ in 0..n {
        // quiet noise, a tenth of full scale
        w.write_sample(rng.gen_range(-3277i16..=3277))
            .map_err(|e| e.to_string())?;
    }
    w.finalize().map_err(|e| e.to_string())?;
    Ok(out.into_inner())
}

fn data_url(mime: &str, bytes: &[u8]) -> String {
    format!(
        "data:{mime};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// The chat content part of one item:
/// * an image: `{"type": "image_url", "image_url": {"url": "data:image/png;base64,…"}}`
///   (OpenAI's image part);
/// * audio: `{"type": "input_audio", "input_audio": {"data": "…", "format": "wav"}}`
///   (OpenAI's audio part);
/// * video: `{"type": "video_url", "video_url": {"url": "data:video/jpeg;base64,F1,F2,…"}}`,
///   the sampled frames as JPEGs, base64 each, joined by commas: vLLM's form
///   of a video given as frames (`vllm/multimodal/media/video.py`, vLLM
///   0.33.0, media type `video/jpeg`); the OpenAI API has no video part.
///
/// # Errors
/// As [`image_bytes`] and [`wav_bytes`].
pub fn content_part<R: RngCore>(
    rng: &mut R,
    item: &MmItem,
    codec: ImageCodec,
) -> Result<Value, String> {
    Ok(match *item {
        MmItem::Image { height, width } => json!({
            "type": "image_url",
            "image_url": { "url": data_url(codec.mime(), &image_bytes(rng, height, width, codec)?) },
        }),
        MmItem::Audio { seconds } => json!({
            "type": "input_audio",
            "input_audio": {
                "data": base64::engine::general_purpose::STANDARD.encode(wav_bytes(rng, seconds)?),
                "format": "wav",
            },
        }),
        MmItem::Video {
            frames,
            height,
            width,
        } => {
            let b64 = &base64::engine::general_purpose::STANDARD;
            let frames: Result<Vec<String>, String> = (0..frames)
                .map(|_| Ok(b64.encode(image_bytes(rng, height, width, ImageCodec::Jpeg)?)))
                .collect();
            json!({
                "type": "video_url",
                "video_url": { "url": format!("data:video/jpeg;base64,{}", frames?.join(",")) },
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn images_decode_to_the_requested_shape_in_both_codecs() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        for codec in [ImageCodec::Png, ImageCodec::Jpeg] {
            let bytes = image_bytes(&mut rng, 37, 91, codec).unwrap();
            let img = image::load_from_memory(&bytes).unwrap();
            assert_eq!((img.height(), img.width()), (37, 91), "{codec:?}");
        }
        assert!(image_bytes(&mut rng, 0, 4, ImageCodec::Png).is_err());
    }

    #[test]
    fn wav_has_the_requested_duration_and_the_same_seed_the_same_bytes() {
        let one = wav_bytes(&mut rand_chacha::ChaCha8Rng::seed_from_u64(3), 1.5).unwrap();
        let two = wav_bytes(&mut rand_chacha::ChaCha8Rng::seed_from_u64(3), 1.5).unwrap();
        assert_eq!(one, two);
        let r = hound::WavReader::new(Cursor::new(one)).unwrap();
        assert_eq!(r.spec().sample_rate, AUDIO_SAMPLE_RATE);
        assert_eq!(r.duration(), 24_000);
        assert!(wav_bytes(&mut rand_chacha::ChaCha8Rng::seed_from_u64(3), -1.0).is_err());
    }
}
