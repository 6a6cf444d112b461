//! The executor's event loop on a virtual clock: the [`Controller`] driven as
//! `easerve exec` drives it, with every worker replaced by a service time
//! from a [`StageCost`] and every link by a serialised transfer time.
//!
//! It exists to check that the executor makes exactly the simulator's
//! decisions: with a cost whose times do not depend on what else runs
//! (no bandwidth interference, no time-slicing penalty, prefill time
//! independent of the SM share), [`run_virtual`] and the simulator produce
//! the same [`easerve_sched::Decision`] log for the same scenario.
//! Ties at one instant break as in the simulator: completions, then
//! transfers, then arrivals, then timers, each FIFO.

use crate::event::{apply, ExecEvent};
use easerve_calib::StageCost;
use easerve_model::ItemTokens;
use easerve_sched::{Command, Controller};
use easerve_workload::Scenario;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

struct Entry {
    time: f64,
    class: u8,
    seq: u64,
    gen: u64,
    ev: ExecEvent,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    fn cmp(&self, o: &Self) -> Ordering {
        o.time
            .total_cmp(&self.time)
            .then(o.class.cmp(&self.class))
            .then(o.seq.cmp(&self.seq))
    }
}

const COMPLETION: u8 = 0;
const TRANSFER: u8 = 1;
const ARRIVAL: u8 = 2;
const TIMER: u8 = 3;

/// Drive `ctrl` (built by [`crate::plan::build_controller`] for `sc`, with
/// `tokens` per request) to the end of the run on a virtual clock, with
/// service times from `cost`; returns it for its records and decision log.
pub fn run_virtual(
    mut ctrl: Controller,
    sc: &Scenario,
    tokens: &[Vec<ItemTokens>],
    cost: &dyn StageCost,
) -> Controller {
    let alloc = sc.deployment.allocation;
    let emb_per_token = sc.model.embedding_bytes_per_token();
    let kv_per_token = sc.model.kv_bytes_per_token();
    let arrivals: Vec<f64> = ctrl.requests().iter().map(|r| r.arrival).collect();
    let mut heap = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |heap: &mut BinaryHeap<Entry>, time: f64, class: u8, gen: u64, ev| {
        seq += 1;
        heap.push(Entry {
            time,
            class,
            seq,
            gen,
            ev,
        });
    };
    if let Some(&t) = arrivals.first() {
        push(&mut heap, t, ARRIVAL, 0, ExecEvent::Arrival(0));
    }
    let mut timer_gen = vec![0u64; alloc.encode.workers as usize];
    let mut encode_link = vec![0.0f64; alloc.encode.workers as usize];
    let mut prefill_link = vec![0.0f64; 64.max(alloc.prefill.workers as usize * 2 + 64)];
    let mut now = 0.0f64;
    while let Some(e) = heap.pop() {
        now = e.time.max(now);
        match e.ev {
            ExecEvent::Arrival(id) => {
                let next = id as usize + 1;
                if let Some(&t) = arrivals.get(next) {
                    push(&mut heap, t, ARRIVAL, 0, ExecEvent::Arrival(next as u64));
                }
            }
            ExecEvent::Timer(w) if e.gen != timer_gen[w] => continue,
            _ => {}
        }
        apply(&mut ctrl, now, e.ev);
        for cmd in ctrl.take_commands() {
            match cmd {
                Command::Encode {
                    worker,
                    ids,
                    sm_share,
                } => {
                    let items: Vec<ItemTokens> = ids
                        .iter()
                        .flat_map(|&id| tokens[id as usize].iter().copied())
                        .collect();
                    let t = cost.encode(&items, 1.0);
                    let gpu = cost.encode(&items, sm_share).t_gpu;
                    let end = now + t.t_pass + t.t_pre + gpu;
                    push(&mut heap, end, COMPLETION, 0, ExecEvent::EncodeDone(worker));
                }
                Command::Timer { worker, at } => {
                    timer_gen[worker] += 1;
                    let g = timer_gen[worker];
                    push(&mut heap, at, TIMER, g, ExecEvent::Timer(worker));
                }
                Command::Embeddings {
                    from,
                    to,
                    ids,
                    local,
                } => {
                    let (land, from) = if local {
                        (now, None)
                    } else {
                        let bytes: f64 = ids
                            .iter()
                            .map(|&id| ctrl.requests()[id as usize].mm_tokens as f64)
                            .sum::<f64>()
                            * emb_per_token;
                        let start = encode_link[from].max(now);
                        encode_link[from] = start + cost.transfer(bytes);
                        (encode_link[from], Some(from))
                    };
                    push(
                        &mut heap,
                        land,
                        TRANSFER,
                        0,
                        ExecEvent::EmbeddingsLanded { to, ids, from },
                    );
                }
                Command::Prefill {
                    worker,
                    items,
                    sm_share,
                } => {
                    let lens: Vec<u64> = items.iter().map(|i| i.tokens).collect();
                    let tp = if ctrl.is_local_prefill(worker) {
                        sc.knobs.local_prefill_tp.unwrap_or(1)
                    } else {
                        alloc.prefill.tp
                    };
                    let end = now + cost.prefill(&lens, tp, sm_share);
                    push(
                        &mut heap,
                        end,
                        COMPLETION,
                        0,
                        ExecEvent::PrefillDone(worker),
                    );
                }
                Command::Kv { from, to, id } => {
                    let bytes = ctrl.requests()[id as usize].prefill_tokens() as f64 * kv_per_token;
                    if from >= prefill_link.len() {
                        prefill_link.resize(from + 1, 0.0);
                    }
                    let start = prefill_link[from].max(now);
                    prefill_link[from] = start + cost.transfer(bytes);
                    push(
                        &mut heap,
                        prefill_link[from],
                        TRANSFER,
                        0,
                        ExecEvent::KvLanded { to, id },
                    );
                }
                Command::DecodeStep {
                    worker,
                    ids,
                    context,
                } => {
                    let end = now + cost.decode_step(ids.len() as u64, context, alloc.decode.tp);
                    push(
                        &mut heap,
                        end,
                        COMPLETION,
                        0,
                        ExecEvent::DecodeStepDone(worker),
                    );
                }
                Command::Release { .. } => {}
            }
        }
    }
    ctrl
}
