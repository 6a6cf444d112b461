//! The report's explanation: offered load against capacity per stage, the
//! most loaded stage, the encode GPUs' idle time, and one plain sentence per
//! finding.

use crate::capacity::{alpha, capacities, encode_capacity, pool_parallel, Typical};
use easerve_calib::StageCost;
use easerve_workload::report::{Explanation, StageLoad};
use easerve_workload::{Report, Scenario};

/// What would relieve a saturated `stage`; for encode, raising B only while
/// its passes run below the bound (`mean_batch` of `max_batch`: within 10 %
/// of it the passes are already full).
fn remedy(stage: &str, mean_batch: f64, max_batch: usize) -> String {
    match stage {
        "encode" if mean_batch >= 0.9 * max_batch as f64 => format!(
            "its passes already run nearly full (mean micro-batch {mean_batch:.2} of B = {max_batch}), so adding an encode worker would relieve it"
        ),
        "encode" => "raising B or adding an encode worker would relieve it".into(),
        "prefill" => "another prefill worker, a larger prefill TP, or (where the LLM fits beside the encoder) a lower s that moves prefill onto the encode GPUs would relieve it".into(),
        _ => "more decode workers or a larger decode TP (more KV cache, bigger batches) would relieve it".into(),
    }
}

/// Explain an EPD run of `sc` offered `rate` requests/s, whose report is `r`
/// and whose typical request is `t`.
pub(crate) fn explain(
    sc: &Scenario,
    cost: &dyn StageCost,
    t: &Typical,
    rate: f64,
    r: &Report,
) -> Explanation {
    let caps = capacities(sc, cost, t, sc.deployment.allocation.encode.tp);
    let d = &sc.deployment;
    let a = d.allocation;
    let mut loads = Vec::new();
    // a stage is offered what the stage before it can pass on
    let mut offered = rate;
    if a.encode.workers > 0 {
        let capacity = f64::from(a.encode.workers) * encode_capacity(&caps, d.max_batch as u32);
        loads.push(StageLoad {
            stage: "encode".into(),
            offered,
            capacity,
            load: (offered / capacity.max(1e-12)).min(1e6),
        });
        offered = offered.min(capacity);
    }
    let c_remote = f64::from(a.prefill.workers) * caps.prefill_at(pool_parallel(&a.prefill));
    let c_local = match sc.knobs.local_prefill_tp {
        Some(tp) => {
            let n_l = a.encode.workers / tp;
            f64::from(n_l)
                * alpha(sc, cost, t, Some(tp), a.encode.workers, rate)
                * caps.local_prefill_at(tp)
        }
        None => 0.0,
    };
    let s = d.offload;
    let side = |load: f64, cap: f64| {
        if cap > 0.0 {
            load / cap
        } else if load > 0.0 {
            1e6
        } else {
            0.0
        }
    };
    let p_load = side(s * offered, c_remote)
        .max(side((1.0 - s) * offered, c_local))
        .min(1e6);
    let c_p = if p_load > 0.0 {
        offered / p_load
    } else {
        c_remote + c_local
    };
    loads.push(StageLoad {
        stage: "prefill".into(),
        offered,
        capacity: c_p,
        load: p_load,
    });
    offered = offered.min(c_p);
    let c_d = f64::from(a.decode.workers) * caps.decode_at(pool_parallel(&a.decode));
    loads.push(StageLoad {
        stage: "decode".into(),
        offered,
        capacity: c_d,
        load: side(offered, c_d).min(1e6),
    });

    let mut sorted: Vec<&StageLoad> = loads.iter().collect();
    sorted.sort_by(|x, y| y.load.total_cmp(&x.load));
    let most = sorted[0];
    let lead = match sorted.get(1) {
        Some(next) if next.load > 0.0 => Some(most.load / next.load),
        _ => None,
    };
    let encode_gpus: Vec<f64> = r
        .gpus
        .iter()
        .filter(|g| g.stage == "encode")
        .map(|g| g.busy_fraction)
        .collect();
    let encode_gpu_idle = (!encode_gpus.is_empty())
        .then(|| 1.0 - encode_gpus.iter().sum::<f64>() / encode_gpus.len() as f64);
    let queue = |stage: &str| {
        r.stages
            .iter()
            .find(|x| x.stage == stage)
            .map_or(0.0, |x| x.queue.mean)
    };

    let mut findings = Vec::new();
    for l in &loads {
        if l.load >= 1.0 {
            findings.push(format!(
                "{} is saturated: it is offered {:.2} req/s but can serve about {:.2} (load {:.2}); requests wait {:.1} s on average before their {} starts; {}.",
                l.stage,
                l.offered,
                l.capacity,
                l.load,
                queue(&l.stage),
                l.stage,
                remedy(&l.stage, r.encode.mean_batch, d.max_batch)
            ));
        }
    }
    if most.load < 1.0 {
        findings.push(format!(
            "No stage is saturated: the busiest, {}, runs at {:.0} % of its capacity{}.",
            most.stage,
            100.0 * most.load,
            lead.map_or(String::new(), |l| format!(
                ", {l:.1}× the next stage's load"
            ))
        ));
    } else if let Some(lead) = lead {
        findings.push(format!(
            "{} is the bottleneck by a factor of {lead:.1} over the next most loaded stage.",
            most.stage
        ));
    }
    if let Some(idle) = encode_gpu_idle {
        let why = if d.max_batch == 1 && loads.first().is_some_and(|l| l.load >= 1.0) {
            ": the encoder is limited by its fixed per-pass cost, not by the GPU, which micro-batching (B > 1) amortizes"
        } else if d.offload >= 1.0 {
            "; with s < 1 a local prefill worker could use that time"
        } else {
            ""
        };
        findings.push(format!(
            "The encode GPUs have no GPU work {:.0} % of the time{why}.",
            100.0 * idle
        ));
    }
    if most.load >= 1.0 && r.request_throughput < 0.95 * rate {
        findings.push(format!(
            "The cluster completes {:.2} of the {:.2} req/s offered, so queues grow through the run.",
            r.request_throughput, rate
        ));
    }
    let most_loaded = most.stage.clone();
    Explanation {
        loads,
        most_loaded,
        lead,
        encode_gpu_idle,
        findings,
    }
}

#[cfg(test)]
mod tests {
    use super::remedy;

    #[test]
    fn raising_b_is_advised_only_while_passes_run_below_it() {
        assert!(remedy("encode", 2.5, 8).contains("raising B"));
        let full = remedy("encode", 7.69, 8);
        assert!(!full.contains("raising B"), "{full}");
        assert!(
            full.contains("7.69 of B = 8") && full.contains("encode worker"),
            "{full}"
        );
        assert!(remedy("prefill", 7.69, 8).contains("prefill worker"));
    }
}
