//! The search space: feasible allocations of a cluster and the candidates
//! `(allocation, B, s)` built on them.

use easerve_sched::{Allocation, MAX_TERM};
use easerve_workload::scenario::{Overrides, Scenario, ScenarioFile, StageGroupsSection};
use serde::{Deserialize, Serialize};
use std::fmt;

/// TP degrees tried for prefill and decode workers.
pub use easerve_sim::capacity::{worker_layouts, TP_DEGREES};

/// One point of the search space.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// GPUs per stage.
    pub allocation: Allocation,
    /// Encode micro-batch bound `B ≥ 1`.
    pub batch: u32,
    /// Offload ratio `s ∈ [0, 1]`.
    pub offload: f64,
    /// On node groups, the group of each stage (encode, prefill, decode),
    /// by name; `None`: the scenario's own `[deployment.groups]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<StageGroups>,
}

/// The node group of each stage, by name: encode, prefill, decode.
pub type StageGroups = [String; 3];

impl fmt::Display for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} B={} s={}", self.allocation, self.batch, self.offload)?;
        match &self.groups {
            Some(g) => write!(f, " groups={}", g.join(",")),
            None => Ok(()),
        }
    }
}

/// What a candidate's text must look like (every [`CandidateError`] but a bad
/// allocation ends with it).
const SHAPE: &str = "expected `ALLOCATION B=<integer ≥ 1> s=<number in [0, 1]>` and, on node groups, optionally `groups=ENCODE,PREFILL,DECODE` (group names), e.g. `2E(TP1)+1P(TP2)+1D(TP4) B=8 s=0.55`";

/// Why a text is not a [`Candidate`] (`--deployment`).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CandidateError {
    /// Nothing but blanks.
    #[error("empty deployment; {SHAPE}")]
    Empty,
    /// The allocation does not parse.
    #[error("{0}")]
    Allocation(easerve_sched::AllocationError),
    /// A `B=` that is not an integer ≥ 1, or an `s=` that is not a number in
    /// `[0, 1]`.
    #[error("`{0}`: {SHAPE}")]
    Value(String),
    /// A part that is neither `B=` nor `s=`.
    #[error("unexpected `{0}`; {SHAPE}")]
    Unexpected(String),
    /// `B=` or `s=` missing.
    #[error("`{0}` lacks B= or s=; {SHAPE}")]
    Incomplete(String),
}

impl std::str::FromStr for Candidate {
    type Err = CandidateError;

    /// Parse what [`fmt::Display`] prints: `ALLOCATION B=<int> s=<float>`,
    /// then on node groups `groups=ENCODE,PREFILL,DECODE`, e.g.
    /// `2E(TP1)+1P(TP2)+1D(TP4) B=8 s=0.55 groups=l40s,h100,h100`.
    fn from_str(text: &str) -> Result<Self, CandidateError> {
        let mut parts = text.split_whitespace();
        let allocation: Allocation = parts
            .next()
            .ok_or(CandidateError::Empty)?
            .parse()
            .map_err(CandidateError::Allocation)?;
        let (mut batch, mut offload, mut groups) = (None, None, None);
        for p in parts {
            match p.split_once('=') {
                Some(("B", v)) => {
                    batch = Some(
                        v.parse::<u32>()
                            .ok()
                            .filter(|b| *b >= 1)
                            .ok_or_else(|| CandidateError::Value(p.to_string()))?,
                    )
                }
                Some(("s", v)) => {
                    offload = Some(
                        v.parse::<f64>()
                            .ok()
                            .filter(|s| (0.0..=1.0).contains(s))
                            .ok_or_else(|| CandidateError::Value(p.to_string()))?,
                    )
                }
                Some(("groups", v)) => {
                    let names: Vec<String> = v.split(',').map(str::to_string).collect();
                    groups = Some(
                        <StageGroups>::try_from(names)
                            .ok()
                            .filter(|g| g.iter().all(|n| !n.is_empty()))
                            .ok_or_else(|| CandidateError::Value(p.to_string()))?,
                    )
                }
                _ => return Err(CandidateError::Unexpected(p.to_string())),
            }
        }
        match (batch, offload) {
            (Some(batch), Some(offload)) => Ok(Candidate {
                allocation,
                batch,
                offload,
                groups,
            }),
            _ => Err(CandidateError::Incomplete(text.to_string())),
        }
    }
}

impl Candidate {
    /// The command-line overrides that run this candidate.
    pub fn overrides(&self, base: &Overrides) -> Overrides {
        Overrides {
            allocation: Some(self.allocation.to_string()),
            batch: Some(i64::from(self.batch)),
            offload: Some(self.offload),
            groups: self.groups.as_ref().map(|[e, p, d]| StageGroupsSection {
                encode: Some(e.clone()),
                prefill: Some(p.clone()),
                decode: Some(d.clone()),
            }),
            ..base.clone()
        }
    }
}

/// A feasible allocation and what it allows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FeasibleAllocation {
    /// The allocation (all of the cluster's GPUs).
    pub allocation: Allocation,
    /// Local prefill workers it can co-locate on its encode GPUs when `s < 1`
    /// (0 when the LLM does not fit next to the encoder).
    pub local_workers: u32,
    /// TP degree of each local prefill worker.
    pub local_tp: Option<u32>,
    /// Offload ratios it admits: `[lo, hi]` (`[1, 1]` without local prefill,
    /// `[0, 0]` without remote prefill workers).
    pub offload_range: (f64, f64),
    /// On node groups, the group of each stage ([`stage_assignments`]);
    /// `None` on a one-node cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub groups: Option<StageGroups>,
}

impl FeasibleAllocation {
    /// Whether `c` runs this allocation on the same groups.
    pub fn is_of(&self, c: &Candidate) -> bool {
        self.allocation == c.allocation && (c.groups.is_none() || c.groups == self.groups)
    }
}

/// Validate `raw` with `o` applied, as the CLI would.
pub(crate) fn validate(raw: &ScenarioFile, file: &str, o: &Overrides) -> Option<Scenario> {
    let mut raw = raw.clone();
    raw.apply(o);
    Scenario::validate(raw, file, "search").ok()
}

/// Every allocation that uses all `gpus` GPUs of the scenario's cluster and is
/// feasible for its model and workload: `nE ≥ 1` encode workers at TP1,
/// `nP ≥ 0` remote prefill workers and `nD ≥ 1` decode workers at TP degrees
/// from [`TP_DEGREES`] where the LLM's weights plus the KV cache of one longest
/// sequence fit. An allocation without prefill workers is feasible only when
/// local prefill fits next to the encoder (then `s = 0`). On node groups
/// each stage's workers stay in the group `[deployment.groups]` names and
/// within one of its nodes, so the allocation fills every group a stage
/// names exactly (and leaves the others idle); shapes that do not are
/// dropped by counting, before any validation (a 1,024-GPU cluster of two
/// groups: 3,540 allocations validated of the 1.8 million counts that sum
/// to its GPUs). Order: by encode, prefill, decode counts and degrees
/// (deterministic). [`feasible_allocations_across_groups`] enumerates the
/// stages' groups as well.
pub fn feasible_allocations(sc: &Scenario) -> Vec<FeasibleAllocation> {
    let text_only = sc.workload.modality == easerve_sched::Modality::Text;
    let experts = sc.model.llm.moe.as_ref().map(|m| m.experts);
    feasible_allocations_in(&sc.raw, &sc.file, sc.gpus, text_only, experts)
}

/// [`feasible_allocations`] on every assignment of the stages to the
/// scenario's node groups ([`stage_assignments`]: the file's own first),
/// each allocation tagged with its groups: which group each stage's
/// instances use, how many instances each stage gets, and their TP. On a
/// one-node cluster, [`feasible_allocations`].
pub fn feasible_allocations_across_groups(sc: &Scenario) -> Vec<FeasibleAllocation> {
    if sc.raw.cluster.groups.is_empty() {
        return feasible_allocations(sc);
    }
    let text_only = sc.workload.modality == easerve_sched::Modality::Text;
    let experts = sc.model.llm.moe.as_ref().map(|m| m.experts);
    stage_assignments(&sc.raw)
        .into_iter()
        .flat_map(|groups| {
            let mut raw = sc.raw.clone();
            raw.deployment.groups = Some(section_of(&groups));
            feasible_allocations_in(&raw, &sc.file, sc.gpus, text_only, experts)
        })
        .collect()
}

/// The allocations a search on `sc` ranked by `objective` chooses among:
/// on node groups, every assignment of the stages to them
/// ([`feasible_allocations_across_groups`]) with `all_groups` or when the
/// objective ranks by cost (which groups the stages use is then part of the
/// choice); else the groups the scenario names ([`feasible_allocations`]).
pub fn search_space(
    sc: &Scenario,
    objective: &crate::Objective,
    all_groups: bool,
) -> Vec<FeasibleAllocation> {
    match all_groups || objective.needs_costs() {
        true => feasible_allocations_across_groups(sc),
        false => feasible_allocations(sc),
    }
}

/// `[deployment.groups]` naming `groups`.
fn section_of([e, p, d]: &StageGroups) -> StageGroupsSection {
    StageGroupsSection {
        encode: Some(e.clone()),
        prefill: Some(p.clone()),
        decode: Some(d.clone()),
    }
}

/// Every assignment of the three stages (encode, prefill, decode) to the
/// node groups of `raw`, by name: the scenario's own (`[deployment.groups]`,
/// a stage it leaves out on the first group) first, then the others in the
/// groups' order (`groups³` in all). Empty without node groups.
pub fn stage_assignments(raw: &ScenarioFile) -> Vec<StageGroups> {
    let names: Vec<String> = raw.cluster.groups.iter().map(|g| g.name.clone()).collect();
    let Some(first) = names.first() else {
        return Vec::new();
    };
    let own = raw.deployment.groups.clone().unwrap_or_default();
    let pick = |x: Option<String>| x.unwrap_or_else(|| first.clone());
    let own = [pick(own.encode), pick(own.prefill), pick(own.decode)];
    let mut out = vec![own.clone()];
    for e in &names {
        for p in &names {
            for d in &names {
                let a = [e.clone(), p.clone(), d.clone()];
                if a != own {
                    out.push(a);
                }
            }
        }
    }
    out
}

/// What an allocation on the stage groups `groups` of `raw` pays per hour:
/// the GPUs of every group a stage names, `Σ nodes · gpus_per_node ·
/// cost_per_gpu_hour` over those groups, each counted once; a group no
/// stage names is not paid. An allocation fills the groups its stages name
/// ([`feasible_allocations`]), so these are the GPUs it places instances
/// on. `None` when a named group has no `cost_per_gpu_hour` or is not one
/// of the cluster's groups.
pub fn hourly_cost(raw: &ScenarioFile, groups: &StageGroups) -> Option<f64> {
    let all = &raw.cluster.groups;
    if all.is_empty() || groups.iter().any(|n| !all.iter().any(|g| &g.name == n)) {
        return None;
    }
    all.iter()
        .filter(|g| groups.contains(&g.name))
        .map(|g| {
            let gpus = g.nodes.max(0) as f64 * g.gpus_per_node.max(0) as f64;
            Some(gpus * g.cost_per_gpu_hour?)
        })
        .sum()
}

/// [`feasible_allocations`] of the scenario file `raw` (read from `file`)
/// on a cluster of `gpus` GPUs, before it has a deployment that fits:
/// `text_only` when its workload has no media (no encode stage);
/// `moe_experts` the model's routed experts for an MoE model (its prefill and
/// decode workers may then take EP, [`worker_layouts`]).
pub fn feasible_allocations_in(
    raw: &ScenarioFile,
    file: &str,
    gpus: u32,
    text_only: bool,
    moe_experts: Option<u32>,
) -> Vec<FeasibleAllocation> {
    let mut raw = raw.clone();
    raw.cluster.gpus = i64::from(gpus);
    let fill = GroupFill::of(&raw);
    // on node groups the allocation fills the groups its stages name
    let used = fill.as_ref().map_or(gpus, |f| {
        u32::try_from(f.gpus.iter().sum::<u64>()).unwrap_or(u32::MAX)
    });
    let shapes = allocation_shapes(used, text_only, moe_experts, fill.as_ref());
    let groups = stage_assignments(&raw).into_iter().next();
    use rayon::prelude::*;
    let Some(fill) = fill else {
        // one node: each shape is checked as the CLI would check it,
        // independently: on rayon's threads, collected in the enumeration's order
        return shapes
            .par_iter()
            .filter_map(|a| assess_shape(&raw, file, *a))
            .collect();
    };
    // on node groups, one validation per class of shapes ([`ShapeClass`])
    // and a placement check per shape: the classes on rayon's threads,
    // the verdicts collected in the enumeration's order
    let nodes = fill.node_groups(&raw);
    let stages = fill.stage.map(Some);
    let mut index: std::collections::HashMap<ShapeClass, usize> = Default::default();
    let mut classes: Vec<Vec<usize>> = Vec::new();
    for (i, a) in shapes.iter().enumerate() {
        let k = *index.entry(ShapeClass::of(a)).or_insert_with(|| {
            classes.push(Vec::new());
            classes.len() - 1
        });
        classes[k].push(i);
    }
    let verdicts: Vec<Vec<(usize, FeasibleAllocation)>> = classes
        .par_iter()
        .map(|members| {
            let mut class: Option<Option<FeasibleAllocation>> = None;
            let mut out = Vec::new();
            for &i in members {
                let a = shapes[i];
                if easerve_sched::Topology::fits_nodes(&a, &nodes, stages).is_err() {
                    continue; // validation refuses it at placement
                }
                let v = match &class {
                    Some(v) => v.clone().map(|fa| FeasibleAllocation {
                        allocation: a,
                        ..fa
                    }),
                    None => {
                        let v = assess_shape(&raw, file, a);
                        class = Some(v.clone());
                        v
                    }
                };
                out.extend(v.map(|fa| (i, fa)));
            }
            out
        })
        .collect();
    let mut all: Vec<(usize, FeasibleAllocation)> = verdicts.into_iter().flatten().collect();
    all.sort_by_key(|(i, _)| *i);
    all.into_iter()
        .map(|(_, fa)| FeasibleAllocation {
            groups: groups.clone(),
            ..fa
        })
        .collect()
}

/// Shapes of one stage assignment that validate alike but for where their
/// workers go: the same encode count and the same prefill and decode
/// layouts (TP, EP), with and without prefill workers apart. What
/// validation checks of a shape depends on its counts only through
/// placement, the local prefill TP (which must divide the encode workers)
/// and whether it has prefill workers (`workload/src/scenario/validate/`:
/// each worker's fit on its group's GPU, the local prefill TP, the stage
/// groups); placement is checked per shape ([`easerve_sched::Topology::fits_nodes`],
/// the first fit validation runs), so a class is validated once, at its
/// first shape that places (tested against a validation per shape in
/// `one_validation_per_class_gives_every_shapes_verdict`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ShapeClass {
    encode: u32,
    prefill: Option<(u32, u32)>,
    decode: (u32, u32),
}

impl ShapeClass {
    fn of(a: &Allocation) -> ShapeClass {
        ShapeClass {
            encode: a.encode.workers,
            prefill: (a.prefill.workers > 0).then_some((a.prefill.tp, a.prefill.ep)),
            decode: (a.decode.tp, a.decode.ep),
        }
    }
}

/// How the node groups of a scenario bound its allocations: the GPUs of
/// each group a stage names (0 for the others), the GPUs of a node of
/// each, and the group each stage's workers run on (`[deployment.groups]`;
/// a stage that names none, the first group, as validation resolves it).
/// Placement keeps a stage's workers within its group, so an allocation
/// using all the GPUs of the named groups fills each of them exactly.
struct GroupFill {
    gpus: Vec<u64>,
    per_node: Vec<u64>,
    stage: [usize; 3],
}

impl GroupFill {
    /// `None` for the one-node form, or where a stage names a group the
    /// cluster lacks (validation refuses every allocation then, saying why).
    fn of(raw: &ScenarioFile) -> Option<GroupFill> {
        let groups = &raw.cluster.groups;
        if groups.is_empty() {
            return None;
        }
        let named = raw.deployment.groups.clone().unwrap_or_default();
        let mut stage = [0; 3];
        for (s, name) in [named.encode, named.prefill, named.decode]
            .into_iter()
            .enumerate()
        {
            if let Some(n) = name {
                stage[s] = groups.iter().position(|g| g.name == n)?;
            }
        }
        let count = |x: i64| u64::try_from(x).unwrap_or(0);
        Some(GroupFill {
            gpus: groups
                .iter()
                .enumerate()
                .map(|(i, g)| match stage.contains(&i) {
                    true => count(g.nodes) * count(g.gpus_per_node),
                    false => 0,
                })
                .collect(),
            per_node: groups.iter().map(|g| count(g.gpus_per_node)).collect(),
            stage,
        })
    }

    /// The cluster's node groups as placement sees them.
    fn node_groups(&self, raw: &ScenarioFile) -> Vec<easerve_sched::NodeGroup> {
        let count = |x: i64| u32::try_from(x).unwrap_or(0);
        raw.cluster
            .groups
            .iter()
            .map(|g| easerve_sched::NodeGroup {
                name: g.name.clone(),
                nodes: count(g.nodes),
                gpus_per_node: count(g.gpus_per_node),
            })
            .collect()
    }

    /// Whether `a` fills every group a stage names exactly, with each
    /// worker within one node of its stage's group (what placement needs
    /// of those groups; placement itself is still checked by validation).
    fn admits(&self, a: &Allocation) -> bool {
        let mut used = vec![0u64; self.gpus.len()];
        for (s, pool) in [a.encode, a.prefill, a.decode].iter().enumerate() {
            let g = self.stage[s];
            let need = u64::from(pool.gpus_per_worker());
            if pool.workers > 0 && need > self.per_node[g] {
                return false;
            }
            used[g] += u64::from(pool.workers) * need;
        }
        used == self.gpus
    }
}

/// The allocation shapes of `gpus` GPUs [`feasible_allocations_in`]
/// checks, in its order: every count and layout that uses all of them
/// (with node groups `fill`, that fills each group, [`GroupFill`]).
/// Counting only: no scenario is validated here.
fn allocation_shapes(
    gpus: u32,
    text_only: bool,
    moe_experts: Option<u32>,
    fill: Option<&GroupFill>,
) -> Vec<Allocation> {
    let layouts = worker_layouts(moe_experts);
    let g = gpus.min(MAX_TERM);
    let mut out = Vec::new();
    // a text-only workload has no encode stage: plain prefill/decode allocations
    let encode_counts = if text_only { 0..=0 } else { 1..=g };
    for n_e in encode_counts {
        for &(tp_p, ep_p) in &layouts {
            let gpus_p = tp_p * ep_p;
            for n_p in 0..=g {
                if n_p > 0 && n_p * gpus_p > g {
                    break;
                }
                if n_p == 0 && (tp_p, ep_p) != layouts[0] {
                    continue; // one allocation without P workers, not one per degree
                }
                for &(tp_d, ep_d) in &layouts {
                    let gpus_d = tp_d * ep_d;
                    let used = n_e + n_p * gpus_p;
                    if used >= g || !(g - used).is_multiple_of(gpus_d) {
                        continue;
                    }
                    let n_d = (g - used) / gpus_d;
                    let mut allocation = Allocation::new((n_e, 1), (n_p, tp_p), (n_d, tp_d));
                    allocation.prefill.ep = if n_p > 0 { ep_p } else { 1 };
                    allocation.decode.ep = ep_d;
                    if fill.is_none_or(|f| f.admits(&allocation)) {
                        out.push(allocation);
                    }
                }
            }
        }
    }
    out
}

/// `allocation` as a [`FeasibleAllocation`] of `raw` (read from `file`), if
/// the scenario validates with it: at `s = 0.5` (or 0 without P workers)
/// for its local prefill workers, at `s = 1` for its remote ones.
fn assess_shape(
    raw: &ScenarioFile,
    file: &str,
    allocation: Allocation,
) -> Option<FeasibleAllocation> {
    let n_p = allocation.prefill.workers;
    let at = |s: f64| {
        validate(
            raw,
            file,
            &Overrides {
                allocation: Some(allocation.to_string()),
                offload: Some(s),
                batch: Some(1),
                ..Default::default()
            },
        )
    };
    let local = if n_p > 0 { at(0.5) } else { at(0.0) };
    let local_tp = local.as_ref().and_then(|s| s.knobs.local_prefill_tp);
    let local_workers = local_tp.map_or(0, |tp| allocation.encode.workers / tp);
    let remote_ok = n_p > 0 && at(1.0).is_some();
    let offload_range = match (remote_ok, local_workers > 0) {
        (true, true) => (0.0, 1.0),
        (true, false) => (1.0, 1.0),
        (false, true) if n_p == 0 => (0.0, 0.0),
        _ => return None,
    };
    Some(FeasibleAllocation {
        allocation,
        local_workers,
        local_tp,
        offload_range,
        groups: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_round_trip_through_text() {
        let c: Candidate = "2E(TP1)+1P(TP2)+1D(TP4) B=8 s=0.55".parse().unwrap();
        assert_eq!(c.batch, 8);
        assert_eq!(c.offload, 0.55);
        assert_eq!(c.to_string().parse::<Candidate>().unwrap(), c);
        let g: Candidate = "2E(TP1)+1P(TP2)+1D(TP4) B=8 s=1 groups=l40s,h100,h100"
            .parse()
            .unwrap();
        assert_eq!(g.groups, Some(["l40s", "h100", "h100"].map(String::from)));
        assert_eq!(g.to_string().parse::<Candidate>().unwrap(), g);
        for bad in [
            "2E(TP1)+1D(TP4) B=2 s=1 groups=a,b",
            "2E(TP1)+1D(TP4) B=2 s=1 groups=a,,b",
            "",
            "2E(TP1)+1D(TP4)",
            "2E(TP1)+1D(TP4) B=0 s=1",
            "2E(TP1)+1D(TP4) B=2 s=2",
            "2E B=1 s=1",
            "2E(TP1)+1D(TP4) B=2 s=1 x=3",
        ] {
            assert!(bad.parse::<Candidate>().is_err(), "{bad}");
        }
    }

    /// Counting against the node groups drops only shapes validation
    /// refuses: on `two-group.toml` (6 L40S + 8 H100, stages on named
    /// groups) the counted enumeration is every shape of its 14 GPUs that
    /// validates, in the same order (under a second in debug).
    #[test]
    fn counting_against_the_groups_keeps_every_allocation_that_validates() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/two-group.toml");
        let sc = Scenario::load(std::path::Path::new(path), &Overrides::default()).unwrap();
        let counted = feasible_allocations(&sc);
        let all: Vec<FeasibleAllocation> = allocation_shapes(sc.gpus, false, None, None)
            .into_iter()
            .filter_map(|a| assess_shape(&sc.raw, &sc.file, a))
            .map(|fa| FeasibleAllocation {
                groups: Some(["l40s", "h100", "h100"].map(String::from)),
                ..fa
            })
            .collect();
        assert!(!counted.is_empty());
        assert_eq!(counted, all);
        let fill = GroupFill::of(&sc.raw).unwrap();
        let shapes = allocation_shapes(sc.gpus, false, None, None);
        assert!(shapes.iter().filter(|a| fill.admits(a)).count() < shapes.len());
    }

    fn load(name: &str) -> Scenario {
        let path = format!("{}/../scenarios/{name}", env!("CARGO_MANIFEST_DIR"));
        Scenario::load(std::path::Path::new(&path), &Overrides::default()).unwrap()
    }

    /// One validation per [`ShapeClass`] and a placement check per shape
    /// give each shape the verdict a validation of its own gives: on
    /// `two-group.toml` (6 L40S + 8 H100), on all 8 stage assignments
    /// (where two stages share a group their counts vary over it), the
    /// same allocations with the same local workers and offload ranges, in
    /// the same order (a few seconds in release).
    #[test]
    fn one_validation_per_class_gives_every_shapes_verdict() {
        let sc = load("two-group.toml");
        let mut classes_shared = 0;
        for groups in stage_assignments(&sc.raw) {
            let mut raw = sc.raw.clone();
            raw.deployment.groups = Some(section_of(&groups));
            let fast = feasible_allocations_in(&raw, &sc.file, sc.gpus, false, None);
            let fill = GroupFill::of(&raw).unwrap();
            let used = u32::try_from(fill.gpus.iter().sum::<u64>()).unwrap();
            let shapes = allocation_shapes(used, false, None, Some(&fill));
            let slow: Vec<FeasibleAllocation> = shapes
                .iter()
                .filter_map(|a| assess_shape(&raw, &sc.file, *a))
                .map(|fa| FeasibleAllocation {
                    groups: Some(groups.clone()),
                    ..fa
                })
                .collect();
            assert_eq!(fast, slow, "{groups:?}");
            let mut seen = std::collections::HashSet::new();
            classes_shared += shapes
                .iter()
                .filter(|a| !seen.insert(ShapeClass::of(a)))
                .count();
        }
        // the classes do share shapes (else the check above tests nothing)
        assert!(classes_shared >= 10, "{classes_shared}");
    }

    /// `--all-groups` on a cluster of one node group, or of one node, is the
    /// search on the fixed groups by construction: the same space.
    #[test]
    fn all_groups_on_one_group_is_the_fixed_groups_search() {
        let objective = crate::Objective::Throughput;
        let one_node = load("image.toml");
        assert_eq!(
            search_space(&one_node, &objective, true),
            search_space(&one_node, &objective, false)
        );
        let two = load("two-group.toml");
        let mut raw = two.raw.clone();
        raw.cluster.groups.retain(|g| g.name == "h100");
        raw.apply(&Overrides {
            allocation: Some("2E(TP1)+1P(TP2)+1D(TP4)".into()),
            ..Default::default()
        });
        raw.deployment.groups = Some(section_of(&["h100", "h100", "h100"].map(String::from)));
        let one_group = Scenario::validate(raw, &two.file, "test").unwrap();
        assert_eq!(stage_assignments(&one_group.raw).len(), 1);
        let all = search_space(&one_group, &objective, true);
        assert!(!all.is_empty());
        assert_eq!(all, search_space(&one_group, &objective, false));
    }
}
