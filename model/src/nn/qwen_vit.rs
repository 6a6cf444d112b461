//! Qwen2.5-VL style vision tower for images and video: temporal patches of frame
//! pairs, 2-D rotary positions, window attention with periodic full attention (per
//! temporal patch), and the 2x2 spatial merger.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::attention::{index_tensor, RopeAngles, Segments};
use super::blocks::{EncoderBlock, EncoderBlockConfig, Norm, NormConfig, NormKind};
use super::projector::{Projector, ProjectorConfig};
use super::vit::inverse;

/// RoPE base of the Qwen2-VL vision tower (`VisionRotaryEmbedding(theta=10000)`).
const VISION_ROPE_THETA: f64 = 10_000.0;

/// Configuration of [`QwenVision`].
#[derive(Config, Debug)]
pub struct QwenVisionConfig {
    /// Patch side in pixels (14).
    pub patch: usize,
    /// Frames per temporal patch (2).
    pub temporal_patch: usize,
    /// Merge factor per side (2: 2x2 patches -> one LLM token).
    pub merge: usize,
    /// Attention window side in patches (Qwen2.5-VL: 112 px / 14 = 8).
    pub window: usize,
    /// Block `i` attends over its whole temporal patch when `(i + 1) % fullatt_every
    /// == 0` (`fullatt_block_indexes` 7, 15, 23, 31 -> 8); the others within windows.
    pub fullatt_every: usize,
    /// Model width `d`.
    pub d_model: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// Transformer blocks.
    pub n_layers: usize,
    /// SwiGLU hidden width.
    pub d_ff: usize,
    /// The LLM's embedding width (merger output).
    pub d_llm: usize,
}

impl QwenVisionConfig {
    /// Flattened features of one patch: `3 * temporal_patch * patch^2`.
    pub fn patch_dim(&self) -> usize {
        3 * self.temporal_patch * self.patch * self.patch
    }

    /// A randomly initialised [`QwenVision`] on `device`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> QwenVision<B> {
        let m2 = self.merge * self.merge;
        QwenVision {
            patch_embed: LinearConfig::new(self.patch_dim(), self.d_model)
                .with_bias(false)
                .init(device),
            blocks: (0..self.n_layers)
                .map(|_| {
                    EncoderBlockConfig::new(self.d_model, self.n_heads, self.d_ff)
                        .with_gated(true)
                        .with_norm(NormKind::Rms)
                        .init(device)
                })
                .collect(),
            ln_q: NormConfig::new(self.d_model, NormKind::Rms).init(device),
            merger: ProjectorConfig::new(m2 * self.d_model, m2 * self.d_model, self.d_llm)
                .init(device),
            merge: self.merge,
            window: self.window,
            fullatt_every: self.fullatt_every.max(1),
            head_dim: self.d_model / self.n_heads,
        }
    }
}

/// The patches of one image or video.
#[derive(Clone, Debug)]
pub struct QwenPatches<B: Backend> {
    /// `[t*grid_h*grid_w, 3*temporal_patch*patch^2]`: temporal patch by temporal
    /// patch, patches in raster order, each flattened `(c, frame, y, x)`.
    pub patches: Tensor<B, 2>,
    /// Temporal patches (1 for an image: its frame is duplicated).
    pub t: usize,
    /// Patch rows (a multiple of `merge`).
    pub grid_h: usize,
    /// Patch columns (a multiple of `merge`).
    pub grid_w: usize,
}

/// Qwen2.5-VL style vision tower with its merger.
#[derive(Module, Debug)]
pub struct QwenVision<B: Backend> {
    patch_embed: Linear<B>,
    blocks: Vec<EncoderBlock<B>>,
    /// RMSNorm of each patch before the merge (the merger's `ln_q`).
    ln_q: Norm<B>,
    merger: Projector<B>,
    merge: usize,
    window: usize,
    fullatt_every: usize,
    head_dim: usize,
}

/// Token layout of a micro-batch: window order, segments and positions.
struct Layout {
    /// Input (raster) index of each patch in processing order.
    order: Vec<usize>,
    /// Merged-token index (raster over merged tokens) of each merge group, in
    /// processing order.
    groups: Vec<usize>,
    windows: Vec<usize>,
    slices: Vec<usize>,
    rows_cols: Vec<(usize, usize)>,
}

impl<B: Backend> QwenVision<B> {
    /// Encode a micro-batch of images / videos in one pass.
    ///
    /// # Shapes
    /// * item `i`: see [`QwenPatches`]
    /// * output `i`: `[t*grid_h*grid_w / merge^2, d_llm]` (LLM tokens in raster order
    ///   of merged patches, temporal patch by temporal patch), matching
    ///   `ModelArch::{image,video}_tokens(..).llm_tokens`
    pub fn forward(&self, items: &[QwenPatches<B>]) -> Vec<Tensor<B, 2>> {
        if items.is_empty() {
            return Vec::new();
        }
        let device = items[0].patches.device();
        let dims: Vec<(usize, usize, usize)> = items
            .iter()
            .map(|it| (it.t, it.grid_h, it.grid_w))
            .collect();
        let layout = layout(&dims, self.merge, self.window);
        let x = Tensor::cat(items.iter().map(|it| it.patches.clone()).collect(), 0);
        let x = self
            .patch_embed
            .forward(x)
            .select(0, index_tensor(&layout.order, &device));
        let rope =
            RopeAngles::positions_2d(&layout.rows_cols, self.head_dim, VISION_ROPE_THETA, &device);
        let windows = Segments::new(layout.windows.iter().copied());
        let slices = Segments::new(layout.slices.iter().copied());
        let mut x = x;
        for (i, block) in self.blocks.iter().enumerate() {
            let seg = if (i + 1) % self.fullatt_every == 0 {
                &slices
            } else {
                &windows
            };
            x = block.forward(x, seg, Some(&rope));
        }
        // Merge groups are contiguous in window order: merge, then restore raster
        // order of the merged tokens.
        let [n, d] = x.dims();
        let m2 = self.merge * self.merge;
        let merged = self
            .merger
            .forward(self.ln_q.forward(x).reshape([n / m2, m2 * d]));
        let merged = merged.select(0, index_tensor(&inverse(&layout.groups), &device));
        let mut out = Vec::with_capacity(items.len());
        let mut start = 0;
        for it in items {
            let len = it.t * it.grid_h * it.grid_w / m2;
            out.push(merged.clone().narrow(0, start, len));
            start += len;
        }
        out
    }
}

/// Processing order of all tokens: for each item and temporal patch, window by
/// window, merge group by merge group (each group's `merge x merge` patches
/// contiguous, so the merger is a reshape).
fn layout(items: &[(usize, usize, usize)], merge: usize, window: usize) -> Layout {
    let m = merge;
    let wg = (window / m).max(1); // window side in merge groups
    let mut lay = Layout {
        order: Vec::new(),
        groups: Vec::new(),
        windows: Vec::new(),
        slices: Vec::new(),
        rows_cols: Vec::new(),
    };
    let mut base = 0; // raster-patch offset of the item
    let mut group_base = 0; // merged-token offset of the item
    for &(t_len, grid_h, grid_w) in items {
        let (gh, gw) = (grid_h / m, grid_w / m);
        for t in 0..t_len {
            let slice_base = base + t * grid_h * grid_w;
            let slice_groups = group_base + t * gh * gw;
            let before_slice = lay.order.len();
            for wr in (0..gh).step_by(wg) {
                for wc in (0..gw).step_by(wg) {
                    let before = lay.order.len();
                    for gr in wr..(wr + wg).min(gh) {
                        for gc in wc..(wc + wg).min(gw) {
                            lay.groups.push(slice_groups + gr * gw + gc);
                            for r in 0..m {
                                for c in 0..m {
                                    let (row, col) = (gr * m + r, gc * m + c);
                                    lay.order.push(slice_base + row * grid_w + col);
                                    lay.rows_cols.push((row, col));
                                }
                            }
                        }
                    }
                    lay.windows.push(lay.order.len() - before);
                }
            }
            lay.slices.push(lay.order.len() - before_slice);
        }
        base += t_len * grid_h * grid_w;
        group_base += t_len * gh * gw;
    }
    lay
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_orders_windows_then_merge_groups() {
        // One 4x6-patch slice, merge 2, 4-patch windows: 2x3 merge groups, windows of
        // 2x2 groups -> a full window (16 patches) and an edge window (8).
        let lay = layout(&[(1, 4, 6)], 2, 4);
        assert_eq!(lay.windows, vec![16, 8]);
        assert_eq!(lay.slices, vec![24]);
        assert_eq!(lay.groups, vec![0, 1, 3, 4, 2, 5]);
        assert_eq!(&lay.order[..8], &[0, 1, 6, 7, 2, 3, 8, 9]);
        assert_eq!(&lay.order[16..], &[4, 5, 10, 11, 16, 17, 22, 23]);
        assert_eq!(lay.rows_cols[5], (0, 3));
        let mut sorted = lay.order.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..24).collect::<Vec<_>>());
        // A second item's indices continue after the first's.
        let two = layout(&[(1, 4, 6), (2, 2, 2)], 2, 4);
        assert_eq!(two.slices, vec![24, 4, 4]);
        assert_eq!(&two.groups[6..], &[6, 7]);
        assert_eq!(&two.order[24..28], &[24, 25, 26, 27]);
    }
}
