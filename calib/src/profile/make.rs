//! Making a profile: sampled from a cost model on a [`GridSpec`]
//! ([`Profile::from_roofline`], [`Profile::from_cost`], timing a
//! [`synthetic_item`] per encode grid point), or from measured rows
//! ([`Profile::from_measurements`]), with [`monotone_envelope`] to take timing
//! noise out of the rows first.

use easerve_model::ItemTokens;

use super::format::is_work_axis;
use super::{PrefillBatching, Profile, ProfileError, Provenance, Source, Stage, Table, TimeUnit};
use crate::gpu::GpuSpec;
use crate::roofline::Roofline;
use crate::StageCost;

/// Axis values of a profile written from the roofline.
#[derive(Clone, Debug, PartialEq)]
pub struct GridSpec {
    /// Items per encode pass.
    pub encode_batch: Vec<u64>,
    /// Encoder tokens per item.
    pub encode_tokens: Vec<u64>,
    /// SM levels (fraction of the GPU's SMs) for encode and prefill.
    pub sm_levels: Vec<f64>,
    /// Prefill batch tokens.
    pub prefill_tokens: Vec<u64>,
    /// TP degrees for prefill and decode.
    pub tp: Vec<u32>,
    /// Sequences per decode step.
    pub decode_batch: Vec<u64>,
    /// Total context tokens of a decode batch.
    pub decode_context: Vec<u64>,
    /// Bytes per transfer.
    pub transfer_bytes: Vec<u64>,
}

fn pow2(lo: u32, hi: u32) -> Vec<u64> {
    (lo..=hi).map(|e| 1u64 << e).collect()
}

/// Powers of √2 from `2^lo` to `2^hi`, rounded to integers.
fn pow_sqrt2(lo: u32, hi: u32) -> Vec<u64> {
    let mut v: Vec<u64> = (2 * lo..=2 * hi)
        .map(|e| (2f64.powf(f64::from(e) / 2.0)).round() as u64)
        .collect();
    v.dedup();
    v
}

impl Default for GridSpec {
    /// Five SM levels 0.2, 0.4, 0.6, 0.8, 1.0; encode batches 1..64 (powers of 2)
    /// × 32..65536 encoder tokens per item (powers of √2); prefill 16..131072
    /// tokens (powers of √2) × TP 1, 2, 4, 8; decode batches 1..512 (powers of √2:
    /// the compute/memory switch lies in this range) × 256..2^24 total context
    /// tokens (powers of 2); transfers 1 KiB..64 GiB (powers of 2).
    fn default() -> Self {
        GridSpec {
            encode_batch: pow2(0, 6),
            encode_tokens: pow_sqrt2(5, 16),
            sm_levels: vec![0.2, 0.4, 0.6, 0.8, 1.0],
            prefill_tokens: pow_sqrt2(4, 17),
            tp: vec![1, 2, 4, 8],
            decode_batch: pow_sqrt2(0, 9),
            decode_context: pow2(8, 24),
            transfer_bytes: pow2(10, 36),
        }
    }
}

/// A representative item of `n` encoder tokens for `model`'s encoder family, used
/// to time encode grid points from the roofline:
/// * CLIP anyres: tiles of `(image_size/patch)^2 + 1` tokens, span one tile;
/// * Qwen ViT: one image, span = all its tokens, `n / merge^2` LLM tokens;
/// * Whisper: 30 s windows of `frames_per_window` frames, `n / stack` LLM tokens;
/// * tiled ViT: tiles of `(image_size/patch)^2 + 1` tokens, a quarter (pixel
///   shuffle 2) of the patches as LLM tokens;
/// * Qwen3-Omni audio: one token per LLM token, windows of 104.
pub fn synthetic_item(model: &easerve_model::ModelArch, n: u64) -> ItemTokens {
    use easerve_model::EncoderKind;
    let n = n.max(1);
    match model.encoder.as_ref().map(|e| &e.kind) {
        Some(EncoderKind::ClipAnyres {
            image_size, patch, ..
        }) => {
            let side = u64::from(image_size / patch.max(&1));
            let tile = side * side + 1;
            ItemTokens {
                encoder_tokens: n,
                llm_tokens: n,
                attn_span: n.min(tile),
            }
        }
        Some(EncoderKind::Siglip {
            image_size,
            patch,
            pooled_side,
            ..
        }) => {
            let side = u64::from(image_size / patch.max(&1)).max(1);
            let per = (side * side) / u64::from(*pooled_side).pow(2).max(1);
            ItemTokens {
                encoder_tokens: n,
                llm_tokens: (n / per.max(1)).max(1),
                attn_span: n.min(side * side),
            }
        }
        Some(EncoderKind::TiledVit {
            image_size,
            patch,
            pixel_shuffle,
            ..
        }) => {
            let side = u64::from(image_size / patch.max(&1)).max(1);
            let tile = side * side + 1;
            let per = side * side / u64::from(*pixel_shuffle).pow(2).max(1);
            ItemTokens {
                encoder_tokens: n,
                llm_tokens: (n * per / tile).max(1),
                attn_span: n.min(tile),
            }
        }
        Some(EncoderKind::OmniAudio {
            chunk_frames,
            window_chunks,
            ..
        }) => {
            let per =
                easerve_model::tokens::omni_audio_tokens(u64::from(*chunk_frames), *chunk_frames);
            ItemTokens {
                encoder_tokens: n,
                llm_tokens: n,
                attn_span: n.min(u64::from(*window_chunks) * per).max(1),
            }
        }
        Some(EncoderKind::QwenVit { spatial_merge, .. }) => {
            let m = u64::from(*spatial_merge).pow(2).max(1);
            ItemTokens {
                encoder_tokens: n,
                llm_tokens: (n / m).max(1),
                attn_span: n,
            }
        }
        Some(EncoderKind::Whisper {
            frames_per_window,
            stack,
            ..
        }) => ItemTokens {
            encoder_tokens: n,
            llm_tokens: (n / u64::from(*stack).max(1)).max(1),
            attn_span: n.min(u64::from(*frames_per_window)),
        },
        None => ItemTokens {
            encoder_tokens: n,
            llm_tokens: n,
            attn_span: n,
        },
    }
}

impl Profile {
    /// A profile of the roofline `r` on the grid `g`, dated `date` (`YYYY-MM-DD`).
    ///
    /// Each grid point is timed by `r` exactly: encode over `batch` copies of
    /// [`synthetic_item`] with `encoder_tokens` tokens, split into `t_pass`, `t_pre`
    /// and the GPU rest (`p90 = median`: the roofline is deterministic); prefill of
    /// **one** sequence of `tokens` tokens (so a lookup for several shorter
    /// sequences slightly overstates attention: a few % at 34B sizes); decode and
    /// transfer as [`Roofline::decode_step`] and [`Roofline::transfer`]. Latencies
    /// are written in seconds. A model without encoder gets no encode table.
    pub fn from_roofline(r: &Roofline, g: &GridSpec, date: &str) -> Profile {
        let e = &r.eff;
        let provenance = Provenance {
            model: r.model.name.clone(),
            device: r.gpu.name.clone(),
            link: r.gpu.link.name.clone(),
            source: Source::Roofline,
            backend: "none (computed)".into(),
            driver: "none (computed)".into(),
            libraries: vec![format!("easerve-calib {}", env!("CARGO_PKG_VERSION"))],
            date: date.into(),
            method: format!(
                "roofline max(flops/(peak*gemm_eff*usable), bytes/(bw*mem_eff)) + per-layer overhead + TP ring all-reduce; gemm_eff {} (fitted A100 curve of tokens and TP: {}), mem_eff {}, layer_overhead_s {}, {}, prefill_batch_s {}, decode_step_s {}, tokens_to_fill_gpu {}",
                e.gemm_eff, e.gemm_eff_from_fit, e.mem_eff, e.layer_overhead_s,
                match &r.terms {
                    Some(t) => format!("encode {}", t.note()),
                    None => format!(
                        "encode_pass_s {}, preprocess_item_s {}, preprocess_per_token_s {}",
                        e.encode_pass_s, e.preprocess_item_s, e.preprocess_per_token_s
                    ),
                },
                e.prefill_batch_s, e.decode_step_s, e.tokens_to_fill_gpu
            ),
            repetitions: 0,
            cores: None,
        };
        Profile::from_cost(
            r,
            &r.model,
            &r.gpu,
            provenance,
            g,
            (
                e.time_slice_penalty,
                e.bandwidth_interference,
                "easerve-calib Efficiency defaults (assumptions, see calib/src/eff.rs)",
            ),
        )
    }

    /// A profile of any stage cost `r` of `model` on `gpu` on the grid `g`, timed at
    /// each grid point exactly as [`Profile::from_roofline`] describes, with the
    /// given provenance and `(time_slice_penalty, bandwidth_interference, note)`.
    /// The sampled latencies are made non-decreasing along the work axes
    /// ([`monotone_envelope`]): a cost priced from measured kernels can dip between
    /// grid points where the tables switch kernels, and a profile may not; when
    /// that raises a value, `provenance.method` says how many.
    pub fn from_cost(
        r: &dyn StageCost,
        model: &easerve_model::ModelArch,
        gpu: &GpuSpec,
        mut provenance: Provenance,
        g: &GridSpec,
        scalars: (f64, f64, &str),
    ) -> Profile {
        let s = |v: &[u64]| -> Vec<f64> { v.iter().map(|&x| x as f64).collect() };
        let cols = |c: &[&str]| -> Vec<String> { c.iter().map(|x| x.to_string()).collect() };
        let mut raised = 0;
        let encode = model.encoder.as_ref().map(|_| {
            let mut rows = Vec::new();
            for &b in &g.encode_batch {
                for &n in &g.encode_tokens {
                    let items = vec![synthetic_item(model, n); b as usize];
                    for &sm in &g.sm_levels {
                        let t = r.encode(&items, sm);
                        let m = t.total();
                        rows.push(vec![b as f64, n as f64, sm, m, m, t.t_pass, t.t_pre]);
                    }
                }
            }
            raised += monotone_envelope(Stage::Encode, &mut rows);
            Table::build(
                Stage::Encode,
                None,
                TimeUnit::S,
                cols(&[
                    "batch",
                    "encoder_tokens",
                    "sm_level",
                    "median",
                    "p90",
                    "t_pass",
                    "t_pre",
                ]),
                rows,
            )
        });
        let mut rows = Vec::new();
        for &n in &g.prefill_tokens {
            for &tp in &g.tp {
                for &sm in &g.sm_levels {
                    rows.push(vec![
                        n as f64,
                        f64::from(tp),
                        sm,
                        r.prefill(&[n], tp.into(), sm),
                    ]);
                }
            }
        }
        raised += monotone_envelope(Stage::Prefill, &mut rows);
        let prefill = Table::build(
            Stage::Prefill,
            None,
            TimeUnit::S,
            cols(&["tokens", "tp", "sm_level", "median"]),
            rows,
        );
        let mut rows = Vec::new();
        for &b in &g.decode_batch {
            for &c in &g.decode_context {
                for &tp in &g.tp {
                    rows.push(vec![
                        b as f64,
                        c as f64,
                        f64::from(tp),
                        r.decode_step(b, c, tp.into()),
                    ]);
                }
            }
        }
        raised += monotone_envelope(Stage::Decode, &mut rows);
        if raised > 0 {
            provenance.method.push_str(&format!(
                "; {raised} sampled latencies raised to make them non-decreasing along work axes (running max)"
            ));
        }
        let decode = Table::build(
            Stage::Decode,
            None,
            TimeUnit::S,
            cols(&["batch", "context_tokens", "tp", "median"]),
            rows,
        );
        let rows = s(&g.transfer_bytes)
            .into_iter()
            .map(|b| vec![b, r.transfer(b)])
            .collect();
        let transfer = vec![Table::build(
            Stage::Transfer,
            Some(gpu.link.name.clone()),
            TimeUnit::S,
            cols(&["bytes", "median"]),
            rows,
        )];
        Profile {
            origin: format!(
                "<{} {} on {}>",
                provenance.source.as_str(),
                model.name,
                gpu.name
            ),
            provenance,
            time_slice_penalty: scalars.0,
            bandwidth_interference: scalars.1,
            scalars_note: scalars.2.into(),
            prefill_batching: PrefillBatching::Packed,
            encode,
            prefill,
            decode,
            transfer,
            all_reduce: None,
            kv_land: None,
            encode_tp: None,
            host_sharing: None,
            encode_tp_fallbacks: Default::default(),
            tp_fallbacks: Default::default(),
            tp_priced: Default::default(),
        }
    }

    /// A profile from measured rows, validated exactly as a file would be (full grid,
    /// axes sorted, latency non-decreasing along work axes within
    /// [`MONOTONE_TOLERANCE`](super::MONOTONE_TOLERANCE)). Rows use the standard columns in seconds: encode
    /// `[batch, encoder_tokens, sm_level, median, p90, t_pass, t_pre]`, prefill
    /// `[tokens, tp, sm_level, median, p90]`, decode `[batch, context_tokens, tp,
    /// median, p90]`, transfer `[bytes, median, p90]` over `provenance.link`. Rows may
    /// come in any order; pass them through [`monotone_envelope`] first to remove
    /// timing noise along work axes.
    ///
    /// Errors: what [`Profile::from_toml_str`] reports for the same tables.
    pub fn from_measurements(
        provenance: Provenance,
        scalars: (f64, f64, String),
        encode: Option<Vec<Vec<f64>>>,
        prefill: Vec<Vec<f64>>,
        decode: Vec<Vec<f64>>,
        transfer: Vec<Vec<f64>>,
    ) -> Result<Profile, ProfileError> {
        let table = measured_table;
        let link = provenance.link.clone();
        let p = Profile {
            origin: format!("<measured {} on {}>", provenance.model, provenance.device),
            time_slice_penalty: scalars.0,
            bandwidth_interference: scalars.1,
            scalars_note: scalars.2,
            prefill_batching: PrefillBatching::Padded,
            encode: encode.map(|r| table(Stage::Encode, None, r)),
            prefill: table(Stage::Prefill, None, prefill),
            decode: table(Stage::Decode, None, decode),
            transfer: vec![table(Stage::Transfer, Some(link.clone()), transfer)],
            all_reduce: None,
            kv_land: None,
            encode_tp: None,
            host_sharing: None,
            encode_tp_fallbacks: Default::default(),
            tp_fallbacks: Default::default(),
            tp_priced: Default::default(),
            provenance,
        };
        let extra_dev = [p.provenance.device.clone()];
        let checked = Profile::from_toml_str_with_devices(
            &p.to_toml_string(),
            &p.origin,
            &extra_dev,
            &[link],
        )?;
        Ok(checked)
    }
    /// This measured profile with an all-reduce table: rows `[tp, bytes,
    /// median, p90]` in seconds (one all-reduce of a `bytes` message among
    /// `tp` ranks; a full grid of `tp` × `bytes`, made non-decreasing along
    /// `bytes` by the caller), validated as a file would be.
    ///
    /// Errors: rows the profile's validation rejects (not a full grid, a
    /// value that is not finite and positive, latency falling with `bytes`).
    pub fn with_all_reduce(self, rows: Vec<Vec<f64>>) -> Result<Profile, ProfileError> {
        self.with_table(Stage::AllReduce, rows)
    }

    /// This measured profile with an encode table at TP > 1: rows `[tp,
    /// batch, encoder_tokens, median, p90, t_pass, t_pre]` in seconds (one
    /// pass of `batch` items of `encoder_tokens` tokens on an encode worker
    /// at TP `tp`; a full grid of `tp` × `batch` × `encoder_tokens`, made
    /// non-decreasing along the work axes by the caller), validated as a
    /// file would be.
    ///
    /// Errors: as [`Profile::with_all_reduce`], and rows at `tp` = 1.
    pub fn with_encode_tp(self, rows: Vec<Vec<f64>>) -> Result<Profile, ProfileError> {
        self.with_table(Stage::EncodeTp, rows)
    }

    /// This measured profile with a KV landing table: rows `[tp, tokens,
    /// median, p90]` in seconds (landing one sequence's cache of `tokens`
    /// positions on a decode worker at TP `tp`, see
    /// [`StageCost::kv_land`](crate::StageCost::kv_land); a full grid of
    /// `tp` × `tokens`, made non-decreasing along `tokens` by the caller),
    /// validated as a file would be.
    ///
    /// Errors: as [`Profile::with_all_reduce`].
    pub fn with_kv_land(self, rows: Vec<Vec<f64>>) -> Result<Profile, ProfileError> {
        self.with_table(Stage::KvLand, rows)
    }

    /// This profile with the optional table of `stage` (all-reduce, encode
    /// at TP > 1) from rows of its axes, `median` and optional columns,
    /// validated as a file would be.
    fn with_table(mut self, stage: Stage, rows: Vec<Vec<f64>>) -> Result<Profile, ProfileError> {
        let table = Some(measured_table(stage, None, rows));
        match stage {
            Stage::EncodeTp => self.encode_tp = table,
            Stage::KvLand => self.kv_land = table,
            _ => self.all_reduce = table,
        }
        let extra_dev = [self.provenance.device.clone()];
        let links: Vec<String> = self
            .transfer
            .iter()
            .filter_map(|t| t.link.clone())
            .collect();
        let origin = self.origin.clone();
        Profile::from_toml_str_with_devices(&self.to_toml_string(), &origin, &extra_dev, &links)
    }
}

/// A table of `stage` from measured rows in seconds in any order: its axes,
/// `median` and optional columns (the caller validates it).
fn measured_table(stage: Stage, link: Option<String>, mut rows: Vec<Vec<f64>>) -> Table {
    let n = stage.axes().len();
    rows.sort_by(|a, b| {
        a[..n]
            .iter()
            .zip(&b[..n])
            .map(|(x, y)| x.total_cmp(y))
            .find(|o| o.is_ne())
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let cols: Vec<String> = (stage.axes().iter())
        .chain(&["median"])
        .chain(stage.optional_columns())
        .map(|c| c.to_string())
        .collect();
    Table::build(stage, link, TimeUnit::S, cols, rows)
}

/// Make the `median` and `p90` of measured rows of `stage` non-decreasing along its
/// work axes (a running maximum over the grid), so timing noise between neighbouring
/// points does not make a table non-monotone. Rows are `[axes..., median, p90, ...]`
/// as for [`Profile::from_measurements`]; other columns are left as measured.
/// Returns how many values (medians and p90s) it raised.
pub fn monotone_envelope(stage: Stage, rows: &mut [Vec<f64>]) -> usize {
    let na = stage.axes().len();
    envelope_at(stage, &[na, na + 1], rows)
}

/// [`monotone_envelope`] for rows laid out as `columns` (the axes first, then value
/// columns in any order, e.g. a table read from a file): raises the `median` and
/// `p90` columns wherever they are, and leaves every other column as measured.
pub fn monotone_envelope_columns(stage: Stage, columns: &[String], rows: &mut [Vec<f64>]) -> usize {
    let at: Vec<usize> = ["median", "p90"]
        .iter()
        .filter_map(|name| columns.iter().position(|c| c == name))
        .collect();
    envelope_at(stage, &at, rows)
}

fn envelope_at(stage: Stage, value_cols: &[usize], rows: &mut [Vec<f64>]) -> usize {
    let before: Vec<Vec<f64>> = rows.to_vec();
    let axes = stage.axes();
    let na = axes.len();
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by(|&i, &j| {
        rows[i][..na]
            .iter()
            .zip(&rows[j][..na])
            .map(|(x, y)| x.total_cmp(y))
            .find(|o| o.is_ne())
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    // Lexicographic order visits every lower point along each axis first.
    for _ in 0..na {
        for a in 0..na {
            if !is_work_axis(stage, axes[a]) {
                continue;
            }
            for (pos, &i) in order.iter().enumerate() {
                let prev = order[..pos].iter().rev().find(|&&j| {
                    (0..na).all(|d| d == a || rows[j][d] == rows[i][d]) && rows[j][a] < rows[i][a]
                });
                if let Some(&j) = prev {
                    for &c in value_cols {
                        if c < rows[i].len() && rows[i][c] < rows[j][c] {
                            rows[i][c] = rows[j][c];
                        }
                    }
                }
            }
        }
    }
    rows.iter()
        .zip(&before)
        .map(|(r, b)| r.iter().zip(b).filter(|(x, y)| x != y).count())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_finds_median_and_p90_by_name() {
        // Prefill rows laid out [tokens, tp, sm_level, p90, t_extra, median]: the
        // 1024-token point dips below the 128-token point in median and p90.
        let columns: Vec<String> = ["tokens", "tp", "sm_level", "p90", "t_extra", "median"]
            .iter()
            .map(|c| c.to_string())
            .collect();
        let mut rows = vec![
            vec![128.0, 1.0, 1.0, 0.012, 5.0, 0.010],
            vec![1024.0, 1.0, 1.0, 0.011, 1.0, 0.009],
        ];
        let raised = monotone_envelope_columns(Stage::Prefill, &columns, &mut rows);
        assert_eq!(raised, 2);
        assert_eq!(rows[1], vec![1024.0, 1.0, 1.0, 0.012, 1.0, 0.010]);
        // The positional form would have raised column 3 and 4 (p90, t_extra).
        let mut positional = vec![
            vec![128.0, 1.0, 1.0, 0.012, 5.0, 0.010],
            vec![1024.0, 1.0, 1.0, 0.011, 1.0, 0.009],
        ];
        monotone_envelope(Stage::Prefill, &mut positional);
        assert_eq!(positional[1][4], 5.0);
    }
}
