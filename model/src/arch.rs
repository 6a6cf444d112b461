//! Architecture types: an optional multimodal encoder (+ projector) and a decoder LLM.
//!
//! Field names follow the checkpoints' `config.json` terms; each field's doc names the
//! original key. Parameter counts are derived from the shapes (biases and norms, well
//! under 0.1 % of the weights, are left out).

/// Which encoder family, with the preprocessing constants that decide its token counts.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum EncoderKind {
    /// CLIP ViT with LLaVA-NeXT "anyres" tiling (image only).
    ClipAnyres {
        /// Tile side in pixels (`vision_config.image_size`, 336 for ViT-L/14-336).
        image_size: u32,
        /// Patch side in pixels (`vision_config.patch_size`, 14).
        patch: u32,
        /// Candidate resolutions `(height, width)` in pixels (`image_grid_pinpoints`;
        /// HF `select_best_resolution` reads each pair as height, width).
        grid_pinpoints: Vec<(u32, u32)>,
    },
    /// Qwen2.5-VL ViT (image + video): window attention, full attention every
    /// `fullatt_every` blocks, 2x2 patch merger.
    QwenVit {
        /// Patch side in pixels (`vision_config.patch_size`, 14).
        patch: u32,
        /// Frames per temporal patch (`vision_config.temporal_patch_size`, 2).
        temporal_patch: u32,
        /// Merge factor per side (`vision_config.spatial_merge_size`, 2): 2x2 patches -> 1 LLM token.
        spatial_merge: u32,
        /// Attention window side in pixels (`vision_config.window_size`, 112 = 8 patches).
        window_px: u32,
        /// Full attention on every `fullatt_every`-th block (`fullatt_block_indexes`
        /// [7, 15, 23, 31] -> 8).
        fullatt_every: u32,
        /// Lower pixel bound of `smart_resize` for images (`preprocessor_config.json`
        /// `min_pixels`, 3136 = 56*56).
        min_pixels: u64,
        /// Upper pixel bound of `smart_resize` for images (`max_pixels`, 12845056 = 14*14*4*16384).
        max_pixels: u64,
        /// Lower per-frame pixel bound for video frames (default
        /// [`crate::QWEN_VIDEO_MIN_PIXELS`], Qwen2.5-VL's video processor).
        #[serde(default = "default_video_min_pixels")]
        video_min_pixels: u64,
        /// Upper per-frame pixel bound for video frames (default
        /// [`crate::QWEN_VIDEO_MAX_PIXELS`]).
        #[serde(default = "default_video_max_pixels")]
        video_max_pixels: u64,
        /// Blocks after which a deepstack merger taps the ViT's features
        /// (`vision_config.deepstack_visual_indexes`, 0-based; Qwen3-VL-8B and up:
        /// [8, 16, 24]); each tap's merger output is added to the LLM's hidden
        /// states in one of its first layers. Empty (Qwen2.5-VL) for none.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        deepstack: Vec<u32>,
        /// Whether the video pixel bounds hold for the whole clip, `t'·h'·w'`
        /// (Qwen3-VL's `Qwen3VLVideoProcessor.smart_resize`), instead of per
        /// frame (Qwen2.5-VL).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        video_bounds_per_clip: bool,
    },
    /// SigLIP at a fixed resolution with average pooling (Gemma 3, image
    /// only): each image (and each pan-and-scan crop) is resized to
    /// `image_size`², encoded as `(image_size/patch)²` patches with full
    /// attention, pooled to `pooled_side²` tokens and projected to the LLM.
    Siglip {
        /// Input side in pixels (`vision_config.image_size`, 896).
        image_size: u32,
        /// Patch side in pixels (`vision_config.patch_size`, 14).
        patch: u32,
        /// Tokens per side after pooling: `sqrt(mm_tokens_per_image)` (16).
        pooled_side: u32,
        /// Pan-and-scan crops of wide or tall images (HF
        /// `Gemma3ImageProcessor` `do_pan_and_scan`; off by default there and in vLLM).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pan_and_scan: Option<PanAndScan>,
    },
    /// Fixed-size tiles through a ViT with a class token, pixel shuffle and an
    /// MLP projector (image; video as one tile per frame for InternVL): InternVL's
    /// InternViT with dynamic 448-px tiles and a thumbnail, Llama 4's vision
    /// encoder with up to 16 336-px tiles and a global tile. Each tile is a
    /// sequence of `(image_size/patch)² + 1` tokens with full attention; the
    /// class token is dropped, every `pixel_shuffle²` neighbouring patches are
    /// folded into one token of `pixel_shuffle² · hidden` channels, and the
    /// projector maps it to the LLM.
    TiledVit {
        /// Tile side in pixels (`vision_config.image_size`: 448 InternVL, 336 Llama 4).
        image_size: u32,
        /// Patch side in pixels (`vision_config.patch_size`, 14).
        patch: u32,
        /// Patches per side folded into one token: `1 / downsample_ratio`
        /// (InternVL 0.5 -> 2) or `1 / pixel_shuffle_ratio` (Llama 4 0.5 -> 2).
        pixel_shuffle: u32,
        /// How an image is cut into tiles.
        tiling: Tiling,
        /// Widths of the projector's linear layers, input first
        /// (InternVL3-38B `mlp1`: [12800, 5120, 5120]; Llama 4 vision adapter and
        /// projector: [5632, 4096, 4096, 5120]); the last is the LLM's `hidden`.
        projector: Vec<u32>,
    },
    /// The Qwen3-Omni audio encoder (audio only): 128-bin log-mel frames at
    /// 100 per second (Whisper feature extractor), cut into chunks of
    /// `chunk_frames`; three 3x3 stride-2 Conv2d layers of `conv_channels`
    /// over (mel, time) and a linear layer to `hidden` per remaining time step
    /// (13 per 100-frame chunk); transformer blocks with attention within
    /// windows of `window_chunks` chunks; an MLP projector to the LLM.
    OmniAudio {
        /// Log-mel bins (`audio_config.num_mel_bins`, 128).
        mel_bins: u32,
        /// Mel frames per conv chunk (`2 · audio_config.n_window`, 100).
        chunk_frames: u32,
        /// Chunks per attention window (`n_window_infer / (2 · n_window)`, 800 / 100 = 8).
        window_chunks: u32,
        /// Conv2d channels (`audio_config.downsample_hidden_size`, 480).
        conv_channels: u32,
        /// Widths of the projector's linear layers, input first (`proj1`,
        /// `proj2`: [1280, 1280, 2048]); the last is `audio_config.output_dim`.
        projector: Vec<u32>,
    },
    /// Whisper encoder + Ultravox stacking projector (audio only).
    Whisper {
        /// Log-mel bins (`num_mel_bins`, 128 for large-v3 / large-v3-turbo).
        mel_bins: u32,
        /// Window length in seconds (Whisper pads / cuts input to 30 s).
        window_s: f64,
        /// Encoder frames per window (`max_source_positions`, 1500 = 30 s * 50 Hz).
        frames_per_window: u32,
        /// Ultravox `stack_factor` (8): frames stacked into one LLM token.
        stack: u32,
    },
}

/// How a [`EncoderKind::TiledVit`] cuts an image into tiles.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub enum Tiling {
    /// InternVL's `dynamic_preprocess`: the grid of `cols x rows` tiles
    /// (`min_tiles ≤ cols·rows ≤ max_tiles`) whose aspect ratio is closest to
    /// the image's (on a tie the larger grid when the image covers more than
    /// half its pixels), plus a thumbnail tile of the whole image when
    /// `thumbnail` and there is more than one tile (`min_dynamic_patch`,
    /// `max_dynamic_patch`, `use_thumbnail`).
    InternVl {
        /// Fewest tiles (`min_dynamic_patch`, 1).
        min_tiles: u32,
        /// Most tiles (`max_dynamic_patch`, 12).
        max_tiles: u32,
        /// Whether a thumbnail tile is added (`use_thumbnail`).
        thumbnail: bool,
    },
    /// Llama 4's `get_best_fit`: the canvas of `rows x cols` tiles
    /// (`rows·cols ≤ max_tiles`) that needs the smallest upscale of the image
    /// (or, when every canvas needs a downscale, the smallest downscale), the
    /// smallest such canvas on a tie; a global tile of the whole image is
    /// added when there is more than one tile (`Llama4ImageProcessorFast`
    /// `max_patches` 16, `resize_to_max_canvas` false).
    Llama4 {
        /// Most tiles (`max_patches`, 16).
        max_tiles: u32,
    },
}

/// Gemma 3's pan-and-scan: an image whose long side is at least `min_ratio`
/// times its short side is also cut into 2 ..= `max_crops` crops along the
/// long side, each at least `min_crop` pixels, every crop encoded like the
/// whole image (HF `Gemma3ImageProcessor.pan_and_scan`; defaults
/// `pan_and_scan_min_crop_size` 256, `pan_and_scan_max_num_crops` 4,
/// `pan_and_scan_min_ratio_to_activate` 1.2).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PanAndScan {
    /// Smallest crop side, pixels.
    pub min_crop: u32,
    /// Most crops.
    pub max_crops: u32,
    /// Aspect ratio from which crops are made.
    pub min_ratio: f64,
}

impl Default for PanAndScan {
    fn default() -> Self {
        PanAndScan {
            min_crop: 256,
            max_crops: 4,
            min_ratio: 1.2,
        }
    }
}

fn default_video_min_pixels() -> u64 {
    crate::QWEN_VIDEO_MIN_PIXELS
}

fn default_video_max_pixels() -> u64 {
    crate::QWEN_VIDEO_MAX_PIXELS
}

/// A multimodal encoder (transformer + projector to the LLM's embedding space).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncoderArch {
    /// Encoder family and its preprocessing constants.
    pub kind: EncoderKind,
    /// Transformer blocks (`num_hidden_layers` / `depth` / `encoder_layers`).
    pub layers: u32,
    /// Model width (`hidden_size` / `d_model`).
    pub hidden: u32,
    /// Attention heads (`num_attention_heads` / `num_heads` / `encoder_attention_heads`).
    pub heads: u32,
    /// MLP width (`intermediate_size` / `encoder_ffn_dim`).
    pub ffn: u32,
    /// true for SwiGLU/gated MLP (3 matrices), false for GELU MLP (2).
    pub gated_mlp: bool,
    /// Projector parameter count (MLP / merger / stacking projector), for FLOPs and
    /// weight bytes. Its rows per item are [`ModelArch::projector_rows`].
    pub projector_params: u64,
    /// Bytes per weight / activation element (2 = BF16).
    pub dtype_bytes: u32,
}

/// A decoder-only LLM with grouped-query attention and a gated (SwiGLU / GeGLU) MLP.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmArch {
    /// Decoder layers (`num_hidden_layers`).
    pub layers: u32,
    /// Model width (`hidden_size`).
    pub hidden: u32,
    /// Query heads (`num_attention_heads`).
    pub heads: u32,
    /// Key/value heads (`num_key_value_heads`).
    pub kv_heads: u32,
    /// Per-head width (`head_dim`, or hidden/heads).
    pub head_dim: u32,
    /// MLP width (`intermediate_size`); the MLP is gated (3 matrices) in every preset.
    pub ffn: u32,
    /// Vocabulary size (`vocab_size`).
    pub vocab: u32,
    /// Bytes per weight / activation element (2 = BF16, 1 = FP8 weights with
    /// FP8 activations, vLLM's `--quantization fp8`).
    pub dtype_bytes: u32,
    /// Bytes per KV-cache element when it differs from `dtype_bytes` (1 = an
    /// FP8 KV cache, vLLM's `--kv-cache-dtype fp8`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_dtype_bytes: Option<u32>,
    /// The most positions (prompt plus output tokens) the model was trained
    /// to take (`max_position_embeddings`): a request may hold no more
    /// (vLLM's default `max_model_len`). `None`: no bound of its own (every
    /// preset: the tiny LMs' RoPE has no trained length, and the real-size
    /// presets are checked against trimmed configs without the key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_positions: Option<u64>,
    /// The mixture-of-experts layers, `None` for a dense model (every layer's MLP
    /// is the gated `ffn`-wide one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeArch>,
}

/// How a step's tokens spread over the experts: the distributions NVIDIA
/// aiconfigurator measured its MoE kernels with (`distribution` column of
/// `moe_perf.parquet`: `balanced`, `power_law_1.01`, `power_law_1.2`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum MoeRouting {
    /// Every expert receives the same share of the routed tokens.
    #[default]
    #[serde(rename = "balanced")]
    Balanced,
    /// Expert `i` (by load rank, from 1) receives a share ∝ `i^-1.01`.
    #[serde(rename = "power_law_1.01")]
    PowerLaw101,
    /// Expert `i` receives a share ∝ `i^-1.2`.
    #[serde(rename = "power_law_1.2")]
    PowerLaw12,
}

impl MoeRouting {
    /// Every routing, in the order of [`MoeRouting::name`]s listed to users.
    pub const ALL: [MoeRouting; 3] = [
        MoeRouting::Balanced,
        MoeRouting::PowerLaw101,
        MoeRouting::PowerLaw12,
    ];

    /// The name used in scenarios and in aiconfigurator's `distribution` column.
    pub fn name(self) -> &'static str {
        match self {
            MoeRouting::Balanced => "balanced",
            MoeRouting::PowerLaw101 => "power_law_1.01",
            MoeRouting::PowerLaw12 => "power_law_1.2",
        }
    }

    /// The routing of this name, `None` for another.
    pub fn from_name(name: &str) -> Option<MoeRouting> {
        MoeRouting::ALL.into_iter().find(|r| r.name() == name)
    }

    /// The power-law exponent (0 for balanced).
    pub fn exponent(self) -> f64 {
        match self {
            MoeRouting::Balanced => 0.0,
            MoeRouting::PowerLaw101 => 1.01,
            MoeRouting::PowerLaw12 => 1.2,
        }
    }

    /// Token-expert pairs per expert when `tokens` tokens each pick `top_k` of
    /// `experts` experts, most loaded first: `tokens·top_k` pairs split by the
    /// routing's shares (`i^-α` normalised, α = [`MoeRouting::exponent`]), no
    /// expert above `tokens` (a token picks an expert once), the remainder
    /// given to the next experts in turn, so the counts sum to `tokens·top_k`.
    /// Empty when `experts` is 0.
    pub fn expert_loads(self, tokens: u64, top_k: u32, experts: u32) -> Vec<u64> {
        let e = experts as usize;
        if e == 0 {
            return Vec::new();
        }
        let pairs = tokens * u64::from(top_k.min(experts));
        let alpha = self.exponent();
        let w: Vec<f64> = (1..=e).map(|i| (i as f64).powf(-alpha)).collect();
        let total: f64 = w.iter().sum();
        let mut loads: Vec<u64> = w
            .iter()
            .map(|x| ((pairs as f64 * x / total).floor() as u64).min(tokens))
            .collect();
        let mut left = pairs - loads.iter().sum::<u64>();
        // hand out what flooring and the cap left, one pair at a time, in order
        while left > 0 {
            let mut gave = false;
            for l in loads.iter_mut() {
                if left == 0 {
                    break;
                }
                if *l < tokens {
                    *l += 1;
                    left -= 1;
                    gave = true;
                }
            }
            if !gave {
                break;
            }
        }
        loads
    }
}

/// The mixture-of-experts part of an LLM (Qwen3-MoE / Llama-4 style): every
/// layer from `first_dense_layers` on replaces its MLP by a router, `experts`
/// gated experts of width `expert_ffn` of which each token takes `top_k`, and
/// optionally `shared_experts` gated experts every token takes.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeArch {
    /// Routed experts per MoE layer (`num_experts` / `num_local_experts` / `n_routed_experts`).
    pub experts: u32,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub top_k: u32,
    /// Width of one routed expert's MLP (`moe_intermediate_size`, or
    /// `intermediate_size` for Llama 4).
    pub expert_ffn: u32,
    /// Experts every token also passes (`n_shared_experts`; Llama 4: 1), 0 for none.
    #[serde(default)]
    pub shared_experts: u32,
    /// Width of a shared expert (`shared_expert_intermediate_size`, or the
    /// expert width when the config has no such key); ignored when there are none.
    #[serde(default)]
    pub shared_ffn: u32,
    /// Leading layers with a dense `ffn`-wide MLP instead (`first_k_dense_replace`;
    /// `mlp_only_layers` counted from the front), 0 when every layer is MoE.
    #[serde(default)]
    pub first_dense_layers: u32,
    /// Router output width: one logit per expert (`num_experts`); a router of
    /// `hidden x router` weights.
    pub router: u32,
    /// How tokens spread over the experts (a scenario knob; default balanced).
    #[serde(default)]
    pub routing: MoeRouting,
}

impl MoeArch {
    /// Parameters of one routed expert: gate, up and down `hidden x expert_ffn` matrices.
    pub fn expert_params(&self, hidden: u32) -> f64 {
        3.0 * f64::from(hidden) * f64::from(self.expert_ffn)
    }

    /// Parameters of the shared experts of one layer.
    pub fn shared_params(&self, hidden: u32) -> f64 {
        3.0 * f64::from(hidden) * f64::from(self.shared_ffn) * f64::from(self.shared_experts)
    }

    /// Parameters of the router of one layer: `hidden x router`.
    pub fn router_params(&self, hidden: u32) -> f64 {
        f64::from(hidden) * f64::from(self.router)
    }
}

/// A whole (multimodal) model: optional encoder + LLM.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelArch {
    /// Preset name, e.g. `"llava-v1.6-34b"`.
    pub name: String,
    /// The multimodal encoder, `None` for a text-only model.
    pub encoder: Option<EncoderArch>,
    /// The decoder LLM.
    pub llm: LlmArch,
}

/// Models whose LM head shares the input embedding matrix (`tie_word_embeddings: true`
/// in the text config). Gemma-3 ties (HF `google/gemma-3-27b-it` `Gemma3TextConfig`
/// default `tie_word_embeddings=True`); Yi-34B and Qwen2.5-32B do not.
///
/// [`LlmArch`] has no field for this (the API is fixed), so it is looked up by model
/// name here, in one table. A custom model not named here is treated as untied.
pub const TIED_EMBEDDING_MODELS: &[&str] = &["ultravox-v0.6-27b", "gemma-3-27b", "tiny-whisper-lm"];

/// The tensor-parallel degrees ≤ 64 that split a layer of `heads` query heads,
/// `kv_heads` key/value heads and the widths `widths` (MLP hidden features)
/// Megatron-style: `tp` divides `heads` and every width, and `tp` divides
/// `kv_heads` or `kv_heads` divides `tp` (each KV head then replicated on
/// `tp / kv_heads` ranks, vLLM's rule).
pub fn allowed_tp(heads: usize, kv_heads: usize, widths: &[usize]) -> Vec<usize> {
    (1..=64)
        .filter(|&tp| {
            heads.is_multiple_of(tp)
                && (kv_heads.is_multiple_of(tp) || tp.is_multiple_of(kv_heads.max(1)))
                && widths.iter().all(|w| w.is_multiple_of(tp))
        })
        .collect()
}

impl LlmArch {
    /// The TP degrees the executor splits this LLM into ([`allowed_tp`] of its
    /// heads, KV heads and dense MLP width); only 1 for a mixture of experts,
    /// which has no tensor-parallel split in the executor.
    pub fn executor_tp(&self) -> Vec<usize> {
        if self.moe.is_some() {
            return vec![1];
        }
        allowed_tp(
            self.heads as usize,
            self.kv_heads as usize,
            &[self.ffn as usize],
        )
    }

    /// The TP degrees ≤ 64 a serving engine splits this LLM's attention into:
    /// `tp` divides the query heads, and divides the KV heads or is a
    /// multiple of them (each KV head then replicated on `tp / kv_heads`
    /// ranks). vLLM's rule: `ModelConfig.verify_with_parallel_config`
    /// refuses a TP that does not divide `num_attention_heads`, and its
    /// `QKVParallelLinear` divides the KV heads by TP, or replicates them
    /// when TP is a multiple of them. vLLM also splits the dense MLP width
    /// by TP; that is not checked here (every preset's width divides 8), nor
    /// are experts (an MoE layer may take EP), unlike
    /// [`LlmArch::executor_tp`].
    pub fn serving_tp(&self) -> Vec<usize> {
        allowed_tp(self.heads as usize, self.kv_heads as usize, &[])
    }

    /// Bytes per KV-cache element: `kv_dtype_bytes`, else `dtype_bytes`.
    pub fn kv_bytes(&self) -> u32 {
        self.kv_dtype_bytes.unwrap_or(self.dtype_bytes)
    }

    /// Query width `heads * head_dim` (elements); differs from `hidden` for Gemma-3 (4096 vs 5376).
    pub fn q_width(&self) -> f64 {
        f64::from(self.heads) * f64::from(self.head_dim)
    }

    /// Key (= value) width `kv_heads * head_dim` (elements).
    pub fn kv_width(&self) -> f64 {
        f64::from(self.kv_heads) * f64::from(self.head_dim)
    }

    /// Parameters of one layer's attention: Q, K, V and O projections.
    pub fn attention_params(&self) -> f64 {
        let h = f64::from(self.hidden);
        2.0 * h * self.q_width() + 2.0 * h * self.kv_width()
    }

    /// Parameters of one dense gated MLP (3 `hidden x ffn` matrices).
    pub fn dense_mlp_params(&self) -> f64 {
        3.0 * f64::from(self.hidden) * f64::from(self.ffn)
    }

    /// Parameters of one dense decoder layer: Q, K, V, O projections + gated MLP (3 matrices).
    /// Yi-34B: 2*7168*7168 + 2*7168*1024 + 3*7168*20480 = 557.8e6.
    pub fn layer_params(&self) -> f64 {
        self.attention_params() + self.dense_mlp_params()
    }

    /// `(dense layers, MoE layers)`: all layers are dense without MoE.
    pub fn layer_split(&self) -> (u32, u32) {
        match &self.moe {
            None => (self.layers, 0),
            Some(m) => {
                let dense = m.first_dense_layers.min(self.layers);
                (dense, self.layers - dense)
            }
        }
    }

    /// Parameters of all decoder layers (no embedding, no LM head), every
    /// expert included: what memory must hold.
    /// Qwen3-VL-30B-A3B: 48 * (attention 2*2048*4096 + 2*2048*512 + router
    /// 2048*128 + 128 experts * 3*2048*768) = 29.91e9.
    pub fn body_params(&self) -> f64 {
        self.params_with_routed(|m| f64::from(m.experts))
    }

    /// Decoder-layer parameters with `routed(moe)` routed experts counted per
    /// MoE layer (all, the top k, the touched ones).
    fn params_with_routed(&self, routed: impl Fn(&MoeArch) -> f64) -> f64 {
        let (dense, moe) = self.layer_split();
        let mut p = f64::from(self.layers) * self.attention_params()
            + f64::from(dense) * self.dense_mlp_params();
        if let Some(m) = &self.moe {
            p += f64::from(moe)
                * (routed(m) * m.expert_params(self.hidden)
                    + m.shared_params(self.hidden)
                    + m.router_params(self.hidden));
        }
        p
    }

    /// Parameters one token passes through in all decoder layers: the
    /// attention, the dense MLPs, and per MoE layer the router, the shared
    /// experts and `top_k` routed experts (= [`LlmArch::body_params`] for a
    /// dense model). Qwen3-VL-30B-A3B: 48 * (attention + router + 8 experts) = 2.73e9.
    pub fn active_body_params(&self) -> f64 {
        self.params_with_routed(|m| f64::from(m.top_k.min(m.experts)))
    }

    /// Weight parameters a pass over `tokens` tokens reads from HBM in all
    /// decoder layers: everything but the routed experts, plus the experts the
    /// tokens are routed to ([`MoeRouting::expert_loads`] of the model's
    /// routing: an expert with at least one token is read whole).
    pub fn streamed_body_params(&self, tokens: u64) -> f64 {
        self.params_with_routed(|m| {
            m.routing
                .expert_loads(tokens, m.top_k, m.experts)
                .iter()
                .filter(|&&l| l > 0)
                .count() as f64
        })
    }

    /// Parameters of one `vocab x hidden` matrix (the embedding table or the LM head).
    pub fn vocab_matrix_params(&self) -> f64 {
        f64::from(self.vocab) * f64::from(self.hidden)
    }
}

impl EncoderArch {
    /// The TP degrees the executor splits this encoder into: for the
    /// LLaVA-NeXT CLIP tower ([`EncoderKind::ClipAnyres`]), [`allowed_tp`] of
    /// its heads and MLP width (attention by heads, the MLP by hidden
    /// features: `nn::EncoderBlock::shard`); only 1 for the other families,
    /// whose burn modules have no tensor-parallel split.
    pub fn executor_tp(&self) -> Vec<usize> {
        match self.kind {
            EncoderKind::ClipAnyres { .. } => allowed_tp(
                self.heads as usize,
                self.heads as usize,
                &[self.ffn as usize],
            ),
            _ => vec![1],
        }
    }

    /// Parameters of one transformer block: 4 attention projections + MLP (2 or 3 matrices).
    /// CLIP ViT-L: 4*1024^2 + 2*1024*4096 = 12.6e6.
    pub fn layer_params(&self) -> f64 {
        let h = f64::from(self.hidden);
        let mats = if self.gated_mlp { 3.0 } else { 2.0 };
        4.0 * h * h + mats * h * f64::from(self.ffn)
    }

    /// Parameters of the input stem (patch embedding / conv front end), with the
    /// multiply-accumulates it spends per encoder token (same number for these stems).
    ///
    /// * CLIP: Conv2d(3, hidden, patch, stride patch): 3*p*p*hidden.
    /// * Qwen ViT: Conv3d(3, hidden, (tp, p, p)): 3*tp*p*p*hidden.
    /// * Whisper: Conv1d(mel, hidden, 3) over 2 input frames per output frame +
    ///   Conv1d(hidden, hidden, 3, stride 2): params mel*3*h + 3*h*h.
    pub fn stem_params(&self) -> f64 {
        let h = f64::from(self.hidden);
        match &self.kind {
            EncoderKind::ClipAnyres { patch, .. } => 3.0 * f64::from(*patch).powi(2) * h,
            EncoderKind::QwenVit {
                patch,
                temporal_patch,
                ..
            } => 3.0 * f64::from(*temporal_patch) * f64::from(*patch).powi(2) * h,
            EncoderKind::Siglip { patch, .. } | EncoderKind::TiledVit { patch, .. } => {
                3.0 * f64::from(*patch).powi(2) * h
            }
            EncoderKind::OmniAudio {
                mel_bins,
                conv_channels,
                ..
            } => {
                let c = f64::from(*conv_channels);
                let f3 = f64::from(omni_conv_out(omni_conv_out(omni_conv_out(*mel_bins))));
                9.0 * c + 2.0 * 9.0 * c * c + c * f3 * h
            }
            EncoderKind::Whisper { mel_bins, .. } => 3.0 * f64::from(*mel_bins) * h + 3.0 * h * h,
        }
    }

    /// Stem multiply-accumulates per encoder token (see [`EncoderArch::stem_params`];
    /// Whisper's first conv runs at twice the output frame rate).
    pub fn stem_macs_per_token(&self) -> f64 {
        let h = f64::from(self.hidden);
        match &self.kind {
            EncoderKind::Whisper { mel_bins, .. } => {
                2.0 * 3.0 * f64::from(*mel_bins) * h + 3.0 * h * h
            }
            EncoderKind::OmniAudio {
                mel_bins,
                chunk_frames,
                conv_channels,
                ..
            } => {
                // per chunk: each conv's output positions x its kernel's MACs,
                // then the linear layer per remaining time step; per token
                let c = f64::from(*conv_channels);
                let (f, t) = (*mel_bins, *chunk_frames);
                let (f1, t1) = (omni_conv_out(f), omni_conv_out(t));
                let (f2, t2) = (omni_conv_out(f1), omni_conv_out(t1));
                let (f3, t3) = (omni_conv_out(f2), omni_conv_out(t2));
                let pos = |a: u32, b: u32| f64::from(a) * f64::from(b);
                let chunk = pos(f1, t1) * 9.0 * c
                    + pos(f2, t2) * 9.0 * c * c
                    + pos(f3, t3) * 9.0 * c * c
                    + f64::from(t3) * c * f64::from(f3) * h;
                chunk / f64::from(t3.max(1))
            }
            _ => self.stem_params(),
        }
    }

    /// All encoder parameters: stem + blocks + projector (position embeddings left out).
    pub fn params(&self) -> f64 {
        self.stem_params()
            + f64::from(self.layers) * self.layer_params()
            + self.projector_params as f64
    }
}

/// Output length of one 3x3, stride-2, padding-1 convolution over `n`
/// positions: `⌈n/2⌉` (the Qwen3-Omni audio encoder's Conv2d layers; 0 for 0).
pub fn omni_conv_out(n: u32) -> u32 {
    n.div_ceil(2)
}

impl ModelArch {
    /// Whether serving engines load this model's Hugging Face checkpoint
    /// with its own modeling code (`--trust-remote-code` in vLLM and
    /// SGLang): InternVL's checkpoints (`OpenGVLab/InternVL3-*`) declare
    /// their config and model classes in `auto_map`; the other families are
    /// in transformers.
    pub fn needs_remote_code(&self) -> bool {
        matches!(
            self.encoder.as_ref().map(|e| &e.kind),
            Some(EncoderKind::TiledVit {
                tiling: Tiling::InternVl { .. },
                ..
            })
        )
    }

    /// Whether the LM head is tied to the embedding table (see [`TIED_EMBEDDING_MODELS`]).
    pub fn tied_embeddings(&self) -> bool {
        TIED_EMBEDDING_MODELS.contains(&self.name.as_str())
    }

    /// LLM parameter count: layers + embedding table + LM head (once if tied).
    /// Yi-34B: 33.47e9 + 2 * 0.459e9 = 34.39e9.
    pub fn llm_params(&self) -> f64 {
        let vocab_mats = if self.tied_embeddings() { 1.0 } else { 2.0 };
        self.llm.body_params() + vocab_mats * self.llm.vocab_matrix_params()
    }

    /// Bytes of LLM weights (all of them, unsharded): `llm_params * dtype_bytes`.
    /// Yi-34B at BF16: 68.8e9.
    pub fn llm_weight_bytes(&self) -> f64 {
        self.llm_params() * f64::from(self.llm.dtype_bytes)
    }

    /// Bytes of LLM weights one GPU of a worker at `par` holds: everything
    /// but the routed experts split `tp` ways (each attention replica holds
    /// its own copy), the routed experts split `tp · ep` ways. Dense models at
    /// TP `t`: `llm_weight_bytes / t`. Qwen3-VL-30B-A3B at (TP1,EP8):
    /// (30.53e9 − 28.99e9 experts + 28.99e9 / 8) · 2 = 10.3e9.
    pub fn llm_weight_bytes_per_gpu(&self, par: crate::Parallel) -> f64 {
        let (_, moe) = self.llm.layer_split();
        let experts = self.llm.moe.as_ref().map_or(0.0, |m| {
            f64::from(moe) * f64::from(m.experts) * m.expert_params(self.llm.hidden)
        });
        let rest = self.llm_params() - experts;
        (rest / f64::from(par.tp) + experts / f64::from(par.gpus()))
            * f64::from(self.llm.dtype_bytes)
    }

    /// Bytes of encoder weights incl. projector and stem; 0 when there is no encoder.
    /// CLIP ViT-L/14-336 + LLaVA MLP: (0.30e9 + 0.059e9) * 2 = 0.72e9.
    pub fn encoder_weight_bytes(&self) -> f64 {
        self.encoder
            .as_ref()
            .map_or(0.0, |e| e.params() * f64::from(e.dtype_bytes))
    }

    /// K and V for all layers, one token: `2 * layers * kv_heads * head_dim *`
    /// [`LlmArch::kv_bytes`].
    /// Yi-34B: 2*60*8*128*2 = 245760 bytes.
    ///
    /// Gemma-3's sliding-window layers (5 of 6, window 1024) are counted as full
    /// attention, as a cache manager without sliding-window support allocates them.
    pub fn kv_bytes_per_token(&self) -> f64 {
        2.0 * f64::from(self.llm.layers) * self.llm.kv_width() * f64::from(self.llm.kv_bytes())
    }

    /// Feature sets the encoder hands the LLM per multimodal token: the
    /// merger's output plus one per deepstack tap (Qwen3-VL-30B-A3B: 1 + 3 = 4),
    /// 1 for every other family.
    pub fn embedding_sets(&self) -> u32 {
        match self.encoder.as_ref().map(|e| &e.kind) {
            Some(EncoderKind::QwenVit { deepstack, .. }) => 1 + deepstack.len() as u32,
            _ => 1,
        }
    }

    /// Bytes of one embedding token handed from encoder to LLM:
    /// `embedding_sets * llm.hidden * dtype_bytes` (Yi-34B: 7168 * 2 = 14336;
    /// Qwen3-VL-30B-A3B: 4 * 2048 * 2 = 16384).
    pub fn embedding_bytes_per_token(&self) -> f64 {
        f64::from(self.embedding_sets())
            * f64::from(self.llm.hidden)
            * f64::from(self.llm.dtype_bytes)
    }

    /// Bytes one TP all-reduce moves per LLM layer for `tokens` tokens:
    /// `hidden * dtype_bytes * tokens`. The LLM does 2 per layer (after attention, after MLP).
    pub fn allreduce_bytes_per_layer(&self, tokens: u64) -> f64 {
        f64::from(self.llm.hidden) * f64::from(self.llm.dtype_bytes) * tokens as f64
    }
}
