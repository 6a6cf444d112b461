//! Validation: raw data ([`ScenarioFile`]) in, a [`Scenario`] out, or an
//! error that names the file, the field and what is allowed.
//! [`Scenario::validate`] takes the sections in a fixed order (the first
//! error found is the one reported): the system, the model and cluster, the
//! workload, the deployment, the allocation against the cluster and the
//! model (`feasibility`), preprocessing, the profile, the SLO tiers, the
//! launch modes. Each section's checks and bounds live in a module of their
//! own; the helpers they share (`V`, [`num`], presets or custom files) live
//! here, with the warnings for a run that is valid but large
//! ([`Scenario::size_warnings`]).

mod cache;
mod cluster;
mod deployment;
mod feasibility;
mod groups;
mod limits;
mod model;
mod planner;
mod profile;
mod reuse;
mod schedule;
mod slo;
mod workload;

pub use cluster::{HARDWARE_MIN, NO_FP8_GPUS};
pub use deployment::{HOST_CORES_PER_GPU, MAX_BATCH, MAX_WAIT_S};
pub use model::{check_model, ModelError, KV_DTYPES, LLM_DTYPES, NODE_GPUS};
pub use reuse::MAX_POOL;
pub use schedule::PHASE_KINDS;
pub use slo::MAX_TIER_NAME;
pub use workload::{MAX_HORIZON_S, MAX_RATE};

use super::file::{field_at, plain_types};
use super::{Scenario, ScenarioError, ScenarioFile, ServingKnobs, System};
use cluster::cluster_section;
use deployment::{deployment_section, launch_section, preprocess_section, system_of};
use feasibility::{check_allocation, check_llm_tp, Fit};
use limits::limits_section;
use profile::profile_section;
use slo::slo_section;
use std::path::Path;
use workload::workload_section;

impl Scenario {
    /// Validate raw data into a scenario.
    pub fn validate(
        raw: ScenarioFile,
        file: &str,
        default_name: &str,
    ) -> Result<Scenario, ScenarioError> {
        let v = V { file };
        let system = system_of(&raw, &v)?;
        if matches!(
            system,
            System::Passthrough | System::EpdServe | System::HydraInfer
        ) {
            // what the user gave (B, s, the dispatch rule, …) is checked first,
            // as for every system, before the system's policy set replaces it
            deployment_section(&raw, &v)?;
        }
        let dir = Path::new(file).parent().unwrap_or(Path::new("."));
        let (model, gpu, gpus, groups) = cluster_section(&raw, &v, dir)?;
        let workload = workload_section(&raw, &v, file, &model)?;
        let (deployment, knobs) = deployment_section(&raw, &v)?;
        let deployment = system.deployment(deployment);

        // --- feasibility against the cluster and the model ---
        check_allocation(&v, system, gpus, &model, workload.modality, &deployment)?;
        let stage_groups = groups::stage_groups(&raw, &v, &groups, &deployment.allocation)?;
        // with groups, `gpu` is the LLM's (decode's) and the encode GPU may differ
        let (gpu, enc_gpu) = match groups.is_empty() {
            true => (gpu.clone(), gpu),
            false => (
                groups[stage_groups[2]].gpu.clone(),
                groups[stage_groups[0]].gpu.clone(),
            ),
        };
        let fit = Fit::new(&model, &gpu, &workload, &knobs);
        if groups.is_empty() {
            fit.check_workers(&v, &deployment.allocation, workload.modality)?;
        } else {
            // each stage's workers against its own group's GPU
            for (s, &g) in stage_groups.iter().enumerate() {
                let mut only = deployment.allocation;
                for (k, pool) in [&mut only.encode, &mut only.prefill, &mut only.decode]
                    .into_iter()
                    .enumerate()
                {
                    if k != s {
                        pool.workers = 0;
                    }
                }
                Fit::new(&model, &groups[g].gpu, &workload, &knobs).check_workers(
                    &v,
                    &only,
                    workload.modality,
                )?;
            }
        }
        let enc_fit = (!groups.is_empty()).then(|| Fit::new(&model, &enc_gpu, &workload, &knobs));
        let aggregated_tp = fit.aggregated_tp(&v, raw.deployment.aggregated_tp, system, gpus)?;
        let local_prefill_tp = enc_fit
            .as_ref()
            .unwrap_or(&fit)
            .local_prefill_tp(&v, &deployment)?;
        let cluster = match groups.is_empty() {
            true => None,
            false => {
                groups::check_system(&raw, &v, system)?;
                let alloc = &deployment.allocation;
                Some(groups::place(
                    &v,
                    groups,
                    stage_groups,
                    alloc,
                    local_prefill_tp,
                )?)
            }
        };
        check_llm_tp(&v, &deployment.allocation, &model, gpus)?;

        let preprocess_threads = preprocess_section(&raw, &v, system, &gpu, gpus)?;
        check_baseline(&v, system, workload.modality, preprocess_threads.is_some())?;

        // --- cost source ---
        let profile = profile_section(&raw, &v, file, &model, &gpu)?;

        let against = cache::Against {
            system,
            model: &model,
            gpu: &gpu,
            workload: &workload,
            deployment: &deployment,
            knobs: &knobs,
            local_prefill_tp,
        };
        let caches = cache::cache_section(&raw, &v, &against)?;
        let slo = slo_section(&raw, &v)?;
        let limits = limits_section(&raw, &v)?;
        let launch = launch_section(&raw, &v)?;

        let mut sc = Scenario {
            name: raw.name.clone().unwrap_or_else(|| default_name.to_string()),
            file: file.to_string(),
            seed: raw.seed,
            model,
            gpu,
            gpus,
            deployment,
            system,
            profile,
            knobs: ServingKnobs {
                local_prefill_tp,
                aggregated_tp,
                preprocess_threads,
                caches,
                ..knobs
            },
            workload,
            slo,
            limits,
            launch,
            planner: None,
            cluster,
            raw,
        };
        sc.planner = planner::planner_section(&sc, &v)?;
        if system == System::HydraInfer {
            sc.apply_step_budgets();
        }
        Ok(sc)
    }
}

/// What the EPD-Serve and HydraInfer baselines serve: image (or text)
/// requests, as their repositories do (EPD-Serve shards a request's images,
/// `epdserve/engine_encoding.py`; HydraInfer's request processor takes one
/// image, `hydrainfer/engine/request_processor.py`); EPD-Serve preprocesses
/// each shard inside its encode pass (`epdserve/worker.py`, `map_input`),
/// never as a pipelined host stage.
fn check_baseline(
    v: &V<'_>,
    system: System,
    modality: easerve_sched::Modality,
    pipelined: bool,
) -> Result<(), ScenarioError> {
    use easerve_sched::Modality;
    if !matches!(system, System::EpdServe | System::HydraInfer) {
        return Ok(());
    }
    if matches!(modality, Modality::Video | Modality::Audio) {
        return Err(v.err(
            "deployment.system",
            format!(
                "{system} serves image (or text) requests only, as its repository does; this workload is {}",
                format!("{modality:?}").to_lowercase()
            ),
        ));
    }
    if system == System::EpdServe && pipelined {
        return Err(v.err(
            "deployment.preprocess",
            "epd-serve preprocesses each image shard inside its encode pass (`serial`), not as a pipelined host stage",
        ));
    }
    Ok(())
}

/// The file every error names, and the checks every section shares.
struct V<'a> {
    file: &'a str,
}

impl V<'_> {
    fn err(&self, field: &str, message: impl std::fmt::Display) -> ScenarioError {
        ScenarioError {
            file: self.file.to_string(),
            field: field.to_string(),
            message: message.to_string(),
        }
    }

    /// Validate a non-empty table field by field; `each` gets `field[i]` and the row.
    fn table<B, T>(
        &self,
        field: &str,
        rows: &[B],
        mut each: impl FnMut(&str, &B) -> Result<T, ScenarioError>,
    ) -> Result<Vec<T>, ScenarioError> {
        if rows.is_empty() {
            return Err(self.err(field, "at least one bucket is required"));
        }
        rows.iter()
            .enumerate()
            .map(|(i, row)| each(&format!("{field}[{i}]"), row))
            .collect()
    }

    fn int(&self, field: &str, v: i64, min: i64, max: i64) -> Result<i64, ScenarioError> {
        if v < min || v > max {
            Err(self.err(
                field,
                format!("{v} is out of range: allowed {min} ..= {max}"),
            ))
        } else {
            Ok(v)
        }
    }

    fn real(
        &self,
        field: &str,
        v: f64,
        lo: f64,
        hi: f64,
        open_lo: bool,
    ) -> Result<f64, ScenarioError> {
        let ok = v.is_finite() && (if open_lo { v > lo } else { v >= lo }) && v <= hi;
        if ok {
            Ok(v)
        } else {
            let l = if open_lo { "(" } else { "[" };
            Err(self.err(
                field,
                format!(
                    "{} is out of range: allowed {l}{}, {}]",
                    num(v),
                    num(lo),
                    num(hi)
                ),
            ))
        }
    }
}

/// A number as an error message shows it: plain when it is of everyday size,
/// in scientific notation when it is tiny or huge (never 309 digits).
pub fn num(x: f64) -> String {
    let a = x.abs();
    if x == 0.0 || !x.is_finite() || (1e-4..1e15).contains(&a) {
        format!("{x}")
    } else {
        format!("{x:e}")
    }
}

/// What a preset field names (`"model"`), its lookup, and the allowed names.
type Presets<'a, T> = (&'a str, fn(&str) -> Option<T>, &'a [&'a str]);

/// A model or GPU given either as a preset name or as a custom TOML file next
/// to the scenario (in `dir`), exactly one of the two. `fields` names the
/// section and its preset and file fields; `presets` names what it is, looks
/// a preset up and lists the allowed names; `check` validates a custom file.
fn preset_or_file<T: serde::de::DeserializeOwned, E: std::fmt::Display>(
    v: &V,
    dir: &Path,
    (section, preset_field, file_field): (&str, &str, &str),
    given: (Option<&str>, Option<&str>),
    (what, preset, names): Presets<'_, T>,
    check: fn(&T) -> Result<(), E>,
) -> Result<T, ScenarioError> {
    let key = |f: &str| f.rsplit('.').next().unwrap_or(f).to_string();
    match given {
        (Some(name), None) => preset(name).ok_or_else(|| {
            v.err(
                preset_field,
                format!(
                    "unknown {what} `{name}`; allowed: {} (or `{file_field}` for a custom {what})",
                    names.join(", ")
                ),
            )
        }),
        (None, Some(f)) => {
            let path = dir.join(f);
            let x: T = load_custom(v, file_field, &path)?;
            check(&x).map_err(|e| v.err(file_field, format!("{}: {e}", path.display())))?;
            Ok(x)
        }
        _ => Err(v.err(
            section,
            format!(
                "give exactly one of `{}` and `{}`",
                key(preset_field),
                key(file_field)
            ),
        )),
    }
}

/// Read a custom model or GPU definition; errors name the file and the field.
fn load_custom<T: serde::de::DeserializeOwned>(
    v: &V,
    field: &str,
    path: &Path,
) -> Result<T, ScenarioError> {
    let text = easerve_calib::input::read_text(path)
        .map_err(|e| v.err(field, format!("cannot read {}: {e}", path.display())))?;
    serde_path_to_error::deserialize(toml::Deserializer::new(&text)).map_err(|e| {
        let inner_field = e.path().to_string();
        let inner = e.into_inner();
        // as in ScenarioFile::parse: a value the TOML parser rejects names
        // its field from the text
        let inner_field = match (inner_field.as_str(), inner.span()) {
            (".", Some(span)) => field_at(&text, span.start).unwrap_or(inner_field),
            _ => inner_field,
        };
        v.err(
            field,
            format!(
                "{}: field `{inner_field}`: {}",
                path.display(),
                plain_types(inner.message())
            ),
        )
    })
}

/// Peak memory of a simulated run per request, bytes: 289,268–290,272 KiB
/// (296.2–297.2 MB) at most at 1,000,000 requests of the image scenario
/// (docs/reuse.md, "Speed"), 2,677,192–2,680,720 KiB (2.75 GB) at
/// 10,000,000 of `dc-1024.toml` (docs/datacenter.md, "Less memory per
/// request"); `/usr/bin/time -f %M`, 2026-12-07, since a request's record
/// is 144 bytes and the report gathers its samples in two passes.
pub const SIM_BYTES_PER_REQUEST: f64 = 296.0;

/// Decode iterations a simulated run gets through per second, about: the
/// image scenario's 1,000,000-request run took 1.71 s for 10.8 M iterations
/// inside decode runs, plus 9.1 M other events (docs/speed.md, "Speed",
/// 2026-12-03), so about 6.3 M iterations per second of the whole run (it
/// took 1.23–1.44 s on 2026-12-07: a conservative rate).
pub const SIM_STEPS_PER_SECOND: f64 = 6.3e6;

impl Scenario {
    /// Warnings for a run that is valid but large: its memory estimate
    /// ([`SIM_BYTES_PER_REQUEST`]) over 2 GB, or an upper bound on its decode
    /// iterations (every output token an iteration of its own) that would take
    /// over a minute at [`SIM_STEPS_PER_SECOND`]. Nothing is capped.
    pub fn size_warnings(&self) -> Vec<String> {
        let w = &self.workload;
        let mut out = Vec::new();
        let bytes = w.requests as f64 * SIM_BYTES_PER_REQUEST;
        if bytes > 2e9 {
            out.push(format!(
                "{} requests need about {:.1} GB of memory in the simulator ({} bytes each, measured); lower workload.requests for a smaller run",
                w.requests,
                bytes / 1e9,
                SIM_BYTES_PER_REQUEST
            ));
        }
        let steps = w.requests as f64 * f64::from(w.output_len) * (1.0 + w.range_ratio);
        let secs = steps / SIM_STEPS_PER_SECOND;
        if secs > 60.0 {
            out.push(format!(
                "{} requests of up to {} output tokens may take up to {} decode iterations, up to about {} s to simulate (decode batches share iterations, so usually far less; the exec driver is slower still); lower workload.output_len or workload.requests for a quicker run",
                w.requests,
                (f64::from(w.output_len) * (1.0 + w.range_ratio)).ceil(),
                num(steps),
                num(secs.round())
            ));
        }
        out
    }
}
