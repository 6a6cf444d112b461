//! Property tests of the whole simulator over 256 small random scenarios (all
//! three systems, every dispatch and SM policy, offload ratios, transfer caps,
//! preprocessing in series or pipelined on one or more threads):
//! every request completes; each request's lifecycle timestamps never go back;
//! SM shares on one GPU never sum above 1; a worker or link never runs two
//! batches at once; busy fractions stay within [0, 1]. KV-block capacity is
//! property-tested in `easerve-sched` (`decode.rs`).

use crate::{scenario_cost, simulate_with, SimOptions};
use easerve_workload::scenario::{Scenario, ScenarioFile};
use proptest::prelude::*;

#[allow(clippy::too_many_arguments)]
fn scenario(
    alloc: &str,
    b: u32,
    s: f64,
    rate: f64,
    sm: &str,
    dispatch: &str,
    modality: &str,
    system: &str,
    cap: u32,
    pre: &str,
) -> Scenario {
    let shapes = match modality {
        "image" => "[workload.image]\nbuckets = [{ height = 224, width = 224, probability = 1.0 }, { height = 448, width = 448, probability = 1.0 }]",
        _ => "[workload.audio]\nmean_s = 8.0",
    };
    let preset = if modality == "image" {
        "tiny-vit-lm"
    } else {
        "tiny-whisper-lm"
    };
    let text = format!(
        r#"
seed = 5
[model]
preset = "{preset}"
[cluster]
gpu = "rtx-6000-ada"
gpus = 8
[deployment]
allocation = "{alloc}"
system = "{system}"
batch = {b}
offload = {s}
sm_policy = "{sm}"
dispatch = "{dispatch}"
max_inflight_transfers = {cap}
{pre}
[workload]
requests = 60
rate = {rate}
modality = "{modality}"
input_len = 64
output_len = 24
range_ratio = 0.9
{shapes}
"#
    );
    let raw = ScenarioFile::parse(&text, "prop.toml").expect("parses");
    Scenario::validate(raw, "prop.toml", "prop").expect("valid")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn run_invariants_hold(
        alloc in prop::sample::select(vec!["1E(TP1)+1P(TP1)+1D(TP1)", "2E(TP1)+1P(TP2)+1D(TP2)", "3E(TP1)+1D(TP4)"]),
        b in 1u32..12,
        s in prop::sample::select(vec![0.0, 0.3, 0.5, 0.9, 1.0]),
        rate in 0.5f64..40.0,
        sm in prop::sample::select(vec!["dynamic", "none", "static:0.5"]),
        dispatch in prop::sample::select(vec!["poisson-gap", "immediate", "fixed-timeout:0.05", "queue-length:3"]),
        modality in prop::sample::select(vec!["image", "audio"]),
        system in prop::sample::select(vec!["easerve", "passthrough", "aggregated"]),
        cap in 1u32..4,
        pre in prop::sample::select(vec!["", "preprocess = \"serial\"", "preprocess = \"pipelined\"\npreprocess_threads = 1", "preprocess = \"pipelined\"\npreprocess_threads = 3"]),
    ) {
        // an allocation without P workers needs s = 0
        let s = if alloc.contains("P(") { s } else { 0.0 };
        // pass-through needs remote prefill workers
        let system = if system == "passthrough" && !alloc.contains("P(") { "easerve" } else { system };
        let sc = scenario(alloc, b, s, rate, sm, dispatch, modality, system, cap, pre);
        let out = simulate_with(&sc, scenario_cost(&sc), &SimOptions {
                timeline: true,
                decisions: true,
                ..Default::default()
            },
        );
        prop_assert_eq!(out.report.completed, 60);
        for r in &out.records {
            let chain = [
                easerve_sched::Stamp::at(r.arrival), r.encode_start, r.encode_end, r.embedding_sent,
                r.prefill_ready, r.prefill_start, r.first_token, r.kv_sent, r.decode_ready,
                r.decode_start, r.finish,
            ];
            let times: Vec<f64> = chain.iter().filter_map(|t| t.get()).collect();
            prop_assert!(times.windows(2).all(|w| w[0] <= w[1] + 1e-9), "request {} times {:?}", r.id, times);
            if system != "aggregated" {
                prop_assert!(r.encode_batch.is_some_and(|k| k >= 1 && k <= b));
            }
        }
        // SM shares on one GPU never sum above 1
        prop_assert!(out.max_sm_share_sum <= 1.0 + 1e-9, "SM shares sum to {}", out.max_sm_share_sum);
        // a worker (or link) never runs two batches at once: its slices do not overlap
        let timeline = out.timeline.as_ref().expect("timeline");
        let mut tracks: std::collections::BTreeMap<u64, Vec<(f64, f64)>> = Default::default();
        for e in timeline["traceEvents"].as_array().expect("events") {
            if e["ph"] == "X" {
                let ts = e["ts"].as_f64().expect("ts");
                tracks.entry(e["tid"].as_u64().expect("tid")).or_default().push((ts, ts + e["dur"].as_f64().expect("dur")));
            }
        }
        for slices in tracks.values_mut() {
            slices.sort_by(|a, b| a.0.total_cmp(&b.0));
            for w in slices.windows(2) {
                prop_assert!(w[1].0 >= w[0].1 - 1e-3, "overlap {:?} {:?}", w[0], w[1]);
            }
        }
        for g in &out.report.gpus {
            prop_assert!(g.busy_fraction <= 1.0 && g.sm_utilization <= 1.0 + 1e-9);
        }
    }
}
