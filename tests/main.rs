//! End-to-end tests of the `easerve` command line and cross-crate behaviour.
//! One integration-test binary (modules below).

mod bad_input;
#[cfg(feature = "bench")]
mod bench_cli;
mod capacity_cli;
mod cluster_groups;
mod demand_cli;
mod deploy_cli;
mod drivers_agree;
mod exec_agree;
#[cfg(feature = "exec")]
mod exec_cli;
mod fuzz_cli;
#[cfg(feature = "exec")]
mod fuzz_http;
mod hardening;
mod hardening_inputs;
mod model_cli;
mod plots_render;
#[cfg(feature = "exec")]
mod profile_cli;
mod readme_commands;
mod reproduce_cli;
mod search_cli;
#[cfg(feature = "exec")]
mod serve_abuse;
#[cfg(feature = "exec")]
mod serve_cli;
mod sim_cli;
#[cfg(feature = "exec")]
mod supervision_cli;
mod sweep_cli;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Held by every test that times real models (`profile`, `exec`): their
/// measurements are only meaningful when they do not share the cores.
#[cfg(feature = "exec")]
pub static TIMED: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Take [`TIMED`] (a failed test holding it does not block the others).
#[cfg(feature = "exec")]
pub fn timed() -> std::sync::MutexGuard<'static, ()> {
    TIMED.lock().unwrap_or_else(|p| p.into_inner())
}

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The kernel-grid cache the tests' `easerve` processes use
/// (`$EASERVE_CACHE_DIR`): under the build's temporary folder, so a test run never
/// reads or writes the user's own cache.
pub fn test_cache_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("easerve-cache")
}

/// The `easerve` binary as a command, with [`test_cache_dir`] as its cache.
pub fn easerve_command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_easerve"));
    c.env("EASERVE_CACHE_DIR", test_cache_dir());
    c
}

/// Run `easerve` with `args` from the repository root.
pub fn easerve(args: &[&str]) -> Output {
    easerve_command()
        .args(args)
        .current_dir(root())
        .output()
        .expect("run easerve")
}

/// `easerve sim SCENARIO --json ARGS...` parsed; panics with stderr on failure.
pub fn sim_json(scenario: &Path, args: &[&str]) -> Value {
    report_json("sim", scenario, args)
}

/// `easerve CMD SCENARIO --json ARGS...` (`sim`, `exec`, `capacity`, …)
/// parsed; panics with stderr on failure.
pub fn report_json(cmd: &str, scenario: &Path, args: &[&str]) -> Value {
    let s = scenario.to_str().expect("utf-8 path");
    let mut all = vec![cmd, s, "--json"];
    all.extend_from_slice(args);
    let out = easerve(&all);
    assert!(
        out.status.success(),
        "easerve {all:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON report")
}

/// A field of the report as f64, by JSON pointer.
pub fn num(v: &Value, pointer: &str) -> f64 {
    v.pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no number at {pointer}"))
}

/// Mean queueing time of a stage, seconds.
pub fn stage_queue(v: &Value, stage: &str) -> f64 {
    v["stages"]
        .as_array()
        .expect("stages")
        .iter()
        .find(|s| s["stage"] == stage)
        .map(|s| num(s, "/queue/mean"))
        .unwrap_or_else(|| panic!("no stage {stage}"))
}

/// aiconfigurator's kernel tables where the CLI finds them
/// (`$EASERVE_AICONFIGURATOR_DIR`, else `../shared/data/aiconfigurator`;
/// third-party data: tests that need them skip without it).
pub fn kernel_dir() -> Option<PathBuf> {
    easerve_calib::aic::find_data_dir().filter(|d| d.join("data").is_dir())
}

/// Whether [`kernel_dir`] found the tables.
pub fn kernel_data() -> bool {
    kernel_dir().is_some()
}

/// A copy of the paper scenario `name` in `dir` whose `cluster.kernels` is
/// `mode`, so a test can price it from the roofline whether or not the kernel
/// tables are present.
pub fn scenario_with_kernels(dir: &Path, name: &str, mode: &str) -> PathBuf {
    let text = std::fs::read_to_string(root().join(format!("scenarios/{name}.toml"))).unwrap();
    assert!(
        text.contains("kernels = \"auto\""),
        "{name}.toml names its kernels"
    );
    let out = dir.join(format!("{name}-{mode}.toml"));
    std::fs::write(
        &out,
        text.replace("kernels = \"auto\"", &format!("kernels = \"{mode}\"")),
    )
    .unwrap();
    out
}
