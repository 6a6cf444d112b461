//! One scheduler, two drivers: the simulator and an executor-shaped driver
//! (`easerve_sched::harness::Cluster`: fake workers on a virtual clock, share
//! changes applied at the next batch as `easerve exec` applies them) make the
//! same decisions — placement, micro-batches and their SM shares, prefill
//! routes, prefill batches and the share changes during them, KV placement,
//! every decode run and every yield that cuts one short, and every failure —
//! for the same arrivals and the same service times. The service times are the ones the simulated hardware
//! took (bandwidth interference, the time-slicing penalty and re-rating
//! included): nothing is stripped.

use easerve_sched::harness::{
    assert_same_log, assert_same_outcomes, assert_same_transfer_times, decision_kinds, Cluster,
    Replay,
};
use easerve_sched::WorkerRef;
use easerve_sim::{simulate_with, SimOptions};
use easerve_workload::generate::generate_with_tokens;
use easerve_workload::scenario::{Overrides, Scenario};
use std::io::Write;

fn scenario(toml: &str) -> Scenario {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(toml.as_bytes()).expect("write scenario");
    Scenario::load(f.path(), &Overrides::default()).expect("valid scenario")
}

/// Run `toml` in the simulator and replay its service times through the
/// executor-shaped driver (with worker `kill` dying at the same time in
/// both); the decision logs and records must agree. Returns the log's kinds.
fn assert_same_decisions(toml: &str, kill: Option<(WorkerRef, f64)>) -> [usize; 10] {
    let sc = scenario(toml);
    let sim = simulate_with(
        &sc,
        sc.cost(),
        &SimOptions {
            decisions: true,
            service_log: true,
            kill,
            ..Default::default()
        },
    );
    let (requests, tokens) = generate_with_tokens(&sc);
    let ctrl = sc.controller(requests, &tokens, &*sc.cost(), true);
    let mut driver = Cluster::new(ctrl, Replay::new(sim.service.clone().expect("service log")));
    if let Some((w, at)) = kill {
        driver.kill_at(w, at);
    }
    driver.drive();
    let exec = driver.ctrl.decisions();
    let n = decision_kinds(&sim.decisions);
    assert!(
        n[2] > 10 && n[4] > 10 && n[7] > 100,
        "too few decisions to compare: {n:?}"
    );
    assert_same_log(&sim.decisions, exec);
    // the lifecycle records agree too
    assert_same_outcomes(&sim.records, driver.ctrl.records());
    assert_same_transfer_times(&sim.records, driver.ctrl.records());
    n
}

/// The image scenario with local prefill (`drivers_agree_image.toml`, which
/// easerve-exec's agreement tests run too).
const IMAGE: &str = include_str!("drivers_agree_image.toml");

#[test]
fn the_drivers_decide_the_same_with_local_prefill() {
    let n = assert_same_decisions(IMAGE, None);
    // decode runs cut short for a KV cache that can join at once
    assert!(n[9] > 10, "too few decode yields: {n:?}");
}

#[test]
fn the_drivers_decide_the_same_for_each_dispatch_policy() {
    for dispatch in ["immediate", "fixed-timeout:0.05", "queue-length:4"] {
        let toml = IMAGE
            .replace("\"poisson-gap\"", &format!("\"{dispatch}\""))
            .replace("offload = 0.6", "offload = 1.0");
        assert_same_decisions(&toml, None);
    }
}

/// Under time-slicing and the dynamic split the local prefill share changes
/// while batches run: both drivers log the same changes at the same times.
#[test]
fn the_drivers_decide_the_same_share_changes() {
    for policy in ["none", "dynamic"] {
        let toml = IMAGE.replace("\"static:0.6\"", &format!("\"{policy}\""));
        let n = assert_same_decisions(&toml, None);
        assert!(n[5] > 10, "sm_policy {policy}: too few share changes {n:?}");
    }
}

/// Drift regression: faults exist in both drivers and fail the same requests.
/// An encode worker that dies idle fails nothing (placement steers around
/// it); the only remote prefill or decode worker takes every later request
/// with it.
#[test]
fn the_drivers_fail_the_same_requests_when_a_worker_dies() {
    for (w, fails) in [
        (WorkerRef::Encode(1), false),
        (WorkerRef::Prefill(0), true),
        (WorkerRef::Decode(0), true),
    ] {
        let n = assert_same_decisions(IMAGE, Some((w, 40.0)));
        assert_eq!(n[8] > 0, fails, "{w:?}: {n:?}");
    }
}
