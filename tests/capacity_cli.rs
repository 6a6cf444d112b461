//! `easerve capacity`: the answer is a bracket the probes support, a probe is
//! exactly `easerve sim` at that rate, and bad goals exit 2.

use crate::{easerve, num, report_json, root, sim_json};
use serde_json::Value;

fn capacity_json(args: &[&str]) -> Value {
    let mut all = vec!["--requests", "120"];
    all.extend_from_slice(args);
    report_json("capacity", &root().join("scenarios/image.toml"), &all)
}

#[test]
fn the_highest_rate_meets_and_the_bracket_above_it_fails() {
    let v = capacity_json(&["--slo", "moderate", "--tolerance", "0.05", "--as-is"]);
    let ans = &v["answer"];
    let rate = num(ans, "/rate");
    let hi = num(ans, "/fails_at");
    assert!(
        hi > rate && hi / rate <= 1.05 + 1e-12,
        "bracket [{rate}, {hi}]"
    );
    let probes = ans["probes"].as_array().expect("probes");
    let at = |r: f64| {
        probes
            .iter()
            .find(|p| num(p, "/rate") == r)
            .unwrap_or_else(|| panic!("no probe at {r}"))
    };
    assert_eq!(at(rate)["meets"], true);
    assert_eq!(at(hi)["meets"], false);
    // the probe is one `easerve sim` run at that rate: same goodput, exactly
    let sim = sim_json(
        &root().join("scenarios/image.toml"),
        &["--rate", &rate.to_string(), "--requests", "120"],
    );
    let tier = sim["goodput"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "moderate")
        .unwrap();
    assert_eq!(num(tier, "/goodput"), num(at(rate), "/goodput"));
    assert!(num(at(rate), "/ratio") >= 0.9);
}

#[test]
fn fewest_gpus_is_an_answer_even_when_none_suffices() {
    let out = easerve(&[
        "capacity",
        "scenarios/image.toml",
        "--slo",
        "moderate",
        "--target-rate",
        "50",
        "--max-gpus",
        "4",
        "--requests",
        "60",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("not reachable with up to 4 GPUs"), "{text}");
    assert!(text.contains("no allocation fits 1, 2, 3 GPU(s)"), "{text}");
    let v = capacity_json(&["--slo", "relaxed", "--target-rate", "1", "--max-gpus", "8"]);
    let found = &v["answer"]["found"];
    assert_eq!(found["meets"], true);
    // every smaller size that fits was probed and failed
    for p in v["answer"]["probes"].as_array().unwrap() {
        if num(p, "/gpus") < num(found, "/gpus") {
            assert_eq!(p["meets"], false);
        }
    }
}

#[test]
fn bad_goals_exit_2_naming_what_is_allowed() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--slo", "nope"],
            "its tiers: strict, tight, moderate, loose, relaxed",
        ),
        (&["--slo", "moderate", "--attain", "0"], "(0, 1]"),
        (&["--slo", "moderate", "--attain", "1.5"], "(0, 1]"),
        (
            &["--slo", "moderate", "--target-rate", "-1"],
            "--target-rate",
        ),
        (&["--slo", "moderate", "--tolerance", "0"], "--tolerance"),
        (
            &[
                "--slo",
                "moderate",
                "--gpus",
                "h100-sxm",
                "--cost-per-gpu-hour",
                "h100-sxm=2",
            ],
            "give a price for the scenario's own GPU `rtx-6000-ada`",
        ),
        (
            &[
                "--slo",
                "moderate",
                "--gpus",
                "h100-sxm",
                "--cost-per-gpu-hour",
                "h100-sxm=x",
            ],
            "TYPE=PRICE",
        ),
    ];
    for (args, want) in cases {
        let mut all = vec!["capacity", "scenarios/image.toml", "--requests", "40"];
        all.extend_from_slice(args);
        let out = easerve(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{all:?}: {err}");
        assert!(err.contains(want), "{all:?}: {err}");
    }
}

#[test]
fn a_tier_no_rate_meets_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(root().join("scenarios/image.toml")).unwrap();
    let path = dir.path().join("strict.toml");
    // the strict tier tightened far below any zero-load TTFT
    let tightened = text.replacen(
        "name = \"strict\"\nttft_s = ",
        "name = \"strict\"\nttft_s = 0.000001 # ",
        1,
    );
    assert_ne!(
        tightened, text,
        "image.toml's strict tier starts with ttft_s"
    );
    std::fs::write(&path, tightened).unwrap();
    let out = easerve(&[
        "capacity",
        path.to_str().unwrap(),
        "--slo",
        "strict",
        "--requests",
        "40",
        "--as-is",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("is not met") && err.contains("TTFT ≤ 0.000001 s"),
        "{err}"
    );
}

#[test]
fn gpu_types_compare_at_equal_count_and_equal_cost() {
    let v = capacity_json(&[
        "--slo",
        "moderate",
        "--tolerance",
        "0.1",
        "--gpus",
        "a100-sxm4-80gb",
        "--cost-per-gpu-hour",
        "a100-sxm4-80gb=2,rtx-6000-ada=1",
    ]);
    let rows = v["comparison"].as_array().expect("rows");
    let row = |gpu: &str, basis: &str| {
        rows.iter()
            .find(|r| r["gpu"] == gpu && r["basis"] == basis)
            .unwrap_or_else(|| panic!("no {gpu} {basis} row in {rows:?}"))
    };
    // the scenario's own type is the baseline; 8 RTX at 1/h buy 4 A100 at 2/h
    assert_eq!(rows[0]["gpu"], "rtx-6000-ada");
    assert_eq!(num(row("rtx-6000-ada", "equal count"), "/gpus"), 8.0);
    assert_eq!(num(row("a100-sxm4-80gb", "equal count"), "/gpus"), 8.0);
    let cost = row("a100-sxm4-80gb", "equal cost");
    assert_eq!(num(cost, "/gpus"), 4.0);
    assert_eq!(num(cost, "/answer/gpus"), 4.0);
    // every answer is a tuned probe that met the goal
    for r in rows {
        let ans = &r["answer"];
        let rate = num(ans, "/rate");
        let met = ans["probes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| num(p, "/rate") == rate && p["meets"] == true);
        assert!(met, "{r}");
    }
}

#[test]
fn tuning_with_has_never_does_worse_than_the_fixed_deployment_here() {
    let fixed = capacity_json(&["--slo", "moderate", "--tolerance", "0.1", "--as-is"]);
    assert_eq!(fixed["tuning"], "fixed");
    let tuned = capacity_json(&["--slo", "moderate", "--tolerance", "0.1"]);
    assert_eq!(tuned["tuning"], "has", "HAS at each probe is the default");
    assert!(
        num(&tuned, "/answer/rate") >= num(&fixed, "/answer/rate"),
        "tuned {} < fixed {}",
        num(&tuned, "/answer/rate"),
        num(&fixed, "/answer/rate")
    );
}
