//! Core sharing on one CPU host: the physics of a scenario on the `cpu`
//! device, where every CPU "GPU" is the same host of `C` cores
//! ([`Scenario::cpu_host_cores`]) and `easerve exec` runs every worker
//! process on it.
//!
//! A profile times each stage alone on an idle host. Each busy worker asks
//! the host for as many cores as it runs threads, by the executor's own rule
//! ([`easerve_sched::cpu`]): an encode pass at SM share `f` the
//! `round(f · threads)` threads of each of its ranks, its serial
//! preprocessing (the pass's host phase) one, a local prefill batch its
//! share of the host, a remote prefill batch, a decode run and an
//! aggregated replica's iteration every thread of each of their ranks.
//! While the busy demand `D` exceeds `C`, the host is a processor-sharing
//! server: every pass progresses at `C / D` of its profiled speed. The
//! rate changes whenever a unit of work starts or ends, and the work in
//! flight is then re-timed (encode host and device phases, prefill batches,
//! the iterations of decode runs priced ahead), keeping what it has done;
//! an aggregated replica's iteration is priced at the rate in force at its
//! start only. Pipelined preprocessing threads (`deployment.preprocess =
//! "pipelined"`, not the CPU default) are neither counted nor slowed.
//!
//! What `C / D` leaves out, and the executor has: the OS places threads,
//! not a fair share (pinned encode and local prefill cores, rayon's
//! spinning workers, a fork-join pass waiting for its slowest thread at
//! every join), the controller process's own CPU time, and a thread count
//! other than the profile's (a worker on fewer threads than the profile's
//! level runs at the profile's speed for its share).
//!
//! **The measured curve.** When the profile has a `[host_sharing]` table
//! (`easerve profile` measures it: the executor's passes timed alone and
//! with other busy worker processes, see `easerve_calib::HostSharing`)
//! measured on a host of the same `C` cores, the slowdown at demand `D` is
//! that curve instead of `D / C`: 1 up to `C`, piecewise linear in `D`
//! between its rows, beyond the last row the fair-share line scaled by the
//! last row's excess over it. A tensor-parallel decode worker's steps read
//! the curve's rank-group rows for its degree instead, where the profile
//! has them (its ranks timed as a group among the busy processes,
//! `HostSharing::slowdown_tp`). While no busy worker runs a pass on more
//! than one thread per rank, a one-rank pass reads the curve's one-thread
//! rows instead, where the profile has them (`D` one-thread processes busy
//! together, `HostSharing::slowdown_one_thread`: 1 for one process alone,
//! the interference below the core count measured rather than taken as
//! none). It carries what the list above leaves out,
//! as measured; the run's notes say which term priced the sharing, its
//! source, the mean and highest one-rank slowdown while any worker was
//! busy, and whether the KV landing on decode workers is priced (the
//! profile's `kv_land` table, added by the engine to the first iteration of
//! the run that first holds each sequence). A curve measured on another
//! core count is not used (its excess belongs to that host); the notes say
//! so.

use super::Sim;
use easerve_calib::HostSharing;
use easerve_sched::cpu::{self, CpuSlot};
use easerve_sched::{Topology, WorkerRef};
use easerve_workload::Scenario;

/// What the busy workers ask of the host: threads in all, and how many of
/// those workers run their pass on more than one thread per rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Busy {
    /// Threads the busy workers ask in all (each worker its ranks × its
    /// pass's threads).
    total: usize,
    /// Busy workers whose pass runs on more than one thread per rank.
    wide: usize,
}

/// How much slower a pass of a worker of `ranks` rank processes on a host
/// of `cores` cores runs while its busy workers ask `busy`: the measured
/// `curve` where given (a rank group's rows for `ranks` > 1 where it has
/// them, see [`HostSharing::slowdown_tp`]; its one-thread rows while no
/// busy worker runs a pass on more than one thread per rank, see
/// [`HostSharing::slowdown_one_thread`]), else 1 up to `cores`, then
/// `demand / cores` (processor sharing: each progresses at
/// `cores / demand` of its speed). Each row set prices the mix it was
/// measured with: when a wide pass starts, the one-rank passes go from the
/// one-thread rows to the main rows, which may read lower at the same
/// demand (on the 2-core VM the main rows read 1 at demand 2, the
/// executor's one-thread passes 1.09–1.20 by `calib refine
/// --sharing-from-run`).
fn sharing_slowdown(busy: Busy, cores: usize, curve: Option<&HostSharing>, ranks: usize) -> f64 {
    let demand = busy.total;
    if let Some(c) = curve {
        return match ranks {
            0 | 1 if busy.wide == 0 => c.slowdown_one_thread(demand as f64),
            0 | 1 => c.slowdown(demand as f64),
            r => c.slowdown_tp(r as u32, demand as f64),
        };
    }
    if demand <= cores {
        1.0
    } else {
        demand as f64 / cores.max(1) as f64
    }
}

/// The slowdown in force over the run: its integral over the time a
/// worker was busy, that time, the highest value and its demand.
#[derive(Default)]
struct SlowdownMeter {
    integral: f64,
    busy: f64,
    max: (f64, usize),
    since: f64,
}

/// The host's cores and what each worker asks of them.
pub(super) struct HostCores {
    /// `C`.
    cores: usize,
    /// Where `C` came from (for the notes).
    source: &'static str,
    /// Per worker, in the topology's order (encode, prefill, decode,
    /// replica): what the thread rule needs of it.
    slots: Vec<CpuSlot>,
    /// Its threads per rank.
    threads: Vec<usize>,
    /// Whether its process runs (threads of a spare started later are
    /// shared out among the running ones).
    running: Vec<bool>,
    /// Cores it asks now (0 when idle).
    demand: Vec<usize>,
    /// Where each stage's workers start in that order.
    base: [usize; 4],
    labels: Vec<String>,
    /// Sum of `demand`, and the busy workers whose passes run on more than
    /// one thread per rank.
    busy: Busy,
    /// The profile's measured curve, when it prices the sharing.
    curve: Option<HostSharing>,
    /// The rank counts of the topology's TP decode workers that the curve
    /// has rank-group rows for.
    groups: Vec<usize>,
    /// The rank counts of all its TP decode workers: their slowdown can
    /// change while a one-rank pass's does not (their rank-group rows, or
    /// the main rows while one-rank passes read the one-thread rows).
    tp_ranks: Vec<usize>,
    /// Per worker, the ranks its passes read the curve at: a decode
    /// worker's ranks (its steps are what the rank-group rows time), 1 for
    /// every other worker.
    curve_ranks: Vec<usize>,
    /// Why a profile's curve is not used (another core count).
    curve_unused: Option<String>,
    /// What the notes say of the KV landing on decode workers.
    landing: String,
    meter: SlowdownMeter,
}

impl HostCores {
    /// The host of `sc`'s workers, when it runs on the `cpu` device and its
    /// cores are known.
    pub(super) fn of(sc: &Scenario, topology: &Topology) -> Option<HostCores> {
        let (cores, source) = sc.cpu_host_cores()?;
        let cores = cores as usize;
        let slots: Vec<CpuSlot> = topology.workers().map(CpuSlot::of).collect();
        let ne = topology.encode().len();
        let np = ne + topology.prefill().len();
        let nd = np + topology.decode().len();
        let measured = sc.profile.as_ref().and_then(|p| p.host_sharing());
        let (curve, curve_unused) = match measured {
            Some(h) if h.cores as usize == cores => (Some(h.clone()), None),
            Some(h) => (None, Some(format!(
                "the profile's measured [host_sharing] curve is of a {}-core host, not used on {cores} cores",
                h.cores
            ))),
            None => (None, None),
        };
        let curve_ranks: Vec<usize> = (0..slots.len())
            .map(|k| {
                if (np..nd).contains(&k) {
                    slots[k].ranks
                } else {
                    1
                }
            })
            .collect();
        let mut groups: Vec<usize> = (curve_ranks.iter().copied())
            .filter(|&r| r > 1 && curve.as_ref().is_some_and(|c| c.has_tp(r as u32)))
            .collect();
        let decode_tps: Vec<f64> = slots[np..nd].iter().map(|s| s.ranks as f64).collect();
        let landing = landing_note(
            sc.profile.as_ref().and_then(|p| p.kv_land_table()),
            &decode_tps,
        );
        groups.sort_unstable();
        groups.dedup();
        // without a curve every rank count reads processor sharing alike
        let mut tp_ranks: Vec<usize> = (curve_ranks.iter().copied())
            .filter(|&r| r > 1 && curve.is_some())
            .collect();
        tp_ranks.sort_unstable();
        tp_ranks.dedup();
        Some(HostCores {
            cores,
            source,
            groups,
            tp_ranks,
            curve_ranks,
            landing,
            threads: cpu::worker_threads(&slots, cores, None),
            running: slots.iter().map(|s| !s.standby).collect(),
            demand: vec![0; slots.len()],
            labels: topology.workers().map(|w| w.label.clone()).collect(),
            slots,
            base: [0, ne, np, nd],
            busy: Busy::default(),
            curve,
            curve_unused,
            meter: SlowdownMeter::default(),
        })
    }

    fn index(&self, w: WorkerRef) -> usize {
        match w {
            WorkerRef::Encode(i) => self.base[0] + i,
            WorkerRef::Prefill(i) => self.base[1] + i,
            WorkerRef::Decode(i) => self.base[2] + i,
            WorkerRef::Replica(i) => self.base[3] + i,
        }
    }

    /// The slowdown a pass of a one-rank worker on the host runs at now.
    pub(super) fn slowdown(&self) -> f64 {
        sharing_slowdown(self.busy, self.cores, self.curve.as_ref(), 1)
    }

    /// The slowdown worker `w`'s passes run at while the busy workers ask
    /// `busy`: a TP > 1 decode worker's by the curve's rank-group rows,
    /// where it has them (they time a decode step), any other's by the
    /// main rows or the one-thread rows ([`sharing_slowdown`]).
    fn slowdown_at(&self, w: WorkerRef, busy: Busy) -> f64 {
        let ranks = self.curve_ranks[self.index(w)];
        sharing_slowdown(busy, self.cores, self.curve.as_ref(), ranks)
    }

    /// The slowdown worker `w`'s passes run at now.
    pub(super) fn slowdown_of(&self, w: WorkerRef) -> f64 {
        self.slowdown_at(w, self.busy)
    }

    /// Cores worker `w` asks while it runs a pass at SM share `share` on
    /// every thread of its ranks (`share` 1: all of them).
    pub(super) fn demand_at(&self, w: WorkerRef, share: f64) -> usize {
        let k = self.index(w);
        self.slots[k].ranks * cpu::pass_threads(self.threads[k], share)
    }

    /// Worker `w` now asks `demand` cores (at `now`, seconds); what the
    /// busy workers asked before, when that changed the slowdown of any
    /// worker.
    pub(super) fn set(&mut self, w: WorkerRef, demand: usize, now: f64) -> Option<Busy> {
        let k = self.index(w);
        let before = self.slowdown();
        let m = &mut self.meter;
        if self.busy.total > 0 {
            m.integral += before * (now - m.since);
            m.busy += now - m.since;
            if before > m.max.0 {
                m.max = (before, self.busy.total);
            }
        }
        m.since = now;
        let busy_before = self.busy;
        let ranks = self.slots[k].ranks;
        self.busy.total = self.busy.total - self.demand[k] + demand;
        self.busy.wide =
            self.busy.wide - usize::from(self.demand[k] > ranks) + usize::from(demand > ranks);
        self.demand[k] = demand;
        let curve = self.curve.as_ref();
        debug_assert_eq!(
            self.busy.wide,
            (0..self.demand.len())
                .filter(|&j| self.demand[j] > self.slots[j].ranks)
                .count()
        );
        let group_changed = self.tp_ranks.iter().any(|&r| {
            sharing_slowdown(busy_before, self.cores, curve, r)
                != sharing_slowdown(self.busy, self.cores, curve, r)
        });
        (self.slowdown() != before || group_changed).then_some(busy_before)
    }

    /// Worker `w`'s process starts (a planner's load): on the stopped
    /// worker `on`'s threads for a role change, else by the rule for a
    /// spare started beside the running workers.
    pub(super) fn started(&mut self, w: WorkerRef, on: Option<WorkerRef>) {
        let k = self.index(w);
        self.threads[k] = match on {
            Some(o) => self.threads[self.index(o)],
            None => {
                let running = (0..self.slots.len())
                    .filter(|&j| j != k && self.running[j])
                    .map(|j| (self.slots[j], self.threads[j]));
                cpu::start_threads(self.slots[k], running, self.cores)
            }
        };
        self.running[k] = true;
    }

    /// Worker `w`'s process stopped (drained, or died).
    pub(super) fn stopped(&mut self, w: WorkerRef) {
        let k = self.index(w);
        self.running[k] = false;
    }

    /// What the run's report says of the term.
    pub(super) fn note(&self) -> String {
        let threads: Vec<String> = self
            .labels
            .iter()
            .zip(&self.threads)
            .zip(&self.slots)
            .filter(|((_, _), s)| !s.standby)
            .map(|((l, t), s)| match s.ranks {
                1 => format!("{l} {t}"),
                r => format!("{l} {r}×{t}"),
            })
            .collect();
        let head = format!(
            "CPU host: {} cores shared by every worker ({}); threads per worker as `easerve exec` gives them without `--threads`: {}",
            self.cores,
            self.source,
            threads.join(", ")
        );
        let Some(c) = &self.curve else {
            let unused = (self.curve_unused.as_ref()).map_or(String::new(), |u| format!(" ({u})"));
            return format!(
                "{head}; while the busy workers ask more cores than that, every pass runs at cores/demand of its profiled speed (processor sharing, re-timed as work starts and ends){unused}; {}",
                self.landing
            );
        };
        let rows: Vec<String> = (c.rows().iter())
            .map(|(d, s)| format!("{d}:{s:.2}"))
            .collect();
        let m = &self.meter;
        let mean = if m.busy > 0.0 {
            m.integral / m.busy
        } else {
            1.0
        };
        let groups = match self.groups.is_empty() {
            true => String::new(),
            false => {
                let rows: Vec<String> = (c.tp_rows().into_iter())
                    .filter(|(t, _, _)| self.groups.contains(&(*t as usize)))
                    .map(|(t, d, s)| format!("{t}:{d}:{s:.2}"))
                    .collect();
                format!(
                    "; a tensor-parallel decode worker's steps by the curve's rank-group rows instead (tp:demand:slowdown {}; 1 up to the group alone, then as the curve)",
                    rows.join(" ")
                )
            }
        };
        let one = match c.one_thread_rows() {
            [] => String::new(),
            rows => {
                let rows: Vec<String> = rows.iter().map(|(d, s)| format!("{d}:{s:.2}")).collect();
                format!(
                    "; while no busy worker runs a pass on more than one thread per rank, by its one-thread rows instead (demand:slowdown {}; 1 for one process alone, linear between rows)",
                    rows.join(" ")
                )
            }
        };
        format!(
            "{head}; while the busy workers ask more threads than the cores, every pass runs slower by the profile's measured [host_sharing] curve (demand:slowdown {}; linear between rows, beyond the last the fair-share line times its excess; re-timed as work starts and ends){one}{groups}, measured by: {}; the one-rank slowdown while any worker was busy: mean {mean:.2}, highest {:.2} at demand {}; {}",
            rows.join(" "),
            c.method,
            m.max.0.max(1.0),
            m.max.1,
            self.landing
        )
    }
}

/// What the notes say of the KV landing on decode workers at TP `tps`
/// (their ranks) from the profile's `kv_land` table, where it has one.
fn landing_note(table: Option<&easerve_calib::profile::Table>, tps: &[f64]) -> String {
    let Some(t) = table else {
        return "KV landing on decode workers not priced (the profile has no kv_land table; `easerve profile --device cpu` measures one)".into();
    };
    let measured = &t.axes()[0];
    let missing: Vec<String> = (tps.iter())
        .filter(|tp| !measured.contains(tp))
        .map(|tp| format!("TP {tp}"))
        .collect();
    let held = match missing.is_empty() {
        true => String::new(),
        false => format!(
            " ({} not measured: read between, or held at the nearest of, the measured TP {measured:?})",
            missing.join(", ")
        ),
    };
    format!("KV landing on decode workers priced from the profile's kv_land table in the first iteration of the run that first holds each sequence{held}")
}

impl Sim<'_> {
    /// The host-core slowdown in force for a one-thread, one-rank phase
    /// (an encode pass's serial preprocessing; 1 off the `cpu` device).
    pub(super) fn host_slowdown(&self) -> f64 {
        self.host.as_ref().map_or(1.0, HostCores::slowdown)
    }

    /// The host-core slowdown in force for worker `w`'s passes (1 off the
    /// `cpu` device).
    pub(super) fn host_slowdown_of(&self, w: WorkerRef) -> f64 {
        self.host.as_ref().map_or(1.0, |h| h.slowdown_of(w))
    }

    /// Worker `w` now asks `demand` cores of the host: when that changes
    /// the rate of every pass on it, the work in flight is re-timed.
    pub(super) fn ask_cores(&mut self, w: WorkerRef, demand: usize) {
        let now = self.now;
        let Some(before) = self.host.as_mut().and_then(|h| h.set(w, demand, now)) else {
            return;
        };
        self.retime(before);
    }

    /// Worker `w` asks its cores for a pass at `share` (`None`: it is idle).
    pub(super) fn ask_cores_at(&mut self, w: WorkerRef, share: Option<f64>) {
        let demand = match (&self.host, share) {
            (Some(h), Some(s)) => h.demand_at(w, s),
            _ => 0,
        };
        self.ask_cores(w, demand);
    }

    /// The slowdown changed from the busy workers' demand `before`: every
    /// unit of work in flight on the host keeps what it has done and runs
    /// the rest at the new rate.
    fn retime(&mut self, before: Busy) {
        let now = self.now;
        let serial = self.host_slowdown();
        for w in 0..self.encode.len() {
            self.retime_host_phase(w, serial);
            self.rerate_encode(w);
        }
        for p in 0..self.prefill.len() {
            if let Some(share) = self.prefill[p].job.as_ref().map(|j| j.share) {
                self.rerate_prefill(p, share);
            }
        }
        for d in 0..self.decode.len() {
            let w = WorkerRef::Decode(d);
            let Some(h) = self.host.as_ref() else {
                return;
            };
            let (before, after) = (h.slowdown_at(w, before), h.slowdown_of(w));
            let worker = &mut self.decode[d];
            if worker.run.is_none() || before == after {
                continue;
            }
            for e in worker.ends.iter_mut().filter(|e| **e > now) {
                *e = now + (*e - now) * after / before;
            }
            worker.gen += 1;
            self.queue_decode_end(d);
        }
    }

    /// Re-time encode worker `w`'s pass while it is in its serial host
    /// phase (preprocessing on one thread) to slowdown `slow`.
    fn retime_host_phase(&mut self, w: usize, slow: f64) {
        let now = self.now;
        let worker = &mut self.encode[w];
        let Some(pass) = worker.pass.as_mut().filter(|p| !p.gpu_phase) else {
            return;
        };
        if !worker.pre_free.is_empty() {
            return;
        }
        pass.host_left = (pass.host_left - (now - pass.last_update) / pass.host_slow).max(0.0);
        pass.last_update = now;
        pass.host_slow = slow;
        worker.gen += 1;
        let at = (now + pass.host_left * slow).max(pass.fetch_end);
        let gen = worker.gen;
        self.events.push(
            at,
            crate::event::Priority::Completion,
            super::Ev::EncodeGpuPhase { worker: w, gen },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use easerve_sched::Event;

    #[test]
    fn passes_share_the_cores_they_ask_for() {
        let at = |total: usize| Busy { total, wide: 1 };
        assert_eq!(sharing_slowdown(at(1), 1, None, 1), 1.0);
        assert_eq!(sharing_slowdown(at(2), 1, None, 1), 2.0);
        assert_eq!(sharing_slowdown(at(2), 2, None, 1), 1.0);
        assert_eq!(sharing_slowdown(at(5), 2, None, 1), 2.5);
        assert_eq!(sharing_slowdown(at(0), 2, None, 1), 1.0);
        let curve = HostSharing::new(2, "m".into(), vec![(2.0, 1.0), (4.0, 3.0)]).unwrap();
        assert_eq!(sharing_slowdown(at(2), 2, Some(&curve), 1), 1.0);
        assert_eq!(sharing_slowdown(at(3), 2, Some(&curve), 1), 2.0);
        assert_eq!(sharing_slowdown(at(4), 2, Some(&curve), 1), 3.0);
        // one-thread rows: read while no busy pass is wider than a thread
        // per rank, the main rows otherwise
        let curve = curve
            .with_one_thread_rows(vec![(2.0, 1.25), (4.0, 2.5)])
            .unwrap();
        let narrow = |total: usize| Busy { total, wide: 0 };
        assert_eq!(sharing_slowdown(narrow(2), 2, Some(&curve), 1), 1.25);
        assert_eq!(sharing_slowdown(at(2), 2, Some(&curve), 1), 1.0);
        assert_eq!(sharing_slowdown(narrow(4), 2, Some(&curve), 1), 2.5);
        assert_eq!(sharing_slowdown(at(4), 2, Some(&curve), 1), 3.0);
        // without the curve, processor sharing either way
        assert_eq!(sharing_slowdown(narrow(2), 2, None, 1), 1.0);
    }

    /// `1E(TP1)+1P(TP1)+2D(TP1)` on a host of `cores` cores (each decode
    /// worker gets one thread there).
    fn two_decoders(cores: &str) -> Scenario {
        scenario_with(
            "cpu-image.toml",
            &[
                ("cluster.gpus", "4"),
                ("cluster.host_cores", cores),
                ("deployment.allocation", "1E(TP1)+1P(TP1)+2D(TP1)"),
                ("deployment.offload", "1.0"),
            ],
        )
    }

    /// A wide pass starting or ending moves the one-rank passes between the
    /// curve's one-thread rows and its main rows, and `set` reports the
    /// demand before each change that moved a slowdown.
    #[test]
    fn a_wide_pass_switches_the_one_rank_passes_to_the_main_rows() {
        let mut sc = two_decoders("2");
        let curve = HostSharing::new(2, "a test curve".into(), vec![(4.0, 3.0)])
            .unwrap()
            .with_one_thread_rows(vec![(2.0, 1.25), (4.0, 2.5)])
            .unwrap();
        let p = sc.profile.take().expect("a profile");
        sc.profile = Some(p.with_host_sharing(Some(curve)));
        let sim = Sim::new(&sc, sc.cost(), false);
        let mut h = HostCores::of(&sc, &sim.topology).expect("a CPU host");
        let (e0, d0, d1) = (
            WorkerRef::Encode(0),
            WorkerRef::Decode(0),
            WorkerRef::Decode(1),
        );
        assert_eq!(h.demand_at(e0, 1.0), 2, "the encode worker owns the host");
        assert_eq!(h.demand_at(e0, 0.5), 1);
        // one one-thread pass: 1
        assert_eq!(h.set(d0, 1, 0.0), None);
        // two: the one-thread rows' 1.25
        assert_eq!(h.set(d1, 1, 0.0), Some(Busy { total: 1, wide: 0 }));
        assert_eq!(h.slowdown_of(d0), 1.25);
        // an encode pass on both threads: demand 4 with a wide pass, the
        // main rows' 3 (the one-thread rows would read 2.5)
        assert_eq!(h.set(e0, 2, 1.0), Some(Busy { total: 2, wide: 0 }));
        assert_eq!(h.slowdown_of(d0), 3.0);
        // on one thread instead: demand 3, one-thread rows, 1.875
        assert_eq!(h.set(e0, 1, 2.0), Some(Busy { total: 4, wide: 1 }));
        assert!((h.slowdown_of(d1) - 1.875).abs() < 1e-12);
        assert_eq!(h.set(e0, 0, 3.0), Some(Busy { total: 3, wide: 0 }));
        assert_eq!(h.slowdown(), 1.25);
    }

    /// `scenarios/{file}` with `sets` as `--set` overrides.
    fn scenario_with(file: &str, sets: &[(&str, &str)]) -> Scenario {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../scenarios")
            .join(file);
        let sets: Vec<(String, String)> = (sets.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Scenario::load_with(&path, &sets, &Default::default()).expect("valid")
    }

    /// When each of the decode runs `(worker, start)` of 10 iterations
    /// (batch 1, context 64) ends, with nothing else on the host.
    fn run_ends(sc: &Scenario, runs: &[(usize, f64)]) -> Vec<f64> {
        let mut sim = Sim::new(sc, sc.cost(), false);
        let mut starts: Vec<(f64, usize)> = runs.iter().map(|&(d, t)| (t, d)).collect();
        starts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut ends = vec![f64::NAN; sim.decode.len()];
        let mut next = starts.into_iter().peekable();
        loop {
            let due = next.peek().map_or(f64::INFINITY, |s| s.0);
            match sim.events.pop_until(due) {
                Some((t, ev)) => {
                    sim.now = t;
                    if let Some(Event::DecodeRunDone { worker, .. }) = sim.on_event(ev) {
                        ends[worker] = t;
                    }
                }
                None => match next.next() {
                    Some((t, d)) => {
                        sim.now = t;
                        sim.start_decode_run(d, 1, 64, 10);
                    }
                    None => break,
                },
            }
        }
        runs.iter().map(|&(d, _)| ends[d]).collect()
    }

    /// The sharing term: a run alone takes its profiled time; two started
    /// together on a 1-core host each take twice as long (on 2 cores, as
    /// long as alone); one that joins halfway slows the other's second
    /// half, and runs its own first half at half speed.
    #[test]
    fn two_passes_started_together_on_one_core_take_twice_as_long() {
        let one = two_decoders("1");
        let alone = run_ends(&one, &[(0, 0.0)])[0];
        let mut profiled = Vec::new();
        one.cost()
            .decode_steps(1, 64, easerve_model::Parallel::new(1, 1), 10, &mut profiled);
        let t: f64 = profiled.iter().sum();
        assert!((alone - t).abs() < 1e-12, "{alone} {t}");
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9 * b;
        let both = run_ends(&one, &[(0, 0.0), (1, 0.0)]);
        assert!(
            close(both[0], 2.0 * t) && close(both[1], 2.0 * t),
            "{both:?} {t}"
        );
        let two = run_ends(&two_decoders("2"), &[(0, 0.0), (1, 0.0)]);
        assert!(close(two[0], t) && close(two[1], t), "{two:?} {t}");
        let late = run_ends(&one, &[(0, 0.0), (1, t / 2.0)]);
        assert!(close(late[0], 1.5 * t), "{late:?} {t}");
        assert!(close(late[1], 2.0 * t), "{late:?} {t}"); // the report names the host, its source and the threads
        let mut small = one.clone();
        small.workload.requests = 4;
        let notes = crate::engine::simulate(&small).report.notes;
        let note = notes.iter().find(|n| n.starts_with("CPU host: 1 cores"));
        let note = note.expect("a CPU host note");
        assert!(
            note.contains("cluster.host_cores") && note.contains("D1 1"),
            "{note}"
        );
    }

    /// The measured curve: where the profile has a `[host_sharing]` table
    /// of a host of the scenario's cores, two runs started together on one
    /// core take the curve's slowdown at demand 2 (3×), not cores/demand
    /// (2×); a curve of another core count is left out, and the notes say
    /// which term priced the sharing.
    #[test]
    fn a_measured_curve_replaces_fair_share_on_a_host_of_its_cores() {
        let with_curve = |cores: u32| {
            let mut sc = two_decoders("1");
            let curve = HostSharing::new(cores, "a test curve".into(), vec![(2.0, 3.0)]).unwrap();
            let p = sc.profile.take().expect("a profile");
            sc.profile = Some(p.with_host_sharing(Some(curve)));
            sc
        };
        let sc = with_curve(1);
        let alone = run_ends(&sc, &[(0, 0.0)])[0];
        let both = run_ends(&sc, &[(0, 0.0), (1, 0.0)]);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9 * b;
        assert!(
            close(both[0], 3.0 * alone) && close(both[1], 3.0 * alone),
            "{both:?} {alone}"
        );
        let other = with_curve(2);
        let both = run_ends(&other, &[(0, 0.0), (1, 0.0)]);
        assert!(close(both[0], 2.0 * alone), "{both:?} {alone}");
        let note = |sc: &Scenario| {
            let mut small = sc.clone();
            small.workload.requests = 4;
            let notes = crate::engine::simulate(&small).report.notes;
            notes
                .into_iter()
                .find(|n| n.starts_with("CPU host:"))
                .expect("a CPU host note")
        };
        let n = note(&sc);
        assert!(
            n.contains("[host_sharing] curve (demand:slowdown 2:3.00")
                && n.contains("a test curve")
                && n.contains("slowdown while any worker was busy"),
            "{n}"
        );
        let n = note(&other);
        assert!(
            n.contains("cores/demand") && n.contains("of a 2-core host, not used on 1 cores"),
            "{n}"
        );
    }

    /// Rank groups: a profile whose curve has TP 2 rows prices a TP 2
    /// worker's passes by them where the main curve (one-rank workers)
    /// has none; the notes give the rows.
    #[test]
    fn a_tensor_parallel_worker_runs_at_its_rank_group_rows() {
        let base = scenario_with(
            "cpu-image-tp2.toml",
            &[
                ("cluster.gpus", "6"),
                ("cluster.host_cores", "2"),
                ("deployment.allocation", "1E(TP1)+1P(TP1)+2D(TP2)"),
            ],
        );
        let with_rows = |tp_rows: &[(u32, f64, f64)]| {
            let mut sc = base.clone();
            // one-rank workers: no slowdown up to demand 4
            let curve = HostSharing::new(2, "a test curve".into(), vec![(4.0, 1.0)])
                .unwrap()
                .with_tp_rows(tp_rows)
                .unwrap();
            let p = sc.profile.take().expect("a profile");
            sc.profile = Some(p.with_host_sharing(Some(curve)));
            sc
        };
        let grouped = with_rows(&[(2, 4.0, 2.0), (2, 6.0, 3.0)]);
        let plain = with_rows(&[]);
        let sim = Sim::new(&grouped, grouped.cost(), false);
        let mut h = HostCores::of(&grouped, &sim.topology).expect("a CPU host");
        let (d0, d1) = (WorkerRef::Decode(0), WorkerRef::Decode(1));
        assert_eq!(h.demand_at(d0, 1.0), 2, "two ranks of one thread");
        assert_eq!(h.set(d1, 2, 0.0), None, "the group alone: 1");
        assert_eq!(h.slowdown_of(d1), 1.0);
        assert_eq!(h.set(d0, 2, 0.0), Some(Busy { total: 2, wide: 0 }));
        assert_eq!((h.slowdown_of(d0), h.slowdown_of(d1)), (2.0, 2.0));
        assert_eq!(h.slowdown(), 1.0, "a one-rank worker at demand 4");
        // in a run: two groups started together each take twice as long
        let alone = run_ends(&grouped, &[(0, 0.0)])[0];
        assert_eq!(alone, run_ends(&plain, &[(0, 0.0)])[0]);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9 * b;
        let both = run_ends(&grouped, &[(0, 0.0), (1, 0.0)]);
        assert!(
            close(both[0], 2.0 * alone) && close(both[1], 2.0 * alone),
            "{both:?} {alone}"
        );
        let both = run_ends(&plain, &[(0, 0.0), (1, 0.0)]);
        assert!(
            close(both[0], alone) && close(both[1], alone),
            "{both:?} {alone}"
        );
        let mut small = grouped.clone();
        small.workload.requests = 4;
        let notes = crate::engine::simulate(&small).report.notes;
        let n = notes
            .iter()
            .find(|n| n.starts_with("CPU host:"))
            .expect("a note");
        assert!(
            n.contains("rank-group rows") && n.contains("2:4:2.00 2:6:3.00"),
            "{n}"
        );
    }

    /// The KV landing: with a `kv_land` table every sequence's decode pays
    /// its landing (10 ms here) once, in the first iteration of the run that
    /// first holds it, and the notes say whether it is priced.
    #[test]
    fn a_decode_run_pays_the_landing_of_the_caches_it_first_holds() {
        let mut sc = scenario_with("cpu-image-tp2.toml", &[]);
        sc.workload.requests = 12;
        let p = sc.profile.take().expect("a profile");
        let rows: Vec<Vec<f64>> = [1.0, 2.0]
            .iter()
            .flat_map(|&tp| [64.0, 4096.0].map(|n| vec![tp, n, 0.01, 0.01]))
            .collect();
        let mut with = sc.clone();
        with.profile = Some(p.clone().with_kv_land(rows).expect("valid rows"));
        sc.profile = Some(p);
        let decode_s = |sc: &Scenario| {
            let out = crate::engine::simulate(sc);
            let total: f64 = (out.records.iter())
                .map(|r| r.finish.get().unwrap() - r.decode_start.get().unwrap())
                .sum();
            let note = (out.report.notes.iter())
                .find(|n| n.starts_with("CPU host:"))
                .expect("a note")
                .clone();
            (total, note)
        };
        let (without, n0) = decode_s(&sc);
        let (landed, n1) = decode_s(&with);
        assert!(
            n0.contains("KV landing on decode workers not priced"),
            "{n0}"
        );
        assert!(
            n1.contains("priced from the profile's kv_land table"),
            "{n1}"
        );
        // each of the 12 sequences waits for its own landing at least
        assert!(landed - without >= 12.0 * 0.01 * 0.99, "{landed} {without}");
    }
}
