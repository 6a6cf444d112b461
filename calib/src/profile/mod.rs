//! Profiles: per-stage latency tables of one model × device, with provenance.
//!
//! One format for every source (DESIGN.md "Cost"): a profile written from the
//! roofline ([`Profile::from_roofline`]), measured on hardware (the executor's
//! `easerve profile`), or imported. The file format is TOML, documented with an
//! example in `calib/README.md`; [`Profile::to_toml_string`] writes it in one
//! canonical layout, so written → read → written is byte-identical.
//!
//! Tables (latencies in the table's `unit`, stored as written):
//!
//! | table        | axes (in this order)                      | value columns                           |
//! |--------------|-------------------------------------------|-----------------------------------------|
//! | `encode`     | `batch`, `encoder_tokens`, `sm_level`     | `median`, optional `p90`, `t_pass`, `t_pre` |
//! | `prefill`    | `tokens`, `tp`, `sm_level`                | `median`, optional `p90`                |
//! | `decode`     | `batch`, `context_tokens`, `tp`           | `median`, optional `p90`                |
//! | `[[transfer]]` (one per `link`) | `bytes`                | `median`, optional `p90`                |
//! | `all_reduce` (optional)  | `tp`, `bytes`                 | `median`, optional `p90`                |
//! | `encode_tp` (optional)   | `tp` (≥ 2), `batch`, `encoder_tokens` | as `encode`                     |
//! | `kv_land` (optional, CPU) | `tp`, `tokens`               | `median`, optional `p90`                |
//! | `host_sharing` (optional, CPU) | `demand_threads`               | `slowdown` (no unit; [`HostSharing`]) |
//! | `host_sharing`'s `tp_rows` (optional) | `tp` (≥ 2), `demand_threads` | a rank group's `slowdown` |
//!
//! `batch` of encode counts items (images, videos, audio clips) in one pass;
//! `encoder_tokens` is tokens per item; `tokens` of prefill is the batch's
//! total prompt tokens; `context_tokens` of decode is the total over the batch.
//! `encode_tp` times an encode worker at TP > 1 on its whole devices; an
//! encode lookup at a TP without its rows uses `encode` (TP 1) and says so.
//! `kv_land` times landing one sequence's KV cache of `tokens` positions on a
//! decode worker at TP `tp` at its first step ([`StageCost::kv_land`](crate::StageCost::kv_land)).
//! Lookups interpolate multi-linearly in `ln(axis)` ([`crate::interp`]) and count
//! lookups outside the table, reported once per run by [`StageCost::notes`](crate::StageCost::notes).
//!
//! # Where it is
//! * `format.rs`: the types — [`Profile`], [`Table`], [`Provenance`],
//!   [`Source`], [`Stage`], [`TimeUnit`], [`PrefillBatching`], [`ProfileError`],
//!   [`FORMAT_VERSION`] and [`MONOTONE_TOLERANCE`].
//! * `parse.rs`: reading and validating a profile ([`Profile::load`],
//!   [`Profile::from_toml_str`]) and replacing a table's rows
//!   ([`Profile::set_rows`]).
//! * `write.rs`: the canonical layout ([`Profile::to_toml_string`],
//!   [`Profile::save`]).
//! * `make.rs`: profiles sampled from a cost model on a [`GridSpec`]
//!   ([`Profile::from_roofline`], [`Profile::from_cost`]) or built from
//!   measured rows ([`Profile::from_measurements`], [`monotone_envelope`]).
//! * `cost.rs`: `impl StageCost for Profile`.
//! * `mod.rs` (here): the table accessors and [`today_utc`].

mod cost;
mod format;
mod host_sharing;
mod make;
mod parse;
mod write;

pub use format::{
    PrefillBatching, Profile, ProfileError, Provenance, Source, Stage, Table, TimeUnit,
    FORMAT_VERSION, MONOTONE_TOLERANCE,
};
pub use host_sharing::{HostSharing, HOST_SHARING_COLUMNS, HOST_SHARING_TP_COLUMNS};
pub use make::{monotone_envelope, monotone_envelope_columns, synthetic_item, GridSpec};

impl Profile {
    /// The encode table (absent for a text-only model).
    pub fn encode_table(&self) -> Option<&Table> {
        self.encode.as_ref()
    }
    /// The prefill table.
    pub fn prefill_table(&self) -> &Table {
        &self.prefill
    }
    /// The decode table.
    pub fn decode_table(&self) -> &Table {
        &self.decode
    }
    /// The transfer tables, one per link.
    pub fn transfer_tables(&self) -> &[Table] {
        &self.transfer
    }
    /// The encode table at TP > 1 (`tp`, `batch`, `encoder_tokens`), where
    /// the profile measured one.
    pub fn encode_tp_table(&self) -> Option<&Table> {
        self.encode_tp.as_ref()
    }
    /// The all-reduce table (`tp`, `bytes`), where the profile measured one.
    pub fn all_reduce_table(&self) -> Option<&Table> {
        self.all_reduce.as_ref()
    }
    /// The KV landing table (`tp`, `tokens`), where the profile measured one.
    pub fn kv_land_table(&self) -> Option<&Table> {
        self.kv_land.as_ref()
    }
    /// The host's measured oversubscription curve, where the profile has
    /// one (`[host_sharing]`, a CPU profile).
    pub fn host_sharing(&self) -> Option<&HostSharing> {
        self.host_sharing.as_ref()
    }
    /// This profile with the host's measured oversubscription curve
    /// (`None`: without one).
    pub fn with_host_sharing(mut self, curve: Option<HostSharing>) -> Profile {
        self.host_sharing = curve;
        self
    }
}

/// Today's date (UTC) as `YYYY-MM-DD`, from the system clock.
pub fn today_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Days since 1970-01-01 → (year, month, day) in the proleptic Gregorian
/// calendar (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roofline::Roofline;

    pub(super) fn roof(model: &str, gpu: &str) -> Roofline {
        crate::roofline::preset_roofline(model, gpu)
    }

    pub(super) fn small_grid() -> GridSpec {
        GridSpec {
            encode_batch: vec![1, 2, 4],
            encode_tokens: vec![256, 1024],
            sm_levels: vec![0.5, 1.0],
            prefill_tokens: vec![128, 1024],
            tp: vec![1, 2],
            decode_batch: vec![1, 8],
            decode_context: vec![1024, 8192],
            transfer_bytes: vec![1024, 1 << 20],
        }
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(today_utc().len(), 10);
    }
}
