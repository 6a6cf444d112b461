//! Simulator speed: the image scenario (LLaVA-v1.6-34B on 8× RTX 6000 Ada) with
//! 10,000, 100,000 and 1,000,000 requests, timed around `easerve_sim::simulate`
//! (scenario parsing excluded; the cost model is built inside, from kernel
//! tables that are read once per process). Criterion's throughput is requests
//! per second; each size first prints its queue events and its decode
//! iterations run inline, which are counted apart.
//! Group `image` prices stages as the scenario does (measured kernels when
//! `../shared/data/aiconfigurator` is present), group `image-roofline` from the
//! roofline.
//!
//! Run with `cargo bench --bench sim`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use easerve_workload::scenario::{Overrides, Scenario};
use std::path::Path;
use std::time::Duration;

fn image(requests: i64, kernels: &str) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/image.toml");
    let o = Overrides {
        requests: Some(requests),
        ..Default::default()
    };
    let sets = [("cluster.kernels".to_string(), kernels.to_string())];
    Scenario::load_with(&path, &sets, &o).expect("scenarios/image.toml is valid")
}

fn bench(c: &mut Criterion) {
    for (name, kernels) in [("image", "auto"), ("image-roofline", "roofline")] {
        bench_group(c, name, kernels);
    }
}

fn bench_group(c: &mut Criterion, name: &str, kernels: &str) {
    let mut group = c.benchmark_group(name);
    for (requests, samples) in [(10_000i64, 50usize), (100_000, 10), (1_000_000, 10)] {
        let sc = image(requests, kernels);
        let out = easerve_sim::simulate(&sc);
        eprintln!(
            "{name}/{requests}: {} queue events, {} decode iterations inline",
            out.queue_events, out.inline_steps
        );
        group.throughput(Throughput::Elements(requests as u64));
        group.sample_size(samples);
        if requests > 100_000 {
            group.measurement_time(Duration::from_secs(45));
        }
        group.bench_with_input(BenchmarkId::new("requests", requests), &sc, |b, sc| {
            b.iter(|| easerve_sim::simulate(sc))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
