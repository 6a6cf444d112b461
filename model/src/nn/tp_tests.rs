//! Tensor-parallel forwards equal the TP 1 forward (tiny-image's LM and
//! encoder blocks, NdArray, f32).
//!
//! Tolerance: a shard's row-parallel partial sums are added in another order
//! than the unsharded matmul's, so results differ by f32 rounding only; every
//! comparison allows `max |a - b| ≤ 1e-4 · max |reference|` ([`REL_TOL`]).

use burn::backend::NdArray;
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};

use super::lm::{DecoderLm, KvCache};
use super::tp::{kv_heads_of, LocalGroup, LocalRank, TpError};
use super::MultimodalModel;
use crate::arch::ModelArch;

type B = NdArray;

/// Relative tolerance of a TP k result against TP 1 (see the module doc).
const REL_TOL: f32 = 1e-4;

fn lm(name: &str) -> DecoderLm<B> {
    let device = Default::default();
    B::seed(&device, 7);
    MultimodalModel::<B>::from_arch(&ModelArch::preset(name).unwrap(), &device)
        .unwrap()
        .lm
}

fn rand<const D: usize>(shape: [usize; D]) -> Tensor<B, D> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), &Default::default())
}

fn assert_close<const D: usize>(got: Tensor<B, D>, want: Tensor<B, D>, what: &str) {
    assert_eq!(got.dims(), want.dims(), "{what}");
    let scale: f32 = want.clone().abs().max().into_scalar();
    let diff: f32 = (got - want).abs().max().into_scalar();
    assert!(
        diff <= REL_TOL * scale,
        "{what}: max difference {diff} over scale {scale} exceeds {REL_TOL} relative"
    );
}

/// `f(shard, group rank)` on each rank of a `tp`-way split of `m`, one thread
/// per rank; the results in rank order.
fn on_ranks<T: Send>(
    m: &DecoderLm<B>,
    tp: usize,
    f: impl Fn(DecoderLm<B>, LocalRank) -> T + Sync,
) -> Vec<T> {
    let shards: Vec<DecoderLm<B>> = (0..tp).map(|r| m.shard(r, tp).unwrap()).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = shards
            .into_iter()
            .zip(LocalGroup::ranks(tp))
            .map(|(shard, rank)| s.spawn(|| f(shard, rank)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

type Steps = (Vec<Tensor<B, 2>>, Vec<KvCache<B>>);

/// Prefill two sequences (7 and 4 tokens), then three decode steps over both:
/// the logits of each pass and the caches at the end.
fn passes(
    m: &DecoderLm<B>,
    prompts: &[Tensor<B, 2>],
    next: &Tensor<B, 2>,
    red: &LocalRank,
) -> Steps {
    let (logits, mut caches) = m.prefill_with(prompts, red).unwrap();
    let mut out = vec![logits];
    for i in 0..3 {
        let x = next.clone().narrow(0, 2 * i, 2);
        out.push(m.decode_with(x, &mut caches, red).unwrap());
    }
    (out, caches)
}

#[test]
fn tp2_and_tp4_prefill_and_decode_equal_tp1() {
    let m = lm("tiny-image");
    let prompts = vec![rand([7, 256]), rand([4, 256])];
    let next = rand([6, 256]);
    let want = on_ranks(&m, 1, |s, r| passes(&s, &prompts, &next, &r)).remove(0);
    for tp in [2, 4] {
        let ranks = on_ranks(&m, tp, |s, r| passes(&s, &prompts, &next, &r));
        for (rank, (logits, _)) in ranks.iter().enumerate() {
            for (step, (g, w)) in logits.iter().zip(&want.0).enumerate() {
                assert_close(
                    g.clone(),
                    w.clone(),
                    &format!("TP {tp} rank {rank} pass {step}"),
                );
            }
        }
        for seq in 0..2 {
            let shards: Vec<KvCache<B>> = ranks.iter().map(|r| r.1[seq].clone()).collect();
            assert_eq!(shards[0].kv_heads(), kv_heads_of(0, tp, 2).len());
            let whole = KvCache::reshard(&shards, tp, 1, 2).remove(0);
            assert_eq!(whole.len, want.1[seq].len);
            for l in 0..4 {
                let what = format!("TP {tp} sequence {seq} layer {l}");
                assert_close(whole.keys(l), want.1[seq].keys(l), &what);
                assert_close(whole.values(l), want.1[seq].values(l), &what);
            }
        }
    }
}

/// One decode step at TP `tp` over the given per-rank caches: rank 0's logits.
fn decode_at(
    m: &DecoderLm<B>,
    tp: usize,
    caches: Vec<Vec<KvCache<B>>>,
    x: &Tensor<B, 2>,
) -> Tensor<B, 2> {
    let caches: Vec<std::sync::Mutex<Vec<KvCache<B>>>> =
        caches.into_iter().map(std::sync::Mutex::new).collect();
    on_ranks(m, tp, |s, r| {
        let mut c = caches[r.rank()].lock().unwrap();
        s.decode_with(x.clone(), &mut c, &r).unwrap()
    })
    .remove(0)
}

/// A prefill at TP a hands its cache to a decode at TP b (2 -> 1 and 1 -> 2):
/// the decode step equals the TP 1 decode over the TP 1 cache.
#[test]
fn kv_reshard_between_tp1_and_tp2_decodes_as_tp1() {
    let m = lm("tiny-image");
    let prompt = rand([9, 256]);
    let x = rand([1, 256]);
    let prefill_caches = |tp| -> Vec<KvCache<B>> {
        on_ranks(&m, tp, |s, r| {
            s.prefill_with(std::slice::from_ref(&prompt), &r)
                .unwrap()
                .1
                .remove(0)
        })
    };
    let tp1 = prefill_caches(1);
    let want = decode_at(&m, 1, vec![tp1.clone()], &x);
    for (from, to) in [(2, 1), (1, 2)] {
        let shards = if from == 1 {
            tp1.clone()
        } else {
            prefill_caches(from)
        };
        let resharded = KvCache::reshard(&shards, from, to, 2);
        assert_eq!(resharded.len(), to);
        let got = decode_at(&m, to, resharded.into_iter().map(|c| vec![c]).collect(), &x);
        assert_close(got, want.clone(), &format!("TP {from} -> TP {to}"));
    }
}

#[test]
fn a_tp_that_does_not_divide_the_heads_is_refused() {
    let m = lm("tiny-image");
    let e = m.shard(0, 3).unwrap_err();
    assert!(
        matches!(&e, TpError::Indivisible { what: "LLM attention heads", count: 4, allowed, .. } if allowed == &[1, 2, 4]),
        "{e}"
    );
    assert!(matches!(m.shard(2, 2), Err(TpError::BadRank { .. })));
    let moe = lm("tiny-moe");
    assert!(matches!(moe.shard(0, 2), Err(TpError::Unsupported(_))));
    assert!(moe.shard(0, 1).is_ok());
}

fn image() -> super::EncoderItem<B> {
    // tiny-image: a 2x1 grid of 112-px tiles plus the base tile, 64 patches each.
    super::EncoderItem::Anyres(super::AnyresImage {
        tiles: rand([3, 64, 588]),
        grid_h: 2,
        grid_w: 1,
        crop_rows: 16,
        crop_cols: 8,
    })
}

/// The anyres encoder (4 heads, GELU MLP 1024, biases) at TP 2 and 4 equals TP 1.
#[test]
fn tp2_and_tp4_anyres_encoder_equals_tp1() {
    let device = Default::default();
    B::seed(&device, 7);
    let m = MultimodalModel::<B>::from_arch(&ModelArch::preset("tiny-image").unwrap(), &device)
        .unwrap();
    let items = vec![image(), image()];
    let want = m.encode(&items).unwrap();
    for tp in [2, 4] {
        let shards: Vec<_> = (0..tp).map(|r| m.shard(r, tp, true).unwrap()).collect();
        let got: Vec<Vec<Tensor<B, 2>>> = std::thread::scope(|s| {
            let hs: Vec<_> = shards
                .iter()
                .zip(LocalGroup::ranks(tp))
                .map(|(sh, red)| {
                    let items = &items;
                    s.spawn(move || sh.encode_with(items, &red).ok().unwrap())
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, out) in got.into_iter().enumerate() {
            for (g, w) in out.into_iter().zip(&want) {
                assert_close(g, w.clone(), &format!("encoder TP {tp} rank {rank}"));
            }
        }
    }
    let qwen = MultimodalModel::<B>::from_arch(&ModelArch::preset("tiny-video").unwrap(), &device)
        .unwrap();
    assert!(matches!(
        qwen.shard(0, 2, true),
        Err(TpError::Unsupported(_))
    ));
    assert!(qwen.shard(0, 2, false).is_ok());
}
