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
    // Table 5: every comparison on both platforms has a verdict on the
    // ordering and on the ratio, and a driving term
    let t5 = md
        .split("## Table 5:")
        .nth(1)
        .expect("a Table 5 section")
        .split("\n## ")
        .next()
        .unwrap();
    for platform in ["RTX 6000 Ada", "A100"] {
        for baseline in ["epd-serve", "hydrainfer"] {
            let row = t5
                .lines()
                .find(|l| l.contains(platform) && l.contains(&format!("easerve / {baseline}")))
                .unwrap_or_else(|| panic!("no verdict for {baseline} on {platform}"));
            let verdicts = row.matches("**agrees**").count() + row.matches("**disagrees**").count();
            assert_eq!(verdicts, 2, "{row}");
            assert!(row.contains(" load "), "no driving term: {row}");
        }
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
