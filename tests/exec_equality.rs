//! One scheduler, two faces: the executor's event loop (on a virtual clock,
//! workers replaced by service times) and the simulator make the same
//! decisions — placement, micro-batches and their SM shares, prefill routes,
//! prefill batches, KV placement and every decode iteration — for the same
//! arrivals and the same service times.

use easerve_calib::{EncodeTime, StageCost};
use easerve_exec::plan::build_controller;
use easerve_exec::virtual_clock::run_virtual;
use easerve_model::ItemTokens;
use easerve_sched::Decision;
use easerve_sim::{simulate_with, SimOptions};
use easerve_workload::scenario::{Overrides, Scenario};
use std::io::Write;

/// The scenario's own costs with the two effects that depend on what else
/// runs (and that the executor measures rather than decides) taken out:
/// bandwidth interference, the time-slicing penalty and the SM share's
/// effect on prefill speed.
struct Independent(Box<dyn StageCost>);

impl StageCost for Independent {
    fn encode(&self, items: &[ItemTokens], sm_share: f64) -> EncodeTime {
        self.0.encode(items, sm_share)
    }
    fn prefill(&self, seq_lens: &[u64], tp: u32, _sm_share: f64) -> f64 {
        self.0.prefill(seq_lens, tp, 1.0)
    }
    fn decode_step(&self, batch: u64, ctx: u64, tp: u32) -> f64 {
        self.0.decode_step(batch, ctx, tp)
    }
    fn transfer(&self, bytes: f64) -> f64 {
        self.0.transfer(bytes)
    }
    fn time_slice_penalty(&self) -> f64 {
        0.0
    }
    fn bandwidth_interference(&self) -> f64 {
        0.0
    }
    fn notes(&self) -> Vec<String> {
        self.0.notes()
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
            },
            Decision::Prefill {
                at: t2,
                worker: w2,
                ids: i2,
            },
        ) => close(*t1, *t2) && w1 == w2 && i1 == i2,
        (
            Decision::DecodeStep {
                at: t1,
                worker: w1,
                batch: b1,
                context: c1,
            },
            Decision::DecodeStep {
                at: t2,
                worker: w2,
                batch: b2,
                context: c2,
            },
        ) => close(*t1, *t2) && w1 == w2 && b1 == b2 && c1 == c2,
        _ => a == b,
    }
}

fn assert_same_decisions(toml: &str) {
    let sc = scenario(toml);
    let sim = simulate_with(
        &sc,
        Box::new(Independent(sc.cost())),
        &SimOptions {
            decisions: true,
            ..Default::default()
        },
    );
    let cost = Independent(sc.cost());
    let (ctrl, tokens) = build_controller(&sc, &cost);
    let ctrl = run_virtual(ctrl, &sc, &tokens, &cost);
    let exec = ctrl.decisions();
    let kinds = |log: &[Decision]| {
        let mut n = [0usize; 7];
        for d in log {
            n[match d {
                Decision::Reject { .. } => 0,
                Decision::PlaceEncode { .. } => 1,
                Decision::Dispatch { .. } => 2,
                Decision::Route { .. } => 3,
                Decision::Prefill { .. } => 4,
                Decision::PlaceDecode { .. } => 5,
                Decision::DecodeStep { .. } => 6,
            }] += 1;
        }
        n
    };
    let n = kinds(&sim.decisions);
    assert!(
        n[2] > 10 && n[4] > 10 && n[6] > 100,
        "too few decisions to compare: {n:?}"
    );
    if let Some(i) =
        (0..sim.decisions.len().min(exec.len())).find(|&i| !same(&sim.decisions[i], &exec[i]))
    {
        panic!(
            "decision {i} differs:\n  sim:  {:?}\n  exec: {:?}\n(previous: {:?})",
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
    let recs = ctrl.records();
    for (a, b) in sim.records.iter().zip(recs) {
        assert_eq!(a.encode_batch, b.encode_batch, "request {}", a.id);
        assert_eq!(a.prefill_local, b.prefill_local, "request {}", a.id);
        let (fa, fb) = (a.finish.expect("finished"), b.finish.expect("finished"));
        assert!(
            (fa - fb).abs() < 1e-9 * fa.max(1.0),
            "request {}: {fa} vs {fb}",
            a.id
        );
    }
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
fn executor_loop_and_simulator_decide_the_same_with_local_prefill() {
    assert_same_decisions(IMAGE);
}

#[test]
fn executor_loop_and_simulator_decide_the_same_for_each_dispatch_policy() {
    for dispatch in ["immediate", "fixed-timeout:0.05", "queue-length:4"] {
        let toml = IMAGE
            .replace("\"poisson-gap\"", &format!("\"{dispatch}\""))
            .replace("offload = 0.6", "offload = 1.0");
        assert_same_decisions(&toml);
    }
}
