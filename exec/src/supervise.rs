//! Supervision of the worker processes, for `easerve exec` and `easerve
//! serve` alike: what the controller's [`Command::Restart`] means here (a new
//! process after the backoff, connecting to the same listener), heartbeats
//! (a worker silent for [`SILENT_S`] is killed and failed), the rejoin once
//! the new process has loaded its model ([`Event::WorkerLoaded`]), and the
//! last [`STDERR_LINES`] lines of each worker's stderr for the report and the
//! failed requests' messages.
//!
//! When to restart, and what becomes of a dead worker's requests, is the
//! controller's (`easerve_sched::controller`, `supervision.rs`); this module
//! only carries it out. No clock of its own: `now` (seconds since the run
//! started) comes from the driver loop.
//!
//! [`Command::Restart`]: easerve_sched::Command::Restart
//! [`Event::WorkerLoaded`]: easerve_sched::Event::WorkerLoaded

use crate::run::{reader, sigkill, worker_command, ExecOptions, Incoming, Pool, WorkerProcess};
use crate::wire::{encode_frame, read_frame_async, write_bytes_async, FromWorker, ToWorker};
use easerve_sched::WorkerRef;
use easerve_workload::Scenario;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// Seconds between two heartbeats ([`ToWorker::Ping`]) to each live worker.
pub const HEARTBEAT_S: f64 = 1.0;

/// Seconds of silence (no frame at all, heartbeat answers included) after
/// which a live worker is taken for dead: five heartbeats. A worker answers
/// from its receiver thread whatever it computes, so only a hung or stopped
/// process stays silent; five missed beats leave room for a host whose cores
/// are all busy (the 2-core CI machine) without taking a slow worker for a
/// dead one.
pub const SILENT_S: f64 = 5.0;

/// Lines of a worker's stderr kept for the report and the failed requests'
/// messages.
pub const STDERR_LINES: usize = 20;

/// What it takes to start a worker again: the scenario, the options, the
/// controller's listener address, and each worker's threads and whether it
/// shares its GPU with a local prefill worker.
pub(crate) struct SpawnSpec {
    pub(crate) sc: Scenario,
    pub(crate) opts: ExecOptions,
    pub(crate) addr: SocketAddr,
    pub(crate) local_peer: Vec<bool>,
}

/// The supervision state of a [`Pool`]: per worker, its incarnation, its
/// restart in progress, when it was last heard, its stderr tail.
pub(crate) struct Supervisor {
    spec: Option<SpawnSpec>,
    /// Incarnation of each worker (0 for the first process); shared with the
    /// acceptor task, which tags the connections it accepts.
    pub(crate) gens: Arc<Vec<AtomicU32>>,
    /// Restarts asked for and not begun: (pool index, when, seconds).
    due: Vec<(usize, f64)>,
    /// Per worker: when its restart began (a process started, not yet ready).
    restarting: Vec<Option<f64>>,
    /// Per worker: the writer of a restarted process that connected but is
    /// not ready yet.
    joining: Vec<Option<mpsc::UnboundedSender<Vec<u8>>>>,
    /// Per worker: when it was last heard from, seconds.
    last_heard: Vec<f64>,
    next_ping: f64,
    /// Per worker: its last lines of stderr (and error frames), oldest first.
    pub(crate) stderr: Vec<VecDeque<String>>,
}

impl Supervisor {
    /// Supervision of `n` workers, first incarnations, none restarting;
    /// `spec` is how to restart them (`None`: restarts do nothing, for the
    /// tests' fake workers).
    pub(crate) fn new(n: usize, spec: Option<SpawnSpec>) -> Supervisor {
        Supervisor {
            spec,
            gens: Arc::new((0..n).map(|_| AtomicU32::new(0)).collect()),
            due: Vec::new(),
            restarting: vec![None; n],
            joining: vec![None; n],
            last_heard: vec![0.0; n],
            next_ping: HEARTBEAT_S,
            stderr: vec![VecDeque::new(); n],
        }
    }

    /// Keep `line` as worker `k`'s latest stderr line.
    pub(crate) fn stderr_line(&mut self, k: usize, line: String) {
        let tail = &mut self.stderr[k];
        if tail.len() == STDERR_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    }

    /// Worker `k` said something at `now`.
    pub(crate) fn heard(&mut self, k: usize, now: f64) {
        self.last_heard[k] = now;
    }

    /// Worker `k` is to be started again at `at` (seconds).
    pub(crate) fn restart_at(&mut self, k: usize, at: f64) {
        self.due.push((k, at));
    }

    /// When the next restart is due, if one is.
    pub(crate) fn next_restart(&self) -> Option<f64> {
        self.due.iter().map(|d| d.1).reduce(f64::min)
    }

    /// When the loop must wake for supervision: a restart due or the next
    /// heartbeat.
    pub(crate) fn wake_at(&self) -> f64 {
        self.next_restart()
            .map_or(self.next_ping, |t| t.min(self.next_ping))
    }

    /// The CPU threads `--threads` gives every worker, if given.
    pub(crate) fn fixed_threads(&self) -> Option<usize> {
        self.spec.as_ref().and_then(|s| s.opts.threads)
    }

    /// Worker `k`'s current incarnation.
    pub(crate) fn gen(&self, k: usize) -> u32 {
        self.gens[k].load(Ordering::SeqCst)
    }

    /// Whether incarnation `gen` of worker `k` is its current one.
    pub(crate) fn current(&self, k: usize, gen: u32) -> bool {
        self.gens[k].load(Ordering::SeqCst) == gen
    }

    /// A restarted worker `k` connected: its writer waits for its `Ready`.
    pub(crate) fn joined(&mut self, k: usize, tx: mpsc::UnboundedSender<Vec<u8>>) {
        if self.restarting[k].is_some() {
            self.joining[k] = Some(tx);
        }
    }

    /// Worker `k` said `Ready` at `now`: if it was restarting, its writer
    /// (to make its connection live) and the seconds since its restart began.
    pub(crate) fn ready(
        &mut self,
        k: usize,
        now: f64,
    ) -> Option<(mpsc::UnboundedSender<Vec<u8>>, f64)> {
        let began = self.restarting[k].take()?;
        self.last_heard[k] = now;
        let tx = self.joining[k].take()?;
        Some((tx, now - began))
    }

    /// Incarnation `gen` of worker `k` ended: whether it was a restart in
    /// progress (then the restart failed).
    pub(crate) fn restart_failed(&mut self, k: usize) -> bool {
        self.joining[k] = None;
        self.restarting[k].take().is_some()
    }

    /// Worker `k`'s stderr tail, oldest first.
    pub(crate) fn tail(&self, k: usize) -> Vec<String> {
        self.stderr[k].iter().cloned().collect()
    }
}

impl Pool {
    /// Supervision at `now`: start the restarts that are due, send the
    /// heartbeats, kill a live worker silent for [`SILENT_S`], a restart
    /// not ready within the startup timeout, and a worker told to stop that
    /// has not exited within [`crate::plan::STOP_GRACE_S`] (its exit then
    /// comes as its end, which the planner takes). What comes of it (a process
    /// that cannot start, a silent worker's end) is returned as the worker's
    /// end, for the loop to hear.
    pub(crate) fn supervise(&mut self, now: f64) -> Vec<Incoming> {
        let (_, mut ends) = self.start_due_restarts(now);
        let startup = self
            .sup
            .spec
            .as_ref()
            .map_or(f64::INFINITY, |s| s.opts.startup_timeout_s.max(1.0));
        for w in &mut self.workers {
            let Some(stop) = w.stop.as_mut() else {
                continue;
            };
            if !stop.exited && !stop.killed && now - stop.at > crate::plan::STOP_GRACE_S {
                stop.killed = true;
                if let Some(pid) = w.pid {
                    sigkill(pid);
                }
            }
        }
        for k in 0..self.workers.len() {
            let w = &self.workers[k];
            let live = self.live.is_alive(w.wref);
            let silent = now - self.sup.last_heard[k];
            let stuck = self.sup.restarting[k].is_some_and(|t| now - t > startup);
            if (live && w.tx.is_some() && silent > SILENT_S) || stuck {
                if let Some(pid) = w.pid {
                    sigkill(pid);
                }
                let gen = self.sup.gens[k].load(Ordering::SeqCst);
                let why = if stuck {
                    format!("its restart was not ready within {startup:.0} s")
                } else {
                    format!(
                        "stopped answering heartbeats: silent for {silent:.1} s (more than {SILENT_S} s; killed)"
                    )
                };
                ends.push(Incoming::Down(k, gen, why));
            }
        }
        if now >= self.sup.next_ping {
            self.sup.next_ping = now + HEARTBEAT_S;
            if let Ok(frame) = encode_frame(&ToWorker::Ping) {
                for w in &self.workers {
                    if let Some(tx) = &w.tx {
                        let _ = tx.send(frame.clone());
                    }
                }
            }
        }
        ends
    }

    /// Start the restarts due by `now`: the workers whose new incarnation
    /// began, and the ends of those that could not start.
    pub(crate) fn start_due_restarts(&mut self, now: f64) -> (Vec<usize>, Vec<Incoming>) {
        let due: Vec<usize> = {
            let s = &mut self.sup;
            let (now_due, later): (Vec<_>, Vec<_>) = s.due.drain(..).partition(|d| d.1 <= now);
            s.due = later;
            now_due.into_iter().map(|d| d.0).collect()
        };
        let (mut started, mut ends) = (Vec::new(), Vec::new());
        for k in due {
            match self.respawn(k, now) {
                Ok(()) => started.push(k),
                Err(why) => {
                    let gen = self.sup.gens[k].load(Ordering::SeqCst);
                    ends.push(Incoming::Down(k, gen, why));
                }
            }
        }
        (started, ends)
    }

    /// Start a new process for worker `k` (its next incarnation), which
    /// connects to the controller's listener; `Err` with why when it cannot
    /// be started. Without a [`SpawnSpec`] (the tests' fake workers) only
    /// the incarnation begins: the fakes connect and say `Ready` themselves.
    fn respawn(&mut self, k: usize, now: f64) -> Result<(), String> {
        let gen = self.sup.gens[k].fetch_add(1, Ordering::SeqCst) + 1;
        self.sup.restarting[k] = Some(now);
        let Some(spec) = &self.sup.spec else {
            return Ok(());
        };
        let w = &mut self.workers[k];
        let mut cmd = worker_command(
            &spec.sc,
            &spec.opts,
            w,
            self.threads[k],
            spec.local_peer[k],
            spec.addr,
        );
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("its restart could not start a process: {e}"))?;
        w.pid = child.id();
        watch_child(k, gen, &mut child, &self.tx);
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let why = match child.wait().await {
                Ok(status) => format!("process exited ({status})"),
                Err(e) => format!("process lost: {e}"),
            };
            let _ = tx.send(Incoming::Down(k, gen, why));
        });
        Ok(())
    }
}

/// Hand worker `k`'s stderr lines (incarnation `gen`) to the loop as they come.
pub(crate) fn watch_child(
    k: usize,
    _gen: u32,
    child: &mut tokio::process::Child,
    tx: &mpsc::UnboundedSender<Incoming>,
) {
    if let Some(err) = child.stderr.take() {
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(err).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                let _ = tx.send(Incoming::Stderr(k, l));
            }
        });
    }
}

/// Accept restarted workers' connections for the rest of the run: each says
/// hello, gets its writer task and reader (tagged with its incarnation), and
/// is handed to the loop ([`Incoming::Joined`]).
pub(crate) fn accept_restarts(
    listener: TcpListener,
    workers: &[WorkerProcess],
    gens: Arc<Vec<AtomicU32>>,
    tx: mpsc::UnboundedSender<Incoming>,
) {
    let by_ref: HashMap<WorkerRef, usize> = workers
        .iter()
        .enumerate()
        .map(|(k, w)| (w.wref, k))
        .collect();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let (mut rd, mut wr) = stream.into_split();
            let hello = tokio::time::timeout(
                Duration::from_secs(30),
                read_frame_async::<_, FromWorker>(&mut rd),
            )
            .await;
            let Ok(Ok(Some(FromWorker::Hello { role, index, .. }))) = hello else {
                continue;
            };
            let Some(&k) = by_ref.get(&crate::run::role_ref(role, index)) else {
                continue;
            };
            let gen = gens[k].load(Ordering::SeqCst);
            let (wtx, mut wrx) = mpsc::unbounded_channel::<Vec<u8>>();
            tokio::spawn(async move {
                while let Some(frame) = wrx.recv().await {
                    if write_bytes_async(&mut wr, &frame).await.is_err() {
                        break;
                    }
                }
            });
            tokio::spawn(reader(k, gen, rd, tx.clone()));
            if tx.send(Incoming::Joined(k, gen, wtx)).is_err() {
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stderr_tail_keeps_the_last_lines() {
        let mut s = Supervisor::new(1, None);
        for i in 0..25 {
            s.stderr_line(0, format!("line {i}"));
        }
        let tail = s.tail(0);
        assert_eq!(tail.len(), STDERR_LINES);
        assert_eq!(tail.first().map(String::as_str), Some("line 5"));
        assert_eq!(tail.last().map(String::as_str), Some("line 24"));
    }
}
