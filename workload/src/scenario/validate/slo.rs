//! The `[[slo]]` tiers: names that can name files and labels, each named
//! once, with positive TTFT and TPOT bounds.

use super::V;
use crate::report::SloTier;
use crate::scenario::{ScenarioError, ScenarioFile};

/// Longest SLO tier name, characters.
pub const MAX_TIER_NAME: usize = 64;

/// The `[[slo]]` tiers: names and TTFT / TPOT bounds (seconds).
pub(super) fn slo_section(raw: &ScenarioFile, v: &V<'_>) -> Result<Vec<SloTier>, ScenarioError> {
    let mut slo = Vec::new();
    for (i, t) in raw.slo.iter().enumerate() {
        let f = format!("slo[{i}]");
        let name = &t.name;
        // tier names also name files (`goodput-NAME.svg`) and metric labels
        let plain = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if name.is_empty() || name.len() > MAX_TIER_NAME || !plain || name.starts_with('.') {
            return Err(v.err(
                &format!("{f}.name"),
                format!(
                    "`{}` is not a tier name: use 1 to {MAX_TIER_NAME} ASCII letters, digits, `_`, `-` or `.`, not starting with `.`",
                    name.chars().take(80).collect::<String>()
                ),
            ));
        }
        if raw.slo[..i].iter().any(|o| &o.name == name) {
            return Err(v.err(
                &format!("{f}.name"),
                format!("tier `{name}` is named twice"),
            ));
        }
        slo.push(SloTier {
            name: name.clone(),
            ttft_s: v.real(&format!("{f}.ttft_s"), t.ttft_s, 0.0, 1e9, true)?,
            tpot_s: v.real(&format!("{f}.tpot_ms"), t.tpot_ms, 0.0, 1e9, true)? / 1e3,
        });
    }

    Ok(slo)
}
