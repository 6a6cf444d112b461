//! Trace replay: arrival times and token counts from a production trace.
//!
//! Format: the Azure LLM inference trace (Azure Public Dataset, 2023; used by
//! Splitwise, ISCA'24): a CSV with header `TIMESTAMP,ContextTokens,GeneratedTokens`,
//! timestamps like `2023-11-16 18:15:46.6805900`, one row per request in arrival
//! order.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// One request of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceRow {
    /// Arrival, seconds after the trace's first request (after rate scaling).
    pub t: f64,
    /// Prompt tokens (`ContextTokens`).
    pub prompt_tokens: u32,
    /// Output tokens (`GeneratedTokens`, at least 1).
    pub output_tokens: u32,
}

/// Why a trace could not be read: the row (1-based, header = row 1) and what is wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct TraceError {
    /// 1-based line number in the CSV (0 = the file as a whole).
    pub row: usize,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for TraceError {
    /// `row N: message`, or the message alone for the file as a whole.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.row {
            0 => f.write_str(&self.message),
            row => write!(f, "row {row}: {}", self.message),
        }
    }
}

#[derive(Deserialize)]
struct RawRow {
    #[serde(rename = "TIMESTAMP")]
    timestamp: String,
    #[serde(rename = "ContextTokens")]
    context_tokens: i64,
    #[serde(rename = "GeneratedTokens")]
    generated_tokens: i64,
}

/// Read the first `limit` rows of an Azure-format trace; times are relative to
/// the first row and not yet scaled.
///
/// # Errors
/// An unreadable file, a missing column, a timestamp that does not parse,
/// negative token counts, or timestamps that go back.
pub fn read_azure(path: &Path, limit: usize) -> Result<Vec<TraceRow>, TraceError> {
    let whole = |message: String| TraceError { row: 0, message };
    if path.is_dir() {
        return Err(whole(
            "is a folder; give the trace's CSV file (Azure LLM inference trace format)".into(),
        ));
    }
    // a device or FIFO would be read without end; a regular file streams
    easerve_calib::input::check_regular(path).map_err(|e| whole(format!("cannot read: {e}")))?;
    let mut reader =
        csv::Reader::from_path(path).map_err(|e| whole(format!("cannot read: {e}")))?;
    let mut rows = Vec::new();
    let mut first: Option<chrono::NaiveDateTime> = None;
    let mut last_t = 0.0;
    for (i, rec) in reader.deserialize::<RawRow>().enumerate() {
        if rows.len() >= limit {
            break;
        }
        let row = i + 2;
        let err = |message: String| TraceError { row, message };
        let r = rec.map_err(|e| {
            err(format!(
                "{e}; expected columns TIMESTAMP,ContextTokens,GeneratedTokens"
            ))
        })?;
        let ts = chrono::NaiveDateTime::parse_from_str(r.timestamp.trim(), "%Y-%m-%d %H:%M:%S%.f")
            .map_err(|e| {
                err(format!(
                    "TIMESTAMP `{}`: {e}; expected like 2023-11-16 18:15:46.6805900",
                    r.timestamp
                ))
            })?;
        let t0 = *first.get_or_insert(ts);
        let t = (ts - t0).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6;
        if t < last_t {
            return Err(err(format!(
                "TIMESTAMP `{}` is earlier than the row before",
                r.timestamp
            )));
        }
        last_t = t;
        // the same bounds as workload.input_len / output_len; a request has
        // at least one prompt token (a run of empty requests takes no time)
        if !(1..=10_000_000).contains(&r.context_tokens)
            || !(0..=10_000_000).contains(&r.generated_tokens)
        {
            return Err(err(format!(
                "ContextTokens {} and GeneratedTokens {}: allowed 1 ..= 10^7 and 0 ..= 10^7",
                r.context_tokens, r.generated_tokens
            )));
        }
        rows.push(TraceRow {
            t,
            prompt_tokens: r.context_tokens as u32,
            output_tokens: (r.generated_tokens.clamp(1, u32::MAX as i64)) as u32,
        });
    }
    if rows.is_empty() {
        return Err(whole("the trace has no requests".into()));
    }
    Ok(rows)
}

/// Mean arrival rate of a trace, requests/s: `(n − 1)` gaps over the span from
/// the first to the last arrival (`n` when the span is zero).
pub fn mean_rate(rows: &[TraceRow]) -> f64 {
    let span = rows.last().map_or(0.0, |r| r.t);
    if span > 0.0 {
        (rows.len() - 1) as f64 / span
    } else {
        rows.len() as f64
    }
}

/// Speed a trace up by `scale` (> 1 = more requests per second).
pub fn scale(rows: &mut [TraceRow], scale: f64) {
    for r in rows {
        r.t /= scale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    #[test]
    fn reads_azure_rows_relative_to_the_first() {
        let f = file("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5000000,374,44\n2023-11-16 18:15:48.0000000,396,0\n");
        let rows = read_azure(f.path(), 10).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].t, 0.0);
        assert!((rows[1].t - 1.5).abs() < 1e-9);
        assert_eq!(rows[1].output_tokens, 1);
        assert!((mean_rate(&rows) - 1.0 / 1.5).abs() < 1e-9);
    }

    #[test]
    fn bad_rows_are_named() {
        let f = file("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,374,44\nyesterday,1,1\n");
        assert_eq!(read_azure(f.path(), 10).unwrap_err().row, 3);
        let f = file("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,374,44\n2023-11-16 18:15:40.5,1,1\n");
        assert!(read_azure(f.path(), 10)
            .unwrap_err()
            .message
            .contains("earlier"));
        let f = file("when,tokens\n1,2\n");
        assert_eq!(read_azure(f.path(), 10).unwrap_err().row, 2);
    }

    #[test]
    fn azure_conversation_trace_if_present() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../shared/data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv");
        if !path.exists() {
            eprintln!(
                "skipped: {} is absent (third-party data, see ../shared/data/README.md)",
                path.display()
            );
            return;
        }
        let rows = read_azure(&path, usize::MAX).unwrap();
        assert_eq!(rows.len(), 19_366);
        let rate = mean_rate(&rows);
        assert!((4.0..7.0).contains(&rate), "mean rate {rate}");
    }
}
