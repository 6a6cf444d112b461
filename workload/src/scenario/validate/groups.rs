//! `[[cluster.groups]]` and `[deployment.groups]`: node groups (nodes, GPUs
//! per node, GPU type, intra-node link, NIC, cost) and the group each stage
//! runs on; then the deployment placed on them
//! ([`easerve_sched::Topology::placed`]).

use super::cluster::{check_gpu, check_link, LinkError};
use super::{preset_or_file, V};
use crate::scenario::{num, Cluster, Group, GroupSection, LinkChoice, ScenarioError, ScenarioFile};
use easerve_calib::{GpuSpec, LinkSpec};
use easerve_sched::{Allocation, NodeGroup, Topology};
use std::path::Path;

/// Most nodes in one group, and most GPUs in one node.
const MAX_NODES: i64 = 4096;
const MAX_GPUS_PER_NODE: i64 = 72;

/// The groups of `raw.cluster.groups`, validated, or an empty list for the
/// one-node form. `cluster.gpu`, `cluster.gpu_file` and `cluster.link` must
/// be absent beside groups; `cluster.gpus`, when given, must be their total.
pub(super) fn groups_section(
    raw: &ScenarioFile,
    v: &V<'_>,
    dir: &Path,
) -> Result<Vec<Group>, ScenarioError> {
    let c = &raw.cluster;
    if c.groups.is_empty() {
        return Ok(Vec::new());
    }
    for (given, field) in [
        (c.gpu.is_some(), "cluster.gpu"),
        (c.gpu_file.is_some(), "cluster.gpu_file"),
        (c.link.is_some(), "cluster.link"),
    ] {
        if given {
            return Err(v.err(
                field,
                "give the GPU and link of each node group (`[[cluster.groups]]`) instead, not beside them",
            ));
        }
    }
    let mut out: Vec<Group> = Vec::with_capacity(c.groups.len());
    for (i, g) in c.groups.iter().enumerate() {
        if g.name.trim().is_empty() || out.iter().any(|o| o.node.name == g.name) {
            return Err(v.err(
                &format!("cluster.groups[{i}].name"),
                "must be non-empty and unique among the groups",
            ));
        }
        out.push(group_of(v, dir, i, g)?);
    }
    let total: u32 = out.iter().map(|g| g.node.gpus()).sum();
    if c.gpus != 0 && c.gpus != i64::from(total) {
        return Err(v.err(
            "cluster.gpus",
            format!(
                "{} but the groups hold {total} GPUs: leave `cluster.gpus` out beside `[[cluster.groups]]`, or give their total",
                c.gpus
            ),
        ));
    }
    let costed = out.iter().filter(|g| g.cost_per_gpu_hour.is_some()).count();
    if costed != 0 && costed != out.len() {
        let missing = out
            .iter()
            .position(|g| g.cost_per_gpu_hour.is_none())
            .unwrap_or(0);
        return Err(v.err(
            &format!("cluster.groups[{missing}].cost_per_gpu_hour"),
            "missing while other groups give one: a cost objective (goodput per dollar, the cheapest mix) needs a cost on every group; give all or none",
        ));
    }
    Ok(out)
}

/// Group `i` of `[[cluster.groups]]`, validated (its name is checked by
/// the caller, against the others).
fn group_of(v: &V<'_>, dir: &Path, i: usize, g: &GroupSection) -> Result<Group, ScenarioError> {
    let f = |name: &str| format!("cluster.groups[{i}].{name}");
    let nodes = v.int(&f("nodes"), g.nodes, 1, MAX_NODES)? as u32;
    let per = v.int(&f("gpus_per_node"), g.gpus_per_node, 1, MAX_GPUS_PER_NODE)? as u32;
    let mut gpu: GpuSpec = preset_or_file(
        v,
        dir,
        (&f("gpu"), &f("gpu"), &f("gpu_file")),
        (g.gpu.as_deref(), g.gpu_file.as_deref()),
        ("GPU", GpuSpec::preset, GpuSpec::preset_names()),
        check_gpu,
    )?;
    if let Some(link) = &g.link {
        gpu.link = link_of(v, &f("link"), link)?;
    }
    let nic = LinkSpec {
        name: format!("{} NIC", g.name),
        bandwidth_gbs: g.nic_bandwidth_gbs,
        latency_s: g.nic_latency_s,
    };
    check_link(&nic).map_err(|e| match e {
        LinkError::Bandwidth(b) => v.err(
            &f("nic_bandwidth_gbs"),
            format!(
                "{} GB/s: a NIC's bandwidth must be > 0 and finite (allowed [{}, 1e5] GB/s per direction)",
                num(b),
                super::HARDWARE_MIN
            ),
        ),
        e => v.err(&f("nic_latency_s"), e),
    })?;
    if let Some(cost) = g.cost_per_gpu_hour {
        v.real(&f("cost_per_gpu_hour"), cost, 0.0, 1e4, true)?;
    }
    Ok(Group {
        node: NodeGroup {
            name: g.name.clone(),
            nodes,
            gpus_per_node: per,
        },
        gpu,
        nic,
        cost_per_gpu_hour: g.cost_per_gpu_hour,
    })
}

/// A link preset or an inline link at `field`.
pub(super) fn link_of(
    v: &V<'_>,
    field: &str,
    link: &LinkChoice,
) -> Result<LinkSpec, ScenarioError> {
    match link {
        LinkChoice::Preset(name) => LinkSpec::preset(name).ok_or_else(|| {
            v.err(
                field,
                format!(
                    "unknown link `{name}`; allowed: {}, or a table {{ name, bandwidth_gbs, latency_s }}",
                    LinkSpec::preset_names().join(", ")
                ),
            )
        }),
        LinkChoice::Inline(l) => {
            check_link(l).map_err(|e| v.err(&format!("{field}.{}", e.field()), e))?;
            Ok(l.clone())
        }
    }
}

/// The group of each stage (encode, prefill, decode): `[deployment.groups]`,
/// or the only group. With several groups every stage with workers must
/// name its group, so its GPU type (and cost) is known.
pub(super) fn stage_groups(
    raw: &ScenarioFile,
    v: &V<'_>,
    groups: &[Group],
    alloc: &Allocation,
) -> Result<[usize; 3], ScenarioError> {
    let named = raw.deployment.groups.clone().unwrap_or_default();
    if groups.is_empty() {
        return match raw.deployment.groups {
            Some(_) => Err(v.err(
                "deployment.groups",
                "names node groups, but the cluster has none (`[[cluster.groups]]`)",
            )),
            None => Ok([0; 3]),
        };
    }
    let mut out = [0usize; 3];
    let stages = [
        ("encode", named.encode, alloc.encode.workers),
        ("prefill", named.prefill, alloc.prefill.workers),
        ("decode", named.decode, alloc.decode.workers),
    ];
    for (s, (stage, name, workers)) in stages.into_iter().enumerate() {
        let field = format!("deployment.groups.{stage}");
        out[s] = match name {
            Some(n) => groups.iter().position(|g| g.node.name == n).ok_or_else(|| {
                let names: Vec<&str> = groups.iter().map(|g| g.node.name.as_str()).collect();
                v.err(&field, format!("unknown group `{n}`; allowed: {}", names.join(", ")))
            })?,
            None if groups.len() == 1 || workers == 0 => 0,
            None => {
                return Err(v.err(
                    &field,
                    "missing: with several node groups, name the group of each stage's workers (its GPU type prices them)",
                ))
            }
        };
    }
    Ok(out)
}

/// The deployment placed on the groups (TP within a node, first fit within
/// each stage's group).
pub(super) fn place(
    v: &V<'_>,
    groups: Vec<Group>,
    stage_groups: [usize; 3],
    alloc: &Allocation,
    local_tp: Option<u32>,
) -> Result<Cluster, ScenarioError> {
    let nodes: Vec<NodeGroup> = groups.iter().map(|g| g.node.clone()).collect();
    let topology =
        Topology::placed(alloc, local_tp, &nodes, stage_groups.map(Some)).map_err(|e| {
            v.err(
                "deployment.allocation",
                format!("does not fit the node groups: {e}"),
            )
        })?;
    Ok(Cluster {
        groups,
        stage_groups,
        topology,
    })
}

/// Node groups run the EPD systems without a planner (the aggregated
/// system's replicas and a planner's spare slots are laid out on one node).
pub(super) fn check_system(
    raw: &ScenarioFile,
    v: &V<'_>,
    system: crate::scenario::System,
) -> Result<(), ScenarioError> {
    if system == crate::scenario::System::Aggregated {
        return Err(v.err(
            "deployment.system",
            "`aggregated` is laid out on one node; with `[[cluster.groups]]` use an EPD system (easerve, passthrough, epd-serve, hydrainfer)",
        ));
    }
    if raw.planner.is_some() {
        return Err(v.err(
            "planner",
            "a planner's spare slots are laid out on one node; remove `[planner]` or `[[cluster.groups]]`",
        ));
    }
    Ok(())
}
