//! Trace replay: arrival times and token counts from a production trace.
//!
//! Format: the Azure LLM inference trace (Azure Public Dataset, 2023; used by
//! Splitwise, ISCA'24): a CSV with header `TIMESTAMP,ContextTokens,GeneratedTokens`,
//! timestamps like `2023-11-16 18:15:46.6805900`, one row per request in arrival
//! order. Two optional columns say what repeats: `ItemHashes`, the content
//! hash of each media item of the request (16 hexadecimal digits each, 64
//! bits, separated by `;`, earlier turns' items first), and
//! `ConversationId`, which groups a conversation's turns ([`TraceContent`]).

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
    #[serde(rename = "ItemHashes", default)]
    item_hashes: Option<String>,
    #[serde(rename = "ConversationId", default)]
    conversation_id: Option<String>,
}

/// What a trace's optional columns say repeats: per row, its items'
/// content hashes and its conversation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceContent {
    /// `starts[i]..starts[i + 1]` indexes row `i`'s hashes in `hashes`.
    pub starts: Vec<usize>,
    /// Every row's item hashes, in order.
    pub hashes: Vec<u64>,
    /// Each row's conversation (`ConversationId`), if given.
    pub conversations: Vec<Option<u64>>,
}

impl TraceContent {
    /// Row `i`'s item hashes.
    pub fn items(&self, i: usize) -> &[u64] {
        &self.hashes[self.starts[i]..self.starts[i + 1]]
    }

    /// Whether neither column had a value.
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty() && self.conversations.iter().all(Option::is_none)
    }
}

/// Row `row`'s `ItemHashes` field, parsed into `out`.
fn parse_hashes(text: &str, row: usize, out: &mut Vec<u64>) -> Result<(), TraceError> {
    for h in text.split(';').map(str::trim).filter(|h| !h.is_empty()) {
        if h.len() != 16 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(TraceError {
                row,
                message: format!(
                    "ItemHashes `{h}`: each hash is 16 hexadecimal digits (64 bits), hashes separated by `;`"
                ),
            });
        }
        out.push(u64::from_str_radix(h, 16).expect("16 hex digits"));
    }
    Ok(())
}

/// The conversation id of a row: the value's own 64-bit FNV-1a hash, so
/// any text names a conversation.
fn conversation_of(text: Option<&str>) -> Option<u64> {
    let t = text.map(str::trim).filter(|t| !t.is_empty())?;
    Some(t.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    }))
}

/// Read the first `limit` rows of an Azure-format trace; times are relative to
/// the first row and not yet scaled.
///
/// # Errors
/// An unreadable file, a missing column, a timestamp that does not parse,
/// negative token counts, or timestamps that go back.
pub fn read_azure(path: &Path, limit: usize) -> Result<Vec<TraceRow>, TraceError> {
    read_azure_content(path, limit).map(|(rows, _)| rows)
}

/// [`read_azure`] and what its optional `ItemHashes` and `ConversationId`
/// columns say.
///
/// # Errors
/// As [`read_azure`], and a hash that is not 16 hexadecimal digits.
pub fn read_azure_content(
    path: &Path,
    limit: usize,
) -> Result<(Vec<TraceRow>, TraceContent), TraceError> {
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
    let mut content = TraceContent {
        starts: vec![0],
        ..TraceContent::default()
    };
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
        parse_hashes(
            r.item_hashes.as_deref().unwrap_or(""),
            row,
            &mut content.hashes,
        )?;
        content.starts.push(content.hashes.len());
        content
            .conversations
            .push(conversation_of(r.conversation_id.as_deref()));
        rows.push(TraceRow {
            t,
            prompt_tokens: r.context_tokens as u32,
            output_tokens: (r.generated_tokens.clamp(1, u32::MAX as i64)) as u32,
        });
    }
    if rows.is_empty() {
        return Err(whole("the trace has no requests".into()));
    }
    Ok((rows, content))
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
    fn item_hashes_and_conversations_are_read_and_bad_widths_named() {
        let f = file("TIMESTAMP,ContextTokens,GeneratedTokens,ItemHashes,ConversationId\n2023-11-16 18:15:46.5,374,44,00000000000000ff;0123456789abcdef,c1\n2023-11-16 18:15:47.5,500,10,,\n");
        let (rows, c) = read_azure_content(f.path(), 10).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(c.items(0), [0xff, 0x0123_4567_89ab_cdef]);
        assert!(c.items(1).is_empty());
        assert!(c.conversations[0].is_some() && c.conversations[1].is_none());
        let f = file("TIMESTAMP,ContextTokens,GeneratedTokens,ItemHashes\n2023-11-16 18:15:46.5,374,44,abc\n");
        let e = read_azure_content(f.path(), 10).unwrap_err();
        assert_eq!(e.row, 2);
        assert!(e.message.contains("16 hexadecimal digits"), "{e}");
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
