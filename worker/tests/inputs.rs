//! Real-input preprocessing: the sample files in `scenarios/samples` decode to the
//! token counts the model's token rules give, and encode to that many embeddings.

use std::path::PathBuf;

use burn::backend::NdArray;
use easerve_exec::input::{prepare, InputError, Media};
use easerve_model::nn::MultimodalModel;
use easerve_model::ModelArch;

fn sample(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios/samples")
        .join(name)
}

/// Prepare `file` for `model`, encode it, and return (encoder tokens, LLM tokens,
/// embedding rows).
fn encode_file(model: &str, file: &str) -> (u64, u64, usize) {
    let arch = ModelArch::preset(model).unwrap();
    let media = Media::open(&sample(file)).unwrap();
    let p = prepare(&arch, &media).unwrap();
    let device = Default::default();
    let m = MultimodalModel::<NdArray>::from_arch(&arch, &device).unwrap();
    let out = m
        .encode(&[easerve_worker::items::to_device::<NdArray>(
            &p.item, &device,
        )])
        .unwrap();
    (
        p.tokens.encoder_tokens,
        p.tokens.llm_tokens,
        out[0].dims()[0],
    )
}

#[test]
fn png_and_jpeg_test_pattern_give_the_anyres_token_counts() {
    // 240x320 (h x w): best pinpoint 224x224 -> 2x2 grid + base = 5 tiles of 65;
    // unpadded 16x16 map cropped to 12 rows: 64 + 12*16 + 12 = 268 LLM tokens.
    for file in ["test-pattern.png", "test-pattern.jpg"] {
        let (enc, llm, rows) = encode_file("tiny-image", file);
        assert_eq!((enc, llm), (325, 268), "{file}");
        assert_eq!(rows, 268, "{file}");
    }
    let arch = ModelArch::preset("tiny-image").unwrap();
    assert_eq!(arch.image_tokens(240, 320).unwrap().llm_tokens, 268);
}

#[test]
fn wav_speech_gives_whisper_token_counts() {
    // 60428 samples at 16 kHz = 3.777 s: one 5-s window of 250 frames;
    // ceil(3.777 * 50 / 8) = 24 LLM tokens.
    let (enc, llm, rows) = encode_file("tiny-audio", "speech.wav");
    assert_eq!((enc, llm, rows), (250, 24, 24));
}

#[test]
fn frame_folder_gives_qwen_video_token_counts() {
    // 4 frames of 112x112: 2 temporal patches of 8x8 patches = 128 encoder tokens,
    // merged 2x2 -> 32 LLM tokens.
    let (enc, llm, rows) = encode_file("tiny-video", "clip");
    assert_eq!((enc, llm, rows), (128, 32, 32));
    // A single image through the same tower: 252x308 exceeds the 50176-px cap, so
    // smart_resize scales by sqrt(76800/50176) and floors to 168x252 -> 12x18 patches,
    // 54 LLM tokens.
    let (enc, llm, rows) = encode_file("tiny-video", "test-pattern.png");
    assert_eq!((enc, llm, rows), (216, 54, 54));
}

#[test]
fn synthetic_media_has_the_workload_shape() {
    let arch = ModelArch::preset("tiny-video").unwrap();
    let item = easerve_sched::MmItem::Video {
        frames: 8,
        height: 112,
        width: 112,
    };
    let a = prepare(&arch, &Media::synthetic(&item, 3)).unwrap();
    assert_eq!(a.tokens, arch.video_tokens(8, 112, 112).unwrap());
    let audio = easerve_sched::MmItem::Audio { seconds: 4.0 };
    let m = Media::synthetic(&audio, 1);
    let p = prepare(&ModelArch::preset("tiny-audio").unwrap(), &m).unwrap();
    assert_eq!((p.tokens.encoder_tokens, p.tokens.llm_tokens), (250, 25));
}

#[test]
fn wrong_modality_and_missing_files_are_clear_errors() {
    let arch = ModelArch::preset("tiny-image").unwrap();
    let tone = Media::open(&sample("tone-440hz-2s.wav")).unwrap();
    let e = prepare(&arch, &tone).unwrap_err().to_string();
    assert_eq!(e, "model tiny-image cannot encode audio");
    match Media::open(&sample("missing.png")) {
        Err(InputError::File { path, .. }) => assert!(path.ends_with("missing.png")),
        other => panic!("{other:?}"),
    }
    let e = Media::open(&sample("README.md")).unwrap_err().to_string();
    assert!(e.contains("unknown input kind"), "{e}");
}
