//! One scheduler, two drivers: the simulator and an executor-shaped driver
//! (`easerve_sched::harness::Cluster`: fake workers on a virtual clock, share
//! changes applied at the next batch as `easerve exec` applies them) make the
//! same decisions — placement, micro-batches and their SM shares, prefill
//! routes, prefill batches and the share changes during them, KV placement,
//! every decode run and every yield that cuts one short, and every failure —
//! for the same arrivals and the same service times. The service times are the ones the simulated hardware
//! took (bandwidth interference, the time-slicing penalty and re-rating
//! included): nothing is stripped. The baselines' own mechanisms are the
//! same controller's: EPD-Serve's shards of a request on several encode
//! workers, HydraInfer's chunked prefill and its instance steps.

use easerve_sched::harness::{Cluster, Service};
use easerve_sched::{Decision, PrefillItem, RequestId, WorkerRef};
use easerve_sim::{simulate_with, ServiceLog, SimOptions};
use easerve_workload::generate::generate_with_tokens;
use easerve_workload::scenario::{Overrides, Scenario};
use std::io::Write;

/// Hands back what the simulated hardware took, unit by unit, per worker.
struct Replay {
    log: ServiceLog,
    next: [Vec<usize>; 7],
}

impl Replay {
    fn new(log: ServiceLog) -> Self {
        let next = [
            vec![0; log.encode.len()],
            vec![0; log.prefill.len()],
            vec![0; log.decode.len()],
            vec![0; log.embeddings.len()],
            vec![0; log.kv.len()],
            vec![0; 1],
            vec![0; log.replica.len()],
        ];
        Replay { log, next }
    }

    /// The next unit of `kind` on worker `w`; work the simulator never
    /// finished (lost to a fault) never ends.
    fn take<T: Copy>(next: &mut [Vec<usize>; 7], kind: usize, w: usize, log: &[T]) -> Option<T> {
        let i = next[kind][w];
        next[kind][w] += 1;
        log.get(i).copied()
    }
}

impl Service for Replay {
    fn encode(&mut self, w: usize, _: &[RequestId], _: f64) -> (f64, f64) {
        Self::take(&mut self.next, 0, w, &self.log.encode[w]).unwrap_or((f64::INFINITY, 0.0))
    }
    fn prefill(&mut self, p: usize, _: &[PrefillItem], _: f64) -> f64 {
        Self::take(&mut self.next, 1, p, &self.log.prefill[p]).unwrap_or(f64::INFINITY)
    }
    fn decode(&mut self, d: usize, _: u64, _: u64) -> f64 {
        Self::take(&mut self.next, 2, d, &self.log.decode[d]).unwrap_or(f64::INFINITY)
    }
    fn embeddings(&mut self, from: usize, _: &[RequestId]) -> f64 {
        Self::take(&mut self.next, 3, from, &self.log.embeddings[from]).unwrap_or(f64::INFINITY)
    }
    fn kv(&mut self, from: usize, _: RequestId) -> f64 {
        Self::take(&mut self.next, 4, from, &self.log.kv[from]).unwrap_or(f64::INFINITY)
    }
    fn front_end(&mut self, _: RequestId) -> f64 {
        Self::take(&mut self.next, 5, 0, &self.log.front_end).unwrap_or(f64::INFINITY)
    }
    fn replica_step(&mut self, r: usize, _: &[RequestId], _: u64, _: u64) -> (f64, f64) {
        Self::take(&mut self.next, 6, r, &self.log.replica[r])
            .unwrap_or((f64::INFINITY, f64::INFINITY))
    }
}

fn scenario(toml: &str) -> Scenario {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(toml.as_bytes()).expect("write scenario");
    Scenario::load(f.path(), &Overrides::default()).expect("valid scenario")
}

fn same(a: &Decision, b: &Decision) -> bool {
    let close = |x: f64, y: f64| (x - y).abs() <= 1e-9 * x.abs().max(1.0);
    match (a, b) {
        (
            Decision::Dispatch {
                at: t1,
                worker: w1,
                ids: i1,
                sm_share: s1,
            },
            Decision::Dispatch {
                at: t2,
                worker: w2,
                ids: i2,
                sm_share: s2,
            },
        ) => close(*t1, *t2) && w1 == w2 && i1 == i2 && close(*s1, *s2),
        (
            Decision::Prefill {
                at: t1,
                worker: w1,
                ids: i1,
                sm_share: s1,
            },
            Decision::Prefill {
                at: t2,
                worker: w2,
                ids: i2,
                sm_share: s2,
            },
        ) => close(*t1, *t2) && w1 == w2 && i1 == i2 && close(*s1, *s2),
        (
            Decision::Share {
                at: t1,
                worker: w1,
                sm_share: s1,
            },
            Decision::Share {
                at: t2,
                worker: w2,
                sm_share: s2,
            },
        ) => close(*t1, *t2) && w1 == w2 && close(*s1, *s2),
        (
            Decision::DecodeRun {
                at: t1,
                worker: w1,
                batch: b1,
                context: c1,
                steps: s1,
            },
            Decision::DecodeRun {
                at: t2,
                worker: w2,
                batch: b2,
                context: c2,
                steps: s2,
            },
        ) => close(*t1, *t2) && w1 == w2 && b1 == b2 && c1 == c2 && s1 == s2,
        (
            Decision::DecodeYield { at: t1, worker: w1 },
            Decision::DecodeYield { at: t2, worker: w2 },
        ) => close(*t1, *t2) && w1 == w2,
        (
            Decision::PrefillChunk {
                at: t1,
                worker: w1,
                id: i1,
                tokens: k1,
                queued_tokens: q1,
            },
            Decision::PrefillChunk {
                at: t2,
                worker: w2,
                id: i2,
                tokens: k2,
                queued_tokens: q2,
            },
        ) => close(*t1, *t2) && (w1, i1, k1, q1) == (w2, i2, k2, q2),
        (
            Decision::ReplicaStep {
                at: t1,
                replica: r1,
                ids: i1,
                batch: b1,
                context: c1,
            },
            Decision::ReplicaStep {
                at: t2,
                replica: r2,
                ids: i2,
                batch: b2,
                context: c2,
            },
        ) => close(*t1, *t2) && r1 == r2 && i1 == i2 && b1 == b2 && c1 == c2,
        _ => a == b,
    }
}

/// Decisions of each kind in `log`: reject, place-encode, dispatch, route,
/// prefill, share, place-decode, decode run, fail, decode yield,
/// place-replica, replica step, place-shard, prefill chunk.
fn kinds(log: &[Decision]) -> [usize; 14] {
    let mut n = [0usize; 14];
    for d in log {
        n[match d {
            Decision::Reject { .. } => 0,
            Decision::PlaceEncode { .. } => 1,
            Decision::Dispatch { .. } => 2,
            Decision::Route { .. } => 3,
            Decision::Prefill { .. } => 4,
            Decision::Share { .. } => 5,
            Decision::PlaceDecode { .. } => 6,
            Decision::DecodeRun { .. } => 7,
            Decision::Fail { .. } => 8,
            Decision::DecodeYield { .. } => 9,
            Decision::PlaceReplica { .. } => 10,
            Decision::ReplicaStep { .. } => 11,
            Decision::PlaceShard { .. } => 12,
            Decision::PrefillChunk { .. } => 13,
        }] += 1;
    }
    n
}

/// Run `toml` in the simulator and replay its service times through the
/// executor-shaped driver (with worker `kill` dying at the same time in
/// both); the decision logs and records must agree. Returns the log's kinds.
fn assert_same_decisions(toml: &str, kill: Option<(WorkerRef, f64)>) -> [usize; 14] {
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
    let n = kinds(&sim.decisions);
    assert!(
        (n[2] > 10 && n[4] > 10 && n[7] > 100) || n[11] > 100,
        "too few decisions to compare: {n:?}"
    );
    if let Some(i) =
        (0..sim.decisions.len().min(exec.len())).find(|&i| !same(&sim.decisions[i], &exec[i]))
    {
        panic!(
            "decision {i} differs:\n  sim:    {:?}\n  driver: {:?}\n(previous: {:?})",
            sim.decisions[i],
            exec[i],
            &sim.decisions[i.saturating_sub(3)..i]
        );
    }
    assert_eq!(
        sim.decisions.len(),
        exec.len(),
        "{n:?} vs {:?}",
        kinds(exec)
    );
    // the lifecycle records agree too
    for (a, b) in sim.records.iter().zip(driver.ctrl.records()) {
        assert_eq!(a.encode_batch, b.encode_batch, "request {}", a.id);
        assert_eq!(a.prefill_local, b.prefill_local, "request {}", a.id);
        assert_eq!(a.failure, b.failure, "request {}", a.id);
        assert_eq!(a.finish.is_some(), b.finish.is_some(), "request {}", a.id);
        if let (Some(fa), Some(fb)) = (a.finish, b.finish) {
            assert!(
                (fa - fb).abs() < 1e-9 * fa.max(1.0),
                "request {}: {fa} vs {fb}",
                a.id
            );
        }
        for (x, y) in [
            (a.kv_sent, b.kv_sent),
            (a.embedding_sent, b.embedding_sent),
            (a.prefill_start, b.prefill_start),
        ] {
            assert_eq!(x.is_some(), y.is_some(), "request {}", a.id);
            if let (Some(x), Some(y)) = (x, y) {
                assert!(
                    (x - y).abs() < 1e-9 * x.max(1.0),
                    "request {}: {x} vs {y}",
                    a.id
                );
            }
        }
    }
    n
}

const IMAGE: &str = r#"
name = "equality-image"
seed = 7
[model]
preset = "llava-v1.6-34b"
[cluster]
gpu = "rtx-6000-ada"
gpus = 8
[deployment]
allocation = "2E(TP1)+1P(TP2)+1D(TP4)"
batch = 8
offload = 0.6
dispatch = "poisson-gap"
sm_policy = "static:0.6"
[workload]
requests = 300
rate = 3.0
arrival = "gamma"
cv = 2.0
modality = "image"
input_len = 128
output_len = 64
range_ratio = 0.5
[workload.image]
items_per_request = 1
buckets = [
  { height = 336, width = 336, probability = 0.5 },
  { height = 672, width = 672, probability = 0.5 },
]
"#;

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
