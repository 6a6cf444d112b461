//! Decode: KV caches landing at a decode worker, decode runs, and their ends.

use super::{Command, Controller, Decision, Place};
use crate::{DecodeSeq, RequestId, Stamp};

impl Controller {
    pub(super) fn on_kv(&mut self, now: f64, id: RequestId, sent_at: f64) {
        let i = id as usize;
        let Place::Decode(d) = self.place[i] else {
            return;
        };
        let d = d as usize;
        if self.records[i].decode_ready.is_some() {
            // a duplicate landing: the cache is already queued
            return;
        }
        self.records[i].kv_sent = Stamp::at(sent_at);
        if !self.decode[d].alive {
            self.fail(id, &format!("decode worker D{d} is down"));
            return;
        }
        self.records[i].decode_ready = Stamp::at(now);
        let seq = DecodeSeq {
            id,
            prompt_tokens: self.requests[i].prefill_tokens(),
            remaining: self.requests[i].output_tokens - 1,
        };
        if !self.decode[d].sched.can_ever_fit(&seq) {
            // release the placement its prefill made
            let work = (seq.prompt_tokens + self.requests[i].output_tokens as u64) as f64;
            self.decode_place.complete(d, work);
            self.fail(
                id,
                &format!("its KV cache can never fit decode worker D{d}"),
            );
            return;
        }
        self.decode[d].sched.enqueue(seq);
        let slot = &mut self.decode[d];
        if slot.in_run && !slot.yielded && slot.sched.can_admit_next() {
            // it joins at the end of the iteration in progress, as it would
            // if the iterations were decided one by one
            slot.yielded = true;
            self.decide(|| Decision::DecodeYield { at: now, worker: d });
            self.commands.push_back(Command::DecodeYield { worker: d });
        }
        self.try_decode(now, d);
    }

    /// Start a run on decode worker `d` if it is idle and has work: the
    /// iterations until its first running sequence finishes.
    pub(super) fn try_decode(&mut self, now: f64, d: usize) {
        let slot = &mut self.decode[d];
        if slot.in_run || !slot.alive {
            return;
        }
        let mut admitted = std::mem::take(&mut self.scratch_ids);
        slot.sched.admit_into(&mut admitted);
        for &id in &admitted {
            self.records[id as usize].decode_start = Stamp::at(now);
        }
        self.scratch_ids = admitted;
        let slot = &mut self.decode[d];
        let (batch, context) = slot.sched.step_shape();
        if batch == 0 {
            return;
        }
        let steps = slot.sched.steps_to_finish().unwrap_or(1);
        slot.in_run = true;
        slot.since = now;
        slot.run_steps = steps;
        slot.yielded = false;
        self.decide(|| Decision::DecodeRun {
            at: now,
            worker: d,
            batch,
            context,
            steps,
        });
        self.commands.push_back(Command::DecodeRun {
            worker: d,
            batch,
            context,
            steps,
        });
    }

    /// Decode worker `d`'s run ended at `now` after `steps` iterations:
    /// sequences that generated their last token finish.
    pub(super) fn complete_decode_run(&mut self, now: f64, d: usize, steps: u64) {
        if !self.decode[d].in_run {
            return;
        }
        self.worked(super::WorkerRef::Decode(d));
        let slot = &mut self.decode[d];
        debug_assert!(
            (1..=slot.run_steps).contains(&steps),
            "decode worker D{d} reported {steps} iterations of a run of {}",
            slot.run_steps
        );
        slot.in_run = false;
        slot.busy_s += now - slot.since;
        slot.yielded = false;
        let mut done = std::mem::take(&mut self.scratch_ids);
        slot.sched
            .complete_steps_into(steps.clamp(1, slot.run_steps.max(1)), &mut done);
        for &id in &done {
            if self.aborted(id) {
                // released with the others leaving below
                continue;
            }
            let work = self.work(id);
            self.decode_place.complete(d, work);
            self.done(id, now);
            self.commands.push_back(Command::Release { worker: d, id });
        }
        self.scratch_ids = done;
        self.release_leaving(d);
    }
}
