//! The shared encoder-output store as the executor holds it: real
//! embeddings in the controller's process, exactly the items the
//! controller's directory says the store holds (`sched`'s `EncoderCache`
//! decides every hit, write and eviction; this only copies and drops).
//!
//! A request that hits the store takes its items' embeddings with its
//! encode pass ([`crate::wire::EncodeRequest::fetched`]), over the same
//! socket as the pass; a pass's encoded items are copied here once the
//! controller has heard the pass ended and entered them. An item the
//! directory evicts while a placed request still waits to fetch it is kept
//! until that request's pass goes out.

use easerve_sched::{Controller, ItemOp, RequestId};
use std::collections::HashMap;
use std::sync::Arc;

use crate::wire::Matrix;

/// One item's embeddings, `[rows, d]` row-major.
type Rows = Arc<Vec<f32>>;

/// Embeddings by content key.
type Held = HashMap<u64, Rows>;

/// The store's embeddings and what is on its way in and out (module doc).
#[derive(Default)]
pub struct SharedStore {
    /// What the directory says the store holds.
    items: Held,
    /// Evicted by the directory, kept for placed requests that fetch them.
    retired: Held,
    /// Requests whose pass ended, with each item's embedding rows, until
    /// the controller has heard it and their encoded items are copied.
    ended: Vec<(RequestId, Vec<u32>)>,
    /// Each placed request's fetched items, until its pass goes out.
    fetched: HashMap<RequestId, Vec<(u64, Rows)>>,
    /// Items copied in.
    pub writes: u64,
    /// Items sent to encode workers from here.
    pub fetches: u64,
}

impl SharedStore {
    /// The worker reported the pass of these requests ended, with each
    /// item's rows.
    pub fn ended(&mut self, rows: impl Iterator<Item = (RequestId, Vec<u32>)>) {
        self.ended.extend(rows);
    }

    /// Follow the directory: drop what it evicted (keeping what a placed
    /// request still fetches), then copy in the encoded items of the passes
    /// the controller has heard end that it holds, from their requests'
    /// `embeddings`. Nothing with the store off.
    pub fn sync(&mut self, ctrl: &mut Controller, embeddings: &HashMap<RequestId, Matrix>) {
        if ctrl.caches().store.is_none() {
            self.ended.clear();
            return;
        }
        for k in ctrl.take_store_evictions() {
            if let Some(e) = self.items.remove(&k) {
                if ctrl.store_fetch_pending(k) {
                    self.retired.insert(k, e);
                }
            }
        }
        let mut ended = std::mem::take(&mut self.ended);
        ended.retain(|(id, rows)| {
            let heard = ctrl.records()[*id as usize].encode_end.is_some();
            if heard {
                if let Some(m) = embeddings.get(id) {
                    self.copy_in(ctrl, *id, m, rows);
                }
            }
            !heard && ctrl.records()[*id as usize].aborted.is_none()
        });
        self.ended = ended;
    }

    /// Copy request `id`'s encoded items (those that hit neither cache)
    /// that the directory holds and this store does not yet.
    fn copy_in(&mut self, ctrl: &Controller, id: RequestId, m: &Matrix, rows: &[u32]) {
        let Some(content) = ctrl.requests()[id as usize].content.as_ref() else {
            return;
        };
        let hits = ctrl.encoder_hits(id);
        let d = m.cols as usize;
        let mut at = 0usize;
        for (k, (item, &r)) in content.items().zip(rows).enumerate() {
            let len = r as usize * d;
            let hit = k < 64 && hits & (1 << k) != 0;
            if !hit && ctrl.store_holds(item.id) && !self.items.contains_key(&item.id) {
                if let Some(slice) = m.data.get(at..at + len) {
                    self.items.insert(item.id, Arc::new(slice.to_vec()));
                    self.writes += 1;
                }
            }
            at += len;
        }
    }

    /// Request `id` was placed with `ops`: keep the embeddings of the items
    /// it fetches from the store for its pass (those of an earlier
    /// placement, on a worker that died, are replaced).
    pub fn fetch(&mut self, id: RequestId, ops: &[ItemOp]) {
        self.fetched.remove(&id);
        let mut got = Vec::new();
        for o in ops.iter().filter(|o| o.fetched) {
            let e = self.items.get(&o.key).or_else(|| self.retired.get(&o.key));
            if let Some(e) = e {
                got.push((o.key, e.clone()));
            }
        }
        if !got.is_empty() {
            self.fetched.insert(id, got);
        }
    }

    /// Drop the evicted items no placed request fetches any more.
    pub fn release(&mut self, ctrl: &Controller) {
        if !self.retired.is_empty() {
            self.retired.retain(|k, _| ctrl.store_fetch_pending(*k));
        }
    }

    /// The embeddings request `id`'s pass takes from the store.
    pub fn take_fetched(&mut self, id: RequestId) -> Vec<(u64, Vec<f32>)> {
        let got = self.fetched.remove(&id).unwrap_or_default();
        self.fetches += got.len() as u64;
        got.into_iter().map(|(k, e)| (k, (*e).clone())).collect()
    }

    /// Forget the requests `wanted` rejects (aborted).
    pub fn forget(&mut self, wanted: impl Fn(&RequestId) -> bool) {
        self.fetched.retain(|id, _| wanted(id));
        self.ended.retain(|(id, _)| wanted(id));
    }

    /// Items held.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}
