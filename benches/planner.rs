//! The `twin` planner's speed: one decision over a ten-minute horizon (four
//! windows of 150 s) on the image day of the planner study
//! (`scenarios/demand/image-day-plan.toml`, 16 GPUs): forecast, candidate
//! set, one twin simulation per candidate. The target is ≤ 50 ms.
//!
//! Run with `cargo bench --bench planner`.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use easerve_sched::planner::Planner;
use easerve_sched::StageLoad;
use easerve_sim::SimTwin;
use easerve_workload::scenario::{Overrides, Scenario};
use std::path::Path;
use std::sync::Arc;

fn bench(c: &mut Criterion) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/demand/image-day-plan.toml");
    let o = Overrides {
        planner: Some("twin".into()),
        ..Default::default()
    };
    let sc = Scenario::load(&path, &o).expect("shipped scenario");
    let setup = sc.planner.clone().expect("[planner]");
    assert_eq!(setup.config.horizon_s, 600.0);
    let topology = sc.resolution(false).topology();
    let cost: Arc<dyn easerve_calib::StageCost> = Arc::from(sc.cost());
    let mut planner = Planner::new(setup.config.clone(), &topology).expect("valid planner");
    let counts = planner.counts();
    let load = |k: usize, queued: usize| StageLoad {
        active: counts[k] as usize,
        queued,
        ..StageLoad::default()
    };
    // two windows seen at the peak (1.8 req/s), five requests waiting
    planner.on_window(150.0, [load(0, 0), load(1, 0), load(2, 0)], 270, None);
    planner.on_window(300.0, [load(0, 0), load(1, 0), load(2, 0)], 540, None);
    let loads = [load(0, 3), load(1, 2), load(2, 0)];
    let mut twin = SimTwin::new(&sc, cost);
    c.bench_function("twin decision, 600 s horizon", |b| {
        b.iter_batched(
            || planner.clone(),
            |mut p| p.on_window(450.0, loads, 810, Some(&mut twin)),
            BatchSize::SmallInput,
        )
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench
}
criterion_main!(benches);
