//! The planner in the simulator: a decision at the end of each window
//! (`easerve_sched::planner::Planner`), its changes handed to the
//! controller, model loads timed from the scenario's load times, the
//! GPU-hours the run held, each change with when it was decided, when its
//! worker stopped and when the new one was ready; and the twin the `twin`
//! policy tries its candidates in ([`SimTwin`]: this crate's own
//! simulator, over the forecast, from an empty cluster with the requests
//! waiting now arriving at once).

use crate::engine::{simulate_with, SimOptions};
use easerve_calib::{EncodeTime, StageCost};
use easerve_model::{ItemTokens, Parallel};
use easerve_sched::planner::{PlannerPolicy, Twin, TwinQuery};
use easerve_sched::Topology;
use easerve_workload::plan::PlanLedger;
use easerve_workload::scenario::Scenario;
use easerve_workload::schedule::{Phase, RateSchedule};
use std::sync::Arc;

/// A cost source shared by every twin run of one simulation.
pub(super) struct Shared(pub(super) Arc<dyn StageCost>);

impl StageCost for Shared {
    fn encode_tp(&self, items: &[ItemTokens], sm_share: f64, tp: u32) -> EncodeTime {
        self.0.encode_tp(items, sm_share, tp)
    }
    fn preprocess(&self, items: &[ItemTokens]) -> f64 {
        self.0.preprocess(items)
    }
    fn prefill(&self, seq_lens: &[u64], par: Parallel, sm_share: f64) -> f64 {
        self.0.prefill(seq_lens, par, sm_share)
    }
    fn prefill_cached(&self, new: &[u64], cached: &[u64], par: Parallel, sm_share: f64) -> f64 {
        self.0.prefill_cached(new, cached, par, sm_share)
    }
    fn decode_step(&self, batch: u64, ctx: u64, par: Parallel) -> f64 {
        self.0.decode_step(batch, ctx, par)
    }
    fn decode_steps(&self, batch: u64, ctx: u64, par: Parallel, steps: u64, out: &mut Vec<f64>) {
        self.0.decode_steps(batch, ctx, par, steps, out)
    }
    fn transfer(&self, bytes: f64) -> f64 {
        self.0.transfer(bytes)
    }
    fn kv_land(&self, tp: u32, tokens: u64) -> f64 {
        self.0.kv_land(tp, tokens)
    }
    fn time_slice_penalty(&self) -> f64 {
        self.0.time_slice_penalty()
    }
    fn bandwidth_interference(&self) -> f64 {
        self.0.bandwidth_interference()
    }
    fn notes(&self) -> Vec<String> {
        self.0.notes()
    }
}

/// The twin the `twin` policy asks: the scenario with the candidate's
/// workers per stage, arrivals at the forecast rates (a constant phase per
/// window, drawn by the scenario's own generator with the query's seed)
/// after the backlog, all at once; a request counts when it meets the
/// planner's tier. Candidates with a new encode worker get the local
/// prefill worker the layout gives every encode GPU group, where the
/// running deployment's spare encode workers have none.
pub struct SimTwin {
    sc: Scenario,
    cost: Arc<dyn StageCost>,
    tier: usize,
}

impl SimTwin {
    /// A twin of `sc` (its planner removed) pricing with `cost`.
    pub fn new(sc: &Scenario, cost: Arc<dyn StageCost>) -> SimTwin {
        let mut sc = sc.clone();
        let tier = sc.planner.as_ref().map_or(0, |p| p.tier);
        sc.planner = None;
        sc.workload.window_s = None;
        SimTwin { sc, cost, tier }
    }
}

impl Twin for SimTwin {
    fn good_requests(&mut self, q: &TwinQuery) -> f64 {
        let mut sc = self.sc.clone();
        let a = &mut sc.deployment.allocation;
        a.encode.workers = q.counts[0];
        a.prefill.workers = q.counts[1];
        a.decode.workers = q.counts[2];
        sc.deployment.offload = q.offload;
        let mut phases = Vec::new();
        // the backlog arrives within a millisecond
        const BURST_S: f64 = 1e-3;
        if q.backlog > 0 {
            phases.push(Phase::Constant {
                duration_s: BURST_S,
                rate: q.backlog as f64 / BURST_S,
            });
        }
        phases.extend(q.rates.iter().map(|&r| Phase::Constant {
            duration_s: q.window_s,
            rate: r,
        }));
        let Some(schedule) = RateSchedule::new(phases) else {
            return 0.0;
        };
        let total = schedule.integral(schedule.period_s());
        let n = total.round() as usize;
        if n == 0 {
            return 0.0;
        }
        sc.workload.rate = total / schedule.period_s();
        sc.workload.requests = n;
        sc.workload.schedule = Some(schedule);
        sc.seed = q.seed;
        let out = simulate_with(
            &sc,
            Box::new(Shared(self.cost.clone())),
            &SimOptions::default(),
        );
        out.report
            .goodput
            .get(self.tier)
            .map_or(0.0, |t| t.good as f64)
    }
}

/// The planner of one run ([`PlanLedger`]: its decisions, changes and
/// GPU-hours) and the twin its `twin` policy asks.
pub(super) struct PlanRun {
    pub(super) book: PlanLedger,
    twin: Option<SimTwin>,
}

impl PlanRun {
    /// The planner of `sc`, if it has one.
    pub(super) fn of(
        sc: &Scenario,
        topology: &Topology,
        cost: &Arc<dyn StageCost>,
    ) -> Option<PlanRun> {
        let book = PlanLedger::of(sc, topology)?;
        let twin = (book.planner.config().policy == PlannerPolicy::Twin)
            .then(|| SimTwin::new(sc, cost.clone()));
        Some(PlanRun { book, twin })
    }

    /// Decide at the end of a window: the changes, queued for the controller.
    pub(super) fn decide(
        &mut self,
        now: f64,
        loads: [easerve_sched::StageLoad; 3],
        arrived: u64,
    ) -> std::ops::Range<usize> {
        let twin = self.twin.as_mut().map(|t| t as &mut dyn Twin);
        self.book.decide(now, loads, arrived, twin)
    }
}
