//! Fuzzing the newer commands' flags and input files, as the scenario fuzzer
//! (`sim/tests/fuzz_scenarios.rs`) does the scenario files: each case runs one
//! of `capacity`, `deploy`, `search --emit`, `bench`, `calib
//! import-aiconfigurator`, `calib validate`, `calib refine` and `reproduce` on
//! small sizes with one flag's value replaced by a hostile one (empty,
//! negative, huge, not a number, a device, an unwritable path, a long
//! string). Every case must end in time with exit 0, or exit 2 and a message
//! on stderr (`calib validate --max-error` may exit 1, as documented), never a
//! panic, a signal or a hang.
//!
//! The cases are the same on every run: `EASERVE_FUZZ_CLI_CASES` sets their
//! number (default 60) and `EASERVE_FUZZ_CLI_SEED` the seed (default 2026).

use crate::{easerve_command, root};
use rand::{Rng, SeedableRng};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Longest a case may take (a hang guard, not a speed goal).
const CASE_LIMIT: Duration = Duration::from_secs(120);

/// Values a careless or hostile user puts in a flag.
const HOSTILE: &[&str] = &[
    "",
    "0",
    "-1",
    "1e308",
    "NaN",
    "inf",
    "abc",
    "/dev/zero",
    "/dev/full",
    "18446744073709551615",
    "h100-sxm,",
    "2026-02-30",
    "{(256, 256, 1): 1e308}",
    "{(256, 256, 1): 1e308, (512, 512, 1): 1e308}",
    " x y ",
];

/// A command on small sizes, `{out}` standing for a fresh temporary folder,
/// and the flags whose values a case may replace.
struct Template {
    args: &'static [&'static str],
    flags: &'static [&'static str],
}

const TEMPLATES: &[Template] = &[
    Template {
        args: &[
            "capacity",
            "scenarios/cpu-image.toml",
            "--slo",
            "loose",
            "--requests",
            "20",
            "--as-is",
        ],
        flags: &["--slo", "--requests", "--attain", "--tolerance", "--seed"],
    },
    Template {
        args: &[
            "capacity",
            "scenarios/cpu-image.toml",
            "--slo",
            "loose",
            "--requests",
            "20",
            "--target-rate",
            "2",
            "--max-gpus",
            "6",
        ],
        flags: &["--target-rate", "--max-gpus"],
    },
    Template {
        args: &[
            "deploy",
            "scenarios/image.toml",
            "--requests",
            "20",
            "--emit",
            "{out}",
        ],
        flags: &["--requests", "--emit", "--seed", "--deployment"],
    },
    Template {
        args: &[
            "search",
            "scenarios/audio.toml",
            "--requests",
            "20",
            "--budget",
            "3",
            "--emit",
            "{out}",
        ],
        flags: &[
            "--requests",
            "--budget",
            "--rate",
            "--emit",
            "--method",
            "--seed",
        ],
    },
    Template {
        args: &[
            "bench",
            "--base-url",
            "http://127.0.0.1:1",
            "--model",
            "m",
            "--num-prompts",
            "2",
            "--random-input-len",
            "4",
            "--random-output-len",
            "2",
            "--timeout",
            "5",
        ],
        flags: &[
            "--model",
            "--endpoint",
            "--num-prompts",
            "--random-output-len",
            "--random-range-ratio",
            "--random-mm-bucket-config",
            "--request-rate",
            "--burstiness",
            "--requests-csv",
            "--timeout",
        ],
    },
    Template {
        args: &[
            "calib",
            "import-aiconfigurator",
            "../shared/data/aiconfigurator",
            "--gpu",
            "h100-sxm",
            "--model",
            "qwen2.5-vl-32b",
            "-o",
            "{out}/p.toml",
        ],
        flags: &[
            "--gpu",
            "--model",
            "--date",
            "--version",
            "--dtype",
            "--system",
            "-o",
        ],
    },
    Template {
        args: &[
            "calib",
            "validate",
            "--sim",
            "tests/golden/video-40.json",
            "--measured",
            "tests/golden/video-40-roofline.json",
        ],
        flags: &["--sim", "--measured", "--max-error"],
    },
    Template {
        args: &[
            "calib",
            "refine",
            "--profile",
            "scenarios/profiles/tiny-image.cpu.toml",
            "--measured-csv",
            "tests/golden/video-40.json",
            "--encoder-tokens",
            "195",
            "-o",
            "{out}/r.toml",
        ],
        flags: &[
            "--profile",
            "--measured-csv",
            "--encoder-tokens",
            "--items-per-request",
            "-o",
        ],
    },
    Template {
        args: &[
            "reproduce",
            "--scenarios",
            "scenarios/.",
            "--requests",
            "10",
            "--out",
            "{out}",
        ],
        flags: &["--requests", "--out"],
    },
];

/// `args` with `flag`'s value set to `value` (the flag added when absent).
fn with_flag(args: &[String], flag: &str, value: &str) -> Vec<String> {
    let mut out = args.to_vec();
    match out.iter().position(|a| a == flag) {
        Some(i) if i + 1 < out.len() => out[i + 1] = value.to_string(),
        _ => {
            out.push(flag.to_string());
            out.push(value.to_string());
        }
    }
    out
}

#[test]
fn newer_commands_survive_hostile_flags() {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let cases = env("EASERVE_FUZZ_CLI_CASES", 60);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(env("EASERVE_FUZZ_CLI_SEED", 2026));
    let long = "x".repeat(5000);
    for case in 0..cases {
        let t = &TEMPLATES[rng.gen_range(0..TEMPLATES.len())];
        let flag = t.flags[rng.gen_range(0..t.flags.len())];
        let value = match rng.gen_range(0..=HOSTILE.len()) {
            i if i == HOSTILE.len() => long.as_str(),
            i => HOSTILE[i],
        };
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        // files of the checkout by absolute path: the case runs in its own
        // folder, so a hostile output path lands there, not in the checkout
        let base: Vec<String> = t
            .args
            .iter()
            .map(|a| {
                if a.starts_with("scenarios/") || a.starts_with("tests/") || a.starts_with("../") {
                    root().join(a).display().to_string()
                } else {
                    a.replace("{out}", out.to_str().unwrap())
                }
            })
            .collect();
        let args = with_flag(&base, flag, value);
        let shown = format!("case {case}: easerve {}", args.join(" "));
        let started = Instant::now();
        let mut cmd = easerve_command();
        if let Some(d) = easerve_calib::aic::find_data_dir() {
            // the checkout's kernel tables, found from its folder
            cmd.env(
                "EASERVE_AICONFIGURATOR_DIR",
                std::fs::canonicalize(d).unwrap(),
            );
        }
        let mut child = cmd
            .args(&args)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if started.elapsed() > CASE_LIMIT {
                let _ = child.kill();
                panic!("{shown}: still running after {CASE_LIMIT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let err = {
            use std::io::Read;
            let mut s = String::new();
            child.stderr.take().unwrap().read_to_string(&mut s).unwrap();
            s
        };
        assert!(!err.contains("panicked"), "{shown}: panic: {err}");
        let code = status
            .code()
            .unwrap_or_else(|| panic!("{shown}: killed by a signal: {err}"));
        let allowed_1 = args.iter().any(|a| a == "--max-error");
        assert!(
            code == 0 || code == 2 || (code == 1 && allowed_1),
            "{shown}: exit {code}: {err}"
        );
        if code == 2 {
            assert!(!err.trim().is_empty(), "{shown}: exit 2 without a message");
        }
    }
}
