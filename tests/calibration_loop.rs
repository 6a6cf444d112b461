//! The calibration loop end to end on this machine, in its own test binary
//! so that nothing else computes while it measures (cargo runs test binaries
//! one after another): sim → exec → refine → sim.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn easerve(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_easerve"))
        .env(
            "EASERVE_CACHE_DIR",
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("easerve-cache"),
        )
        .args(args)
        .current_dir(root())
        .output()
        .expect("run easerve")
}

fn report(cmd: &str, scenario: &str, args: &[&str]) -> Value {
    let mut all = vec![cmd, scenario, "--json"];
    all.extend_from_slice(args);
    let out = easerve(&all);
    assert!(
        out.status.success(),
        "easerve {all:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON report")
}

fn num(v: &Value, pointer: &str) -> f64 {
    v.pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no number at {pointer}"))
}

/// The calibration loop on this machine: sim → exec → validate → refine →
/// sim, from the scenario's measured profile. Asserted: an unsaturated
/// open-loop run completes at the offered rate in both faces, so throughput
/// agrees within 15 %; `validate` compares the two reports; `refine` folds
/// the measured service times into a profile that loads and names what it
/// folded in, and the refined profile drives the simulator. How close the
/// refined simulation comes is measured, not asserted (README: within 5 % on
/// cpu-audio and cpu-video, worse near saturation): on a shared 2-core host a
/// short run's latencies vary too much for a bound that cannot flake.
/// Held by each loop: two loops timing real models must not share the cores.
static TIMED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn sim_exec_validate_refine_loop_closes(
    scenario: &str,
    profile: &str,
    (requests, rate): (&str, &str),
    validate_rows: &[&str],
) -> (Value, Value) {
    let _timed = TIMED.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let p = root().join(profile);
    let ps = p.to_str().unwrap();
    let args = ["--requests", requests, "--rate", rate, "--profile", ps];
    let sim = report("sim", scenario, &args);
    let run = report("exec", scenario, &args);
    let err = |s: &Value, m: &Value, k: &str| (num(s, k) - num(m, k)) / num(m, k);
    let thr = err(&sim, &run, "/request_throughput");
    assert!(thr.abs() <= 0.15, "throughput error {thr}");
    let write = |name: &str, v: &Value| {
        let f = dir.path().join(name);
        std::fs::write(&f, serde_json::to_string(v).unwrap()).unwrap();
        f.to_str().unwrap().to_string()
    };
    let (s, m) = (write("sim.json", &sim), write("run.json", &run));
    let out = easerve(&["calib", "validate", "--sim", &s, "--measured", &m]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for row in ["throughput (req/s)", "TTFT mean (s)", "TPOT mean (s)"]
        .iter()
        .chain(validate_rows)
    {
        assert!(text.contains(row), "validate lacks {row}: {text}");
    }
    let refined = dir.path().join("refined.toml");
    let rs = refined.to_str().unwrap();
    let out = easerve(&[
        "calib",
        "refine",
        "--profile",
        ps,
        "--sim",
        &s,
        "--measured",
        &m,
        "-o",
        rs,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let show = easerve(&["calib", "show", rs]);
    assert!(show.status.success());
    let shown = String::from_utf8_lossy(&show.stdout);
    for stage in ["encode scaled x", "prefill scaled x", "decode scaled x"] {
        assert!(shown.contains(stage), "provenance lacks `{stage}`: {shown}");
    }
    let sim2 = report(
        "sim",
        scenario,
        &["--requests", requests, "--rate", rate, "--profile", rs],
    );
    assert_eq!(num(&sim2, "/completed"), requests.parse::<f64>().unwrap());
    (run, sim2)
}

#[test]
fn the_loop_closes_on_cpu_audio() {
    sim_exec_validate_refine_loop_closes(
        "scenarios/cpu-audio.toml",
        "scenarios/profiles/tiny-audio.cpu.toml",
        ("40", "4"),
        &["prefill TP1 service mean (s)"],
    );
}

/// The same loop on the mixture-of-experts LLM (`tiny-moe`: router, top-2 of
/// 8 experts and a shared expert in every layer), from its shipped profile,
/// at 1.5 req/s: the test build's executor (`easerve` itself unoptimised)
/// measured a 3x slower encode service than the release build's (132 vs
/// 45 ms) and saturates near the scenario's own 4 req/s on the machine that
/// measured it; on a 2-core VM 30–40 % slower, a run at 2 req/s once took
/// 1.58x the simulated time (2026-12-06), so the rate leaves it headroom.
#[test]
fn the_loop_closes_on_cpu_moe_image() {
    sim_exec_validate_refine_loop_closes(
        "scenarios/cpu-moe-image.toml",
        "scenarios/profiles/tiny-moe.cpu.toml",
        ("30", "1.5"),
        &["decode TP1 service mean (s)"],
    );
}

/// The loop at TP 2 (`1E(TP1)+1P(TP2)+1D(TP2)`: prefill and decode workers of
/// two rank processes each, all-reducing over loopback), from the profile
/// `easerve profile --tp 1,2,4` measured: validate compares the stage times
/// keyed by TP (prefill at TP 1 on the local prefill worker and TP 2 on the
/// remote one, decode at TP 2), and the refined simulation's error against
/// the measured run is printed, not asserted (docs/calibration.md, "Tensor
/// parallelism on the CPU": on a loaded 2-core host it misses the ≤ 5 % mean
/// and ≤ 10 % P99 bound). 16 requests at 0.5 req/s: the test build's TP 2
/// workers saturate near 1 req/s; about 40 s on a 2-core host at load 10.
#[test]
fn the_loop_closes_on_cpu_image_tp2() {
    let (run, sim2) = sim_exec_validate_refine_loop_closes(
        "scenarios/cpu-image-tp2.toml",
        "scenarios/profiles/tiny-image-tp.cpu.toml",
        ("16", "0.5"),
        &[
            "prefill TP1,2 service mean (s)",
            "decode TP2 service mean (s)",
        ],
    );
    for k in ["/ttft/mean", "/ttft/p99", "/tpot/mean", "/tpot/p99"] {
        let e = (num(&sim2, k) - num(&run, k)) / num(&run, k);
        eprintln!("cpu-image-tp2 after refine: {k} error {:+.1} %", 100.0 * e);
    }
}
