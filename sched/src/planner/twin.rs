//! The `twin` policy: at each window, forecast the next windows' arrival
//! rates from the rates seen ([`forecast`]), simulate each candidate
//! deployment over that horizon in the twin ([`Twin`], which the simulator
//! implements: `sched` cannot depend on it), and take the best by good
//! requests per GPU-hour, net of the change's cost.
//!
//! Candidates (a small set, not `has::tune`): the deployment in force, one
//! worker more or fewer in each stage, and each move of one worker from a
//! stage to another (a role change), those the cluster's GPUs and slots
//! allow ([`Planner::feasible`]). A candidate's score is
//! `good / (gpu_h + cost_h)`: `good` the requests the twin finds meeting the
//! SLO tier over the horizon, `gpu_h` its GPUs times the horizon, and
//! `cost_h` the GPU-hours of the change itself, the moved or added worker's
//! GPUs held through its model load (`load_s`) without serving. Ties keep
//! the deployment in force.

use super::{PlanRecord, Planner};

/// What the twin is asked ([`Twin::good_requests`]).
#[derive(Clone, Debug, PartialEq)]
pub struct TwinQuery {
    /// Workers per stage (encode, remote prefill, decode).
    pub counts: [u32; 3],
    /// Forecast rate of each coming window, requests/s.
    pub rates: Vec<f64>,
    /// Window length, seconds.
    pub window_s: f64,
    /// Requests waiting now, to be served first (they arrive at the
    /// horizon's start).
    pub backlog: usize,
    /// The offload ratio `s` the candidate runs with
    /// ([`Planner::offload_for`] its remote prefill workers).
    pub offload: f64,
    /// A seed for the twin's arrivals (the same for every candidate of one
    /// decision, so they meet the same requests).
    pub seed: u64,
}

/// A simulator the `twin` policy tries candidates in.
pub trait Twin {
    /// Requests that meet the planner's SLO tier when `q.counts` workers
    /// serve `q.backlog` requests at once and then arrivals at `q.rates`.
    fn good_requests(&mut self, q: &TwinQuery) -> f64;
}

/// The rates of the next `n` windows, requests/s, from the rates seen
/// (`seen`, oldest first): a least-squares line through the last three
/// windows (two points give a trend, a third damps one window's Poisson
/// noise), evaluated at each coming window, floored at 0; the last rate
/// held when fewer than three were seen.
pub fn forecast(seen: &[f64], n: usize) -> Vec<f64> {
    let k = seen.len().min(3);
    let Some(&last) = seen.last() else {
        return vec![0.0; n];
    };
    if k < 3 {
        return vec![last; n];
    }
    let ys = &seen[seen.len() - k..];
    let xm = (k as f64 - 1.0) / 2.0;
    let ym = ys.iter().sum::<f64>() / k as f64;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (i, y) in ys.iter().enumerate() {
        let dx = i as f64 - xm;
        sxy += dx * (y - ym);
        sxx += dx * dx;
    }
    let slope = sxy / sxx;
    (1..=n)
        .map(|j| (ym + slope * (k as f64 - 1.0 - xm + j as f64)).max(0.0))
        .collect()
}

/// A `twin` decision's simulations, snapshot at the window it is taken
/// for ([`Planner::observe`]): owned data, so a driver can run it on
/// another thread while its loop keeps serving, and hand the results to
/// [`Planner::conclude`].
#[derive(Clone, Debug, PartialEq)]
pub struct TwinJob {
    /// The window's end the decision is taken for, seconds.
    pub at: f64,
    /// Active workers per stage then.
    pub counts: [u32; 3],
    /// One query per candidate, the deployment in force first.
    pub queries: Vec<TwinQuery>,
}

impl TwinJob {
    /// The forecast rates every candidate is run at, requests/s per window.
    pub fn rates(&self) -> &[f64] {
        self.queries.first().map_or(&[], |q| &q.rates)
    }

    /// Ask `twin` each query in order: the good requests of each candidate.
    pub fn run(&self, twin: &mut dyn Twin) -> Vec<f64> {
        self.queries.iter().map(|q| twin.good_requests(q)).collect()
    }
}

impl Planner {
    /// The `twin` decision at `now` with `backlog` requests waiting: the
    /// forecast and the candidates (module doc), as queries for the twin.
    pub(super) fn twin_job(&self, now: f64, backlog: usize) -> TwinJob {
        let w = self.cfg.window_s;
        let n = (self.cfg.horizon_s / w).ceil().max(1.0) as usize;
        let rates = forecast(&self.rates, n);
        let cur = self.counts();
        let mut cands = vec![cur];
        for k in 0..3 {
            let mut up = cur;
            up[k] += 1;
            cands.push(up);
            if cur[k] > 0 {
                let mut down = cur;
                down[k] -= 1;
                cands.push(down);
            }
            for j in (0..3).filter(|&j| j != k && cur[j] > 0) {
                let mut mv = cur;
                mv[k] += 1;
                mv[j] -= 1;
                cands.push(mv);
            }
        }
        cands.retain(|c| self.feasible(*c));
        let seed = (now * 1e3) as u64;
        let queries = cands
            .into_iter()
            .map(|c| TwinQuery {
                counts: c,
                rates: rates.clone(),
                window_s: w,
                backlog,
                offload: self.offload_for(c[1]),
                seed,
            })
            .collect();
        TwinJob {
            at: now,
            counts: cur,
            queries,
        }
    }

    /// The best of `job`'s candidates by good requests per GPU-hour, net of
    /// the change's cost, given `good` per candidate (module doc); each
    /// candidate's score and the forecast go to `rec`.
    pub(super) fn twin_pick(
        &self,
        job: &TwinJob,
        good: &[f64],
        rec: &mut PlanRecord,
    ) -> Option<[u32; 3]> {
        let cur = job.counts;
        let gpw = self.gpus_per_worker();
        let horizon_h = job.rates().len() as f64 * self.cfg.window_s / 3600.0;
        let mut best: Option<([u32; 3], f64)> = None;
        for (q, &good) in job.queries.iter().zip(good) {
            let c = q.counts;
            let added: f64 = (0..3)
                .map(|k| c[k].saturating_sub(cur[k]) as f64 * gpw[k] as f64 * self.cfg.load_s[k])
                .sum();
            let gpu_h = self.gpus_of(c) as f64 * horizon_h + added / 3600.0;
            let score = if gpu_h > 0.0 { good / gpu_h } else { 0.0 };
            rec.candidates.push((c, score));
            if best.is_none_or(|(_, s)| score > s) {
                best = Some((c, score));
            }
        }
        rec.forecast = job.rates().to_vec();
        best.map(|(c, _)| c)
    }
}
