//! The physics of the aggregated system's replicas: what the controller's
//! replica commands cost (`replica.rs` in `easerve-sched` decides).
//!
//! * Front-end preprocessing ([`Command::FrontEndPreprocess`]) takes the
//!   request's CPU preprocessing time (`t_pre` of its items at full share),
//!   in the server's front end, before any replica can schedule it; it holds
//!   no GPU.
//! * One iteration ([`Command::ReplicaStep`]) costs the GPU time of encoding
//!   the admitted requests' items, split over the replica's TP GPUs, plus
//!   their prefill at that TP, plus one decode step over the running batch.
//!   An inline encoder pays no separate per-pass framework overhead (`t_pass`,
//!   the cost of a disaggregated encode service).
//!
//! [`Command::FrontEndPreprocess`]: easerve_sched::Command::FrontEndPreprocess
//! [`Command::ReplicaStep`]: easerve_sched::Command::ReplicaStep

use super::{Ev, Sim};
use crate::event::Priority;
use easerve_sched::{Event, RequestId, WorkerRef};
use serde_json::json;

/// One aggregated replica on the hardware.
pub(super) struct ReplicaEngine {
    pub(super) gpus: Vec<u32>,
    pub(super) tp: u32,
    /// Generation of the pending iteration end, never reset.
    pub(super) gen: u64,
    /// The iteration in flight: (start, inline encode seconds, batch, context).
    pub(super) step: Option<(f64, f64, u64, u64)>,
}

impl Sim<'_> {
    /// Request `id` is preprocessed in the front end: it is ready `t_pre`
    /// seconds from now.
    pub(super) fn front_end(&mut self, id: RequestId) {
        let t_pre = self.cost.encode(&self.tokens[id as usize], 1.0).t_pre;
        if let Some(log) = self.service.as_mut() {
            log.front_end.push(t_pre);
        }
        self.events.push(
            self.now + t_pre,
            Priority::Transfer,
            Ev::Preprocessed { id },
        );
    }

    /// Replica `r` starts an iteration of `batch` sequences over `context`
    /// tokens that encodes and prefills what the controller admitted.
    pub(super) fn start_replica_step(&mut self, r: usize, batch: u64, context: u64) {
        let now = self.now;
        let tp = self.replicas[r].tp;
        self.items.clear();
        let mut seq_lens = Vec::new();
        for &id in self.ctrl.replica_admitted(r) {
            let i = id as usize;
            self.items.extend_from_slice(&self.tokens[i]);
            seq_lens.push(self.ctrl.requests()[i].prefill_tokens());
        }
        // on a CPU host: at the core sharing in force at its start
        self.ask_cores_at(WorkerRef::Replica(r), Some(1.0));
        let slow = self.host_slowdown_of(WorkerRef::Replica(r));
        let t_enc = if self.items.is_empty() {
            0.0
        } else {
            self.cost.encode(&self.items, 1.0).t_gpu / tp as f64 * slow
        };
        let t_prefill = if seq_lens.is_empty() {
            0.0
        } else {
            self.cost.prefill(&seq_lens, tp.into(), 1.0)
        };
        let dur =
            t_enc + t_prefill * slow + self.cost.decode_step(batch, context, tp.into()) * slow;
        if let Some(log) = self.service.as_mut() {
            log.replica[r].push((t_enc, dur));
        }
        let rep = &mut self.replicas[r];
        rep.gen += 1;
        rep.step = Some((now, t_enc, batch, context));
        for &g in &rep.gpus {
            self.meters[g as usize].begin(now);
            self.meters[g as usize].add_sm_time(dur);
        }
        let gen = rep.gen;
        self.events.push(
            now + dur,
            Priority::Completion,
            Ev::ReplicaDone { replica: r, gen },
        );
    }

    /// Replica `r`'s iteration ends now: its GPUs go idle, the timeline gets
    /// the iteration; what the controller hears of it.
    pub(super) fn on_replica_done(&mut self, r: usize) -> Option<Event> {
        let now = self.now;
        let rep = &mut self.replicas[r];
        let (start, t_enc, batch, context) = rep.step.take()?;
        for &g in &rep.gpus {
            self.meters[g as usize].end(now);
        }
        self.ask_cores(WorkerRef::Replica(r), 0);
        if let Some(tl) = self.timeline.as_mut() {
            let args = json!({ "batch": batch, "context_tokens": context });
            tl.slice(&format!("R{r} engine"), "iteration", start, now, args);
        }
        Some(Event::ReplicaStepDone {
            replica: r,
            prefill_start: start + t_enc,
        })
    }

    /// Replica `r` dies: the iteration in flight never ends.
    pub(super) fn lose_replica_step(&mut self, r: usize) {
        let rep = &mut self.replicas[r];
        rep.gen += 1;
        if rep.step.take().is_some() {
            for &g in &rep.gpus {
                self.meters[g as usize].end(self.now);
            }
        }
    }
}
