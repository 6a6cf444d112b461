//! Bad input is rejected before anything runs: exit code 2 and a message that
//! names the file, the field and what is allowed; never a panic.

use crate::{easerve, root};
use std::io::Write;

fn video_with(edit: impl Fn(String) -> String) -> tempfile::NamedTempFile {
    let base = std::fs::read_to_string(root().join("scenarios/video.toml")).unwrap();
    let text = edit(base);
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

/// Run `easerve sim FILE ARGS` and check exit 2 and that stderr contains every needle.
fn rejects(file: &std::path::Path, args: &[&str], needles: &[&str]) {
    let path = file.to_str().unwrap();
    let mut all = vec!["sim", path];
    all.extend_from_slice(args);
    let out = easerve(&all);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "expected exit 2 for {args:?}; stderr: {err}"
    );
    assert!(out.stdout.is_empty(), "printed a report for bad input");
    assert!(!err.contains("panicked"), "panic: {err}");
    assert!(err.contains(path), "message does not name the file: {err}");
    for n in needles {
        assert!(err.contains(n), "message lacks {n:?}: {err}");
    }
}

#[test]
fn unknown_field() {
    let f = video_with(|s| s.replace("batch = 8", "batch = 8\nbatch_size = 8"));
    rejects(f.path(), &[], &["deployment.batch_size", "unknown field"]);
}

#[test]
fn wrong_type() {
    let f = video_with(|s| s.replace("batch = 8", "batch = \"eight\""));
    rejects(f.path(), &[], &["deployment.batch", "integer"]);
}

#[test]
fn zero_batch_bound() {
    let f = video_with(|s| s.replace("batch = 8", "batch = 0"));
    rejects(f.path(), &[], &["deployment.batch", "allowed 1"]);
}

#[test]
fn offload_outside_unit_interval() {
    let f = video_with(|s| s.replace("offload = 1.0", "offload = 1.5"));
    rejects(f.path(), &[], &["deployment.offload", "[0, 1]"]);
    let f = video_with(|s| s.to_string());
    rejects(
        f.path(),
        &["--offload", "-0.1"],
        &["deployment.offload", "[0, 1]"],
    );
}

#[test]
fn allocation_needing_more_gpus_than_the_cluster_has() {
    let f = video_with(|s| s.replace("2E(TP1)+1P(TP2)+1D(TP4)", "4E(TP1)+1P(TP2)+1D(TP4)"));
    rejects(
        f.path(),
        &[],
        &["deployment.allocation", "needs 10 GPUs", "cluster has 8"],
    );
}

#[test]
fn tp_degree_at_which_the_weights_do_not_fit() {
    let f = video_with(|s| s.replace("2E(TP1)+1P(TP2)+1D(TP4)", "2E(TP1)+1P(TP1)+1D(TP4)"));
    rejects(
        f.path(),
        &[],
        &["deployment.allocation", "prefill at TP1", "larger TP"],
    );
}

#[test]
fn tp_degree_that_does_not_split_the_attention_heads() {
    // Qwen2.5-VL-32B: 40 attention heads, 8 KV heads; `deploy` must not
    // write `--tensor-parallel-size 3` files vLLM refuses
    let f = video_with(|s| s.replace("2E(TP1)+1P(TP2)+1D(TP4)", "2E(TP1)+1P(TP3)+1D(TP3)"));
    rejects(
        f.path(),
        &[],
        &[
            "deployment.allocation",
            "prefill at TP3 does not split qwen2.5-vl-32b's 40 attention heads and 8 KV heads",
            "allowed TP up to the cluster's 8 GPUs: [1, 2, 4, 8]",
        ],
    );
    // an aggregated replica's TP too (Qwen2.5-VL-7B: 28 heads, 4 KV heads)
    let out = easerve(&[
        "sim",
        "scenarios/custom-video.toml",
        "--system",
        "aggregated",
        "--set",
        "cluster.gpus=16",
        "--set",
        "deployment.aggregated_tp=8",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("deployment.aggregated_tp")
            && err.contains("a replica at TP8 does not split qwen2.5-vl-7b's 28 attention heads"),
        "{err}"
    );
    let emit = tempfile::tempdir().unwrap();
    let files = emit.path().join("files");
    let out = easerve(&[
        "deploy",
        "scenarios/video.toml",
        "--deployment",
        "2E(TP1)+1P(TP2)+1D(TP3) B=8 s=1",
        "--emit",
        files.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("decode at TP3 does not split"), "{err}");
    assert!(!files.exists(), "no files written");
}

#[test]
fn a_bad_set_is_blamed_on_the_set_not_on_a_line_of_the_file() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "deployment.ofload=0.5",
            "`deployment.ofload`: unknown field `ofload`",
            "(with --set deployment.ofload=0.5 from the command line)",
        ),
        (
            "workload.pool.alpha=abc",
            "`workload.pool.alpha`: invalid type",
            "(with --set workload.pool.alpha=abc from the command line)",
        ),
        (
            "cluster.gpus=0",
            "`cluster.gpus`: 0 is out of range",
            "(with --set cluster.gpus=0 from the command line)",
        ),
    ];
    for (set, field, blame) in cases {
        let out = easerve(&["sim", "scenarios/image.toml", "--set", set]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{set}: {err}");
        assert!(err.contains(field) && err.contains(blame), "{set}: {err}");
        // the text parsed is the file rewritten with the set: no line of it
        assert!(!err.contains("(line "), "{set}: {err}");
    }
    // an array element as the set names it
    let out = easerve(&[
        "sim",
        "scenarios/two-group.toml",
        "--set",
        "cluster.groups.1.nodes=abc",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("(with --set cluster.groups.1.nodes=abc from the command line)")
            && err.contains("`cluster.groups[1].nodes`: invalid type"),
        "{err}"
    );
    // an error of the file's own, with a set beside it: the file's line
    let f = video_with(|s| s.replace("offload = 1.0", "offload = \"most\""));
    let line = std::fs::read_to_string(f.path())
        .unwrap()
        .lines()
        .position(|l| l.starts_with("offload = "))
        .unwrap()
        + 1;
    let out = easerve(&["sim", f.path().to_str().unwrap(), "--set", "seed=7"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(!err.contains("--set"), "{err}");
    assert!(
        err.contains(&format!("(line {line})")),
        "line {line}: {err}"
    );
}

#[test]
fn malformed_allocation() {
    let f = video_with(|s| s.replace("2E(TP1)+1P(TP2)+1D(TP4)", "2E(TP1)+1P(2)+1D(TP4)"));
    rejects(
        f.path(),
        &[],
        &["deployment.allocation", "expected terms like"],
    );
}

#[test]
fn unknown_preset_lists_the_allowed_ones() {
    let f = video_with(|s| s.replace("qwen2.5-vl-32b", "qwen9"));
    rejects(f.path(), &[], &["model.preset", "llava-v1.6-34b"]);
    let f = video_with(|s| s.replace("rtx-6000-ada", "gtx-480"));
    rejects(f.path(), &[], &["cluster.gpu", "h100-sxm"]);
}

#[test]
fn toml_syntax_error_names_the_line() {
    let f = video_with(|s| s.replace("rate = 2.0", "rate = = 2.0"));
    rejects(f.path(), &[], &["line"]);
}

#[test]
fn bad_command_line_values_are_blamed_on_the_flag() {
    let f = video_with(|s| s.to_string());
    rejects(
        f.path(),
        &["--rate", "-1"],
        &["--rate", "workload.rate", "command line"],
    );
    rejects(
        f.path(),
        &["--batch", "0"],
        &["--batch", "deployment.batch", "command line"],
    );
    let out = easerve(&["sim", f.path().to_str().unwrap(), "--rate", "fast"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn missing_file() {
    rejects(
        std::path::Path::new("no/such/scenario.toml"),
        &[],
        &["cannot read"],
    );
}

#[test]
fn encode_workers_at_tp_above_one() {
    let f = video_with(|s| s.replace("2E(TP1)+1P(TP2)+1D(TP4)", "1E(TP2)+1P(TP2)+1D(TP4)"));
    rejects(
        f.path(),
        &["--offload", "0.5"],
        &["deployment.allocation", "use 2E(TP1)"],
    );
}

#[test]
fn local_prefill_needs_whole_groups_of_encode_gpus() {
    // the 32B LLM needs TP2 next to its encoder: 3 encode workers cannot all be paired
    let f = video_with(|s| s.replace("2E(TP1)+1P(TP2)+1D(TP4)", "3E(TP1)+1P(TP1)+1D(TP4)"));
    rejects(
        f.path(),
        &[
            "--offload",
            "0.5",
            "--allocation",
            "3E(TP1)+1P(TP2)+1D(TP2)",
        ],
        &["deployment.offload", "multiple of 2"],
    );
}

#[test]
fn allocation_counts_that_would_overflow() {
    let f = video_with(|s| s.to_string());
    rejects(
        f.path(),
        &["--allocation", "2147483648E(TP2)+1P(TP2)+1D(TP4)"],
        &["--allocation", "1 ..= 4096"],
    );
}

#[test]
fn audio_cap_below_the_shortest_clip() {
    let base = std::fs::read_to_string(root().join("scenarios/audio.toml")).unwrap();
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    f.write_all(base.replace("max_s = 30.0", "max_s = 0.05").as_bytes())
        .unwrap();
    rejects(f.path(), &[], &["workload.audio.max_s", "[0.1, 3600]"]);
}

#[test]
fn trace_that_cannot_be_read() {
    let base = std::fs::read_to_string(root().join("scenarios/azure-conv.toml")).unwrap();
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    f.write_all(
        base.replace("AzureLLMInferenceTrace_conv.csv", "no-such-trace.csv")
            .as_bytes(),
    )
    .unwrap();
    rejects(
        f.path(),
        &[],
        &["workload.trace", "no-such-trace.csv", "cannot read"],
    );
}

#[test]
fn profile_of_another_model_or_missing() {
    let dir = tempfile::tempdir().unwrap();
    let profile = dir.path().join("llava.toml");
    let out = easerve(&[
        "calib",
        "roofline",
        "--model",
        "llava-v1.6-34b",
        "--gpu",
        "rtx-6000-ada",
        "-o",
        profile.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let f = video_with(|s| {
        s.replace(
            "seed = 42",
            &format!("seed = 42\nprofile = {:?}", profile.to_str().unwrap()),
        )
    });
    rejects(
        f.path(),
        &[],
        &["`profile`", "llava-v1.6-34b", "qwen2.5-vl-32b"],
    );
    let f = video_with(|s| s.replace("seed = 42", "seed = 42\nprofile = \"no-such-profile.toml\""));
    rejects(f.path(), &[], &["`profile`", "no-such-profile.toml"]);
}

#[test]
fn custom_model_or_gpu_with_bad_fields() {
    let dir = tempfile::tempdir().unwrap();
    let custom =
        std::fs::read_to_string(root().join("scenarios/custom/qwen2.5-vl-7b.toml")).unwrap();
    let gpu = std::fs::read_to_string(root().join("scenarios/custom/l40s.toml")).unwrap();
    let scenario = std::fs::read_to_string(root().join("scenarios/custom-video.toml")).unwrap();
    std::fs::create_dir(dir.path().join("custom")).unwrap();
    let sc = dir.path().join("s.toml");
    std::fs::write(&sc, &scenario).unwrap();
    let write = |m: &str, g: &str| {
        std::fs::write(dir.path().join("custom/qwen2.5-vl-7b.toml"), m).unwrap();
        std::fs::write(dir.path().join("custom/l40s.toml"), g).unwrap();
    };
    write(&custom.replace("kv_heads = 4", "kv_heads = 5"), &gpu);
    rejects(
        &sc,
        &[],
        &["model.file", "qwen2.5-vl-7b.toml", "llm.kv_heads"],
    );
    write(&custom.replace("layers = 28", "layers = \"many\""), &gpu);
    rejects(&sc, &[], &["model.file", "llm.layers", "integer"]);
    write(
        &custom,
        &gpu.replace("memory_gb = 48.0", "memory_gb = -1.0"),
    );
    rejects(&sc, &[], &["cluster.gpu_file", "memory_gb"]);
    write(
        &custom,
        &gpu.replace("sms = 142", "sms = 142\ncolor = \"green\""),
    );
    rejects(&sc, &[], &["cluster.gpu_file", "color"]);
}

/// Regression: a custom encoder with a zero patch size divided by zero while
/// counting tokens (found in review of the custom-model files).
#[test]
fn custom_encoder_sizes_that_would_divide_by_zero() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("custom")).unwrap();
    let custom =
        std::fs::read_to_string(root().join("scenarios/custom/qwen2.5-vl-7b.toml")).unwrap();
    let gpu = std::fs::read_to_string(root().join("scenarios/custom/l40s.toml")).unwrap();
    std::fs::write(dir.path().join("custom/l40s.toml"), gpu).unwrap();
    let sc = dir.path().join("s.toml");
    std::fs::write(
        &sc,
        std::fs::read_to_string(root().join("scenarios/custom-video.toml")).unwrap(),
    )
    .unwrap();
    for (from, to, field) in [
        ("patch = 14", "patch = 0", "QwenVit.patch"),
        (
            "spatial_merge = 2",
            "spatial_merge = 0",
            "QwenVit.spatial_merge",
        ),
        (
            "temporal_patch = 2",
            "temporal_patch = 0",
            "QwenVit.temporal_patch",
        ),
    ] {
        std::fs::write(
            dir.path().join("custom/qwen2.5-vl-7b.toml"),
            custom.replace(from, to),
        )
        .unwrap();
        rejects(&sc, &[], &["model.file", field, "≥ 1"]);
    }
}

/// A build without the executor says what to build for each command that
/// runs real models, and exits 2.
#[cfg(not(feature = "exec"))]
#[test]
fn commands_that_run_real_models_name_the_build_they_need() {
    for args in [
        &["exec", "scenarios/cpu-image.toml"][..],
        &["profile", "--model", "tiny-image"],
        &["calib", "measure-preprocess", "-o", "x.toml"],
    ] {
        let out = crate::easerve(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("built without the executor") && err.contains("--features exec"),
            "{args:?}: {err}"
        );
    }
    let help = crate::easerve(&["--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("not in this build"), "{text}");
}

fn moe_video_with(edit: impl Fn(String) -> String) -> tempfile::NamedTempFile {
    let base = std::fs::read_to_string(root().join("scenarios/moe-video.toml")).unwrap();
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    f.write_all(edit(base).as_bytes()).unwrap();
    f
}

/// Expert parallelism is checked against the model and the node: an EP that
/// does not divide the experts, a TP × EP over an 8-GPU node, EP on a dense
/// model or on encode workers, an unknown routing, a routing on a dense model.
#[test]
fn expert_parallel_layouts_that_cannot_run() {
    let f = moe_video_with(|s| s.to_string());
    rejects(
        f.path(),
        &["--allocation", "2E(TP1)+1P(TP1,EP3)+1D(TP2)"],
        &["EP3", "divide the 128 experts", "1, 2, 4, 8"],
    );
    let big = moe_video_with(|s| s.replace("gpus = 8", "gpus = 19"));
    rejects(
        big.path(),
        &["--allocation", "2E(TP1)+1P(TP1)+1D(TP4,EP4)"],
        &["TP4 × EP4 = 16 GPUs", "8-GPU node"],
    );
    rejects(
        f.path(),
        &["--allocation", "2E(TP1,EP2)+1P(TP1)+1D(TP2)"],
        &["encode workers take no expert parallelism"],
    );
    let dense = video_with(|s| s.to_string());
    rejects(
        dense.path(),
        &["--allocation", "2E(TP1)+1P(TP2)+1D(TP2,EP2)"],
        &["decode at EP2", "dense model"],
    );
    let f = moe_video_with(|s| s.replace("moe_routing = \"balanced\"", "moe_routing = \"zipf\""));
    rejects(
        f.path(),
        &[],
        &[
            "model.moe_routing",
            "balanced, power_law_1.01, power_law_1.2",
        ],
    );
    let f = video_with(|s| s.replace("[model]", "[model]\nmoe_routing = \"balanced\""));
    rejects(f.path(), &[], &["model.moe_routing", "dense model"]);
}

/// A custom MoE model whose top-k exceeds its experts, or with a zero width.
#[test]
fn custom_moe_model_with_bad_fields() {
    let dir = tempfile::tempdir().unwrap();
    let model = |moe: &str| {
        format!(
            "name = \"my-moe\"\n[llm]\nlayers = 4\nhidden = 256\nheads = 4\nkv_heads = 2\nhead_dim = 64\nffn = 512\nvocab = 1000\ndtype_bytes = 2\n[llm.moe]\n{moe}\n"
        )
    };
    for (moe, needles) in [
        (
            "experts = 4\ntop_k = 8\nexpert_ffn = 128\nrouter = 4",
            &["llm.moe.top_k", "≤ `llm.moe.experts`"][..],
        ),
        (
            "experts = 4\ntop_k = 2\nexpert_ffn = 0\nrouter = 4",
            &["llm.moe.expert_ffn", "≥ 1"][..],
        ),
        (
            "experts = 4\ntop_k = 2\nexpert_ffn = 128\nrouter = 4\nfirst_dense_layers = 4",
            &["llm.moe.first_dense_layers", "< `llm.layers`"][..],
        ),
    ] {
        std::fs::write(dir.path().join("m.toml"), model(moe)).unwrap();
        let sc = dir.path().join("s.toml");
        std::fs::write(
            &sc,
            "[model]\nfile = \"m.toml\"\n[cluster]\ngpu = \"h100-sxm\"\ngpus = 2\n\
             [deployment]\nallocation = \"1P(TP1)+1D(TP1)\"\nbatch = 1\noffload = 1.0\n\
             [workload]\nrequests = 10\nrate = 1.0\nmodality = \"text\"\ninput_len = 100\noutput_len = 10\n",
        )
        .unwrap();
        rejects(&sc, &[], needles);
    }
}

/// A dtype a GPU lacks, or one that is not a dtype.
#[test]
fn fp8_on_a_gpu_without_fp8_units_and_unknown_dtypes() {
    let f = moe_video_with(|s| {
        s.replace("h100-sxm", "a100-sxm4-80gb")
            .replace("dtype = \"bfloat16\"\nkv", "dtype = \"fp8\"\nkv")
    });
    rejects(
        f.path(),
        &[],
        &["model.dtype", "a100-sxm4-80gb has no FP8 units", "bfloat16"],
    );
    let f =
        moe_video_with(|s| s.replace("kv_cache_dtype = \"bfloat16\"", "kv_cache_dtype = \"fp4\""));
    rejects(f.path(), &[], &["model.kv_cache_dtype", "bfloat16, fp8"]);
    let f = moe_video_with(|s| s.replace("dtype = \"bfloat16\"\nkv", "dtype = \"int4\"\nkv"));
    rejects(f.path(), &[], &["model.dtype", "bfloat16, fp8, fp8_block"]);
}

/// Pan-and-scan applies to a SigLIP (Gemma 3) encoder only.
#[test]
fn pan_and_scan_on_a_model_without_siglip() {
    let f = moe_video_with(|s| s.replace("[model]", "[model]\npan_and_scan = true"));
    rejects(f.path(), &[], &["model.pan_and_scan", "not SigLIP"]);
}

/// A custom tiled-ViT or Qwen3-Omni-audio encoder whose projector does not
/// end at the LLM's width, whose `projector_params` disagree with its
/// widths, or whose tiling is empty.
#[test]
fn custom_tiled_and_omni_encoders_with_bad_fields() {
    let dir = tempfile::tempdir().unwrap();
    let model = |encoder: &str| {
        format!(
            "name = \"my-vlm\"\n[encoder]\nlayers = 2\nhidden = 64\nheads = 4\nffn = 128\ngated_mlp = false\ndtype_bytes = 2\n{encoder}\n\
             [llm]\nlayers = 2\nhidden = 256\nheads = 4\nkv_heads = 2\nhead_dim = 64\nffn = 512\nvocab = 1000\ndtype_bytes = 2\n"
        )
    };
    let tiled = |projector: &str, params: u64, tiling: &str| {
        format!(
            "projector_params = {params}\n[encoder.kind.TiledVit]\nimage_size = 448\npatch = 14\npixel_shuffle = 2\nprojector = {projector}\ntiling = {tiling}\n"
        )
    };
    let internvl = "{ InternVl = { min_tiles = 1, max_tiles = 12, thumbnail = true } }";
    for (encoder, needles) in [
        (
            tiled("[256, 128]", 256 * 128, internvl),
            &["model.file", "projector", "llm.hidden", "256"][..],
        ),
        (
            tiled("[256, 256]", 1, internvl),
            &["model.file", "encoder.projector_params", "65536"][..],
        ),
        (
            tiled("[128, 256]", 128 * 256, internvl),
            &["model.file", "projector", "must start at", "pixel_shuffle", "256"][..],
        ),
        (
            tiled("[256, 256]", 65536, internvl).replace("patch = 14", "patch = 15"),
            &["model.file", "TiledVit.image_size", "multiple of `patch`"][..],
        ),
        (
            tiled("[256, 256]", 65536, "{ Llama4 = { max_tiles = 0 } }"),
            &["model.file", "TiledVit.tiling", "max_tiles"][..],
        ),
        (
            "projector_params = 65536\n[encoder.kind.OmniAudio]\nmel_bins = 128\nchunk_frames = 0\nwindow_chunks = 8\nconv_channels = 32\nprojector = [256, 256]\n".to_string(),
            &["model.file", "OmniAudio.chunk_frames", "≥ 1"][..],
        ),
    ] {
        std::fs::write(dir.path().join("m.toml"), model(&encoder)).unwrap();
        let sc = dir.path().join("s.toml");
        std::fs::write(
            &sc,
            "[model]\nfile = \"m.toml\"\n[cluster]\ngpu = \"h100-sxm\"\ngpus = 3\n\
             [deployment]\nallocation = \"1E(TP1)+1P(TP1)+1D(TP1)\"\nbatch = 1\noffload = 1.0\n\
             [workload]\nrequests = 10\nrate = 1.0\nmodality = \"image\"\ninput_len = 100\noutput_len = 10\n",
        )
        .unwrap();
        rejects(&sc, &[], needles);
    }
}

/// Measured tables that are there but unreadable are refused (exit 2, naming
/// the field and the file), not silently replaced by the roofline: a corrupt
/// fused-MoE table under a private copy of the H100's data.
#[test]
fn a_corrupt_moe_table_exits_2_naming_the_file() {
    let src = root().join("../shared/data/aiconfigurator");
    if !src.join("data/h100_sxm").is_dir() {
        eprintln!("skipped: ../shared/data/aiconfigurator is absent");
        return;
    }
    fn copy(from: &std::path::Path, to: &std::path::Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let p = e.unwrap().path();
            let t = to.join(p.file_name().unwrap());
            if p.is_dir() {
                copy(&p, &t);
            } else {
                std::fs::copy(&p, &t).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    copy(
        &src.join("data/h100_sxm"),
        &dir.path().join("data/h100_sxm"),
    );
    std::fs::copy(src.join("h100_sxm.yaml"), dir.path().join("h100_sxm.yaml")).unwrap();
    let moe = dir
        .path()
        .join("data/h100_sxm/moe/vllm/0.24.0/moe_perf.parquet");
    assert!(moe.is_file(), "{}", moe.display());
    std::fs::write(&moe, b"PAR1 not a parquet file").unwrap();
    for cmd in [
        &["sim", "scenarios/moe-video.toml", "--requests", "10"][..],
        &["search", "scenarios/moe-video.toml", "--requests", "10"][..],
    ] {
        let out = crate::easerve_command()
            .args(cmd)
            .current_dir(root())
            .env("EASERVE_AICONFIGURATOR_DIR", dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {err}");
        assert!(out.stdout.is_empty(), "{cmd:?} printed a report");
        for n in [
            "scenarios/moe-video.toml",
            "cluster.kernels",
            "moe_perf.parquet",
            "roofline",
        ] {
            assert!(err.contains(n), "{cmd:?}: lacks {n:?}: {err}");
        }
    }
}

#[test]
fn launch_modes_engines_and_sizes_are_checked() {
    let with = |t: &str| video_with(|s| format!("{s}\n[deployment.launch]\n{t}\n"));
    rejects(
        with("encode = \"graphs\"").path(),
        &[],
        &["deployment.launch.encode", "allowed: eager, graph"],
    );
    rejects(
        with("engine = \"tgi\"").path(),
        &[],
        &["deployment.launch.engine", "allowed: vllm, sglang, easerve"],
    );
    rejects(
        with("graph_max_batch = 0").path(),
        &[],
        &["deployment.launch.graph_max_batch", "allowed 1"],
    );
    rejects(
        with("per_launch_us = -1.0").path(),
        &[],
        &["deployment.launch.per_launch_us", "[0, 10000]"],
    );
    rejects(
        with("decode = \"eager\"\ncuda_graphs = true").path(),
        &[],
        &["cuda_graphs", "unknown field"],
    );
}

#[test]
fn unknown_preprocessing_mode_and_threads_without_a_pipeline() {
    let f = video_with(|s| s.replace("batch = 8", "batch = 8\npreprocess = \"parallel\""));
    rejects(
        f.path(),
        &[],
        &["deployment.preprocess", "parallel", "pipelined, serial"],
    );
    let f = video_with(|s| {
        s.replace(
            "batch = 8",
            "batch = 8\npreprocess = \"serial\"\npreprocess_threads = 4",
        )
    });
    rejects(
        f.path(),
        &[],
        &["deployment.preprocess_threads", "pipelined"],
    );
    let f = video_with(|s| s.replace("batch = 8", "batch = 8\npreprocess_threads = 0"));
    rejects(f.path(), &[], &["deployment.preprocess_threads"]);
    let f = video_with(|s| s.replace("gpus = 8", "gpus = 8\nhost_cores = 0"));
    rejects(f.path(), &[], &["cluster.host_cores"]);
}

/// `[limits]` and its flags: positive bounds, known modalities; each error
/// names the field, or the flag that set it.
#[test]
fn bad_limits() {
    let limits = |body: &str| video_with(|s| format!("{s}\n[limits]\n{body}\n"));
    let f = limits("max_prefill_tokens = 0");
    rejects(
        f.path(),
        &[],
        &["limits.max_prefill_tokens", "out of range"],
    );
    let f = limits("limit_mm_per_prompt = { picture = 3 }");
    rejects(
        f.path(),
        &[],
        &["limits.limit_mm_per_prompt", "`picture` is not a modality"],
    );
    let f = limits("max_audio_seconds = -1.0");
    rejects(f.path(), &[], &["limits.max_audio_seconds"]);
    let f = limits("max_batch_bytes = 3");
    rejects(f.path(), &[], &["limits.max_batch_bytes", "unknown field"]);
    let f = video_with(|s| s);
    rejects(
        f.path(),
        &["--max-model-len", "0"],
        &["--max-model-len", "out of range"],
    );
    rejects(
        f.path(),
        &["--limit-mm-per-prompt", "{\"image\": -1}"],
        &["--limit-mm-per-prompt"],
    );
    rejects(
        f.path(),
        &["--limit-mm-per-prompt", "image=3"],
        &["--limit-mm-per-prompt", "JSON object"],
    );
}

/// A request over a limit is refused by the simulator, counted apart from
/// failures, with the limit and its value.
#[test]
fn the_simulator_refuses_what_the_limits_refuse() {
    let f = video_with(|s| s);
    let path = f.path().to_str().unwrap();
    let out = easerve(&[
        "sim",
        path,
        "--requests",
        "40",
        "--max-prefill-tokens",
        "1",
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["refused"], 40, "{r}");
    assert_eq!(r["refusals"][0]["reason"], "max_prefill_tokens");
    assert!(r.get("failed").is_none());
}

/// `scripts/has-vs-exhaustive` refuses a bad argument before building or
/// searching: exit 2 and a message naming the flag and what is allowed.
#[test]
fn has_vs_exhaustive_refuses_bad_arguments_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--bogus"],
            "allowed: --scenario FILE, --requests N, --rate R",
        ),
        (&["--rate", "0"], "--rate '0' is not a rate > 0"),
        (&["--rate", "fast"], "--rate 'fast' is not a rate > 0"),
        (&["--requests", "0"], "--requests '0' is not a count"),
        (&["--bound", "two"], "--bound 'two' is not a fraction"),
        (
            &["--scenario", "no/such.toml"],
            "no/such.toml: no such file",
        ),
        (&["--rate"], "has-vs-exhaustive: --rate needs a value"),
    ];
    for (args, needle) in cases {
        let out = std::process::Command::new(root().join("scripts/has-vs-exhaustive"))
            .args(*args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// The study scripts refuse a bad argument before building or running
/// anything: exit 2 and a message naming the flag and what is allowed.
#[test]
fn the_study_scripts_refuse_bad_arguments_naming_the_flag() {
    let cases: &[(&str, &[&str], &str)] = &[
        ("scripts/calib-loop", &["--bogus"], "allowed: --out DIR"),
        ("scripts/calib-loop", &["--requests", "0"], "--requests '0'"),
        (
            "scripts/calib-loop",
            &["--p99-error", "ten"],
            "--p99-error 'ten'",
        ),
        (
            "scripts/calib-loop",
            &["--scenario", "no/such.toml"],
            "no/such.toml: no such file",
        ),
        ("scripts/demand-agree", &["--bogus"], "allowed: --out DIR"),
        (
            "scripts/demand-agree",
            &["--max-error", "x"],
            "--max-error 'x'",
        ),
        ("scripts/demand-agree", &["--max-error", "."], "'.' is not"),
        ("scripts/calib-loop", &["--rate", "0"], "not a number > 0"),
    ];
    let out_dir = tempfile::tempdir().unwrap();
    for (script, args, needle) in cases {
        let out = std::process::Command::new(root().join(script))
            .args(*args)
            .args(["--out", out_dir.path().join("out").to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{script} {args:?}: {err}");
        assert!(err.contains(needle), "{script} {args:?}: {err}");
        let bare = std::process::Command::new(root().join(script))
            .arg("--out")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&bare.stderr);
        assert_eq!(bare.status.code(), Some(2), "{script} --out: {err}");
        assert!(err.contains("--out needs a value"), "{script} --out: {err}");
    }
}
