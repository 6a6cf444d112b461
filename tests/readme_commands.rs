//! Every shell command of `README.md`, of every page under `docs/` and of
//! `scenarios/README.md`, run as written (on small sizes) in a temporary
//! folder, in the order a reader meets them ([`PAGES`]: the README, then its
//! docs pages in the order of its contents): a command that reads an earlier
//! one's output finds it there.
//!
//! How a command is run:
//! * `cargo run --release [--features exec|bench] --` becomes the binary under test
//!   (any other command must be in [`NOT_RUN`] with its reason); the line runs
//!   in `bash` with the block's earlier variable assignments (`M=audio`), so
//!   redirections and `$M` work as in a terminal;
//! * sizes are cut so that the whole README runs in about a minute
//!   ([`SMALL`]): `--requests 24` where a subcommand takes it, one seed per
//!   sweep point, the profiler's `--quick` grid with one timed run;
//! * the folder holds `scenarios/` and `model/` (links to the repository's) and
//!   `calib/preprocess/`; `../shared/data` is the repository's neighbour, and
//!   a command that needs it is skipped, saying so, when it is absent;
//! * every command must exit 0, except `calib validate`, whose exit 1 means "an
//!   error above `--max-error`" (a measured verdict, not a broken command).
//!
//! Blocks with `--features exec` run only in a build with the executor (the
//! second pass of `.ci/run`); the others run in both. Commands this test does
//! not run are in [`NOT_RUN`], with the reason.

use crate::root;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Commands (by prefix) this test does not run, and why. The README marks
/// each of them.
const NOT_RUN: &[(&str, &str)] = &[
    (
        "scripts/sweep-scale-out",
        "a measurement, not a check: two 10,000-point sweeps (about a minute of CPU); sweep_cli's shards_merged_equal_the_unsharded_sweep checks shards against the whole sweep",
    ),
    (
        "scripts/demand-agree",
        "a study, not a check: builds the release executor and runs profile, exec and two simulations (about 2 min on an idle host); demand_cli's per-window test checks its comparison",
    ),
    (
        "target/release/easerve calib validate --per-window --sim DIR_A",
        "compares two folders of scripts/demand-agree runs (DIR_A, DIR_B), which that study writes; demand_cli's per-window test checks calib validate --per-window",
    ),
    (
        "scripts/calib-loop",
        "a study, not a check: builds the release executor and runs profile (minutes at --tp 1,2,4), exec and two simulations; calibration_loop's tests run the same loop",
    ),
    (
        "cargo run --release --features bench -- bench",
        "needs a running OpenAI-compatible server; tests/bench_cli.rs runs it against a loopback one",
    ),
    (
        "cargo run --release --features exec -- bench",
        "needs the running server of the serve example; tests/serve_cli.rs benches one",
    ),
    (
        "cargo test",
        "the test command itself (CI runs it; `cargo test -p easerve-calib fidelity` is part of it)",
    ),
    (
        "python3 calib/preprocess/measure.py",
        "installs PyTorch (about 2 GB) into its own virtual environment; its result is committed as calib/preprocess/measured-python.toml",
    ),
    (
        "easerve sweep",
        "a cluster job-array example (Slurm, Kubernetes); sweep_cli's shard tests run the same --shard and merge",
    ),
    (
        "cargo run --release --features exec -- serve",
        "a server that runs until SIGTERM; tests/serve_cli.rs starts one on loopback, queries it and stops it",
    ),
    (
        "printf '{\"model\": \"tiny-image\", \"max_tokens\": 8,",
        "writes the request of the serve example, which needs the server",
    ),
    (
        "curl -sN http://127.0.0.1:8000/v1/chat/completions",
        "needs the running server of the serve example; tests/serve_cli.rs sends the same requests",
    ),
    (
        "kill -TERM %1",
        "stops the server of the serve example; tests/serve_cli.rs does the same by PID",
    ),
    (
        "cargo run --release -- calib validate --sim sim.json --measured bench.json",
        "compares with the serve example's bench.json, which needs the server; tests/serve_cli.rs refines from one",
    ),
    (
        "scripts/gpu-check --out gpu-check-out",
        "needs an NVIDIA GPU and driver; its dry run is the next line's command, which .ci/run runs",
    ),
    (
        "scripts/gpu-check --dry-run",
        ".ci/run runs it (as `--dry-run --debug`) after the executor's tests, whose build it reuses",
    ),
    (
        "cargo run --release -- calib refine --profile scenarios/profiles/tiny-image.cpu.toml --sim sim.json",
        "refines from the serve example's bench.json, which needs the server; tests/serve_cli.rs does it",
    ),
    (
        "parallel easerve",
        "needs GNU parallel; sweep_cli's shard tests run the same --shard and merge",
    ),
];

/// Extra arguments per subcommand, appended unless the command gives the flag
/// itself: `(subcommand, flag, arguments)`.
const SMALL: &[(&str, &str, &str)] = &[
    ("sim", "--requests", "--requests 24"),
    ("exec", "--requests", "--requests 24"),
    ("search", "--requests", "--requests 24"),
    ("sweep", "--requests", "--requests 24"),
    ("sweep", "--seeds", "--seeds 1"),
    ("reproduce", "--requests", "--requests 24"),
    ("capacity", "--requests", "--requests 24"),
    ("deploy", "--requests", "--requests 24"),
    ("profile", "--quick", "--quick --repetitions 1 --warmup 0"),
    ("calib measure-preprocess", "--reps", "--reps 1"),
];

/// One ```sh block: its first line in the file and its commands (continuation
/// lines joined, comments dropped).
struct Block {
    file: &'static str,
    line: usize,
    commands: Vec<String>,
}

fn blocks(file: &'static str) -> Vec<Block> {
    let text = std::fs::read_to_string(root().join(file)).expect("README readable");
    let mut out = Vec::new();
    let mut current: Option<Block> = None;
    let mut pending = String::new();
    for (i, line) in text.lines().enumerate() {
        match (&mut current, line.trim_start()) {
            (None, "```sh") => {
                current = Some(Block {
                    file,
                    line: i + 1,
                    commands: Vec::new(),
                });
            }
            (Some(_), "```") => {
                assert!(
                    pending.is_empty(),
                    "{file}:{}: a block ends inside a continued line",
                    i + 1
                );
                out.push(current.take().expect("in a block"));
            }
            (Some(b), l) => {
                let code = strip_comment(l);
                if let Some(head) = code.strip_suffix('\\') {
                    pending.push_str(head.trim_end());
                    pending.push(' ');
                    continue;
                }
                pending.push_str(code.trim());
                let cmd = std::mem::take(&mut pending);
                if !cmd.trim().is_empty() {
                    b.commands.push(cmd.trim().to_string());
                }
            }
            (None, _) => {}
        }
    }
    assert!(current.is_none(), "{file}: a ```sh block is not closed");
    out
}

/// `line` without a trailing `# comment` (a `#` that starts a word outside
/// quotes).
fn strip_comment(line: &str) -> &str {
    let (mut single, mut double) = (false, false);
    let bytes = line.as_bytes();
    for (i, &c) in bytes.iter().enumerate() {
        match c {
            b'\'' if !double => single = !single,
            b'"' if !single => double = !double,
            b'#' if !single && !double && (i == 0 || bytes[i - 1].is_ascii_whitespace()) => {
                return line[..i].trim_end();
            }
            _ => {}
        }
    }
    line
}

/// The command with the binary under test in place of `cargo run …` or
/// `easerve`, or `None` when it is not an easerve command.
fn as_binary(cmd: &str, exe: &str) -> Option<String> {
    for prefix in [
        "cargo run --release --features exec -- ",
        "cargo run --release --features bench -- ",
        "cargo run --release -- ",
    ] {
        if let Some(rest) = cmd.strip_prefix(prefix) {
            return Some(format!("{exe} {rest}"));
        }
    }
    None
}

/// `cmd` (its binary already replaced, `rest` the part after it) with the
/// small sizes of [`SMALL`] appended before any redirection.
fn small(rest: &str) -> String {
    let (args, redirect) = match rest.find(" >") {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let words: Vec<&str> = args.split_whitespace().collect();
    let sub = match words.as_slice() {
        ["calib", s, ..] => format!("calib {s}"),
        [s, ..] => s.to_string(),
        [] => String::new(),
    };
    let mut out = args.to_string();
    for (which, flag, extra) in SMALL {
        if *which == sub && !words.contains(flag) {
            out.push(' ');
            out.push_str(extra);
        }
    }
    out + redirect
}

/// The pages whose blocks run in one folder, in the order a reader meets
/// them: the README, then the docs pages in the order of its contents.
const PAGES: &[&str] = &[
    "README.md",
    "docs/build.md",
    "docs/sim.md",
    "docs/report.md",
    "docs/search-and-deploy.md",
    "docs/capacity.md",
    "docs/sweeps.md",
    "docs/demand.md",
    "docs/reuse.md",
    "docs/baselines.md",
    "docs/calibration.md",
    "docs/kernels.md",
    "docs/gpu.md",
    "docs/serve-and-bench.md",
    "docs/json.md",
    "docs/speed.md",
    "docs/datacenter.md",
];

/// Run every block of `files`, in order, in one folder; returns how many
/// commands ran in each file.
fn run_blocks(files: &[&'static str]) -> Vec<usize> {
    let exe = env!("CARGO_BIN_EXE_easerve");
    let with_exec = cfg!(feature = "exec");
    let dir = tempfile::tempdir().expect("temp dir");
    let work = dir.path();
    std::os::unix::fs::symlink(root().join("scenarios"), work.join("scenarios")).unwrap();
    std::os::unix::fs::symlink(root().join("model"), work.join("model")).unwrap();
    std::fs::create_dir_all(work.join("calib/preprocess")).unwrap();
    let shared: PathBuf = root().join("../shared/data");
    let mut counts = Vec::new();
    for file in files {
        counts.push(run_file(file, &shared, work, exe, with_exec));
    }
    counts
}

/// Run every block of `file` in `work`; returns how many commands ran.
fn run_file(file: &'static str, shared: &Path, work: &Path, exe: &str, with_exec: bool) -> usize {
    let mut ran = 0;
    for b in blocks(file) {
        let needs_exec = b.commands.iter().any(|c| c.contains("--features exec"));
        if needs_exec && !with_exec {
            eprintln!(
                "{}:{}: not run in this build: needs the executor (the `exec` feature; .ci/run's second pass runs it)",
                b.file, b.line
            );
            continue;
        }
        let mut vars = String::new();
        for cmd in &b.commands {
            if let Some((_, why)) = NOT_RUN.iter().find(|(p, _)| cmd.starts_with(p)) {
                eprintln!("{}:{}: not run: `{cmd}`: {why}", b.file, b.line);
                continue;
            }
            if is_assignment(cmd) {
                vars.push_str(cmd);
                vars.push('\n');
                continue;
            }
            let Some(line) = as_binary(cmd, "") else {
                panic!(
                    "{}:{}: `{cmd}` is neither an easerve command nor listed in NOT_RUN with a reason",
                    b.file, b.line
                );
            };
            if line.contains("../shared/data") && !shared.is_dir() {
                eprintln!(
                    "{}:{}: skipped `{cmd}`: {} is absent (third-party data)",
                    b.file,
                    b.line,
                    shared.display()
                );
                continue;
            }
            let line = small(&line).replace("../shared/data", &shared.display().to_string());
            run_one(&b, cmd, &format!("{vars}\"$EASERVE\"{line}"), exe, work);
            ran += 1;
        }
    }
    eprintln!("{file}: {ran} commands ran");
    ran
}

/// `NAME=value` alone on its line (not `NAME=value command …`).
fn is_assignment(cmd: &str) -> bool {
    !cmd.contains(char::is_whitespace)
        && cmd.split_once('=').is_some_and(|(name, _)| {
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

fn run_one(b: &Block, cmd: &str, script: &str, exe: &str, work: &Path) {
    let start = std::time::Instant::now();
    let out = Command::new("bash")
        .args(["-e", "-o", "pipefail", "-c", script])
        .env("EASERVE", exe)
        .env("EASERVE_CACHE_DIR", crate::test_cache_dir())
        .current_dir(work)
        .output()
        .expect("bash runs");
    let code = out.status.code();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // `calib validate` exits 1 with its verdict table when an error is above
    // --max-error; an internal error (also 1) prints no table
    let verdict = cmd.contains(" calib validate ") && !out.stdout.is_empty();
    let ok = code == Some(0) || (verdict && code == Some(1));
    assert!(
        ok && !stderr.contains("panicked"),
        "{}:{}: `{cmd}` (run as `{script}`) exited {code:?}:\n{stderr}",
        b.file,
        b.line
    );
    eprintln!(
        "{}:{}: ok in {:.1} s: {cmd}",
        b.file,
        b.line,
        start.elapsed().as_secs_f64()
    );
}

#[test]
fn every_readme_and_docs_command_runs_as_written() {
    // the count catches a page whose blocks the reader misses: the README
    // has 5 commands that run without the executor, the docs pages 12 more
    // (fewer when ../shared/data is absent)
    let ran = run_blocks(PAGES);
    eprintln!(
        "commands run per page: {:?}",
        PAGES.iter().zip(&ran).collect::<Vec<_>>()
    );
    assert!(ran[0] >= 5, "only {} README commands ran", ran[0]);
    let total: usize = ran.iter().sum();
    assert!(
        total >= 16,
        "only {total} commands ran in the README and docs/"
    );
}

/// Every page under `docs/` is run by the test above and linked from the
/// README's contents.
#[test]
fn every_docs_page_is_run_and_linked() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut pages: Vec<String> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| format!("docs/{}", e.unwrap().file_name().to_string_lossy()))
        .filter(|p| p.ends_with(".md"))
        .collect();
    pages.sort();
    assert!(pages.len() >= 10, "{pages:?}");
    for p in &pages {
        assert!(
            PAGES.contains(&p.as_str()),
            "{p} is not in PAGES, so its commands never run"
        );
        assert!(
            readme.contains(&format!("]({p})")),
            "README's contents do not link {p}"
        );
    }
}

#[test]
fn every_scenarios_readme_command_runs_as_written() {
    assert_eq!(run_blocks(&["scenarios/README.md"]), vec![2]);
}

#[test]
fn the_command_reader_joins_lines_drops_comments_and_cuts_sizes() {
    assert_eq!(strip_comment("a 'b # c' # d"), "a 'b # c'");
    assert_eq!(strip_comment("--out x   # about a minute"), "--out x");
    assert_eq!(
        small(" sim scenarios/x.toml --json > sim.json"),
        " sim scenarios/x.toml --json --requests 24 > sim.json"
    );
    assert_eq!(
        small(" sweep s.toml --seeds 1 --out o"),
        " sweep s.toml --seeds 1 --out o --requests 24"
    );
    assert_eq!(
        small(" calib measure-preprocess -o f"),
        " calib measure-preprocess -o f --reps 1"
    );
    assert_eq!(
        as_binary("cargo run --release --features exec -- exec a", "E"),
        Some("E exec a".into())
    );
    assert_eq!(as_binary("python3 x", "E"), None);
    assert!(is_assignment("M=audio"));
    assert!(!is_assignment("M=audio cargo run --release -- sim x"));
    assert!(!is_assignment("cargo run --release -- sim --set a=b"));
    assert_eq!(
        as_binary("cargo run --release --features bench -- bench x", "E"),
        Some("E bench x".into())
    );
    let readme = blocks("README.md");
    assert!(readme.iter().any(|b| b
        .commands
        .iter()
        .any(|c| c.contains("--allocation '4E(TP1)+1P(TP2)+1D(TP2)' --seed 7"))));
}
