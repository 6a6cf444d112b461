//! `easerve profile`: a real (reduced-grid) CPU profile that `calib show` and the
//! simulator read back; bad devices and models exit 2 with one line.

use crate::{easerve, root};

#[test]
fn quick_cpu_profile_is_read_back_and_simulated() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.toml");
    let o = easerve(&[
        "profile",
        "--model",
        "tiny-audio",
        "--device",
        "cpu",
        "--quick",
        "--repetitions",
        "2",
        "--warmup",
        "1",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("source = \"measured\""), "{text}");
    assert!(text.contains("device = \"cpu\""));
    let show = easerve(&["calib", "show", out.to_str().unwrap()]);
    assert!(
        show.status.success(),
        "{}",
        String::from_utf8_lossy(&show.stderr)
    );
    let s = String::from_utf8_lossy(&show.stdout);
    // Quick grid: 2 encode sizes (1 and 2 windows of 250 frames) x batches 1, 2 x one
    // SM level per core count.
    assert!(s.contains("encoder_tokens 250..500 (2 values)"), "{s}");
    let p = easerve_calib::Profile::load(&out).unwrap();
    let enc = p.encode_table().unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let levels = easerve_exec::device::cpu_levels(cores).len();
    assert_eq!(enc.rows().len(), 2 * 2 * levels);
    // Every timing is positive and p90 >= median.
    for r in enc.rows() {
        assert!(r[3] > 0.0 && r[4] >= r[3], "{r:?}");
    }
    // The simulator runs a CPU scenario from the measured profile.
    let sc = dir.path().join("cpu-audio.toml");
    std::fs::write(
        &sc,
        format!(
            r#"name = "cpu-audio-test"
seed = 1
profile = "{}"
[model]
preset = "tiny-audio"
[cluster]
gpu = "cpu"
gpus = 3
[deployment]
allocation = "1E(TP1)+1P(TP1)+1D(TP1)"
batch = 2
offload = 0.5
[workload]
requests = 20
rate = 1.0
modality = "audio"
input_len = 16
output_len = 8
[workload.audio]
mean_s = 4.0
sigma = 0.2
max_s = 9.0
"#,
            out.display()
        ),
    )
    .unwrap();
    let report = crate::sim_json(&sc, &[]);
    assert_eq!(report["completed"].as_u64(), Some(20), "{report}");
}

#[test]
fn cuda_without_gpu_or_feature_exits_2_with_one_line() {
    let o = easerve(&["profile", "--model", "tiny-image", "--device", "cuda"]);
    if o.status.success() {
        eprintln!("skipping: this machine has CUDA");
        return;
    }
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("--device cuda"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn unknown_model_device_and_zero_repetitions_exit_2() {
    for (args, want) in [
        (
            vec!["profile", "--model", "gpt-9"],
            "--model: unknown model `gpt-9`",
        ),
        (
            vec!["profile", "--model", "tiny-image", "--device", "tpu"],
            "--device: unknown device `tpu`",
        ),
        (
            vec!["profile", "--model", "tiny-image", "--repetitions", "0"],
            "--repetitions must be at least 1",
        ),
    ] {
        let o = easerve(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let _ = root();
}
