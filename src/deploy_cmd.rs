//! `easerve deploy` (and `easerve search --emit`): a deployment as launch files
//! for vLLM, SGLang and NVIDIA Dynamo, with the scenario that reproduces it,
//! a benchmark script and each engine's predicted figures
//! (`easerve_study::deploy`).

use crate::BadInput;
use easerve_study::deploy::{emit, DeployError, EmitOptions, Emitted};
use easerve_workload::scenario::{Overrides, Scenario};
use std::path::PathBuf;
use std::process::ExitCode;

/// Where to write the launch files and what they need beyond the scenario:
/// shared by `deploy` and `search`.
#[derive(clap::Args, Debug)]
pub(crate) struct EmitArgs {
    /// Write the deployment's files into this folder (created if missing):
    /// scenario.toml, vllm/, sglang/, dynamo/, bench.sh, predictions.json and
    /// README.md.
    #[arg(long, value_name = "DIR")]
    pub(crate) emit: Option<PathBuf>,
    /// Weights the engines load: a Hugging Face repository or a local path
    /// (default: the model preset's checkpoint; required for a custom model).
    #[arg(long, value_name = "PATH")]
    pub(crate) model_path: Option<String>,
    /// GPUs per node: cluster GPU g is GPU g % N of node g / N, in 1..=1024.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub(crate) gpus_per_node: u32,
    /// TP of each replica of the aggregated baseline written beside the
    /// deployment (`aggregated/`); default: the smallest degree that holds the
    /// LLM, its encoder and one longest sequence.
    #[arg(long, value_name = "TP")]
    pub(crate) aggregated_tp: Option<u32>,
}

impl EmitArgs {
    fn options(&self) -> Result<EmitOptions, BadInput> {
        if !(1..=1024).contains(&self.gpus_per_node) {
            return Err(BadInput(format!(
                "--gpus-per-node {}: a node holds 1 to 1024 GPUs",
                self.gpus_per_node
            )));
        }
        Ok(EmitOptions {
            model_path: self.model_path.clone(),
            gpus_per_node: self.gpus_per_node,
            aggregated_tp: self.aggregated_tp,
        })
    }

    /// Check the options against the scenario before a long search, so a
    /// typo fails at once (the deployment the search picks is checked again
    /// when it is written).
    pub(crate) fn check(&self, sc: &Scenario) -> Result<(), BadInput> {
        let opts = self.options()?;
        match &self.emit {
            Some(dir) => easerve_study::deploy::check(sc, dir, &opts)
                .map(|_| ())
                .map_err(|e| BadInput(e.to_string())),
            None => Ok(()),
        }
    }
}

/// Arguments of `easerve deploy`.
#[derive(clap::Args, Debug)]
#[command(allow_negative_numbers = true)]
pub(crate) struct DeployArgs {
    /// Scenario file (its model, cluster, workload and SLO tiers).
    scenario: PathBuf,
    /// The deployment, as `easerve search` prints it, e.g.
    /// `'2E(TP1)+1P(TP2)+1D(TP4) B=8 s=0.55'` (default: the scenario's own).
    #[arg(long)]
    deployment: Option<String>,
    /// Arrival rate in requests/s (overrides `workload.rate`).
    #[arg(long)]
    rate: Option<f64>,
    /// Master seed (overrides the scenario's `seed`).
    #[arg(long)]
    seed: Option<u64>,
    /// Requests per run (overrides `workload.requests`).
    #[arg(long)]
    requests: Option<i64>,
    #[command(flatten)]
    out: EmitArgs,
}

pub(crate) fn run(a: DeployArgs) -> anyhow::Result<ExitCode> {
    let Some(dir) = a.out.emit.clone() else {
        return Err(BadInput(
            "--emit DIR is required: the folder the deployment's files go into".into(),
        )
        .into());
    };
    let overrides = crate::with_deployment(
        Overrides {
            seed: a.seed,
            rate: a.rate,
            requests: a.requests,
            ..Default::default()
        },
        a.deployment.as_deref(),
    )?;
    let sc = Scenario::load(&a.scenario, &overrides).map_err(|e| BadInput(e.to_string()))?;
    crate::preflight(&sc)?;
    write(&sc, &dir, &a.out)?;
    Ok(ExitCode::SUCCESS)
}

fn emit_files(sc: &Scenario, dir: &std::path::Path, args: &EmitArgs) -> anyhow::Result<Emitted> {
    let opts = args.options()?;
    emit(sc, dir, &opts).map_err(|e| match e {
        DeployError::Input(_) | DeployError::Io { .. } => {
            anyhow::Error::from(BadInput(e.to_string()))
        }
        DeployError::Variant(m) => anyhow::anyhow!(m),
    })
}

/// Emit `sc`'s deployment into `dir`, saying on standard error where it went.
pub(crate) fn write_quiet(
    sc: &Scenario,
    dir: &std::path::Path,
    args: &EmitArgs,
) -> anyhow::Result<()> {
    let out = emit_files(sc, dir, args)?;
    eprintln!(
        "wrote {} files under {} (README.md there has the predictions)",
        out.files.len(),
        dir.display()
    );
    Ok(())
}

/// Emit `sc`'s deployment into `dir` and print what was written, with the
/// predictions.
pub(crate) fn write(sc: &Scenario, dir: &std::path::Path, args: &EmitArgs) -> anyhow::Result<()> {
    let out = emit_files(sc, dir, args)?;
    sayln!("wrote {} files under {}:", out.files.len(), dir.display());
    for f in &out.files {
        sayln!("  {}", f.strip_prefix(dir).unwrap_or(f).display());
    }
    for (folder, why) in &out.skipped {
        sayln!("{folder}/: not written: {why}");
    }
    sayln!(
        "{:<34} {:>11} {:>10} {:>10} {:>10}  goodput per tier (req/s)",
        "predicted (easerve sim)",
        "thr (req/s)",
        "TTFT (s)",
        "P99 (s)",
        "TPOT (ms)"
    );
    for p in &out.predictions {
        let tiers: Vec<String> = p
            .goodput
            .iter()
            .map(|t| format!("{} {:.3}", t.name, t.goodput))
            .collect();
        sayln!(
            "{:<34} {:>11.3} {:>10.3} {:>10.3} {:>10.1}  {}",
            p.scenario,
            p.request_throughput,
            p.mean_ttft_s,
            p.p99_ttft_s,
            p.mean_tpot_s * 1e3,
            tiers.join(", ")
        );
    }
    Ok(())
}
