//! Time-varying load: rate schedules in a scenario (`[[workload.phases]]`),
//! the per-window report, the rate estimator knob, and the objective HAS
//! ranks by (`--objective`).

use crate::{easerve, root, sim_json};
use std::io::Write;

fn step_with(edit: impl Fn(String) -> String) -> tempfile::NamedTempFile {
    let base = std::fs::read_to_string(root().join("scenarios/demand/image-step.toml")).unwrap();
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    f.write_all(edit(base).as_bytes()).unwrap();
    f
}

/// `easerve ARGS` exits 2, names the file (when given) and every needle, never panics.
fn rejects(args: &[&str], needles: &[&str]) {
    let out = easerve(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    for n in needles {
        assert!(err.contains(n), "message lacks {n:?}: {err}");
    }
}

#[test]
fn bad_phases_exit_2_naming_the_field() {
    let first = "kind = \"constant\"\nduration_s = 600\nrate = 1.0";
    let cases: [(&str, &[&str]); 7] = [
        (
            "kind = \"constant\"\nduration_s = 600\nrate = 1.0\nmedia_share = 1.5",
            &["workload.phases[0].media_share", "[0, 1]"],
        ),
        (
            "kind = \"constant\"\nduration_s = 0\nrate = 1.0",
            &["workload.phases[0].duration_s", "must be > 0"],
        ),
        (
            "kind = \"constant\"\nduration_s = -5\nrate = 1.0",
            &["workload.phases[0].duration_s", "must be > 0"],
        ),
        (
            "kind = \"diurnal\"\nduration_s = 600\nperiod_s = 0\npeak = 2.0\ntrough = 1.0",
            &["workload.phases[0].period_s", "must be > 0"],
        ),
        (
            "kind = \"diurnal\"\nduration_s = 600\nperiod_s = 60\npeak = 1.0\ntrough = 2.0",
            &["workload.phases[0].peak", "below the trough"],
        ),
        (
            "kind = \"sawtooth\"\nduration_s = 600",
            &[
                "workload.phases[0].kind",
                "constant, ramp, diurnal, burst, servegen",
            ],
        ),
        (
            "kind = \"constant\"\nduration_s = 600\nrate = 1.0\nperiod_s = 60",
            &[
                "workload.phases[0].period_s",
                "not used by a `constant` phase",
            ],
        ),
    ];
    for (phase, needles) in cases {
        let f = step_with(|s| s.replacen(first, phase, 1));
        let path = f.path().to_str().unwrap();
        let mut all = needles.to_vec();
        all.push(path);
        rejects(&["sim", path], &all);
    }
    let f = step_with(|s| s.to_string());
    let path = f.path().to_str().unwrap();
    rejects(
        &["sim", path, "--rate-estimator", "ewma:0"],
        &["deployment.rate_estimator", "ewma:30"],
    );
}

#[test]
fn a_scheduled_run_reports_its_windows() {
    let path = root().join("scenarios/demand/image-step.toml");
    let r = sim_json(&path, &["--requests", "800", "--seed", "3"]);
    let ws = r["windows"].as_array().expect("windows");
    let arrived: u64 = ws.iter().map(|w| w["arrived"].as_u64().unwrap()).sum();
    assert_eq!(arrived, 800, "every request lands in one window");
    // the step: 1 req/s in the first 600 s, 1.8 after (30 s windows)
    assert_eq!(ws[0]["offered_rate"].as_f64(), Some(1.0));
    assert!(ws.len() > 20 && ws[20]["offered_rate"].as_f64().unwrap() > 1.79);
    assert_eq!(r, sim_json(&path, &["--requests", "800", "--seed", "3"]));
    // a scenario without phases has no windows
    let plain = sim_json(&root().join("scenarios/image.toml"), &["--requests", "50"]);
    assert!(plain.get("windows").is_none());
}

#[test]
fn the_rate_estimator_knob_changes_the_run_only_when_it_estimates() {
    let path = root().join("scenarios/demand/image-step.toml");
    let args = |e: &'static str| ["--requests", "600", "--rate-estimator", e];
    let window = sim_json(&path, &["--requests", "600"]);
    assert_eq!(
        window,
        sim_json(&path, &args("window")),
        "window is the default"
    );
    let ewma = sim_json(&path, &args("ewma:30"));
    // the EWMA router moves the offload ratio with the rate
    let remote = |r: &serde_json::Value| r["encode"]["remote_fraction"].as_f64();
    assert_ne!(remote(&window), remote(&ewma));
}

#[test]
fn search_ranks_by_the_objective() {
    let study = |obj: &str| {
        let out = easerve(&[
            "search",
            "scenarios/image.toml",
            "--json",
            "--rate",
            "5",
            "--requests",
            "150",
            "--objective",
            obj,
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let best_by = |s: &serde_json::Value, key: &str| {
        let trials = s["trials"].as_array().unwrap();
        let top = trials
            .iter()
            .filter_map(|t| t["outcome"][key].as_f64())
            .fold(f64::NEG_INFINITY, f64::max);
        (s["best"]["outcome"][key].as_f64().unwrap(), top)
    };
    let g = study("goodput:moderate");
    assert_eq!(g["objective"], "goodput:moderate");
    let (chosen, top) = best_by(&g, "slo_goodput");
    assert_eq!(chosen, top, "the chosen trial has the highest goodput");
    let t = study("throughput");
    assert_eq!(t["objective"], "throughput");
    assert!(t["best"]["outcome"].get("slo_goodput").is_none());
    let (chosen, top) = best_by(&t, "throughput");
    assert_eq!(chosen, top, "the chosen trial has the highest throughput");
    rejects(
        &["search", "scenarios/image.toml", "--objective", "latency"],
        &[
            "--objective latency",
            "unknown objective",
            "goodput:TIER",
            "throughput, ttft",
        ],
    );
    rejects(
        &[
            "search",
            "scenarios/image.toml",
            "--objective",
            "goodput:gold",
        ],
        &["no SLO tier `gold`", "moderate"],
    );
    rejects(
        &[
            "capacity",
            "scenarios/image.toml",
            "--slo",
            "moderate",
            "--objective",
            "fast",
        ],
        &["--objective fast", "unknown objective"],
    );
}

#[test]
fn bad_planner_input_exits_2_naming_the_field() {
    let day = root().join("scenarios/demand/image-day-plan.toml");
    let day = day.to_str().unwrap();
    rejects(
        &["sim", day, "--planner", "oracle"],
        &["planner.policy", "--planner", "static, load, twin"],
    );
    // a dwell shorter than a model load (Yi-34B at TP2 over PCIe 4: 1.4 s)
    let f =
        step_with(|s| format!("{s}\n[planner]\npolicy = \"load\"\nwindow_s = 30\ndwell_s = 0.5\n"));
    let path = f.path().to_str().unwrap();
    rejects(
        &["sim", path],
        &[path, "planner.dwell_s", "shorter than a model load"],
    );
    // a planner that moves workers needs EPD workers
    rejects(
        &["sim", day, "--planner", "load", "--system", "aggregated"],
        &["planner.policy", "easerve and passthrough"],
    );
    // measured load times: three positive seconds, and not beside a bandwidth
    rejects(
        &["sim", day, "--set", "planner.load_s=[0.5, 0.5]"],
        &["planner.load_s", "three positive seconds"],
    );
    rejects(
        &["sim", day, "--set", "planner.load_s=[0.5, -1, 0.5]"],
        &["planner.load_s", "three positive seconds"],
    );
    let both = ["planner.load_s=[1, 2, 2]", "planner.load_bandwidth_gbs=25"];
    rejects(
        &["sim", day, "--set", both[0], "--set", both[1]],
        &["planner.load_s", "not both"],
    );
    rejects(
        &["sim", day, "--set", "planner.queue_signal=often"],
        &["planner.queue_signal", "end", "mean"],
    );
    // busy thresholds: both or neither, 0 ≤ down < up ≤ 1
    rejects(
        &["sim", day, "--set", "planner.busy_up=0.5"],
        &["planner.busy_down", "required with `planner.busy_up`"],
    );
    rejects(
        &["sim", day, "--set", "planner.busy_down=0.2"],
        &["planner.busy_up", "required with `planner.busy_down`"],
    );
    let over = ["planner.busy_up=1.5", "planner.busy_down=0.2"];
    rejects(
        &["sim", day, "--set", over[0], "--set", over[1]],
        &["planner.busy_up", "(0, 1)"],
    );
    let never = ["planner.busy_up=1", "planner.busy_down=0.2"];
    rejects(
        &["sim", day, "--set", never[0], "--set", never[1]],
        &["planner.busy_up", "(0, 1)"],
    );
    let crossed = ["planner.busy_up=0.3", "planner.busy_down=0.4"];
    rejects(
        &["sim", day, "--set", crossed[0], "--set", crossed[1]],
        &["planner.busy_down", "[0, busy_up = 0.3)"],
    );
}

#[test]
fn measured_load_times_replace_the_derived_ones() {
    // 300 requests of the image day, well under a second
    let day = root().join("scenarios/demand/image-day-plan.toml");
    let args = ["--requests", "300", "--planner", "load"];
    let derived = sim_json(&day, &args);
    let mut with = args.to_vec();
    with.extend(["--set", "planner.load_s=[1.5, 2.5, 3.5]"]);
    let measured = sim_json(&day, &with);
    let (d, m) = (&derived["planner"], &measured["planner"]);
    assert_eq!(m["load_s"], serde_json::json!([1.5, 2.5, 3.5]));
    assert_ne!(d["load_s"], m["load_s"]);
    assert!(m["load_source"].as_str().unwrap().contains("measured"));
    assert!(d["load_source"].as_str().unwrap().contains("GB/s"));
}

#[test]
fn a_planner_run_reports_gpu_hours_changes_and_decisions() {
    // the image day's first 1200 requests (about 20 minutes), 2 s to run
    let day = root().join("scenarios/demand/image-day-plan.toml");
    let args = |p: &'static str| ["--requests", "1200", "--planner", p];
    let fixed = sim_json(&day, &args("static"));
    let load = sim_json(&day, &args("load"));
    let p = &load["planner"];
    assert_eq!(p["policy"], "load");
    let (gh_fixed, gh_load) = (
        fixed["planner"]["gpu_hours"].as_f64().unwrap(),
        p["gpu_hours"].as_f64().unwrap(),
    );
    // static holds all 16 GPUs until the last finish; the load rule drains
    // two decode workers in the first, quiet windows
    let end = fixed["duration_s"].as_f64().unwrap();
    assert!(
        (gh_fixed - 16.0 * end / 3600.0).abs() < 0.05,
        "{gh_fixed} vs {end}"
    );
    assert!(gh_load < gh_fixed, "{gh_load} vs {gh_fixed}");
    let changes = p["changes"].as_array().unwrap();
    assert!(changes
        .iter()
        .any(|c| c["from"] == "D2" && c["stopped_at"].is_f64()));
    let decisions = p["decisions"].as_array().unwrap();
    assert!(decisions.len() >= 7, "one per 150 s window");
    assert!(decisions[0]["stages"][2]["active"].as_u64() == Some(3));
    assert_eq!(p["goodput_per_gpu_hour"].as_array().unwrap().len(), 5);
    // no request is lost to a change
    assert_eq!(load["completed"], 1200);
    // without [planner] and --planner the report has no planner section
    let plain = sim_json(
        &root().join("scenarios/demand/image-day.toml"),
        &["--requests", "100"],
    );
    assert!(plain.get("planner").is_none());
    assert_eq!(load, sim_json(&day, &args("load")), "same seed, same run");
    // the text report lists each change, a set of `s` as `set s = 0.600 (at
    // once)` (the rendering's unit test: `report.rs`), never in Rust's Debug
    let out = easerve(&[
        "sim",
        day.to_str().unwrap(),
        "--requests",
        "1200",
        "--planner",
        "load",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let offloads = changes
        .iter()
        .filter(|c| c["change"].get("SetOffload").is_some())
        .count();
    assert_eq!(text.matches("set s = ").count(), offloads, "{text}");
    let listed = text.lines().filter(|l| l.starts_with("  at ")).count();
    assert_eq!(listed, changes.len(), "{text}");
    assert!(text.contains("remove D2 ("), "{text}");
    assert!(
        !text.contains("SetOffload") && !text.contains("SetBatch"),
        "{text}"
    );
}

/// `calib validate --per-window` compares two runs of a schedule window by
/// window: a `load`-planner run of `cpu-image-phases.toml` against itself
/// agrees (every window 0 %, the same changes, exit 0); against the
/// `static` run (no changes) it exits 1 under `--max-error`, naming the
/// changes that differ. About 1 s in the debug build.
#[test]
fn per_window_validation_compares_ttft_and_changes_by_phase() {
    let dir = tempfile::tempdir().unwrap();
    let sc = root().join("scenarios/demand/cpu-image-phases.toml");
    let run = |planner: &str, name: &str| {
        let out = easerve(&["sim", sc.to_str().unwrap(), "--planner", planner, "--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = dir.path().join(name);
        std::fs::write(&path, &out.stdout).unwrap();
        path
    };
    let (load, stat) = (run("load", "load.json"), run("static", "static.json"));
    let validate = |sim: &std::path::Path, measured: &std::path::Path| {
        easerve(&[
            "calib",
            "validate",
            "--per-window",
            "--sim",
            sim.to_str().unwrap(),
            "--measured",
            measured.to_str().unwrap(),
            "--max-error",
            "0.1",
        ])
    };
    let same = validate(&load, &load);
    let text = String::from_utf8_lossy(&same.stdout);
    assert_eq!(same.status.code(), Some(0), "{text}");
    assert_eq!(text.matches("+0.0 %").count(), 3, "three phases: {text}");
    assert!(
        text.contains("worker changes, sim: ") && !text.contains("sim: 0 "),
        "{text}"
    );
    let differ = validate(&stat, &load);
    let err = String::from_utf8_lossy(&differ.stderr);
    assert_eq!(differ.status.code(), Some(1), "{err}");
    assert!(err.contains("worker changes differ"), "{err}");
}

/// `cpu-image-surge.toml`: a surge of 4.5 req/s that the deployment
/// serves once a prefill worker is added, with a 15 s dwell. On the shipped
/// profile (a faster host than the one the file is tuned on) the rule on
/// the queue at each window's end makes one worker change per phase —
/// drain the spare decode worker, start a prefill worker, drain it — 15 s
/// apart at least, and none once the run is over (as `exec`, which stops
/// with its last request); the rule on the window's mean queue (the file's own,
/// `planner.queue_signal = "mean"`) drains the decode worker only, the
/// surge's prefill queue averaging under 0.5 per worker there, and its
/// decisions carry that mean. Every request completes in both.
#[test]
fn a_surge_below_capacity_moves_workers_by_the_queue_signal() {
    let sc = root().join("scenarios/demand/cpu-image-surge.toml");
    let workers = |r: &serde_json::Value| -> Vec<(String, String, f64)> {
        r["planner"]["changes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["from"].is_string() || c["to"].is_string())
            .map(|c| {
                let name = |k: &str| c[k].as_str().unwrap_or("-").to_string();
                (name("from"), name("to"), c["at"].as_f64().unwrap())
            })
            .collect()
    };
    let kinds = |w: &[(String, String, f64)]| -> Vec<(String, String)> {
        w.iter().map(|(f, t, _)| (f.clone(), t.clone())).collect()
    };
    let pair = |f: &str, t: &str| (f.to_string(), t.to_string());
    // the file's 112 requests are the schedule's expected count; this draw
    // brings 124 within its 45 s, so they end (39.9 s) before the window
    // at 40 s (the first the 15 s dwell leaves open after the start at
    // 25 s), which is then not decided; the draw's 124 last the schedule
    let end = sim_json(
        &sc,
        &["--set", "planner.queue_signal=end", "--requests", "124"],
    );
    let w = workers(&end);
    assert_eq!(
        kinds(&w),
        [pair("D1", "-"), pair("-", "P1"), pair("P1", "-")],
        "{w:?}"
    );
    // the dwell keeps them 15 s apart at least
    assert!(w.windows(2).all(|w| w[1].2 - w[0].2 >= 15.0 - 1e-9));
    let cut = sim_json(&sc, &["--set", "planner.queue_signal=end"]);
    let w = workers(&cut);
    assert_eq!(kinds(&w), [pair("D1", "-"), pair("-", "P1")], "{w:?}");
    let last = cut["planner"]["decisions"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["at"]
        .as_f64()
        .unwrap();
    // windows every 5 s: 35 s is the last the run reaches
    assert_eq!(last, 35.0, "the last window decided");
    let mean = sim_json(&sc, &[]);
    assert_eq!(kinds(&workers(&mean)), [pair("D1", "-")]);
    let has_mean = |r: &serde_json::Value| {
        r["planner"]["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["stages"][1]["queue_mean_per_worker"].is_f64())
    };
    assert!(has_mean(&mean) && !has_mean(&end));
    assert_eq!(end["completed"], 124);
    assert_eq!(cut["completed"], 112);
    assert_eq!(mean["completed"], 112);
}

/// `cpu-image-busy.toml`: the surge's prefill load itself moves workers.
/// On the shipped profile (a faster host than the 2-core VM the file's
/// thresholds were set on) prefill is busy 0.49 of the surge's first
/// window, under the file's `busy_up` of 0.5, and only the spare decode
/// worker goes; with `busy_up` 0.35 and `busy_down` 0.2 the rule makes one
/// change per phase — drain the decode worker, start a prefill worker at
/// 20 s, drain it at 35 s — and the queue thresholds alone make only the
/// first. Decisions record the busy fraction the rule read.
#[test]
fn busy_thresholds_move_a_prefill_worker_through_the_surge() {
    let sc = root().join("scenarios/demand/cpu-image-busy.toml");
    let moves = |r: &serde_json::Value| -> Vec<(String, String, f64)> {
        (r["planner"]["changes"].as_array().unwrap().iter())
            .filter(|c| c["from"].is_string() || c["to"].is_string())
            .map(|c| {
                let name = |k: &str| c[k].as_str().unwrap_or("-").to_string();
                (name("from"), name("to"), c["at"].as_f64().unwrap())
            })
            .collect()
    };
    let as_is = sim_json(&sc, &[]);
    let busy_at_20 = as_is["planner"]["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["at"] == 20.0)
        .unwrap()["stages"][1]["busy"]
        .as_f64()
        .unwrap();
    assert!((0.35..0.5).contains(&busy_at_20), "{busy_at_20}");
    let d1 = ("D1".to_string(), "-".to_string(), 5.0);
    assert_eq!(moves(&as_is), std::slice::from_ref(&d1));
    let low = ["planner.busy_up=0.35", "planner.busy_down=0.2"];
    let lowered = sim_json(&sc, &["--set", low[0], "--set", low[1]]);
    assert_eq!(
        moves(&lowered),
        [
            d1.clone(),
            ("-".into(), "P1".into(), 20.0),
            ("P1".into(), "-".into(), 35.0)
        ]
    );
    assert_eq!(lowered["completed"], 112);
    // the queue thresholds alone (a file without the busy pair)
    let text = std::fs::read_to_string(&sc).unwrap();
    let profile = root().join("scenarios/profiles/tiny-image.cpu.toml");
    let queue_only = text
        .replace("busy_up = 0.5\nbusy_down = 0.3\n", "")
        .replace(
            "\"../profiles/tiny-image.cpu.toml\"",
            &format!("{:?}", profile.to_str().unwrap()),
        );
    assert!(!queue_only.contains("\nbusy_up =") && !queue_only.contains("\"../profiles"));
    let mut f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    f.write_all(queue_only.as_bytes()).unwrap();
    let q = sim_json(
        f.path(),
        &["--set", low[0], "--set", "planner.busy_down=0.2"],
    );
    assert_eq!(moves(&q), moves(&lowered), "given again by --set");
    let q = sim_json(f.path(), &[]);
    assert_eq!(moves(&q), [d1]);
}
