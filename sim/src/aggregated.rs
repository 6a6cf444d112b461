//! The `aggregated` baseline: how a single-engine server (vLLM-style) runs the
//! cluster. `GPUs / TP` replicas, each an engine of TP GPUs that runs every
//! stage itself: per iteration it admits waiting requests (FCFS, within the
//! prefill token budget and while KV blocks are free), encodes their items
//! inline, prefills them, and advances every running sequence by one token.
//!
//! Cost of one iteration = the GPU time of encoding the newly admitted items
//! (split over TP) + their prefill + one decode step over the running batch.
//! An inline encoder pays no separate per-pass framework overhead
//! (`t_pass`, the cost of a disaggregated encode service); CPU preprocessing
//! (`t_pre`) runs in the server's front end before a request is schedulable.

use crate::event::{EventQueue, Priority};
use crate::meter::GpuMeter;
use crate::output::{assemble, RunParts};
use crate::timeline::Timeline;
use crate::{SimOptions, SimOutput};
use easerve_calib::{Efficiency, Roofline, StageCost};
use easerve_sched::{
    DecodeScheduler, DecodeSeq, KvBlocks, LeastOutstanding, PrefillItem, PrefillQueue, Request,
    RequestRecord,
};
use easerve_workload::generate::{generate_with_tokens, ItemTokenTable};
use easerve_workload::report::EncodeSummary;
use easerve_workload::Scenario;
use serde_json::json;

enum Event {
    Arrival(usize),
    Ready(usize),
    StepDone(usize),
}

struct Replica {
    gpus: Vec<u32>,
    /// Requests preprocessed and waiting to be scheduled.
    waiting: PrefillQueue,
    sched: DecodeScheduler,
    stepping: bool,
    step_start: f64,
    /// Requests whose prefill ran in the current iteration.
    prefilling: Vec<usize>,
}

/// The baseline's state during a run.
struct Baseline<'a> {
    sc: &'a Scenario,
    cost: Box<dyn StageCost>,
    tp: u32,
    requests: Vec<Request>,
    tokens: ItemTokenTable,
    records: Vec<RequestRecord>,
    replicas: Vec<Replica>,
    place: LeastOutstanding,
    meters: Vec<GpuMeter>,
    timeline: Option<Timeline>,
    events: EventQueue<Event>,
    processed: u64,
    /// Requests admitted and not finished (admission control).
    in_system: usize,
    /// Iterations that encoded something, and the requests they encoded.
    passes: usize,
    encoded: usize,
}

/// Run `sc` as the aggregated baseline.
pub(crate) fn run(sc: &Scenario, cost: Box<dyn StageCost>, opts: &SimOptions) -> SimOutput {
    let mut b = Baseline::new(sc, cost, opts);
    while let Some((now, ev)) = b.events.pop() {
        b.processed += 1;
        let touched = match ev {
            Event::Arrival(i) => {
                b.on_arrival(now, i);
                None
            }
            Event::Ready(i) => b.on_ready(now, i),
            Event::StepDone(r) => {
                b.on_step_done(now, r);
                Some(r)
            }
        };
        if let Some(r) = touched {
            b.start_iteration(now, r);
        }
    }
    b.finish()
}

fn work(r: &Request) -> f64 {
    (r.prefill_tokens() + r.output_tokens as u64) as f64
}

impl<'a> Baseline<'a> {
    fn new(sc: &'a Scenario, cost: Box<dyn StageCost>, opts: &SimOptions) -> Self {
        let tp = sc.knobs.aggregated_tp.expect("validated: aggregated TP");
        let (requests, tokens) = generate_with_tokens(sc);
        let records = requests.iter().map(RequestRecord::new).collect();
        let memory = Roofline::new(sc.model.clone(), sc.gpu.clone(), Efficiency::default());
        let kv_bytes = memory
            .kv_bytes_free_per_gpu(
                tp,
                sc.model.encoder_weight_bytes(),
                sc.knobs.gpu_memory_utilization,
            )
            .unwrap_or(0.0)
            * tp as f64;
        let n = (sc.gpus / tp).max(1) as usize;
        let replicas: Vec<Replica> = (0..n)
            .map(|r| Replica {
                gpus: (r as u32 * tp..(r as u32 + 1) * tp).collect(),
                waiting: PrefillQueue::new(
                    sc.knobs.prefill_token_budget,
                    sc.knobs.prefill_max_seqs,
                ),
                sched: DecodeScheduler::new(
                    KvBlocks::from_memory(
                        kv_bytes,
                        sc.model.kv_bytes_per_token(),
                        sc.knobs.kv_block_size,
                    ),
                    sc.knobs.decode_max_batch,
                ),
                stepping: false,
                step_start: 0.0,
                prefilling: Vec::new(),
            })
            .collect();
        let mut events = EventQueue::new();
        // arrivals are sorted: only the next one waits in the queue
        if let Some(first) = requests.first() {
            events.push(first.arrival, Priority::Arrival, Event::Arrival(0));
        }
        Baseline {
            sc,
            cost,
            tp,
            requests,
            tokens,
            records,
            place: LeastOutstanding::new(n),
            replicas,
            meters: vec![GpuMeter::default(); sc.gpus as usize],
            timeline: opts.timeline.then(Timeline::default),
            events,
            processed: 0,
            in_system: 0,
            passes: 0,
            encoded: 0,
        }
    }

    /// Request `i` arrives: admission control, as the controller applies it
    /// to the EPD systems, then preprocessing in the server's front end.
    fn on_arrival(&mut self, now: f64, i: usize) {
        if let Some(next) = self.requests.get(i + 1) {
            self.events
                .push(next.arrival, Priority::Arrival, Event::Arrival(i + 1));
        }
        if self
            .sc
            .knobs
            .admission_limit
            .is_some_and(|cap| self.in_system >= cap)
        {
            self.records[i].rejected = true;
            return;
        }
        self.in_system += 1;
        let t_pre = self.cost.encode(&self.tokens[i], 1.0).t_pre;
        self.events
            .push(now + t_pre, Priority::Transfer, Event::Ready(i));
    }

    /// Request `i` is preprocessed: it waits at the least-loaded replica, or
    /// fails when its KV cache can never fit one. Returns the replica.
    fn on_ready(&mut self, now: f64, i: usize) -> Option<usize> {
        let req = &self.requests[i];
        let seq = DecodeSeq {
            id: req.id,
            prompt_tokens: req.prefill_tokens(),
            remaining: req.output_tokens,
        };
        if !self.replicas[0].sched.can_ever_fit(&seq) {
            // it would wait forever: it fails, as the controller fails it
            self.records[i].failure =
                Some("its KV cache can never fit one aggregated replica".into());
            self.in_system -= 1;
            return None;
        }
        let r = self.place.assign(work(req));
        if self.tokens[i].is_empty() {
            // text-only: ready for prefill once preprocessed
            self.records[i].prefill_ready = Some(now);
        }
        self.replicas[r].waiting.push(PrefillItem {
            id: req.id,
            tokens: req.prefill_tokens(),
        });
        Some(r)
    }

    /// Replica `r`'s iteration ended: first tokens of what it prefilled, one
    /// token for every running sequence, finished sequences leave.
    fn on_step_done(&mut self, now: f64, r: usize) {
        let rep = &mut self.replicas[r];
        rep.stepping = false;
        for &g in &rep.gpus {
            self.meters[g as usize].end(now);
        }
        for i in rep.prefilling.drain(..) {
            let rec = &mut self.records[i];
            rec.first_token = Some(now);
            rec.decode_ready = Some(now);
            rec.decode_start = Some(now);
        }
        if let Some(tl) = self.timeline.as_mut() {
            let (batch, ctx) = rep.sched.step_shape();
            let args = json!({ "batch": batch, "context_tokens": ctx });
            tl.slice(
                &format!("R{r} engine"),
                "iteration",
                rep.step_start,
                now,
                args,
            );
        }
        for id in rep.sched.complete_step() {
            let i = id as usize;
            self.records[i].finish = Some(now);
            self.in_system -= 1;
            self.place.complete(r, work(&self.requests[i]));
        }
    }

    /// Start replica `r`'s next iteration if it is idle: admit waiting
    /// requests within the token budget, encode their items inline, prefill
    /// them, and advance every running sequence by one token.
    fn start_iteration(&mut self, now: f64, r: usize) {
        // start the next iteration of the touched replica if it is idle
        let rep = &mut self.replicas[r];
        if rep.stepping {
            return;
        }
        // take a new budget's worth only once the previous one was admitted, so an
        // iteration never prefills more than the token budget
        let batch_in = if rep.sched.waiting() == 0 {
            rep.waiting.next_batch()
        } else {
            Vec::new()
        };
        for item in batch_in {
            // the whole output is generated in this engine: the first token by
            // the prefill iteration, the rest by decode iterations
            let i = item.id as usize;
            rep.sched.enqueue(DecodeSeq {
                id: item.id,
                prompt_tokens: item.tokens,
                remaining: self.requests[i].output_tokens,
            });
        }
        let admitted = rep.sched.admit();
        let (batch, ctx) = rep.sched.step_shape();
        if batch == 0 {
            return;
        }
        let mut items = Vec::new();
        let mut seq_lens = Vec::new();
        for &id in &admitted {
            let i = id as usize;
            items.extend_from_slice(&self.tokens[i]);
            seq_lens.push(self.requests[i].prefill_tokens());
            rep.prefilling.push(i);
        }
        let t_enc = if items.is_empty() {
            0.0
        } else {
            self.cost.encode(&items, 1.0).t_gpu / self.tp as f64
        };
        for &id in &admitted {
            // encode runs first in the iteration; prefill follows on its embeddings
            let i = id as usize;
            if !self.tokens[i].is_empty() {
                self.records[i].encode_start = Some(now);
                self.records[i].encode_end = Some(now + t_enc);
                self.records[i].encode_batch = Some(admitted.len());
            }
            if !self.tokens[i].is_empty() {
                // multimodal: its embeddings are ready when the inline encode ends
                self.records[i].prefill_ready = Some(now + t_enc);
            }
            self.records[i].prefill_start = Some(now + t_enc);
        }
        if !items.is_empty() {
            self.passes += 1;
            self.encoded += admitted
                .iter()
                .filter(|&&id| !self.tokens[id as usize].is_empty())
                .count();
        }
        let t_prefill = if seq_lens.is_empty() {
            0.0
        } else {
            self.cost.prefill(&seq_lens, self.tp.into(), 1.0)
        };
        let dur = t_enc + t_prefill + self.cost.decode_step(batch, ctx, self.tp.into());
        rep.stepping = true;
        rep.step_start = now;
        for &g in &rep.gpus {
            self.meters[g as usize].begin(now);
            self.meters[g as usize].add_sm_time(dur);
        }
        self.events
            .push(now + dur, Priority::Completion, Event::StepDone(r));
    }

    fn finish(self) -> SimOutput {
        let (sc, n, tp) = (self.sc, self.replicas.len(), self.tp);
        let roles = (0..sc.gpus)
            .map(
                |g| match self.replicas.iter().position(|r| r.gpus.contains(&g)) {
                    Some(r) => ("aggregated".to_string(), format!("R{r}")),
                    None => ("idle".to_string(), "-".to_string()),
                },
            )
            .collect();
        let mut notes = self.cost.notes();
        notes.push(format!(
            "aggregated baseline: {n} replicas at TP{tp}, encode inline before prefill in each iteration (no separate per-pass encode overhead)"
        ));
        let mut out = assemble(
            sc,
            RunParts {
                deployment: format!("aggregated {n}×(TP{tp})"),
                records: self.records,
                finished: None,
                meters: self.meters,
                roles,
                encode: EncodeSummary {
                    passes: self.passes,
                    mean_batch: if self.passes > 0 {
                        self.encoded as f64 / self.passes as f64
                    } else {
                        0.0
                    },
                    batcher: None,
                    remote_fraction: 0.0,
                },
                notes,
                events: self.processed,
                max_sm_share_sum: 0.0,
                timeline: self.timeline,
            },
        );
        crate::verdict::name_bottleneck(sc, &*self.cost, None, sc.workload.rate, &mut out.report);
        out
    }
}
