//! `easerve reproduce`: the EAServe paper's findings (§2.2, §4.2–4.5) re-run
//! in simulation on its testbed scenarios, written as a Markdown report with
//! plots, saying next to each finding whether the simulation agrees.

use crate::sweep_cmd::{sweep_err, write_outputs};
use crate::BadInput;
use easerve_study::sweep::{aggregate, Shard, SweepPlan, SweptSystem};
use easerve_workload::scenario::{Overrides, Scenario, System};
use easerve_workload::Report;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `easerve reproduce`.
#[derive(clap::Args, Debug)]
pub(crate) struct ReproduceArgs {
    /// Output folder: report.md and one folder of plots per modality.
    #[arg(long)]
    out: PathBuf,
    /// Folder holding image.toml, video.toml and audio.toml.
    #[arg(long, default_value = "scenarios")]
    scenarios: PathBuf,
    /// Requests per run (default: the scenarios' 500).
    #[arg(long)]
    requests: Option<i64>,
}

/// Offered rate of finding 3's searches (the paper's §4.2 setting), req/s.
const HAS_RATE: f64 = 5.0;

fn sim(path: &Path, sets: &[(&str, &str)], o: &Overrides) -> anyhow::Result<Report> {
    let sets: Vec<(String, String)> = sets
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let sc = Scenario::load_with(path, &sets, o).map_err(|e| BadInput(e.to_string()))?;
    Ok(easerve_sim::simulate(&sc).report)
}

fn verdict(agrees: bool) -> &'static str {
    if agrees {
        "**agrees**"
    } else {
        "**disagrees**"
    }
}

fn pct(new: f64, old: f64) -> f64 {
    if old != 0.0 {
        100.0 * (new - old) / old
    } else {
        0.0
    }
}

fn stage_queue(r: &Report, stage: &str) -> f64 {
    r.stages
        .iter()
        .find(|s| s.stage == stage)
        .map_or(0.0, |s| s.queue.mean)
}

/// One modality's encode-side terms, read from its scenario's cost model so the
/// report cannot state a stale constant.
struct Terms {
    /// Micro-batch the pass is priced at (typical requests).
    b: usize,
    /// Encode workers of the scenario's allocation.
    encode_workers: usize,
    /// The pass of `b` typical requests at the full GPU.
    pass: easerve_calib::EncodeTime,
    /// Its GPU phase at half the SMs, seconds.
    gpu_half: f64,
    /// Prefill of one typical request at the scenario's prefill TP, full GPU, seconds.
    prefill_s: f64,
    /// Encode slowdown next to a co-located prefill under SM partitioning (fraction).
    interference: f64,
    /// Slowdown of both under time-slicing (fraction).
    penalty: f64,
    /// The cost model's per-stage sources.
    notes: Vec<String>,
    /// Preprocessing threads per encode worker when preprocessing is a
    /// pipelined host stage; `None` when each pass preprocesses in series.
    threads: Option<u32>,
}

impl Terms {
    /// Where the co-location figures come from: the cost model's own note.
    fn colocation_source(&self) -> &str {
        self.notes
            .iter()
            .find_map(|n| n.strip_prefix("co-location: "))
            .unwrap_or("the cost model's notes")
    }
}

/// The terms of the scenario at `path` for a pass of `b` typical requests
/// (default: the scenario's own B).
fn terms(path: &Path, o: &Overrides, b: Option<usize>) -> anyhow::Result<Terms> {
    use easerve_workload::generate::{generate_with_tokens, typical_batch, typical_items};
    let sc = Scenario::load(path, o).map_err(|e| BadInput(e.to_string()))?;
    let b = b.unwrap_or(sc.deployment.max_batch.max(1));
    let cost = sc.cost();
    let (reqs, tokens) = generate_with_tokens(&sc);
    let items = typical_batch(&typical_items(&reqs, &tokens), b);
    let mut lens: Vec<u64> = reqs.iter().map(|r| r.prefill_tokens()).collect();
    lens.sort_unstable();
    let median = lens.get(lens.len() / 2).copied().unwrap_or(0);
    Ok(Terms {
        b,
        encode_workers: sc.deployment.allocation.encode.workers as usize,
        pass: cost.encode(&items, 1.0),
        gpu_half: cost.encode(&items, 0.5).t_gpu,
        prefill_s: cost.prefill(&[median], sc.deployment.allocation.prefill.tp.into(), 1.0),
        interference: cost.bandwidth_interference(),
        penalty: cost.time_slice_penalty(),
        notes: cost.notes(),
        threads: sc.knobs.preprocess_threads,
    })
}

fn ms(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{:.0} µs", s * 1e6)
    }
}

pub(crate) fn run(a: ReproduceArgs) -> anyhow::Result<ExitCode> {
    let started = std::time::Instant::now();
    let scn = |name: &str| a.scenarios.join(format!("{name}.toml"));
    for name in ["image", "video", "audio"] {
        if !scn(name).exists() {
            return Err(BadInput(format!("{}: not found (--scenarios names the folder holding image.toml, video.toml, audio.toml)", scn(name).display())).into());
        }
    }
    out_dir(&a.out)?;
    let req = a.requests;
    let mut md = String::new();
    let _ = writeln!(md, "# The EAServe paper's findings, re-run in simulation\n");
    let base = Overrides {
        requests: req,
        ..Default::default()
    };
    let pass_o = Overrides {
        system: Some(System::Passthrough),
        ..base.clone()
    };
    let paper_pass = terms(&scn("image"), &pass_o, Some(1))?.pass.t_pass;
    let _ = writeln!(
        md,
        "Testbed: 8× RTX 6000 Ada over PCIe, LLaVA-v1.6-34B (image), Qwen2.5-VL-32B (video), Ultravox-v0.6-27B (audio), the scenarios in `{}`. \
         Costs come from each scenario's cost model (its sources per stage are listed below), not tuned to the paper; \
         the one figure taken from the paper is pass-through's per-pass encode overhead ({}), set from its pass-through saturation point, so finding 1's \
         saturation rate is an input rather than a prediction. Each run has {} requests; one seed per point.\n",
        a.scenarios.display(),
        ms(paper_pass),
        req.map_or("the scenario's 500".to_string(), |n| n.to_string())
    );
    let _ = writeln!(md, "## Cost sources and encode terms\n");
    let _ = writeln!(md, "One encode pass of B typical requests of each scenario (its own B), as easerve prices it, and one typical request's prefill at the scenario's prefill TP. CPU preprocessing is one thread's time; with preprocessing pipelined on n threads per encode worker, the host side of a pass is that over n, overlapped with the previous pass's GPU phase, and back-to-back passes start every max(framework + GPU, preprocessing / n):\n");
    let _ = writeln!(md, "| modality | B | framework | CPU preprocessing | preprocessing | GPU, all SMs | GPU, half the SMs | back-to-back passes every | prefill | encode slowdown beside a prefill | time-slicing penalty |\n|---|---|---|---|---|---|---|---|---|---|---|");
    let mut all_terms = Vec::new();
    for name in ["image", "video", "audio"] {
        let t = terms(&scn(name), &base, None)?;
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} % | {:.0} % |",
            t.b,
            ms(t.pass.t_pass),
            ms(t.pass.t_pre),
            t.threads.map_or("in series".to_string(), |n| format!(
                "pipelined, {n} threads"
            )),
            ms(t.pass.t_gpu),
            ms(t.gpu_half),
            ms(t.pass.cycle(t.threads)),
            ms(t.prefill_s),
            t.interference * 100.0,
            t.penalty * 100.0
        );
        all_terms.push((name, t));
    }
    let _ = writeln!(md);
    for (name, t) in &all_terms {
        let _ = writeln!(md, "{name}:\n");
        for n in &t.notes {
            let _ = writeln!(md, "- {n}");
        }
        let _ = writeln!(md);
    }
    let term_of = |n: &str| {
        &all_terms
            .iter()
            .find(|t| t.0 == n)
            .expect("three modalities")
            .1
    };

    // --- rate sweeps (Figure 9/10 analogues) and finding 1 ---
    let rates = [1.0, 2.0, 3.0, 4.0, 5.0];
    let _ = writeln!(
        md,
        "## Goodput by SLO tier and rate sweeps (cf. Figures 9 and 10)\n"
    );
    let mut saturation = Vec::new();
    for name in ["image", "video", "audio"] {
        let part = SweepPlan::whole(&scn(name), &rates, &SweptSystem::ALL, 1, req)
            .run(Shard::WHOLE, &|| {})
            .map_err(sweep_err)?;
        write_outputs(&part, &a.out.join(name))?;
        let points = aggregate(&part.rows);
        let _ = writeln!(md, "### {name}\n");
        let _ = writeln!(md, "Goodput (req/s) per SLO tier at Λ = 2 req/s; plots in `{name}/` (`goodput-*.svg`, `throughput.svg`, `p99-ttft.svg`, `p99-tpot.svg`, `ttft-cdf.svg`).\n");
        let _ = writeln!(
            md,
            "| system | {} | throughput | P99 TTFT (s) | P99 TPOT (ms) | bottleneck |",
            part.tiers.join(" | ")
        );
        let _ = writeln!(
            md,
            "|---|{}---|---|---|---|",
            "---|".repeat(part.tiers.len())
        );
        for p in points.iter().filter(|p| p.rate == 2.0) {
            let g: Vec<String> = p.median.goodput.iter().map(|x| format!("{x:.2}")).collect();
            let _ = writeln!(
                md,
                "| {} | {} | {:.2} | {:.1} | {:.0} | {} |",
                p.system,
                g.join(" | "),
                p.median.throughput,
                p.median.ttft_p99,
                p.median.tpot_p99 * 1e3,
                p.median.bottleneck
            );
        }
        let _ = writeln!(md, "\nThroughput (req/s) against offered rate:\n");
        let _ = writeln!(
            md,
            "| system | {} |",
            rates
                .iter()
                .map(|r| format!("Λ={r}"))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        let _ = writeln!(md, "|---|{}", "---|".repeat(rates.len()));
        for s in SweptSystem::ALL {
            let row: Vec<String> = rates
                .iter()
                .map(|r| {
                    points
                        .iter()
                        .find(|p| p.system == s.name() && p.rate == *r)
                        .map_or("-".into(), |p| format!("{:.2}", p.median.throughput))
                })
                .collect();
            let _ = writeln!(md, "| {s} | {} |", row.join(" | "));
        }
        let _ = writeln!(md);
        if name != "audio" {
            // the first rate pass-through cannot keep up with, and what limits it there
            let first = points
                .iter()
                .filter(|p| p.system == "passthrough")
                .find(|p| p.median.throughput < 0.95 * p.rate);
            saturation.push((
                name,
                first.map(|p| (p.rate, p.median.throughput, p.median.bottleneck.clone())),
            ));
        }
    }
    let _ = writeln!(
        md,
        "## Finding 1: pass-through encode saturates first on image and video (§2.2, §4.2)\n"
    );
    let mut all = true;
    for (name, sat) in &saturation {
        match sat {
            Some((rate, thr, b)) => {
                all &= b == "encode";
                let _ = writeln!(md, "- {name}: pass-through first falls behind at Λ = {rate} req/s (completes {thr:.2}); its bottleneck there is **{b}**.");
            }
            None => {
                all = false;
                let _ = writeln!(
                    md,
                    "- {name}: pass-through keeps up at every rate up to 5 req/s."
                );
            }
        }
    }
    let _ = writeln!(md, "\nThe simulation {} (pass-through's {} per pass is calibrated from the paper, so the saturation point is an input; the stage that saturates is not).\n", verdict(all), ms(paper_pass));

    // --- finding 2: micro-batching alone pushes load downstream ---
    let image = scn("image");
    let o = |system: Option<System>, offload: Option<f64>| Overrides {
        rate: Some(3.0),
        requests: req,
        system,
        offload,
        ..Default::default()
    };
    let pass = sim(&image, &[], &o(Some(System::Passthrough), None))?;
    // micro-batching added to the same framework: easerve's dispatch with the
    // pass-through framework's encode terms
    let fw = [("deployment.framework", "passthrough")];
    let batch_b = Scenario::load(&image, &o(None, Some(1.0)))
        .map_err(|e| BadInput(e.to_string()))?
        .deployment
        .max_batch;
    let batch = sim(&image, &fw, &o(None, Some(1.0)))?;
    let thr_up = batch.request_throughput > pass.request_throughput;
    let down = stage_queue(&batch, "prefill") > stage_queue(&pass, "prefill")
        || batch.tpot.mean > pass.tpot.mean;
    let _ = writeln!(md, "## Finding 2: micro-batching alone raises throughput but pushes load downstream (§2.2, Table 1)\n");
    let _ = writeln!(
        md,
        "Image at Λ = 3 req/s, the scenario's allocation with s = 1, both with the pass-through framework's encode terms ({} per pass):\n",
        ms(paper_pass)
    );
    let _ = writeln!(md, "| encode dispatch | throughput | mean TTFT (s) | mean TPOT (ms) | prefill queueing (s) | decode queueing (s) |\n|---|---|---|---|---|---|");
    for (label, r) in [
        ("pass-through (B = 1)".to_string(), &pass),
        (
            format!("micro-batching (B = {batch_b}, Poisson-gap)"),
            &batch,
        ),
    ] {
        let _ = writeln!(
            md,
            "| {label} | {:.2} | {:.1} | {:.1} | {:.2} | {:.3} |",
            r.request_throughput,
            r.ttft.mean,
            r.tpot.mean * 1e3,
            stage_queue(r, "prefill"),
            stage_queue(r, "decode")
        );
    }
    let _ = writeln!(
        md,
        "\nThroughput {} by {:.0} % and prefill queueing goes from {:.2} s to {:.2} s: the simulation {}. The term that drives it is pass-through's {} per encode pass, which micro-batching amortises over up to {batch_b} requests. {}\n",
        if thr_up { "rises" } else { "does not rise" },
        pct(batch.request_throughput, pass.request_throughput),
        stage_queue(&pass, "prefill"),
        stage_queue(&batch, "prefill"),
        verdict(thr_up && down),
        ms(paper_pass),
        if batch.tpot.mean > 1.1 * pass.tpot.mean {
            format!("Mean TPOT rises {:+.0} %, as the paper reports.", pct(batch.tpot.mean, pass.tpot.mean))
        } else {
            format!(
                "Unlike the paper, mean TPOT barely moves ({:+.0} %): decode has spare capacity on this allocation, so the flood shows up as prefill queueing instead.",
                pct(batch.tpot.mean, pass.tpot.mean)
            )
        }
    );

    // --- finding 3: HAS's choice of s ---
    let _ = writeln!(
        md,
        "## Finding 3: HAS picks s = 1 on video and s < 1 on image and audio (§4.2)\n"
    );
    let _ = writeln!(
        md,
        "| modality | chosen deployment at Λ = {HAS_RATE} req/s | throughput |\n|---|---|---|"
    );
    let mut chosen = Vec::new();
    for name in ["image", "video", "audio"] {
        let base = Overrides {
            rate: Some(HAS_RATE),
            requests: req,
            ..Default::default()
        };
        let sc = Scenario::load(&scn(name), &base).map_err(|e| BadInput(e.to_string()))?;
        if let Some(b) = easerve_has::tune(&sc, &base, HAS_RATE, 1) {
            let _ = writeln!(
                md,
                "| {name} | `{}` | {:.2} |",
                b.candidate, b.outcome.throughput
            );
            chosen.push((name, b.candidate.offload));
        }
    }
    let s_of = |n: &str| chosen.iter().find(|c| c.0 == n).map_or(f64::NAN, |c| c.1);
    let f3 = s_of("video") >= 1.0 && s_of("image") < 1.0 && s_of("audio") < 1.0;
    let _ = writeln!(
        md,
        "\nThe simulation {}. {}\n",
        verdict(f3),
        if f3 {
            "Local prefill pays on image and audio, not on video.".to_string()
        } else {
            let mut why = Vec::new();
            if s_of("video") < 1.0 {
                let v = term_of("video");
                why.push(format!(
                    "local prefill pays on video too: a pass of {} typical video requests costs {} of CPU preprocessing and {} on the GPU with all SMs ({} with half), against {} for one prefill, so at Λ = {HAS_RATE} req/s over {} encode workers the encode GPUs would be about {:.0} % busy with encode work and have room for a co-located prefill; under SM partitioning it slows encode by only {:.1} % (source: {}). The paper measures the multi-frame encoder using over 90 % of the SMs during batched passes (§4.2), far more GPU time per request than this cost model prices; measuring the video encoder on the testbed would settle which holds",
                    v.b,
                    ms(v.pass.t_pre),
                    ms(v.pass.t_gpu),
                    ms(v.gpu_half),
                    ms(v.prefill_s),
                    v.encode_workers,
                    100.0 * HAS_RATE / v.encode_workers.max(1) as f64 * v.pass.t_gpu / v.b.max(1) as f64,
                    v.interference * 100.0,
                    v.colocation_source()
                ));
            }
            for m in ["image", "audio"] {
                let x = s_of(m);
                if x.is_nan() {
                    why.push(format!("the {m} search chose nothing"));
                } else if x >= 1.0 {
                    why.push(format!("on {m} the search kept every prefill remote"));
                }
            }
            format!("Where it differs: {}.", why.join("; "))
        }
    );

    // --- finding 4: SM partitioning ablation ---
    let audio = scn("audio");
    let _ = writeln!(md, "## Finding 4: dynamic SM partitioning beats static 50/50, which beats none (§4.4, Table 6)\n");
    let _ = writeln!(md, "Audio, `2E(TP1)+1P(TP2)+1D(TP4)`, B = 10, s = 0.55, Λ = 10 req/s (the paper's Table 6 setting):\n");
    let _ = writeln!(
        md,
        "| SM policy | throughput | P99 TTFT (s) | P99 TPOT (ms) |\n|---|---|---|---|"
    );
    let abl_o = Overrides {
        rate: Some(10.0),
        requests: req,
        allocation: Some("2E(TP1)+1P(TP2)+1D(TP4)".into()),
        batch: Some(10),
        offload: Some(0.55),
        ..Default::default()
    };
    let abl_terms = terms(&audio, &abl_o, None)?;
    let mut abl = Vec::new();
    for (label, policy) in [
        ("none (time-slicing)", "none"),
        ("static 50/50", "static:0.5"),
        ("dynamic", "dynamic"),
    ] {
        let r = sim(&audio, &[("deployment.sm_policy", policy)], &abl_o)?;
        let _ = writeln!(
            md,
            "| {label} | {:.2} | {:.2} | {:.1} |",
            r.request_throughput,
            r.ttft.p99,
            r.tpot.p99 * 1e3
        );
        abl.push(r);
    }
    let better = |x: &Report, y: &Report| {
        x.request_throughput >= y.request_throughput * 0.999 && x.ttft.p99 <= y.ttft.p99 * 1.001
    };
    let f4 = better(&abl[2], &abl[1]) && better(&abl[1], &abl[0]);
    let _ = writeln!(
        md,
        "\nAgainst dynamic: none changes throughput by {:+.1} %, P99 TTFT by {:+.1} %, P99 TPOT by {:+.1} % (paper: −9 %, +19 %, +42 %); static by {:+.1} %, {:+.1} %, {:+.1} % (paper: −3 %, +11 %, +22 %). The simulation {}{}.\n",
        pct(abl[0].request_throughput, abl[2].request_throughput),
        pct(abl[0].ttft.p99, abl[2].ttft.p99),
        pct(abl[0].tpot.p99, abl[2].tpot.p99),
        pct(abl[1].request_throughput, abl[2].request_throughput),
        pct(abl[1].ttft.p99, abl[2].ttft.p99),
        pct(abl[1].tpot.p99, abl[2].tpot.p99),
        verdict(f4),
        if f4 {
            String::new()
        } else {
            let t = &abl_terms;
            format!(
                " on the order. Why: a pass of {} typical audio requests spends {} in framework terms and {} in CPU preprocessing ({}), which hold no SMs, and {} on the GPU with all SMs ({} with half); the GPU-phase contention that SM partitioning controls is {:.0} % of the time between back-to-back passes. Time-slicing costs both passes {:.0} % while partitioning costs encode {:.1} % (source: {}), so which policy wins turns on the GPU phases that overlap. At this rate the run's bottleneck is {}, which no SM policy on the encode GPUs relieves; TPOT barely moves because decode runs on its own GPUs",
                t.b,
                ms(t.pass.t_pass),
                ms(t.pass.t_pre),
                t.threads.map_or("in series with the GPU phase".to_string(), |n| {
                    format!("pipelined on {n} threads: {} of host time a pass, overlapped with the previous pass", ms(t.pass.t_pre / f64::from(n)))
                }),
                ms(t.pass.t_gpu),
                ms(t.gpu_half),
                100.0 * t.pass.t_gpu / t.pass.cycle(t.threads).max(1e-12),
                t.penalty * 100.0,
                t.interference * 100.0,
                t.colocation_source(),
                abl[2].bottleneck
            )
        }
    );

    // --- finding 5: burstiness ---
    let _ = writeln!(md, "## Finding 5: burstiness raises P99 TTFT much more than it lowers throughput (§4.5, Table 7)\n");
    let _ = writeln!(md, "Image at Λ = 2 req/s, the scenario's deployment:\n");
    let _ = writeln!(md, "| arrivals | throughput | mean TTFT (s) | P99 TTFT (s) | P99 TPOT (ms) |\n|---|---|---|---|---|");
    let mut bur = Vec::new();
    for (label, sets) in [
        (
            "Gamma CV 0.5",
            vec![("workload.arrival", "gamma"), ("workload.cv", "0.5")],
        ),
        ("Poisson (CV 1)", vec![]),
        (
            "Gamma CV 2",
            vec![("workload.arrival", "gamma"), ("workload.cv", "2")],
        ),
    ] {
        let r = sim(
            &image,
            &sets,
            &Overrides {
                rate: Some(2.0),
                requests: req,
                ..Default::default()
            },
        )?;
        let _ = writeln!(
            md,
            "| {label} | {:.2} | {:.2} | {:.2} | {:.1} |",
            r.request_throughput,
            r.ttft.mean,
            r.ttft.p99,
            r.tpot.p99 * 1e3
        );
        bur.push(r);
    }
    let d_thr = pct(bur[2].request_throughput, bur[1].request_throughput);
    let d_ttft = pct(bur[2].ttft.p99, bur[1].ttft.p99);
    let f5 = d_ttft > 0.0 && d_ttft > d_thr.abs() * 3.0;
    let _ = writeln!(
        md,
        "\nFrom Poisson to CV 2 throughput changes by {d_thr:+.1} % and P99 TTFT by {d_ttft:+.1} % (paper: −3 % and +62 %); from Poisson to CV 0.5 P99 TTFT changes by {:+.1} % (paper: −35 %). The simulation {}. The bursts queue at {} ({:.2} s mean queueing there under CV 2, {:.2} s under Poisson).\n",
        pct(bur[0].ttft.p99, bur[1].ttft.p99),
        verdict(f5),
        bur[2].bottleneck,
        stage_queue(&bur[2], &bur[2].bottleneck),
        stage_queue(&bur[1], &bur[2].bottleneck)
    );
    preprocessing_section(&mut md, &scn, req)?;
    // no wall time in the report: the same inputs give the same bytes
    let _ = writeln!(md, "---\nGenerated by `easerve reproduce`.");
    crate::write_output("--out", &a.out.join("report.md"), |w| {
        Ok(w.write_all(md.as_bytes())?)
    })?;
    sayln!(
        "wrote {} (and plots in image/, video/, audio/)",
        a.out.join("report.md").display()
    );
    eprintln!("reproduce took {:.1} s", started.elapsed().as_secs_f64());
    Ok(ExitCode::SUCCESS)
}

/// `--out`: created if missing (with its parents); a path that is a file, or
/// under one, or cannot be created, is refused naming the flag, before any run.
fn out_dir(dir: &Path) -> Result<(), BadInput> {
    let cannot = |why: String| BadInput(format!("--out {}: {why}", dir.display()));
    if dir.exists() && !dir.is_dir() {
        return Err(cannot(
            "exists and is not a folder; give a new or existing folder".into(),
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| cannot(format!("cannot create the folder: {e}")))?;
    Ok(())
}

/// Preprocessing as a pipelined host stage against preprocessing in series
/// within each pass: each modality's own deployment at Λ = 5 req/s, run
/// both ways.
fn preprocessing_section(
    md: &mut String,
    scn: &dyn Fn(&str) -> std::path::PathBuf,
    req: Option<i64>,
) -> anyhow::Result<()> {
    let _ = writeln!(
        md,
        "## Preprocessing: in series within each pass, or a pipelined host stage\n"
    );
    let _ = writeln!(md, "Each scenario's own deployment at Λ = 5 req/s with `deployment.preprocess = \"serial\"` (one thread, before each pass's GPU phase) and `\"pipelined\"` (the default: the scenario's threads per encode worker, from `cluster.host_cores`, preprocessing each request as it is placed):\n");
    let _ = writeln!(md, "| modality | preprocessing | throughput | mean TTFT (s) | P99 TTFT (s) | mean encode service (ms) | encode stage capacity (req/s) | bottleneck |\n|---|---|---|---|---|---|---|---|");
    let o = Overrides {
        rate: Some(5.0),
        requests: req,
        ..Default::default()
    };
    for name in ["image", "video", "audio"] {
        for mode in ["serial", "pipelined"] {
            let r = sim(&scn(name), &[("deployment.preprocess", mode)], &o)?;
            let enc = r.stages.iter().find(|s| s.stage == "encode");
            let cap = r
                .explanation
                .loads
                .iter()
                .find(|s| s.stage == "encode")
                .map_or(f64::NAN, |s| s.capacity);
            let _ = writeln!(
                md,
                "| {name} | {mode} | {:.2} | {:.2} | {:.2} | {:.1} | {:.2} | {} |",
                r.request_throughput,
                r.ttft.mean,
                r.ttft.p99,
                enc.map_or(f64::NAN, |s| s.service.mean * 1e3),
                cap,
                r.bottleneck
            );
        }
    }
    let _ = writeln!(md);
    Ok(())
}
