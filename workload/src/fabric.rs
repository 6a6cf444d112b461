//! The network of a cluster of node groups (`[[cluster.groups]]`): each
//! node's NIC, one port out and one in, each a shared resource with its own
//! FIFO queue.
//!
//! A transfer between workers on different nodes holds the sender node's
//! out-port and the receiver node's in-port for `latency + bytes / bandwidth`
//! seconds (the slower NIC's figures), starting once both are free: a burst
//! out of (or into) one node queues, so `n` transfers asked for at once
//! end after `n` times one transfer's time, as `n` flows sharing the NIC's
//! bandwidth fairly would end together. Within a node a transfer takes the
//! sender's intra-node link as without groups. A port is a [`Port`], which
//! the simulator's shared encoder store uses for its host link too.
//!
//! Sources: the NIC's bandwidth and latency are the scenario's
//! (`cluster.groups[].nic_bandwidth_gbs`, `nic_latency_s`). The
//! aiconfigurator NCCL tables (`comm/nccl/*/nccl_perf.parquet`) measure
//! all-gather and reduce-scatter within one node only: no point-to-point
//! row across nodes, so no measured figure replaces the NIC's spec.
//!
//! Both drivers take their cross-node times from here: the simulator
//! schedules a transfer's landing at its `end`, and `easerve exec`, whose
//! workers all run on one host, adds `end − now` to the loopback transfer
//! before the controller hears it landed.

use crate::generate::ItemTokenTable;
use crate::report::LinkReport;
use crate::scenario::Cluster;
use easerve_calib::LinkSpec;
use easerve_sched::{Controller, EnvelopeId, Place, RequestId};

/// One direction of a link that transfers share: each holds it for its
/// whole time, one after another in the order they were asked for (FIFO),
/// so `n` transfers asked for at once end after `n` times one transfer's
/// time, as `n` flows sharing the bandwidth fairly would end together. A
/// NIC's port (here) and the shared encoder store's host link (the
/// simulator's) are ports; [`Port::hold`] takes a transfer on several at
/// once (a sender's and a receiver's).
#[derive(Clone, Debug, Default)]
pub struct Port {
    free_at: f64,
    busy_s: f64,
    queued_s: f64,
    max_queued_s: f64,
    transfers: u64,
    bytes: f64,
}

impl Port {
    fn account(&mut self, asked: f64, start: f64, dur: f64, bytes: f64) {
        let q = start - asked;
        self.queued_s += q;
        self.max_queued_s = self.max_queued_s.max(q);
        self.busy_s += dur;
        self.transfers += 1;
        self.bytes += bytes;
        self.free_at = start + dur;
    }

    /// When the port is free for the next transfer, seconds.
    pub fn free_at(&self) -> f64 {
        self.free_at
    }

    /// A transfer of `bytes` taking `dur` seconds, asked for at `now` and
    /// ready no earlier than `ready` (its sender's own link may hold it),
    /// on every port of `ports` at once: it starts when all are free,
    /// `(start, start + dur)`; each port counts its wait from `now`.
    pub fn hold(ports: &mut [&mut Port], now: f64, ready: f64, dur: f64, bytes: f64) -> (f64, f64) {
        let start = ports.iter().fold(now.max(ready), |t, p| t.max(p.free_at));
        for p in ports.iter_mut() {
            p.account(now, start, dur, bytes);
        }
        (start, start + dur)
    }

    /// The port's line in the report, named `link`, over a run of
    /// `duration_s` seconds; `None` when it carried nothing.
    pub fn report(&self, link: String, duration_s: f64) -> Option<LinkReport> {
        (self.transfers > 0).then(|| LinkReport {
            link,
            transfers: self.transfers,
            bytes: self.bytes,
            utilisation: if duration_s > 0.0 {
                self.busy_s / duration_s
            } else {
                0.0
            },
            mean_queue_s: self.queued_s / self.transfers as f64,
            max_queue_s: self.max_queued_s,
        })
    }
}

/// Every node's NIC ports (module doc).
#[derive(Clone, Debug)]
pub struct Fabric {
    /// Index of each group's first node among all nodes.
    base: Vec<usize>,
    /// Each group's NIC.
    nic: Vec<LinkSpec>,
    /// `(group name, node)` of each node, for the report.
    names: Vec<(String, u32)>,
    out: Vec<Port>,
    inn: Vec<Port>,
}

impl Fabric {
    /// The NICs of `cluster`'s nodes, all idle.
    pub fn new(cluster: &Cluster) -> Self {
        let mut base = Vec::with_capacity(cluster.groups.len());
        let mut names = Vec::new();
        for g in &cluster.groups {
            base.push(names.len());
            names.extend((0..g.node.nodes).map(|n| (g.node.name.clone(), n)));
        }
        let n = names.len();
        Fabric {
            base,
            nic: cluster.groups.iter().map(|g| g.nic.clone()).collect(),
            names,
            out: vec![Port::default(); n],
            inn: vec![Port::default(); n],
        }
    }

    fn node(&self, p: Place) -> usize {
        self.base[p.group as usize] + p.node as usize
    }

    /// A transfer of `bytes` from node `from` to node `to` asked for at `now`
    /// (seconds): `(start, end)` on the two NICs, or `None` when both are the
    /// same node (the intra-node link carries it).
    pub fn send(&mut self, now: f64, from: Place, to: Place, bytes: f64) -> Option<(f64, f64)> {
        if from == to {
            return None;
        }
        let (a, b) = (self.node(from), self.node(to));
        let (na, nb) = (&self.nic[from.group as usize], &self.nic[to.group as usize]);
        let slow = if na.bandwidth_gbs <= nb.bandwidth_gbs {
            na
        } else {
            nb
        };
        let dur = na.latency_s.max(nb.latency_s) + bytes / (slow.bandwidth_gbs * 1e9);
        let ports = &mut [&mut self.out[a], &mut self.inn[b]];
        Some(Port::hold(ports, now, now, dur, bytes))
    }

    /// Each NIC port that carried a transfer: utilisation over `duration_s`
    /// and its queueing.
    pub fn report(&self, duration_s: f64) -> Vec<LinkReport> {
        let mut out = Vec::new();
        for (dir, ports) in [("out", &self.out), ("in", &self.inn)] {
            for (i, p) in ports.iter().enumerate() {
                let (group, node) = &self.names[i];
                out.extend(p.report(format!("{group}/node{node} NIC {dir}"), duration_s));
            }
        }
        out
    }
}

/// Bytes of envelope `envelope`'s embeddings as the model's LLM takes them:
/// each request's multimodal tokens (a shard: its item's LLM tokens, from
/// `tokens`) × `bytes_per_token`
/// ([`easerve_model::ModelArch::embedding_bytes_per_token`]).
pub fn envelope_bytes(
    ctrl: &Controller,
    tokens: &ItemTokenTable,
    envelope: EnvelopeId,
    bytes_per_token: f64,
) -> f64 {
    let requests = ctrl.requests();
    let shards = ctrl.envelope_items(envelope);
    let per = |(k, &id): (usize, &RequestId)| match shards.get(k) {
        // a shard carries its item's embeddings
        Some(&item) => tokens[id as usize]
            .get(item as usize)
            .map_or(0.0, |t| t.llm_tokens as f64),
        None => requests[id as usize].mm_tokens as f64,
    };
    ctrl.envelope(envelope)
        .iter()
        .enumerate()
        .map(per)
        .sum::<f64>()
        * bytes_per_token
}

/// Bytes of request `id`'s KV cache after its prefill: its prefill tokens ×
/// `bytes_per_token` ([`easerve_model::ModelArch::kv_bytes_per_token`]).
pub fn kv_bytes(ctrl: &Controller, id: RequestId, bytes_per_token: f64) -> f64 {
    ctrl.requests()[id as usize].prefill_tokens() as f64 * bytes_per_token
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Group;
    use easerve_calib::GpuSpec;
    use easerve_sched::{NodeGroup, Topology};

    fn cluster() -> Cluster {
        let group = |name: &str| Group {
            node: NodeGroup {
                name: name.into(),
                nodes: 2,
                gpus_per_node: 8,
            },
            gpu: GpuSpec::preset("h100-sxm").unwrap(),
            nic: LinkSpec {
                name: "ib".into(),
                bandwidth_gbs: 50.0,
                latency_s: 1e-5,
            },
            cost_per_gpu_hour: None,
        };
        let a = "1E(TP1)+1P(TP1)+1D(TP1)".parse().unwrap();
        Cluster {
            groups: vec![group("a")],
            stage_groups: [0; 3],
            topology: Topology::new(&a, None),
        }
    }

    const N0: Place = Place { group: 0, node: 0 };
    const N1: Place = Place { group: 0, node: 1 };

    /// NIC sharing: two transfers out of one node asked for at once take
    /// twice as long as one (runs in microseconds).
    #[test]
    fn two_concurrent_transfers_take_twice_as_long_as_one() {
        let bytes = 1e9;
        let mut f = Fabric::new(&cluster());
        let (s, one) = f.send(0.0, N0, N1, bytes).unwrap();
        assert_eq!(s, 0.0);
        assert!((one - (1e-5 + bytes / 50e9)).abs() < 1e-12);
        let mut f = Fabric::new(&cluster());
        f.send(0.0, N0, N1, bytes).unwrap();
        let (_, two) = f.send(0.0, N0, N1, bytes).unwrap();
        assert!((two - 2.0 * one).abs() < 1e-12, "{two} vs 2 × {one}");
        // within a node: not on the NIC
        assert_eq!(f.send(0.0, N0, N0, bytes), None);
        let r = f.report(two);
        assert_eq!(r.len(), 2);
        assert!((r[0].utilisation - 1.0).abs() < 1e-12);
        assert!((r[0].max_queue_s - one).abs() < 1e-12);
    }

    /// Transfers into one node from two senders share its in-port.
    #[test]
    fn a_receiving_nic_is_shared_too() {
        let mut c = cluster();
        c.groups[0].node.nodes = 3;
        let mut f = Fabric::new(&c);
        let n2 = Place { group: 0, node: 2 };
        let (_, one) = f.send(0.0, N0, n2, 1e9).unwrap();
        let (s, two) = f.send(0.0, N1, n2, 1e9).unwrap();
        assert_eq!(s, one);
        assert!((two - 2.0 * one).abs() < 1e-12);
    }
}
