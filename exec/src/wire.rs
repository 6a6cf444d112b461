//! The executor's wire format: length-prefixed frames between the controller
//! and its worker processes over local TCP sockets.
//!
//! A frame is a little-endian `u32` byte length followed by that many bytes
//! of a message encoded with `bincode` 2 (serde, standard configuration).
//! Frames above [`MAX_FRAME`] are refused, so a corrupt length cannot make a
//! reader allocate without bound. The worker side is blocking (`std::io`);
//! the controller side is `tokio`.

use easerve_sched::{MmItem, RequestId};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest frame either side accepts: 1 GiB.
pub const MAX_FRAME: usize = 1 << 30;

/// A worker's stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    /// Runs the multimodal encoder and projector.
    Encode,
    /// Runs LLM prefill (remote, or local: co-located on an encode device).
    Prefill,
    /// Runs LLM decode iterations over the KV caches it holds.
    Decode,
    /// An aggregated replica: runs every stage, one iteration at a time
    /// ([`ToWorker::ReplicaStep`]).
    Replica,
}

impl Role {
    /// `encode`, `prefill` or `decode`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Encode => "encode",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Replica => "replica",
        }
    }
}

/// A row-major `f32` matrix.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Matrix {
    /// Rows (tokens).
    pub rows: u32,
    /// Columns (hidden width).
    pub cols: u32,
    /// `rows × cols` values.
    pub data: Vec<f32>,
}

/// One request's KV cache: keys and values of every layer, each
/// `[kv_heads, len, head_dim]`, concatenated layer after layer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KvData {
    /// Layers.
    pub layers: u32,
    /// KV heads.
    pub kv_heads: u32,
    /// Positions cached.
    pub len: u32,
    /// Head width.
    pub head_dim: u32,
    /// Keys, `layers × kv_heads × len × head_dim`.
    pub k: Vec<f32>,
    /// Values, same layout.
    pub v: Vec<f32>,
}

/// One request of an encode micro-batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EncodeRequest {
    /// Request.
    pub id: RequestId,
    /// Its items; when `media` is empty (and the request was not sent ahead
    /// in a [`ToWorker::Preprocess`] frame, whose prepared items the pass
    /// takes instead) the worker synthesises media of these shapes (seeded by
    /// the run's seed, the request id and the item index), and it
    /// preprocesses them for real either way.
    pub items: Vec<MmItem>,
    /// The request's own decoded media, one per item (`easerve serve`), or
    /// empty (`easerve exec`'s synthetic workload).
    pub media: Vec<WireMedia>,
    /// With the encoder cache on: what to do with each item's embeddings,
    /// in order, as the controller's directory decided (reuse the stored
    /// ones, store them, drop others first); empty: encode every item and
    /// store nothing.
    #[serde(default)]
    pub cache: Vec<easerve_sched::ItemOp>,
    /// Each item's content id when the workload gives one (a scenario's
    /// `[workload.pool]`; `Request::content`), else empty: synthetic media
    /// are then seeded by it rather than by the request, so equal ids give
    /// equal media.
    #[serde(default)]
    pub keys: Vec<u64>,
    /// Whether an item whose embeddings are reused is still preprocessed
    /// (its pixels resized and normalised, then dropped): true when items
    /// are keyed over their decoded form, since vLLM hashes the processed
    /// item; false with `hash_raw_bytes`.
    #[serde(default)]
    pub prepare_hits: bool,
    /// With the shared encoder-output store on: the embeddings of the items
    /// the controller found in the store (`ItemOp::fetched`), by content
    /// key, each `[rows, d]` row-major; the worker takes them instead of
    /// encoding. The store lives in the controller's process.
    #[serde(default)]
    pub fetched: Vec<(u64, Vec<f32>)>,
}

/// A decoded input as it crosses to an encode worker: RGB pixels
/// (`height × width × 3` bytes, row-major) or 16 kHz mono samples.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum WireMedia {
    /// A still image.
    Image(WireImage),
    /// Video frames, in order.
    Video(Vec<WireImage>),
    /// Audio samples in `[-1, 1]` at 16 kHz.
    Audio(Vec<f32>),
}

/// One RGB image: `height × width × 3` bytes, row-major.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WireImage {
    /// Pixels.
    pub width: u32,
    /// Pixels.
    pub height: u32,
    /// Pixel bytes.
    pub rgb: Vec<u8>,
}

impl WireImage {
    fn of(img: &image::RgbImage) -> WireImage {
        WireImage {
            width: img.width(),
            height: img.height(),
            rgb: img.as_raw().clone(),
        }
    }

    fn into_rgb(self) -> Result<image::RgbImage, WireMediaError> {
        let (width, height) = (self.width, self.height);
        image::RgbImage::from_raw(width, height, self.rgb).ok_or(WireMediaError { width, height })
    }
}

/// An image whose pixel bytes do not match its size ([`WireMedia::into_media`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("an image of {width}×{height} pixels came with the wrong byte count")]
pub struct WireMediaError {
    /// Its width, pixels.
    pub width: u32,
    /// Its height, pixels.
    pub height: u32,
}

impl WireMedia {
    /// The wire form of decoded media.
    pub fn of(m: &crate::input::Media) -> WireMedia {
        use crate::input::Media;
        match m {
            Media::Image(img) => WireMedia::Image(WireImage::of(img)),
            Media::Video(frames) => WireMedia::Video(frames.iter().map(WireImage::of).collect()),
            Media::Audio(s) => WireMedia::Audio(s.clone()),
        }
    }

    /// Back to decoded media.
    ///
    /// # Errors
    /// When an image's byte count does not match its size.
    pub fn into_media(self) -> Result<crate::input::Media, WireMediaError> {
        use crate::input::Media;
        Ok(match self {
            WireMedia::Image(img) => Media::Image(img.into_rgb()?),
            WireMedia::Video(frames) => Media::Video(
                frames
                    .into_iter()
                    .map(WireImage::into_rgb)
                    .collect::<Result<_, _>>()?,
            ),
            WireMedia::Audio(s) => Media::Audio(s),
        })
    }
}

/// One piece of a prefill's prompt, in order ([`PrefillRequest::prompt`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PromptPart {
    /// The next `tokens` rows of the request's embeddings (one item's).
    Item {
        /// LLM tokens of the item.
        tokens: u32,
    },
    /// `tokens` text tokens drawn from content id `id` (a system prompt, a
    /// turn's text, an earlier turn's answer).
    Text {
        /// Content id of the segment.
        id: u64,
        /// Tokens of the segment.
        tokens: u32,
    },
}

impl PromptPart {
    /// The parts of a prompt whose content is `c`.
    pub fn of(c: &easerve_sched::Content) -> Vec<PromptPart> {
        c.pieces()
            .map(|p| match p {
                easerve_sched::Piece::Item(_, tokens) => PromptPart::Item { tokens },
                easerve_sched::Piece::Text(s) => PromptPart::Text {
                    id: s.id,
                    tokens: s.tokens,
                },
            })
            .collect()
    }
}

/// One request of a prefill batch; its multimodal embeddings (if any) came
/// earlier in an [`ToWorker::Embeddings`] envelope.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrefillRequest {
    /// Request.
    pub id: RequestId,
    /// Text prompt tokens after the embeddings (when `prompt` is empty).
    pub prompt_tokens: u32,
    /// The prompt in order when the workload says what it is made of
    /// (`easerve_sched::Content::pieces`): each item's embeddings and each
    /// text segment, whose tokens the worker draws from its content id, so
    /// equal segments are equal tokens in every request. Empty: the
    /// embeddings, then `prompt_tokens` drawn from the request id.
    #[serde(default)]
    pub prompt: Vec<PromptPart>,
    /// With the prefix cache on: the leading prompt tokens whose KV cache
    /// this worker keeps (the controller's hit; 0: prefill it all).
    #[serde(default)]
    pub cached: u32,
    /// The chain link the cached tokens are kept under.
    #[serde(default)]
    pub cached_key: u64,
    /// Keep the KV cache this prefill computes until the controller says
    /// under which links to keep it ([`ToWorker::PrefixOps`]).
    #[serde(default)]
    pub keep: bool,
}

/// Controller → worker.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ToWorker {
    /// Run one encode pass over the micro-batch with `sm_share` of the
    /// worker's compute (its thread share on CPU).
    Encode {
        /// Requests, FCFS.
        requests: Vec<EncodeRequest>,
        /// Share in (0, 1].
        sm_share: f64,
    },
    /// Start preprocessing these requests' media now, on the worker's
    /// preprocessing threads, ahead of the pass that will encode them
    /// (`deployment.preprocess = "pipelined"`): each request's items are
    /// prepared in parallel and held by request id. A later
    /// [`ToWorker::Encode`] names the same requests with empty `media` (they
    /// came here) and takes the prepared items, waiting for those still in
    /// progress; nothing is answered for this frame.
    Preprocess {
        /// Requests placed on this worker, with their media (or none, for
        /// synthetic media).
        requests: Vec<EncodeRequest>,
    },
    /// One envelope of embeddings (one micro-batch's requests bound for this
    /// prefill worker): hold them and answer [`FromWorker::EmbeddingsLanded`].
    Embeddings {
        /// Envelope number (the controller's).
        envelope: u64,
        /// `[mm_tokens, d]` per request.
        embeddings: Vec<(RequestId, Matrix)>,
    },
    /// Run one prefill batch.
    Prefill {
        /// Requests.
        requests: Vec<PrefillRequest>,
        /// Share in (0, 1].
        sm_share: f64,
    },
    /// Hold request `id`'s KV cache (answer [`FromWorker::KvLanded`]); its
    /// next input is `last_token`.
    Kv {
        /// Request.
        id: RequestId,
        /// The token prefill emitted.
        last_token: u32,
        /// The cache.
        kv: KvData,
    },
    /// Run one decode iteration over these sequences.
    DecodeStep {
        /// Running sequences.
        ids: Vec<RequestId>,
    },
    /// One iteration of an aggregated replica: encode the items of
    /// `encode`, prefill every request of `prefill` (their embeddings from
    /// this iteration's encode; their first tokens), then one decode step
    /// over `decode`, the sequences already running. Every sequence named in
    /// neither `prefill` nor `decode` has finished: its cache is freed first.
    /// Answer [`FromWorker::ReplicaStepDone`].
    ReplicaStep {
        /// The admitted requests that have items, in admission order.
        encode: Vec<EncodeRequest>,
        /// Every admitted request.
        prefill: Vec<PrefillRequest>,
        /// The running sequences admitted before this iteration.
        decode: Vec<RequestId>,
    },
    /// Drop what the worker holds for these requests, finished or aborted:
    /// decode sequences, KV caches landed, embeddings, media prepared ahead.
    Release {
        /// Finished or aborted requests.
        ids: Vec<RequestId>,
    },
    /// The prefix cache's operations for this prefill worker, in the
    /// controller's order: keep a finished request's KV cache under its
    /// prompt's links, drop evicted links. Nothing is answered.
    PrefixOps {
        /// Operations, in order.
        ops: Vec<easerve_sched::PrefixOp>,
    },
    /// Exit.
    Shutdown,
    /// A heartbeat: answer [`FromWorker::Pong`] at once, whatever the worker
    /// is computing (its receiver thread answers).
    Ping,
}

/// Worker → controller.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum FromWorker {
    /// First message after connecting.
    Hello {
        /// Stage.
        role: Role,
        /// Index within the stage (as the controller numbers workers).
        index: usize,
        /// Process id.
        pid: u32,
    },
    /// The model is built and warmed up; `load_s` seconds it took.
    Ready {
        /// Seconds.
        load_s: f64,
    },
    /// An embeddings envelope is held by this prefill worker.
    EmbeddingsLanded {
        /// Envelope number.
        envelope: u64,
    },
    /// A KV cache is held by this decode worker.
    KvLanded {
        /// Request.
        id: RequestId,
    },
    /// An encode pass finished its host phase (preprocessing) and starts on
    /// the device.
    EncodeGpuStarted,
    /// An encode pass ended.
    EncodeDone {
        /// Embeddings per request, in pass order.
        embeddings: Vec<(RequestId, Matrix)>,
        /// Seconds from the pass's start until its items were prepared: its
        /// own preprocessing when serial; when its requests came ahead
        /// ([`ToWorker::Preprocess`]), the wait for those still in progress.
        preprocess_s: f64,
        /// Seconds of the whole pass in the worker.
        compute_s: f64,
        /// Rows of each item's embeddings, per request in pass order (how
        /// the controller's process cuts a request's matrix into the items
        /// it writes to the shared store).
        #[serde(default)]
        item_rows: Vec<Vec<u32>>,
    },
    /// A prefill batch ended: the first token and the KV cache per request.
    PrefillDone {
        /// `(request, first token, KV cache)`.
        outputs: Vec<(RequestId, u32, KvData)>,
        /// Seconds in the worker.
        compute_s: f64,
    },
    /// A decode iteration ended.
    DecodeDone {
        /// `(request, token)` per running sequence.
        tokens: Vec<(RequestId, u32)>,
        /// Seconds in the worker.
        compute_s: f64,
    },
    /// An aggregated replica's iteration ended.
    ReplicaStepDone {
        /// `(request, token)`: the first token of each admitted request, then
        /// the next token of each running sequence.
        tokens: Vec<(RequestId, u32)>,
        /// Seconds from the iteration's start to the end of its encode (its
        /// preprocessing included): when its prefill began.
        encode_s: f64,
        /// Seconds of the whole iteration in the worker.
        compute_s: f64,
    },
    /// The worker cannot go on (the controller fails its requests).
    Error {
        /// What went wrong.
        message: String,
    },
    /// The answer to a heartbeat ([`ToWorker::Ping`]).
    Pong,
}

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// Encode `msg` as one frame (length prefix included).
pub fn encode_frame<T: Serialize>(msg: &T) -> io::Result<Vec<u8>> {
    let mut out = vec![0u8; 4];
    bincode::serde::encode_into_std_write(msg, &mut out, config()).map_err(invalid)?;
    let len = out.len() - 4;
    if len > MAX_FRAME {
        return Err(invalid(format!("frame of {len} bytes exceeds {MAX_FRAME}")));
    }
    out[..4].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(out)
}

fn decode_body<T: DeserializeOwned>(body: &[u8]) -> io::Result<T> {
    let (msg, used) = bincode::serde::decode_from_slice(body, config()).map_err(invalid)?;
    if used != body.len() {
        return Err(invalid(format!(
            "frame has {} trailing bytes",
            body.len() - used
        )));
    }
    Ok(msg)
}

fn frame_len(prefix: [u8; 4]) -> io::Result<usize> {
    let len = u32::from_le_bytes(prefix) as usize;
    if len > MAX_FRAME {
        return Err(invalid(format!("frame of {len} bytes exceeds {MAX_FRAME}")));
    }
    Ok(len)
}

/// Write one frame (blocking).
pub fn write_frame<W: Write, T: Serialize>(w: &mut W, msg: &T) -> io::Result<()> {
    w.write_all(&encode_frame(msg)?)?;
    w.flush()
}

/// Read one frame (blocking); `None` at a clean end of stream.
pub fn read_frame<R: Read, T: DeserializeOwned>(r: &mut R) -> io::Result<Option<T>> {
    let mut prefix = [0u8; 4];
    match r.read_exact(&mut prefix) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut body = vec![0u8; frame_len(prefix)?];
    r.read_exact(&mut body)?;
    decode_body(&body).map(Some)
}

/// Read one frame (async); `None` at a clean end of stream.
pub async fn read_frame_async<R: AsyncReadExt + Unpin, T: DeserializeOwned>(
    r: &mut R,
) -> io::Result<Option<T>> {
    let mut prefix = [0u8; 4];
    match r.read_exact(&mut prefix).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let mut body = vec![0u8; frame_len(prefix)?];
    r.read_exact(&mut body).await?;
    decode_body(&body).map(Some)
}

/// Write an already encoded frame (async).
pub async fn write_bytes_async<W: AsyncWriteExt + Unpin>(
    w: &mut W,
    frame: &[u8],
) -> io::Result<()> {
    w.write_all(frame).await?;
    w.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_lengths_are_refused() {
        let msg = ToWorker::Kv {
            id: 7,
            last_token: 3,
            kv: KvData {
                layers: 1,
                kv_heads: 1,
                len: 2,
                head_dim: 2,
                k: vec![1.0, 2.0, 3.0, 4.0],
                v: vec![0.5; 4],
            },
        };
        let bytes = encode_frame(&msg).unwrap();
        let mut two = bytes.clone();
        two.extend_from_slice(&encode_frame(&ToWorker::Shutdown).unwrap());
        let mut r = &two[..];
        assert_eq!(read_frame::<_, ToWorker>(&mut r).unwrap(), Some(msg));
        assert_eq!(
            read_frame::<_, ToWorker>(&mut r).unwrap(),
            Some(ToWorker::Shutdown)
        );
        assert_eq!(read_frame::<_, ToWorker>(&mut r).unwrap(), None);
        let huge = ((MAX_FRAME + 1) as u32).to_le_bytes();
        assert!(read_frame::<_, ToWorker>(&mut &huge[..]).is_err());
        // a truncated body is an error, not a clean end
        assert!(read_frame::<_, ToWorker>(&mut &bytes[..bytes.len() - 1]).is_err());
    }
}
