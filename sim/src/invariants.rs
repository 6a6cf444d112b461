//! Property tests of the whole simulator over small random scenarios: every
//! request completes, and each request's lifecycle timestamps never go back.

use crate::simulate;
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
    fn every_request_completes_and_time_never_goes_back(
        alloc in prop::sample::select(vec!["1E(TP1)+1P(TP1)+1D(TP1)", "2E(TP1)+1P(TP2)+1D(TP2)", "3E(TP1)+1D(TP4)"]),
        b in 1u32..12,
        s in prop::sample::select(vec![0.0, 0.3, 0.5, 0.9, 1.0]),
        rate in 0.5f64..40.0,
        sm in prop::sample::select(vec!["dynamic", "none", "static:0.5"]),
        dispatch in prop::sample::select(vec!["poisson-gap", "immediate", "fixed-timeout:0.05", "queue-length:3"]),
        modality in prop::sample::select(vec!["image", "audio"]),
        system in prop::sample::select(vec!["easerve", "passthrough", "aggregated"]),
        cap in 1u32..4,
    ) {
        // an allocation without P workers needs s = 0
        let s = if alloc.contains("P(") { s } else { 0.0 };
        // pass-through needs remote prefill workers
        let system = if system == "passthrough" && !alloc.contains("P(") { "easerve" } else { system };
        let sc = scenario(alloc, b, s, rate, sm, dispatch, modality, system, cap);
        let out = simulate(&sc);
        prop_assert_eq!(out.report.completed, 60);
        for r in &out.records {
            let chain = [
                Some(r.arrival), r.encode_start, r.encode_end, r.embedding_sent, r.prefill_ready,
                r.prefill_start, r.first_token, r.kv_sent, r.decode_ready, r.decode_start, r.finish,
            ];
            let times: Vec<f64> = chain.iter().flatten().copied().collect();
            prop_assert!(times.windows(2).all(|w| w[0] <= w[1] + 1e-9), "request {} times {:?}", r.id, times);
            if system != "aggregated" {
                prop_assert!(r.encode_batch.is_some_and(|k| k >= 1 && k <= b as usize));
            }
        }
        for g in &out.report.gpus {
            prop_assert!(g.busy_fraction <= 1.0 && g.sm_utilization <= 1.0 + 1e-9);
        }
    }
}
