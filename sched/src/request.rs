//! A multimodal request and the record of its lifecycle.

use serde::{Deserialize, Serialize};

/// Identifier of a request, unique within a run (0, 1, 2, … in arrival order).
pub type RequestId = u64;

/// One multimodal input item of a request, in the shape the user sent it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum MmItem {
    /// A still image of `height × width` pixels.
    Image {
        /// Pixels.
        height: u32,
        /// Pixels.
        width: u32,
    },
    /// A video of `frames` sampled frames, each `height × width` pixels.
    Video {
        /// Frames after sampling (e.g. at 2 fps for Qwen2.5-VL).
        frames: u32,
        /// Pixels.
        height: u32,
        /// Pixels.
        width: u32,
    },
    /// An audio clip of `seconds` seconds.
    Audio {
        /// Duration in seconds.
        seconds: f64,
    },
}

/// The input modality of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Modality {
    /// Still images.
    Image,
    /// Video.
    Video,
    /// Audio.
    Audio,
    /// No multimodal items: a plain prefill/decode request.
    Text,
}

impl MmItem {
    /// The modality of this item.
    pub fn modality(&self) -> Modality {
        match self {
            MmItem::Image { .. } => Modality::Image,
            MmItem::Video { .. } => Modality::Video,
            MmItem::Audio { .. } => Modality::Audio,
        }
    }
}

/// One request as the scheduler sees it.
///
/// Token counts derived from the items (`encoder_tokens`, `mm_tokens`) are filled
/// in by whoever builds the request from the model architecture (`easerve-workload`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Unique id.
    pub id: RequestId,
    /// Arrival time, seconds since the start of the run.
    pub arrival: f64,
    /// Multimodal items, in prompt order (empty for a text-only request).
    pub items: Items,
    /// Text prompt tokens (excluding multimodal tokens).
    pub prompt_tokens: u32,
    /// Output tokens to generate (including the first, emitted by prefill).
    pub output_tokens: u32,
    /// Tokens the encoder's transformer processes for all items.
    pub encoder_tokens: u64,
    /// Multimodal embeddings the items contribute to the LLM prompt.
    pub mm_tokens: u64,
    /// What the prompt is made of, for the caches (content ids of the items,
    /// the prompt's segments and their hash chain, one heap block); `None`
    /// when the workload repeats nothing, so a run without reuse allocates
    /// nothing for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<crate::Content>,
}

/// A request's multimodal items: one held inline (no heap block of its
/// own), more on the heap. A run of 10,000,000 requests of one image each
/// allocated, touched and freed a 16-byte block per request for them
/// (docs/datacenter.md, "1,024 GPUs").
pub type Items = smallvec::SmallVec<[MmItem; 1]>;

impl Request {
    /// Tokens prefill processes: text prompt plus multimodal embeddings.
    pub fn prefill_tokens(&self) -> u64 {
        self.prompt_tokens as u64 + self.mm_tokens
    }

    /// Whether the request needs the encode stage.
    pub fn needs_encode(&self) -> bool {
        !self.items.is_empty()
    }
}

/// A moment of a request's life, seconds since the start of the run, or none
/// (the event did not happen, or not yet): an `Option<f64>` in 8 bytes, none
/// being stored as a NaN, which no time is. A [`RequestRecord`] holds ten, and
/// a simulated run one record per request (10,000,000 at the datacenter
/// scale of `docs/datacenter.md`), where `Option<f64>`'s 16 bytes made them
/// 80 bytes of every request's 400. Serialized as the `Option<f64>` it stands
/// for (`null` or a number).
#[derive(Clone, Copy)]
pub struct Stamp(f64);

impl Stamp {
    /// No time: the event did not happen.
    pub const NONE: Stamp = Stamp(f64::NAN);

    /// The time `t`, seconds (a NaN reads as none).
    #[inline]
    pub fn at(t: f64) -> Stamp {
        debug_assert!(!t.is_nan(), "a request's time is a number");
        Stamp(t)
    }

    /// The time, if the event happened.
    #[inline]
    pub fn get(self) -> Option<f64> {
        (!self.0.is_nan()).then_some(self.0)
    }

    /// Whether the event happened.
    #[inline]
    pub fn is_some(self) -> bool {
        !self.0.is_nan()
    }

    /// Whether the event has not happened.
    #[inline]
    pub fn is_none(self) -> bool {
        self.0.is_nan()
    }

    /// The time, set to `t` first if there was none.
    #[inline]
    pub fn get_or_insert(&mut self, t: f64) -> f64 {
        if self.0.is_nan() {
            *self = Stamp::at(t);
        }
        self.0
    }
}

impl Default for Stamp {
    fn default() -> Stamp {
        Stamp::NONE
    }
}

impl From<Option<f64>> for Stamp {
    fn from(t: Option<f64>) -> Stamp {
        t.map_or(Stamp::NONE, Stamp::at)
    }
}

impl PartialEq for Stamp {
    fn eq(&self, other: &Stamp) -> bool {
        self.get() == other.get()
    }
}

impl std::fmt::Debug for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

impl Serialize for Stamp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.get().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Stamp {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Stamp, D::Error> {
        Option::<f64>::deserialize(d).map(Stamp::from)
    }
}

/// When each lifecycle event of one request happened (seconds since the start of
/// the run). Filled in by the simulator or the executor; turned into the report
/// by `easerve-workload`. [`Stamp::NONE`] means the event did not happen (e.g. a
/// text-only request has no encode times). 144 bytes: a simulated run keeps one
/// per request (10,000,000 at the scale of `docs/datacenter.md`), so the
/// worker index and batch size are `u32` and the failure a boxed `str`
/// (they were `usize`s and a `String`: 168 bytes).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Request id.
    pub id: RequestId,
    /// Arrival at the serving system.
    pub arrival: f64,
    /// Output tokens generated.
    pub output_tokens: u32,
    /// Tokens prefill processed (text + multimodal).
    pub prefill_tokens: u64,
    /// Encode worker index that served it.
    pub encode_worker: Option<u32>,
    /// Micro-batch size of its encode pass.
    pub encode_batch: Option<u32>,
    /// Start of its encode pass (end of encode queueing).
    pub encode_start: Stamp,
    /// End of its encode pass.
    pub encode_end: Stamp,
    /// Its embeddings started moving to the prefill worker (after waiting for the link).
    pub embedding_sent: Stamp,
    /// Whether its prefill ran on a local prefill worker co-located on the encode GPU.
    pub prefill_local: bool,
    /// Embeddings available at the prefill worker (after transfer).
    pub prefill_ready: Stamp,
    /// Start of its prefill batch.
    pub prefill_start: Stamp,
    /// First token emitted (end of prefill).
    pub first_token: Stamp,
    /// Its KV cache started moving to the decode worker (after waiting for the link).
    pub kv_sent: Stamp,
    /// KV cache available at the decode worker (after transfer).
    pub decode_ready: Stamp,
    /// Admitted into the running decode batch.
    pub decode_start: Stamp,
    /// Last token emitted.
    pub finish: Stamp,
    /// Why the request failed (a worker died, the run was interrupted);
    /// `None` for a request that finished or is still running.
    #[serde(default)]
    pub failure: Option<Box<str>>,
    /// Turned away at arrival because the admission queue was full.
    #[serde(default)]
    pub rejected: bool,
    /// Refused at arrival for asking more than the limits allow: which
    /// limit (the decision log has the whole message, with the value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<crate::LimitKind>,
    /// Aborted before its end: its client left or its deadline passed
    /// ([`crate::Event::Abort`]); counted apart from failures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aborted: Option<Abort>,
}

/// Why a request was aborted: nothing went wrong in the server, its client
/// no longer wants the answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Abort {
    /// The client closed its connection before the last token.
    Disconnected,
    /// The request's deadline (its arrival plus its timeout: the request's
    /// `timeout`, or the scenario's `workload.timeout_s`) passed first.
    Deadline,
}

impl Abort {
    /// How the report and the decision log name it.
    pub fn name(self) -> &'static str {
        match self {
            Abort::Disconnected => "client disconnected",
            Abort::Deadline => "deadline passed",
        }
    }
}

impl RequestRecord {
    /// A fresh record for `req`.
    pub fn new(req: &Request) -> Self {
        RequestRecord {
            id: req.id,
            arrival: req.arrival,
            output_tokens: req.output_tokens,
            prefill_tokens: req.prefill_tokens(),
            ..Default::default()
        }
    }

    /// Time to first token, seconds.
    pub fn ttft(&self) -> Option<f64> {
        self.first_token.get().map(|t| t - self.arrival)
    }

    /// End-to-end latency, seconds.
    pub fn e2e(&self) -> Option<f64> {
        self.finish.get().map(|t| t - self.arrival)
    }

    /// Time per output token after the first, seconds:
    /// `(E2E − TTFT)/(output − 1)`, 0 when output ≤ 1.
    pub fn tpot(&self) -> Option<f64> {
        let (ttft, e2e) = (self.ttft()?, self.e2e()?);
        if self.output_tokens <= 1 {
            Some(0.0)
        } else {
            Some((e2e - ttft) / (self.output_tokens - 1) as f64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn a_record_is_144_bytes() {
        // a simulated run keeps one per request: its size is the run's memory
        assert_eq!(std::mem::size_of::<RequestRecord>(), 144);
    }

    #[test]
    fn a_record_round_trips_through_json_with_its_failure() {
        let mut r = RequestRecord::new(&Request {
            id: 7,
            arrival: 1.5,
            items: Items::new(),
            prompt_tokens: 10,
            output_tokens: 4,
            encoder_tokens: 0,
            mm_tokens: 0,
            content: None,
        });
        r.encode_worker = Some(3);
        r.encode_batch = Some(2);
        r.failure = Some("encode worker E3 is down".into());
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains(r#""encode_worker":3"#), "{json}");
        assert!(
            json.contains(r#""failure":"encode worker E3 is down""#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<RequestRecord>(&json).unwrap(), r);
    }
}
