//! The cluster as node groups, and where each worker of a deployment runs in
//! it ([`Topology::placed`]).
//!
//! A cluster is a list of [`NodeGroup`]s: `nodes` nodes of `gpus_per_node`
//! GPUs each, of one GPU type. GPUs are numbered group by group, node by
//! node: GPU `k` of node `n` of group `g` is `base(g) + n · gpus_per_node + k`,
//! `base(g)` the GPUs of the groups before `g`. A worker's TP × EP group stays
//! within one node ([`Place`]); transfers between workers on different nodes
//! go over the two nodes' NICs, within a node over the intra-node link.
//!
//! Placement is first fit, stage by stage (encode, remote prefill, decode),
//! worker by worker: the first node of the stage's group (or, for a stage
//! with no group named, of the groups in order) with enough free GPUs takes
//! the worker's GPUs, lowest first. A cluster of one group of one node lays
//! workers out exactly as [`Topology::new`].

use crate::{Allocation, StagePool, Topology, WorkerRef};

/// One group of identical nodes (what `[[cluster.groups]]` describes; the
/// GPU type, links and cost live with the scenario, which prices them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeGroup {
    /// The group's name (`cluster.groups[].name`), in labels and errors.
    pub name: String,
    /// Nodes in the group, ≥ 1.
    pub nodes: u32,
    /// GPUs of each node, ≥ 1.
    pub gpus_per_node: u32,
}

impl NodeGroup {
    /// GPUs of the whole group.
    pub fn gpus(&self) -> u32 {
        self.nodes * self.gpus_per_node
    }
}

/// Where a worker runs: a node of a group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Place {
    /// The group's index in the cluster.
    pub group: u16,
    /// The node's index within its group.
    pub node: u32,
}

/// Why a deployment does not fit a cluster's groups.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// A worker's TP × EP GPUs exceed every node it may use.
    #[error("{stage} workers need {need} GPUs each (TP × EP) but a node of group `{group}` has {per_node}: TP stays within a node")]
    TpOverNode {
        /// `encode`, `prefill` or `decode`.
        stage: &'static str,
        /// GPUs one worker needs.
        need: u32,
        /// The group (the largest node it may use).
        group: String,
        /// GPUs per node there.
        per_node: u32,
    },
    /// The stage's workers do not all fit in the free GPUs of its groups.
    #[error("{stage} worker {index} ({need} GPUs) finds no node with {need} free GPUs in {groups} after the workers before it are placed")]
    NoRoom {
        /// `encode`, `prefill` or `decode`.
        stage: &'static str,
        /// The worker's index within its stage.
        index: usize,
        /// GPUs it needs.
        need: u32,
        /// The groups it may use, named.
        groups: String,
    },
    /// A local prefill worker's encode workers sit on different nodes.
    #[error("local prefill worker {label} would span two nodes (its TP stays within a node): its encode workers were placed on different nodes; use a local prefill TP that divides the encode workers of a node")]
    LocalAcrossNodes {
        /// The local worker's label (`L0`, …).
        label: String,
    },
}

/// Free GPUs per node while placing, with each group's first GPU number.
struct Free<'a> {
    groups: &'a [NodeGroup],
    base: Vec<u32>,
    /// `used[g][n]`: GPUs taken on node `n` of group `g`.
    used: Vec<Vec<u32>>,
    /// `full[g]`: the nodes of group `g` before it have no GPU free (a
    /// node once full stays full, so first fit starts its scan there).
    full: Vec<usize>,
}

impl<'a> Free<'a> {
    fn new(groups: &'a [NodeGroup]) -> Self {
        let base = groups
            .iter()
            .scan(0u32, |acc, g| {
                let b = *acc;
                *acc += g.gpus();
                Some(b)
            })
            .collect();
        let used = groups.iter().map(|g| vec![0; g.nodes as usize]).collect();
        let full = vec![0; groups.len()];
        Free {
            groups,
            base,
            used,
            full,
        }
    }

    /// The GPUs (numbers `first..first + need`) of the first node in
    /// `allowed` groups with `need` free.
    fn take(&mut self, allowed: &[usize], need: u32) -> Option<(Place, std::ops::Range<u32>)> {
        for &g in allowed {
            let per = self.groups[g].gpus_per_node;
            if need > per {
                continue;
            }
            let from = self.full[g];
            for (n, used) in self.used[g].iter_mut().enumerate().skip(from) {
                if per - *used >= need {
                    let first = self.base[g] + n as u32 * per + *used;
                    *used += need;
                    let place = Place {
                        group: g as u16,
                        node: n as u32,
                    };
                    let nodes = &self.used[g];
                    let full = &mut self.full[g];
                    while *full < nodes.len() && nodes[*full] >= per {
                        *full += 1;
                    }
                    return Some((place, first..first + need));
                }
            }
        }
        None
    }
}

impl Topology {
    /// The layout of `alloc` on the cluster `groups` (module doc):
    /// `stage_groups[s]` names the group of stage `s` (encode, prefill,
    /// decode), `None` for the groups in order. Local prefill workers (of TP
    /// `local_tp`) run on their encode workers' GPUs as in [`Topology::new`].
    ///
    /// # Errors
    /// A worker wider than every node it may use
    /// ([`PlacementError::TpOverNode`]); a worker no node has room for
    /// ([`PlacementError::NoRoom`]).
    pub fn placed(
        alloc: &Allocation,
        local_tp: Option<u32>,
        groups: &[NodeGroup],
        stage_groups: [Option<usize>; 3],
    ) -> Result<Topology, PlacementError> {
        let mut t = Topology::new(alloc, local_tp);
        first_fit(alloc, groups, stage_groups, &mut |w, place, gpus| {
            t.set_place(w, place, gpus)
        })?;
        t.place_locals()
            .map_err(|label| PlacementError::LocalAcrossNodes { label })?;
        t.gpus = groups.iter().map(NodeGroup::gpus).sum();
        Ok(t)
    }

    /// Whether every encode, remote prefill and decode worker of `alloc`
    /// finds its GPUs on a node of `groups` by the first fit of
    /// [`Topology::placed`], without building the layout: for checking many
    /// worker counts of one layout (a search's enumeration). The workers of
    /// one stage all need the same GPUs, so first fit gives each node in
    /// turn (of the stage's groups, in order) as many as its free GPUs hold
    /// until none is left: one step per node, not per worker (the same
    /// answer as the per-worker scan; tested in
    /// `first_fit_fills_earlier_holes_and_fits_nodes_agrees_with_placed`).
    /// Local prefill workers are not checked: where they fit depends on the
    /// encode workers alone, which are placed first.
    ///
    /// # Errors
    /// As [`Topology::placed`]: [`PlacementError::TpOverNode`] or
    /// [`PlacementError::NoRoom`] (the same stage, worker index and groups).
    pub fn fits_nodes(
        alloc: &Allocation,
        groups: &[NodeGroup],
        stage_groups: [Option<usize>; 3],
    ) -> Result<(), PlacementError> {
        let mut used: Vec<Vec<u32>> = groups.iter().map(|g| vec![0; g.nodes as usize]).collect();
        let all: Vec<usize> = (0..groups.len()).collect();
        for (_, pool, stage, allowed) in stage_pools(alloc, &stage_groups, &all) {
            check_width(&pool, stage, groups, allowed)?;
            let need = pool.gpus_per_worker();
            let mut left = pool.workers;
            if need == 0 && allowed.iter().any(|&g| groups[g].nodes > 0) {
                left = 0; // a worker of no GPUs fits the first node
            }
            for &g in allowed {
                let per = groups[g].gpus_per_node;
                if left == 0 || need == 0 || need > per {
                    continue;
                }
                for u in used[g].iter_mut() {
                    let here = ((per - *u) / need).min(left);
                    *u += here * need;
                    left -= here;
                    if left == 0 {
                        break;
                    }
                }
            }
            if left > 0 && need > 0 {
                let index = (pool.workers - left) as usize;
                return Err(no_room(stage, index, need, groups, allowed));
            }
        }
        Ok(())
    }
}

/// The first fit of the module doc: every worker of `alloc`, stage by
/// stage, handed to `put` with its node and GPUs.
fn first_fit(
    alloc: &Allocation,
    groups: &[NodeGroup],
    stage_groups: [Option<usize>; 3],
    put: &mut dyn FnMut(WorkerRef, Place, std::ops::Range<u32>),
) -> Result<(), PlacementError> {
    let mut free = Free::new(groups);
    let all: Vec<usize> = (0..groups.len()).collect();
    for (s, pool, stage, allowed) in stage_pools(alloc, &stage_groups, &all) {
        check_width(&pool, stage, groups, allowed)?;
        for i in 0..pool.workers as usize {
            let need = pool.gpus_per_worker();
            let (place, gpus) = (free.take(allowed, need))
                .ok_or_else(|| no_room(stage, i, need, groups, allowed))?;
            let w = match s {
                0 => WorkerRef::Encode(i),
                1 => WorkerRef::Prefill(i),
                _ => WorkerRef::Decode(i),
            };
            put(w, place, gpus);
        }
    }
    Ok(())
}

/// Each stage of `alloc` in placement order (encode, prefill, decode): its
/// index, pool, name and the groups it may use (the one `stage_groups`
/// names, else `all`), borrowed rather than built per stage, as the search
/// places a million shapes.
fn stage_pools<'a>(
    alloc: &Allocation,
    stage_groups: &'a [Option<usize>; 3],
    all: &'a [usize],
) -> impl Iterator<Item = (usize, StagePool, &'static str, &'a [usize])> + 'a {
    let pools = [alloc.encode, alloc.prefill, alloc.decode];
    (pools.into_iter().zip(["encode", "prefill", "decode"]))
        .zip(stage_groups)
        .enumerate()
        .map(move |(s, ((pool, stage), g))| {
            let allowed = g.as_ref().map_or(all, std::slice::from_ref);
            (s, pool, stage, allowed)
        })
}

/// [`PlacementError::NoRoom`] for worker `index` of `stage`, which needs
/// `need` GPUs of one node in the `allowed` groups.
fn no_room(
    stage: &'static str,
    index: usize,
    need: u32,
    groups: &[NodeGroup],
    allowed: &[usize],
) -> PlacementError {
    let names: Vec<String> = (allowed.iter())
        .map(|&g| format!("group `{}`", groups[g].name))
        .collect();
    PlacementError::NoRoom {
        stage,
        index,
        need,
        groups: names.join(", "),
    }
}

/// A stage's worker must fit one node of a group it may use.
fn check_width(
    pool: &StagePool,
    stage: &'static str,
    groups: &[NodeGroup],
    allowed: &[usize],
) -> Result<(), PlacementError> {
    let need = pool.gpus_per_worker();
    let widest = allowed
        .iter()
        .max_by_key(|&&g| groups[g].gpus_per_node)
        .copied();
    match widest {
        Some(g) if pool.workers > 0 && need > groups[g].gpus_per_node => {
            Err(PlacementError::TpOverNode {
                stage,
                need,
                group: groups[g].name.clone(),
                per_node: groups[g].gpus_per_node,
            })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(name: &str, nodes: u32, per: u32) -> NodeGroup {
        NodeGroup {
            name: name.into(),
            nodes,
            gpus_per_node: per,
        }
    }

    /// First fit fills a hole an earlier node kept (its scan starts at the
    /// first node with a GPU free, not at the last one used), and
    /// `fits_nodes` answers as `placed` on every shape of a small cluster.
    #[test]
    fn first_fit_fills_earlier_holes_and_fits_nodes_agrees_with_placed() {
        let eight = [group("eight", 2, 8)];
        let a: Allocation = "1E(TP1)+2P(TP4)+1D(TP2)".parse().unwrap();
        let t = Topology::placed(&a, None, &eight, [Some(0); 3]).unwrap();
        // E0 and P0 on node 0 (5 GPUs), P1 on node 1; D0 in node 0's 3 free
        assert_eq!(t.prefill()[1].place, Place { group: 0, node: 1 });
        assert_eq!(t.decode()[0].place, Place { group: 0, node: 0 });
        assert_eq!(t.decode()[0].gpus, vec![5, 6]);
        assert!(Topology::fits_nodes(&a, &eight, [Some(0); 3]).is_ok());
        let over: Allocation = "1E(TP1)+2P(TP4)+4D(TP2)".parse().unwrap();
        assert!(Topology::fits_nodes(&over, &eight, [Some(0); 3]).is_err());
        let groups = [group("six", 2, 6)];
        let mut agree = (0, 0);
        for e in 1..=4 {
            for p in 0..=3 {
                for d in 1..=3 {
                    for tp in [1, 2, 4] {
                        let a = Allocation::new((e, 1), (p, tp), (d, 2));
                        let placed = Topology::placed(&a, None, &groups, [Some(0); 3]).is_ok();
                        let fits = Topology::fits_nodes(&a, &groups, [Some(0); 3]).is_ok();
                        assert_eq!(placed, fits, "{a}");
                        agree.0 += usize::from(placed);
                        agree.1 += usize::from(!placed);
                    }
                }
            }
        }
        assert!(agree.0 > 10 && agree.1 > 10, "{agree:?}");
        // one step per node gives the per-worker scan's answer, its error
        // included, on two groups with stages on either or on both
        let two = [group("four", 3, 4), group("eight", 2, 8)];
        let mut outcomes = (0, 0);
        for stages in [[Some(0), Some(1), Some(1)], [Some(1); 3], [None; 3]] {
            for e in 1..=9 {
                for p in 0..=5 {
                    for d in 0..=4 {
                        for (tp_p, tp_d) in [(1, 2), (2, 4), (4, 8), (8, 1)] {
                            let a = Allocation::new((e, 1), (p, tp_p), (d, tp_d));
                            let per_worker = first_fit(&a, &two, stages, &mut |_, _, _| {});
                            assert_eq!(Topology::fits_nodes(&a, &two, stages), per_worker, "{a}");
                            outcomes.0 += usize::from(per_worker.is_ok());
                            outcomes.1 += usize::from(per_worker.is_err());
                        }
                    }
                }
            }
        }
        assert!(outcomes.0 > 100 && outcomes.1 > 100, "{outcomes:?}");
    }

    #[test]
    fn one_node_lays_out_as_new() {
        let a: Allocation = "2E(TP1)+1P(TP2)+1D(TP4)".parse().unwrap();
        let t = Topology::placed(&a, Some(1), &[group("all", 1, 8)], [None; 3]).unwrap();
        let mut want = Topology::new(&a, Some(1));
        want.gpus = 8;
        assert_eq!(t, want);
    }

    #[test]
    fn tp_stays_within_a_node_and_stages_use_their_group() {
        let a: Allocation = "4E(TP1)+2P(TP4)+1D(TP8)".parse().unwrap();
        let groups = [group("l40s", 1, 4), group("h100", 2, 8)];
        let t = Topology::placed(&a, None, &groups, [Some(0), Some(1), Some(1)]).unwrap();
        for w in t.encode() {
            assert_eq!(w.place.group, 0);
        }
        // P0, P1 fill node 0 of h100 (GPUs 4..12); D0 takes node 1 (12..20)
        assert_eq!(t.prefill()[0].gpus, vec![4, 5, 6, 7]);
        assert_eq!(t.prefill()[1].gpus, vec![8, 9, 10, 11]);
        assert_eq!(t.prefill()[1].place, Place { group: 1, node: 0 });
        assert_eq!(t.decode()[0].gpus, (12..20).collect::<Vec<_>>());
        assert_eq!(t.decode()[0].place, Place { group: 1, node: 1 });
        assert_eq!(t.gpus(), 20);
    }

    #[test]
    fn a_worker_wider_than_a_node_or_without_room_is_refused() {
        let a: Allocation = "1E(TP1)+1P(TP1)+1D(TP8)".parse().unwrap();
        let groups = [group("small", 2, 4)];
        let e = Topology::placed(&a, None, &groups, [None; 3]).unwrap_err();
        assert!(
            matches!(e, PlacementError::TpOverNode { need: 8, .. }),
            "{e}"
        );
        let a: Allocation = "1E(TP1)+1P(TP1)+2D(TP4)".parse().unwrap();
        let e = Topology::placed(&a, None, &groups, [None; 3]).unwrap_err();
        assert!(
            matches!(
                e,
                PlacementError::NoRoom {
                    stage: "decode",
                    index: 1,
                    ..
                }
            ),
            "{e}"
        );
    }
}
