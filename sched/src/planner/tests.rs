use super::*;
use crate::harness::{config_for, test_request, Cluster, Service};
use crate::{
    Allocation, Batcher, Command, Controller, Decision, DispatchPolicy, Event, PrefillItem,
    RequestId, SmSplit,
};

fn cfg(policy: PlannerPolicy) -> PlannerConfig {
    PlannerConfig {
        policy,
        window_s: 10.0,
        dwell_s: 30.0,
        load_s: [1.0, 2.0, 2.0],
        cluster_gpus: 4,
        horizon_s: 40.0,
        rule: LoadRule::default(),
        offload: 0.5,
    }
}

/// 1E+1P+1D on 4 GPUs, with one spare slot per stage.
fn topology() -> Topology {
    let a: Allocation = "1E(TP1)+1P(TP1)+1D(TP1)".parse().unwrap();
    Topology::with_spares(&a, None, [1, 1, 1])
}

fn load(active: usize, queued: usize, kv: f64) -> StageLoad {
    StageLoad {
        active,
        queued,
        kv_used: kv,
        ..StageLoad::default()
    }
}

#[test]
fn forecast_extends_the_line_through_the_last_three_windows() {
    assert_eq!(forecast(&[], 2), vec![0.0, 0.0]);
    assert_eq!(forecast(&[1.0, 2.0], 2), vec![2.0, 2.0]);
    let f = forecast(&[5.0, 1.0, 2.0, 3.0], 2);
    assert!(
        (f[0] - 4.0).abs() < 1e-12 && (f[1] - 5.0).abs() < 1e-12,
        "{f:?}"
    );
    // floored at zero
    assert_eq!(forecast(&[3.0, 2.0, 1.0], 2), vec![0.0, 0.0]);
}

#[test]
fn a_dwell_shorter_than_a_model_load_is_refused_naming_the_field() {
    let mut c = cfg(PlannerPolicy::Load);
    c.dwell_s = 1.5;
    let e = Planner::new(c, &topology()).unwrap_err();
    assert_eq!(e.field, "planner.dwell_s");
    assert!(
        e.message.contains("shorter than a model load"),
        "{}",
        e.message
    );
    let unknown = "fancy".parse::<PlannerPolicy>().unwrap_err();
    assert!(unknown.contains("static, load, twin"), "{unknown}");
}

#[test]
fn load_policy_adds_on_a_hot_queue_then_holds_for_the_dwell_and_inside_the_band() {
    let mut p = Planner::new(cfg(PlannerPolicy::Load), &topology()).unwrap();
    let hot = [load(1, 12, 0.0), load(1, 0, 0.0), load(1, 0, 0.6)];
    // encode has 12 queued per worker > 0.5: a spare encode worker starts
    let c = p.on_window(10.0, hot, 10, None);
    assert_eq!(
        c,
        vec![Change::Start {
            worker: WorkerRef::Encode(1)
        }]
    );
    assert_eq!(p.counts(), [2, 1, 1]);
    // still hot, but within the dwell time of that change
    let mut hot2 = hot;
    hot2[0].active = 2;
    assert!(p.on_window(20.0, hot2, 20, None).is_empty());
    assert!(p.log()[1].held.as_deref().unwrap().contains("dwell"));
    // a change under way holds too
    let mut busy = hot2;
    busy[0].changing = 1;
    assert!(p.on_window(50.0, busy, 30, None).is_empty());
    assert_eq!(p.log()[2].held.as_deref(), Some("a change is under way"));
    // inside the band (0.2 ≤ queue per worker ≤ 0.5, 0.5 ≤ KV ≤ 0.9): no
    // change either way
    let mid = [load(2, 1, 0.0), load(3, 1, 0.0), load(1, 0, 0.7)];
    assert!(p.on_window(60.0, mid, 40, None).is_empty());
    assert_eq!(p.counts(), [2, 1, 1]);
    // cold everywhere: one worker goes, from the coldest stage that has two
    let cold = [load(2, 0, 0.0), load(1, 0, 0.0), load(1, 0, 0.1)];
    let c = p.on_window(70.0, cold, 50, None);
    assert_eq!(
        c,
        vec![Change::Drain {
            worker: WorkerRef::Encode(1),
            then: None
        }]
    );
    assert_eq!(p.counts(), [1, 1, 1]);
}

#[test]
fn busy_thresholds_grow_a_loaded_stage_before_a_queue_forms_and_keep_it_inside_the_band() {
    let mut c = cfg(PlannerPolicy::Load);
    c.rule.busy = Some(BusyRule {
        up: 0.5,
        down: 0.25,
    });
    c.dwell_s = 10.0;
    let mut p = Planner::new(c, &topology()).unwrap();
    // cumulative busy worker-seconds per stage at each window's end (10 s)
    let at = |busy: [f64; 3], active: [usize; 3]| {
        let mut l = [
            load(active[0], 0, 0.0),
            load(active[1], 0, 0.0),
            load(active[2], 0, 0.6),
        ];
        for k in 0..3 {
            l[k].busy_s = busy[k];
        }
        l
    };
    // prefill busy 7 of 10 s with nothing queued: hot on load alone
    let c = p.on_window(10.0, at([1.0, 7.0, 9.0], [1, 1, 1]), 10, None);
    assert_eq!(
        c[0],
        Change::Start {
            worker: WorkerRef::Prefill(1)
        }
    );
    assert!((p.log()[0].stages[1].busy - 0.7).abs() < 1e-12);
    // two prefill workers busy 0.3 of the window each: inside the band,
    // though the queue (0 < queue_down) alone would call it cold
    assert!(p
        .on_window(20.0, at([2.0, 13.0, 18.0], [1, 2, 1]), 20, None)
        .is_empty());
    assert_eq!(p.counts(), [1, 2, 1]);
    // busy 0.1 each: cold, one prefill worker goes
    let c = p.on_window(30.0, at([3.0, 15.0, 27.0], [1, 2, 1]), 30, None);
    assert_eq!(
        c[0],
        Change::Drain {
            worker: WorkerRef::Prefill(1),
            then: None
        }
    );
    assert_eq!(p.counts(), [1, 1, 1]);
    // without busy thresholds the same first window changes nothing
    let mut p = Planner::new(cfg(PlannerPolicy::Load), &topology()).unwrap();
    let c = p.on_window(10.0, at([1.0, 7.0, 9.0], [1, 1, 1]), 10, None);
    assert!(
        c.iter().all(|x| !matches!(x, Change::Start { .. })),
        "{c:?}"
    );
}

#[test]
fn load_policy_moves_a_worker_when_the_cluster_is_full() {
    let mut c = cfg(PlannerPolicy::Load);
    c.cluster_gpus = 3;
    let mut p = Planner::new(c, &topology()).unwrap();
    let mut loads = [load(1, 0, 0.0), load(1, 9, 0.0), load(1, 0, 0.1)];
    p.on_window(10.0, loads, 5, None);
    // no spare GPU, and every stage has one worker: nothing to take
    assert!(p.log()[0].changes.is_empty());
    c = cfg(PlannerPolicy::Load);
    c.cluster_gpus = 4;
    let mut p = Planner::new(c, &topology()).unwrap();
    // take the spare encode GPU first, then prefill is hot with encode cold
    loads[0].queued = 20;
    loads[1].queued = 0;
    p.on_window(10.0, loads, 5, None);
    assert_eq!(p.counts(), [2, 1, 1]);
    let loads = [load(2, 0, 0.0), load(1, 9, 0.0), load(1, 0, 0.6)];
    let c = p.on_window(50.0, loads, 10, None);
    assert_eq!(
        c,
        vec![
            Change::Drain {
                worker: WorkerRef::Encode(1),
                then: Some(WorkerRef::Prefill(1)),
            },
            Change::SetOffload { s: 1.0 }
        ]
    );
    assert_eq!(p.counts(), [1, 2, 1]);
}

/// A twin whose good requests grow with prefill workers only.
struct PrefillBound;
impl Twin for PrefillBound {
    fn good_requests(&mut self, q: &TwinQuery) -> f64 {
        let offered: f64 = q.rates.iter().sum::<f64>() * q.window_s + q.backlog as f64;
        offered.min(100.0 * q.counts[1] as f64)
    }
}

#[test]
fn twin_policy_takes_the_best_candidate_per_gpu_hour() {
    let mut p = Planner::new(cfg(PlannerPolicy::Twin), &topology()).unwrap();
    let loads = [load(1, 0, 0.0), load(1, 0, 0.0), load(1, 0, 0.0)];
    // 50 req/s offered: two prefill workers serve twice as much on 4 GPUs
    // as one does on 3
    let c = p.on_window(10.0, loads, 500, Some(&mut PrefillBound));
    // s follows the remote pool: 0.5 · 2 / 1
    assert_eq!(
        c,
        vec![
            Change::Start {
                worker: WorkerRef::Prefill(1)
            },
            Change::SetOffload { s: 1.0 }
        ]
    );
    let rec = &p.log()[0];
    assert_eq!(rec.forecast, vec![50.0; 4]);
    assert!(rec.candidates.len() > 3, "{:?}", rec.candidates);
    // without a twin it changes nothing and says so
    let mut q = Planner::new(cfg(PlannerPolicy::Twin), &topology()).unwrap();
    assert!(q.on_window(10.0, loads, 500, None).is_empty());
    assert!(q.log()[0].held.as_deref().unwrap().contains("no twin"));
}

#[test]
fn a_twin_decision_split_off_the_loop_holds_later_windows_and_applies_when_done() {
    let loads = [load(1, 0, 0.0), load(1, 0, 0.0), load(1, 0, 0.0)];
    let mut sync = Planner::new(cfg(PlannerPolicy::Twin), &topology()).unwrap();
    let want = sync.on_window(10.0, loads, 500, Some(&mut PrefillBound));
    let mut p = Planner::new(cfg(PlannerPolicy::Twin), &topology()).unwrap();
    let Step::Twin(job) = p.observe(10.0, loads, 500) else {
        panic!("no twin job");
    };
    // a window that ends while the job is out holds
    assert_eq!(p.observe(20.0, loads, 1000), Step::Changes(Vec::new()));
    assert!(p.log()[1]
        .held
        .as_deref()
        .unwrap()
        .contains("window at 10 s"));
    let good = job.run(&mut PrefillBound);
    assert_eq!(p.conclude(23.5, &job, &good), want);
    assert_eq!(p.counts(), sync.counts());
    let rec = &p.log()[0];
    assert_eq!((rec.at, rec.applied_at), (10.0, Some(23.5)));
    assert_eq!(rec.candidates, sync.log()[0].candidates);
    assert_eq!(rec.held, None);
    // a stale job changes nothing
    assert!(p.conclude(30.0, &job, &good).is_empty());
    // and the synchronous call leaves `applied_at` out (at the window)
    assert_eq!(sync.log()[0].applied_at, None);
}

/// Fake workers: encode 20 ms, prefill 30 ms, decode 5 ms a step.
struct Fixed;
impl Service for Fixed {
    fn encode(&mut self, _: usize, ids: &[RequestId], _: f64) -> (f64, f64) {
        (0.001, 0.02 * ids.len() as f64)
    }
    fn prefill(&mut self, _: usize, items: &[PrefillItem], _: f64) -> f64 {
        0.03 * items.len() as f64
    }
    fn decode(&mut self, _: usize, _: u64, _: u64) -> f64 {
        0.005
    }
    fn embeddings(&mut self, _: usize, _: &[RequestId]) -> f64 {
        0.001
    }
    fn kv(&mut self, _: usize, _: RequestId) -> f64 {
        0.001
    }
    fn front_end(&mut self, _: RequestId) -> f64 {
        0.0
    }
    fn replica_step(&mut self, _: usize, _: &[RequestId], _: u64, _: u64) -> (f64, f64) {
        (0.0, 0.01)
    }
}

/// 1E+2P+1D with a spare encode slot, `n` requests at 20 req/s, B = 4.
fn cluster(n: usize) -> Cluster<Fixed> {
    let a: Allocation = "1E(TP1)+2P(TP1)+1D(TP1)".parse().unwrap();
    let mut c = config_for(
        &a,
        None,
        SmSplit::Static(1.0),
        crate::KvBlocks::new(1 << 20, 16),
        None,
    );
    c.topology = Topology::with_spares(&a, None, [1, 0, 0]);
    c.batchers = (0..2)
        .map(|_| {
            Batcher::new(
                &DispatchPolicy::QueueLength {
                    k: 4,
                    max_age_s: Some(0.05),
                },
                4,
                |k| 0.02 * k as f64,
            )
        })
        .collect();
    let reqs = (0..n).map(|i| test_request(i, i as f64 / 20.0)).collect();
    Cluster::new(Controller::new(reqs, c), Fixed)
}

#[test]
fn a_role_change_through_the_controller_drains_stops_loads_and_loses_nothing() {
    let mut c = cluster(200);
    c.load_s = 0.5;
    c.reconfigure_at(
        3.0,
        Change::Drain {
            worker: WorkerRef::Prefill(1),
            then: Some(WorkerRef::Encode(1)),
        },
    );
    assert!(!c.ctrl.is_active(WorkerRef::Encode(1)), "a spare stands by");
    c.drive();
    let log = c.ctrl.decisions().to_vec();
    let at = |f: &dyn Fn(&Decision) -> bool| log.iter().position(f).unwrap();
    let change = at(&|d| matches!(d, Decision::Reconfigure { .. }));
    let stopped = at(&|d| {
        matches!(
            d,
            Decision::WorkerStopped {
                worker: WorkerRef::Prefill(1),
                ..
            }
        )
    });
    let ready = at(&|d| {
        matches!(
            d,
            Decision::WorkerReady {
                worker: WorkerRef::Encode(1),
                ..
            }
        )
    });
    assert!(change < stopped && stopped < ready);
    let (Decision::WorkerStopped { at: t_stop, .. }, Decision::WorkerReady { at: t_ready, .. }) =
        (&log[stopped], &log[ready])
    else {
        unreachable!()
    };
    assert!(
        (t_ready - t_stop - 0.5).abs() < 1e-9,
        "the load follows the stop"
    );
    assert_eq!(c.stops, vec![(*t_stop, WorkerRef::Prefill(1))]);
    // nothing routed to the drained worker after the change, something
    // placed on the new one after it was ready
    assert!(!log[change..].iter().any(|d| matches!(
        d,
        Decision::Route {
            worker: 1,
            local: false,
            ..
        }
    )));
    assert!(log[ready..]
        .iter()
        .any(|d| matches!(d, Decision::PlaceEncode { worker: 1, .. })));
    assert!(!log[..ready]
        .iter()
        .any(|d| matches!(d, Decision::PlaceEncode { worker: 1, .. })));
    // every request finished
    assert!(c
        .ctrl
        .records()
        .iter()
        .all(|r| r.finish.is_some() && r.failure.is_none()));
    assert!(c.ctrl.is_active(WorkerRef::Encode(1)) && !c.ctrl.is_active(WorkerRef::Prefill(1)));
}

#[test]
fn batch_bound_and_offload_change_live() {
    let mut c = cluster(120);
    c.reconfigure_at(2.0, Change::SetBatch { max_batch: 1 });
    c.reconfigure_at(2.0, Change::SetOffload { s: 0.25 });
    c.drive();
    assert_eq!(c.ctrl.max_batch(), Some(1));
    assert_eq!(c.ctrl.offload(), 0.25);
    let after: Vec<usize> = c
        .ctrl
        .decisions()
        .iter()
        .filter_map(|d| match d {
            Decision::Dispatch { at, ids, .. } if *at > 2.0 => Some(ids.len()),
            _ => None,
        })
        .collect();
    assert!(
        !after.is_empty() && after.iter().all(|&n| n == 1),
        "{after:?}"
    );
    let before = c
        .ctrl
        .decisions()
        .iter()
        .any(|d| matches!(d, Decision::Dispatch { at, ids, .. } if *at < 2.0 && ids.len() > 1));
    assert!(before, "batches of more than one before the change");
}

#[test]
fn a_planned_load_that_dies_loading_fails_the_change_and_frees_the_slot() {
    let mut c = cluster(4);
    c.ctrl.supervise(crate::Backoff::starting_at(1.0));
    let spare = WorkerRef::Encode(1);
    c.ctrl.handle(
        1.0,
        Event::Reconfigure {
            change: Change::Start { worker: spare },
        },
    );
    let cmds: Vec<Command> = std::iter::from_fn(|| c.ctrl.poll_command()).collect();
    assert!(
        cmds.contains(&Command::LoadWorker {
            worker: spare,
            on: None
        }),
        "{cmds:?}"
    );
    assert_eq!(c.ctrl.stage_loads(1.0)[0].changing, 1);
    c.ctrl.handle(
        1.2,
        Event::WorkerFailed {
            worker: spare,
            reason: "process exited (signal 9)".into(),
        },
    );
    // a failed planned load: recorded as such, no restart asked for, the
    // change no longer under way, the slot standing by
    let failed = c.ctrl.decisions().iter().any(|d| {
        matches!(d, Decision::LoadFailed { worker, at, reason }
            if *worker == spare && *at == 1.2 && reason.contains("signal 9"))
    });
    assert!(failed, "{:?}", c.ctrl.decisions());
    let cmds: Vec<Command> = std::iter::from_fn(|| c.ctrl.poll_command()).collect();
    assert!(
        !cmds.iter().any(|c| matches!(c, Command::Restart { .. })),
        "{cmds:?}"
    );
    assert_eq!(c.ctrl.stage_loads(1.2)[0].changing, 0);
    assert!(!c.ctrl.is_active(spare));
    // a later start of the slot loads and joins
    c.ctrl.handle(
        2.0,
        Event::Reconfigure {
            change: Change::Start { worker: spare },
        },
    );
    c.ctrl.handle(2.5, Event::WorkerLoaded { worker: spare });
    assert!(c.ctrl.is_active(spare));
    // the planner counts the slot free again
    let mut p = Planner::new(cfg(PlannerPolicy::Load), &topology()).unwrap();
    let before = p.counts();
    let loads = [load(1, 9, 0.0), load(1, 0, 0.0), load(1, 0, 0.0)];
    let changes = p.on_window(10.0, loads, 10, None);
    let Some(Change::Start { worker }) = changes.first().copied() else {
        panic!("no start: {changes:?}");
    };
    assert_ne!(p.counts(), before);
    p.load_failed(worker);
    assert_eq!(p.counts(), before);
}

#[test]
fn the_controller_integrates_each_stage_queue_over_time_when_asked() {
    // the harness's cluster with the queue integral kept: after every
    // instant the queues hold until the next one, so the integral is the
    // sum of each instant's queues times the time to the next
    let a: Allocation = "1E(TP1)+1P(TP1)+1D(TP1)".parse().unwrap();
    let mut cfg = config_for(
        &a,
        None,
        SmSplit::Static(1.0),
        crate::KvBlocks::new(1 << 20, 16),
        None,
    );
    cfg.queue_area = true;
    let reqs = (0..60).map(|i| test_request(i, i as f64 / 40.0)).collect();
    let mut c = Cluster::new(Controller::new(reqs, cfg), Fixed);
    let (mut expected, mut last, mut queued) = ([0.0f64; 3], 0.0, [0usize; 3]);
    let mut most = 0;
    while c.step() {
        let now = c.now;
        for k in 0..3 {
            expected[k] += queued[k] as f64 * (now - last);
        }
        let loads = c.ctrl.stage_loads(now);
        queued = std::array::from_fn(|k| loads[k].queued);
        most = most.max(queued.iter().sum::<usize>());
        last = now;
        for k in 0..3 {
            let got = loads[k].queued_s.expect("kept");
            assert!(
                (got - expected[k]).abs() < 1e-9,
                "stage {k} at {now}: {got} vs {}",
                expected[k]
            );
        }
    }
    assert!(
        most > 1 && expected.iter().sum::<f64>() > 0.0,
        "the run queued"
    );
    // off by default: no integral
    let plain = cluster(4);
    assert!(plain
        .ctrl
        .stage_loads(0.0)
        .iter()
        .all(|l| l.queued_s.is_none()));
}

#[test]
fn the_load_rule_reads_the_window_mean_queue_when_asked() {
    // the queue at the window's end is 1 (hot: over 0.5 per worker), its
    // mean over the 10 s window 0.05 (cold: under 0.2)
    let at = |queued, queued_s| StageLoad {
        active: 1,
        queued,
        queued_s: Some(queued_s),
        ..StageLoad::default()
    };
    let loads = [at(0, 0.0), at(1, 0.5), at(0, 0.0)];
    let start = Change::Start {
        worker: WorkerRef::Prefill(1),
    };
    let mut end = Planner::new(cfg(PlannerPolicy::Load), &topology()).unwrap();
    assert_eq!(end.on_window(10.0, loads, 10, None).first(), Some(&start));
    let mut c = cfg(PlannerPolicy::Load);
    c.rule.signal = QueueSignal::Mean;
    let mut mean = Planner::new(c, &topology()).unwrap();
    assert!(mean.on_window(10.0, loads, 10, None).is_empty());
    let seen = mean.log()[0].stages[1];
    assert_eq!(seen.queue_per_worker, 1.0);
    assert!((seen.queue_mean_per_worker.unwrap() - 0.05).abs() < 1e-12);
    // the next window's mean is its own: 40 request-seconds over 10 s
    let later = [at(0, 0.0), at(4, 40.5), at(0, 0.0)];
    assert_eq!(mean.on_window(20.0, later, 20, None).first(), Some(&start));
    assert!((mean.log()[1].stages[1].queue_mean_per_worker.unwrap() - 4.0).abs() < 1e-12);
    assert!("sometimes"
        .parse::<QueueSignal>()
        .unwrap_err()
        .contains("end"));
}
