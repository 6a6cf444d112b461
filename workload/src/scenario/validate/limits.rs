//! The `[limits]` section: positive bounds on what one request may ask for.

use super::V;
use crate::scenario::{ScenarioError, ScenarioFile};
use easerve_sched::Limits;

/// The request limits of `raw` (`easerve_sched::Limits`; vLLM's defaults for
/// what it leaves out).
pub(super) fn limits_section(raw: &ScenarioFile, v: &V<'_>) -> Result<Limits, ScenarioError> {
    let l = &raw.limits;
    let int = |field: &str, x: Option<i64>, max: i64| -> Result<Option<u64>, ScenarioError> {
        x.map(|x| {
            v.int(&format!("limits.{field}"), x, 1, max)
                .map(|x| x as u64)
        })
        .transpose()
    };
    let mut mm_per_prompt = Limits::default().mm_per_prompt;
    for (name, &n) in l.limit_mm_per_prompt.iter().flatten() {
        let k = match name.as_str() {
            "image" => 0,
            "video" => 1,
            "audio" => 2,
            other => {
                return Err(v.err(
                    "limits.limit_mm_per_prompt",
                    format!("`{other}` is not a modality: use image, video or audio"),
                ))
            }
        };
        // 0 turns a modality off, as in vLLM
        mm_per_prompt[k] = v.int(
            &format!("limits.limit_mm_per_prompt.{name}"),
            n,
            0,
            1_000_000,
        )? as u32;
    }
    Ok(Limits {
        max_model_len: int("max_model_len", l.max_model_len, 1 << 40)?,
        max_prefill_tokens: int("max_prefill_tokens", l.max_prefill_tokens, 1 << 40)?,
        mm_per_prompt,
        max_image_pixels: int("max_image_pixels", l.max_image_pixels, 1 << 40)?,
        max_video_frames: int("max_video_frames", l.max_video_frames, 1 << 20)?.map(|x| x as u32),
        max_audio_seconds: l
            .max_audio_seconds
            .map(|x| v.real("limits.max_audio_seconds", x, 0.0, 1e7, true))
            .transpose()?,
        max_media_bytes: int("max_media_bytes", l.max_media_bytes, 1 << 50)?,
    })
}
