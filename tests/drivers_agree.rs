//! One scheduler, two drivers: the simulator and an executor-shaped driver
//! (`easerve_sched::harness::Cluster`: fake workers on a virtual clock, share
//! changes applied at the next batch as `easerve exec` applies them) make the
//! same decisions — placement, micro-batches and their SM shares, prefill
//! routes, prefill batches and the share changes during them, KV placement,
//! every decode run and every yield that cuts one short, and every failure —
//! for the same arrivals and the same service times. The service times are the ones the simulated hardware
//! took (bandwidth interference, the time-slicing penalty and re-rating
//! included): nothing is stripped. The other systems' own mechanisms are the
//! same controller's: the aggregated system's replicas, EPD-Serve's shards
//! of a request on several encode workers, HydraInfer's chunked prefill and
//! its instance steps.

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
fn assert_same_decisions(toml: &str, kill: Option<(WorkerRef, f64)>) -> [usize; 20] {
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
        (n[2] > 10 && n[4] > 10 && n[7] > 100) || n[11] > 100,
        "too few decisions to compare: {n:?}"
    );
    assert_same_log(&sim.decisions, exec);
    // the lifecycle records agree too
    assert_same_outcomes(&sim.records, driver.ctrl.records());
    assert_same_transfer_times(&sim.records, driver.ctrl.records());
    n
}

/// The image scenario with local prefill (`drivers_agree_image.toml`, which
/// `exec_agree.rs`'s executor and server run too).
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
/// it); the only remote prefill worker's requests are re-run on the local
/// prefill workers, the same in both (nothing fails); the only decode worker
/// takes every later request with it.
#[test]
fn the_drivers_fail_the_same_requests_when_a_worker_dies() {
    for (w, fails) in [
        (WorkerRef::Encode(1), false),
        (WorkerRef::Prefill(0), false),
        (WorkerRef::Decode(0), true),
    ] {
        let n = assert_same_decisions(IMAGE, Some((w, 40.0)));
        assert_eq!(n[8] > 0, fails, "{w:?}: {n:?}");
    }
}

/// The aggregated system is the same controller: both drivers place every
/// request on the same replica and run the same iterations, and a replica
/// that dies fails the same requests.
#[test]
fn the_drivers_decide_the_same_for_the_aggregated_system() {
    let toml = IMAGE.replace(
        "dispatch = \"poisson-gap\"",
        "dispatch = \"poisson-gap\"\nsystem = \"aggregated\"\naggregated_tp = 4",
    );
    let n = assert_same_decisions(&toml, None);
    assert_eq!(n[10], 300, "{n:?}");
    assert_eq!(n[1] + n[2] + n[4] + n[7], 0, "no EPD decision: {n:?}");
    let n = assert_same_decisions(&toml, Some((WorkerRef::Replica(1), 30.0)));
    assert!(n[8] > 0, "the dead replica fails requests: {n:?}");
}

/// The `IMAGE` scenario run as serving system `system`.
fn as_system(system: &str) -> String {
    IMAGE.replace(
        "sm_policy =",
        &format!("system = \"{system}\"\nsm_policy ="),
    )
}

/// EPD-Serve's intra-request parallelism: three images a request, one shard
/// each, placed in turn over the encode workers; both drivers place, batch
/// and route the same shards and start the same prefills once every shard
/// has landed, and an encode worker that dies fails the requests it holds a
/// shard of.
#[test]
fn the_drivers_decide_the_same_for_epd_serve_shards() {
    let toml = as_system("epd-serve")
        .replace("items_per_request = 1", "items_per_request = 3")
        .replace("rate = 3.0", "rate = 1.0");
    let n = assert_same_decisions(&toml, None);
    assert_eq!(n[12], 900, "one shard per image: {n:?}");
    assert_eq!(
        n[1] + n[5],
        0,
        "no whole-request placement, no share: {n:?}"
    );
    // killed 1 ms after request 40 arrived: in the host phase of a pass
    // holding one of its shards
    let (requests, _) = generate_with_tokens(&scenario(&toml));
    let at = requests[40].arrival + 1e-3;
    let n = assert_same_decisions(&toml, Some((WorkerRef::Encode(1), at)));
    assert!(
        n[8] > 0,
        "the dead encode worker fails what it holds: {n:?}"
    );
}

/// HydraInfer: chunked prefill under its token budget in the E+P+D form,
/// and in the EP+D form the instance steps (encode and local prefill start
/// together on time-sliced GPUs); both drivers decide the same chunks, steps
/// and share changes.
#[test]
fn the_drivers_decide_the_same_for_hydrainfer() {
    let toml = as_system("hydrainfer");
    let n = assert_same_decisions(&toml, None);
    assert!(n[13] > 10, "too few prefill chunks: {n:?}");
    let ep = toml.replace("2E(TP1)+1P(TP2)+1D(TP4)", "4E(TP1)+2D(TP2)");
    let n = assert_same_decisions(&ep, None);
    assert!(n[13] > 10 && n[5] > 10, "chunks and share changes: {n:?}");
}
