//! Simulator speed: the image scenario (LLaVA-v1.6-34B on 8× RTX 6000 Ada) with
//! 10,000, 100,000 and 1,000,000 requests, timed around `easerve_sim::simulate`
//! (scenario parsing excluded; the cost model is built inside, from kernel
//! tables that are read once per process). Criterion's throughput is requests
//! per second; each size first prints its queue events and its decode
//! iterations run inline, which are counted apart.
//! Group `image` prices stages as the scenario does (measured kernels when
//! `../shared/data/aiconfigurator` is present), group `image-roofline` from the
//! roofline; group `dc-1024` runs 100,000 requests of `scenarios/dc-1024.toml`
//! (1,024 GPUs, 448 workers: where a structure that grows with the workers
//! shows; docs/datacenter.md); group `image-reuse` runs 100,000 requests of
//! `scenarios/image-reuse.toml` (a media pool, system prompts, both caches;
//! its workload's reuse rewrite and offered-reuse pass inside the timing, as
//! in `easerve sim`). Group `offered-reuse` times the pass that
//! counts the reuse a workload offers
//! (`easerve_workload::reuse::offered_reuse`) over the 1,000,000 requests of
//! `scenarios/image-reuse.toml`, generated once (docs/reuse.md, "Speed").
//!
//! Run with `cargo bench --bench sim`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use easerve_workload::scenario::{Overrides, Scenario};
use std::path::Path;
use std::time::Duration;

fn load(file: &str, requests: i64, kernels: &str) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(file);
    let o = Overrides {
        requests: Some(requests),
        ..Default::default()
    };
    let sets = [("cluster.kernels".to_string(), kernels.to_string())];
    Scenario::load_with(&path, &sets, &o).expect("a shipped scenario is valid")
}

fn bench(c: &mut Criterion) {
    let image: &[(i64, usize)] = &[(10_000, 50), (100_000, 10), (1_000_000, 10)];
    for (name, file, kernels, sizes) in [
        ("image", "image.toml", "auto", image),
        ("image-roofline", "image.toml", "roofline", image),
        ("dc-1024", "dc-1024.toml", "auto", &[(100_000, 10)]),
        ("image-reuse", "image-reuse.toml", "auto", &[(100_000, 10)]),
    ] {
        bench_group(c, name, (file, kernels), sizes);
    }
    let (requests, _) = easerve_workload::generate::generate_with_tokens(&load(
        "image-reuse.toml",
        1_000_000,
        "auto",
    ));
    let mut group = c.benchmark_group("offered-reuse");
    group.throughput(Throughput::Elements(requests.len() as u64));
    group.sample_size(20);
    group.bench_function(BenchmarkId::new("requests", requests.len()), |b| {
        b.iter(|| easerve_workload::reuse::offered_reuse(&requests, 16))
    });
    group.finish();
}

fn bench_group(
    c: &mut Criterion,
    name: &str,
    (file, kernels): (&str, &str),
    sizes: &[(i64, usize)],
) {
    let mut group = c.benchmark_group(name);
    for &(requests, samples) in sizes {
        let sc = load(file, requests, kernels);
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
