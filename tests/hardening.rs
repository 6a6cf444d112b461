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

// --- issue 32: the newer commands (bench, capacity, deploy, search --emit,
// reproduce), tried as a new user would ---

/// `easerve ARGS`, killed (and the test failed) if it runs past `limit`;
/// returns its output and how long it took.
fn easerve_within(args: &[&str], limit: Duration) -> (std::process::Output, Duration) {
    let mut child = crate::easerve_command()
        .args(args)
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while start.elapsed() < limit {
        if child.try_wait().unwrap().is_some() {
            let took = start.elapsed();
            return (child.wait_with_output().unwrap(), took);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("{args:?} still running after {limit:?}");
}

/// Issue 32: bucket weights whose sum overflows panicked in `Uniform::new`.
#[test]
#[cfg(feature = "bench")]
fn bench_bucket_weights_whose_sum_overflows() {
    exits_2(
        &[
            "bench",
            "--base-url",
            "http://127.0.0.1:9",
            "--model",
            "m",
            "--num-prompts",
            "1",
            "--random-mm-bucket-config",
            "{(256, 256, 1): 1e308, (512, 512, 1): 1e308}",
        ],
        &["--random-mm-bucket-config", "sum to inf", "finite"],
    );
}

/// Issue 32: `--requests-csv /dev/full` sent every request, then exited 2 and
/// lost the measurement; the file is now checked before the first request.
#[test]
#[cfg(feature = "bench")]
fn bench_results_file_that_cannot_be_written_fails_before_any_request() {
    let server = crate::bench_cli::fake_server(Duration::ZERO, Duration::ZERO, 0);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let under_a_file = file.join("requests.csv");
    let mut paths = vec![
        under_a_file.to_str().unwrap().to_string(),
        dir.path().to_str().unwrap().to_string(),
    ];
    if std::path::Path::new("/dev/full").exists() {
        paths.push("/dev/full".into());
    }
    for path in &paths {
        exits_2(
            &[
                "bench",
                "--base-url",
                &server.url,
                "--model",
                "m",
                "--num-prompts",
                "3",
                "--dataset-name",
                "random",
                "--random-input-len",
                "5",
                "--random-output-len",
                "2",
                "--requests-csv",
                path,
            ],
            &[&format!("--requests-csv {path}"), "cannot write"],
        );
    }
    assert_eq!(server.seen.lock().unwrap().len(), 0, "requests were sent");
}

/// Issue 32: accepted without a word: `--random-output-len 0` (sent as 1),
/// an endpoint with a space, an empty model name.
#[test]
#[cfg(feature = "bench")]
fn bench_output_len_endpoint_and_model_are_checked() {
    let cases: [(&str, &str, &[&str]); 3] = [
        (
            "--random-output-len",
            "0",
            &["--random-output-len 0", "at least 1"],
        ),
        (
            "--endpoint",
            "/v1/chat completions",
            &["--endpoint", "without spaces"],
        ),
        ("--model", "", &["--model", "empty", "/v1/models"]),
    ];
    for (flag, value, needles) in cases {
        let mut args = vec![
            "bench",
            "--base-url",
            "http://127.0.0.1:9",
            "--num-prompts",
            "1",
            flag,
            value,
        ];
        if flag != "--model" {
            args.extend(["--model", "m"]);
        }
        exits_2(&args, needles);
    }
}

/// Issue 32: `--target-rate` on a tier no cluster size reaches probed every
/// size 4, 5, 6, … (300 probes in 435 s without an answer). The sizes now
/// double and the search stops when a doubling brings no gain.
#[test]
fn capacity_fewest_gpus_is_bounded_when_the_tier_is_out_of_reach() {
    let (out, took) = easerve_within(
        &[
            "capacity",
            "scenarios/image.toml",
            "--slo",
            "strict",
            "--target-rate",
            "1",
            "--max-gpus",
            "4096",
        ],
        Duration::from_secs(300),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let probes = text.lines().filter(|l| l.starts_with("probe")).count();
    assert!(probes <= 12, "{probes} probes in {took:?}: {text}");
    let answer = text.lines().last().unwrap_or_default();
    assert!(
        answer.starts_with("not met up to ") || answer.starts_with("fewest GPUs"),
        "{text}"
    );
}

/// Issue 32: `--gpus bogus` exited 0 with the error as a table row.
#[test]
fn capacity_unknown_gpu_types_exit_2_before_any_run() {
    for gpus in ["bogus", "", "H100-SXM", "h100-sxm,"] {
        exits_2(
            &[
                "capacity",
                "scenarios/image.toml",
                "--slo",
                "moderate",
                "--requests",
                "40",
                "--gpus",
                gpus,
            ],
            &[
                &format!("--gpus `{gpus}`"),
                "allowed GPU types",
                "h100-sxm, h200-sxm",
            ],
        );
    }
}

/// Issue 32: a target rate too low for the clock blamed the file's
/// `workload.rate`.
#[test]
fn capacity_target_rate_too_low_blames_the_flag() {
    let out = easerve(&[
        "capacity",
        "scenarios/image.toml",
        "--slo",
        "moderate",
        "--target-rate",
        "1e-9",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--target-rate 1e-9"), "{err}");
    assert!(err.contains("at least"), "{err}");
    assert!(!err.contains("workload.rate"), "blames the file: {err}");
}

/// Issue 32: probes stopped at 2^20 × the scenario's rate, so a scenario at a
/// tiny rate reported the cluster "not the limit" at 0.52 req/s on a cluster
/// that fails near 1 req/s with these requests. The cluster bounds them now.
#[test]
fn capacity_probes_are_bounded_by_the_cluster_not_the_scenario_rate() {
    let f = scenario_with("image.toml", |s| s.replace("rate = 2.0", "rate = 5e-7"));
    let v = crate::report_json(
        "capacity",
        f.path(),
        &["--slo", "moderate", "--requests", "60", "--as-is"],
    );
    let ans = &v["answer"];
    assert!(ans["fails_at"].is_number(), "no failing rate found: {ans}");
    let rate = crate::num(ans, "/rate");
    assert!(rate > 0.6, "highest rate {rate} req/s");
}

/// Issue 32: `deploy --seed 18446744073709551615` exited 1 ("out-of-range
/// value for u64") while writing scenario.toml.
#[test]
fn deploy_seed_beyond_a_toml_integer_names_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("deploy");
    for cmd in ["deploy", "search"] {
        exits_2(
            &[
                cmd,
                "scenarios/image.toml",
                "--seed",
                "18446744073709551615",
                "--emit",
                out.to_str().unwrap(),
            ],
            &["--seed 18446744073709551615", "0 ..= 9223372036854775807"],
        );
        assert!(!out.exists(), "{cmd} wrote files");
    }
}

/// Issue 32: a deployment without P workers exited 1 (then 2) after writing
/// scenario.toml; it is written now, and its README says no engine runs it.
#[test]
fn deployment_without_p_workers_is_emitted_with_the_reason_per_engine() {
    let dir = tempfile::tempdir().unwrap();
    let deployed = dir.path().join("deploy");
    let searched = dir.path().join("search");
    for (args, out) in [
        (
            vec![
                "deploy",
                "scenarios/audio.toml",
                "--deployment",
                "2E(TP1)+3D(TP2) B=2 s=0",
                "--emit",
                deployed.to_str().unwrap(),
            ],
            &deployed,
        ),
        (
            vec![
                "search",
                "scenarios/audio.toml",
                "--emit",
                searched.to_str().unwrap(),
            ],
            &searched,
        ),
    ] {
        let run = easerve(&args);
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(0), "{args:?}: {err}");
        let scenario = std::fs::read_to_string(out.join("scenario.toml")).unwrap();
        let readme = std::fs::read_to_string(out.join("README.md")).unwrap();
        if scenario.contains("P(TP") {
            continue; // the search chose P workers: nothing to say
        }
        for engine in ["vllm", "sglang", "dynamo"] {
            assert!(!out.join(engine).exists(), "{args:?}: {engine}/ written");
            assert!(
                readme.contains(&format!("* `{engine}/` — not written:"))
                    && readme.contains("has no P workers"),
                "{args:?}: {engine}: {readme}"
            );
        }
    }
    // the deploy case above has no P workers by construction
    assert!(!deployed.join("vllm").exists());
}

/// Issue 32: `reproduce --out` on a file, /dev/full or a path under a file
/// gave a bare `File exists (os error 17)`.
#[test]
fn reproduce_out_that_cannot_be_a_folder_names_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let under = file.join("out");
    let mut outs = vec![
        file.to_str().unwrap().to_string(),
        under.to_str().unwrap().to_string(),
    ];
    if std::path::Path::new("/dev/full").exists() {
        outs.push("/dev/full".into());
    }
    for out in &outs {
        exits_2(
            &["reproduce", "--out", out, "--requests", "20"],
            &[&format!("--out {out}")],
        );
    }
}

/// Issue 32: report.md carried its own wall time ("in 0.8 s" against
/// "0.7 s"), so two runs differed.
#[test]
fn reproduce_report_is_byte_identical_across_runs() {
    let dir = tempfile::tempdir().unwrap();
    let mut reports = Vec::new();
    for run in ["a", "b"] {
        let out = dir.path().join(run);
        let r = easerve(&[
            "reproduce",
            "--out",
            out.to_str().unwrap(),
            "--requests",
            "20",
        ]);
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(r.status.success(), "{err}");
        assert!(err.contains("reproduce took"), "{err}");
        reports.push(std::fs::read_to_string(out.join("report.md")).unwrap());
    }
    assert!(
        !reports[0].contains("Generated by `easerve reproduce` in"),
        "wall time in the report"
    );
    assert!(reports[0] == reports[1], "the two reports differ");
}

/// A build without the `bench` feature keeps `easerve bench`'s flags and
/// exits 2 saying which build has the client.
#[test]
#[cfg(not(feature = "bench"))]
fn bench_without_the_client_says_how_to_build_it() {
    exits_2(
        &["bench", "--base-url", "http://127.0.0.1:9", "--model", "m"],
        &["built without it", "--features bench"],
    );
    let help = crate::easerve(&["bench", "--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        text.contains("--base-url") && text.contains("--request-rate"),
        "{text}"
    );
    assert!(text.contains("not in this build"), "{text}");
}
