//! A deployment resolved into the controller that runs it: what each serving
//! system means — its workers (the EPD stages, or the aggregated system's
//! replicas), its encode policies, its mechanisms — laid out here, from the
//! numbers a scenario's cost model supplies ([`Resolution`]). The scenario
//! prices (KV memory, encode times); this module decides the layout, so no
//! caller rewrites a deployment per system.

use crate::{
    Batcher, ControllerConfig, DecodeScheduler, Deployment, DispatchPolicy, KvBlocks, Limits,
    RateEstimate, SmSplit, System, Topology,
};

/// Everything a [`ControllerConfig`] is resolved from.
#[derive(Clone, Debug)]
pub struct Resolution<'a> {
    /// The serving system.
    pub system: System,
    /// The deployment as the system runs it (its policy set applied,
    /// [`System::deployment`]).
    pub deployment: &'a Deployment,
    /// TP of each local prefill worker (`None`: no local prefill).
    pub local_prefill_tp: Option<u32>,
    /// The aggregated system's replicas and their TP (`gpus / TP` of them);
    /// `None` for the EPD systems.
    pub replicas: Option<(u32, u32)>,
    /// KV blocks of one worker that holds KV caches: a decode worker, or an
    /// aggregated replica (whose memory also holds the encoder's weights).
    pub kv: KvBlocks,
    /// Sequences in one decode batch.
    pub decode_max_batch: usize,
    /// Prefill token budget per batch.
    pub prefill_token_budget: u64,
    /// Prefill sequences per batch.
    pub prefill_max_seqs: usize,
    /// Embedding envelopes one encode worker may have in flight.
    pub max_inflight_transfers: usize,
    /// Requests admitted and not finished before an arrival is turned away.
    pub admission_limit: Option<usize>,
    /// What one request may ask for; arrivals over a limit are refused.
    pub limits: Limits,
    /// Seconds after arrival at which an unfinished request is aborted
    /// ([`ControllerConfig::client_timeout_s`]).
    pub client_timeout_s: Option<f64>,
    /// Preprocessing is a pipelined host stage ([`ControllerConfig::preprocess_ahead`]).
    pub preprocess_ahead: bool,
    /// The offered rate, requests/s: the Poisson-gap rule's starting
    /// estimate is its share per encode worker when the deployment gives none.
    pub rate: f64,
    /// How each encode worker estimates its arrival rate for the Poisson-gap
    /// rule ([`RateEstimate`]); with [`RateEstimate::Ewma`] the offload
    /// router tracks the rate too ([`crate::Router::tracking`]).
    pub rate_estimate: RateEstimate,
    /// Keep the decision log.
    pub log_decisions: bool,
    /// Spare slots per stage (encode, remote prefill, decode) standing by for
    /// a planner ([`Topology::with_spares`]); `[0; 3]` without one.
    pub spares: [u32; 3],
    /// The caches (all off by default).
    pub caches: crate::CacheConfig,
    /// The deployment placed on a cluster of node groups
    /// ([`Topology::placed`]), when the scenario gives groups; `None` lays
    /// the workers out on one node ([`Topology::with_spares`]).
    pub placed: Option<&'a Topology>,
}

impl Resolution<'_> {
    /// The workers: the aggregated system's replicas, or the allocation's
    /// encode, prefill and decode workers with the local prefill groups.
    pub fn topology(&self) -> Topology {
        if let Some(t) = self.placed {
            return t.clone();
        }
        match self.replicas {
            Some((n, tp)) => Topology::replicas(n, tp),
            None => Topology::with_spares(
                &self.deployment.allocation,
                self.local_prefill_tp,
                self.spares,
            ),
        }
    }

    /// The dispatch policy each encode worker runs: the deployment's, with
    /// the Poisson-gap estimate seeded from the offered rate per encode worker
    /// when the deployment gives no hint.
    pub fn encode_dispatch(&self) -> DispatchPolicy {
        let workers = self.deployment.allocation.encode.workers;
        match self.deployment.dispatch.clone() {
            DispatchPolicy::PoissonGap {
                q,
                max_age_s,
                rate_hint: None,
            } if workers > 0 => DispatchPolicy::PoissonGap {
                q,
                max_age_s,
                rate_hint: Some(self.rate / workers as f64),
            },
            d => d,
        }
    }

    /// The controller's configuration. `t_enc(k, share)` is the time, in
    /// seconds, a pass of `k` typical requests holds its encode worker at SM
    /// share `share` (the batcher's `W(k)` at share 1, and the SM table of a
    /// local prefill deployment); it is not called for the aggregated system.
    pub fn config(&self, t_enc: impl Fn(usize, f64) -> f64) -> ControllerConfig {
        let dep = self.deployment;
        let (batchers, split, decode, replicas) = match self.replicas {
            Some((n, _)) => (
                Vec::new(),
                SmSplit::Static(1.0),
                Vec::new(),
                self.schedulers(n),
            ),
            None => {
                let split = if dep.has_local_prefill() {
                    SmSplit::new(&dep.sm_policy, dep.max_batch, &t_enc)
                } else {
                    SmSplit::Static(1.0)
                };
                let dispatch = self.encode_dispatch();
                let batchers = (0..dep.allocation.encode.workers + self.spares[0])
                    .map(|_| {
                        Batcher::new(&dispatch, dep.max_batch, |k| t_enc(k, 1.0))
                            .with_estimator(self.rate_estimate)
                    })
                    .collect();
                let decode = self.schedulers(dep.allocation.decode.workers + self.spares[2]);
                (batchers, split, decode, Vec::new())
            }
        };
        ControllerConfig {
            batchers,
            topology: self.topology(),
            decode,
            replicas,
            prefill_token_budget: self.prefill_token_budget,
            prefill_max_seqs: self.prefill_max_seqs,
            max_inflight_transfers: self.max_inflight_transfers,
            router: (dep.router.clone(), dep.offload),
            offload_tracking: match self.rate_estimate {
                RateEstimate::Ewma { tau_s } if self.replicas.is_none() => Some((self.rate, tau_s)),
                _ => None,
            },
            split,
            admission_limit: self.admission_limit,
            limits: self.limits(),
            client_timeout_s: self.client_timeout_s,
            log_decisions: self.log_decisions,
            preprocess_ahead: self.preprocess_ahead,
            mechanisms: self.system.mechanisms(),
            caches: self.caches,
            queue_area: false,
        }
    }

    /// The limits the controller checks arrivals against: the scenario's,
    /// with `max_model_len` at most what one sequence's KV cache can hold on
    /// a decode worker (or replica): every block of its empty cache, plus
    /// the last token, whose KV is never stored
    /// ([`DecodeScheduler::max_context_tokens`]). A longer request could
    /// only fail once its KV cache reached decode; refused at arrival, it
    /// costs no work, and the server's 400 says the same.
    pub fn limits(&self) -> Limits {
        let kv_len = self.kv.total() * self.kv.block_size() + 1;
        let mut limits = self.limits.clone();
        limits.max_model_len = Some(limits.max_model_len.map_or(kv_len, |l| l.min(kv_len)));
        limits
    }

    /// `n` continuous-batching schedulers of [`Resolution::kv`] blocks each.
    pub fn schedulers(&self, n: u32) -> Vec<DecodeScheduler> {
        (0..n)
            .map(|_| DecodeScheduler::new(self.kv, self.decode_max_batch))
            .collect()
    }

    /// Requests the deployment holds in work at once, none of them queued,
    /// when each holds `context` tokens of KV cache (prompt plus output):
    /// each encode worker's micro-batch in its pass and its envelopes in
    /// flight (`B · (1 + max_inflight_transfers)`), each prefill worker's
    /// batch (`prefill_max_seqs`, local workers included), and each decode
    /// worker's running batch (`decode_max_batch`, or the sequences of
    /// `context` tokens its KV blocks hold, if fewer); for the aggregated
    /// system, each replica's running batch alone.
    pub fn requests_in_work(&self, context: u64) -> usize {
        let per_seq = self.kv.blocks_for(context.max(1)).max(1);
        let running = self
            .decode_max_batch
            .min(usize::try_from(self.kv.total() / per_seq).unwrap_or(usize::MAX));
        if let Some((replicas, _)) = self.replicas {
            return running * replicas as usize;
        }
        let a = &self.deployment.allocation;
        let encode = a.encode.workers as usize
            * self.deployment.max_batch
            * (1 + self.max_inflight_transfers);
        let prefill = self.topology().prefill().len() * self.prefill_max_seqs;
        encode + prefill + running * a.decode.workers as usize
    }
}
