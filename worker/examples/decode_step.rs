//! Time one decode step of a tiny preset's LM on the CPU backend, the cost the
//! KV cache's layout decides: `cargo run --release -p easerve-worker --example
//! decode_step -- [model] [batch] [context...]` (defaults: tiny-image, batch 1,
//! contexts 256 1024 4096). Each sequence is prefilled with `context / batch`
//! random embeddings; then 3 warm-up and 21 timed steps (the cache grows by
//! one position per step); prints the median and p90 in milliseconds.
//! Runs on all cores (no thread bound); compare figures from one machine.

use burn::backend::NdArray;
use burn::tensor::{Distribution, Tensor};
use easerve_model::nn::MultimodalModel;
use easerve_model::ModelArch;
use std::time::Instant;

type B = NdArray;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let name = args.get(1).map_or("tiny-image", String::as_str);
    let count = |what: &str, s: &str| -> usize {
        match s.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("{what} `{s}`: expected a whole number of at least 1");
                std::process::exit(2);
            }
        }
    };
    let batch = args.get(2).map_or(1, |s| count("batch", s));
    let contexts: Vec<usize> = if args.len() > 3 {
        args[3..].iter().map(|s| count("context", s)).collect()
    } else {
        vec![256, 1024, 4096]
    };
    let Some(arch) = ModelArch::preset(name) else {
        eprintln!("unknown model `{name}`: see `easerve models`");
        std::process::exit(2);
    };
    let device = Default::default();
    let model = match MultimodalModel::<B>::from_arch(&arch, &device) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("{name}: {e}");
            std::process::exit(2);
        }
    };
    let d = arch.llm.hidden as usize;
    for c in contexts {
        let per = (c / batch.max(1)).max(1);
        let seqs: Vec<Tensor<B, 2>> = (0..batch)
            .map(|_| Tensor::random([per, d], Distribution::Normal(0.0, 1.0), &device))
            .collect();
        let (_, mut caches) = model.lm.prefill(&seqs);
        let x: Tensor<B, 2> = Tensor::random([batch, d], Distribution::Normal(0.0, 1.0), &device);
        let mut ts = Vec::new();
        for i in 0..24 {
            let t0 = Instant::now();
            let logits = model.lm.decode(x.clone(), &mut caches);
            let _ = logits.into_data();
            if i >= 3 {
                ts.push(t0.elapsed().as_secs_f64() * 1e3);
            }
        }
        ts.sort_by(f64::total_cmp);
        println!(
            "{name} batch {batch} context {}: median {:.2} ms, p90 {:.2} ms",
            per * batch,
            ts[ts.len() / 2],
            ts[ts.len() * 9 / 10]
        );
    }
}
