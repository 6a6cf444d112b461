//! Where every worker of a deployment runs: its GPUs, its label and, for local
//! prefill, the encode workers whose GPUs it shares. Built once from the
//! allocation; the controller, the simulator, the executor and the report all
//! read it, so none of them lays out GPUs or parses labels.
//!
//! Layout (the one every part of easerve uses): GPUs are numbered from 0, encode
//! workers first (`E0` on GPUs `0..tp_E`, `E1` next, …), then the remote prefill
//! workers (`P0`, …), then the decode workers (`D0`, …). Local prefill workers
//! (`L0`, …) take no GPU of their own: `L{g}` runs on the first GPU of each of
//! the `local_tp` encode workers `g·local_tp .. (g+1)·local_tp`. Prefill workers
//! are indexed remote first, then local, as [`WorkerRef::Prefill`] says.
//!
//! The aggregated system has none of these: its [`Topology::replicas`] are
//! `R0`, `R1`, … on consecutive groups of TP GPUs, each running every stage.

use crate::{Allocation, WorkerRef};

/// One worker of the deployment: what it is and where it runs. (The
/// controller keeps each worker's scheduling state, the simulator its
/// hardware state, the executor its process.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Worker {
    /// The worker, as the controller names it.
    pub wref: WorkerRef,
    /// Its label in reports and traces: `E0`, `P0`, `L0`, `D0`, `R0`.
    pub label: String,
    /// The GPUs it runs on (its TP group, or its `tp · ep` GPUs), in the
    /// cluster's numbering.
    pub gpus: Vec<u32>,
    /// Tensor-parallel degree of each attention replica (`gpus.len() / ep`).
    pub tp: u32,
    /// Expert-parallel degree (attention replicas), 1 without EP.
    pub ep: u32,
    /// A prefill worker co-located on encode GPUs.
    pub local: bool,
    /// For a local prefill worker: the encode workers it shares GPUs with.
    pub encode_workers: Vec<usize>,
    /// For an encode worker: the local prefill worker on its GPU, if any.
    pub local_prefill: Option<usize>,
    /// A spare slot a planner may start ([`Topology::with_spares`]): it
    /// takes no work and holds no GPU until then.
    pub standby: bool,
    /// The group and node it runs on ([`Topology::placed`]); group 0, node 0
    /// in a cluster of one node.
    pub place: crate::cluster::Place,
}

impl Worker {
    /// The first GPU of its TP group.
    pub fn gpu(&self) -> u32 {
        self.gpus[0]
    }
}

/// The workers of one deployment and the GPUs they run on (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    pub(crate) encode: Vec<Worker>,
    /// Remote first, then local.
    prefill: Vec<Worker>,
    decode: Vec<Worker>,
    /// Aggregated replicas (only in the aggregated system's layout).
    replica: Vec<Worker>,
    remote: usize,
    pub(crate) gpus: u32,
}

fn worker(wref: WorkerRef, label: String, gpus: Vec<u32>, ep: u32) -> Worker {
    Worker {
        wref,
        label,
        tp: gpus.len() as u32 / ep,
        ep,
        gpus,
        local: false,
        encode_workers: Vec::new(),
        local_prefill: None,
        standby: false,
        place: crate::cluster::Place::default(),
    }
}

impl Topology {
    /// The layout of `alloc`, with one local prefill worker of TP `local_tp` per
    /// group of `local_tp` encode workers when `local_tp` is given (encode workers
    /// beyond the last whole group get none).
    pub fn new(alloc: &Allocation, local_tp: Option<u32>) -> Topology {
        let mut next = 0u32;
        let mut take = |n: u32| -> Vec<u32> {
            let g: Vec<u32> = (next..next + n).collect();
            next += n;
            g
        };
        let mut encode: Vec<Worker> = (0..alloc.encode.workers as usize)
            .map(|i| {
                let gpus = take(alloc.encode.gpus_per_worker());
                worker(WorkerRef::Encode(i), label('E', i), gpus, alloc.encode.ep)
            })
            .collect();
        let mut prefill: Vec<Worker> = (0..alloc.prefill.workers as usize)
            .map(|i| {
                let gpus = take(alloc.prefill.gpus_per_worker());
                worker(WorkerRef::Prefill(i), label('P', i), gpus, alloc.prefill.ep)
            })
            .collect();
        let decode = (0..alloc.decode.workers as usize)
            .map(|i| {
                let gpus = take(alloc.decode.gpus_per_worker());
                worker(WorkerRef::Decode(i), label('D', i), gpus, alloc.decode.ep)
            })
            .collect();
        let remote = prefill.len();
        if let Some(tp) = local_tp.filter(|t| *t > 0) {
            let tp = tp as usize;
            for g in 0..encode.len() / tp {
                let members: Vec<usize> = (g * tp..(g + 1) * tp).collect();
                let p = prefill.len();
                for &m in &members {
                    encode[m].local_prefill = Some(p);
                }
                let mut w = worker(
                    WorkerRef::Prefill(p),
                    label('L', g),
                    members.iter().map(|&m| encode[m].gpu()).collect(),
                    1,
                );
                w.local = true;
                w.encode_workers = members;
                prefill.push(w);
            }
        }
        Topology {
            encode,
            prefill,
            decode,
            replica: Vec::new(),
            remote,
            gpus: next,
        }
    }

    /// The layout of `alloc` ([`Topology::new`]) with `spares` more slots of
    /// each stage (encode, remote prefill, decode; each of the stage's TP and
    /// EP) standing by for a planner to start. Spares follow the stage's
    /// workers in its index (remote prefill spares before the local prefill
    /// workers, which keep their groups over the deployment's own encode
    /// workers) and get GPU numbers after every GPU of the deployment, in
    /// stage order, so `gpus()` stays the deployment's count: a spare's GPU
    /// numbers name its slot, and a planner keeps the GPUs in use within the
    /// cluster. Labels go on (`E2`, `P1`, `D1`, …).
    pub fn with_spares(alloc: &Allocation, local_tp: Option<u32>, spares: [u32; 3]) -> Topology {
        let mut t = Topology::new(alloc, local_tp);
        if spares == [0; 3] {
            return t;
        }
        let mut next = t.gpus;
        let mut take = |n: u32| -> Vec<u32> {
            let g: Vec<u32> = (next..next + n).collect();
            next += n;
            g
        };
        let spare = |wref: WorkerRef, label: String, gpus: Vec<u32>, ep: u32| Worker {
            standby: true,
            ..worker(wref, label, gpus, ep)
        };
        let base = t.encode.len();
        for k in 0..spares[0] as usize {
            let i = base + k;
            let gpus = take(alloc.encode.gpus_per_worker());
            t.encode.push(spare(
                WorkerRef::Encode(i),
                label('E', i),
                gpus,
                alloc.encode.ep,
            ));
        }
        let extra = spares[1] as usize;
        let mut remote: Vec<Worker> = t.prefill.drain(..t.remote).collect();
        for k in 0..extra {
            let i = t.remote + k;
            let gpus = take(alloc.prefill.gpus_per_worker());
            remote.push(spare(
                WorkerRef::Prefill(i),
                label('P', i),
                gpus,
                alloc.prefill.ep,
            ));
        }
        // local prefill workers move up by the spares' count
        let locals = std::mem::take(&mut t.prefill);
        for mut w in locals {
            let WorkerRef::Prefill(p) = w.wref else {
                unreachable!()
            };
            w.wref = WorkerRef::Prefill(p + extra);
            for &e in &w.encode_workers {
                t.encode[e].local_prefill = Some(p + extra);
            }
            remote.push(w);
        }
        t.prefill = remote;
        t.remote += extra;
        let base = t.decode.len();
        for k in 0..spares[2] as usize {
            let i = base + k;
            let gpus = take(alloc.decode.gpus_per_worker());
            t.decode.push(spare(
                WorkerRef::Decode(i),
                label('D', i),
                gpus,
                alloc.decode.ep,
            ));
        }
        t
    }

    /// The aggregated system's layout: `replicas` engines of `tp` GPUs each,
    /// `R{r}` on GPUs `r·tp .. (r+1)·tp`, with no encode, prefill or decode
    /// workers.
    pub fn replicas(replicas: u32, tp: u32) -> Topology {
        let replica = (0..replicas)
            .map(|r| {
                let gpus = (r * tp..(r + 1) * tp).collect();
                worker(WorkerRef::Replica(r as usize), format!("R{r}"), gpus, 1)
            })
            .collect();
        Topology {
            encode: Vec::new(),
            prefill: Vec::new(),
            decode: Vec::new(),
            replica,
            remote: 0,
            gpus: replicas * tp,
        }
    }

    /// Encode workers, by index.
    pub fn encode(&self) -> &[Worker] {
        &self.encode
    }

    /// Prefill workers, remote first, then local.
    pub fn prefill(&self) -> &[Worker] {
        &self.prefill
    }

    /// Decode workers, by index.
    pub fn decode(&self) -> &[Worker] {
        &self.decode
    }

    /// Aggregated replicas, by index (empty outside the aggregated system).
    pub fn replica(&self) -> &[Worker] {
        &self.replica
    }

    /// Number of remote prefill workers (the index of the first local one).
    pub fn remote_prefill(&self) -> usize {
        self.remote
    }

    /// GPUs the deployment occupies (local prefill adds none).
    pub fn gpus(&self) -> u32 {
        self.gpus
    }

    /// Every worker: encode, prefill (remote, then local), decode, replicas.
    pub fn workers(&self) -> impl Iterator<Item = &Worker> {
        self.encode
            .iter()
            .chain(&self.prefill)
            .chain(&self.decode)
            .chain(&self.replica)
    }

    /// The worker `w`.
    ///
    /// # Panics
    /// When `w` is not a worker of this deployment.
    pub fn worker(&self, w: WorkerRef) -> &Worker {
        match w {
            WorkerRef::Encode(i) => &self.encode[i],
            WorkerRef::Prefill(i) => &self.prefill[i],
            WorkerRef::Decode(i) => &self.decode[i],
            WorkerRef::Replica(i) => &self.replica[i],
        }
    }

    /// Put worker `w` on `gpus` of node `place` ([`Topology::placed`]).
    pub(crate) fn set_place(
        &mut self,
        w: WorkerRef,
        place: crate::cluster::Place,
        gpus: impl Iterator<Item = u32>,
    ) {
        let worker = match w {
            WorkerRef::Encode(i) => &mut self.encode[i],
            WorkerRef::Prefill(i) => &mut self.prefill[i],
            WorkerRef::Decode(i) => &mut self.decode[i],
            WorkerRef::Replica(i) => &mut self.replica[i],
        };
        worker.place = place;
        // in place: a worker keeps its number of GPUs, so its vector's room
        worker.gpus.clear();
        worker.gpus.extend(gpus);
    }

    /// Local prefill workers follow their encode workers: their first GPUs
    /// and the first one's node. A member on another node is `Err` with the
    /// local worker's label (its TP would span two nodes).
    pub(crate) fn place_locals(&mut self) -> Result<(), String> {
        for w in &mut self.prefill[self.remote..] {
            let members: Vec<&Worker> = w.encode_workers.iter().map(|&e| &self.encode[e]).collect();
            w.gpus = members.iter().map(|m| m.gpu()).collect();
            w.place = members.first().map_or(w.place, |m| m.place);
            if members.iter().any(|m| m.place != w.place) {
                return Err(w.label.clone());
            }
        }
        Ok(())
    }

    /// Whether workers `a` and `b` run on the same node (a transfer between
    /// them stays on the intra-node link).
    pub fn same_node(&self, a: WorkerRef, b: WorkerRef) -> bool {
        self.worker(a).place == self.worker(b).place
    }

    /// The label of worker `w` (`E0`, `P0`, `L0`, `D0`, `R0`).
    pub fn label(&self, w: WorkerRef) -> &str {
        &self.worker(w).label
    }

    /// The workers GPU `g` runs, as the report's GPU table counts them: the
    /// encode worker whose TP group holds it and that worker's local prefill
    /// worker, or the remote prefill, decode or replica worker whose group
    /// holds it; empty for a GPU the deployment leaves idle.
    pub fn on_gpu(&self, g: u32) -> Vec<WorkerRef> {
        if let Some(e) = self.encode.iter().find(|w| w.gpus.contains(&g)) {
            let mut on = vec![e.wref];
            on.extend(e.local_prefill.map(WorkerRef::Prefill));
            return on;
        }
        self.prefill[..self.remote]
            .iter()
            .chain(&self.decode)
            .chain(&self.replica)
            .find(|w| w.gpus.contains(&g))
            .map(|w| vec![w.wref])
            .unwrap_or_default()
    }

    /// Who owns GPU `g`, as the report's GPU table names it: the stage
    /// (`encode`, `prefill`, `decode`, `aggregated`) and the labels of [`Topology::on_gpu`]
    /// joined by `+` (`E0+L0` for an encode GPU shared with a local prefill
    /// worker); `None` for a GPU the deployment leaves idle.
    pub fn gpu_owner(&self, g: u32) -> Option<(&'static str, String)> {
        let on = self.on_gpu(g);
        let stage = match on.first()? {
            WorkerRef::Encode(_) => "encode",
            WorkerRef::Prefill(_) => "prefill",
            WorkerRef::Decode(_) => "decode",
            WorkerRef::Replica(_) => "aggregated",
        };
        let labels: Vec<&str> = on.iter().map(|w| self.label(*w)).collect();
        Some((stage, labels.join("+")))
    }
}

/// A worker's label, `prefix` then `index` in decimal (`E0`, `P12`): what
/// `format!("{prefix}{index}")` gives, without the formatting machinery (a
/// search validates thousands of topologies of about 1,000 workers each,
/// where formatting the labels took a quarter of its time).
fn label(prefix: char, index: usize) -> String {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = index;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let mut s = String::with_capacity(1 + digits.len() - at);
    s.push(prefix);
    s.extend(digits[at..].iter().map(|&d| char::from(d)));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_the_prefix_and_the_index_in_decimal() {
        for i in [0, 1, 9, 10, 99, 100, 1023, 4096, 65_535, usize::MAX] {
            assert_eq!(label('E', i), format!("E{i}"));
            assert_eq!(label('L', i), format!("L{i}"));
        }
    }

    #[test]
    fn spare_slots_follow_each_stage_and_keep_the_local_groups() {
        let a: Allocation = "2E(TP1)+1P(TP2)+1D(TP4)".parse().unwrap();
        let t = Topology::with_spares(&a, Some(1), [1, 2, 1]);
        assert_eq!(t, Topology::with_spares(&a, Some(1), [1, 2, 1]));
        assert_eq!(t.gpus(), 8, "the deployment's GPUs");
        assert_eq!(t.encode().len(), 3);
        assert!(t.encode()[2].standby && t.encode()[2].local_prefill.is_none());
        assert_eq!(t.encode()[2].gpus, vec![8]);
        // remote prefill: P0, then the spares P1 and P2; the local workers after
        assert_eq!(t.remote_prefill(), 3);
        assert_eq!(t.prefill()[1].gpus, vec![9, 10]);
        assert_eq!(t.prefill()[3].label, "L0");
        assert_eq!(t.prefill()[3].wref, WorkerRef::Prefill(3));
        assert_eq!(t.encode()[0].local_prefill, Some(3));
        assert_eq!(t.decode()[1].gpus, vec![13, 14, 15, 16]);
        assert_eq!(t.decode()[1].label, "D1");
        assert_eq!(
            Topology::with_spares(&a, Some(1), [0; 3]),
            Topology::new(&a, Some(1))
        );
    }

    #[test]
    fn gpus_are_laid_out_encode_then_prefill_then_decode() {
        let a: Allocation = "2E(TP1)+1P(TP2)+1D(TP4)".parse().unwrap();
        let t = Topology::new(&a, Some(1));
        assert_eq!(t.gpus(), 8);
        assert_eq!(t.encode()[1].gpus, vec![1]);
        assert_eq!(t.prefill()[0].gpus, vec![2, 3]);
        assert_eq!(t.decode()[0].gpus, vec![4, 5, 6, 7]);
        // one local prefill worker per encode worker, on its GPU
        assert_eq!(t.remote_prefill(), 1);
        let l1 = &t.prefill()[2];
        assert!(l1.local && l1.label == "L1" && l1.gpus == vec![1]);
        assert_eq!(l1.encode_workers, vec![1]);
        assert_eq!(t.encode()[1].local_prefill, Some(2));
        assert_eq!(t.gpu_owner(1), Some(("encode", "E1+L1".into())));
        assert_eq!(t.gpu_owner(3), Some(("prefill", "P0".into())));
        assert_eq!(t.gpu_owner(7), Some(("decode", "D0".into())));
        assert_eq!(t.gpu_owner(8), None);
        assert_eq!(
            t.on_gpu(0),
            vec![WorkerRef::Encode(0), WorkerRef::Prefill(1)]
        );
        let labels: Vec<&str> = t.workers().map(|w| w.label.as_str()).collect();
        assert_eq!(labels, ["E0", "E1", "P0", "L0", "L1", "D0"]);
    }

    #[test]
    fn a_local_prefill_worker_spans_a_group_of_encode_workers() {
        let a: Allocation = "4E(TP1)+1D(TP4)".parse().unwrap();
        let t = Topology::new(&a, Some(2));
        assert_eq!(t.remote_prefill(), 0);
        let l: Vec<_> = t.prefill().iter().map(|w| (w.gpus.clone(), w.tp)).collect();
        assert_eq!(l, vec![(vec![0, 1], 2), (vec![2, 3], 2)]);
        assert_eq!(t.label(WorkerRef::Prefill(1)), "L1");
        assert_eq!(t.gpu_owner(2), Some(("encode", "E2+L1".into())));
        // without local prefill nothing is co-located
        let t = Topology::new(&a, None);
        assert!(t.prefill().is_empty() && t.encode()[0].local_prefill.is_none());
        assert_eq!(t.gpu_owner(0), Some(("encode", "E0".into())));
    }

    #[test]
    fn aggregated_replicas_take_consecutive_tp_groups() {
        let t = Topology::replicas(3, 2);
        assert_eq!(t.gpus(), 6);
        assert_eq!(t.replica()[1].gpus, vec![2, 3]);
        assert_eq!(t.replica()[1].tp, 2);
        assert_eq!(t.gpu_owner(5), Some(("aggregated", "R2".into())));
        assert_eq!(t.gpu_owner(6), None);
        assert!(t.encode().is_empty() && t.prefill().is_empty() && t.decode().is_empty());
        let labels: Vec<&str> = t.workers().map(|w| w.label.as_str()).collect();
        assert_eq!(labels, ["R0", "R1", "R2"]);
    }
}
