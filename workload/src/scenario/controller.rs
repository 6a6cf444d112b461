//! The [`easerve_sched::Controller`] a scenario lays out, as every driver
//! runs it: the scenario supplies the numbers its cost model prices (the KV
//! blocks of a worker, a pass's encode time, for HydraInfer its step budgets,
//! [`Scenario::apply_step_budgets`]) as an [`easerve_sched::Resolution`], and
//! `sched` resolves what its system means (its workers, encode policies and
//! mechanisms).

use super::Scenario;

impl Scenario {
    /// What the controller of a run of this scenario is resolved from
    /// ([`easerve_sched::Resolution`]): the system, the deployment, the knobs,
    /// the offered rate and the KV blocks of one decode worker, or of one
    /// aggregated replica, from the model's and GPU's memory (a property of
    /// model × GPU whatever the cost source;
    /// `Roofline::kv_bytes_free_per_gpu`, after the LLM's weights and, on a
    /// replica, the encoder's).
    pub fn resolution(&self, log_decisions: bool) -> easerve_sched::Resolution<'_> {
        use easerve_calib::{Efficiency, Roofline};
        use easerve_model::Parallel;
        let replicas = self.aggregated();
        let (par, encoder_bytes) = match replicas {
            Some((_, tp)) => (Parallel::from(tp), self.model.encoder_weight_bytes()),
            None => {
                let d = self.deployment.allocation.decode;
                (Parallel::new(d.tp, d.ep), 0.0)
            }
        };
        let free = Roofline::new(self.model.clone(), self.gpu.clone(), Efficiency::default())
            .kv_bytes_free_per_gpu(par, encoder_bytes, self.knobs.gpu_memory_utilization)
            .unwrap_or(0.0)
            * par.gpus() as f64;
        easerve_sched::Resolution {
            system: self.system,
            deployment: &self.deployment,
            local_prefill_tp: self.knobs.local_prefill_tp,
            replicas,
            kv: easerve_sched::KvBlocks::from_memory(
                free,
                self.model.kv_bytes_per_token(),
                self.knobs.kv_block_size,
            ),
            decode_max_batch: self.knobs.decode_max_batch,
            prefill_token_budget: self.knobs.prefill_token_budget,
            prefill_max_seqs: self.knobs.prefill_max_seqs,
            max_inflight_transfers: self.knobs.max_inflight_transfers,
            admission_limit: self.knobs.admission_limit,
            limits: self.model_limits(),
            client_timeout_s: self.workload.timeout_s,
            preprocess_ahead: self.knobs.preprocess_threads.is_some(),
            rate: self.workload.rate,
            rate_estimate: self.knobs.rate_estimate,
            log_decisions,
            spares: self.planner_spares(),
            caches: self.knobs.caches,
            placed: self.cluster.as_ref().map(|c| &c.topology),
        }
    }

    /// Where the deployment's workers run: GPUs, labels and local-prefill
    /// groups ([`easerve_sched::Topology`]), built from the allocation and the
    /// local prefill TP; for the aggregated system, its replicas
    /// ([`easerve_sched::Topology::replicas`]; the allocation is not used).
    pub fn topology(&self) -> easerve_sched::Topology {
        self.resolution(false).topology()
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

    /// One continuous-batching scheduler per decode worker, with the KV blocks
    /// of [`Scenario::resolution`].
    pub fn decode_schedulers(&self) -> Vec<easerve_sched::DecodeScheduler> {
        self.resolution(false)
            .schedulers(self.deployment.allocation.decode.workers)
    }

    /// The [`easerve_sched::Controller`] of one run of this scenario, as both
    /// faces drive it: `requests` (with their per-item `tokens`, for the
    /// policies' costs) and the configuration of
    /// [`Scenario::controller_config`]. `log_decisions` keeps the decision
    /// log.
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

    /// The layout and policies of [`Scenario::controller`], resolved in
    /// `sched` ([`easerve_sched::Resolution::config`]), for a controller
    /// whose requests may come later
    /// ([`easerve_sched::Controller::add_request`], as `easerve serve` learns
    /// of them). A typical request's items (median encoder tokens, over
    /// `requests` with their per-item `tokens`) stand for "a request" in the
    /// batcher's `W(k) = T_enc(k)` and in the SM table, both from `cost`
    /// (seconds): the time a pass holds its worker
    /// ([`easerve_calib::EncodeTime::pass`]), which leaves preprocessing out
    /// when it is pipelined, at the allocation's encode TP
    /// ([`easerve_calib::StageCost::encode_tp`]).
    pub fn controller_config(
        &self,
        requests: &[easerve_sched::Request],
        tokens: &crate::generate::ItemTokenTable,
        cost: &dyn easerve_calib::StageCost,
        log_decisions: bool,
    ) -> easerve_sched::ControllerConfig {
        use crate::generate::{typical_batch, typical_items};
        let typical = typical_items(requests, tokens);
        let threads = self.knobs.preprocess_threads;
        let tp = self.deployment.allocation.encode.tp;
        let mut cfg = self.resolution(log_decisions).config(|k, share| {
            cost.encode_tp(&typical_batch(&typical, k), share, tp)
                .pass(threads)
        });
        // a planner reading the mean queue needs the queues integrated
        cfg.queue_area = self
            .planner
            .as_ref()
            .is_some_and(|p| p.config.rule.signal == easerve_sched::planner::QueueSignal::Mean);
        cfg
    }

    /// The scenario's limits with `max_model_len` at most the model's own
    /// maximum positions ([`easerve_model::LlmArch::max_positions`], its
    /// config's `max_position_embeddings`); the controller bounds it further
    /// by what one sequence's KV cache can hold
    /// ([`easerve_sched::Resolution::limits`]).
    pub fn model_limits(&self) -> easerve_sched::Limits {
        let mut limits = self.limits.clone();
        if let Some(m) = self.model.llm.max_positions {
            limits.max_model_len = Some(limits.max_model_len.map_or(m, |l| l.min(m)));
        }
        limits
    }

    /// The admission limit `easerve serve` takes when neither the scenario
    /// nor `--admission-limit` gives one: twice the requests the deployment
    /// holds in work at once ([`easerve_sched::Resolution::requests_in_work`],
    /// at the mean KV context of the scenario's workload: prompt, multimodal
    /// and output tokens). By Little's law the requests queued beyond those
    /// in work then wait about one of their E2E times at most; a burst
    /// larger than that is turned away (429) rather than queued without
    /// bound, each queued request holding its decoded media in the server.
    pub fn default_admission_limit(&self) -> usize {
        let (requests, _) = crate::generate::generate_with_tokens(self);
        let n = requests.len().max(1) as u64;
        let context: u64 = requests
            .iter()
            .map(|r| r.prefill_tokens() + u64::from(r.output_tokens))
            .sum::<u64>()
            / n;
        2 * self.resolution(false).requests_in_work(context).max(1)
    }

    /// HydraInfer's step budgets ([`easerve_sched::StepBudgets`]) from this
    /// scenario's cost model, as its profiler measures them on the instances
    /// that run them: images of 336 × 336 pixels encoded on one GPU, prompts
    /// of 16 tokens prefilled at the prefill workers' layout (the local one
    /// in the EP+D form) and at the decode workers'.
    pub fn step_budgets(&self) -> easerve_sched::StepBudgets {
        use easerve_model::Parallel;
        use easerve_sched::budget::PROBE_PROMPT_TOKENS;
        let cost = self.cost();
        let a = &self.deployment.allocation;
        let prefill_par = if a.prefill.workers > 0 {
            Parallel::new(a.prefill.tp, a.prefill.ep)
        } else {
            Parallel::new(self.knobs.local_prefill_tp.unwrap_or(1), 1)
        };
        let probe = self.model.image_tokens(336, 336).ok();
        let fill = |par: Parallel, n: u64| {
            let prompts = (n / PROBE_PROMPT_TOKENS).max(1) as usize;
            cost.prefill(&vec![PROBE_PROMPT_TOKENS; prompts], par, 1.0)
        };
        easerve_sched::StepBudgets::from_step_times(
            |n| match probe {
                Some(item) => cost.encode(&vec![item; n as usize], 1.0).t_gpu,
                None => 0.0,
            },
            |n| fill(prefill_par, n),
            |n| fill(Parallel::new(a.decode.tp, a.decode.ep), n),
        )
    }

    /// What the system adds to the deployment, for a report's notes: the
    /// mechanisms of `epd-serve` and `hydrainfer` and where they come from;
    /// `None` for the others.
    pub fn system_note(&self) -> Option<String> {
        use easerve_sched::budget::{DECODE_TPOT_SLO_S, NO_DECODE_TPOT_SLO_S};
        match self.system {
            easerve_sched::System::EpdServe => Some(format!(
                "epd-serve: encode instances take turns (round robin), each request's images are shards encoded on their own (intra-request parallelism) and its prefill waits for every shard; each encode pass takes all that waits up to B = {} (github.com/vbdi/epdserve 9b111f7: epdserve/engine_encoding.py, epdserve/scheduler_encoding.py, epdserve/scheduler_context.py)",
                self.deployment.max_batch
            )),
            easerve_sched::System::HydraInfer => Some(format!(
                "hydrainfer: form {}; image budget B = {} requests a step, token budget {} tokens a prefill step (chunked prefill), decode steps of at most {} sequences: the largest whose step fits its instance's TPOT SLO ({} s encoding or prefilling, {} s decoding; hydrainfer/engine/profiler.py, hydrainfer/config/node/*.yaml){}",
                if self.deployment.allocation.prefill.workers > 0 { "E+P+D" } else { "EP+D" },
                self.deployment.max_batch,
                self.knobs.prefill_token_budget,
                self.knobs.decode_max_batch,
                NO_DECODE_TPOT_SLO_S,
                DECODE_TPOT_SLO_S,
                if self.deployment.allocation.prefill.workers > 0 {
                    ""
                } else {
                    "; each EP instance runs encode and prefill on two CUDA streams of its GPUs, time-sliced (no SM partition), and starts both together each step"
                }
            )),
            _ => None,
        }
    }

    /// Set HydraInfer's budgets ([`Scenario::step_budgets`]) as the knobs
    /// they are: the image budget is the encode batch bound B, the token
    /// budget the prefill token budget (chunked), and decode steps take at
    /// most the decode token budget of sequences.
    pub fn apply_step_budgets(&mut self) {
        let b = self.step_budgets();
        self.deployment.max_batch = b.images as usize;
        self.knobs.prefill_token_budget = b.prefill_tokens;
        self.knobs.decode_max_batch = self.knobs.decode_max_batch.min(b.decode_tokens as usize);
    }
}
