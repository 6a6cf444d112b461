//! The `profile` field: a measured profile next to the scenario, which must
//! profile the scenario's model on its GPU and link and price every stage
//! the workload needs at more than nothing.

use super::V;
use crate::scenario::{ScenarioError, ScenarioFile};
use easerve_calib::GpuSpec;
use easerve_model::ModelArch;
use std::path::Path;

/// The `profile` field: a measured profile next to the scenario (`file`),
/// which must profile the scenario's model on its GPU and link; `None` for
/// none or `"roofline"`.
pub(super) fn profile_section(
    raw: &ScenarioFile,
    v: &V<'_>,
    file: &str,
    model: &ModelArch,
    gpu: &GpuSpec,
) -> Result<Option<easerve_calib::Profile>, ScenarioError> {
    let profile = match raw.profile.as_deref() {
        None | Some("roofline") => None,
        Some(name) => {
            let path = Path::new(file)
                .parent()
                .unwrap_or(Path::new("."))
                .join(name);
            let text = easerve_calib::input::read_text(&path)
                .map_err(|e| v.err("profile", format!("cannot read {}: {e}", path.display())))?;
            // a custom GPU (cluster.gpu_file) is a known device for its own profiles
            let p = easerve_calib::Profile::from_toml_str_with_devices(
                &text,
                &path.display().to_string(),
                std::slice::from_ref(&gpu.name),
                std::slice::from_ref(&gpu.link.name),
            )
            .map_err(|e| v.err("profile", e.to_string()))?;
            let prov = &p.provenance;
            if prov.model != model.name || prov.device != gpu.name || prov.link != gpu.link.name {
                return Err(v.err(
                    "profile",
                    format!(
                        "{} profiles {} on {} over {}, but the scenario runs {} on {} over {}",
                        path.display(),
                        prov.model,
                        prov.device,
                        prov.link,
                        model.name,
                        gpu.name,
                        gpu.link.name
                    ),
                ));
            }
            check_profile_tables(&p, raw, v, &path)?;
            Some(p)
        }
    };

    Ok(profile)
}

/// A profile that would make a stage free is refused: an encode table is
/// needed by a multimodal workload, and a table whose `median` latencies are
/// all 0 prices every batch of its stage at nothing.
fn check_profile_tables(
    p: &easerve_calib::Profile,
    raw: &ScenarioFile,
    v: &V<'_>,
    path: &Path,
) -> Result<(), ScenarioError> {
    let modality = raw.workload.modality.as_str();
    if modality != "text" && p.encode_table().is_none() {
        return Err(v.err(
            "profile",
            format!(
                "{} has no encode table, which a {modality} workload needs (every encode pass would be free); measure one with `easerve profile`, or write its [[encode]] rows",
                path.display()
            ),
        ));
    }
    let tables = p
        .encode_table()
        .into_iter()
        .chain([p.prefill_table(), p.decode_table()]);
    for t in tables {
        let Some(m) = t.columns().iter().position(|c| c == "median") else {
            continue;
        };
        if !t.rows().is_empty() && t.rows().iter().all(|r| r.get(m).is_some_and(|x| *x <= 0.0)) {
            return Err(v.err(
                "profile",
                format!(
                    "{}: every `median` of its {} table is 0, which would make that stage free; give the measured latencies",
                    path.display(),
                    t.stage().name()
                ),
            ));
        }
    }
    Ok(())
}
