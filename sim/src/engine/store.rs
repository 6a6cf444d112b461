//! The shared encoder-output store's transfers
//! (`[deployment.encoder_store]`): a pass's fetch of the items the store
//! held and its write of the items it encoded.
//!
//! The store is host memory on the cluster's first node. A worker on
//! another node reaches it over both nodes' NICs (`fabric.rs`, queued with
//! the cluster's other cross-node transfers). A worker on the store's node
//! reaches it over the store's host link (`link`, else that node's
//! intra-node link), one [`Port`] per direction shared by every worker
//! there, as a NIC's port is shared: concurrent fetches queue on its out
//! direction, concurrent writes on its in direction, so a burst of fetches
//! ends after the sum of their times. A write also holds the writing
//! worker's own outgoing link, ahead of its embeddings (vLLM's example
//! connector saves a pass's outputs in the encoder's step, before the
//! prefill instance loads them).

use super::Sim;
use easerve_sched::{Place, WorkerRef};
use easerve_workload::fabric::Port;
use easerve_workload::report::{LinkReport, STORE_LINK};

/// The store's host link, both directions (module doc).
#[derive(Clone, Debug, Default)]
pub(super) struct StoreLink {
    /// Store to workers: fetches.
    fetch: Port,
    /// Workers to store: writes.
    write: Port,
}

impl StoreLink {
    /// Each direction that carried a transfer, over a run of `duration_s`.
    pub(super) fn report(&self, duration_s: f64) -> Vec<LinkReport> {
        let dirs = [("out (fetches)", &self.fetch), ("in (writes)", &self.write)];
        dirs.into_iter()
            .filter_map(|(dir, p)| p.report(format!("{STORE_LINK} {dir}"), duration_s))
            .collect()
    }
}

/// A transfer to or from the store (module doc): when it starts and ends,
/// and, for a write on the store's node, how long after it was asked for
/// the store's link was first free for it (what a replay of the worker's
/// link needs).
pub(super) struct StoreTransfer {
    pub(super) start: f64,
    pub(super) end: f64,
    /// `None` for a fetch or a write over the NICs (it does not hold the
    /// worker's link).
    pub(super) link_wait: Option<f64>,
}

impl Sim<'_> {
    /// A transfer of `bytes` between encode worker `w` and the shared
    /// store, asked for now: a write when `write`, else a fetch.
    pub(super) fn store_transfer(&mut self, w: usize, bytes: f64, write: bool) -> StoreTransfer {
        let now = self.now;
        let at = self.topology.worker(WorkerRef::Encode(w)).place;
        let store = Place { group: 0, node: 0 };
        let (from, to) = if write { (at, store) } else { (store, at) };
        let nics = self
            .fabric
            .as_mut()
            .and_then(|f| f.send(now, from, to, bytes));
        if let Some((start, end)) = nics {
            return StoreTransfer {
                start,
                end,
                link_wait: None,
            };
        }
        let dur = match self.sc.knobs.caches.store.and_then(|s| s.link) {
            Some(l) => l.transfer_time(bytes),
            None => self.intra_node(WorkerRef::Encode(w), bytes),
        };
        if !write {
            let (start, end) = Port::hold(&mut [&mut self.store_link.fetch], now, now, dur, bytes);
            return StoreTransfer {
                start,
                end,
                link_wait: None,
            };
        }
        let port = &mut self.store_link.write;
        let link_wait = port.free_at().max(now) - now;
        let ready = self.encode[w].link.free_at().max(now);
        let (start, end) = Port::hold(&mut [port], now, ready, dur, bytes);
        self.encode[w].link.send(start, dur);
        StoreTransfer {
            start,
            end,
            link_wait: Some(link_wait),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The store's link is shared as a NIC's port is: two fetches asked
    /// for at once by two workers on its node take twice as long as one;
    /// a write goes the other way, not behind them; the report counts the
    /// second fetch's wait (milliseconds: no run).
    #[test]
    fn two_concurrent_fetches_take_twice_as_long_as_one() {
        let sc = crate::engine::tests::image_with(&[
            ("deployment.allocation", "4E(TP1)+1P(TP2)+1D(TP2)"),
            ("deployment.encoder_store.capacity_gib", "8"),
        ]);
        let mut sim = Sim::new(&sc, crate::scenario_cost(&sc), false);
        let bytes = 42e6;
        let one = sim.store_transfer(0, bytes, false);
        assert_eq!(one.start, 0.0);
        let dur = one.end;
        assert!(dur > 1e-3, "{dur}");
        let mut sim = Sim::new(&sc, crate::scenario_cost(&sc), false);
        sim.store_transfer(0, bytes, false);
        let two = sim.store_transfer(1, bytes, false);
        assert_eq!(two.start, dur);
        assert!(
            (two.end - 2.0 * dur).abs() < 1e-12,
            "{} vs 2 × {dur}",
            two.end
        );
        let write = sim.store_transfer(2, bytes, true);
        assert_eq!((write.start, write.link_wait), (0.0, Some(0.0)));
        // a second write waits for the first, and holds its worker's link
        let next = sim.store_transfer(3, bytes, true);
        assert_eq!((next.start, next.link_wait), (dur, Some(dur)));
        assert_eq!(sim.encode[3].link.free_at(), 2.0 * dur);
        let r = sim.store_link.report(2.0 * dur);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].link, "encoder store out (fetches)");
        assert_eq!(r[0].transfers, 2);
        assert!((r[0].utilisation - 1.0).abs() < 1e-12);
        assert!((r[0].max_queue_s - dur).abs() < 1e-12);
        assert!((r[1].mean_queue_s - dur / 2.0).abs() < 1e-12);
    }
}
