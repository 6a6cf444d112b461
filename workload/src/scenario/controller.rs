//! The [`easerve_sched::Controller`] a scenario lays out, as both faces
//! (simulator and executor) drive it: the [`Scenario::topology`], the encode
//! policies (batchers and SM split, [`Scenario::encode_policies`]) and their
//! dispatch, and one decode scheduler per decode worker; for the aggregated
//! system, its replicas ([`Scenario::replica_schedulers`]) instead.

use super::Scenario;

impl Scenario {
    /// Where the deployment's workers run: GPUs, labels and local-prefill
    /// groups ([`easerve_sched::Topology`]), built from the allocation and the
    /// local prefill TP.
    /// For the aggregated system, its replicas: `gpus / aggregated_tp` of
    /// them ([`easerve_sched::Topology::replicas`]); the allocation is not used.
    pub fn topology(&self) -> easerve_sched::Topology {
        match self.aggregated() {
            Some((replicas, tp)) => easerve_sched::Topology::replicas(replicas, tp),
            None => easerve_sched::Topology::new(
                &self.deployment.allocation,
                self.knobs.local_prefill_tp,
            ),
        }
    }

    /// The aggregated system's layout, `(replicas, TP)`: `gpus / TP` replicas
    /// (at least one) of the validated `deployment.aggregated_tp`; `None`
    /// for the EPD systems.
    pub fn aggregated(&self) -> Option<(u32, u32)> {
        if self.system != super::System::Aggregated {
            return None;
        }
        let tp = self.knobs.aggregated_tp?;
        Some(((self.gpus / tp).max(1), tp))
    }

    /// One KV and batch scheduler per aggregated replica, with the KV blocks
    /// its TP group holds after the LLM's and the encoder's weights
    /// (`Roofline::kv_bytes_free_per_gpu`); empty for the EPD systems.
    pub fn replica_schedulers(&self) -> Vec<easerve_sched::DecodeScheduler> {
        use easerve_calib::{Efficiency, Roofline};
        use easerve_sched::{DecodeScheduler, KvBlocks};
        let Some((replicas, tp)) = self.aggregated() else {
            return Vec::new();
        };
        let memory = Roofline::new(self.model.clone(), self.gpu.clone(), Efficiency::default());
        let kv_bytes = memory
            .kv_bytes_free_per_gpu(
                tp,
                self.model.encoder_weight_bytes(),
                self.knobs.gpu_memory_utilization,
            )
            .unwrap_or(0.0)
            * tp as f64;
        let kv = KvBlocks::from_memory(
            kv_bytes,
            self.model.kv_bytes_per_token(),
            self.knobs.kv_block_size,
        );
        (0..replicas)
            .map(|_| DecodeScheduler::new(kv, self.knobs.decode_max_batch))
            .collect()
    }

    /// One continuous-batching scheduler per decode worker, with the KV blocks
    /// its TP group's memory holds after the LLM weights (a property of model
    /// × GPU whatever the cost source; `Roofline::kv_bytes_free_per_gpu`).
    pub fn decode_schedulers(&self) -> Vec<easerve_sched::DecodeScheduler> {
        use easerve_calib::{Efficiency, Roofline};
        use easerve_sched::{DecodeScheduler, KvBlocks};
        let d = self.deployment.allocation.decode;
        let par = easerve_model::Parallel::new(d.tp, d.ep);
        let free = Roofline::new(self.model.clone(), self.gpu.clone(), Efficiency::default())
            .kv_bytes_free_per_gpu(par, 0.0, self.knobs.gpu_memory_utilization)
            .unwrap_or(0.0)
            * par.gpus() as f64;
        let kv = KvBlocks::from_memory(
            free,
            self.model.kv_bytes_per_token(),
            self.knobs.kv_block_size,
        );
        (0..self.deployment.allocation.decode.workers)
            .map(|_| DecodeScheduler::new(kv, self.knobs.decode_max_batch))
            .collect()
    }

    /// The encode-side policies of a run, as both faces build them: one
    /// [`easerve_sched::Batcher`] per encode worker and the SM split. A
    /// typical request's items (median encoder tokens, over `requests` with
    /// their per-item `tokens`) stand for "a request" in the batcher's
    /// `W(k) = T_enc(k)` and in the SM table, both from `cost` (seconds):
    /// the time a pass holds its worker ([`easerve_calib::EncodeTime::pass`]),
    /// which leaves preprocessing out when it is pipelined.
    pub fn encode_policies(
        &self,
        requests: &[easerve_sched::Request],
        tokens: &crate::generate::ItemTokenTable,
        cost: &dyn easerve_calib::StageCost,
    ) -> (Vec<easerve_sched::Batcher>, easerve_sched::SmSplit) {
        use crate::generate::{typical_batch, typical_items};
        use easerve_sched::{Batcher, SmSplit};
        let dep = &self.deployment;
        let b = dep.max_batch;
        let typical = typical_items(requests, tokens);
        let threads = self.knobs.preprocess_threads;
        let t_enc = |k: usize, share: f64| {
            cost.encode(&typical_batch(&typical, k), share)
                .pass(threads)
        };
        let split = if dep.has_local_prefill() {
            SmSplit::new(&dep.sm_policy, b, t_enc)
        } else {
            SmSplit::Static(1.0)
        };
        let dispatch = self.encode_dispatch();
        let batchers = (0..dep.allocation.encode.workers)
            .map(|_| Batcher::new(&dispatch, b, |k| t_enc(k, 1.0)))
            .collect();
        (batchers, split)
    }

    /// The [`easerve_sched::Controller`] of one run of this scenario, as both
    /// faces drive it: `requests` (with their per-item `tokens`, for the
    /// policies' costs), the batchers and SM split of
    /// [`Scenario::encode_policies`], the [`Scenario::topology`], the decode
    /// schedulers and the knobs. `log_decisions` keeps the decision log.
    pub fn controller(
        &self,
        requests: Vec<easerve_sched::Request>,
        tokens: &crate::generate::ItemTokenTable,
        cost: &dyn easerve_calib::StageCost,
        log_decisions: bool,
    ) -> easerve_sched::Controller {
        let cfg = self.controller_config(&requests, tokens, cost, log_decisions);
        easerve_sched::Controller::new(requests, cfg)
    }

    /// The layout and policies of [`Scenario::controller`], for a controller
    /// whose requests come later ([`easerve_sched::Controller::add_request`],
    /// as `easerve serve` learns of them): `requests` and `tokens` only stand
    /// for a typical request in the encode policies' costs.
    pub fn controller_config(
        &self,
        requests: &[easerve_sched::Request],
        tokens: &crate::generate::ItemTokenTable,
        cost: &dyn easerve_calib::StageCost,
        log_decisions: bool,
    ) -> easerve_sched::ControllerConfig {
        let dep = &self.deployment;
        let (batchers, split, decode) = if self.aggregated().is_some() {
            (Vec::new(), easerve_sched::SmSplit::Static(1.0), Vec::new())
        } else {
            let (batchers, split) = self.encode_policies(requests, tokens, cost);
            (batchers, split, self.decode_schedulers())
        };
        easerve_sched::ControllerConfig {
            batchers,
            topology: self.topology(),
            decode,
            replicas: self.replica_schedulers(),
            prefill_token_budget: self.knobs.prefill_token_budget,
            prefill_max_seqs: self.knobs.prefill_max_seqs,
            max_inflight_transfers: self.knobs.max_inflight_transfers,
            router: (dep.router.clone(), dep.offload),
            split,
            admission_limit: self.knobs.admission_limit,
            log_decisions,
            preprocess_ahead: self.knobs.preprocess_threads.is_some(),
        }
    }

    /// The encode dispatch policy each encode worker runs: the scenario's,
    /// with the Poisson-gap rate estimate seeded from the offered rate per
    /// encode worker when the scenario gives no hint.
    pub fn encode_dispatch(&self) -> easerve_sched::DispatchPolicy {
        use easerve_sched::DispatchPolicy;
        let workers = self.deployment.allocation.encode.workers;
        match self.deployment.dispatch.clone() {
            DispatchPolicy::PoissonGap {
                q,
                max_age_s,
                rate_hint: None,
            } if workers > 0 => DispatchPolicy::PoissonGap {
                q,
                max_age_s,
                rate_hint: Some(self.workload.rate / workers as f64),
            },
            d => d,
        }
    }
}
