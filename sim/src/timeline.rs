//! Timeline export in the Chrome trace-event JSON format, which Perfetto
//! (ui.perfetto.dev) and `chrome://tracing` open: one track per worker or link,
//! complete slices (`"ph": "X"`) for encode micro-batches, prefill batches,
//! decode iterations and transfers, and counters (`"ph": "C"`) for queue lengths.
//! Times are microseconds of simulated time.

use serde_json::{json, Map, Value};

/// Process id of every track (one simulated cluster).
const PID: u32 = 1;

/// Collects timeline events of one run.
#[derive(Debug, Default)]
pub(crate) struct Timeline {
    tracks: Vec<String>,
    events: Vec<Value>,
}

fn us(t: f64) -> f64 {
    // whole nanoseconds keep the JSON short and exact across runs
    (t * 1e9).round() / 1e3
}

impl Timeline {
    /// The thread id of the track `name`, created on first use.
    pub(crate) fn track(&mut self, name: &str) -> usize {
        match self.tracks.iter().position(|t| t == name) {
            Some(i) => i + 1,
            None => {
                self.tracks.push(name.to_string());
                self.tracks.len()
            }
        }
    }

    /// A slice `[start, end]` (seconds) named `name` on `track`, with arguments.
    pub(crate) fn slice(&mut self, track: &str, name: &str, start: f64, end: f64, args: Value) {
        let tid = self.track(track);
        self.events.push(json!({
            "name": name, "cat": track.split(' ').next().unwrap_or(track), "ph": "X",
            "ts": us(start), "dur": us(end) - us(start), "pid": PID, "tid": tid, "args": args,
        }));
    }

    /// A counter sample `name = value` at `t` (seconds).
    pub(crate) fn counter(&mut self, name: &str, t: f64, value: f64) {
        let mut args = Map::new();
        args.insert("value".into(), json!(value));
        self.events
            .push(json!({ "name": name, "ph": "C", "ts": us(t), "pid": PID, "args": args }));
    }

    /// The whole trace as one JSON document (`{"traceEvents": [...]}`).
    pub(crate) fn into_json(self) -> Value {
        let mut events = vec![json!({
            "name": "process_name", "ph": "M", "pid": PID, "args": { "name": "easerve simulated cluster" }
        })];
        for (i, name) in self.tracks.iter().enumerate() {
            events.push(json!({
                "name": "thread_name", "ph": "M", "pid": PID, "tid": i + 1, "args": { "name": name }
            }));
            events.push(json!({
                "name": "thread_sort_index", "ph": "M", "pid": PID, "tid": i + 1, "args": { "sort_index": i }
            }));
        }
        events.extend(self.events);
        json!({ "traceEvents": events, "displayTimeUnit": "ms" })
    }
}
