//! Regressions of input files and fields that were read without end, accepted
//! though invalid, or silently ignored: each now exits 2 naming the file or
//! flag and the field, at once.

use crate::{easerve, root};
use std::io::Write;
use std::time::{Duration, Instant};

/// A file with `text` in `scenarios/` (so a scenario's relative paths resolve)
/// ending in `suffix`.
fn file_in_scenarios(text: &str, suffix: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new()
        .suffix(suffix)
        .tempfile_in(root().join("scenarios"))
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

/// The shipped scenario `base` with `edit` applied, in `scenarios/`.
fn edited(base: &str, edit: impl Fn(String) -> String) -> tempfile::NamedTempFile {
    let text = std::fs::read_to_string(root().join("scenarios").join(base)).unwrap();
    let out = edit(text.clone());
    assert_ne!(out, text, "the edit changed nothing");
    file_in_scenarios(&out, ".toml")
}

/// `easerve ARGS` exits 2 within 30 s, without a panic or a report, and its
/// stderr holds every needle.
fn refused(args: &[&str], needles: &[&str]) {
    let t0 = Instant::now();
    let out = easerve(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: stderr: {err}");
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "{args:?} took {:?}",
        t0.elapsed()
    );
    assert!(out.stdout.is_empty(), "{args:?} printed a report");
    assert!(!err.contains("panicked"), "panic: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: message lacks {n:?}: {err}");
    }
}

/// `easerve ARGS` succeeds, without a panic.
fn runs(args: &[&str]) {
    let out = easerve(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
}

fn path(f: &tempfile::NamedTempFile) -> &str {
    f.path().to_str().unwrap()
}

#[test]
fn devices_are_refused_as_input_files_at_once() {
    let trace = edited("azure-conv.toml", |s| {
        let line = s
            .lines()
            .find(|l| l.trim_start().starts_with("trace ="))
            .expect("a trace line")
            .to_string();
        s.replace(&line, "trace = \"/dev/zero\"")
    });
    refused(
        &["sim", path(&trace)],
        &["workload.trace", "not a regular file"],
    );
    let profile = edited("cpu-image.toml", |s| {
        s.replace("profiles/tiny-image.cpu.toml", "/dev/zero")
    });
    refused(&["sim", path(&profile)], &["profile", "not a regular file"]);
    refused(
        &["calib", "show", "/dev/zero"],
        &["/dev/zero", "not a regular file"],
    );
    refused(
        &[
            "calib",
            "validate",
            "--sim",
            "tests/golden/video-40.json",
            "--measured",
            "/dev/zero",
        ],
        &["/dev/zero", "not a regular file"],
    );
    refused(&["sim", "/dev/zero"], &["/dev/zero", "not a regular file"]);
}

#[test]
fn passthrough_still_checks_the_dispatch_rule_it_replaces() {
    for bad in ["queue-length:0", "fixed-timeout:-1", "bogus"] {
        let f = edited("video.toml", |s| {
            s.replace(
                "dispatch = \"poisson-gap\"",
                &format!("dispatch = \"{bad}\""),
            )
        });
        refused(
            &["sim", path(&f), "--system", "passthrough"],
            &["deployment.dispatch"],
        );
    }
}

#[test]
fn a_static_share_must_leave_both_sides_room_to_run() {
    for bad in ["static:0.9999999999999999", "static:0.0001"] {
        let f = edited("image.toml", |s| {
            s.replace("sm_policy = \"dynamic\"", &format!("sm_policy = \"{bad}\""))
        });
        refused(
            &["sim", path(&f)],
            &["deployment.sm_policy", "[0.001, 0.999]"],
        );
    }
}

#[test]
fn an_empty_sweep_value_is_refused() {
    let out = tempfile::tempdir().unwrap();
    refused(
        &[
            "sweep",
            "scenarios/image.toml",
            "--rates",
            "1",
            "--set",
            "deployment.batch=1,,2",
            "--out",
            out.path().to_str().unwrap(),
        ],
        &["--set", "empty"],
    );
}

#[test]
fn a_trace_at_one_instant_has_no_rate_to_rescale() {
    let csv = file_in_scenarios(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n\
         2023-11-16 18:15:46.6805900,374,44\n\
         2023-11-16 18:15:46.6805900,396,109\n\
         2023-11-16 18:15:46.6805900,879,34\n",
        ".csv",
    );
    let name = csv.path().file_name().unwrap().to_str().unwrap();
    let scenario = |rate: &str| {
        format!(
            "[model]\npreset = \"text-lm-tiny\"\n[cluster]\ngpu = \"a100-sxm4-80gb\"\ngpus = 2\nkernels = \"roofline\"\n\
             [deployment]\nallocation = \"1P(TP1)+1D(TP1)\"\nbatch = 1\noffload = 1.0\n\
             [workload]\nrequests = 3\narrival = \"trace\"\ntrace = \"{name}\"\nmodality = \"text\"\n{rate}"
        )
    };
    let f = file_in_scenarios(&scenario("rate = 2.0\n"), ".toml");
    refused(&["sim", path(&f)], &["workload.rate", "one instant"]);
    // as it is, it replays
    let f = file_in_scenarios(&scenario(""), ".toml");
    runs(&["sim", path(&f)]);
}

#[test]
fn a_trace_rescaled_to_the_lowest_rate_its_span_allows_runs() {
    let trace = root().join("../shared/data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv");
    if !trace.is_file() {
        eprintln!("skipped: {} is absent", trace.display());
        return;
    }
    // 10 requests at 1e-8 req/s span 9e8 s, within the clock's 1e9 s
    runs(&[
        "sim",
        "scenarios/azure-conv.toml",
        "--requests",
        "10",
        "--rate",
        "1e-8",
    ]);
}

#[test]
fn a_profile_that_would_make_a_stage_free_is_refused() {
    let shipped =
        std::fs::read_to_string(root().join("scenarios/profiles/tiny-image.cpu.toml")).unwrap();
    let cut = |from: &str, to: &str| -> String {
        let (a, rest) = shipped.split_once(from).unwrap();
        let (_, b) = rest.split_once(to).unwrap();
        format!("{a}{to}{b}")
    };
    let no_encode = file_in_scenarios(&cut("[encode]", "[prefill]"), ".toml");
    // every decode row's median and p90 set to 0
    let mut in_decode = false;
    let zero_decode: String = shipped
        .lines()
        .map(|l| {
            if l.starts_with('[') {
                in_decode = l == "[decode]";
            }
            match l
                .trim()
                .strip_prefix('[')
                .filter(|_| in_decode && l.starts_with("  ["))
            {
                Some(row) => {
                    let v: Vec<&str> = row.trim_end_matches("],").split(',').collect();
                    format!("  [{}, {}, {}, 0.0, 0.0],", v[0], v[1], v[2])
                }
                None => l.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let zero_decode = file_in_scenarios(&zero_decode, ".toml");
    for (profile, needles) in [
        (&no_encode, ["profile", "no encode table"]),
        (&zero_decode, ["profile", "decode table is 0"]),
    ] {
        let name = profile.path().file_name().unwrap().to_str().unwrap();
        let f = edited("cpu-image.toml", |s| {
            s.replace("profiles/tiny-image.cpu.toml", name)
        });
        refused(&["sim", path(&f)], &needles);
    }
}

#[test]
fn an_impossible_date_or_empty_version_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.toml");
    let o = out.to_str().unwrap();
    // the commands that write a profile, each with one flag's value to add
    let import = |flag: &'static str, value: &'static str| {
        let mut a = vec![
            "calib",
            "import-aiconfigurator",
            "../shared/data/aiconfigurator",
        ];
        a.extend([
            "--gpu",
            "h100-sxm",
            "--model",
            "qwen2.5-vl-32b",
            "-o",
            o,
            flag,
            value,
        ]);
        a
    };
    let roofline = |flag: &'static str, value: &'static str| {
        let mut a = vec!["calib", "roofline"];
        a.extend([
            "--gpu",
            "h100-sxm",
            "--model",
            "qwen2.5-vl-32b",
            "-o",
            o,
            flag,
            value,
        ]);
        a
    };
    for bad in ["abc", "", "2026-1-1", "99999-01-01", "2026-02-30"] {
        refused(&import("--date", bad), &["--date", "YYYY-MM-DD"]);
        refused(&roofline("--date", bad), &["--date", "YYYY-MM-DD"]);
        assert!(!out.exists(), "--date {bad:?} left {o}");
    }
    refused(&import("--version", ""), &["--version"]);
    assert!(!out.exists());
}

/// The golden video report with `edit` applied to its JSON, in a temp file.
fn golden_with(edit: impl Fn(&mut serde_json::Value)) -> tempfile::NamedTempFile {
    let text = std::fs::read_to_string(root().join("tests/golden/video-40.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut v);
    let mut f = tempfile::Builder::new().suffix(".json").tempfile().unwrap();
    f.write_all(v.to_string().as_bytes()).unwrap();
    f
}

#[test]
fn a_measured_run_with_nothing_to_compare_is_refused() {
    let none = golden_with(|v| v["completed"] = 0.into());
    let zero_ttft = golden_with(|v| {
        for k in ["mean", "p50", "p90", "p99", "max"] {
            v["ttft"][k] = 0.0.into();
        }
    });
    for (m, needle) in [
        (&none, "no completed request"),
        (&zero_ttft, "TTFTs are all 0"),
    ] {
        refused(
            &[
                "calib",
                "validate",
                "--sim",
                "tests/golden/video-40.json",
                "--measured",
                path(m),
            ],
            &["--measured", needle],
        );
    }
}

#[test]
fn refine_names_the_input_at_fault_and_refuses_absurd_factors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("refined.toml");
    let o = out.to_str().unwrap();
    let profile = "scenarios/profiles/tiny-image.cpu.toml";
    refused(
        &[
            "calib",
            "refine",
            "--profile",
            profile,
            "--measured-csv",
            "tests/golden/video-40.json",
            "--encoder-tokens",
            "0",
            "-o",
            o,
        ],
        &["--encoder-tokens"],
    );
    let header_only = file_in_scenarios(
        "id,encode_worker,encode_batch,encode_start,encode_end\n",
        ".csv",
    );
    refused(
        &[
            "calib",
            "refine",
            "--profile",
            profile,
            "--measured-csv",
            path(&header_only),
            "--encoder-tokens",
            "195",
            "-o",
            o,
        ],
        &["--measured-csv", "no encode pass"],
    );
    // reports of another model than the profile's
    refused(
        &[
            "calib",
            "refine",
            "--profile",
            profile,
            "--sim",
            "tests/golden/video-40.json",
            "--measured",
            "tests/golden/video-40.json",
            "-o",
            o,
        ],
        &["--sim", "qwen2.5-vl-32b", "tiny-image"],
    );
    assert!(!out.exists(), "a refused refine wrote {o}");
}

/// At 2e-7 req/s the passes run 1e8 s into the run, where an f64 second
/// resolves ~1e-8 s: the simulator's own consistency checks allow for it.
#[test]
fn a_very_slow_rate_runs_to_the_end() {
    runs(&[
        "sim",
        "scenarios/image.toml",
        "--rate",
        "2e-7",
        "--requests",
        "60",
    ]);
}

/// `capacity` without `--slo` lists the scenario's tiers instead of clap's
/// bare "required" error.
#[test]
fn capacity_without_a_tier_lists_the_scenarios_tiers() {
    refused(
        &["capacity", "scenarios/image.toml"],
        &["--slo", "strict", "tight", "moderate", "loose", "relaxed"],
    );
}

/// A scenario without `[[slo]]` tiers gets a goodput table that says why it
/// is empty rather than a bare header.
#[test]
fn a_scenario_without_tiers_says_why_its_goodput_table_is_empty() {
    let text = std::fs::read_to_string(root().join("scenarios/cpu-image.toml")).unwrap();
    let cut = text.find("[[slo]]").expect("cpu-image has tiers");
    let f = file_in_scenarios(&text[..cut], ".toml");
    let out = easerve(&["sim", path(&f), "--requests", "5"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("no [[slo]] tiers"), "{stdout}");
}
