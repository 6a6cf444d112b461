//! `[workload.pool]`, `[workload.conversation]` and `[workload.system_prompt]`:
//! how a workload repeats itself ([`Reuse`]).

use super::{num, V};
use crate::scenario::{Arrival, Popularity, Reuse, ScenarioError, Shapes, WorkloadSection};

/// Most distinct items a pool may hold (the generator keeps each item's
/// shape: 10^7 items are about 160 MB).
pub const MAX_POOL: i64 = 10_000_000;

/// The reuse sections of `w`, validated against the workload's `shapes`
/// and `arrival`; `None` when it has none.
pub(super) fn reuse_of(
    w: &WorkloadSection,
    v: &V<'_>,
    shapes: &Shapes,
    arrival: &Arrival,
) -> Result<Option<Reuse>, ScenarioError> {
    if let Arrival::Trace {
        content: Some(c), ..
    } = arrival
    {
        if !c.hashes.is_empty() && !matches!(shapes, Shapes::Items { .. }) {
            return Err(v.err(
                "workload.trace",
                "its ItemHashes column names images or videos: give modality = \"image\" or \"video\"",
            ));
        }
        if w.pool.is_some() || w.system_prompt.is_some() {
            return Err(v.err(
                if w.pool.is_some() { "workload.pool" } else { "workload.system_prompt" },
                "not with a trace that has ItemHashes or ConversationId: the trace says what repeats",
            ));
        }
    }
    if w.pool.is_none() && w.conversation.is_none() && w.system_prompt.is_none() {
        return Ok(None);
    }
    let pool = match &w.pool {
        None => None,
        Some(p) => {
            if !matches!(shapes, Shapes::Items { .. }) {
                return Err(v.err(
                    "workload.pool",
                    "a pool holds images or videos: give modality = \"image\" or \"video\"",
                ));
            }
            if p.size < 1 {
                return Err(v.err(
                    "workload.pool.size",
                    format!("{}: allowed 1 ..= {MAX_POOL} distinct items", p.size),
                ));
            }
            let size = v.int("workload.pool.size", p.size, 1, MAX_POOL)? as u64;
            let popularity = match p.popularity.as_deref().unwrap_or("zipf") {
                "zipf" => {
                    let a = p.alpha.unwrap_or(1.0);
                    if !(a.is_finite() && (0.0..=10.0).contains(&a)) {
                        return Err(v.err(
                            "workload.pool.alpha",
                            format!("{}: the Zipf exponent α is allowed in [0, 10]", num(a)),
                        ));
                    }
                    Popularity::Zipf(a)
                }
                "uniform" if p.alpha.is_some() => {
                    return Err(v.err(
                        "workload.pool.alpha",
                        "only used with popularity = \"zipf\"",
                    ))
                }
                "uniform" => Popularity::Uniform,
                other => {
                    return Err(v.err(
                        "workload.pool.popularity",
                        format!("unknown popularity `{other}`; allowed: zipf, uniform"),
                    ))
                }
            };
            Some((size, popularity))
        }
    };
    let conversation = match &w.conversation {
        None => None,
        Some(c) => {
            if w.phases.is_some() {
                return Err(v.err(
                    "workload.conversation",
                    "not with [[workload.phases]]: conversations start at one rate",
                ));
            }
            if matches!(arrival, Arrival::Trace { .. }) {
                return Err(v.err(
                    "workload.conversation",
                    "not with arrival = \"trace\": a trace replays its own requests",
                ));
            }
            let turns = v.int("workload.conversation.turns", c.turns, 1, 1_000)? as u32;
            let think = v.real(
                "workload.conversation.think_time_s",
                c.think_time_s.unwrap_or(0.0),
                0.0,
                1e6,
                false,
            )?;
            Some((turns, think))
        }
    };
    let system_prompt = match &w.system_prompt {
        None => None,
        Some(s) => {
            let tokens = v.int("workload.system_prompt.tokens", s.tokens, 1, 1_000_000)? as u32;
            let count = v.int(
                "workload.system_prompt.count",
                s.count.unwrap_or(1),
                1,
                1_000_000,
            )? as u32;
            Some((tokens, count))
        }
    };
    Ok(Some(Reuse {
        pool,
        conversation,
        system_prompt,
    }))
}

#[cfg(test)]
mod tests {
    use crate::scenario::{Overrides, Scenario};

    fn field_of(sets: &[(&str, &str)]) -> (String, String) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/image.toml");
        let sets: Vec<(String, String)> = sets
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let e = Scenario::load_with(&path, &sets, &Overrides::default()).expect_err("invalid");
        (e.field, e.message)
    }

    #[test]
    fn bad_reuse_fields_name_the_field_and_what_is_allowed() {
        let (f, m) = field_of(&[("workload.pool.size", "0")]);
        assert_eq!(f, "workload.pool.size");
        assert!(m.contains("allowed 1 ..="), "{m}");
        let (f, m) = field_of(&[("workload.pool.size", "9"), ("workload.pool.alpha", "-0.5")]);
        assert_eq!(f, "workload.pool.alpha");
        assert!(m.contains("[0, 10]"), "{m}");
        let (f, _) = field_of(&[("workload.conversation.turns", "0")]);
        assert_eq!(f, "workload.conversation.turns");
        let (f, m) = field_of(&[("deployment.encoder_cache.capacity_gib", "0.001")]);
        assert_eq!(f, "deployment.encoder_cache.capacity_gib");
        assert!(m.contains("one item's embeddings (0.0391 GiB"), "{m}");
        let (f, m) = field_of(&[("deployment.prefix_cache.block_size", "24")]);
        assert_eq!(f, "deployment.prefix_cache.block_size");
        assert!(m.contains("a power of two"), "{m}");
        let (f, _) = field_of(&[("deployment.cache_routing.overlap_weight", "1")]);
        assert_eq!(f, "deployment.cache_routing");
        let (f, _) = field_of(&[
            ("deployment.system", "aggregated"),
            ("deployment.encoder_cache.capacity_gib", "1"),
        ]);
        assert_eq!(f, "deployment.encoder_cache");
    }

    #[test]
    fn bad_store_fields_name_the_field_and_what_is_allowed() {
        let (f, m) = field_of(&[("deployment.encoder_store.capacity_gib", "0.001")]);
        assert_eq!(f, "deployment.encoder_store.capacity_gib");
        assert!(m.contains("one item's embeddings (0.0391 GiB"), "{m}");
        let (f, _) = field_of(&[("deployment.encoder_store.capacity_gib", "-1")]);
        assert_eq!(f, "deployment.encoder_store.capacity_gib");
        let (f, m) = field_of(&[
            ("deployment.encoder_store.capacity_gib", "4"),
            ("deployment.encoder_store.link", "pcie9"),
        ]);
        assert_eq!(f, "deployment.encoder_store.link");
        assert!(m.contains("allowed: pcie4-x16"), "{m}");
        let (f, _) = field_of(&[
            ("deployment.system", "aggregated"),
            ("deployment.encoder_store.capacity_gib", "4"),
        ]);
        assert_eq!(f, "deployment.encoder_store");
        // the store alone does not make cache-aware placement meaningful
        let (f, _) = field_of(&[
            ("deployment.encoder_store.capacity_gib", "4"),
            ("deployment.cache_routing.overlap_weight", "1"),
        ]);
        assert_eq!(f, "deployment.cache_routing");
    }
}
