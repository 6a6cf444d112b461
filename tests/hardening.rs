//! Regressions from fuzzing the command line and the scenario files: each
//! case once panicked, hung, exited 1 or printed meaningless numbers, and now
//! exits 2 with a message naming the file (or flag) and the field, or runs.

use crate::{easerve, root};
use easerve_workload::scenario::{Overrides, Scenario};
use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

fn scenario_with(base: &str, edit: impl Fn(String) -> String) -> tempfile::NamedTempFile {
    let text = std::fs::read_to_string(root().join("scenarios").join(base)).unwrap();
    let edited = edit(text.clone());
    assert_ne!(edited, text, "the edit changed nothing");
    scenario_text(&edited)
}

/// A scenario file with `text`, next to the shipped scenarios so relative
/// paths (profiles, traces) resolve.
fn scenario_text(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new()
        .suffix(".toml")
        .tempfile_in(root().join("scenarios"))
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

/// `easerve ARGS` exits 2, prints no report, does not panic, and stderr holds
/// every needle.
fn exits_2(args: &[&str], needles: &[&str]) {
    let out = easerve(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: stderr: {err}");
    assert!(out.stdout.is_empty(), "{args:?} printed a report");
    assert!(!err.contains("panicked"), "panic: {err}");
    for n in needles {
        assert!(err.contains(n), "message lacks {n:?}: {err}");
    }
}

#[test]
fn bucket_probabilities_whose_sum_overflows() {
    let f = scenario_with("image.toml", |s| {
        s.replace("probability = 0.3 }", "probability = 1e308 }")
            .replace("probability = 0.5 }", "probability = 1e308 }")
    });
    let path = f.path().to_str().unwrap();
    let needles = [path, "workload.image.buckets", "sum to inf", "finite"];
    exits_2(&["sim", path, "--requests", "5"], &needles);
    exits_2(&["search", path, "--requests", "5"], &needles);
}

#[test]
fn gamma_cv_too_small_to_represent() {
    let f = scenario_with("image.toml", |s| {
        s.replace("rate = 2.0", "rate = 2.0\narrival = \"gamma\"\ncv = 1e-160")
    });
    let path = f.path().to_str().unwrap();
    exits_2(
        &["sim", path, "--requests", "5"],
        &[path, "workload.cv", "too small", "1e-160"],
    );
}

#[test]
fn rate_so_low_that_the_clock_cannot_resolve_service_times() {
    for rate in ["5e-324", "1e-300"] {
        let f = scenario_with("image.toml", |s| {
            s.replace("rate = 2.0", &format!("rate = {rate}"))
        });
        let path = f.path().to_str().unwrap();
        exits_2(
            &["sim", path, "--requests", "5"],
            &[path, "workload.rate", "at least 5e-9"],
        );
    }
}

#[test]
fn huge_numbers_in_messages_are_short() {
    let f = scenario_with("image.toml", |s| s.replace("rate = 2.0", "rate = 1e308"));
    let path = f.path().to_str().unwrap();
    let out = easerve(&["sim", path]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("1e308"), "{err}");
    assert!(err.len() < 300, "a long message: {err}");
}

#[test]
fn fixed_timeout_beyond_the_batchers_bound() {
    let f = scenario_with("image.toml", |s| {
        s.replace(
            "dispatch = \"poisson-gap\"",
            "dispatch = \"fixed-timeout:1e308\"",
        )
    });
    let path = f.path().to_str().unwrap();
    exits_2(
        &["sim", path, "--requests", "5"],
        &[path, "deployment.dispatch", "[0, 3600]"],
    );
}

#[test]
fn zero_batch_with_passthrough_is_rejected_too() {
    exits_2(
        &[
            "sim",
            "scenarios/image.toml",
            "-B",
            "0",
            "--system",
            "passthrough",
        ],
        &["--batch", "deployment.batch", "allowed 1"],
    );
}

#[test]
fn gap_quantile_bounds_are_stated_once() {
    for q in ["0", "1", "nan"] {
        let f = scenario_with("image.toml", |s| {
            s.replace(
                "dispatch = \"poisson-gap\"",
                &format!("dispatch = \"poisson-gap\"\ngap_quantile = {q}"),
            )
        });
        let path = f.path().to_str().unwrap();
        exits_2(
            &["sim", path, "--requests", "5"],
            &[path, "deployment.gap_quantile", "allowed (0, 1)"],
        );
    }
}

#[test]
fn slo_tier_names_that_cannot_name_a_file() {
    let long = "x".repeat(300);
    for name in ["a/b", long.as_str(), "", ".hidden"] {
        let f = scenario_with("image.toml", |s| {
            s.replace("name = \"strict\"", &format!("name = \"{name}\""))
        });
        let path = f.path().to_str().unwrap();
        exits_2(
            &["sim", path, "--requests", "5"],
            &[path, "slo[0].name", "not a tier name"],
        );
        let out = tempfile::tempdir().unwrap();
        let out = out.path().join("sweep");
        exits_2(
            &[
                "sweep",
                path,
                "--rates",
                "1",
                "--requests",
                "5",
                "--out",
                out.to_str().unwrap(),
            ],
            &["slo[0].name"],
        );
        assert!(!out.exists(), "the sweep ran before rejecting the tier");
    }
    let f = scenario_with("image.toml", |s| {
        s.replace("name = \"tight\"", "name = \"strict\"")
    });
    exits_2(
        &["sim", f.path().to_str().unwrap()],
        &["slo[1].name", "named twice"],
    );
}

#[test]
fn output_files_on_a_full_disk_name_the_flag() {
    if !std::path::Path::new("/dev/full").exists() {
        eprintln!("skipped: no /dev/full on this system");
        return;
    }
    for flag in ["--requests-csv", "--trace", "--decisions"] {
        let out = easerve(&[
            "sim",
            "scenarios/image.toml",
            "--requests",
            "5",
            flag,
            "/dev/full",
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(err.contains(&format!("{flag} /dev/full")), "{err}");
    }
}

#[test]
fn more_requests_than_the_trace_has_rows() {
    let trace = root().join("../shared/data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv");
    if !trace.exists() {
        eprintln!("skipped: the Azure trace is not in ../shared/data");
        return;
    }
    exits_2(
        &["sim", "scenarios/azure-conv.toml", "--requests", "100000"],
        &["--requests", "19366 rows"],
    );
}

/// Once the SM split for α was built over ⌈rate/n_E⌉ items: quadratic in the
/// rate, hours at 1e6 req/s. A pass batches at most B items.
#[test]
fn high_rate_capacity_estimate_is_bounded_by_the_batch() {
    let mut child = crate::easerve_command()
        .args([
            "sim",
            "scenarios/image.toml",
            "--requests",
            "2",
            "--rate",
            "1e6",
        ])
        .current_dir(root())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    // a generous bound (the run takes well under a second), so a regression
    // fails instead of hanging the suite
    while start.elapsed() < Duration::from_secs(120) {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "exit {status}");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("`sim --rate 1e6` still running after 120 s");
}

#[test]
fn a_folder_given_as_the_trace() {
    let folder = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(root().join("scenarios/azure-conv.toml")).unwrap();
    let text: String = text
        .lines()
        .map(|l| {
            if l.starts_with("trace = ") {
                format!("trace = \"{}\"", folder.path().display())
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let f = scenario_text(&text);
    let path = f.path().to_str().unwrap();
    exits_2(&["sim", path], &[path, "workload.trace", "is a folder"]);
}

/// `easerve sim SCENARIO --json --requests 20` written to a file in `dir`,
/// after `edit` of the JSON text.
fn report_file(
    dir: &std::path::Path,
    scenario: &str,
    edit: impl Fn(String) -> String,
) -> std::path::PathBuf {
    let out = easerve(&["sim", scenario, "--json", "--requests", "20"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = edit(String::from_utf8(out.stdout).unwrap());
    let path = dir.join(format!("{}.json", scenario.replace('/', "-")));
    std::fs::write(&path, text).unwrap();
    path
}

fn validate(sim: &std::path::Path, measured: &std::path::Path) -> std::process::Output {
    easerve(&[
        "calib",
        "validate",
        "--sim",
        sim.to_str().unwrap(),
        "--measured",
        measured.to_str().unwrap(),
    ])
}

#[test]
fn calib_validate_refuses_runs_of_different_models_or_clusters() {
    let dir = tempfile::tempdir().unwrap();
    let cpu = report_file(dir.path(), "scenarios/cpu-image.toml", |s| s);
    let gpu = report_file(dir.path(), "scenarios/audio.toml", |s| s);
    let out = validate(&cpu, &gpu);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("different models"), "{err}");
    assert!(err.contains(cpu.to_str().unwrap()) && err.contains(gpu.to_str().unwrap()));
    // the same run against itself still compares
    assert!(validate(&cpu, &cpu).status.success());
}

#[test]
fn calib_validate_refuses_other_schemas_and_impossible_latencies() {
    let dir = tempfile::tempdir().unwrap();
    let good = report_file(dir.path(), "scenarios/cpu-image.toml", |s| s);
    type Edit = fn(String) -> String;
    let cases: [(&str, Edit, &str); 3] = [
        (
            "schema",
            |s| s.replacen("\"schema_version\": 1", "\"schema_version\": 2", 1),
            "schema_version",
        ),
        (
            "negative",
            |s| {
                let mut v: serde_json::Value = serde_json::from_str(&s).unwrap();
                v["ttft"]["p50"] = serde_json::json!(-1.0);
                v.to_string()
            },
            "ttft.p50",
        ),
        ("garbage", |_| "not json at all".into(), "<document>"),
    ];
    for (name, edit, field) in cases {
        let bad = dir.path().join(format!("{name}.json"));
        let text = edit(std::fs::read_to_string(&good).unwrap());
        std::fs::write(&bad, text).unwrap();
        let out = validate(&good, &bad);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(field), "{name}: {err}");
        assert!(err.contains(bad.to_str().unwrap()), "{name}: {err}");
        assert!(!err.contains("field `?`"), "{name}: {err}");
    }
}

#[test]
fn integer_beyond_64_bits_names_its_field() {
    let f = scenario_with("image.toml", |s| {
        s.replace("batch = 8", "batch = 99999999999999999999")
    });
    let path = f.path().to_str().unwrap();
    exits_2(&["sim", path], &[path, "`deployment.batch`", "too large"]);
}

#[test]
fn a_link_given_inline_can_be_swept() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sweep");
    let run = easerve(&[
        "sweep",
        "scenarios/video.toml",
        "--rates",
        "2",
        "--requests",
        "20",
        "--seeds",
        "1",
        "--systems",
        "easerve-s1",
        "--set",
        "cluster.link.bandwidth_gbs=8,64",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let f = scenario_with("video.toml", |s| {
        s.replace(
            "gpus = 8",
            "gpus = 8\nlink = { name = \"slow\", bandwidth_gbs = 0, latency_s = 0 }",
        )
    });
    let path = f.path().to_str().unwrap();
    exits_2(
        &["sim", path],
        &[path, "cluster.link.bandwidth_gbs", "allowed [0.001"],
    );
    let f = scenario_with("video.toml", |s| {
        s.replace("gpus = 8", "gpus = 8\nlink = 5")
    });
    let path = f.path().to_str().unwrap();
    exits_2(
        &["sim", path],
        &[path, "cluster.link", "preset name or a table"],
    );
}

#[test]
fn aggregated_replicas_at_a_chosen_tp() {
    let f = scenario_with("video.toml", |s| {
        s.replace(
            "dispatch = \"poisson-gap\"",
            "dispatch = \"poisson-gap\"\nsystem = \"aggregated\"\naggregated_tp = 4",
        )
    });
    let v = crate::sim_json(f.path(), &["--requests", "20"]);
    let dep = v["deployment"].as_str().unwrap();
    assert!(dep.contains("2×(TP4)"), "{dep}");
    let f = scenario_with("video.toml", |s| {
        s.replace(
            "dispatch = \"poisson-gap\"",
            "dispatch = \"poisson-gap\"\nsystem = \"aggregated\"\naggregated_tp = 3",
        )
    });
    let path = f.path().to_str().unwrap();
    exits_2(
        &["sim", path],
        &[path, "deployment.aggregated_tp", "power of two"],
    );
}

/// `text` with `key = value` in `[section]`: the line replaced, or added
/// under the section's header.
fn with_field(text: &str, section: &str, key: &str, value: &str) -> String {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut done = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            current = t.trim_matches(|c| c == '[' || c == ']').to_string();
        }
        let key_line = t.split_once('=').map(|(k, _)| k.trim()) == Some(key);
        if current == section && key_line && !done {
            out.push(format!("{key} = {value}"));
            done = true;
            continue;
        }
        out.push(line.to_string());
        if !done && t == format!("[{section}]") {
            // added here; a later line of the same key would be a duplicate
            let rest: Vec<&str> = text.lines().collect();
            let has_key = rest
                .iter()
                .skip_while(|l| l.trim() != format!("[{section}]"))
                .skip(1)
                .take_while(|l| !l.trim().starts_with('['))
                .any(|l| l.split_once('=').map(|(k, _)| k.trim()) == Some(key));
            if !has_key {
                out.push(format!("{key} = {value}"));
                done = true;
            }
        }
    }
    assert!(done, "no [{section}] in the scenario");
    out.join("\n") + "\n"
}

/// Every numeric bound the validator enforces is the one `scenarios/README.md`
/// states: the bound's text is in the field's row, its edge is accepted (no
/// error names the field) and one step beyond it is rejected naming the field.
#[test]
fn scenario_bounds_match_the_readme() {
    let readme = std::fs::read_to_string(root().join("scenarios/README.md")).unwrap();
    let base = std::fs::read_to_string(root().join("scenarios/video.toml")).unwrap();
    let gamma = with_field(&base, "workload", "arrival", "\"gamma\"");
    // (section, key, README text, inside, outside, scenario)
    let cases: &[(&str, &str, &str, &str, &str, &str)] = &[
        ("cluster", "gpus", "1 ..= 4096", "4096", "4097", &base),
        (
            "cluster",
            "host_cpu_scale",
            "(0, 1000]",
            "1000",
            "1000.5",
            &base,
        ),
        (
            "cluster",
            "host_cores",
            "1 ..= 2^20",
            "1048576",
            "1048577",
            &base,
        ),
        (
            "deployment",
            "preprocess_threads",
            "1 ..= 1024",
            "1024",
            "1025",
            &base,
        ),
        ("deployment", "batch", "1 ..= 4096", "4096", "4097", &base),
        ("deployment", "offload", "[0, 1]", "1.0", "1.01", &base),
        (
            "deployment",
            "max_age_s",
            "[0, 3600]",
            "3600",
            "3600.5",
            &base,
        ),
        ("deployment", "gap_quantile", "(0, 1)", "0.99", "1.0", &base),
        (
            "deployment",
            "prefill_token_budget",
            "1 ..= 2^30",
            "1073741824",
            "1073741825",
            &base,
        ),
        (
            "deployment",
            "prefill_max_seqs",
            "1 ..= 2^20",
            "1048576",
            "1048577",
            &base,
        ),
        (
            "deployment",
            "decode_max_batch",
            "1 ..= 2^20",
            "1048576",
            "1048577",
            &base,
        ),
        (
            "deployment",
            "kv_block_size",
            "1 ..= 65536",
            "16",
            "65537",
            &base,
        ),
        (
            "deployment",
            "max_inflight_transfers",
            "1 ..= 65536",
            "65536",
            "65537",
            &base,
        ),
        (
            "deployment",
            "admission_limit",
            "1 ..= 2^30",
            "1073741824",
            "1073741825",
            &base,
        ),
        (
            "deployment",
            "gpu_memory_utilization",
            "(0, 1]",
            "1.0",
            "1.01",
            &base,
        ),
        (
            "workload",
            "requests",
            "1 ..= 10,000,000",
            "10000000",
            "10000001",
            &base,
        ),
        ("workload", "rate", "(0, 10^6]", "1000000", "1000001", &base),
        ("workload", "cv", "(0, 100]", "100", "100.5", &gamma),
        (
            "workload",
            "input_len",
            "0 ..= 10^7",
            "10000000",
            "10000001",
            &base,
        ),
        (
            "workload",
            "output_len",
            "1 ..= 10^7",
            "1",
            "10000001",
            &base,
        ),
        ("workload", "range_ratio", "[0, 1]", "1.0", "1.01", &base),
        (
            "workload.video",
            "items_per_request",
            "1 ..= 64",
            "64",
            "65",
            &base,
        ),
    ];
    for &(section, key, text, inside, outside, scenario) in cases {
        let field = format!("{section}.{key}");
        let row = readme
            .lines()
            .find(|l| l.starts_with(&format!("| `{key}` |")))
            .unwrap_or_else(|| panic!("scenarios/README.md has no row for `{key}`"));
        assert!(
            row.contains(text),
            "README row of `{key}` lacks {text:?}: {row}"
        );
        // validated in-process, as `easerve sim` does before it runs
        let check = |value: &str| {
            let f = scenario_text(&with_field(scenario, section, key, value));
            Scenario::load(f.path(), &Overrides::default()).err()
        };
        if let Some(e) = check(inside) {
            assert_ne!(e.field, field, "{field} = {inside} is rejected: {e}");
        }
        match check(outside) {
            Some(e) => assert_eq!(e.field, field, "{field} = {outside}: {e}"),
            None => panic!("{field} = {outside} is accepted"),
        }
    }
}

#[test]
fn large_runs_are_announced_before_they_start() {
    let load = |edit: &dyn Fn(String) -> String| {
        let f = scenario_with("cpu-image.toml", edit);
        Scenario::load(f.path(), &Overrides::default()).expect("valid")
    };
    let long = load(&|s| {
        with_field(
            &with_field(&s, "workload", "output_len", "1000000"),
            "workload",
            "requests",
            "1000",
        )
    });
    let w = long.size_warnings();
    assert!(w.iter().any(|w| w.contains("decode iterations")), "{w:?}");
    let many = load(&|s| {
        with_field(
            &with_field(&s, "workload", "requests", "10000000"),
            "workload",
            "rate",
            "1000",
        )
    });
    let w = many.size_warnings();
    assert!(w.iter().any(|w| w.contains("GB of memory")), "{w:?}");
    let shipped = Scenario::load(
        &root().join("scenarios/cpu-image.toml"),
        &Overrides::default(),
    )
    .expect("valid");
    assert!(shipped.size_warnings().is_empty());
}

#[test]
fn search_and_sweep_at_a_million_requests_per_second_finish() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sweep");
    for args in [
        vec![
            "search",
            "scenarios/image.toml",
            "--rate",
            "1e6",
            "--requests",
            "5",
            "--budget",
            "2",
        ],
        vec![
            "sweep",
            "scenarios/image.toml",
            "--rates",
            "1e6",
            "--requests",
            "5",
            "--seeds",
            "1",
            "--systems",
            "easerve-s1",
            "--out",
            out.to_str().unwrap(),
        ],
    ] {
        let run = easerve(&args);
        assert!(
            run.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&run.stderr)
        );
    }
}

#[test]
fn standard_output_on_a_full_disk() {
    if !std::path::Path::new("/dev/full").exists() {
        eprintln!("skipped: no /dev/full on this system");
        return;
    }
    for args in [
        &["sim", "scenarios/image.toml", "--requests", "5"][..],
        &[
            "search",
            "scenarios/image.toml",
            "--requests",
            "5",
            "--budget",
            "2",
        ][..],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = crate::easerve_command()
            .args(args)
            .current_dir(root())
            .stdout(full)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("standard output: cannot write"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn implausible_hardware_figures_are_rejected() {
    let f = scenario_with("video.toml", |s| {
        s.replace(
            "gpus = 8",
            "gpus = 8\nlink = { name = \"x\", bandwidth_gbs = 8, latency_s = 1e308 }",
        )
    });
    let path = f.path().to_str().unwrap();
    exits_2(
        &["sim", path],
        &[path, "cluster.link.latency_s", "allowed [0, 1]"],
    );
    let dir = tempfile::tempdir().unwrap();
    let gpu = std::fs::read_to_string(root().join("scenarios/custom/l40s.toml"))
        .unwrap()
        .replace("bf16_tflops = 362.0", "bf16_tflops = 1e-300");
    let gpu_path = dir.path().join("slow.toml");
    std::fs::write(&gpu_path, gpu).unwrap();
    let f = scenario_with("video.toml", |s| {
        s.replace(
            "gpu = \"rtx-6000-ada\"",
            &format!("gpu_file = \"{}\"", gpu_path.display()),
        )
    });
    let path = f.path().to_str().unwrap();
    exits_2(&["sim", path], &[path, "bf16_tflops", "plausible"]);
}

#[test]
fn a_trace_of_empty_requests() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("zero.csv");
    std::fs::write(
        &csv,
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,0,0\n2023-11-16 18:15:46.6805900,0,0\n",
    )
    .unwrap();
    let text = std::fs::read_to_string(root().join("scenarios/azure-conv.toml")).unwrap();
    let text: String = text
        .lines()
        .map(|l| {
            if l.starts_with("trace = ") {
                format!("trace = \"{}\"", csv.display())
            } else if l.starts_with("requests = ") {
                "requests = 2".into()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let f = scenario_text(&text);
    let path = f.path().to_str().unwrap();
    exits_2(&["sim", path], &[path, "workload.trace", "ContextTokens 0"]);
}

#[test]
fn sweep_checks_every_rate_before_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sweep");
    exits_2(
        &[
            "sweep",
            "scenarios/image.toml",
            "--requests",
            "3",
            "--rates",
            "2,1e-9",
            "--seeds",
            "1",
            "--systems",
            "easerve-s1",
            "--out",
            out.to_str().unwrap(),
        ],
        &["--rates", "workload.rate", "rate 1e-9"],
    );
    assert!(!out.exists());
}

#[test]
fn integer_beyond_64_bits_in_a_bucket_names_its_field() {
    let f = scenario_with("image.toml", |s| {
        s.replace(
            "{ height = 336, width = 336,",
            "{ height = 99999999999999999999, width = 336,",
        )
    });
    let path = f.path().to_str().unwrap();
    exits_2(&["sim", path], &[path, "`workload.image.buckets.height`"]);
}
