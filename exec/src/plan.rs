//! From a scenario to the [`Controller`] that runs it: the same workload, the
//! same batcher parameters and SM table the simulator builds, from the same
//! cost source.

use easerve_calib::StageCost;
use easerve_model::ItemTokens;
use easerve_sched::{Controller, ControllerConfig};
use easerve_workload::generate::generate_with_tokens;
use easerve_workload::Scenario;

/// The controller for `sc` with policy costs (`W(k) = T_enc(k)`, the SM
/// table) from `cost`, and the per-request item tokens.
pub fn build_controller(sc: &Scenario, cost: &dyn StageCost) -> (Controller, Vec<Vec<ItemTokens>>) {
    let (requests, tokens) = generate_with_tokens(sc);
    let dep = &sc.deployment;
    let (batchers, split) = sc.encode_policies(&requests, &tokens, cost);
    let cfg = ControllerConfig {
        batchers,
        topology: sc.topology(),
        decode: sc.decode_schedulers(),
        prefill_token_budget: sc.knobs.prefill_token_budget,
        prefill_max_seqs: sc.knobs.prefill_max_seqs,
        max_inflight_transfers: sc.knobs.max_inflight_transfers,
        router: (dep.router.clone(), dep.offload),
        split,
        admission_limit: sc.knobs.admission_limit,
    };
    (Controller::new(requests, cfg), tokens)
}
