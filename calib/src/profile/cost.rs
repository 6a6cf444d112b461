//! `impl StageCost for Profile`: encode, prefill, decode and transfer
//! durations looked up in the tables (SM shares clamped into the tables'
//! range), and notes that name the profile and count the lookups that had to
//! extrapolate.

use easerve_model::{ItemTokens, Parallel};

use super::{PrefillBatching, Profile, Table};
use crate::roofline::{EncodeTime, MIN_SM_SHARE};
use crate::StageCost;

fn clamp_share(sm_share: f64) -> f64 {
    if sm_share.is_finite() {
        sm_share.clamp(MIN_SM_SHARE, 1.0)
    } else {
        1.0
    }
}

impl Profile {
    /// The transfer table [`StageCost::transfer`] uses (the provenance's link).
    fn link_table(&self) -> &Table {
        self.transfer
            .iter()
            .find(|t| t.link.as_deref() == Some(self.provenance.link.as_str()))
            .unwrap_or(&self.transfer[0])
    }

    /// All tables, for reports.
    fn tables(&self) -> impl Iterator<Item = &Table> {
        self.encode
            .iter()
            .chain(self.encode_tp.iter())
            .chain([&self.prefill, &self.decode])
            .chain(self.transfer.iter())
            .chain(self.all_reduce.iter())
            .chain(self.kv_land.iter())
    }

    /// Seconds a TP `tp` pass of `rows` token rows spends in all-reduces, added
    /// to a stage time looked up at another TP because the table has no row
    /// at `tp` (a measured row already holds its all-reduces: the profiler
    /// times the rank processes). Priced from the measured all-reduce table:
    /// two all-reduces per decoder layer (after the attention output and the
    /// MLP down projection, `model/src/nn/tp.rs`) of `rows × hidden × 4`
    /// bytes (f32 activations). 0 when `tp` ≤ 1, when the stage table has a
    /// row at `tp`, or when the all-reduce table (a profile without one
    /// falls back as before: the lookup's TP interpolated or clamped, and the
    /// extrapolation note), its row at `tp` or the model's preset is missing;
    /// the notes count the lookups that fell back.
    fn missing_tp_all_reduce(&self, stage: &Table, tp: u32, rows: u64) -> f64 {
        let Some(ar) = self.all_reduce.as_ref() else {
            return 0.0;
        };
        if tp <= 1 || stage.axes()[stage_tp_axis(stage)].contains(&f64::from(tp)) {
            return 0.0;
        }
        self.tp_fallbacks.add();
        if !ar.axes()[0].contains(&f64::from(tp)) {
            return 0.0;
        }
        let Some(arch) = easerve_model::ModelArch::preset(&self.provenance.model) else {
            return 0.0;
        };
        self.tp_priced.add();
        let bytes = rows as f64 * f64::from(arch.llm.hidden) * 4.0;
        2.0 * f64::from(arch.llm.layers) * ar.lookup(&[f64::from(tp), bytes])[0]
    }
}

/// The `tp` axis of a prefill or decode table.
fn stage_tp_axis(t: &Table) -> usize {
    t.stage.axes().iter().position(|a| *a == "tp").unwrap_or(0)
}

impl StageCost for Profile {
    /// Encode: `batch = items.len()`, `encoder_tokens` = their mean; `t_gpu` is
    /// the table's `median − t_pass − t_pre` (all of `median` when the split is
    /// unknown). At TP > 1, from the `encode_tp` table's rows at that TP
    /// (measured at the whole device: `t_gpu` scaled by the TP 1 table's
    /// ratio at `sm_share` to the whole); a TP without rows is looked up in
    /// the TP 1 table and counted in the notes. Empty batches cost nothing.
    fn encode_tp(&self, items: &[ItemTokens], sm_share: f64, tp: u32) -> EncodeTime {
        let Some(t) = self.encode.as_ref() else {
            return EncodeTime::default();
        };
        if items.is_empty() {
            return EncodeTime::default();
        }
        let total: u64 = items.iter().map(|i| i.encoder_tokens).sum();
        let (batch, per_item) = (
            items.len() as f64,
            (total as f64 / items.len() as f64).max(1.0),
        );
        let at = |t: &super::Table, point: &[f64]| {
            let v = t.lookup(point);
            EncodeTime {
                t_gpu: v[0],
                t_pass: v[1],
                t_pre: v[2],
            }
        };
        let one = at(t, &[batch, per_item, clamp_share(sm_share)]);
        if tp <= 1 {
            return one;
        }
        let rows = (self.encode_tp.as_ref()).filter(|e| e.axes()[0].contains(&f64::from(tp)));
        let Some(e) = rows else {
            self.encode_tp_fallbacks.add();
            return one;
        };
        let mut v = at(e, &[f64::from(tp), batch, per_item]);
        if clamp_share(sm_share) < 1.0 {
            let whole = at(t, &[batch, per_item, 1.0]).t_gpu;
            if whole > 0.0 {
                v.t_gpu *= one.t_gpu / whole;
            }
        }
        v
    }

    /// Prefill: looked up at the batch's total tokens and the worker's TP (a
    /// profile is measured per TP degree; an EP degree is not a key of it).
    fn prefill(&self, seq_lens: &[u64], par: Parallel, sm_share: f64) -> f64 {
        let tp = par.tp;
        let tokens: u64 = seq_lens.iter().sum();
        if tokens == 0 {
            return 0.0;
        }
        let at = |n: u64| {
            self.prefill
                .lookup(&[n as f64, f64::from(tp.max(1)), clamp_share(sm_share)])[0]
                + self.missing_tp_all_reduce(&self.prefill, tp, n)
        };
        match self.prefill_batching {
            PrefillBatching::Packed => at(tokens),
            PrefillBatching::Padded => {
                let longest = seq_lens.iter().copied().max().unwrap_or(0);
                seq_lens.iter().filter(|&&l| l > 0).count() as f64 * at(longest)
            }
        }
    }

    fn decode_step(&self, batch: u64, total_context_tokens: u64, par: Parallel) -> f64 {
        let tp = par.tp;
        if batch == 0 {
            return 0.0;
        }
        self.decode.lookup(&[
            batch as f64,
            total_context_tokens.max(1) as f64,
            f64::from(tp.max(1)),
        ])[0]
            + self.missing_tp_all_reduce(&self.decode, tp, batch)
    }

    fn kv_land(&self, tp: u32, tokens: u64) -> f64 {
        match &self.kv_land {
            Some(t) if tokens > 0 => t.lookup(&[f64::from(tp.max(1)), tokens as f64])[0],
            _ => 0.0,
        }
    }

    fn transfer(&self, bytes: f64) -> f64 {
        if bytes.is_nan() || bytes <= 0.0 {
            return 0.0;
        }
        self.link_table().lookup(&[bytes])[0]
    }

    fn time_slice_penalty(&self) -> f64 {
        self.time_slice_penalty
    }

    fn bandwidth_interference(&self) -> f64 {
        self.bandwidth_interference
    }

    /// The profile's provenance, then one line per table whose lookups left the
    /// table since the previous call (counters are reset by this call).
    fn notes(&self) -> Vec<String> {
        let p = &self.provenance;
        let mut notes = vec![format!(
            "costs from profile {} ({} {} on {}, {}; backend {}; driver {}; {} repetitions; {}); contention scalars: {}",
            self.origin,
            p.source.as_str(),
            p.model,
            p.device,
            p.date,
            p.backend,
            p.driver,
            p.repetitions,
            p.method,
            self.scalars_note
        )];
        let encode_fell_back = self.encode_tp_fallbacks.take();
        if encode_fell_back > 0 {
            notes.push(format!(
                "profile {}: {encode_fell_back} encode lookups at a TP > 1 the profile has no encode_tp rows for ({}) were priced as at TP 1 (measure them with `easerve profile --tp`)",
                self.origin,
                self.encode_tp
                    .as_ref()
                    .map_or("it has none".to_string(), |t| format!("TP rows: {:?}", t.axes()[0]))
            ));
        }
        let (fell_back, priced) = (self.tp_fallbacks.take(), self.tp_priced.take());
        if fell_back > 0 {
            notes.push(format!(
                "profile {}: {fell_back} prefill/decode lookups at a TP degree the tables have no rows for (TP rows: prefill {:?}, decode {:?}) were looked up at the nearest measured TP; {priced} of them add all-reduces priced from the measured all-reduce table{}",
                self.origin,
                self.prefill.axes()[stage_tp_axis(&self.prefill)],
                self.decode.axes()[stage_tp_axis(&self.decode)],
                self.all_reduce
                    .as_ref()
                    .map(|t| format!(" (TP {:?})", t.axes()[0]))
                    .unwrap_or_default()
            ));
        }
        for t in self.tables() {
            let c = t.counter.take();
            if c.extrapolated == 0 {
                continue;
            }
            let mut parts = Vec::new();
            for (d, &(below, above)) in c.per_axis.iter().enumerate() {
                let name = t.stage.axes()[d];
                let axis = &t.axes()[d];
                if below > 0 {
                    parts.push(format!("{name} below {} ({below})", axis[0]));
                }
                if above > 0 {
                    parts.push(format!("{name} above {} ({above})", axis[axis.len() - 1]));
                }
            }
            notes.push(format!(
                "profile {}: {} of {} {} lookups ({:.1} %) extrapolated beyond the table: {}",
                self.origin,
                c.extrapolated,
                c.lookups,
                t.label(),
                100.0 * c.extrapolated as f64 / c.lookups.max(1) as f64,
                parts.join(", ")
            ));
        }
        notes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::tests::{roof, small_grid};
    use crate::profile::{synthetic_item, GridSpec};

    fn rel(a: f64, b: f64) -> f64 {
        (a - b).abs() / b.abs().max(1e-300)
    }

    /// Errors between grid points: the median must stay under 1 % and the worst
    /// under `max_allowed`. The worst cases sit where the roofline has a kink
    /// inside a cell (no smooth measured curve has one): `max(compute, memory)`
    /// switching, e.g. a ~100-token prefill at 28 % of the SMs (up to ~17 % with
    /// the fitted GEMM efficiency), and the
    /// encode SM-share knee `min(share, tokens / tokens_to_fill_gpu)`, which
    /// moves `t_gpu` alone by up to ~21 % (the pass total, dominated by `t_pass`,
    /// far less).
    fn check_between(what: &str, mut errs: Vec<f64>, max_allowed: f64) {
        errs.sort_by(f64::total_cmp);
        let med = errs[errs.len() / 2];
        let max = errs[errs.len() - 1];
        println!(
            "{what}: {} points between the grid, median error {:.3} %, max {:.2} %",
            errs.len(),
            med * 100.0,
            max * 100.0
        );
        assert!(
            med < 0.01 && max < max_allowed,
            "{what}: median {med}, max {max}"
        );
    }

    /// At grid points the profile returns the roofline's figures (to rounding);
    /// at the geometric midpoints of every cell within a few % ([`check_between`]).
    #[test]
    fn roofline_profile_agrees_with_roofline() {
        let g = GridSpec::default();
        for (model, gpu) in [
            ("llava-v1.6-34b", "rtx-6000-ada"),
            ("qwen2.5-vl-32b", "h100-sxm"),
            ("ultravox-v0.6-27b", "a100-sxm4-80gb"),
        ] {
            let r = roof(model, gpu);
            let p = Profile::from_roofline(&r, &g, "2025-01-02");
            let mid = |v: &[u64], i: usize| ((v[i] as f64 * v[i + 1] as f64).sqrt()).round() as u64;
            let smid = |i: usize| (g.sm_levels[i] * g.sm_levels[i + 1]).sqrt();
            let (mut errs, mut gpu_errs) = (Vec::new(), Vec::new());
            for bi in 0..g.encode_batch.len() - 1 {
                for ti in 0..g.encode_tokens.len() - 1 {
                    for si in 0..g.sm_levels.len() - 1 {
                        let (b, n, s) = (g.encode_batch[bi], g.encode_tokens[ti], g.sm_levels[si]);
                        let items = vec![synthetic_item(&r.model, n); b as usize];
                        let want = r.encode(&items, s);
                        let got = StageCost::encode(&p, &items, s);
                        assert!(
                            rel(got.total(), want.total()) < 1e-9,
                            "{model} encode {b} {n} {s}"
                        );
                        assert!(
                            rel(got.t_gpu, want.t_gpu) < 1e-9,
                            "{model} encode {b} {n} {s}"
                        );
                        assert!(rel(got.t_pre, want.t_pre) < 1e-12);
                        assert_eq!(got.t_pass, want.t_pass);
                        let (b, n, s) = (
                            mid(&g.encode_batch, bi),
                            mid(&g.encode_tokens, ti),
                            smid(si),
                        );
                        let items = vec![synthetic_item(&r.model, n); b as usize];
                        let want = r.encode(&items, s);
                        let got = StageCost::encode(&p, &items, s);
                        errs.push(rel(got.total(), want.total()));
                        gpu_errs.push(rel(got.t_gpu, want.t_gpu));
                    }
                }
            }
            check_between(&format!("{model} encode"), errs, 0.10);
            check_between(&format!("{model} encode t_gpu"), gpu_errs, 0.25);
            let mut errs = Vec::new();
            for ni in 0..g.prefill_tokens.len() - 1 {
                for &tp in &g.tp {
                    for si in 0..g.sm_levels.len() - 1 {
                        let (n, s) = (g.prefill_tokens[ni], g.sm_levels[si]);
                        let (got, want) = (
                            StageCost::prefill(&p, &[n], tp.into(), s),
                            r.prefill(&[n], tp, s),
                        );
                        assert!(rel(got, want) < 1e-12);
                        let (n, s) = (mid(&g.prefill_tokens, ni), smid(si));
                        errs.push(rel(
                            StageCost::prefill(&p, &[n], tp.into(), s),
                            r.prefill(&[n], tp, s),
                        ));
                    }
                }
            }
            check_between(&format!("{model} prefill"), errs, 0.20);
            let mut errs = Vec::new();
            for bi in 0..g.decode_batch.len() - 1 {
                for ci in 0..g.decode_context.len() - 1 {
                    for &tp in &g.tp {
                        let (b, c) = (g.decode_batch[bi], g.decode_context[ci]);
                        assert!(
                            rel(p.decode_step(b, c, tp.into()), r.decode_step(b, c, tp)) < 1e-12
                        );
                        let (b, c) = (mid(&g.decode_batch, bi), mid(&g.decode_context, ci));
                        errs.push(rel(p.decode_step(b, c, tp.into()), r.decode_step(b, c, tp)));
                    }
                }
            }
            check_between(&format!("{model} decode"), errs, 0.15);
            let mut errs = Vec::new();
            for i in 0..g.transfer_bytes.len() - 1 {
                let b = g.transfer_bytes[i] as f64;
                assert!(rel(StageCost::transfer(&p, b), r.transfer(b)) < 1e-12);
                let b = mid(&g.transfer_bytes, i) as f64;
                errs.push(rel(StageCost::transfer(&p, b), r.transfer(b)));
            }
            check_between(&format!("{model} transfer"), errs, 0.10);
            assert_eq!(p.time_slice_penalty(), r.eff.time_slice_penalty);
            assert_eq!(p.bandwidth_interference(), r.eff.bandwidth_interference);
            // nothing above extrapolated: only the provenance note
            assert_eq!(p.notes().len(), 1, "{:?}", p.notes());
        }
    }

    /// The measured CPU profile shipped for tiny-image.
    fn tiny_image_cpu() -> Profile {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../scenarios/profiles/tiny-image.cpu.toml"
        );
        Profile::load(path).unwrap()
    }

    /// `q` has a `[table]` and writes back byte-identical after a read.
    fn assert_reads_back(q: &Profile, table: &str) {
        let text = q.to_toml_string();
        assert!(text.contains(&format!("\n[{table}]\n")), "{text}");
        let back =
            Profile::from_toml_str_with_devices(&text, "x", &["cpu".into()], &["loopback".into()])
                .unwrap();
        assert_eq!(back.to_toml_string(), text);
    }

    /// An encode worker at TP 2 is looked up in the `encode_tp` rows at TP 2
    /// (its GPU phase at a share below 1 scaled as the TP 1 table scales);
    /// a TP without rows, or a profile without the table, is priced as at
    /// TP 1 and the notes say so; rows at TP 1 are refused; the table
    /// survives a write and a read.
    #[test]
    fn encode_is_looked_up_at_the_workers_tp_or_falls_back_with_a_note() {
        let p = tiny_image_cpu();
        let row = |b: f64, n: f64, m: f64| vec![2.0, b, n, m, m * 1.1, 0.0, 1e-3 * b];
        let rows = vec![
            row(1.0, 195.0, 0.010),
            row(1.0, 325.0, 0.012),
            row(2.0, 195.0, 0.018),
            row(2.0, 325.0, 0.024),
        ];
        let q = p.clone().with_encode_tp(rows.clone()).unwrap();
        assert_reads_back(&q, "encode_tp");
        let item = ItemTokens {
            encoder_tokens: 195,
            llm_tokens: 144,
            attn_span: 65,
        };
        let two = q.encode_tp(&[item; 2], 1.0, 2);
        assert!(rel(two.t_gpu, 0.018 - 2e-3) < 1e-12, "{two:?}");
        assert!(rel(two.t_pre, 2e-3) < 1e-12 && two.t_pass == 0.0);
        let ratio = p.encode(&[item; 2], 0.5).t_gpu / p.encode(&[item; 2], 1.0).t_gpu;
        let half = q.encode_tp(&[item; 2], 0.5, 2).t_gpu;
        assert!(rel(half, two.t_gpu * ratio) < 1e-12, "{half}");
        assert!(q.notes().iter().all(|n| !n.contains("priced as at TP 1")));
        // TP 4 has no rows: the TP 1 table, and a note
        assert_eq!(q.encode_tp(&[item], 1.0, 4), q.encode(&[item], 1.0));
        let notes = q.notes();
        assert!(
            notes
                .iter()
                .any(|n| n.contains("1 encode lookups at a TP > 1")
                    && n.contains("TP rows: [2.0]")
                    && n.contains("priced as at TP 1")),
            "{notes:?}"
        );
        // a profile without the table: TP 1's figures, and a note
        assert_eq!(p.encode_tp(&[item], 1.0, 2), p.encode(&[item], 1.0));
        assert!(p.notes().iter().any(|n| n.contains("it has none")));
        // rows at TP 1 belong in [encode]
        let mut at1 = rows;
        for r in &mut at1 {
            r[0] = 1.0;
        }
        let e = p.with_encode_tp(at1).unwrap_err().to_string();
        assert!(e.contains("encode_tp") && e.contains("tp = 1"), "{e}");
    }

    /// A `kv_land` table prices landing a cache at the worker's TP and
    /// size (0 without the table, or for no tokens), survives a write and a
    /// read, and is refused where the latency falls with `tokens`.
    #[test]
    fn the_kv_land_table_prices_landing_and_reads_back() {
        let p = tiny_image_cpu();
        assert_eq!(p.kv_land(2, 1024), 0.0);
        let rows = vec![
            vec![1.0, 64.0, 1e-4, 2e-4],
            vec![1.0, 1024.0, 2e-3, 3e-3],
            vec![2.0, 64.0, 2e-3, 3e-3],
            vec![2.0, 1024.0, 3e-2, 4e-2],
        ];
        let q = p.clone().with_kv_land(rows.clone()).unwrap();
        assert_reads_back(&q, "kv_land");
        assert!(rel(q.kv_land(2, 1024), 3e-2) < 1e-12);
        assert!(rel(q.kv_land(1, 64), 1e-4) < 1e-12);
        assert!(q.kv_land(2, 256) > 2e-3 && q.kv_land(2, 256) < 3e-2);
        assert_eq!(q.kv_land(2, 0), 0.0);
        let mut falling = rows;
        falling[3][2] = 1e-3;
        let e = p.with_kv_land(falling).unwrap_err().to_string();
        assert!(e.contains("kv_land"), "{e}");
    }

    /// A measured profile with TP 1 stage rows and an all-reduce table at
    /// TP 2: a TP 2 lookup is the TP 1 row plus two all-reduces per layer of
    /// `rows × hidden × 4` bytes from the table, and the notes say so; the
    /// table survives a write and a read.
    #[test]
    fn a_missing_tp_row_adds_the_measured_all_reduces() {
        let p = tiny_image_cpu();
        let ar = vec![
            vec![2.0, 1024.0, 1e-4, 2e-4],
            vec![2.0, 1048576.0, 3e-3, 4e-3],
        ];
        let q = p.clone().with_all_reduce(ar).unwrap();
        assert_reads_back(&q, "all_reduce");
        let arch = easerve_model::ModelArch::preset("tiny-image").unwrap();
        let bytes = 64.0 * f64::from(arch.llm.hidden) * 4.0;
        let t = |x: f64| (x.ln() - 1024f64.ln()) / (1048576f64.ln() - 1024f64.ln());
        let per = (1e-4f64.ln() + t(bytes) * (3e-3f64.ln() - 1e-4f64.ln())).exp();
        let want = p.prefill(&[64], 1.into(), 1.0) + 2.0 * f64::from(arch.llm.layers) * per;
        let got = q.prefill(&[64], 2.into(), 1.0);
        assert!(rel(got, want) < 1e-9, "{got} vs {want}");
        let notes = q.notes();
        assert!(
            notes
                .iter()
                .any(|n| n.contains("1 prefill/decode lookups at a TP degree")
                    && n.contains("1 of them add all-reduces")),
            "{notes:?}"
        );
        // TP 1, and a profile without the table, are as before
        assert_eq!(
            q.prefill(&[64], 1.into(), 1.0),
            p.prefill(&[64], 1.into(), 1.0)
        );
        assert_eq!(
            p.decode_step(4, 64, 2.into()),
            p.decode_step(4, 64, 1.into())
        );
    }

    #[test]
    fn extrapolation_is_reported_once_with_counts_and_then_reset() {
        let p = Profile::from_roofline(
            &roof("llava-v1.6-34b", "rtx-6000-ada"),
            &small_grid(),
            "2025-01-02",
        );
        for _ in 0..3 {
            p.prefill(&[4096], 2.into(), 1.0); // tokens above 1024
        }
        p.prefill(&[512], 2.into(), 1.0);
        p.decode_step(4, 4096, 8.into()); // tp above 2
        let notes = p.notes();
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(
            notes[1].contains("3 of 4 prefill lookups")
                && notes[1].contains("tokens above 1024 (3)"),
            "{}",
            notes[1]
        );
        assert!(
            notes[2].contains("1 of 1 decode lookups") && notes[2].contains("tp above 2 (1)"),
            "{}",
            notes[2]
        );
        // extrapolating tokens extends the edge cell (grows), never clamps
        assert!(p.prefill(&[4096], 2.into(), 1.0) > p.prefill(&[1024], 2.into(), 1.0));
        let _ = p.notes();
        assert_eq!(p.notes().len(), 1);
    }

    #[test]
    fn empty_work_costs_nothing() {
        let p = Profile::from_roofline(
            &roof("llava-v1.6-34b", "rtx-6000-ada"),
            &small_grid(),
            "2025-01-02",
        );
        assert_eq!(StageCost::encode(&p, &[], 1.0), EncodeTime::default());
        assert_eq!(StageCost::prefill(&p, &[], 2.into(), 1.0), 0.0);
        assert_eq!(p.decode_step(0, 0, 2.into()), 0.0);
        assert_eq!(StageCost::transfer(&p, 0.0), 0.0);
        let t = Profile::from_roofline(
            &roof("text-lm-tiny", "rtx-6000-ada"),
            &small_grid(),
            "2025-01-02",
        );
        assert!(t.encode_table().is_none());
        let item = ItemTokens {
            encoder_tokens: 100,
            llm_tokens: 10,
            attn_span: 100,
        };
        assert_eq!(StageCost::encode(&t, &[item], 1.0), EncodeTime::default());
    }
}
