//! The bottleneck: one rule for every report of a scenario's run, simulated
//! (`sim`, `search`, `sweep`) or measured (`exec`, `serve`).
//!
//! * An EPD system (`easerve`, `passthrough`): the stage with the highest
//!   offered load over capacity, from the report's [`Explanation`] (the cost
//!   model's capacities at the run's deployment and typical request), with
//!   by how much it leads the next stage and the mean queueing measured there.
//! * The aggregated baseline: every stage runs inline on the same replicas, so
//!   the verdict is `aggregated`, with the mean wait before the iteration that
//!   starts a request and how busy the replicas' GPUs were.
//!
//! Reports read from outside a run of a scenario (`bench` from the client, a
//! `vllm bench serve` result in `calib validate`) have no stage times and keep
//! the bottleneck `none` that [`Report::build`] leaves.

use crate::capacity::Typical;
use crate::explain::explain;
use easerve_calib::StageCost;
use easerve_sched::Request;
use easerve_workload::generate::{item_tokens, ItemTokenTable};
use easerve_workload::scenario::System;
use easerve_workload::{Report, Scenario};

/// Name the bottleneck of `report`, a run of `sc` priced by `cost`, offered
/// `rate` requests/s, whose typical request is `typical` (`None`: the
/// scenario's generated workload's, [`Typical::of_scenario`]); for an EPD
/// system, also fill its explanation. The stage is the one whose offered load
/// over capacity (the cost model's, at this rate and typical request) is
/// highest; the queueing quoted beside it is the run's, simulated or measured.
pub fn name_bottleneck(
    sc: &Scenario,
    cost: &dyn StageCost,
    typical: Option<&Typical>,
    rate: f64,
    report: &mut Report,
) {
    if sc.system == System::Aggregated {
        name_aggregated(report);
        return;
    }
    let x = match typical {
        Some(t) => explain(sc, cost, t, rate, report),
        None => explain(sc, cost, &Typical::of_scenario(sc), rate, report),
    };
    if let Some(l) = x.loads.iter().find(|l| l.stage == x.most_loaded) {
        let q = report
            .stages
            .iter()
            .find(|st| st.stage == l.stage)
            .map_or(0.0, |st| st.queue.mean);
        report.bottleneck = l.stage.clone();
        report.bottleneck_reason = format!(
            "highest offered load / capacity: {:.2}{}; mean queueing there {:.1} ms",
            l.load,
            x.lead
                .map_or(String::new(), |l| format!(" ({l:.1}× the next stage)")),
            q * 1e3
        );
    }
    report.explanation = x;
}

/// The aggregated baseline's verdict (see the module docs).
fn name_aggregated(r: &mut Report) {
    let wait = r
        .stages
        .iter()
        .filter(|st| st.stage == "encode" || st.stage == "prefill")
        .map(|st| st.queue.mean)
        .fold(0.0, f64::max); // multimodal requests wait before their inline encode
    let busy = r.gpus.iter().map(|g| g.busy_fraction).sum::<f64>() / r.gpus.len().max(1) as f64;
    r.bottleneck = "aggregated".into();
    r.bottleneck_reason = format!(
        "every stage runs inline on the same replicas; requests wait {:.1} ms on average before the iteration that starts them, replica GPUs {:.0}% busy",
        wait * 1e3,
        busy * 100.0
    );
}

/// The typical request of `reqs`, requests of a run of `sc` (the executor's,
/// or the server's, whose requests came over HTTP); an item the model cannot
/// price (none, for requests that passed admission) is left out.
pub fn typical_of(sc: &Scenario, reqs: &[Request]) -> Typical {
    let tokens = reqs
        .iter()
        .map(|r| {
            r.items
                .iter()
                .filter_map(|it| item_tokens(&sc.model, it).ok())
                .collect::<Vec<_>>()
        })
        .collect::<ItemTokenTable>();
    Typical::of(reqs, &tokens)
}
