//! `easerve reproduce`: the EAServe paper's findings (§2.2, §4.2–4.5) re-run
//! in simulation on its testbed scenarios, written as a Markdown report with
//! plots, saying next to each finding whether the simulation agrees. The
//! study is `easerve_study::reproduce`; this command checks the folders,
//! writes the report and each modality's sweep outputs.

use crate::sweep_cmd::{sweep_err, write_outputs};
use crate::BadInput;
use easerve_study::reproduce::{reproduce, ReproduceError, MODALITIES};
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

pub(crate) fn run(a: ReproduceArgs) -> anyhow::Result<ExitCode> {
    let started = std::time::Instant::now();
    for name in MODALITIES {
        let scn = a.scenarios.join(format!("{name}.toml"));
        if !scn.exists() {
            return Err(BadInput(format!("{}: not found (--scenarios names the folder holding image.toml, video.toml, audio.toml)", scn.display())).into());
        }
    }
    out_dir(&a.out)?;
    let study = reproduce(&a.scenarios, a.requests).map_err(|e| match e {
        ReproduceError::Sweep(e) => sweep_err(e),
        e => BadInput(e.to_string()).into(),
    })?;
    for (name, part) in &study.sweeps {
        write_outputs(part, &a.out.join(name), false)?;
    }
    crate::write_output("--out", &a.out.join("report.md"), |w| {
        Ok(w.write_all(study.report.as_bytes())?)
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
