//! `easerve model`: model files for scenarios (`model.file`).

use crate::BadInput;
use easerve_model::import::{import, Inputs, Source};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Model files.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum ModelCommand {
    /// Write a model file from a Hugging Face checkpoint's config.json (LLaVA-NeXT,
    /// Qwen2.5-VL, Qwen3-VL dense and MoE, Gemma 3, InternVL, Llama 4, Qwen3-Omni,
    /// Ultravox/Whisper), each value commented with the key it came from.
    #[command(after_help = crate::EXIT_CODES)]
    Import(ImportArgs),
}

#[derive(clap::Args, Debug)]
pub(crate) struct ImportArgs {
    /// The checkpoint's config.json.
    config: PathBuf,
    /// Its preprocessor_config.json: Qwen's pixel bounds (required for Qwen2.5-VL
    /// and Qwen3-VL), Gemma 3's pan-and-scan, Llama 4's `max_patches`.
    #[arg(long, value_name = "FILE")]
    preprocessor: Option<PathBuf>,
    /// Its video_preprocessor_config.json (Qwen3-VL's video pixel bounds; default:
    /// the values of the Qwen3-VL checkpoints' file).
    #[arg(long, value_name = "FILE")]
    video_preprocessor: Option<PathBuf>,
    /// The model's name in reports (default: the last part of the config's
    /// `_name_or_path`, else the output file's stem, lowercased).
    #[arg(long)]
    name: Option<String>,
    /// The model file to write (TOML; a scenario reads it as `model.file`).
    #[arg(short = 'o', long = "output", value_name = "MODEL.toml")]
    output: PathBuf,
}

fn read_json(flag: &str, path: &Path) -> Result<serde_json::Value, BadInput> {
    let text = easerve_calib::input::read_text(path)
        .map_err(|e| BadInput(format!("{flag} {}: cannot read: {e}", path.display())))?;
    serde_json::from_str(&text).map_err(|e| {
        BadInput(format!(
            "{flag} {}: not JSON ({e}); give the checkpoint's file as Hugging Face ships it",
            path.display()
        ))
    })
}

pub(crate) fn run(cmd: ModelCommand) -> anyhow::Result<ExitCode> {
    let ModelCommand::Import(a) = cmd;
    let config = read_json("CONFIG", &a.config)?;
    let pre = a
        .preprocessor
        .as_deref()
        .map(|p| read_json("--preprocessor", p))
        .transpose()?;
    let video = a
        .video_preprocessor
        .as_deref()
        .map(|p| read_json("--video-preprocessor", p))
        .transpose()?;
    let name = model_name(&a, &config)?;
    let got = import(
        &name,
        Inputs {
            config: &config,
            preprocessor: pre.as_ref(),
            video_preprocessor: video.as_ref(),
        },
    )
    .map_err(|e| {
        BadInput(format!(
            "{}: key `{}`: {}",
            source_path(&a, e.file),
            e.key,
            e.message
        ))
    })?;
    // what a scenario's loader would refuse is refused here, before writing
    easerve_workload::scenario::check_model(&got.arch).map_err(|e| {
        BadInput(format!(
            "{}: the imported model is not one easerve can run: {e}",
            a.config.display()
        ))
    })?;
    let mut inputs = vec![format!("`{}`", a.config.display())];
    inputs.extend(a.preprocessor.iter().map(|p| format!("`{}`", p.display())));
    inputs.extend(
        a.video_preprocessor
            .iter()
            .map(|p| format!("`{}`", p.display())),
    );
    let text = got.to_toml(&inputs.join(", "))?;
    crate::write_output("-o", &a.output, |w| {
        Ok(std::io::Write::write_all(w, text.as_bytes())?)
    })?;
    sayln!(
        "wrote {} ({} model `{}`: {} encoder layers, {} LLM layers{}){}",
        a.output.display(),
        got.family,
        got.arch.name,
        got.arch.encoder.as_ref().map_or(0, |e| e.layers),
        got.arch.llm.layers,
        got.arch.llm.moe.as_ref().map_or(String::new(), |m| format!(
            ", {} experts top {}",
            m.experts, m.top_k
        )),
        if got.notes.is_empty() {
            String::new()
        } else {
            format!("; notes: {}", got.notes.join("; "))
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// The model's name in reports: `--name`, else the last part of the config's
/// `_name_or_path`, else the output file's stem, lowercased.
fn model_name(a: &ImportArgs, config: &serde_json::Value) -> Result<String, BadInput> {
    Ok(match &a.name {
        Some(n) if !n.trim().is_empty() => n.trim().to_string(),
        Some(_) => return Err(BadInput("--name: must not be empty".into())),
        None => config
            .get("_name_or_path")
            .and_then(|v| v.as_str())
            .and_then(|s| s.trim_end_matches('/').rsplit('/').next())
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .or_else(|| {
                a.output
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| "imported".into())
            .to_lowercase(),
    })
}

/// The path given for input `s` (its usual file name when none was given).
fn source_path(a: &ImportArgs, s: Source) -> String {
    let p = match s {
        Source::Config => Some(&a.config),
        Source::Preprocessor => a.preprocessor.as_ref(),
        Source::VideoPreprocessor => a.video_preprocessor.as_ref(),
    };
    p.map_or_else(|| s.file_name().to_string(), |p| p.display().to_string())
}
