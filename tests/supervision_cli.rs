//! Supervision of `easerve serve`'s workers on loopback: a worker killed
//! with SIGKILL is restarted and rejoins, `/health` says 503 only while a
//! stage has no live worker, and the chaos run (a random worker killed every
//! 10 s under a steady load) answers every request and accounts for it.

use crate::num;
use crate::serve_cli::{chat, parse_prometheus, png, Server};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The worker processes of server `pid`: (role, index, pid), read from
/// `/proc` (each is a child of the server started as `easerve worker --role
/// ROLE --index N`).
fn workers_of(pid: u32) -> Vec<(String, usize, u32)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // the parent pid is the second field after the command's closing paren
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(pid) {
            continue;
        }
        let Ok(cmd) = std::fs::read(format!("/proc/{child}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let flag = |f: &str| {
            args.iter()
                .position(|a| a == f)
                .map(|i| args[i + 1].clone())
        };
        if let (Some(role), Some(index)) = (flag("--role"), flag("--index")) {
            out.push((role, index.parse().unwrap(), child));
        }
    }
    out.sort();
    out
}

/// SIGKILL the worker of `role` and `index` of server `s`; its pid.
fn kill_worker(s: &Server, role: &str, index: usize) -> u32 {
    signal_worker(s, role, index, "-KILL")
}

/// Send `signal` (`-KILL`, `-STOP`) to the worker of `role` and `index` of
/// server `s`; its pid.
fn signal_worker(s: &Server, role: &str, index: usize, signal: &str) -> u32 {
    let w = workers_of(s.child.id());
    let &(_, _, pid) = w
        .iter()
        .find(|(r, i, _)| r == role && *i == index)
        .unwrap_or_else(|| panic!("no {role} worker {index} among {w:?}"));
    let st = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    pid
}

/// `/metrics` as name → value.
fn metrics(s: &Server) -> std::collections::HashMap<String, f64> {
    let (status, text) = s.get("/metrics");
    assert_eq!(status, 200);
    parse_prometheus(&text)
}

/// Seconds from `since` until every worker of `s` is live again
/// (`easerve:workers_down` 0 and `/health` 200), polling every 50 ms; panics
/// after `limit` seconds.
fn back_to_full_capacity(s: &Server, since: Instant, limit: f64) -> f64 {
    loop {
        let down = metrics(s)["easerve:workers_down"];
        if down == 0.0 && s.get("/health").0 == 200 {
            return since.elapsed().as_secs_f64();
        }
        let t = since.elapsed().as_secs_f64();
        assert!(
            t < limit,
            "{down} workers still down {t:.1} s after the kill"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn small_chat() -> Value {
    chat(
        json!({"type": "image_url", "image_url": {"url": png(64, 64)}}),
        4,
        4,
        false,
    )
}

/// A SIGKILLed worker is back within 30 s and requests succeed again, with
/// a single worker per stage too: `cpu-image.toml` has one encode and one
/// decode worker (its prefill stage: P0 and the local L0). While the only
/// decode worker is down `/health` says 503; the report and `/metrics` count
/// the death and the restart. Then the encode worker is stopped (SIGSTOP):
/// it answers no heartbeat, is killed and replaced, and requests succeed
/// again. About 25 s.
#[test]
fn a_sigkilled_worker_is_back_within_30_s_and_requests_succeed_again() {
    let _timed = crate::timed();
    let s = Server::start("scenarios/cpu-image.toml", &[]);
    let body = small_chat();
    assert_eq!(s.post(&body).0, 200);
    let old = kill_worker(&s, "decode", 0);
    let killed = Instant::now();
    // the death is seen at once: /health turns 503 (the only decode worker)
    let mut saw_503 = false;
    while killed.elapsed() < Duration::from_secs(5) && !saw_503 {
        saw_503 = s.get("/health").0 == 503;
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        saw_503,
        "/health never said 503 with the only decode worker dead"
    );
    let back = back_to_full_capacity(&s, killed, 30.0);
    eprintln!("D0 back {back:.2} s after SIGKILL");
    let new = workers_of(s.child.id());
    assert!(new.iter().any(|w| w.0 == "decode" && w.2 != old), "{new:?}");
    for _ in 0..3 {
        let (code, text) = s.post(&body);
        assert_eq!(code, 200, "{text}");
    }
    let m = metrics(&s);
    assert_eq!(m["easerve:worker_deaths_total"], 1.0);
    assert_eq!(m["easerve:worker_restarts_total"], 1.0);
    assert!(m["easerve:stage_down_seconds"] > 0.0);
    // a worker that stops answering heartbeats is taken for dead
    signal_worker(&s, "encode", 0, "-STOP");
    let stopped = Instant::now();
    while metrics(&s)["easerve:worker_deaths_total"] < 2.0 {
        assert!(
            stopped.elapsed() < Duration::from_secs(15),
            "E0 stopped and never failed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let back = back_to_full_capacity(&s, stopped, 30.0);
    eprintln!("E0 (stopped) back {back:.2} s after SIGSTOP");
    let (code, text) = s.post(&body);
    assert_eq!(code, 200, "{text}");
    let r = s.stop();
    assert_eq!(num(&r, "/supervision/deaths"), 2.0);
    assert_eq!(num(&r, "/supervision/restarts"), 2.0);
    let silent = r["supervision"]["outages"][1]["reason"].as_str().unwrap();
    assert!(silent.contains("heartbeats"), "{silent}");
    let o = &r["supervision"]["outages"][0];
    assert_eq!(o["worker"], "D0");
    assert!(o["reason"].as_str().unwrap().contains("SIGKILL"), "{o}");
    assert!(num(o, "/back_at") > num(o, "/died_at"));
    assert!(num(o, "/load_s") > 0.0);
    assert_eq!(num(&r, "/completed"), 5.0);
}

/// One request's fate in the chaos run.
#[derive(Debug)]
enum Answer {
    Served,
    Rejected,
    Unavailable,
    BadRequest,
    /// A 500, with its message.
    Failed(String),
}

/// The chaos test: for 60 s under a steady load (2 requests/s, each its own
/// client), SIGKILL a random worker (seeded) every 10 s. Every request gets
/// an answer: served, 4xx, 429, 503, or a 500 that names the dead worker;
/// the report's accounting adds up exactly to what the clients saw; after
/// the last kill the server is back to full capacity within 30 s. Prints
/// the figures. About 75 s.
#[test]
fn chaos_a_random_worker_killed_every_10_s_costs_no_request_its_answer() {
    let _timed = crate::timed();
    let s = std::sync::Arc::new(Server::start("scenarios/cpu-image.toml", &[]));
    let body = small_chat();
    let start = Instant::now();
    let (run_s, rate) = (60.0, 2.0);
    let mut clients = Vec::new();
    let mut kills: Vec<(f64, String)> = Vec::new();
    let labels = [
        ("encode", 0, "E0"),
        ("prefill", 0, "P0"),
        ("prefill", 1, "L0"),
        ("decode", 0, "D0"),
    ];
    // a fixed sequence of victims (an LCG from a fixed seed)
    let mut x: u64 = 31;
    let mut next_kill = 10.0;
    let mut last_kill = start;
    for i in 0..(run_s * rate) as usize {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
        if start.elapsed().as_secs_f64() >= next_kill {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let (role, index, label) = labels[(x >> 33) as usize % labels.len()];
            // a victim still restarting from an earlier kill has no process
            if workers_of(s.child.id())
                .iter()
                .any(|w| w.0 == role && w.1 == index)
            {
                kill_worker(&s, role, index);
                kills.push((start.elapsed().as_secs_f64(), label.to_string()));
                last_kill = Instant::now();
            }
            next_kill += 10.0;
        }
        let (s, body) = (s.clone(), body.clone());
        clients.push(std::thread::spawn(move || s.post(&body)));
    }
    let answers: Vec<Answer> = clients
        .into_iter()
        .map(|c| match c.join().expect("every client gets an answer") {
            (200, _) => Answer::Served,
            (429, _) => Answer::Rejected,
            (503, _) => Answer::Unavailable,
            (400..=499, _) => Answer::BadRequest,
            (500, text) => Answer::Failed(text),
            (code, text) => panic!("{code}: {text}"),
        })
        .collect();
    // a guard while the server runs: every worker live within 30 s of the last kill
    back_to_full_capacity(&s, last_kill, 30.0);
    for a in &answers {
        if let Answer::Failed(text) = a {
            let v: Value = serde_json::from_str(text).unwrap();
            let msg = v["error"]["message"].as_str().unwrap();
            assert!(
                labels.iter().any(|l| msg.contains(l.2)),
                "a 500 that names no worker: {msg}"
            );
        }
    }
    let count = |f: fn(&Answer) -> bool| answers.iter().filter(|a| f(a)).count();
    let served = count(|a| matches!(a, Answer::Served));
    let failed = count(|a| matches!(a, Answer::Failed(_)));
    let rejected = count(|a| matches!(a, Answer::Rejected));
    let unavailable = count(|a| matches!(a, Answer::Unavailable));
    let bad = count(|a| matches!(a, Answer::BadRequest));
    let m = metrics(&s);
    let Ok(s) = std::sync::Arc::try_unwrap(s) else {
        panic!("every client thread has ended");
    };
    let r = s.stop();
    let field = |p: &str| r.pointer(p).and_then(Value::as_f64).unwrap_or(0.0) as usize;
    // the report's accounting adds up exactly, and to what the clients saw
    let requests = field("/requests");
    assert_eq!(requests, served + failed + rejected, "{r}");
    assert_eq!(field("/completed"), served);
    assert_eq!(field("/failed"), failed);
    assert_eq!(field("/rejected"), rejected);
    assert_eq!(field("/refused"), 0);
    assert_eq!(requests + unavailable + bad, answers.len());
    let deaths = field("/supervision/deaths");
    let restarts = field("/supervision/restarts");
    assert_eq!(deaths, kills.len(), "{kills:?}");
    let outages = r["supervision"]["outages"].as_array().unwrap();
    assert_eq!(restarts, outages.len());
    assert!(
        outages.iter().all(|o| o.get("back_at").is_some()),
        "{outages:?}"
    );
    // back to full capacity: from the last death to the last rejoin, by the
    // server's clock
    let last_death = outages
        .iter()
        .map(|o| num(o, "/died_at"))
        .fold(0.0, f64::max);
    let last_back = outages
        .iter()
        .map(|o| num(o, "/back_at"))
        .fold(0.0, f64::max);
    let back = last_back - last_death;
    assert_eq!(m["easerve:worker_restarts_total"], restarts as f64);
    println!(
        "chaos: {} requests over {run_s:.0} s; served {served}, failed (500 naming the dead worker) {failed}, \
         429 {rejected}, 503 {unavailable}, 4xx {bad}; kills {kills:?}; deaths {deaths}, restarts {restarts}; \
         degraded {:.1} s, stage down {:.1} s; back to full capacity {back:.2} s after the last kill",
        answers.len(),
        num(&r, "/supervision/degraded_s"),
        num(&r, "/supervision/down_s"),
    );
    assert!(back <= 30.0);
}

/// `easerve serve --planner load` is accepted and its planner moves
/// workers while it serves: one small image request a second for 12 s
/// (a decision every 5 s, `scenarios/demand/cpu-image-phases.toml`) leaves
/// the second decode worker cold, so a window drains it (and, if prefill
/// was queued at the window's end, starts a prefill worker on its device).
/// Every request is answered, and once drained the server's report shows
/// D1 stopped after its change. About 20 s.
#[test]
fn serve_runs_the_load_planner_and_answers_every_request() {
    let _timed = crate::timed();
    let s = Server::start(
        "scenarios/demand/cpu-image-phases.toml",
        &["--planner", "load"],
    );
    let start = Instant::now();
    let mut sent = 0;
    while start.elapsed() < Duration::from_secs(12) {
        let (code, body) = s.post(&small_chat());
        assert_eq!(code, 200, "{body}");
        sent += 1;
        std::thread::sleep(Duration::from_millis(1000));
    }
    let r = s.stop();
    assert_eq!(r["completed"].as_f64(), Some(sent as f64));
    let p = &r["planner"];
    assert_eq!(p["policy"], "load");
    let drained = p["changes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["from"] == "D1" && c["stopped_at"].as_f64() >= c["at"].as_f64());
    assert!(drained, "D1 was not drained: {p}");
}
