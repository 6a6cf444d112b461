//! A tensor-parallel worker on the CPU: `tp` processes, one per rank.
//!
//! Rank 0 is the process `easerve exec` starts: it speaks to the controller,
//! starts ranks `1..tp` as child processes of the same executable
//! (`easerve worker --tp-rank R --tp-root ADDR ...`), and accepts their
//! connections on a loopback TCP listener. Each follower holds one TCP stream
//! to rank 0, which carries both
//!
//! * [`RankCommand`] frames (rank 0 -> rank r, the same framing as the
//!   controller's wire) with the pass's inputs, and the KV shards a prefill
//!   pass returns (rank r -> rank 0), and
//! * the all-reduces of the pass ([`TcpGroup`]): every follower writes its
//!   buffer (little-endian f32), rank 0 sums the buffers in rank order and
//!   writes the sum back, so every rank holds bit-identical results.
//!
//! On `--device cuda` (feature `cuda`) the all-reduces go through NCCL
//! instead ([`crate::nccl`], one GPU per rank): rank 0 sends each follower the
//! group's NCCL unique id on the same stream right after it connects, and the
//! stream carries the commands and KV shards only.
//!
//! An encode worker's ranks split the encoder ([`RankCommand::Encode`]: rank 0
//! sends the pass's preprocessed images, every rank runs its shard, rank 0's
//! embeddings are the worker's).
//!
//! A follower exits when its stream to rank 0 closes (rank 0 ended or was
//! killed), so no rank outlives its worker.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use easerve_exec::device::{CoreSide, DeviceKind};
use easerve_exec::input::HostItem;
use easerve_exec::wire::{read_frame, write_frame, KvData, Matrix, Role};
use easerve_model::nn::{AllReduce, AnyresImage, DecoderLm, EncoderItem, KvCache, MultimodalModel};
use easerve_model::ModelArch;
use easerve_sched::RequestId;
use serde::{Deserialize, Serialize};

use crate::process::{kv_from_wire, kv_to_wire, to_vec_f32, Pools, WorkerError, WorkerOptions};

/// What rank 0 tells a follower rank to do, in order.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum RankCommand {
    /// Prefill these sequences' input embeddings (`[len_i, d]` each) on this
    /// rank's shard, at this share of its threads; reply with this rank's KV
    /// shard of each sequence (one [`KvData`] frame per sequence, in order).
    Prefill {
        /// The sequences' input embeddings.
        seqs: Vec<Matrix>,
        /// Share of the rank's threads the pass runs on.
        share: f64,
    },
    /// Hold this KV shard (this rank's heads) for a sequence about to decode.
    Kv {
        /// The sequence.
        id: RequestId,
        /// This rank's heads of its cache.
        kv: KvData,
    },
    /// One decode step of these sequences on input embeddings `x` `[b, d]`.
    Decode {
        /// The sequences, in the rows' order.
        ids: Vec<RequestId>,
        /// Their input embeddings.
        x: Matrix,
    },
    /// Drop these sequences' caches.
    Release {
        /// The sequences.
        ids: Vec<RequestId>,
    },
    /// Encode these images on this rank's shard of the encoder, at this
    /// share of its threads (no reply: rank 0's embeddings are the pass's).
    Encode {
        /// The pass's preprocessed images, in order.
        items: Vec<AnyresTiles>,
        /// Share of the rank's threads the pass runs on.
        share: f64,
    },
}

/// A preprocessed LLaVA-NeXT anyres image on its way to a follower rank
/// ([`HostItem::Anyres`]; the encoder families that split by TP take only
/// these).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AnyresTiles {
    /// Row-major tiles.
    pub data: Vec<f32>,
    /// `[tiles, side^2, 3*patch^2]`.
    pub shape: [usize; 3],
    /// Grid tiles per column.
    pub grid_h: usize,
    /// Grid tiles per row.
    pub grid_w: usize,
    /// Feature rows kept after unpadding.
    pub crop_rows: usize,
    /// Feature columns kept after unpadding.
    pub crop_cols: usize,
}

impl AnyresTiles {
    /// `item`'s tiles; `None` for an item of another encoder family.
    pub fn of(item: &HostItem) -> Option<AnyresTiles> {
        match item {
            HostItem::Anyres {
                data,
                shape,
                grid_h,
                grid_w,
                crop_rows,
                crop_cols,
            } => Some(AnyresTiles {
                data: data.clone(),
                shape: *shape,
                grid_h: *grid_h,
                grid_w: *grid_w,
                crop_rows: *crop_rows,
                crop_cols: *crop_cols,
            }),
            _ => None,
        }
    }

    fn into_item<B: Backend>(self, device: &B::Device) -> EncoderItem<B> {
        EncoderItem::Anyres(AnyresImage {
            tiles: Tensor::from_data(TensorData::new(self.data, self.shape), device),
            grid_h: self.grid_h,
            grid_w: self.grid_w,
            crop_rows: self.crop_rows,
            crop_cols: self.crop_cols,
        })
    }
}

/// One rank's end of a `world`-rank group over loopback TCP: rank 0 holds a
/// stream to each follower (index `r - 1` for rank `r`), a follower one
/// stream to rank 0.
#[derive(Debug)]
pub struct TcpGroup {
    rank: usize,
    world: usize,
    streams: Vec<TcpStream>,
}

impl TcpGroup {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The stream to rank 0 (a follower) or to rank `r` (rank 0, `r ≥ 1`).
    pub fn stream(&self, r: usize) -> &TcpStream {
        &self.streams[if self.rank == 0 { r - 1 } else { 0 }]
    }

    /// Rank 0's group: accept `world - 1` followers on `listener` (each says
    /// its rank as a little-endian u32 first), within `timeout`.
    ///
    /// # Errors
    /// A follower that does not connect in time, or says a bad or repeated rank.
    pub fn accept(
        listener: &TcpListener,
        world: usize,
        timeout: Duration,
    ) -> std::io::Result<Self> {
        let deadline = Instant::now() + timeout;
        listener.set_nonblocking(true)?;
        let mut slots: Vec<Option<TcpStream>> = (1..world).map(|_| None).collect();
        while slots.iter().any(Option::is_none) {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false)?;
                    s.set_nodelay(true)?;
                    let mut b = [0u8; 4];
                    (&s).read_exact(&mut b)?;
                    let r = u32::from_le_bytes(b) as usize;
                    match slots.get_mut(r.wrapping_sub(1)) {
                        Some(slot @ None) => *slot = Some(s),
                        _ => return Err(invalid(format!("a follower said rank {r} of {world}"))),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("the TP ranks did not all connect within {timeout:?}"),
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(TcpGroup {
            rank: 0,
            world,
            streams: slots.into_iter().flatten().collect(),
        })
    }

    /// A follower's group: connect to rank 0 at `root` and say `rank`.
    ///
    /// # Errors
    /// Rank 0 cannot be reached.
    pub fn connect(root: SocketAddr, rank: usize, world: usize) -> std::io::Result<Self> {
        let s = TcpStream::connect(root)?;
        s.set_nodelay(true)?;
        (&s).write_all(&(rank as u32).to_le_bytes())?;
        Ok(TcpGroup {
            rank,
            world,
            streams: vec![s],
        })
    }
}

fn invalid(m: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, m)
}

fn write_f32(mut s: &TcpStream, data: &[f32]) -> std::io::Result<()> {
    let mut bytes = Vec::with_capacity(4 * data.len());
    for v in data {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    s.write_all(&bytes)
}

fn read_f32(mut s: &TcpStream, out: &mut [f32]) -> std::io::Result<()> {
    let mut bytes = vec![0u8; 4 * out.len()];
    s.read_exact(&mut bytes)?;
    for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    Ok(())
}

impl<B: Backend> AllReduce<B> for TcpGroup {
    type Error = std::io::Error;

    fn world(&self) -> usize {
        self.world
    }

    /// Star all-reduce through rank 0: `2 (world - 1)` messages of
    /// `4 × data.len()` bytes on rank 0's links.
    fn sum_host(&self, data: &mut [f32]) -> std::io::Result<()> {
        if self.rank != 0 {
            write_f32(&self.streams[0], data)?;
            return read_f32(&self.streams[0], data);
        }
        let mut part = vec![0f32; data.len()];
        for s in &self.streams {
            read_f32(s, &mut part)?;
            for (d, p) in data.iter_mut().zip(&part) {
                *d += p;
            }
        }
        for s in &self.streams {
            write_f32(s, data)?;
        }
        Ok(())
    }
}

/// One rank's end of a TP worker's group: the loopback stream(s) to the
/// other ranks, which carry the commands, and the all-reduce, over those
/// streams on the CPU or over NCCL on CUDA.
#[derive(Debug)]
pub struct RankGroup {
    tcp: TcpGroup,
    #[cfg(feature = "cuda")]
    nccl: Option<crate::nccl::NcclGroup>,
}

impl RankGroup {
    /// The group summing over `tcp` itself (CPU).
    pub fn tcp(tcp: TcpGroup) -> RankGroup {
        RankGroup {
            tcp,
            #[cfg(feature = "cuda")]
            nccl: None,
        }
    }

    /// Rank 0's group on `device`: on CUDA, make an NCCL unique id, send it
    /// to every follower on its stream, and join the NCCL group on GPU
    /// `ordinal` (blocks until all ranks have joined).
    ///
    /// # Errors
    /// NCCL cannot start, or a follower's stream failed.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    fn root(tcp: TcpGroup, device: DeviceKind, ordinal: usize) -> Result<RankGroup, WorkerError> {
        #[cfg(feature = "cuda")]
        if device == DeviceKind::Cuda {
            let nccl_err = |e: crate::nccl::NcclError| WorkerError::Ranks(e.to_string());
            let id = crate::nccl::unique_id().map_err(nccl_err)?;
            for r in 1..tcp.world {
                tcp.stream(r)
                    .write_all(&id)
                    .map_err(|e| WorkerError::Ranks(format!("rank {r}: {e}")))?;
            }
            let world = tcp.world;
            let nccl = crate::nccl::NcclGroup::join(ordinal, 0, world, id).map_err(nccl_err)?;
            return Ok(RankGroup {
                tcp,
                nccl: Some(nccl),
            });
        }
        Ok(RankGroup::tcp(tcp))
    }

    /// A follower's group on `device`: connect to rank 0 at `root`; on CUDA,
    /// read the NCCL unique id from it and join the NCCL group on GPU
    /// `ordinal`.
    ///
    /// # Errors
    /// Rank 0 cannot be reached, or NCCL cannot start.
    #[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
    fn follower(
        root: SocketAddr,
        rank: usize,
        world: usize,
        device: DeviceKind,
        ordinal: usize,
    ) -> Result<RankGroup, WorkerError> {
        let io = |e: std::io::Error| WorkerError::Ranks(e.to_string());
        let tcp = TcpGroup::connect(root, rank, world).map_err(io)?;
        #[cfg(feature = "cuda")]
        if device == DeviceKind::Cuda {
            let mut id = [0u8; crate::nccl::ID_BYTES];
            tcp.stream(0).read_exact(&mut id).map_err(io)?;
            let nccl = crate::nccl::NcclGroup::join(ordinal, rank, world, id)
                .map_err(|e| WorkerError::Ranks(e.to_string()))?;
            return Ok(RankGroup {
                tcp,
                nccl: Some(nccl),
            });
        }
        Ok(RankGroup::tcp(tcp))
    }

    /// The stream to rank 0 (a follower) or to rank `r` (rank 0, `r ≥ 1`).
    pub fn stream(&self, r: usize) -> &TcpStream {
        self.tcp.stream(r)
    }
}

impl<B: Backend> AllReduce<B> for RankGroup {
    type Error = std::io::Error;

    fn world(&self) -> usize {
        self.tcp.world
    }

    /// NCCL's all-reduce when the group has one, else the star over the
    /// streams ([`TcpGroup`]).
    fn sum_host(&self, data: &mut [f32]) -> std::io::Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(n) = &self.nccl {
            return n.sum_host(data).map_err(std::io::Error::other);
        }
        AllReduce::<B>::sum_host(&self.tcp, data)
    }
}

/// Seconds rank 0 waits for its followers to start and connect.
const FOLLOWERS_CONNECT_S: u64 = 120;

/// Rank 0's end of a tensor-parallel worker: the group and the follower
/// processes it started.
pub(crate) struct Ranks {
    pub(crate) group: RankGroup,
    /// KV heads of the whole model.
    kv_heads: usize,
    children: Vec<Child>,
}

impl Ranks {
    /// Start ranks `1..opts.tp` as child processes and connect them.
    pub(crate) fn start(opts: &WorkerOptions, kv_heads: usize) -> Result<Ranks, WorkerError> {
        let io = |e: std::io::Error| WorkerError::Ranks(e.to_string());
        let listener = TcpListener::bind("127.0.0.1:0").map_err(io)?;
        let root = listener.local_addr().map_err(io)?;
        let exe = std::env::current_exe().map_err(io)?;
        let mut children = Vec::with_capacity(opts.tp - 1);
        for rank in 1..opts.tp {
            let child = Command::new(&exe)
                .arg("worker")
                .args(["--role", opts.role.as_str()])
                .args(["--index", &opts.index.to_string()])
                .args(["--connect", &opts.connect.to_string()])
                .args(["--model", &opts.model])
                .args(["--threads", &opts.threads.to_string()])
                .args(["--seed", &opts.seed.to_string()])
                .args(["--device", opts.device.as_str()])
                .args(["--gpu", &opts.gpu.to_string()])
                .args(["--tp", &opts.tp.to_string()])
                .args(["--tp-rank", &rank.to_string()])
                .args(["--tp-root", &root.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .map_err(|e| WorkerError::Ranks(format!("cannot start rank {rank}: {e}")))?;
            children.push(child);
        }
        let mut ranks = Ranks {
            group: RankGroup::tcp(TcpGroup {
                rank: 0,
                world: 1,
                streams: Vec::new(),
            }),
            kv_heads,
            children,
        };
        let tcp = TcpGroup::accept(&listener, opts.tp, Duration::from_secs(FOLLOWERS_CONNECT_S))
            .map_err(io)?;
        ranks.group = RankGroup::root(tcp, opts.device, rank_ordinal(opts, 0))?;
        Ok(ranks)
    }

    fn send(&self, rank: usize, cmd: &RankCommand) -> Result<(), WorkerError> {
        write_frame(&mut self.group.stream(rank), cmd)
            .map_err(|e| WorkerError::Ranks(format!("rank {rank}: {e}")))
    }

    fn followers(&self) -> std::ops::Range<usize> {
        1..self.group.tcp.world
    }

    /// Prefill `seqs` on every rank; the logits and each sequence's whole
    /// cache (the ranks' KV heads joined).
    #[allow(clippy::type_complexity)]
    pub(crate) fn prefill<B: Backend>(
        &self,
        lm: &DecoderLm<B>,
        seqs: &[Tensor<B, 2>],
        share: f64,
    ) -> Result<(Tensor<B, 2>, Vec<KvCache<B>>), WorkerError> {
        let mats = seqs
            .iter()
            .map(|t| {
                let [rows, cols] = t.dims();
                Ok(Matrix {
                    rows: rows as u32,
                    cols: cols as u32,
                    data: to_vec_f32(t.clone())?,
                })
            })
            .collect::<Result<Vec<_>, WorkerError>>()?;
        let cmd = RankCommand::Prefill { seqs: mats, share };
        for r in self.followers() {
            self.send(r, &cmd)?;
        }
        let (logits, mine) = lm.prefill_with(seqs, &self.group).map_err(reduce_err)?;
        let device = logits.device();
        let mut shards: Vec<Vec<KvCache<B>>> = vec![mine];
        for r in self.followers() {
            let mut s = self.group.stream(r);
            let mut got = Vec::with_capacity(seqs.len());
            for _ in seqs {
                let kv: KvData = read_frame(&mut s)
                    .map_err(|e| WorkerError::Ranks(format!("rank {r}: {e}")))?
                    .ok_or_else(|| WorkerError::Ranks(format!("rank {r} closed its stream")))?;
                got.push(kv_from_wire::<B>(kv, &device)?);
            }
            shards.push(got);
        }
        let tp = self.group.tcp.world;
        let whole = (0..seqs.len())
            .map(|i| {
                let per_rank: Vec<KvCache<B>> = shards.iter().map(|s| s[i].clone()).collect();
                KvCache::reshard(&per_rank, tp, 1, self.kv_heads).remove(0)
            })
            .collect();
        Ok((logits, whole))
    }

    /// A whole cache landed for sequence `id`: send each follower its heads;
    /// rank 0's heads.
    pub(crate) fn land_kv<B: Backend>(
        &self,
        id: RequestId,
        whole: KvCache<B>,
    ) -> Result<KvCache<B>, WorkerError> {
        let mut shards = KvCache::reshard(&[whole], 1, self.group.tcp.world, self.kv_heads);
        for (r, shard) in shards.drain(1..).enumerate() {
            let kv = kv_to_wire(shard)?;
            self.send(r + 1, &RankCommand::Kv { id, kv })?;
        }
        Ok(shards.remove(0))
    }

    /// One decode step on every rank.
    pub(crate) fn decode<B: Backend>(
        &self,
        lm: &DecoderLm<B>,
        ids: &[RequestId],
        x: Tensor<B, 2>,
        caches: &mut [KvCache<B>],
    ) -> Result<Tensor<B, 2>, WorkerError> {
        let [rows, cols] = x.dims();
        let cmd = RankCommand::Decode {
            ids: ids.to_vec(),
            x: Matrix {
                rows: rows as u32,
                cols: cols as u32,
                data: to_vec_f32(x.clone())?,
            },
        };
        for r in self.followers() {
            self.send(r, &cmd)?;
        }
        lm.decode_with(x, caches, &self.group).map_err(reduce_err)
    }

    /// Encode `items` on every rank (`wire`: the same items for the
    /// followers); rank 0's embeddings, one `[llm_tokens_i, d_llm]` per item.
    pub(crate) fn encode<B: Backend>(
        &self,
        model: &MultimodalModel<B>,
        items: &[EncoderItem<B>],
        wire: Vec<AnyresTiles>,
        share: f64,
    ) -> Result<Vec<Tensor<B, 2>>, WorkerError> {
        let cmd = RankCommand::Encode { items: wire, share };
        for r in self.followers() {
            self.send(r, &cmd)?;
        }
        model.encode_with(items, &self.group).map_err(encode_err)
    }

    /// The followers drop these sequences' caches.
    pub(crate) fn release(&self, ids: &[RequestId]) -> Result<(), WorkerError> {
        let cmd = RankCommand::Release { ids: ids.to_vec() };
        for r in self.followers() {
            self.send(r, &cmd)?;
        }
        Ok(())
    }
}

impl Drop for Ranks {
    /// Close the streams (a follower exits at their end), then reap the
    /// followers, killing any still running.
    fn drop(&mut self) {
        self.group.tcp.streams.clear();
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn reduce_err(e: std::io::Error) -> WorkerError {
    WorkerError::Ranks(format!("all-reduce: {e}"))
}

fn encode_err(e: Result<easerve_model::nn::NnError, std::io::Error>) -> WorkerError {
    match e {
        Ok(e) => WorkerError::Model(e),
        Err(e) => reduce_err(e),
    }
}

/// GPU ordinal of rank `rank` of the worker `opts` describes: its TP group is
/// the allocation's consecutive GPUs from `opts.gpu` (`easerve_sched`'s
/// topology), each folded onto the GPUs the driver shows
/// ([`crate::cuda::visible_ordinal`]); 0 on the CPU.
#[cfg_attr(not(feature = "cuda"), allow(unused_variables))]
pub(crate) fn rank_ordinal(opts: &WorkerOptions, rank: usize) -> usize {
    #[cfg(feature = "cuda")]
    if opts.device == DeviceKind::Cuda {
        return crate::cuda::visible_ordinal(opts.gpu + rank);
    }
    0
}

fn tensor<B: Backend>(m: Matrix, device: &B::Device) -> Tensor<B, 2> {
    let shape = [m.rows as usize, m.cols as usize];
    Tensor::from_data(TensorData::new(m.data, shape), device)
}

/// A follower rank (`opts.tp_rank ≥ 1`): connect to rank 0 (and, on CUDA,
/// join its NCCL group on GPU [`rank_ordinal`]), build the same model from
/// the run's seed, keep this rank's shard, and run what rank 0 says until its
/// stream closes.
pub(crate) fn run_follower(opts: &WorkerOptions, root: SocketAddr) -> Result<(), WorkerError> {
    let arch = ModelArch::preset(&opts.model)
        .ok_or_else(|| WorkerError::UnknownModel(opts.model.clone()))?;
    let ordinal = rank_ordinal(opts, opts.tp_rank);
    let group = RankGroup::follower(root, opts.tp_rank, opts.tp, opts.device, ordinal)?;
    match opts.device {
        DeviceKind::Cpu => {
            easerve_exec::device::limit_cpu_threads(opts.threads).map_err(WorkerError::Device)?;
            follow::<burn::backend::NdArray>(&arch, opts, &group, &Default::default())
        }
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => follow::<crate::cuda::Gpu>(
            &arch,
            opts,
            &group,
            &burn::backend::cuda::CudaDevice::new(ordinal),
        ),
        #[cfg(not(feature = "cuda"))]
        DeviceKind::Cuda => Err(WorkerError::NoCuda),
    }
}

/// A follower's loop on backend `B`: the model's shard for the worker's
/// stage, then rank 0's commands in order.
fn follow<B: Backend>(
    arch: &ModelArch,
    opts: &WorkerOptions,
    group: &RankGroup,
    device: &B::Device,
) -> Result<(), WorkerError> {
    let io = |e: std::io::Error| WorkerError::Ranks(e.to_string());
    B::seed(device, opts.seed);
    let full = MultimodalModel::<B>::from_arch(arch, device).map_err(WorkerError::Model)?;
    let model = full
        .shard(opts.tp_rank, opts.tp, opts.role == Role::Encode)
        .map_err(|e| WorkerError::Ranks(e.to_string()))?;
    drop(full);
    let lm = &model.lm;
    let mut pools = Pools::new(opts.threads, CoreSide::Any, Vec::new());
    let mut seqs: HashMap<RequestId, KvCache<B>> = HashMap::new();
    let mut s = group.stream(0);
    while let Some(cmd) = read_frame::<_, RankCommand>(&mut s).map_err(io)? {
        match cmd {
            RankCommand::Prefill { seqs: mats, share } => {
                let xs: Vec<Tensor<B, 2>> = mats.into_iter().map(|m| tensor(m, device)).collect();
                let (_, caches) = pools
                    .run(share, || lm.prefill_with(&xs, group))
                    .map_err(reduce_err)?;
                for c in caches {
                    write_frame(&mut s, &kv_to_wire(c)?).map_err(io)?;
                }
            }
            RankCommand::Kv { id, kv } => {
                seqs.insert(id, kv_from_wire::<B>(kv, device)?);
            }
            RankCommand::Decode { ids, x } => {
                let mut caches = ids
                    .iter()
                    .map(|id| seqs.remove(id).ok_or(WorkerError::NoKv(*id)))
                    .collect::<Result<Vec<_>, _>>()?;
                let x = tensor(x, device);
                pools
                    .run(1.0, || lm.decode_with(x, &mut caches, group))
                    .map_err(reduce_err)?;
                seqs.extend(ids.into_iter().zip(caches));
            }
            RankCommand::Release { ids } => {
                for id in ids {
                    seqs.remove(&id);
                }
            }
            RankCommand::Encode { items, share } => {
                let items: Vec<EncoderItem<B>> =
                    items.into_iter().map(|t| t.into_item(device)).collect();
                pools
                    .run(share, || model.encode_with(&items, group))
                    .map_err(encode_err)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;

    /// Four ranks over loopback (threads here, processes in a worker): every
    /// rank gets the rank-ordered sum, bit for bit.
    #[test]
    fn tcp_all_reduce_sums_in_rank_order_on_every_rank() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let root = listener.local_addr().unwrap();
        let world = 4;
        let input =
            |r: usize| -> Vec<f32> { (0..1000).map(|i| (i * (r + 1)) as f32 * 0.1).collect() };
        let mut want = input(0);
        for r in 1..world {
            for (w, v) in want.iter_mut().zip(input(r)) {
                *w += v;
            }
        }
        let followers: Vec<_> = (1..world)
            .map(|r| {
                std::thread::spawn(move || {
                    let g = TcpGroup::connect(root, r, world).unwrap();
                    let mut d = input(r);
                    AllReduce::<NdArray>::sum_host(&g, &mut d).unwrap();
                    d
                })
            })
            .collect();
        let g = TcpGroup::accept(&listener, world, Duration::from_secs(20)).unwrap();
        let mut d = input(0);
        AllReduce::<NdArray>::sum_host(&g, &mut d).unwrap();
        assert_eq!(d, want);
        for f in followers {
            assert_eq!(f.join().unwrap(), want);
        }
    }
}
