//! `easerve reproduce`: the paper's findings re-run in simulation.

use crate::easerve;

#[test]
fn reproduce_reports_every_finding_with_a_verdict_and_plots() {
    let dir = tempfile::tempdir().unwrap();
    let out = easerve(&[
        "reproduce",
        "--out",
        dir.path().to_str().unwrap(),
        "--requests",
        "150",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md = std::fs::read_to_string(dir.path().join("report.md")).unwrap();
    for n in 1..=5 {
        let section = md
            .split(&format!("## Finding {n}:"))
            .nth(1)
            .unwrap_or_else(|| panic!("no finding {n}"));
        let section = section.split("## ").next().unwrap();
        assert!(
            section.contains("**agrees**") || section.contains("**disagrees**"),
            "finding {n} has no verdict"
        );
        assert!(
            section.chars().any(|c| c.is_ascii_digit()),
            "finding {n} has no numbers"
        );
    }
    // the constants the report states come from each scenario's cost model
    let costs = md
        .split("## Cost sources")
        .nth(1)
        .expect("a cost-sources section")
        .split("## Goodput")
        .next()
        .unwrap();
    for m in ["image", "video", "audio"] {
        assert!(
            costs.contains(&format!("| {m} |")),
            "no encode terms for {m}"
        );
    }
    assert_eq!(costs.matches("- encode: ").count(), 3, "{costs}");
    assert_eq!(costs.matches("- co-location: ").count(), 3, "{costs}");
    for m in ["image", "video", "audio"] {
        for f in [
            "goodput-moderate.svg",
            "throughput.svg",
            "p99-ttft.svg",
            "sweep.csv",
        ] {
            assert!(dir.path().join(m).join(f).exists(), "{m}/{f} missing");
        }
    }
}
