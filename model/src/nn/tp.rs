//! Tensor parallelism (Megatron-LM, Shoeybi et al. 2019, arXiv:1909.08053 §3):
//! how a layer's weights split across `tp` ranks and the all-reduce that joins
//! their partial sums.
//!
//! * Column-parallel (split by output features, no communication): the fused
//!   QKV (or Q and fused KV) projections, by heads; the MLP's up projection and,
//!   in a gated MLP, its gate, by hidden features.
//! * Row-parallel (split by input features, the output is a partial sum): the
//!   attention output projection and the MLP's down projection, each followed by
//!   one all-reduce (sum) of `[tokens, d]`. A row-parallel bias is kept on rank 0
//!   only, so the sum adds it once.
//! * Attention heads split across ranks; key/value heads split the same way, so
//!   each rank's KV cache holds its own KV heads. With fewer KV heads than ranks
//!   (a GQA model at high TP), each KV head is replicated on `tp / kv_heads`
//!   consecutive ranks, vLLM's rule (`QKVParallelLinear`).
//! * Norms, the token embedding, the LM head and the encoder's patch embedding and
//!   projector are **replicated**: every rank holds them whole and, after the last
//!   all-reduce, computes the same hidden state and logits (rank 0's are used).
//!
//! A rank's forward takes an [`AllReduce`]: [`Solo`] for TP 1, [`LocalGroup`]'s
//! ranks for threads of one process (tests), a cross-process one in the worker.

use std::convert::Infallible;
use std::ops::Range;
use std::sync::{Arc, Barrier, Mutex};

use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::Linear;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

pub use crate::arch::allowed_tp;

/// Why a model cannot be split `tp` ways.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum TpError {
    /// A width that must divide by the TP degree does not.
    #[error("TP {tp} does not divide the {what} ({count}); allowed TP degrees: {allowed:?}")]
    Indivisible {
        /// The TP degree asked for.
        tp: usize,
        /// `"LLM attention heads"`, `"LLM KV heads"`, `"encoder heads"`, ...
        what: &'static str,
        /// The count that must divide.
        count: usize,
        /// The TP degrees (≤ 64) this model splits into.
        allowed: Vec<usize>,
    },
    /// The rank is not below the TP degree, or the degree is zero.
    #[error("rank {rank} of TP {tp}: need 0 ≤ rank < TP and TP ≥ 1")]
    BadRank {
        /// The rank asked for.
        rank: usize,
        /// The TP degree.
        tp: usize,
    },
    /// A layer kind without a tensor-parallel split.
    #[error("{0} has no tensor-parallel split (TP must be 1)")]
    Unsupported(&'static str),
}

/// Sum of a tensor across the ranks of one tensor-parallel group.
///
/// Every rank calls [`AllReduce::sum`] the same number of times, in the same
/// order, with tensors of the same shape; each gets the elementwise sum over
/// all ranks. Implementations sum in rank order (0, 1, ...) so every rank gets
/// bit-identical results and a run is deterministic.
pub trait AllReduce<B: Backend> {
    /// A failed exchange (a peer gone, a socket error).
    type Error;

    /// Ranks in the group (the TP degree).
    fn world(&self) -> usize;

    /// Sum `data` (f32, row-major, the same length on every rank) across the
    /// group, in place.
    ///
    /// # Errors
    /// The exchange failed.
    fn sum_host(&self, data: &mut [f32]) -> Result<(), Self::Error>;

    /// Elementwise sum of `x` over the group (`x` unchanged at world 1). The
    /// default copies through host memory ([`AllReduce::sum_host`]).
    ///
    /// # Shapes
    /// `[...]` -> `[...]`, the same on every rank.
    ///
    /// # Errors
    /// The exchange failed.
    fn sum<const D: usize>(&self, x: Tensor<B, D>) -> Result<Tensor<B, D>, Self::Error> {
        if self.world() <= 1 {
            return Ok(x);
        }
        let device = x.device();
        let shape = x.dims();
        let mut data = host_f32(x);
        self.sum_host(&mut data)?;
        Ok(Tensor::from_data(TensorData::new(data, shape), &device))
    }
}

/// A tensor's values as f32 on the host.
pub(crate) fn host_f32<B: Backend, const D: usize>(x: Tensor<B, D>) -> Vec<f32> {
    x.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("converted to f32 just above")
}

/// Draw every lazily initialised parameter of `m` now, in field order.
///
/// burn initialises a parameter on its first use, and a clone of a parameter
/// not yet drawn draws its own values; a shard copies parameters, so every rank
/// must draw the whole module first, in the same order, to hold slices of the
/// same weights.
pub fn materialize<B: Backend, M: Module<B>>(m: &M) {
    struct Draw;
    impl<B: Backend> ModuleVisitor<B> for Draw {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let _ = param.val();
        }
    }
    m.visit(&mut Draw);
}

/// The group of one rank: TP 1, where a sum is the identity.
#[derive(Clone, Copy, Debug, Default)]
pub struct Solo;

impl<B: Backend> AllReduce<B> for Solo {
    type Error = Infallible;
    fn world(&self) -> usize {
        1
    }
    fn sum_host(&self, _data: &mut [f32]) -> Result<(), Infallible> {
        Ok(())
    }
}

/// The value of a result that cannot fail.
pub(crate) fn infallible<T>(r: Result<T, Infallible>) -> T {
    match r {
        Ok(t) => t,
        Err(e) => match e {},
    }
}

/// An in-process group of `world` ranks, one thread each: each rank posts its
/// buffer, waits for all, and sums all buffers in rank order.
#[derive(Debug)]
pub struct LocalGroup {
    world: usize,
    slots: Mutex<Vec<Vec<f32>>>,
    barrier: Barrier,
}

impl LocalGroup {
    /// The `world` ranks of a new group, rank `r` at index `r`; move each to
    /// its own thread.
    pub fn ranks(world: usize) -> Vec<LocalRank> {
        let world = world.max(1);
        let group = Arc::new(LocalGroup {
            world,
            slots: Mutex::new(vec![Vec::new(); world]),
            barrier: Barrier::new(world),
        });
        (0..world)
            .map(|rank| LocalRank {
                group: group.clone(),
                rank,
            })
            .collect()
    }
}

/// One rank of a [`LocalGroup`].
#[derive(Clone, Debug)]
pub struct LocalRank {
    group: Arc<LocalGroup>,
    rank: usize,
}

impl LocalRank {
    /// This rank's index in its group.
    pub fn rank(&self) -> usize {
        self.rank
    }
}

impl<B: Backend> AllReduce<B> for LocalRank {
    type Error = Infallible;
    fn world(&self) -> usize {
        self.group.world
    }
    fn sum_host(&self, data: &mut [f32]) -> Result<(), Infallible> {
        let g = &self.group;
        let lock = || g.slots.lock().unwrap_or_else(|e| e.into_inner());
        lock()[self.rank] = data.to_vec();
        g.barrier.wait();
        {
            let slots = lock();
            data.copy_from_slice(&slots[0]);
            for s in &slots[1..] {
                for (d, v) in data.iter_mut().zip(s) {
                    *d += v;
                }
            }
        }
        // nobody overwrites a slot before every rank has read them all
        g.barrier.wait();
        Ok(())
    }
}

/// The key/value heads rank `rank` of `tp` holds: `kv_heads / tp` of them, or,
/// with fewer KV heads than ranks, the one head `rank * kv_heads / tp` (replicated
/// on `tp / kv_heads` ranks).
pub fn kv_heads_of(rank: usize, tp: usize, kv_heads: usize) -> Range<usize> {
    let start = rank * kv_heads / tp;
    start..start + (kv_heads / tp).max(1)
}

/// Check `0 ≤ rank < tp`.
pub(crate) fn check_rank(rank: usize, tp: usize) -> Result<(), TpError> {
    if tp == 0 || rank >= tp {
        return Err(TpError::BadRank { rank, tp });
    }
    Ok(())
}

/// A copy of `lin` keeping the output features in `ranges` (in order), weights
/// and bias: a column-parallel shard.
pub(crate) fn columns<B: Backend>(lin: &Linear<B>, ranges: &[Range<usize>]) -> Linear<B> {
    let w = lin.weight.val();
    let pick = |t: Tensor<B, 2>| {
        Tensor::cat(
            ranges
                .iter()
                .map(|r| t.clone().narrow(1, r.start, r.len()))
                .collect(),
            1,
        )
    };
    let bias = lin.bias.as_ref().map(|b| {
        let b = b.val();
        Param::from_tensor(Tensor::cat(
            ranges
                .iter()
                .map(|r| b.clone().narrow(0, r.start, r.len()))
                .collect(),
            0,
        ))
    });
    Linear {
        weight: Param::from_tensor(pick(w)),
        bias,
    }
}

/// A copy of `lin` keeping the input features `range`: a row-parallel shard,
/// whose output is a partial sum. The bias stays on rank 0 only.
pub(crate) fn rows<B: Backend>(lin: &Linear<B>, range: Range<usize>, rank: usize) -> Linear<B> {
    Linear {
        weight: Param::from_tensor(lin.weight.val().narrow(0, range.start, range.len())),
        bias: if rank == 0 {
            lin.bias.as_ref().map(|b| Param::from_tensor(b.val()))
        } else {
            None
        },
    }
}

/// Rank `rank`'s share `rank*n/tp .. (rank+1)*n/tp` of `n` (`tp` divides `n`).
pub(crate) fn share(rank: usize, tp: usize, n: usize) -> Range<usize> {
    let k = n / tp;
    rank * k..(rank + 1) * k
}

/// `r` scaled by `by` (a head range -> a feature range).
pub(crate) fn scaled(r: Range<usize>, by: usize) -> Range<usize> {
    r.start * by..r.end * by
}

/// `r` moved by `by`.
pub(crate) fn offset(r: Range<usize>, by: usize) -> Range<usize> {
    r.start + by..r.end + by
}
