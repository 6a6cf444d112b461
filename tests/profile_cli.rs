//! `easerve profile`: a real (reduced-grid) CPU profile that `calib show` and the
//! simulator read back; bad devices and models exit 2 with one line.

use crate::{easerve, root};

#[test]
fn quick_cpu_profile_is_read_back_and_simulated() {
    let _timed = crate::timed();
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
    // The simulator runs the shipped CPU scenario from the measured profile.
    let sc = root().join("scenarios/cpu-audio.toml");
    let report = crate::sim_json(
        &sc,
        &["--profile", out.to_str().unwrap(), "--requests", "20"],
    );
    assert_eq!(report["completed"].as_u64(), Some(20), "{report}");
    assert!(
        report["notes"].to_string().contains("p.toml"),
        "the notes name the profile: {}",
        report["notes"]
    );
    // A profile of another model is refused, blamed on the flag.
    let img = root().join("scenarios/cpu-image.toml");
    let o = easerve(&[
        "sim",
        img.to_str().unwrap(),
        "--profile",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--profile") && err.contains("tiny-audio"),
        "{err}"
    );
}
/// `easerve profile --model tiny-image --quick` with one timed run and no
/// warm-up, plus `extra`, written to `out`; panics with stderr on failure.
fn quick_tiny_image_profile(out: &std::path::Path, extra: &[&str]) {
    let mut args = vec!["profile", "--model", "tiny-image", "--quick"];
    args.extend(["--repetitions", "1", "--warmup", "0"]);
    args.extend_from_slice(extra);
    args.extend(["-o", out.to_str().unwrap()]);
    let o = easerve(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `--tp 2` (quick grid, one timed run; about 12 s in a debug build on 2
/// cores): prefill and decode rows at TP 1 and 2 from a TP 2 worker's rank
/// processes, the all-reduce table at TP 2, and the encode rows at TP 2
/// (tiny-image's CLIP tower splits), which the simulator looks an E(TP2)
/// worker up in; a profile without them prices it as at TP 1 and says so.
#[test]
fn quick_cpu_profile_at_tp2_has_tp_rows_and_the_all_reduce() {
    let _timed = crate::timed();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tp.toml");
    quick_tiny_image_profile(&out, &["--tp", "2"]);
    let p = easerve_calib::Profile::load(&out).unwrap();
    assert_eq!(p.prefill_table().axes()[1], vec![1.0, 2.0]);
    assert_eq!(p.decode_table().axes()[2], vec![1.0, 2.0]);
    let ar = p.all_reduce_table().expect("an all_reduce table");
    assert_eq!(ar.axes()[0], vec![2.0]);
    // 1 and 512 rows of tiny-image's 256-wide f32 activations
    assert_eq!(ar.axes()[1], vec![1024.0, 524288.0]);
    for r in p.prefill_table().rows().iter().chain(ar.rows()) {
        assert!(r.iter().all(|x| x.is_finite() && *x > 0.0), "{r:?}");
    }
    let land = p.kv_land_table().expect("a kv_land table");
    assert_eq!(land.axes()[0], vec![1.0, 2.0]);
    assert_eq!(land.axes()[1], vec![64.0, 1024.0]);
    let enc = p.encode_tp_table().expect("an encode_tp table");
    assert_eq!(enc.axes()[0], vec![2.0]);
    assert_eq!(enc.rows().len(), 2 * 2, "2 batches x 2 sizes");
    for r in enc.rows() {
        assert!(r[3] > 0.0 && r[4] >= r[3] && r[6] <= r[3], "{r:?}");
    }
    let sc = root().join("scenarios/cpu-image-tp2.toml");
    let notes = |profile: &str| {
        let r = crate::sim_json(
            &sc,
            &[
                "--profile",
                profile,
                "--allocation",
                "1E(TP2)+1P(TP1)+1D(TP2)",
                "--offload",
                "1",
                "--requests",
                "6",
            ],
        );
        assert_eq!(r["completed"].as_u64(), Some(6), "{r}");
        r["notes"].to_string()
    };
    let measured = notes(out.to_str().unwrap());
    assert!(!measured.contains("priced as at TP 1"), "{measured}");
    let shipped = root().join("scenarios/profiles/tiny-image-tp.cpu.toml");
    let without = notes(shipped.to_str().unwrap());
    assert!(
        without.contains("encode lookups at a TP > 1") && without.contains("priced as at TP 1"),
        "{without}"
    );
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
        (
            vec!["profile", "--model", "tiny-image", "--tp", "1,3"],
            "--tp 3: model tiny-image splits into TP [1, 2, 4] only",
        ),
        (
            vec![
                "profile",
                "--model",
                "tiny-image",
                "--host-sharing-secs",
                "1000",
            ],
            "--host-sharing-secs 1000: must be a number of seconds in 0 ..= 600",
        ),
    ] {
        let o = easerve(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// `--host-sharing-secs` with `--tp 2` (quick grid, windows of 0.3 s;
/// about 25 s in a debug build on 2 cores): the `[host_sharing]` table has
/// one row per demand from the cores to 3.5× them, and rank-group rows of a
/// TP 2 worker from the cores plus two up, every slowdown at least 1; the
/// simulator prices the CPU host's sharing with the main rows, a TP 2
/// worker's with its rows, and says so.
#[test]
fn quick_cpu_profile_measures_the_host_sharing_curve_that_the_twin_uses() {
    let _timed = crate::timed();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("hs.toml");
    quick_tiny_image_profile(&out, &["--host-sharing-secs", "0.3", "--tp", "2"]);
    let p = easerve_calib::Profile::load(&out).unwrap();
    let h = p.host_sharing().expect("a [host_sharing] table");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(h.cores as usize, cores);
    let demands: Vec<f64> = h.rows().iter().map(|r| r.0).collect();
    assert_eq!(demands[0], cores as f64, "{demands:?}");
    let top = *demands.last().unwrap();
    assert!(top >= 3.0 * cores as f64, "{demands:?}");
    assert!(h.rows().iter().all(|r| r.1 >= 1.0 && r.1.is_finite()));
    assert!(h.method.contains("host load average"), "{}", h.method);
    let groups = h.tp_rows();
    assert!(
        groups
            .iter()
            .all(|r| r.0 == 2 && r.2 >= 1.0 && r.2.is_finite()),
        "{groups:?}"
    );
    let want: Vec<f64> = demands
        .iter()
        .copied()
        .filter(|&d| d >= cores as f64 + 2.0)
        .collect();
    assert_eq!(groups.iter().map(|r| r.1).collect::<Vec<_>>(), want);
    assert!(h.method.contains("rank-group rows"), "{}", h.method);
    let notes = |scenario: &str| {
        let sc = root().join(scenario);
        let r = crate::sim_json(
            &sc,
            &["--profile", out.to_str().unwrap(), "--requests", "10"],
        );
        assert_eq!(r["completed"].as_u64(), Some(10), "{r}");
        r["notes"].to_string()
    };
    let n = notes("scenarios/cpu-image.toml");
    assert!(n.contains("measured [host_sharing] curve"), "{n}");
    // no TP decode worker there: the method names the rows, the pricing not
    assert!(
        !n.contains("decode worker's steps by the curve's rank-group rows"),
        "{n}"
    );
    let n = notes("scenarios/cpu-image-tp2.toml");
    assert!(
        n.contains("rank-group rows instead (tp:demand:slowdown 2:"),
        "{n}"
    );
}
