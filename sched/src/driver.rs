//! One way to drive a [`Controller`]: the call order of its contract and the
//! bookkeeping every driver keeps beside it, in one place.
//!
//! Four drivers run the controller: the simulator (`easerve-sim`, a
//! discrete-event clock), `harness::Cluster` (fake workers on a virtual
//! clock, for tests), `easerve exec` and `easerve serve` (worker processes
//! over sockets, on the wall clock). Each is a [`Driver`]: it says which
//! inputs are due and carries out commands; [`instant`] does the rest, in the
//! contract's order (the controller's module doc, "Call order"):
//!
//! 1. every input due at `now` ([`Driver::next_due`]) goes to
//!    [`Controller::handle`], and the commands it gives are drained with
//!    [`Controller::poll_command`] into [`Driver::carry_out`] before the next
//!    input (an input a command makes due at once, such as a transfer to a
//!    dead worker, is one of them);
//! 2. when none is left, [`Controller::handle_timeout`] if the controller's
//!    timer is due (at or before `now`), and its commands are drained; then 1
//!    again, since a command may have made an input due;
//! 3. the answer is [`Controller::poll_timeout`], the time to wake the
//!    controller next.
//!
//! A driver on a virtual clock (the simulator, `harness::Cluster`) also says
//! when its next input is due ([`VirtualClock`]); [`step`] then advances the
//! clock to the earlier of that and the controller's timer and runs that
//! instant. At one instant the timer therefore goes after every input due
//! then. A driver on the wall clock (the executor) sleeps until an input comes
//! or the timer is due, and calls [`instant`] with the time it woke.
//!
//! Beside the order: [`Liveness`] (which workers died: a transfer to a dead
//! worker lands at once, as the contract asks) and [`SerialLink`] (a link that
//! carries one transfer at a time).
//!
//! Nothing here has a clock or does I/O: every time is an argument, in
//! seconds since the start of the run (`f64`).

use crate::{Command, Controller, Event, WorkerRef};

/// A driver's side of the controller contract: what is due, and what a
/// command does. [`instant`] calls these in the contract's order.
pub trait Driver {
    /// The controller driven.
    fn controller(&mut self) -> &mut Controller;

    /// The next input due at `now` (seconds), after the driver did what its
    /// coming due means to it (the simulator's physics, the executor's next
    /// decode iteration), or `None` when nothing more is due at `now`. The
    /// driver orders same-instant inputs (the simulator: completions, then
    /// transfers, then arrivals) and skips inputs that no longer apply (the
    /// end of work a fault lost).
    fn next_due(&mut self, now: f64) -> Option<Event>;

    /// Carry out `cmd` at `now` (seconds). What comes of it is reported later
    /// by [`Driver::next_due`]; a landing that happens at once (a transfer to
    /// a dead worker) is due at `now`.
    fn carry_out(&mut self, now: f64, cmd: Command);

    /// The controller has just heard the input [`Driver::next_due`] returned
    /// last; its commands are not carried out yet. Nothing by default.
    fn heard(&mut self, _now: f64) {}

    /// The commands of that input have all been carried out. Nothing by default.
    fn settled(&mut self, _now: f64) {}

    /// [`Controller::handle_timeout`] is about to be called at `now`. Nothing
    /// by default.
    fn timing_out(&mut self, _now: f64) {}
}

/// Run the instant `now` (seconds) of driver `d` in the contract's order
/// (module doc): every input due, each followed by its commands, then the
/// controller's timer if it is due, until nothing is left at `now`. Returns
/// the controller's next wake-up time ([`Controller::poll_timeout`]).
pub fn instant<D: Driver + ?Sized>(d: &mut D, now: f64) -> Option<f64> {
    loop {
        while let Some(event) = d.next_due(now) {
            d.controller().handle(now, event);
            d.heard(now);
            drain(d, now);
            d.settled(now);
        }
        let timer = d.controller().poll_timeout();
        if !timer.is_some_and(|t| t <= now) {
            return timer;
        }
        d.timing_out(now);
        d.controller().handle_timeout(now);
        drain(d, now);
    }
}

/// Carry out every command the controller has, in order.
fn drain<D: Driver + ?Sized>(d: &mut D, now: f64) {
    while let Some(cmd) = d.controller().poll_command() {
        d.carry_out(now, cmd);
    }
}

/// A [`Driver`] on a virtual clock: it knows when its next input is due.
pub trait VirtualClock: Driver {
    /// The current time, seconds.
    fn now(&self) -> f64;
    /// Move the clock to `t` (never back: [`step`] passes the later of `t`
    /// and [`VirtualClock::now`]).
    fn set_now(&mut self, t: f64);
    /// When the next input is due (seconds), if any is coming.
    fn next_input(&self) -> Option<f64>;
}

/// Advance `d`'s clock to its next instant, the earlier of its next input
/// and the controller's timer (an input and a timer at the same time share
/// the instant, the input first), and run it ([`instant`]). Returns false,
/// doing nothing, when neither is coming.
pub fn step<D: VirtualClock + ?Sized>(d: &mut D) -> bool {
    let timer = d.controller().poll_timeout();
    advance(d, timer).is_some()
}

/// Run `d` until nothing is left to do ([`step`] until it returns false).
pub fn run<D: VirtualClock + ?Sized>(d: &mut D) {
    let mut timer = d.controller().poll_timeout();
    while let Some(next) = advance(d, timer) {
        timer = next;
    }
}

/// [`step`] with the controller's timer known: `None` when nothing is
/// coming, else the timer after the instant run.
fn advance<D: VirtualClock + ?Sized>(d: &mut D, timer: Option<f64>) -> Option<Option<f64>> {
    let next = match (d.next_input(), timer) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b)?,
    };
    let now = next.max(d.now());
    d.set_now(now);
    Some(instant(d, now))
}

/// Which workers a driver has seen die (an injected fault, a process that
/// exited, a socket that closed). A command to a dead worker is not carried
/// out: a transfer to it lands at once, so that the controller fails its
/// requests and frees the sender's slot (the contract's rule for
/// [`Command::Embeddings`] and [`Command::Kv`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Liveness {
    /// Dead workers, in the order they died (few: a list beats a set).
    dead: Vec<WorkerRef>,
}

impl Liveness {
    /// Every worker alive.
    pub fn new() -> Liveness {
        Liveness::default()
    }

    /// Worker `w` died. Returns whether this is news (false when it was known
    /// dead already: a second report of the same death is ignored).
    #[inline]
    pub fn kill(&mut self, w: WorkerRef) -> bool {
        if self.dead.contains(&w) {
            return false;
        }
        self.dead.push(w);
        true
    }

    /// Worker `w` is back (restarted and loaded). Returns whether it was dead.
    pub fn revive(&mut self, w: WorkerRef) -> bool {
        let before = self.dead.len();
        self.dead.retain(|x| *x != w);
        self.dead.len() != before
    }

    /// Whether worker `w` is alive.
    #[inline]
    pub fn is_alive(&self, w: WorkerRef) -> bool {
        !self.dead.contains(&w)
    }

    /// The dead workers, in the order they died.
    pub fn dead(&self) -> &[WorkerRef] {
        &self.dead
    }

    /// Whether the transfer `cmd` lands at once, with no time on a link:
    /// embeddings bound for the co-located local prefill worker (they stay in
    /// the encode GPU's memory) or for a dead worker, and a KV cache bound
    /// for a dead worker. False for every other command.
    #[inline]
    pub fn lands_at_once(&self, cmd: &Command) -> bool {
        match *cmd {
            Command::Embeddings { to, local, .. } => {
                local || !self.is_alive(WorkerRef::Prefill(to))
            }
            Command::Kv { to, .. } => !self.is_alive(WorkerRef::Decode(to)),
            _ => false,
        }
    }
}

/// One direction of a link that carries one transfer at a time: a transfer
/// asked for at `now` starts when the link is free, `max(now, free_at)`, and
/// holds it for its duration. Times in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SerialLink {
    free_at: f64,
}

impl SerialLink {
    /// A transfer of `dur` seconds asked for at `now`: `(start, end)`, and the
    /// link is busy until `end`.
    #[inline]
    pub fn send(&mut self, now: f64, dur: f64) -> (f64, f64) {
        let start = self.free_at.max(now);
        self.free_at = start + dur;
        (start, self.free_at)
    }

    /// When the link is free for the next transfer, seconds.
    pub fn free_at(&self) -> f64 {
        self.free_at
    }
}

/// What each unit of work took, seconds, per worker in the order the worker
/// started it: what one driver's workers took (the simulator's, with
/// `SimOptions::service_log`), for another driver with fake workers to hand
/// back and make the same run (`harness::Replay`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceLog {
    /// Per encode worker, per pass: (host phase, GPU phase as it ran, with
    /// every re-rating). A pass lost to a fault is missing.
    pub encode: Vec<Vec<(f64, f64)>>,
    /// Per prefill worker, per batch, as it ran (re-ratings included).
    pub prefill: Vec<Vec<f64>>,
    /// Per decode worker, per iteration begun (one cut off by a fault included).
    pub decode: Vec<Vec<f64>>,
    /// Per encode worker, per remote envelope: time on the link.
    pub embeddings: Vec<Vec<f64>>,
    /// With the shared encoder-output store on, per encode worker, per
    /// pass ended: its write to the store, (seconds after the pass ended
    /// that the store's link was free for it, seconds it held the worker's
    /// link); `(0, 0)` for none or one over the NICs.
    pub store_writes: Vec<Vec<(f64, f64)>>,
    /// Per prefill worker, per KV cache: time on the link.
    pub kv: Vec<Vec<f64>>,
    /// Per front-end preprocessing, in the order they started (the
    /// aggregated system).
    pub front_end: Vec<f64>,
    /// Per aggregated replica, per iteration: (its inline encode, the whole
    /// iteration).
    pub replica: Vec<Vec<(f64, f64)>>,
}

impl ServiceLog {
    /// An empty log for the workers of `t`.
    pub fn new(t: &crate::Topology) -> ServiceLog {
        let (encode, prefill) = (t.encode().len(), t.prefill().len());
        ServiceLog {
            encode: vec![Vec::new(); encode],
            prefill: vec![Vec::new(); prefill],
            decode: vec![Vec::new(); t.decode().len()],
            embeddings: vec![Vec::new(); encode],
            store_writes: vec![Vec::new(); encode],
            kv: vec![Vec::new(); prefill],
            front_end: Vec::new(),
            replica: vec![Vec::new(); t.replica().len()],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::small_controller;

    /// A driver whose inputs are a list of (time, event) and whose commands
    /// are only recorded: what the order of one instant looks like from the
    /// driver's side.
    struct Script {
        ctrl: Controller,
        now: f64,
        inputs: Vec<(f64, Event)>,
        calls: Vec<String>,
    }

    impl Driver for Script {
        fn controller(&mut self) -> &mut Controller {
            &mut self.ctrl
        }
        fn next_due(&mut self, now: f64) -> Option<Event> {
            if self.inputs.first().is_some_and(|(t, _)| *t <= now) {
                let (_, ev) = self.inputs.remove(0);
                self.calls.push(format!("input {ev:?}"));
                return Some(ev);
            }
            None
        }
        fn carry_out(&mut self, _: f64, cmd: Command) {
            let name = format!("{cmd:?}");
            self.calls
                .push(name.split_whitespace().next().unwrap_or("").into());
        }
        fn timing_out(&mut self, now: f64) {
            self.calls.push(format!("timeout {now}"));
        }
    }

    impl VirtualClock for Script {
        fn now(&self) -> f64 {
            self.now
        }
        fn set_now(&mut self, t: f64) {
            self.now = t;
        }
        fn next_input(&self) -> Option<f64> {
            self.inputs.first().map(|(t, _)| *t)
        }
    }

    /// A batcher waiting on a timer: the inputs due at one instant go first,
    /// each followed by its commands; the clock stops at the timer between
    /// two inputs; an input and the timer at the same time share the instant,
    /// the input first (here it dispatches the batch itself, and the timer,
    /// cleared, is not called).
    #[test]
    fn inputs_then_their_commands_then_the_timer() {
        let alloc: crate::Allocation = "1E(TP1)+1P(TP1)+1D(TP1)".parse().unwrap();
        let mut cfg = crate::harness::config_for(
            &alloc,
            None,
            crate::SmSplit::Static(1.0),
            crate::KvBlocks::new(1 << 20, 16),
            None,
        );
        cfg.batchers = vec![crate::Batcher::new(
            &crate::DispatchPolicy::FixedTimeout { timeout_s: 0.5 },
            4,
            |k| 0.01 * k as f64,
        )];
        let arrivals = [0.0, 0.0, 2.0, 2.5];
        let requests = (0..4)
            .map(|i| crate::harness::test_request(i, arrivals[i]))
            .collect();
        let mut s = Script {
            ctrl: Controller::new(requests, cfg),
            now: 0.0,
            inputs: vec![
                (0.0, Event::Arrival { id: 0 }),
                (0.0, Event::Arrival { id: 1 }),
                (0.6, Event::EncodeGpuStarted { worker: 0 }),
                (0.7, Event::EncodeDone { worker: 0 }),
                (2.0, Event::Arrival { id: 2 }),
                (2.5, Event::Arrival { id: 3 }),
            ],
            calls: Vec::new(),
        };
        assert!(step(&mut s));
        assert_eq!(s.now, 0.0);
        assert_eq!(
            s.calls,
            ["input Arrival { id: 0 }", "input Arrival { id: 1 }"]
        );
        // the timer of the held batch comes before the next input
        assert_eq!(s.ctrl.poll_timeout(), Some(0.5));
        s.calls.clear();
        assert!(step(&mut s));
        assert_eq!(s.now, 0.5);
        assert_eq!(s.calls, ["timeout 0.5", "Encode"]);
        s.calls.clear();
        run(&mut s);
        assert_eq!(s.now, 2.5);
        assert_eq!(
            s.calls,
            [
                "input EncodeGpuStarted { worker: 0 }",
                "input EncodeDone { worker: 0 }",
                "Embeddings",
                "input Arrival { id: 2 }",
                "input Arrival { id: 3 }",
                "Encode"
            ]
        );
        assert_eq!(s.ctrl.encode_batch(0), [2, 3]);
        assert!(!step(&mut s), "nothing is left");
    }

    /// A spurious wake-up (nothing due, the timer not yet) hands the
    /// controller nothing and answers its timer.
    #[test]
    fn an_instant_with_nothing_due_is_a_no_op() {
        let mut s = Script {
            ctrl: small_controller(2, 1.0, None),
            now: 0.0,
            inputs: Vec::new(),
            calls: Vec::new(),
        };
        assert_eq!(instant(&mut s, 3.0), None);
        assert!(s.calls.is_empty());
        assert!(!step(&mut s));
    }

    #[test]
    fn liveness_reports_a_death_once_and_lands_transfers_to_the_dead() {
        let mut live = Liveness::new();
        let kv = Command::Kv {
            from: 0,
            to: 1,
            id: 3,
        };
        let remote = Command::Embeddings {
            envelope: 1,
            from: 0,
            to: 0,
            local: false,
        };
        let local = Command::Embeddings {
            envelope: 2,
            from: 0,
            to: 1,
            local: true,
        };
        assert!(!live.lands_at_once(&kv) && !live.lands_at_once(&remote));
        assert!(live.lands_at_once(&local));
        assert!(live.kill(WorkerRef::Decode(1)));
        assert!(!live.kill(WorkerRef::Decode(1)));
        assert!(live.kill(WorkerRef::Prefill(0)));
        assert_eq!(live.dead(), [WorkerRef::Decode(1), WorkerRef::Prefill(0)]);
        assert!(live.lands_at_once(&kv) && live.lands_at_once(&remote));
        assert!(live.is_alive(WorkerRef::Decode(0)));
        assert!(!live.lands_at_once(&Command::Release { worker: 1, id: 3 }));
    }

    #[test]
    fn a_serial_link_carries_one_transfer_at_a_time() {
        let mut link = SerialLink::default();
        assert_eq!(link.send(1.0, 0.5), (1.0, 1.5));
        // asked for while the first is on the link: it waits
        assert_eq!(link.send(1.2, 0.25), (1.5, 1.75));
        // asked for once the link is free: it starts at once
        assert_eq!(link.send(3.0, 1.0), (3.0, 4.0));
        assert_eq!(link.free_at(), 4.0);
    }
}
