//! `easerve sweep`: outputs, their series, and sharding.

use crate::easerve;
use std::path::Path;

fn sweep(out: &Path, extra: &[&str]) {
    let o = out.to_str().unwrap();
    let mut args = vec![
        "sweep",
        "scenarios/image.toml",
        "--rates",
        "1:5:1",
        "--systems",
        "passthrough,aggregated,easerve",
        "--seeds",
        "2",
        "--requests",
        "150",
        "--out",
        o,
    ];
    args.extend_from_slice(extra);
    let r = easerve(&args);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
}

#[test]
fn sweep_writes_csv_and_svgs_with_the_expected_series() {
    let dir = tempfile::tempdir().unwrap();
    sweep(dir.path(), &[]);
    let csv = std::fs::read_to_string(dir.path().join("sweep.csv")).unwrap();
    assert_eq!(
        csv.lines().count(),
        1 + 3 * 5,
        "header + 3 systems × 5 rates"
    );
    for file in [
        "goodput-strict.svg",
        "goodput-relaxed.svg",
        "p99-ttft.svg",
        "p99-tpot.svg",
        "ttft-cdf.svg",
        "throughput.svg",
    ] {
        let text = std::fs::read_to_string(dir.path().join(file)).unwrap();
        let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let texts: Vec<&str> = doc.descendants().filter_map(|n| n.text()).collect();
        for series in ["passthrough", "aggregated", "easerve"] {
            assert!(
                texts.iter().any(|t| t.trim() == series),
                "{file} lacks series {series}"
            );
        }
        assert!(
            texts
                .iter()
                .any(|t| t.contains("req/s") || t.contains("(s)")),
            "{file} lacks units"
        );
    }
    for (file, names) in [
        (
            "busy-timeline-passthrough.svg",
            vec!["E0 encode", "E1 encode", "P0 prefill", "D0 decode"],
        ),
        ("has-progress.svg", vec!["has", "random", "coordinate"]),
    ] {
        let text = std::fs::read_to_string(dir.path().join(file)).unwrap();
        let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        let texts: Vec<&str> = doc
            .descendants()
            .filter_map(|n| n.text())
            .map(str::trim)
            .collect();
        for n in names {
            assert!(texts.contains(&n), "{file} lacks series {n}");
        }
    }
}

#[test]
fn shards_merged_equal_the_unsharded_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole");
    sweep(&whole, &[]);
    let (p0, p1) = (dir.path().join("p0.json"), dir.path().join("p1.json"));
    sweep(&p0, &["--shard", "0/2"]);
    sweep(&p1, &["--shard", "1/2"]);
    let merged = dir.path().join("merged");
    let r = easerve(&[
        "sweep",
        "merge",
        p0.to_str().unwrap(),
        p1.to_str().unwrap(),
        "--out",
        merged.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    for file in [
        "sweep.json",
        "sweep.csv",
        "goodput-moderate.svg",
        "p99-ttft.svg",
        "ttft-cdf.svg",
        "busy-timeline-passthrough.svg",
        "busy-timeline-aggregated.svg",
        "busy-timeline-easerve.svg",
        "has-progress.svg",
    ] {
        assert!(
            std::fs::read(whole.join(file)).unwrap() == std::fs::read(merged.join(file)).unwrap(),
            "{file} differs between the sharded and the whole sweep"
        );
    }
    // a missing part is refused
    let r = easerve(&[
        "sweep",
        "merge",
        p0.to_str().unwrap(),
        "--out",
        merged.to_str().unwrap(),
    ]);
    assert_eq!(r.status.code(), Some(2));
}

#[test]
fn bad_sweep_input_exits_2() {
    for extra in [
        vec!["--rates", "5:1:1"],
        vec!["--rates", "a,b"],
        vec!["--systems", "vllm"],
        vec!["--shard", "2/2"],
        vec!["--set", "cluster.gpu=gtx-480"],
        vec!["--set", "nonsense"],
    ] {
        let mut args = vec![
            "sweep",
            "scenarios/image.toml",
            "--out",
            "/tmp/never-written",
        ];
        args.extend_from_slice(&extra);
        let r = easerve(&args);
        assert_eq!(
            r.status.code(),
            Some(2),
            "{extra:?}: {}",
            String::from_utf8_lossy(&r.stderr)
        );
    }
}

/// `--set` of a knob works with every system: one that chooses the knob
/// itself runs as it would and names the field in its row's `ignored`.
#[test]
fn set_works_with_every_system_and_rows_name_what_a_system_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("what-if");
    let r = easerve(&[
        "sweep",
        "scenarios/video.toml",
        "--rates",
        "2",
        "--requests",
        "20",
        "--seeds",
        "1",
        "--set",
        "deployment.batch=4,8",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let csv = std::fs::read_to_string(out.join("sweep.csv")).unwrap();
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let header = reader.headers().unwrap().clone();
    assert_eq!(header.iter().next_back(), Some("ignored"), "{csv}");
    let mut seen = 0;
    for rec in reader.records() {
        let rec = rec.unwrap();
        let (system, ignored) = (&rec[1], rec.iter().next_back().unwrap());
        let want = if system == "easerve-s1" {
            ""
        } else {
            "deployment.batch"
        };
        assert_eq!(ignored, want, "{system}: {rec:?}");
        if system == "easerve-s1" {
            // the one system that runs the scenario's B ran each value
            let deployment = &rec[rec.len() - 2];
            assert!(
                deployment.contains("B=4") || deployment.contains("B=8"),
                "{rec:?}"
            );
        }
        seen += 1;
    }
    assert_eq!(seen, 8, "2 variants × 4 systems: {csv}");
}

/// `--systems` takes the two EPD baselines, each configured by its own rule
/// at each point; a `--set` of a knob they choose themselves is named in
/// the rows' `ignored` column.
#[test]
fn sweep_compares_the_epd_baselines() {
    let dir = tempfile::tempdir().unwrap();
    let o = dir.path().to_str().unwrap();
    let r = easerve(&[
        "sweep",
        "scenarios/image.toml",
        "--rates",
        "2,4",
        "--systems",
        "epd-serve,hydrainfer",
        "--seeds",
        "1",
        "--requests",
        "40",
        "--set",
        "deployment.batch=4",
        "--out",
        o,
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let csv = std::fs::read_to_string(dir.path().join("sweep.csv")).unwrap();
    for system in ["epd-serve", "hydrainfer"] {
        let rows: Vec<&str> = csv
            .lines()
            .filter(|l| l.contains(&format!(",\"{system}\",")))
            .collect();
        assert_eq!(rows.len(), 2, "{system}: {csv}");
        assert!(rows.iter().all(|l| l.contains("deployment.batch")), "{csv}");
    }
}

/// A sweep's first seed is the scenario's own, so `--seeds 1` at the
/// scenario's rate runs what `sim` runs, and the sweep prints its table and
/// names the seeds. Found in the second newcomer pass (issue 36): sweeps ran
/// seeds 1–3 while the scenario says 42, so their goodput differed from
/// `sim`'s for the same deployment.
#[test]
fn a_sweeps_first_seed_is_the_scenarios_and_its_table_is_printed() {
    let dir = tempfile::tempdir().unwrap();
    let r = easerve(&[
        "sweep",
        "scenarios/image.toml",
        "--systems",
        "aggregated",
        "--seeds",
        "2",
        "--requests",
        "60",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let stdout = String::from_utf8_lossy(&r.stdout);
    assert!(stdout.contains("medians over seeds 42, 43"), "{stdout}");
    assert!(stdout.contains("(seeds 42, 43)"), "{stdout}");
    let part: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("sweep.json")).unwrap())
            .unwrap();
    let first = &part["rows"][0];
    assert_eq!(first["seed"], 42);
    let sim = crate::sim_json(
        &crate::root().join("scenarios/image.toml"),
        &["--system", "aggregated", "--requests", "60"],
    );
    assert_eq!(first["throughput"], sim["request_throughput"]);
    assert_eq!(first["goodput"][2], sim["goodput"][2]["goodput"]);
    // the table's row shows the median of the two seeds' throughputs
    let thr = |i: usize| part["rows"][i]["throughput"].as_f64().unwrap();
    let row = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("aggregated"))
        .unwrap_or_else(|| panic!("no row: {stdout}"));
    let median = format!("{:.3}", (thr(0) + thr(1)) / 2.0);
    assert_eq!(
        row.split_whitespace().nth(1),
        Some(median.as_str()),
        "{row}"
    );
}
