//! Stage factors from the passes that ran alone (`easerve calib refine
//! --alone-passes`): a calibration of one pass's cost that leaves a CPU
//! host's contention to the twin's sharing term.
//!
//! On a CPU host every worker process shares the host's cores, and the twin
//! prices that sharing itself (the profile's measured `[host_sharing]`
//! curve, or cores over demand). A stage factor taken over a whole run —
//! measured over simulated mean service time — also folds in whatever
//! contention the simulation did not reproduce, and carries it into every
//! pass, the quiet ones too: on `scenarios/demand/cpu-image-phases.toml`
//! (a quiet phase, a surge, a quiet phase) the run-wide factors were 2.2
//! (encode), 1.8 (prefill) and 2.4 (decode) while the passes that ran with
//! nothing else under way took 1.7, 1.3 and 1.3 times their simulated
//! time, and the refined twin priced the first quiet phase's TTFT 53 %
//! slow (docs/demand.md).
//!
//! A pass is **alone** in a run when no other work was under way at any
//! instant of it: no other encode pass, prefill batch or decode run, on any
//! worker, overlaps it (the requests of its own micro-batch share it and do
//! not count). A pass alone in both runs — measured and simulated, the same
//! request — ran at the host's uncontended speed in both, so their ratio is
//! the profile's error on one pass, free of contention. Each stage's factor
//! is the sum of its measured spans over the sum of its simulated spans,
//! over the requests whose pass of that stage was alone in both runs:
//!
//! * encode: the pass, `encode_start` to `encode_end`;
//! * prefill: the batch, `prefill_start` to `first_token`;
//! * decode: the time per output token after the first, (`finish` −
//!   `decode_start`) / (`output_tokens` − 1), of a request decoding alone
//!   (a batch of one).
//!
//! The executor's transfers (relayed by its controller process, which
//! shares the host too) are taken the same way ([`alone_transfers`]): an
//! embedding envelope (`embedding_sent` to `prefill_ready`) or a KV cache
//! (`kv_sent` to `decode_ready`) in flight while no pass of any request
//! ran, in both runs; on the run above the quiet phase's took 2.3 ms and
//! 7.4 ms against the run's means of 11.5 ms and 63.8 ms.
//!
//! **Beside others** ([`shared_levels`], `calib refine --sharing-from-run`):
//! for a deployment whose every pass runs on one thread, the passes that
//! ran beside `n` others on average give the host's one-thread sharing at
//! demand `n + 1`, measured over what they would take uncontended (their
//! simulated spans at the stage factors fitted here, without the
//! simulation's own sharing). The company is counted as the twin counts
//! demand, with one limit: the CSV names no decode worker, so each
//! request's decode run counts as one pass, where the twin charges a
//! decode worker once for all the sequences it runs together.

/// One request's spans in one run, seconds from the run's start: what
/// [`alone_factors`] reads (a row of `--requests-csv`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Spans {
    /// Request id (the same request in both runs has the same id).
    pub id: u64,
    /// Encode pass: worker index, start, end.
    pub encode: Option<(usize, f64, f64)>,
    /// Prefill batch: start, first token.
    pub prefill: Option<(f64, f64)>,
    /// Decode run: start, last token.
    pub decode: Option<(f64, f64)>,
    /// Embedding transfer: sent, ready at the prefill worker.
    pub embedding: Option<(f64, f64)>,
    /// KV cache transfer: sent, ready at the decode worker.
    pub kv: Option<(f64, f64)>,
    /// Output tokens generated.
    pub output_tokens: u32,
}

/// The stages [`alone_factors`] fits, in its output's order.
pub const ALONE_STAGES: [&str; 3] = ["encode", "prefill", "decode"];

/// One stage's fit: the requests whose pass ran alone in both runs, and
/// their summed spans (seconds; for decode, seconds per output token).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AloneFit {
    /// Requests whose pass of this stage was alone in both runs.
    pub passes: usize,
    /// Their measured spans, summed.
    pub measured: f64,
    /// Their simulated spans, summed.
    pub simulated: f64,
}

impl AloneFit {
    /// Measured over simulated, where both sums are positive.
    pub fn factor(&self) -> Option<f64> {
        (self.measured > 0.0 && self.simulated > 0.0).then(|| self.measured / self.simulated)
    }
}

/// A span's kind and who shares it: the requests of one micro-batch share
/// one key, so they do not count as each other's company.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Group {
    Encode(usize, u64),
    Prefill(u64, u64),
    Decode(u64),
}

/// A request's encode pass, prefill batch and decode run, each with the key
/// of the pass it belongs to.
fn pass_spans(r: &Spans) -> [Option<(f64, f64, Group)>; 3] {
    [
        r.encode
            .map(|(w, s, e)| (s, e, Group::Encode(w, s.to_bits()))),
        r.prefill
            .map(|(s, e)| (s, e, Group::Prefill(s.to_bits(), e.to_bits()))),
        r.decode.map(|(s, e)| (s, e, Group::Decode(r.id))),
    ]
}

/// The distinct passes of `run` (a micro-batch's requests are one), sorted
/// by start.
fn distinct_passes(run: &[Spans]) -> Vec<(f64, f64, Group)> {
    let mut spans: Vec<(f64, f64, Group)> = run.iter().flat_map(pass_spans).flatten().collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.2.cmp(&b.2)));
    spans.dedup_by(|a, b| a.2 == b.2);
    spans
}

/// Per request (by index in `runs`) and stage (encode, prefill, decode):
/// whether that pass was alone in its run (module doc). O(n log n): the
/// distinct spans sorted by start; a span has company when one that starts
/// before it ends after its start, or the next one starts before it ends.
fn alone_in(run: &[Spans]) -> Vec<[bool; 3]> {
    let spans = distinct_passes(run);
    let mut company = std::collections::HashMap::with_capacity(spans.len());
    let mut reach = f64::NEG_INFINITY;
    for (i, &(s, e, g)) in spans.iter().enumerate() {
        let from_left = reach > s;
        let from_right = spans.get(i + 1).is_some_and(|n| n.0 < e);
        company.insert(g, from_left || from_right);
        reach = reach.max(e);
    }
    run.iter()
        .map(|r| pass_spans(r).map(|x| x.is_some_and(|(_, _, g)| company.get(&g) == Some(&false))))
        .collect()
}

/// The passes of a run (encode, prefill, decode of every request), sorted
/// by start, with the latest end among each prefix: whether any overlaps
/// an interval is two binary searches' work.
struct Passes {
    starts: Vec<f64>,
    reach: Vec<f64>,
}

impl Passes {
    fn of(run: &[Spans]) -> Passes {
        let mut spans: Vec<(f64, f64)> = (run.iter())
            .flat_map(|r| [r.encode.map(|(_, s, e)| (s, e)), r.prefill, r.decode])
            .flatten()
            .collect();
        spans.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut reach = f64::NEG_INFINITY;
        let reach = (spans.iter())
            .map(|&(_, e)| {
                reach = reach.max(e);
                reach
            })
            .collect();
        Passes {
            starts: spans.iter().map(|s| s.0).collect(),
            reach,
        }
    }

    /// Whether a pass was under way at some instant strictly inside
    /// `(s, e)`.
    fn overlap(&self, (s, e): (f64, f64)) -> bool {
        let k = self.starts.partition_point(|&x| x < e);
        k > 0 && self.reach[k - 1] > s
    }
}

/// The embedding and KV transfers in flight while no pass ran, in both
/// `measured` and `simulated` (matched by id), as `[embedding, kv]` fits of
/// their summed times (module doc).
pub fn alone_transfers(measured: &[Spans], simulated: &[Spans]) -> [AloneFit; 2] {
    let (pm, ps) = (Passes::of(measured), Passes::of(simulated));
    let by_id: std::collections::HashMap<u64, usize> = simulated
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id, i))
        .collect();
    let kinds = |r: &Spans| [r.embedding, r.kv];
    let mut fits = [AloneFit::default(); 2];
    for m in measured {
        let Some(&j) = by_id.get(&m.id) else { continue };
        for ((a, b), fit) in kinds(m)
            .into_iter()
            .zip(kinds(&simulated[j]))
            .zip(&mut fits)
        {
            if let (Some(a), Some(b)) = (a, b) {
                if !pm.overlap(a) && !ps.overlap(b) {
                    fit.passes += 1;
                    fit.measured += a.1 - a.0;
                    fit.simulated += b.1 - b.0;
                }
            }
        }
    }
    fits
}

/// A request's span of stage `k` (0 encode, 1 prefill, 2 decode; decode
/// per output token after the first), where it has one.
fn span(r: &Spans, k: usize) -> Option<f64> {
    match k {
        0 => r.encode.map(|(_, s, e)| e - s),
        1 => r.prefill.map(|(s, e)| e - s),
        _ => r
            .decode
            .filter(|_| r.output_tokens > 1)
            .map(|(s, e)| (e - s) / f64::from(r.output_tokens - 1)),
    }
}

/// Each stage's fit over the requests whose pass of it ran alone in both
/// `measured` and `simulated` (matched by [`Spans::id`]; a request in one
/// run only is left out), in [`ALONE_STAGES`] order (module doc).
pub fn alone_factors(measured: &[Spans], simulated: &[Spans]) -> [AloneFit; 3] {
    let (am, asim) = (alone_in(measured), alone_in(simulated));
    let by_id: std::collections::HashMap<u64, usize> = simulated
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id, i))
        .collect();
    let mut fits = [AloneFit::default(); 3];
    for (i, m) in measured.iter().enumerate() {
        let Some(&j) = by_id.get(&m.id) else { continue };
        for (k, fit) in fits.iter_mut().enumerate() {
            if !(am[i][k] && asim[j][k]) {
                continue;
            }
            if let (Some(a), Some(b)) = (span(m, k), span(&simulated[j], k)) {
                fit.passes += 1;
                fit.measured += a;
                fit.simulated += b;
            }
        }
    }
    fits
}

/// One demand level of the host's one-thread sharing as a run shows it
/// ([`shared_levels`]): the encode passes and prefill batches of the
/// measured run that had `level − 1` other passes under way beside them on
/// average, their measured spans and what they would take at the host's
/// uncontended speed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LevelFit {
    /// Busy one-thread passes, the pass itself included (≥ 2).
    pub level: usize,
    /// Requests whose pass counted.
    pub passes: usize,
    /// Their measured spans, summed (seconds).
    pub measured: f64,
    /// Their simulated spans times the stage's factor over the
    /// simulation's own sharing slowdown, summed (seconds).
    pub expected: f64,
}

impl LevelFit {
    /// Measured over expected: the slowdown at this level, at least 1.
    pub fn slowdown(&self) -> Option<f64> {
        (self.measured > 0.0 && self.expected > 0.0)
            .then(|| (self.measured / self.expected).max(1.0))
    }
}

/// Per request of `run`, the mean number of other passes (encode passes,
/// prefill batches, decode runs; a micro-batch's requests are one pass)
/// under way through its encode pass and its prefill batch.
fn company(run: &[Spans]) -> Vec<[Option<f64>; 2]> {
    let spans = distinct_passes(run);
    let longest = spans.iter().map(|x| x.1 - x.0).fold(0.0, f64::max);
    let mut mean = std::collections::HashMap::with_capacity(spans.len());
    for &(s, e, g) in &spans {
        if e <= s {
            continue;
        }
        // the spans that can overlap (s, e) start in [s − longest, e)
        let lo = spans.partition_point(|x| x.0 < s - longest);
        let hi = spans.partition_point(|x| x.0 < e);
        let shared: f64 = (spans[lo..hi].iter())
            .filter(|x| x.2 != g)
            .map(|x| (x.1.min(e) - x.0.max(s)).max(0.0))
            .sum();
        mean.insert(g, shared / (e - s));
    }
    run.iter()
        .map(|r| {
            let [e, p, _] = pass_spans(r);
            [e, p].map(|x| x.and_then(|(_, _, g)| mean.get(&g).copied()))
        })
        .collect()
}

/// The host's one-thread sharing at each demand level as `measured` shows
/// it (`easerve calib refine --sharing-from-run`), for a deployment whose
/// every pass runs on one thread, so that a pass beside `n` others on
/// average ran at demand `n + 1`. A request's encode pass or prefill batch
/// counts at level `round(n) + 1` ≥ 2 when its mean company `n` in the
/// measured run is within a quarter of that integer; what it would take
/// uncontended is its span in `simulated` (the same request) times
/// `factors` (encode, prefill: the stage factors from the passes alone)
/// over `sim_slowdown(1 + n')`, the sharing slowdown the simulation priced
/// at its own mean company `n'`. Levels ascending; only levels with a pass.
pub fn shared_levels(
    measured: &[Spans],
    simulated: &[Spans],
    factors: [f64; 2],
    sim_slowdown: &dyn Fn(f64) -> f64,
) -> Vec<LevelFit> {
    let (cm, cs) = (company(measured), company(simulated));
    let by_id: std::collections::HashMap<u64, usize> = simulated
        .iter()
        .enumerate()
        .map(|(i, r)| (r.id, i))
        .collect();
    let mut levels: std::collections::BTreeMap<usize, LevelFit> = Default::default();
    for (i, m) in measured.iter().enumerate() {
        let Some(&j) = by_id.get(&m.id) else { continue };
        for k in 0..2 {
            let (Some(n), Some(ns)) = (cm[i][k], cs[j][k]) else {
                continue;
            };
            let (Some(a), Some(b)) = (span(m, k), span(&simulated[j], k)) else {
                continue;
            };
            let level = n.round() as usize + 1;
            if level < 2 || (n - n.round()).abs() > 0.25 {
                continue;
            }
            let fit = levels.entry(level).or_insert(LevelFit {
                level,
                ..LevelFit::default()
            });
            fit.passes += 1;
            fit.measured += a;
            fit.expected += b * factors[k] / sim_slowdown(1.0 + ns);
        }
    }
    levels.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(id: u64, e: (f64, f64), p: (f64, f64), d: (f64, f64)) -> Spans {
        Spans {
            id,
            encode: Some((0, e.0, e.1)),
            prefill: Some(p),
            decode: Some(d),
            embedding: Some((e.1, p.0)),
            kv: Some((p.1, d.0)),
            output_tokens: 5,
        }
    }

    /// A request with an encode pass and a prefill batch only.
    fn passes(id: u64, e: Option<(f64, f64)>, p: Option<(f64, f64)>) -> Spans {
        Spans {
            id,
            encode: e.map(|(s, t)| (0, s, t)),
            prefill: p,
            output_tokens: 1,
            ..Spans::default()
        }
    }

    #[test]
    fn shared_levels_take_the_passes_beside_others_against_their_uncontended_time() {
        // request 1's encode pass and request 2's prefill batch ran together
        // (each beside one other pass: level 2), 1.2 s measured, 1.0 s
        // simulated; request 5's encode pass overlapped half of request 4's
        // prefill batch in the measured run (company 0.5: no level); the
        // rest ran alone (level 1: not a row)
        let measured = vec![
            passes(0, Some((0.0, 1.0)), Some((1.0, 2.0))),
            passes(1, Some((10.0, 11.2)), None),
            passes(2, Some((8.0, 9.0)), Some((10.0, 11.2))),
            passes(3, Some((20.0, 21.0)), Some((21.0, 22.0))),
            passes(4, None, Some((30.0, 31.0))),
            passes(5, Some((30.5, 31.5)), None),
        ];
        let simulated = vec![
            passes(0, Some((0.0, 1.0)), Some((1.0, 2.0))),
            passes(1, Some((10.0, 11.0)), None),
            passes(2, Some((8.0, 9.0)), Some((10.0, 11.0))),
            passes(3, Some((20.0, 21.0)), Some((21.0, 22.0))),
            passes(4, None, Some((30.0, 31.0))),
            passes(5, Some((32.0, 33.0)), None),
        ];
        let levels = shared_levels(&measured, &simulated, [1.0, 1.0], &|_| 1.0);
        assert_eq!(levels.len(), 1, "{levels:?}");
        let l = levels[0];
        assert_eq!((l.level, l.passes), (2, 2));
        assert!(
            (l.measured - 2.4).abs() < 1e-9 && (l.expected - 2.0).abs() < 1e-9,
            "{l:?}"
        );
        assert!((l.slowdown().unwrap() - 1.2).abs() < 1e-9);
        // the stage factors scale the uncontended time; the simulation's own
        // slowdown at its company (1 other: demand 2) is taken out of it
        let l = shared_levels(&measured, &simulated, [1.2, 1.0], &|d| {
            if d > 1.5 {
                1.25
            } else {
                1.0
            }
        })[0];
        assert!(
            (l.expected - (1.2 / 1.25 + 1.0 / 1.25)).abs() < 1e-9,
            "{l:?}"
        );
        // faster than uncontended reads as no slowdown
        let l = shared_levels(&measured, &simulated, [2.0, 2.0], &|_| 1.0)[0];
        assert_eq!(l.slowdown(), Some(1.0));
    }

    /// A transfer counts where no pass of any request was under way while
    /// it was in flight, in both runs.
    #[test]
    fn transfers_count_where_no_pass_ran_in_both_runs() {
        let mut a = req(0, (0.0, 1.0), (1.5, 2.0), (2.5, 3.0));
        let mut b = req(1, (1.2, 1.4), (5.0, 6.0), (6.0, 7.0));
        let measured = vec![a.clone(), b.clone()];
        // in the simulation request 1's embedding (1.4 to 5.0) overlaps
        // request 0's passes; its KV cache (6.0 to 6.0) takes no time
        a.embedding = Some((1.0, 1.1));
        b.embedding = Some((1.4, 5.0));
        let simulated = vec![a, b];
        let [emb, kv] = alone_transfers(&measured, &simulated);
        // measured: request 0's embedding (1.0 to 1.5) overlaps request
        // 1's encode (1.2 to 1.4); its KV (2.0 to 2.5) is alone in both
        assert_eq!(emb.passes, 0);
        assert_eq!(kv.passes, 2);
        assert_eq!((kv.measured, kv.simulated), (0.5, 0.5));
    }

    /// Request 0 runs alone at every stage; requests 1 and 2 share one
    /// encode pass and one prefill batch (each other's batch: alone), then
    /// decode together (not alone); request 3's encode overlaps request 2's
    /// decode (neither alone).
    #[test]
    fn a_pass_is_alone_when_only_its_own_batch_shares_its_time() {
        let run = vec![
            req(0, (0.0, 1.0), (1.0, 2.0), (2.0, 3.0)),
            req(1, (10.0, 11.0), (11.0, 12.0), (12.0, 14.0)),
            req(2, (10.0, 11.0), (11.0, 12.0), (12.5, 15.0)),
            req(3, (14.5, 15.5), (20.0, 21.0), (21.0, 22.0)),
        ];
        let alone = alone_in(&run);
        assert_eq!(alone[0], [true, true, true]);
        assert_eq!(alone[1], [true, true, false]);
        assert_eq!(alone[2], [true, true, false]);
        assert_eq!(alone[3], [false, true, true]);
    }

    /// The factor is measured over simulated over the passes alone in
    /// both runs: a pass alone in one run only is left out.
    #[test]
    fn factors_count_the_passes_alone_in_both_runs() {
        let measured = vec![
            req(0, (0.0, 2.0), (2.0, 3.5), (3.5, 5.5)),
            req(1, (10.0, 12.0), (12.0, 13.0), (13.0, 15.0)),
        ];
        // request 1's encode overlaps request 0's decode in the simulation
        let simulated = vec![
            req(0, (0.0, 1.0), (1.0, 2.0), (2.0, 3.0)),
            req(1, (2.5, 3.5), (10.0, 11.0), (11.0, 12.0)),
        ];
        let f = alone_factors(&measured, &simulated);
        assert_eq!(f[0].passes, 1, "encode: request 0 only");
        assert_eq!(f[0].factor(), Some(2.0));
        assert_eq!(f[1].passes, 2);
        assert_eq!(f[1].factor(), Some(2.5 / 2.0));
        // decode: request 0's simulated run overlaps request 1's encode;
        // request 1's is alone in both (0.5 s against 0.25 s a token)
        assert_eq!(f[2].passes, 1);
        assert_eq!(f[2].factor(), Some((2.0 / 4.0) / (1.0 / 4.0)));
    }
}
