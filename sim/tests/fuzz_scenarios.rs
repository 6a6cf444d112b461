//! Fuzzing the scenario files in-process, as a careless or hostile user would
//! write them: the shipped scenarios with keys deleted, values of the wrong
//! type, extreme and non-finite numbers, huge and empty strings and
//! mismatched allocations. Each case goes through the same steps as
//! `easerve sim` (parse, validate, simulate) and must end either in a clean
//! validation error naming the file and the field, or in a report whose every
//! number is finite (or absent where the report says why) and whose requests
//! are all accounted for. Runs are sized down (at most 24 requests of at most
//! 64 output tokens) and each must finish within a generous bound.
//!
//! The cases are the same on every run (one seed, like the simulator's):
//! `EASERVE_FUZZ_CASES` sets their number (default 1500) and
//! `EASERVE_FUZZ_SEED` the seed (default 2026) to explore others.

use easerve_workload::scenario::{Scenario, ScenarioFile};
use proptest::prelude::*;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;
use toml::Value;

/// The shipped scenarios the mutations start from.
const BASES: [&str; 7] = [
    "image.toml",
    "video.toml",
    "audio.toml",
    "cpu-image.toml",
    "cpu-audio.toml",
    "custom-video.toml",
    "azure-conv.toml",
];

/// Report fields that may be absent (by the end of their JSON path), each
/// with its reason in the report's docs: a stage no GPU runs, no batcher, a
/// batcher parameter of another dispatch policy, a single stage, no encode GPU.
const MAY_BE_NULL: [&str; 8] = [
    ".busy_fraction",
    ".encode.batcher",
    ".batcher.q",
    ".batcher.max_age_s",
    ".batcher.timeout_s",
    ".batcher.queue_length",
    ".lead",
    ".encode_gpu_idle",
];

/// Longest a sized-down case may take (a hang guard, not a speed goal).
const CASE_LIMIT: Duration = Duration::from_secs(60);

fn scenarios() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios")
}

#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

/// Every leaf of a TOML document (scalars and empty containers), by path.
fn leaves(v: &Value, path: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    match v {
        Value::Table(t) if !t.is_empty() => {
            for (k, x) in t {
                path.push(Step::Key(k.clone()));
                leaves(x, path, out);
                path.pop();
            }
        }
        Value::Array(a) if !a.is_empty() => {
            for (i, x) in a.iter().enumerate() {
                path.push(Step::Index(i));
                leaves(x, path, out);
                path.pop();
            }
        }
        _ => out.push(path.clone()),
    }
}

/// What a mutation does at a path.
#[derive(Clone, Debug)]
enum Mutation {
    Delete,
    Set(Value),
}

fn apply(doc: &mut Value, path: &[Step], m: &Mutation) {
    let Some((last, parent_path)) = path.split_last() else {
        return;
    };
    let mut parent = doc;
    for s in parent_path {
        parent = match (s, parent) {
            (Step::Key(k), Value::Table(t)) => match t.get_mut(k) {
                Some(x) => x,
                None => return,
            },
            (Step::Index(i), Value::Array(a)) => match a.get_mut(*i) {
                Some(x) => x,
                None => return,
            },
            _ => return,
        };
    }
    match (last, parent, m) {
        (Step::Key(k), Value::Table(t), Mutation::Delete) => {
            t.remove(k);
        }
        (Step::Key(k), Value::Table(t), Mutation::Set(v)) => {
            t.insert(k.clone(), v.clone());
        }
        (Step::Index(i), Value::Array(a), Mutation::Delete) if *i < a.len() => {
            a.remove(*i);
        }
        (Step::Index(i), Value::Array(a), Mutation::Set(v)) if *i < a.len() => {
            a[*i] = v.clone();
        }
        _ => {}
    }
}

fn values() -> impl Strategy<Value = Value> {
    let ints = prop_oneof![
        Just(0i64),
        Just(-1),
        Just(1),
        Just(2),
        Just(7),
        Just(4096),
        Just(4097),
        Just(i64::MAX),
        Just(i64::MIN),
        -100i64..100_000,
    ]
    .prop_map(Value::Integer);
    let floats = prop_oneof![
        Just(0.0f64),
        Just(-0.0),
        Just(1.0),
        Just(0.5),
        Just(-1.0),
        Just(1e308),
        Just(-1e308),
        Just(5e-324),
        Just(1e-160),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        -1e6f64..1e6,
    ]
    .prop_map(Value::Float);
    let strings = prop_oneof![
        Just(String::new()),
        Just("x".repeat(10_000)),
        Just("a/b".to_string()),
        Just("poisson-gap".to_string()),
        Just("fixed-timeout:1e308".to_string()),
        Just("queue-length:0".to_string()),
        Just("static:1.5".to_string()),
        Just("windowed:0".to_string()),
        Just("gamma".to_string()),
        Just("passthrough".to_string()),
        Just("aggregated".to_string()),
        Just("roofline".to_string()),
        "[0-9]{1,2}E\\(TP[0-9]\\)\\+[0-9]{1,2}P\\(TP[0-9]\\)\\+[0-9]D\\(TP[0-9]\\)",
        "[0-9]{1,2}P\\(TP[0-9]{1,2}\\)\\+[0-9]{1,2}D\\(TP[0-9]{1,2}\\)",
        "\\PC{0,12}",
    ]
    .prop_map(Value::String);
    prop_oneof![
        4 => ints,
        4 => floats,
        3 => strings,
        1 => any::<bool>().prop_map(Value::Boolean),
        1 => Just(Value::Array(Vec::new())),
        1 => Just(Value::Table(Default::default())),
    ]
}

fn mutation() -> impl Strategy<Value = (usize, Mutation)> {
    (
        any::<usize>(),
        prop_oneof![
            1 => Just(Mutation::Delete),
            4 => values().prop_map(Mutation::Set),
        ],
    )
}

/// Every number of the report's JSON is present unless it may be absent;
/// `at` is the JSON path so far.
fn check_numbers(v: &serde_json::Value, at: &str) -> Result<(), String> {
    match v {
        serde_json::Value::Null if !MAY_BE_NULL.iter().any(|k| at.ends_with(k)) => {
            Err(format!("{at} is null (a non-finite number?)"))
        }
        serde_json::Value::Object(m) => m
            .iter()
            .try_for_each(|(k, x)| check_numbers(x, &format!("{at}.{k}"))),
        serde_json::Value::Array(a) => a
            .iter()
            .enumerate()
            .try_for_each(|(i, x)| check_numbers(x, &format!("{at}[{i}]"))),
        _ => Ok(()),
    }
}

/// One case: parse, validate, size down, simulate, check.
fn run_case(base: &str, text: String) -> Result<(), TestCaseError> {
    let path = scenarios().join(base);
    let file = path.display().to_string();
    let raw = match ScenarioFile::parse(&text, &file) {
        Ok(raw) => raw,
        Err(e) => {
            prop_assert!(e.to_string().contains(&file), "error without the file: {e}");
            return Ok(());
        }
    };
    let mut sc = match Scenario::validate(raw, &file, "fuzz") {
        Ok(sc) => sc,
        Err(e) => {
            let msg = e.to_string();
            prop_assert!(msg.contains(&file), "error without the file: {msg}");
            prop_assert!(!e.field.is_empty(), "error without a field: {msg}");
            return Ok(());
        }
    };
    sc.workload.requests = sc.workload.requests.min(24);
    sc.workload.output_len = sc.workload.output_len.min(64);
    // the encode policies price every batch size up to B when the run starts
    sc.deployment.max_batch = sc.deployment.max_batch.min(64);
    let offered = sc.workload.requests;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let out = easerve_sim::simulate(&sc);
        let _ = tx.send(out.report);
    });
    let report = match rx.recv_timeout(CASE_LIMIT) {
        Ok(r) => r,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            return Err(TestCaseError::fail(format!(
                "the sized-down run took over {CASE_LIMIT:?}"
            )))
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            return Err(TestCaseError::fail("the simulation panicked"))
        }
    };
    prop_assert_eq!(
        report.completed + report.rejected + report.failed,
        offered,
        "requests unaccounted for"
    );
    let json = serde_json::to_value(&report).expect("a report serialises");
    check_numbers(&json, "report").map_err(TestCaseError::fail)?;
    Ok(())
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: env_or("EASERVE_FUZZ_CASES", 1500),
        rng_seed: proptest::test_runner::RngSeed::Fixed(env_or("EASERVE_FUZZ_SEED", 2026)),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn mutated_scenarios_fail_cleanly_or_run_and_account_for_every_request(
        base in 0..BASES.len(),
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        let name = BASES[base];
        let text = std::fs::read_to_string(scenarios().join(name)).expect("a shipped scenario");
        let mut doc: Value = toml::from_str(&text).expect("shipped scenarios parse");
        for (pick, m) in &mutations {
            let mut all = Vec::new();
            leaves(&doc, &mut Vec::new(), &mut all);
            if all.is_empty() {
                break;
            }
            let path = &all[pick % all.len()];
            apply(&mut doc, path, m);
        }
        // a document toml cannot write (a NaN key, say) is not a case
        let Ok(mutated) = toml::to_string(&doc) else {
            return Ok(());
        };
        run_case(name, mutated)?;
    }
}
