//! Startup with measured kernels: reading and preparing one GPU's tables
//! (`build`: parquet → outlier filter → trie → dense monotone grid) against
//! reading the prepared grids back from the cache (`cached`,
//! `easerve_calib::grid_cache`), for the L40S tables of `scenarios/image.toml`
//! and the H100 BF16 dense and fused-MoE tables of `scenarios/moe-video.toml`.
//! The cache lives in a temporary folder here, not in the user's cache.
//!
//! Needs `../shared/data/aiconfigurator`; without it the benchmark says so
//! and measures nothing. Run with `cargo bench --bench startup`.

use criterion::{criterion_group, criterion_main, Criterion};
use easerve_calib::aic::find_data_dir;
use easerve_calib::grid_cache::{kernel_tables, moe_tables, Hit};

fn bench(c: &mut Criterion) {
    let Some(dir) = find_data_dir() else {
        eprintln!("startup: ../shared/data/aiconfigurator is absent; nothing measured");
        return;
    };
    let cache = tempfile::tempdir().expect("a temporary folder");
    let mut group = c.benchmark_group("startup");
    group.sample_size(10);
    for system in ["l40s", "h100_sxm"] {
        group.bench_function(format!("{system}/build"), |b| {
            b.iter(|| kernel_tables(None, &dir, system, "bfloat16", "bfloat16").unwrap())
        });
        let (_, hit) = kernel_tables(Some(cache.path()), &dir, system, "bfloat16", "bfloat16")
            .expect("tables load");
        assert_eq!(hit, Hit::Built);
        group.bench_function(format!("{system}/cached"), |b| {
            b.iter(|| {
                let (t, hit) =
                    kernel_tables(Some(cache.path()), &dir, system, "bfloat16", "bfloat16")
                        .unwrap();
                assert_eq!(hit, Hit::Cached);
                t
            })
        });
    }
    group.bench_function("h100_sxm-moe/build", |b| {
        b.iter(|| moe_tables(None, &dir, "h100_sxm", "bfloat16").unwrap())
    });
    moe_tables(Some(cache.path()), &dir, "h100_sxm", "bfloat16").expect("MoE tables load");
    group.bench_function("h100_sxm-moe/cached", |b| {
        b.iter(|| moe_tables(Some(cache.path()), &dir, "h100_sxm", "bfloat16").unwrap())
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
