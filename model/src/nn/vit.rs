//! ViT image encoder (CLIP style) and the LLaVA-NeXT "anyres" image path.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Initializer, Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use super::attention::{index_tensor, Segments};
use super::blocks::{EncoderBlock, EncoderBlockConfig, Norm, NormConfig, NormKind};
use super::projector::{Projector, ProjectorConfig};
use super::tp::{infallible, materialize, AllReduce, Solo, TpError};

/// Configuration of [`Vit`].
#[derive(Config, Debug)]
pub struct VitConfig {
    /// Square input side in pixels (CLIP ViT-L/14-336: 336).
    pub image_size: usize,
    /// Square patch side in pixels (14).
    pub patch: usize,
    /// Model width `d`.
    pub d_model: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// Transformer blocks.
    pub n_layers: usize,
    /// MLP hidden width.
    pub d_ff: usize,
    /// Window attention: side of a square window in patches. Every block but the last
    /// attends within windows (the CLS token alone); the last attends over the tile.
    /// `None` (CLIP): every block attends over the whole tile.
    #[config(default = "None")]
    pub window: Option<usize>,
}

impl VitConfig {
    /// Patches per side of a tile.
    pub fn grid(&self) -> usize {
        self.image_size / self.patch
    }

    /// A randomly initialised [`Vit`] on `device`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Vit<B> {
        let g = self.grid();
        let normal = Initializer::Normal {
            mean: 0.0,
            std: 0.02,
        };
        Vit {
            patch_embed: LinearConfig::new(3 * self.patch * self.patch, self.d_model)
                .with_bias(false)
                .init(device),
            cls: normal.init([1, self.d_model], device),
            pos: normal.init([g * g + 1, self.d_model], device),
            pre_norm: NormConfig::new(self.d_model, NormKind::Layer).init(device),
            blocks: (0..self.n_layers)
                .map(|_| {
                    EncoderBlockConfig::new(self.d_model, self.n_heads, self.d_ff).init(device)
                })
                .collect(),
            grid: g,
            window: self.window,
        }
    }
}

/// A ViT over square tiles: patch embedding (a linear map of each flattened
/// `3 x patch x patch` patch, i.e. a stride-`patch` convolution), a CLS token,
/// learned positions, pre-norm blocks. Outputs the last block's patch features (CLS
/// dropped). LLaVA feeds its projector from the penultimate CLIP layer
/// (`vision_feature_layer: -2`); build this with `n_layers - 1` blocks for that.
#[derive(Module, Debug)]
pub struct Vit<B: Backend> {
    patch_embed: Linear<B>,
    cls: Param<Tensor<B, 2>>,
    pos: Param<Tensor<B, 2>>,
    pre_norm: Norm<B>,
    blocks: Vec<EncoderBlock<B>>,
    grid: usize,
    window: Option<usize>,
}

impl<B: Backend> Vit<B> {
    /// Encode tiles.
    ///
    /// # Shapes
    /// * `tiles`: `[T, grid*grid, 3*patch*patch]`, patches in raster order, each
    ///   patch flattened channel-major (`c, y, x`)
    /// * output: `[T, grid*grid, d]`
    pub fn forward(&self, tiles: Tensor<B, 3>) -> Tensor<B, 3> {
        infallible(self.forward_with(tiles, &Solo))
    }

    /// [`Vit::forward`] on one rank of a tensor-parallel group (this a
    /// [`Vit::shard`], `reduce` its group).
    ///
    /// # Shapes
    /// As [`Vit::forward`].
    ///
    /// # Errors
    /// An all-reduce failed.
    pub fn forward_with<R: AllReduce<B>>(
        &self,
        tiles: Tensor<B, 3>,
        reduce: &R,
    ) -> Result<Tensor<B, 3>, R::Error> {
        let [t, n, _] = tiles.dims();
        let device = tiles.device();
        let patches = self.patch_embed.forward(tiles);
        let [_, _, d] = patches.dims();
        let cls = self.cls.val().reshape([1, 1, d]).repeat_dim(0, t);
        let x = Tensor::cat(vec![cls, patches], 1) + self.pos.val().reshape([1, n + 1, d]);
        let x = self.pre_norm.forward(x).reshape([t * (n + 1), d]);
        let full = Segments::uniform(t, n + 1);
        let (x, order) = match self.window {
            Some(w) if w < self.grid => {
                let (perm, lens) = window_order(self.grid, self.grid, w);
                // Per tile: CLS first, then patches window by window.
                let mut idx = Vec::with_capacity(t * (n + 1));
                let mut seg = Vec::new();
                for tile in 0..t {
                    let base = tile * (n + 1);
                    idx.push(base);
                    idx.extend(perm.iter().map(|&p| base + 1 + p));
                    seg.push(1);
                    seg.extend_from_slice(&lens);
                }
                let inv = inverse(&idx);
                (
                    x.select(0, index_tensor(&idx, &device)),
                    // The window order keeps tiles contiguous: full segments stay one per tile.
                    Some((Segments::new(seg), inv)),
                )
            }
            _ => (x, None),
        };
        let last = self.blocks.len().saturating_sub(1);
        let mut x = x;
        for (i, block) in self.blocks.iter().enumerate() {
            let seg = match &order {
                Some((windows, _)) if i != last => windows,
                _ => &full,
            };
            x = block.forward_with(x, seg, None, reduce)?;
        }
        if let Some((_, inv)) = order {
            x = x.select(0, index_tensor(&inv, &device));
        }
        Ok(x.reshape([t, n + 1, d]).narrow(1, 1, n))
    }

    /// Rank `rank`'s shard of `tp`: each block by [`EncoderBlock::shard`];
    /// patch embedding, CLS, positions and the pre-norm replicated.
    ///
    /// Errors: as [`EncoderBlock::shard`].
    pub fn shard(&self, rank: usize, tp: usize) -> Result<Vit<B>, TpError> {
        materialize(self);
        Ok(Vit {
            patch_embed: self.patch_embed.clone(),
            cls: self.cls.clone(),
            pos: self.pos.clone(),
            pre_norm: self.pre_norm.clone(),
            blocks: self
                .blocks
                .iter()
                .map(|b| b.shard(rank, tp))
                .collect::<Result<_, _>>()?,
            grid: self.grid,
            window: self.window,
        })
    }
}

/// Inverse permutation.
pub(crate) fn inverse(perm: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    inv
}

/// Raster indices of a `rows x cols` patch grid reordered window by window (square
/// windows of `w` patches per side, row-major over windows, row-major inside), and
/// the window lengths (edge windows are smaller).
pub(crate) fn window_order(rows: usize, cols: usize, w: usize) -> (Vec<usize>, Vec<usize>) {
    let w = w.max(1);
    let mut perm = Vec::with_capacity(rows * cols);
    let mut lens = Vec::new();
    for wr in (0..rows).step_by(w) {
        for wc in (0..cols).step_by(w) {
            let before = perm.len();
            for r in wr..(wr + w).min(rows) {
                for c in wc..(wc + w).min(cols) {
                    perm.push(r * cols + c);
                }
            }
            lens.push(perm.len() - before);
        }
    }
    (perm, lens)
}

/// One image prepared for the anyres path.
#[derive(Clone, Debug)]
pub struct AnyresImage<B: Backend> {
    /// `[1 + grid_h*grid_w, grid*grid, 3*patch*patch]`: the base tile (whole image
    /// resized to one tile) then the grid tiles in raster order.
    pub tiles: Tensor<B, 3>,
    /// Grid tiles per column.
    pub grid_h: usize,
    /// Grid tiles per row.
    pub grid_w: usize,
    /// Feature rows kept after unpadding (`easerve_model::tokens::unpadded_crop`).
    pub crop_rows: usize,
    /// Feature columns kept after unpadding.
    pub crop_cols: usize,
}

/// Configuration of [`AnyresVision`].
#[derive(Config, Debug)]
pub struct AnyresVisionConfig {
    /// The ViT.
    pub vit: VitConfig,
    /// The projector into the LLM's embedding space (LLaVA `mlp2x_gelu`).
    pub projector: ProjectorConfig,
}

impl AnyresVisionConfig {
    /// A randomly initialised [`AnyresVision`] on `device`.
    pub fn init<B: Backend>(&self, device: &B::Device) -> AnyresVision<B> {
        AnyresVision {
            vit: self.vit.init(device),
            projector: self.projector.init(device),
            newline: Initializer::Normal {
                mean: 0.0,
                std: 0.02,
            }
            .init([1, self.projector.d_output], device),
            side: self.vit.grid(),
        }
    }
}

/// LLaVA-NeXT image path: ViT over all tiles, projector, then the base tile's
/// features followed by the unpadded grid feature map with one learned newline
/// embedding after each row.
#[derive(Module, Debug)]
pub struct AnyresVision<B: Backend> {
    vit: Vit<B>,
    projector: Projector<B>,
    newline: Param<Tensor<B, 2>>,
    side: usize,
}

impl<B: Backend> AnyresVision<B> {
    /// Encode a micro-batch of images in one ViT pass.
    ///
    /// # Shapes
    /// * each image: see [`AnyresImage`]
    /// * output `i`: `[side^2 + crop_rows*(crop_cols + 1), d_llm]`, matching
    ///   `ModelArch::image_tokens(..).llm_tokens`
    pub fn forward(&self, images: &[AnyresImage<B>]) -> Vec<Tensor<B, 2>> {
        infallible(self.forward_with(images, &Solo))
    }

    /// Rank `rank`'s shard of `tp`: the ViT by [`Vit::shard`], the projector
    /// and the newline embedding replicated.
    ///
    /// Errors: as [`Vit::shard`].
    pub fn shard(&self, rank: usize, tp: usize) -> Result<AnyresVision<B>, TpError> {
        materialize(self);
        Ok(AnyresVision {
            vit: self.vit.shard(rank, tp)?,
            projector: self.projector.clone(),
            newline: self.newline.clone(),
            side: self.side,
        })
    }

    /// [`AnyresVision::forward`] on one rank of a tensor-parallel group (this
    /// an [`AnyresVision::shard`], `reduce` its group); every rank returns
    /// the same embeddings.
    ///
    /// # Shapes
    /// As [`AnyresVision::forward`].
    ///
    /// # Errors
    /// An all-reduce failed.
    pub fn forward_with<R: AllReduce<B>>(
        &self,
        images: &[AnyresImage<B>],
        reduce: &R,
    ) -> Result<Vec<Tensor<B, 2>>, R::Error> {
        if images.is_empty() {
            return Ok(Vec::new());
        }
        let counts: Vec<usize> = images.iter().map(|im| im.tiles.dims()[0]).collect();
        let all = Tensor::cat(images.iter().map(|im| im.tiles.clone()).collect(), 0);
        let feats = self.vit.forward_with(all, reduce)?;
        let [t, n, d] = feats.dims();
        let proj = self.projector.forward(feats.reshape([t * n, d]));
        let dl = proj.dims()[1];
        let proj = proj.reshape([t, n, dl]);
        let s = self.side;
        let mut out = Vec::with_capacity(images.len());
        let mut start = 0;
        for (im, &c) in images.iter().zip(&counts) {
            let tiles = proj.clone().narrow(0, start, c);
            start += c;
            let base = tiles.clone().narrow(0, 0, 1).reshape([n, dl]);
            let (gh, gw) = (im.grid_h, im.grid_w);
            let grid = tiles
                .narrow(0, 1, gh * gw)
                .reshape([gh, gw, s, s, dl])
                .permute([0, 2, 1, 3, 4])
                .reshape([gh * s, gw * s, dl]);
            let (rows, cols) = (im.crop_rows, im.crop_cols);
            if rows == 0 || cols == 0 {
                // An extreme aspect ratio crops the grid away (HF yields an empty grid).
                out.push(base);
                continue;
            }
            let grid =
                grid.narrow(0, (gh * s - rows) / 2, rows)
                    .narrow(1, (gw * s - cols) / 2, cols);
            let nl = self.newline.val().reshape([1, 1, dl]).repeat_dim(0, rows);
            let grid = Tensor::cat(vec![grid, nl], 1).reshape([rows * (cols + 1), dl]);
            out.push(Tensor::cat(vec![base, grid], 0));
        }
        Ok(out)
    }
}
