//! `easerve exec` end to end on the CPU: a small real run, a worker killed
//! mid-run, and an overloaded run with admission control. Each run starts
//! real worker processes with the tiny presets and takes seconds.

use crate::{easerve, num, root};
use serde_json::Value;

fn exec_json(args: &[&str]) -> Value {
    crate::report_json("exec", &root().join("scenarios/cpu-audio.toml"), args)
}

#[test]
fn exec_runs_a_scenario_and_reports_like_sim() {
    let _timed = crate::timed();
    let args = ["--requests", "12", "--rate", "4"];
    let r = exec_json(&args);
    assert_eq!(r["measured"], true);
    assert_eq!(num(&r, "/completed"), 12.0);
    assert!(num(&r, "/ttft/mean") > 0.0 && num(&r, "/tpot/mean") > 0.0);
    assert!(num(&r, "/encode/passes") >= 1.0);
    // the same report type as the simulator's: same fields, same stages
    let s = crate::sim_json(&root().join("scenarios/cpu-audio.toml"), &args);
    let keys = |v: &Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.retain(|k| k != "measured" && k != "events");
        k.sort();
        k
    };
    let mut sim_keys = keys(&s);
    sim_keys.retain(|k| k != "explanation");
    let mut exec_keys = keys(&r);
    exec_keys.retain(|k| k != "explanation");
    assert_eq!(sim_keys, exec_keys);
    let stages = |v: &Value| -> Vec<String> {
        v["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["stage"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(stages(&s), stages(&r));
    // one bottleneck rule: the same stage named for the same deployment,
    // workload and rate, and the same load ratios behind it
    assert_eq!(
        s["bottleneck"], r["bottleneck"],
        "{}",
        r["bottleneck_reason"]
    );
    assert_eq!(s["explanation"]["loads"], r["explanation"]["loads"]);
    // the text layout too
    let out = easerve(&[
        "exec",
        "scenarios/cpu-audio.toml",
        "--requests",
        "3",
        "--rate",
        "4",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Serving Benchmark Result (measured)"),
        "{text}"
    );
    for line in [
        "Mean TTFT (ms):",
        "Mean TPOT (ms):",
        "Stages (ms)",
        "Bottleneck stage:",
    ] {
        assert!(text.contains(line), "missing {line}: {text}");
    }
}

#[test]
fn a_killed_worker_fails_its_requests_and_the_run_still_reports() {
    let _timed = crate::timed();
    let r = exec_json(&["--requests", "40", "--rate", "8", "--kill-worker", "E0@1.5"]);
    let completed = num(&r, "/completed");
    let failed = num(&r, "/failed");
    assert!(failed >= 1.0, "nothing failed: {r}");
    assert_eq!(completed + failed, 40.0, "every request is accounted for");
    let reasons: Vec<&str> = r["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["reason"].as_str().unwrap())
        .collect();
    assert!(
        reasons.iter().any(|x| x.contains("E0")),
        "reasons name the worker: {reasons:?}"
    );
    // detected within 1 s of the kill
    let note = r["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .find(|n| n.contains("after the kill"))
        .unwrap_or_else(|| panic!("no detection note: {r}"));
    let ms: f64 = note
        .split("detected ")
        .nth(1)
        .and_then(|s| s.split(" ms").next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("unparsable note: {note}"));
    assert!(ms < 1000.0, "detection took {ms} ms: {note}");
}

#[test]
fn overload_is_bounded_by_admission_control() {
    let _timed = crate::timed();
    let r = exec_json(&[
        "--requests",
        "120",
        "--rate",
        "200",
        "--admission-limit",
        "6",
    ]);
    let (completed, rejected) = (num(&r, "/completed"), num(&r, "/rejected"));
    assert!(rejected > 0.0, "nothing rejected at 200 req/s: {r}");
    assert!(completed >= 6.0, "admitted requests complete: {r}");
    assert_eq!(completed + rejected, 120.0);
    // the queue never held more than the limit: encode queueing stays below
    // 6 passes' worth of the longest pass
    let q = crate::stage_queue(&r, "encode");
    let s_p99 = r["stages"][0]["service"]["p99"].as_f64().unwrap();
    assert!(
        q <= 6.0 * s_p99 + 0.5,
        "encode queueing {q} s with passes of {s_p99} s"
    );
}

#[test]
fn exec_refuses_what_it_cannot_run() {
    // a real-size model on the CPU: refused (its ranks' cores or its memory)
    let out = easerve(&["exec", "scenarios/image.toml"]);
    assert_eq!(out.status.code(), Some(2));
    // TP that does not split tiny-image's 4 heads, 2 KV heads (on
    // cpu-image-tp2 with room for 8 "GPUs", so the allocations fit the
    // cluster): the scenario's validation refuses it before the executor's
    // own check (which adds the MLP width and an MoE's TP1)
    let dir = tempfile::tempdir().unwrap();
    let wide = dir.path().join("wide.toml");
    let profile = root().join("scenarios/profiles/tiny-image-tp.cpu.toml");
    let text = std::fs::read_to_string(root().join("scenarios/cpu-image-tp2.toml"))
        .unwrap()
        .replace("gpus = 5", "gpus = 8")
        .replace("profiles/tiny-image-tp.cpu.toml", profile.to_str().unwrap());
    std::fs::write(&wide, text).unwrap();
    let refused = |alloc: &str, want: &str| {
        let out = easerve(&["exec", wide.to_str().unwrap(), "--allocation", alloc]);
        assert_eq!(out.status.code(), Some(2), "{alloc}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{alloc}: {err}");
        assert!(err.contains("deployment.allocation"), "{alloc}: {err}");
    };
    refused(
        "1E(TP1)+1P(TP3)+1D(TP1)",
        "prefill at TP3 does not split tiny-image's 4 attention heads and 2 KV heads (a serving engine refuses a TP that does not divide the heads; KV heads are replicated when TP is a multiple of them); allowed TP up to the cluster's 8 GPUs: [1, 2, 4]",
    );
    // the encoder's TP: tiny-image's CLIP tower has 4 heads, MLP 1024; and
    // no encode TP beside local prefill workers (cpu-image-tp2's offload 0.8)
    refused(
        "1E(TP3)+1P(TP1)+1D(TP1)",
        "this model's encoder: TP [1, 2, 4]): use 3E(TP1) instead of 1E(TP3)",
    );
    refused(
        "1E(TP2)+1P(TP1)+1D(TP1)",
        "deployment.offload 0.8 < 1 (local prefill at TP 1",
    );
    // more ranks than cores: one rank per core (CI's host has 2)
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 4 {
        refused(
            "1E(TP1)+1P(TP1)+1D(TP4)",
            "decode worker at TP 4 runs 4 rank processes",
        );
    }
    let out = easerve(&["exec", "scenarios/cpu-audio.toml", "--device", "tpu"]);
    assert_eq!(out.status.code(), Some(2));
    let out = easerve(&["exec", "scenarios/cpu-audio.toml", "--admission-limit", "0"]);
    assert_eq!(out.status.code(), Some(2));
    let out = easerve(&["exec", "scenarios/cpu-audio.toml", "--kill-worker", "X9"]);
    assert_eq!(out.status.code(), Some(2));
    let out = easerve(&["exec", "scenarios/cpu-audio.toml", "--kill-worker", "E7@1"]);
    assert_eq!(out.status.code(), Some(2));
    // the MPS split: a share in (0, 1), a GPU shared with a local prefill
    // worker, on cuda
    for (args, says) in [
        (&["--mps-encode-share", "1.5"][..], "(0, 1)"),
        (
            &["--mps-encode-share", "0.5", "--offload", "1"][..],
            "has none",
        ),
        (&["--mps-encode-share", "0.5"][..], "--device cuda only"),
    ] {
        let out = easerve(&[&["exec", "scenarios/cpu-audio.toml"][..], args].concat());
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

#[test]
fn the_simulator_applies_the_same_admission_control() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(root().join("scenarios/cpu-audio.toml")).unwrap();
    let profile = root().join("scenarios/profiles/tiny-audio.cpu.toml");
    let text = text
        .replace(
            "sm_policy = \"dynamic\"",
            "sm_policy = \"dynamic\"\nadmission_limit = 4",
        )
        .replace(
            "profiles/tiny-audio.cpu.toml",
            profile.to_str().expect("utf-8 path"),
        );
    let path = dir.path().join("limited.toml");
    std::fs::write(&path, text).unwrap();
    let r = crate::sim_json(&path, &["--rate", "200", "--requests", "100"]);
    let (completed, rejected) = (num(&r, "/completed"), num(&r, "/rejected"));
    assert!(rejected > 50.0, "{r}");
    assert_eq!(completed + rejected, 100.0);
}

/// Supervision in `exec`: the killed remote prefill worker's requests are
/// re-run on the local one (nothing fails); the killed decode worker's
/// requests, if it held any, fail naming it; either way the worker is
/// restarted and rejoins, and the run never hangs.
#[test]
fn killing_a_prefill_or_decode_worker_never_hangs_the_run() {
    let _timed = crate::timed();
    for victim in ["P0@1.0", "D0@1.0"] {
        let r = exec_json(&[
            "--requests",
            "30",
            "--rate",
            "8",
            "--kill-worker",
            victim,
            "--time-limit",
            "60",
        ]);
        let completed = num(&r, "/completed");
        let failed = r["failed"].as_f64().unwrap_or(0.0);
        if victim.starts_with('P') {
            assert_eq!(completed, 30.0, "{victim}: re-run on L0: {r}");
        }
        // what failed (if anything was on D0 or sent there while it was
        // down) names the worker
        let label = &victim[..2];
        let failures = r["failures"].as_array().cloned().unwrap_or_default();
        assert!(
            failures
                .iter()
                .all(|f| f["reason"].as_str().unwrap().contains(label)),
            "{victim}: {failures:?}"
        );
        assert_eq!(completed + failed, 30.0, "{victim}: {r}");
        assert_eq!(num(&r, "/supervision/restarts"), 1.0, "{victim}: {r}");
        let notes = r["notes"].to_string();
        assert!(
            !notes.contains("time limit"),
            "{victim} hung until the limit: {notes}"
        );
    }
}

/// The aggregated system runs for real: one replica process per CPU "GPU"
/// (three of TP1 on cpu-image), every request completed, the decision log
/// with its placements and iterations, and the simulator's bottleneck rule
/// naming the replicas. A replica killed mid-run fails what it held and the
/// run still reports; TP > 1 replicas are refused.
#[test]
fn exec_runs_the_aggregated_system() {
    let _timed = crate::timed();
    let log = tempfile::NamedTempFile::new().unwrap();
    let path = log.path().to_str().unwrap();
    let image = root().join("scenarios/cpu-image.toml");
    let args = [
        "--system",
        "aggregated",
        "--requests",
        "8",
        "--rate",
        "4",
        "--decisions",
        path,
    ];
    let r = crate::report_json("exec", &image, &args);
    assert_eq!(num(&r, "/completed"), 8.0, "{r}");
    assert_eq!(r["bottleneck"], "aggregated", "{}", r["bottleneck_reason"]);
    let lines = std::fs::read_to_string(log.path()).unwrap();
    let kinds = |kind: &str| lines.lines().filter(|l| l.contains(kind)).count();
    assert_eq!(kinds("\"PlaceReplica\""), 8, "{lines}");
    assert!(kinds("\"ReplicaStep\"") >= 4, "{lines}");

    let killed = [
        "--system",
        "aggregated",
        "--requests",
        "16",
        "--rate",
        "8",
        "--kill-worker",
        "R0@0.5",
    ];
    let r = crate::report_json("exec", &image, &killed);
    assert_eq!(num(&r, "/completed") + num(&r, "/failed"), 16.0, "{r}");
    let notes = r["notes"].to_string();
    assert!(notes.contains("worker R0 failed"), "{notes}");

    let out = easerve(&["exec", "scenarios/image.toml", "--system", "aggregated"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("deployment.aggregated_tp"), "{err}");
}

/// `easerve exec --planner load` over a short version of
/// `scenarios/demand/cpu-image-phases.toml` (4 s phases of 1, 6 and 1
/// req/s, 32 requests, a decision every 2 s): the planner drains the spare
/// decode worker in the quiet first window and moves or starts workers
/// through the surge; each drained worker is stopped (`stopped_at`), a
/// started one reports its model loaded after its start (`ready_at`), and
/// every request completes. About 25 s on the 2-core CI machine.
#[test]
fn exec_runs_the_load_planner_and_loses_no_request() {
    let _timed = crate::timed();
    let mut text =
        std::fs::read_to_string(root().join("scenarios/demand/cpu-image-phases.toml")).unwrap();
    let profile = format!(
        "{:?}",
        root().join("scenarios/profiles/tiny-image.cpu.toml")
    );
    for (from, to) in [
        ("duration_s = 15", "duration_s = 4"),
        ("rate = 1.5", "rate = 1.0"),
        ("rate = 10.0", "rate = 6.0"),
        ("requests = 210", "requests = 32"),
        ("window_s = 15", "window_s = 4"),
        (
            "policy = \"load\"\nwindow_s = 5",
            "policy = \"static\"\nwindow_s = 2",
        ),
        ("\"../profiles/tiny-image.cpu.toml\"", &profile),
    ] {
        assert!(text.contains(from), "{from}");
        text = text.replace(from, to);
    }
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("exec-planner.toml");
    std::fs::write(&path, text).unwrap();
    let r = crate::report_json("exec", &path, &["--planner", "load"]);
    assert_eq!(num(&r, "/completed"), 32.0, "a request was lost");
    let p = &r["planner"];
    assert_eq!(p["policy"], "load");
    let changes = p["changes"].as_array().unwrap();
    let moves: Vec<&Value> = changes
        .iter()
        .filter(|c| c["from"].is_string() || c["to"].is_string())
        .collect();
    assert!(!moves.is_empty(), "no worker moved: {p}");
    for c in moves {
        let at = c["at"].as_f64().unwrap();
        if c["from"].is_string() {
            assert!(c["stopped_at"].as_f64().is_some_and(|t| t >= at), "{c}");
        }
        // a worker started at the end may still be loading when the last
        // request finishes
        if let Some(ready) = c["ready_at"].as_f64() {
            assert!(ready > c["stopped_at"].as_f64().unwrap_or(at), "{c}");
        }
    }
    assert!(p["gpu_hours"].as_f64().unwrap() > 0.0);
    // every worker a change started has its per-GPU row, a spare slot's
    // among them
    let rows: Vec<&str> = r["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| g["worker"].as_str())
        .collect();
    for c in changes.iter().filter(|c| c["ready_at"].is_number()) {
        let to = c["to"].as_str().unwrap();
        assert!(
            rows.iter().any(|w| w.split('+').any(|l| l == to)),
            "no GPU row of {to}: {rows:?}"
        );
    }
}

/// `scenarios/cpu-two-group.toml` with its NIC latency raised to 0.25 s, so
/// that the modelled delay stands out of the loopback's, as a file under
/// `scenarios/` (removed when dropped).
pub(crate) fn two_group_slow_nic() -> tempfile::NamedTempFile {
    use std::io::Write;
    let text = std::fs::read_to_string(root().join("scenarios/cpu-two-group.toml")).unwrap();
    let mut f = tempfile::Builder::new()
        .suffix(".toml")
        .tempfile_in(root().join("scenarios"))
        .unwrap();
    f.write_all(
        text.replace("nic_latency_s = 5e-5", "nic_latency_s = 0.25")
            .as_bytes(),
    )
    .unwrap();
    f
}

/// The cross-node transfers of report `r`, a run of [`two_group_slow_nic`]
/// that completed `requests`: the NIC ports carry them (one KV cache per
/// request, prefill's node to decode's) and each embedding envelope and KV
/// cache landed at least the NIC's latency after it left. Returns the
/// bytes out of the encoder's node.
pub(crate) fn assert_nic_held(r: &Value, requests: f64) -> f64 {
    let links: Vec<(String, f64, f64)> = r["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            let name = l["link"].as_str().unwrap().into();
            (name, num(l, "/transfers"), num(l, "/bytes"))
        })
        .collect();
    let port = |name: &str| {
        links
            .iter()
            .find(|l| l.0 == name)
            .map_or((0.0, 0.0), |l| (l.1, l.2))
    };
    assert!(port("enc/node0 NIC out").0 >= 1.0, "{links:?}");
    assert_eq!(port("llm/node0 NIC out").0, requests, "{links:?}");
    for stage in ["embedding transfer", "kv transfer"] {
        let s = r["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["stage"] == stage)
            .unwrap();
        let min = num(&s["service"], "/p50");
        assert!(
            min >= 0.25,
            "{stage}: median {min} s, below the NIC's 0.25 s latency"
        );
    }
    port("enc/node0 NIC out").1
}

/// `exec` on a cluster of node groups ([`two_group_slow_nic`]): every
/// request completes, the report names the groups and each worker's node,
/// and the cross-node transfers wait for the modelled NIC
/// ([`assert_nic_held`]). Runtime: about 10 s (8 requests).
#[test]
fn exec_runs_node_groups_with_the_modelled_nic_delay() {
    let _timed = crate::timed();
    let f = two_group_slow_nic();
    let r = crate::report_json("exec", f.path(), &["--requests", "8", "--rate", "4"]);
    assert_eq!(num(&r, "/completed"), 8.0);
    let cluster = r["cluster"].as_str().unwrap();
    assert!(
        cluster.contains("enc: 1×1 cpu") && cluster.contains("llm: 2×1 cpu"),
        "{cluster}"
    );
    let notes = r["notes"].to_string();
    for w in ["E0 on enc/node0", "P0 on llm/node0", "D0 on llm/node1"] {
        assert!(notes.contains(w), "notes lack {w}: {notes}");
    }
    assert_nic_held(&r, 8.0);
}
