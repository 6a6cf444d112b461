//! Preprocessing as a pipelined host stage against preprocessing in series
//! within each pass: alone, a request takes the same time either way on one
//! thread and less on several (its items spread over them); saturated, an
//! encode worker passes every `t_pass + t_pre + t_gpu` in series and every
//! `max(t_pass + t_gpu, t_pre / threads)` pipelined, which the simulated
//! throughput follows.

use easerve_sim::{scenario_cost, simulate_with, SimOptions};
use easerve_workload::scenario::{Scenario, ScenarioFile};

/// An image scenario on the roofline (no data needed): `items` 448×448 images
/// per request on `1E(TP1)+1P(TP1)+1D(TP1)`, preprocessing scaled by
/// `host_scale` so that it weighs against the GPU phase, and `pre` added to
/// `[deployment]`.
fn scenario(
    rate: f64,
    requests: u32,
    items: u32,
    host_scale: f64,
    batch: u32,
    pre: &str,
) -> Scenario {
    let text = format!(
        r#"
seed = 11
[model]
preset = "tiny-vit-lm"
[cluster]
gpu = "rtx-6000-ada"
gpus = 3
kernels = "roofline"
host_cpu_scale = {host_scale}
[deployment]
allocation = "1E(TP1)+1P(TP1)+1D(TP1)"
batch = {batch}
offload = 1.0
dispatch = "queue-length:{batch}"
decode_max_batch = 512
{pre}
[workload]
requests = {requests}
rate = {rate}
modality = "image"
input_len = 16
output_len = 2
[workload.image]
items_per_request = {items}
buckets = [{{ height = 448, width = 448, probability = 1.0 }}]
"#
    );
    let raw = ScenarioFile::parse(&text, "pre.toml").expect("parses");
    Scenario::validate(raw, "pre.toml", "pre").expect("valid")
}

fn encode_service(sc: &Scenario) -> f64 {
    let out = simulate_with(sc, scenario_cost(sc), &SimOptions::default());
    let enc = out
        .report
        .stages
        .iter()
        .find(|s| s.stage == "encode")
        .expect("encode stage");
    enc.service.mean
}

#[test]
fn alone_a_request_takes_as_long_on_one_thread_and_less_on_several() {
    // one request every 100 s: none waits for another
    let serial = encode_service(&scenario(0.01, 5, 4, 20.0, 1, "preprocess = \"serial\""));
    let one = encode_service(&scenario(
        0.01,
        5,
        4,
        20.0,
        1,
        "preprocess = \"pipelined\"\npreprocess_threads = 1",
    ));
    let four = encode_service(&scenario(
        0.01,
        5,
        4,
        20.0,
        1,
        "preprocess = \"pipelined\"\npreprocess_threads = 4",
    ));
    assert!(
        (one - serial).abs() <= 1e-9 * serial,
        "one thread {one} vs serial {serial}"
    );
    assert!(four < 0.5 * one, "four threads {four} vs one {one}");
}

#[test]
fn saturated_throughput_follows_the_slower_side_of_the_pipeline() {
    let threads = 3u32;
    let pipelined = format!("preprocess = \"pipelined\"\npreprocess_threads = {threads}");
    let cases = [
        ("preprocess = \"serial\"", None),
        (pipelined.as_str(), Some(threads)),
    ];
    let mut thr = Vec::new();
    for (pre, n) in cases {
        // far beyond what one encode worker can take
        let sc = scenario(500.0, 400, 1, 20.0, 4, pre);
        let cost = scenario_cost(&sc);
        let items = easerve_workload::generate::generate_with_tokens(&sc).1;
        let batch: Vec<_> = (0..4).flat_map(|i| items[i].iter().copied()).collect();
        let t = cost.encode(&batch, 1.0);
        assert!(
            t.t_pre > 2.0 * t.t_gpu,
            "preprocessing must dominate: {t:?}"
        );
        let expect = 4.0 / t.cycle(n);
        let out = simulate_with(&sc, cost, &SimOptions::default());
        // the encode stage's own rate: requests over the span of its passes
        let recs = &out.records;
        let first = recs
            .iter()
            .filter_map(|r| r.encode_start.get())
            .fold(f64::INFINITY, f64::min);
        let last = recs
            .iter()
            .filter_map(|r| r.encode_end.get())
            .fold(0.0, f64::max);
        let got = recs.len() as f64 / (last - first);
        assert!(
            (got - expect).abs() <= 0.05 * expect,
            "{pre}: encode rate {got:.2} req/s, expected {expect:.2} from the cycle {:?}",
            t
        );
        thr.push(got);
    }
    assert!(
        thr[1] > 2.0 * thr[0],
        "pipelining on {threads} threads: {thr:?}"
    );
}
