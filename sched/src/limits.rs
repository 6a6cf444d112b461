//! What one request may ask for. A request over any limit is refused at
//! arrival, before any work starts: the server answers it with a 400 that
//! names the limit and its value, and the controller refuses the same request
//! with the same reason ([`crate::Decision::Refuse`]), so the simulator, the
//! executor and the server agree on which requests are turned away.
//!
//! Defaults follow vLLM where it has one: `--limit-mm-per-prompt` is 999 items
//! per modality in vLLM's V1 engine (`MultiModalConfig.limit_per_prompt`,
//! vllm/config/multimodal.py, v0.11). The others are off unless the scenario
//! or the server sets them; the server derives `max_model_len` from its
//! decode workers' KV caches and, on the CPU, the most tokens one prefill
//! pass may take from its workers' memory (`easerve_exec::limits`).

use crate::request::{MmItem, Modality, Request};
use serde::{Deserialize, Serialize};

/// vLLM V1's default `--limit-mm-per-prompt`, items per modality.
pub const VLLM_MM_PER_PROMPT: u32 = 999;

/// Bytes of decoded media an item holds: 3 bytes per RGB pixel of an image or
/// of each video frame, 4 bytes per f32 sample of audio at 16 kHz (Whisper's
/// rate, which every audio encoder here takes).
pub fn decoded_bytes(item: &MmItem) -> u64 {
    match *item {
        MmItem::Image { height, width } => 3 * u64::from(height) * u64::from(width),
        MmItem::Video {
            frames,
            height,
            width,
        } => 3 * u64::from(frames) * u64::from(height) * u64::from(width),
        MmItem::Audio { seconds } => (seconds.max(0.0) * 16_000.0).ceil() as u64 * 4,
    }
}

/// The limits one request is checked against. `None`: no limit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// Most tokens one request may hold, prompt (text and multimodal) plus
    /// completion: vLLM's `max_model_len`.
    pub max_model_len: Option<u64>,
    /// Most prompt tokens (text and multimodal) one prefill pass may take
    /// whole; a deployment that chunks its prefills is not bound by it.
    pub max_prefill_tokens: Option<u64>,
    /// Most items per request, per modality (image, video, audio).
    pub mm_per_prompt: [u32; 3],
    /// Most pixels of one image, decoded, before any resizing.
    pub max_image_pixels: Option<u64>,
    /// Most frames of one video.
    pub max_video_frames: Option<u32>,
    /// Most seconds of one audio clip.
    pub max_audio_seconds: Option<f64>,
    /// Most bytes of decoded media per request ([`decoded_bytes`]).
    pub max_media_bytes: Option<u64>,
}

impl Default for Limits {
    /// vLLM's defaults: 999 items per modality, nothing else bounded.
    fn default() -> Self {
        Limits {
            max_model_len: None,
            max_prefill_tokens: None,
            mm_per_prompt: [VLLM_MM_PER_PROMPT; 3],
            max_image_pixels: None,
            max_video_frames: None,
            max_audio_seconds: None,
            max_media_bytes: None,
        }
    }
}

/// Why a request was refused: the limit it is over, its value and the
/// request's figure. The message is what the server's 400 says.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LimitExceeded {
    /// More items of one modality than `mm_per_prompt` allows.
    #[error("At most {limit} {modality}(s) may be provided in one request, but {count} were given (limit_mm_per_prompt)")]
    Items {
        /// `image`, `video` or `audio`.
        modality: &'static str,
        /// Items of that modality in the request.
        count: usize,
        /// The limit.
        limit: u32,
    },
    /// An image larger than `max_image_pixels`.
    #[error("image {index} has {pixels} pixels; at most {limit} are allowed (max_image_pixels)")]
    ImagePixels {
        /// The item's index in the request.
        index: usize,
        /// Its pixels.
        pixels: u64,
        /// The limit.
        limit: u64,
    },
    /// A video longer than `max_video_frames`.
    #[error("video {index} has {frames} frames; at most {limit} are allowed (max_video_frames)")]
    VideoFrames {
        /// The item's index in the request.
        index: usize,
        /// Its frames.
        frames: u32,
        /// The limit.
        limit: u32,
    },
    /// An audio clip longer than `max_audio_seconds`.
    #[error(
        "audio {index} lasts {seconds:.1} s; at most {limit} s are allowed (max_audio_seconds)"
    )]
    AudioSeconds {
        /// The item's index in the request.
        index: usize,
        /// Its duration, seconds.
        seconds: f64,
        /// The limit, seconds.
        limit: f64,
    },
    /// More decoded media than `max_media_bytes`.
    #[error("the request's media decode to {bytes} bytes; at most {limit} are allowed (max_media_bytes)")]
    MediaBytes {
        /// Decoded bytes of all its items.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// More tokens than `max_model_len` (vLLM's wording).
    #[error("This model's maximum context length is {limit} tokens. However, you requested {total} tokens ({prompt} in the messages, {completion} in the completion). Please reduce the length of the messages or completion.")]
    ModelLen {
        /// Prompt plus completion tokens.
        total: u64,
        /// Prompt tokens (text and multimodal).
        prompt: u64,
        /// Completion tokens.
        completion: u64,
        /// The limit.
        limit: u64,
    },
    /// A prompt longer than one prefill pass may take.
    #[error("the prompt has {prompt} tokens (text and media); one prefill pass takes at most {limit} (max_prefill_tokens); send fewer or smaller media")]
    PrefillTokens {
        /// Prompt tokens (text and multimodal).
        prompt: u64,
        /// The limit.
        limit: u64,
    },
}

/// Which limit a request is over: what a request's record and a report
/// count refusals by (the decision log and the server's 400 have the whole
/// message, [`LimitExceeded`]). One byte, so a record holds it for free.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// `limit_mm_per_prompt`.
    LimitMmPerPrompt,
    /// `max_image_pixels`.
    MaxImagePixels,
    /// `max_video_frames`.
    MaxVideoFrames,
    /// `max_audio_seconds`.
    MaxAudioSeconds,
    /// `max_media_bytes`.
    MaxMediaBytes,
    /// `max_model_len`.
    MaxModelLen,
    /// `max_prefill_tokens`.
    MaxPrefillTokens,
}

impl LimitKind {
    /// The limit's field name, e.g. `max_prefill_tokens`.
    pub fn name(self) -> &'static str {
        match self {
            LimitKind::LimitMmPerPrompt => "limit_mm_per_prompt",
            LimitKind::MaxImagePixels => "max_image_pixels",
            LimitKind::MaxVideoFrames => "max_video_frames",
            LimitKind::MaxAudioSeconds => "max_audio_seconds",
            LimitKind::MaxMediaBytes => "max_media_bytes",
            LimitKind::MaxModelLen => "max_model_len",
            LimitKind::MaxPrefillTokens => "max_prefill_tokens",
        }
    }
}

impl LimitExceeded {
    /// Which limit this is.
    pub fn kind(&self) -> LimitKind {
        match self {
            LimitExceeded::Items { .. } => LimitKind::LimitMmPerPrompt,
            LimitExceeded::ImagePixels { .. } => LimitKind::MaxImagePixels,
            LimitExceeded::VideoFrames { .. } => LimitKind::MaxVideoFrames,
            LimitExceeded::AudioSeconds { .. } => LimitKind::MaxAudioSeconds,
            LimitExceeded::MediaBytes { .. } => LimitKind::MaxMediaBytes,
            LimitExceeded::ModelLen { .. } => LimitKind::MaxModelLen,
            LimitExceeded::PrefillTokens { .. } => LimitKind::MaxPrefillTokens,
        }
    }
}

/// Items of each modality (image, video, audio) among `modalities`; text
/// counts for none.
fn count_by_modality(modalities: impl Iterator<Item = Modality>) -> [usize; 3] {
    let mut count = [0usize; 3];
    for m in modalities {
        if let Some(k) = MODALITIES.iter().position(|(x, _)| *x == m) {
            count[k] += 1;
        }
    }
    count
}

const MODALITIES: [(Modality, &str); 3] = [
    (Modality::Image, "image"),
    (Modality::Video, "video"),
    (Modality::Audio, "audio"),
];

impl Limits {
    /// Check the item counts of `items`: the first check, which the server
    /// makes before it decodes any media.
    ///
    /// Errors: [`LimitExceeded::Items`].
    pub fn check_counts(&self, modalities: &[Modality]) -> Result<(), LimitExceeded> {
        self.counts_within(count_by_modality(modalities.iter().copied()))
    }

    /// Whether `count` items of each modality (image, video, audio) are
    /// within `mm_per_prompt`.
    fn counts_within(&self, count: [usize; 3]) -> Result<(), LimitExceeded> {
        for (k, (_, name)) in MODALITIES.iter().enumerate() {
            if count[k] > self.mm_per_prompt[k] as usize {
                return Err(LimitExceeded::Items {
                    modality: name,
                    count: count[k],
                    limit: self.mm_per_prompt[k],
                });
            }
        }
        Ok(())
    }

    /// Check one request against every limit, in the order the server
    /// meets them: item counts, each item's size, the decoded bytes, the
    /// context length, then the prefill pass.
    ///
    /// Errors: the first limit `req` is over.
    pub fn check(&self, req: &Request) -> Result<(), LimitExceeded> {
        if !req.items.is_empty() {
            self.counts_within(count_by_modality(req.items.iter().map(MmItem::modality)))?;
        }
        for (index, item) in req.items.iter().enumerate() {
            self.check_item(index, item)?;
        }
        if let Some(limit) = self.max_media_bytes {
            let bytes: u64 = req.items.iter().map(decoded_bytes).sum();
            if bytes > limit {
                return Err(LimitExceeded::MediaBytes { bytes, limit });
            }
        }
        self.check_tokens(req.prefill_tokens(), u64::from(req.output_tokens))
    }

    /// Check item `index`'s size.
    ///
    /// Errors: [`LimitExceeded::ImagePixels`], [`LimitExceeded::VideoFrames`],
    /// [`LimitExceeded::AudioSeconds`].
    pub fn check_item(&self, index: usize, item: &MmItem) -> Result<(), LimitExceeded> {
        match *item {
            MmItem::Image { height, width } => match self.max_image_pixels {
                Some(limit) if u64::from(height) * u64::from(width) > limit => {
                    Err(LimitExceeded::ImagePixels {
                        index,
                        pixels: u64::from(height) * u64::from(width),
                        limit,
                    })
                }
                _ => Ok(()),
            },
            MmItem::Video { frames, .. } => match self.max_video_frames {
                Some(limit) if frames > limit => Err(LimitExceeded::VideoFrames {
                    index,
                    frames,
                    limit,
                }),
                _ => Ok(()),
            },
            MmItem::Audio { seconds } => match self.max_audio_seconds {
                Some(limit) if seconds > limit => Err(LimitExceeded::AudioSeconds {
                    index,
                    seconds,
                    limit,
                }),
                _ => Ok(()),
            },
        }
    }

    /// Check a request of `prompt` tokens (text and multimodal) asking for
    /// `completion` tokens.
    ///
    /// Errors: [`LimitExceeded::ModelLen`], [`LimitExceeded::PrefillTokens`].
    pub fn check_tokens(&self, prompt: u64, completion: u64) -> Result<(), LimitExceeded> {
        if let Some(limit) = self.max_model_len {
            let total = prompt + completion;
            if total > limit {
                return Err(LimitExceeded::ModelLen {
                    total,
                    prompt,
                    completion,
                    limit,
                });
            }
        }
        match self.max_prefill_tokens {
            Some(limit) if prompt > limit => Err(LimitExceeded::PrefillTokens { prompt, limit }),
            _ => Ok(()),
        }
    }

    /// These limits tightened by `other`'s: each the smaller of the two.
    pub fn tightened(&self, other: &Limits) -> Limits {
        fn min<T: PartialOrd + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(x), Some(y)) => Some(if y < x { y } else { x }),
                (x, None) => x,
                (None, y) => y,
            }
        }
        Limits {
            max_model_len: min(self.max_model_len, other.max_model_len),
            max_prefill_tokens: min(self.max_prefill_tokens, other.max_prefill_tokens),
            mm_per_prompt: std::array::from_fn(|k| {
                self.mm_per_prompt[k].min(other.mm_per_prompt[k])
            }),
            max_image_pixels: min(self.max_image_pixels, other.max_image_pixels),
            max_video_frames: min(self.max_video_frames, other.max_video_frames),
            max_audio_seconds: min(self.max_audio_seconds, other.max_audio_seconds),
            max_media_bytes: min(self.max_media_bytes, other.max_media_bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(items: Vec<MmItem>, prompt: u32, mm: u64, out: u32) -> Request {
        Request {
            id: 0,
            arrival: 0.0,
            items: items.into(),
            prompt_tokens: prompt,
            output_tokens: out,
            encoder_tokens: 0,
            mm_tokens: mm,
            content: None,
        }
    }

    fn image() -> MmItem {
        MmItem::Image {
            height: 64,
            width: 64,
        }
    }

    #[test]
    fn the_defaults_are_vllms_and_refuse_the_thousandth_image() {
        let l = Limits::default();
        assert!(l.check(&request(vec![image(); 999], 10, 0, 10)).is_ok());
        let e = l
            .check(&request(vec![image(); 1000], 10, 0, 10))
            .unwrap_err();
        assert_eq!(
            e,
            LimitExceeded::Items {
                modality: "image",
                count: 1000,
                limit: 999
            }
        );
        assert!(e.to_string().contains("limit_mm_per_prompt"), "{e}");
    }

    #[test]
    fn each_limit_names_itself_and_its_value() {
        let l = Limits {
            max_model_len: Some(100),
            max_prefill_tokens: Some(50),
            mm_per_prompt: [2, 1, 1],
            max_image_pixels: Some(64 * 64),
            max_video_frames: Some(8),
            max_audio_seconds: Some(30.0),
            max_media_bytes: Some(2 * 64 * 64 * 3),
        };
        let big = MmItem::Image {
            height: 65,
            width: 64,
        };
        let video = MmItem::Video {
            frames: 9,
            height: 8,
            width: 8,
        };
        let audio = MmItem::Audio { seconds: 31.0 };
        let cases = [
            (request(vec![image(); 3], 1, 0, 1), "limit_mm_per_prompt"),
            (request(vec![big], 1, 0, 1), "max_image_pixels"),
            (request(vec![video], 1, 0, 1), "max_video_frames"),
            (request(vec![audio], 1, 0, 1), "max_audio_seconds"),
            (request(vec![], 60, 0, 41), "maximum context length is 100"),
            (request(vec![], 51, 0, 1), "max_prefill_tokens"),
        ];
        for (r, want) in cases {
            let e = l.check(&r).unwrap_err().to_string();
            assert!(e.contains(want), "{e} should name {want}");
        }
        assert!(l.check(&request(vec![image(); 2], 10, 40, 50)).is_ok());
        let mut bytes = l.clone();
        bytes.max_media_bytes = Some(64 * 64 * 3);
        let e = bytes
            .check(&request(vec![image(); 2], 1, 0, 1))
            .unwrap_err();
        assert!(e.to_string().contains("max_media_bytes"), "{e}");
    }

    #[test]
    fn tightening_takes_the_smaller_of_each() {
        let a = Limits {
            max_model_len: Some(100),
            max_prefill_tokens: None,
            ..Limits::default()
        };
        let b = Limits {
            max_model_len: Some(200),
            max_prefill_tokens: Some(10),
            mm_per_prompt: [5, 999, 999],
            ..Limits::default()
        };
        let t = a.tightened(&b);
        assert_eq!(t.max_model_len, Some(100));
        assert_eq!(t.max_prefill_tokens, Some(10));
        assert_eq!(t.mm_per_prompt, [5, 999, 999]);
    }
}
