//! `easerve model import`: a model file from a checkpoint's config, run in a
//! scenario like the preset it reproduces; keys it cannot map exit 2.

use crate::{easerve, root, sim_json};

fn fixture(preset: &str, file: &str) -> String {
    root()
        .join("model/tests/hf-configs")
        .join(preset)
        .join(file)
        .display()
        .to_string()
}

/// The imported Qwen3-VL-30B-A3B in `scenarios/moe-video.toml` gives the
/// preset's report, number for number.
#[test]
fn an_imported_model_runs_as_its_preset_does() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("qwen3-vl-30b-a3b.toml");
    let p = "qwen3-vl-30b-a3b";
    let out = easerve(&[
        "model",
        "import",
        &fixture(p, "config.json"),
        "--preprocessor",
        &fixture(p, "preprocessor_config.json"),
        "--video-preprocessor",
        &fixture(p, "video_preprocessor_config.json"),
        "-o",
        model.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("128 experts top 8"), "{said}");
    let text = std::fs::read_to_string(&model).unwrap();
    assert!(
        text.contains("expert_ffn = 768  # config.json `text_config.moe_intermediate_size`"),
        "{text}"
    );
    // the file names the model after its output file (no _name_or_path here)
    assert!(text.contains("name = \"qwen3-vl-30b-a3b\""), "{text}");

    let original = std::fs::read_to_string(root().join("scenarios/moe-video.toml")).unwrap();
    let custom = original.replace(
        "preset = \"qwen3-vl-30b-a3b\"",
        &format!("file = \"{}\"", model.display()),
    );
    assert_ne!(custom, original);
    let scenario = dir.path().join("moe-video.toml");
    std::fs::write(&scenario, custom).unwrap();
    let args = ["--requests", "60"];
    let a = sim_json(&root().join("scenarios/moe-video.toml"), &args);
    let b = sim_json(&scenario, &args);
    for key in [
        "request_throughput",
        "duration_s",
        "ttft",
        "tpot",
        "e2e",
        "encode",
        "stages",
    ] {
        assert!(!a[key].is_null(), "{key}");
        assert_eq!(a[key], b[key], "{key}");
    }
    assert_eq!(a["model"], b["model"]);
}

#[test]
fn keys_it_cannot_map_exit_2_naming_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let p = "llama-4-scout-17b-16e";
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(p, "config.json")).unwrap()).unwrap();
    cfg["text_config"]["interleave_moe_layer_step"] = serde_json::json!(2);
    let bad = dir.path().join("config.json");
    std::fs::write(&bad, cfg.to_string()).unwrap();
    let out_file = dir.path().join("m.toml");
    for (args, needles) in [
        (
            vec![bad.to_str().unwrap()],
            vec![
                "config.json",
                "text_config.interleave_moe_layer_step",
                "allowed: 1",
            ],
        ),
        (
            vec!["/no/such/config.json"],
            vec!["CONFIG /no/such/config.json", "cannot read"],
        ),
    ] {
        let mut all = vec!["model", "import"];
        all.extend(args);
        all.extend(["-o", out_file.to_str().unwrap()]);
        let out = easerve(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        for n in needles {
            assert!(err.contains(n), "lacks {n:?}: {err}");
        }
        assert!(!out_file.exists(), "wrote a file for bad input");
    }
}
