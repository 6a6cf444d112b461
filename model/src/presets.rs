//! Model presets: three real-size MLLMs (the EAServe paper's image, video and audio
//! models) and small test presets with the same token rules, scaled down.
//!
//! Every real-size number comes from the named checkpoint's Hugging Face `config.json`
//! (or `preprocessor_config.json`) unless its line says otherwise.

use crate::arch::{EncoderArch, EncoderKind, LlmArch, ModelArch, MoeArch, MoeRouting, Tiling};

/// Names accepted by [`ModelArch::preset`].
pub const PRESET_NAMES: &[&str] = &[
    "llava-v1.6-34b",
    "qwen2.5-vl-32b",
    "ultravox-v0.6-27b",
    "qwen3-vl-8b",
    "qwen3-vl-32b",
    "qwen3-vl-30b-a3b",
    "qwen3-vl-235b-a22b",
    "gemma-3-27b",
    "internvl3-38b",
    "llama-4-scout-17b-16e",
    "qwen3-omni-30b-a3b",
    "tiny-vit-lm",
    "tiny-qwenvl-lm",
    "tiny-whisper-lm",
    "text-lm-tiny",
    "tiny-image",
    "tiny-video",
    "tiny-audio",
    "tiny-moe",
];

/// The Hugging Face checkpoint a serving engine loads for a real-size preset
/// (the repository each preset's figures were read from; for LLaVA-v1.6-34B
/// the Hugging Face port that vLLM and SGLang load); `None` for the test
/// presets and unknown names.
pub fn hf_checkpoint(name: &str) -> Option<&'static str> {
    Some(match name {
        "llava-v1.6-34b" => "llava-hf/llava-v1.6-34b-hf",
        "qwen2.5-vl-32b" => "Qwen/Qwen2.5-VL-32B-Instruct",
        "ultravox-v0.6-27b" => "fixie-ai/ultravox-v0_6-gemma-3-27b",
        "qwen3-vl-8b" => "Qwen/Qwen3-VL-8B-Instruct",
        "qwen3-vl-32b" => "Qwen/Qwen3-VL-32B-Instruct",
        "qwen3-vl-30b-a3b" => "Qwen/Qwen3-VL-30B-A3B-Instruct",
        "qwen3-vl-235b-a22b" => "Qwen/Qwen3-VL-235B-A22B-Instruct",
        "gemma-3-27b" => "google/gemma-3-27b-it",
        "internvl3-38b" => "OpenGVLab/InternVL3-38B",
        "llama-4-scout-17b-16e" => "meta-llama/Llama-4-Scout-17B-16E-Instruct",
        "qwen3-omni-30b-a3b" => "Qwen/Qwen3-Omni-30B-A3B-Instruct",
        _ => return None,
    })
}

/// BF16: 2 bytes per element (`torch_dtype: bfloat16` in all three real checkpoints).
const BF16: u32 = 2;

/// FP32: 4 bytes per element (the CPU presets run in f32 on burn's NdArray backend).
const F32: u32 = 4;

/// LLaVA-v1.6-34B (`liuhaotian/llava-v1.6-34b`, HF port `llava-hf/llava-v1.6-34b-hf`).
///
/// * Vision: CLIP ViT-L/14-336 (`openai/clip-vit-large-patch14-336`): 24 layers,
///   hidden 1024, 16 heads, intermediate 4096, quick-GELU MLP, image 336, patch 14
///   -> 24*24 = 576 patches + CLS = 577 tokens per tile.
/// * `image_grid_pinpoints` [[336,672],[672,336],[672,672],[1008,336],[336,1008]].
/// * Projector `mlp2x_gelu`: Linear(1024, 7168) + GELU + Linear(7168, 7168)
///   = 1024*7168 + 7168*7168 = 58,720,256 weights.
/// * LLM Yi-34B (`01-ai/Yi-34B`): 60 layers, hidden 7168, 56 heads, 8 KV heads,
///   head_dim 128, intermediate 20480, vocab 64064 (llava-v1.6-34b config), untied.
///
/// LLaVA takes features from the penultimate CLIP layer (`mm_vision_select_layer` -2);
/// all 24 layers are counted, as HF transformers runs them.
fn llava_v16_34b() -> ModelArch {
    ModelArch {
        name: "llava-v1.6-34b".into(),
        encoder: Some(EncoderArch {
            kind: EncoderKind::ClipAnyres {
                image_size: 336,
                patch: 14,
                grid_pinpoints: vec![(336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008)],
            },
            layers: 24,
            hidden: 1024,
            heads: 16,
            ffn: 4096,
            gated_mlp: false,
            projector_params: 1024 * 7168 + 7168 * 7168,
            dtype_bytes: BF16,
        }),
        llm: LlmArch {
            layers: 60,
            hidden: 7168,
            heads: 56,
            kv_heads: 8,
            head_dim: 128,
            ffn: 20480,
            vocab: 64064,
            dtype_bytes: BF16,
            kv_dtype_bytes: None,
            max_positions: None,
            moe: None,
        },
    }
}

/// Qwen2.5-VL-32B-Instruct (`Qwen/Qwen2.5-VL-32B-Instruct`).
///
/// * Vision (`vision_config`): depth 32, hidden 1280, 16 heads, intermediate 3456,
///   SwiGLU (`hidden_act: silu`, gate/up/down), patch 14, temporal_patch_size 2,
///   spatial_merge_size 2, window_size 112, fullatt_block_indexes [7, 15, 23, 31].
/// * Merger: RMSNorm + Linear(1280*4, 5120) + GELU + Linear(5120, out_hidden_size 5120)
///   = 2 * 5120 * 5120 = 52,428,800 weights.
/// * `preprocessor_config.json`: min_pixels 3136, max_pixels 12845056.
/// * LLM (Qwen2.5-32B): 64 layers, hidden 5120, 40 heads, 8 KV heads, head_dim 128,
///   intermediate 27648, vocab 152064, `tie_word_embeddings: false`.
fn qwen25_vl_32b() -> ModelArch {
    ModelArch {
        name: "qwen2.5-vl-32b".into(),
        encoder: Some(EncoderArch {
            kind: EncoderKind::QwenVit {
                patch: 14,
                temporal_patch: 2,
                spatial_merge: 2,
                window_px: 112,
                fullatt_every: 8,
                min_pixels: 3136,
                max_pixels: 12_845_056,
                video_min_pixels: crate::QWEN_VIDEO_MIN_PIXELS,
                video_max_pixels: crate::QWEN_VIDEO_MAX_PIXELS,
                deepstack: Vec::new(),
                video_bounds_per_clip: false,
            },
            layers: 32,
            hidden: 1280,
            heads: 16,
            ffn: 3456,
            gated_mlp: true,
            projector_params: 2 * 5120 * 5120,
            dtype_bytes: BF16,
        }),
        llm: LlmArch {
            layers: 64,
            hidden: 5120,
            heads: 40,
            kv_heads: 8,
            head_dim: 128,
            ffn: 27648,
            vocab: 152_064,
            dtype_bytes: BF16,
            kv_dtype_bytes: None,
            max_positions: None,
            moe: None,
        },
    }
}

/// Ultravox v0.6 on Gemma-3-27B (`fixie-ai/ultravox-v0_6-gemma-3-27b`).
///
/// * Audio: Whisper-large-v3-turbo encoder (`openai/whisper-large-v3-turbo`):
///   encoder_layers 32, d_model 1280, 20 heads, encoder_ffn_dim 5120, GELU,
///   num_mel_bins 128, max_source_positions 1500 (30 s at 50 Hz after the stride-2 conv).
/// * Stacking projector (`stack_factor` 8, `projector_act` swiglu; Ultravox
///   `StackAudioFrames` + `UltravoxProjector`): RMSNorm + Linear(1280*8 = 10240,
///   hidden_size 4096) + SwiGLU (halves to 2048) + Linear(2048, 5376)
///   = 10240*4096 + 2048*5376 = 52,953,088 weights. **Estimate**: `hidden_size` 4096
///   is the value in the v0.4.x / v0.5 Ultravox configs; v0.6's was not checked.
/// * LLM Gemma-3-27B (`google/gemma-3-27b-it` `text_config`): 62 layers, hidden 5376,
///   32 heads, 16 KV heads, head_dim 128, intermediate 21504 (GeGLU, 3 matrices),
///   vocab 262208, tied embeddings (see [`crate::arch::TIED_EMBEDDING_MODELS`]).
fn ultravox_v06_27b() -> ModelArch {
    ModelArch {
        name: "ultravox-v0.6-27b".into(),
        encoder: Some(EncoderArch {
            kind: EncoderKind::Whisper {
                mel_bins: 128,
                window_s: 30.0,
                frames_per_window: 1500,
                stack: 8,
            },
            layers: 32,
            hidden: 1280,
            heads: 20,
            ffn: 5120,
            gated_mlp: false,
            projector_params: 10240 * 4096 + 2048 * 5376,
            dtype_bytes: BF16,
        }),
        llm: gemma3_27b_llm(),
    }
}

/// The Qwen3-VL vision tower shared by Qwen3-VL-8B, -32B, -30B-A3B and
/// -235B-A22B (`vision_config` of each checkpoint's `config.json`): depth 27,
/// hidden 1152, 16 heads, intermediate 4304, GELU MLP (`hidden_act`
/// `gelu_pytorch_tanh`, `linear_fc1`/`linear_fc2`: 2 matrices), patch 16,
/// temporal_patch_size 2, spatial_merge_size 2, `deepstack_visual_indexes`
/// [8, 16, 24]; every block attends fully within a temporal slice (no window
/// attention, so `fullatt_every` = 1 and `window_px` is unused).
///
/// * Mergers: the final `merger` and one `deepstack_merger_list` entry per tap,
///   each Linear(1152*4, 1152*4) + GELU + Linear(1152*4, out_hidden_size), so
///   4 * (4608^2 + 4608 * out_hidden_size) weights in all.
/// * `preprocessor_config.json` (`Qwen2VLImageProcessorFast`): `size.shortest_edge`
///   65536, `size.longest_edge` 16777216 (pixels), `patch_size` 16, `merge_size` 2.
/// * `video_preprocessor_config.json` (`Qwen3VLVideoProcessor`): `size.shortest_edge`
///   4096, `size.longest_edge` 25165824, bounds over the whole clip.
fn qwen3_vit(out_hidden: u64) -> EncoderArch {
    let merged = 4 * 1152;
    EncoderArch {
        kind: EncoderKind::QwenVit {
            patch: 16,
            temporal_patch: 2,
            spatial_merge: 2,
            window_px: 16,
            fullatt_every: 1,
            min_pixels: 65_536,
            max_pixels: 16_777_216,
            video_min_pixels: 4096,
            video_max_pixels: 25_165_824,
            deepstack: vec![8, 16, 24],
            video_bounds_per_clip: true,
        },
        layers: 27,
        hidden: 1152,
        heads: 16,
        ffn: 4304,
        gated_mlp: false,
        projector_params: 4 * (merged * merged + merged * out_hidden),
        dtype_bytes: BF16,
    }
}

/// Qwen3-VL-8B-Instruct (`Qwen/Qwen3-VL-8B-Instruct`): the [`qwen3_vit`] tower
/// (out_hidden_size 4096) and `text_config`: 36 layers, hidden 4096, 32 heads,
/// 8 KV heads, head_dim 128, intermediate 12288, vocab 151936,
/// `tie_word_embeddings: false`.
fn qwen3_vl_8b() -> ModelArch {
    ModelArch {
        name: "qwen3-vl-8b".into(),
        encoder: Some(qwen3_vit(4096)),
        llm: LlmArch {
            layers: 36,
            hidden: 4096,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            ffn: 12288,
            vocab: 151_936,
            dtype_bytes: BF16,
            kv_dtype_bytes: None,
            max_positions: None,
            moe: None,
        },
    }
}

/// Qwen3-VL-32B-Instruct (`Qwen/Qwen3-VL-32B-Instruct`): the [`qwen3_vit`] tower
/// (out_hidden_size 5120) and `text_config`: 64 layers, hidden 5120, 64 heads,
/// 8 KV heads, head_dim 128, intermediate 25600, vocab 151936, untied.
fn qwen3_vl_32b() -> ModelArch {
    ModelArch {
        name: "qwen3-vl-32b".into(),
        encoder: Some(qwen3_vit(5120)),
        llm: LlmArch {
            layers: 64,
            hidden: 5120,
            heads: 64,
            kv_heads: 8,
            head_dim: 128,
            ffn: 25600,
            vocab: 151_936,
            dtype_bytes: BF16,
            kv_dtype_bytes: None,
            max_positions: None,
            moe: None,
        },
    }
}

/// Qwen3-VL-30B-A3B-Instruct (`Qwen/Qwen3-VL-30B-A3B-Instruct`): the
/// [`qwen3_vit`] tower (out_hidden_size 2048) and `text_config`: 48 layers,
/// hidden 2048, 32 heads, 4 KV heads, head_dim 128, vocab 151936, untied;
/// every layer MoE (`decoder_sparse_step` 1, `mlp_only_layers` []): 128 experts
/// (`num_experts`), top 8 (`num_experts_per_tok`), `moe_intermediate_size` 768,
/// no shared expert. `intermediate_size` 6144 belongs to no layer.
fn qwen3_vl_30b_a3b() -> ModelArch {
    ModelArch {
        name: "qwen3-vl-30b-a3b".into(),
        encoder: Some(qwen3_vit(2048)),
        llm: LlmArch {
            layers: 48,
            hidden: 2048,
            heads: 32,
            kv_heads: 4,
            head_dim: 128,
            ffn: 6144,
            vocab: 151_936,
            dtype_bytes: BF16,
            kv_dtype_bytes: None,
            max_positions: None,
            moe: Some(qwen3_moe(768)),
        },
    }
}

/// Qwen3-VL-235B-A22B-Instruct (`Qwen/Qwen3-VL-235B-A22B-Instruct`): the
/// [`qwen3_vit`] tower (out_hidden_size 4096) and `text_config`: 94 layers,
/// hidden 4096, 64 heads, 4 KV heads, head_dim 128, vocab 151936, untied;
/// every layer MoE: 128 experts, top 8, `moe_intermediate_size` 1536, no
/// shared expert (`intermediate_size` 12288 belongs to no layer).
fn qwen3_vl_235b_a22b() -> ModelArch {
    ModelArch {
        name: "qwen3-vl-235b-a22b".into(),
        encoder: Some(qwen3_vit(4096)),
        llm: LlmArch {
            layers: 94,
            hidden: 4096,
            heads: 64,
            kv_heads: 4,
            head_dim: 128,
            ffn: 12288,
            vocab: 151_936,
            dtype_bytes: BF16,
            kv_dtype_bytes: None,
            max_positions: None,
            moe: Some(qwen3_moe(1536)),
        },
    }
}

/// Gemma-3-27B-it (`google/gemma-3-27b-it`).
///
/// * Vision (`vision_config`, `siglip_vision_model`): 27 layers, hidden 1152,
///   16 heads, intermediate 4304, GELU MLP, `image_size` 896, `patch_size` 14
///   (64x64 = 4096 patches), `vision_use_head: false`.
/// * `mm_tokens_per_image` 256: the 64x64 patch map average-pooled 4x4 to 16x16;
///   projector `mm_input_projection_weight` [1152, 5376] after a soft-embedding
///   RMSNorm: 6,193,152 weights. Pan-and-scan is off (`do_pan_and_scan` defaults
///   to false in HF and vLLM). The image's `<start_of_image>`/`<end_of_image>`
///   text tokens are not counted.
/// * LLM (`text_config`): 62 layers, hidden 5376, 32 heads, 16 KV heads,
///   head_dim 128, intermediate 21504, vocab 262208, tied embeddings; 5 of 6
///   layers use a 1024-token sliding window, counted as full attention (as
///   [`ModelArch::kv_bytes_per_token`] says).
fn gemma_3_27b() -> ModelArch {
    ModelArch {
        name: "gemma-3-27b".into(),
        encoder: Some(EncoderArch {
            kind: EncoderKind::Siglip {
                image_size: 896,
                patch: 14,
                pooled_side: 16,
                pan_and_scan: None,
            },
            layers: 27,
            hidden: 1152,
            heads: 16,
            ffn: 4304,
            gated_mlp: false,
            projector_params: 1152 * 5376,
            dtype_bytes: BF16,
        }),
        llm: gemma3_27b_llm(),
    }
}

/// The Gemma-3-27B LLM (`google/gemma-3-27b-it` `text_config`), shared by
/// [`gemma_3_27b`] and Ultravox v0.6.
fn gemma3_27b_llm() -> LlmArch {
    LlmArch {
        layers: 62,
        hidden: 5376,
        heads: 32,
        kv_heads: 16,
        head_dim: 128,
        ffn: 21504,
        vocab: 262_208,
        dtype_bytes: BF16,
        kv_dtype_bytes: None,
        max_positions: None,
        moe: None,
    }
}

/// InternVL3-38B (`OpenGVLab/InternVL3-38B`): InternViT-6B-448px-V2_5 and
/// Qwen2.5-32B.
///
/// * Vision (`vision_config`): 45 layers, hidden 3200, 25 heads, intermediate
///   12800, GELU MLP, `image_size` 448, `patch_size` 14 (32x32 = 1024 patches
///   and a class token: 1025 tokens per tile); `downsample_ratio` 0.5 (pixel
///   shuffle 2x2 -> 256 tokens per tile).
/// * Tiles (`max_dynamic_patch` 12, `min_dynamic_patch` 1, `use_thumbnail`
///   true; InternVL3's fine-tuning scripts and the model card's `load_image`);
///   video: one 448-px tile per sampled frame (the model card's `load_video`).
/// * Projector `mlp1`: LayerNorm(12800), Linear(12800, 5120), GELU,
///   Linear(5120, 5120): 12800*5120 + 5120*5120 = 91,750,400 weights.
/// * LLM (`llm_config`, `Qwen2ForCausalLM`): 64 layers, hidden 5120, 40 heads,
///   8 KV heads, head_dim 128, intermediate 27648, untied; vocab 151674, the
///   value of every InternVL3 sibling's config (the 38B file itself was not
///   read), as are the ViT's figures, which InternVL3-78B shares.
/// * Not counted: the chat template's `<img>` and `</img>` around each image's
///   `<IMG_CONTEXT>` tokens (two prompt tokens per image, under 0.2 % of a
///   one-tile image's 258).
fn internvl3_38b() -> ModelArch {
    ModelArch {
        name: "internvl3-38b".into(),
        encoder: Some(EncoderArch {
            kind: EncoderKind::TiledVit {
                image_size: 448,
                patch: 14,
                pixel_shuffle: 2,
                tiling: Tiling::InternVl {
                    min_tiles: 1,
                    max_tiles: 12,
                    thumbnail: true,
                },
                projector: vec![12800, 5120, 5120],
            },
            layers: 45,
            hidden: 3200,
            heads: 25,
            ffn: 12800,
            gated_mlp: false,
            projector_params: 12800 * 5120 + 5120 * 5120,
            dtype_bytes: BF16,
        }),
        llm: LlmArch {
            layers: 64,
            hidden: 5120,
            heads: 40,
            kv_heads: 8,
            head_dim: 128,
            ffn: 27648,
            vocab: 151_674,
            dtype_bytes: BF16,
            kv_dtype_bytes: None,
            max_positions: None,
            moe: None,
        },
    }
}

/// Llama-4-Scout-17B-16E-Instruct (`meta-llama/Llama-4-Scout-17B-16E-Instruct`).
///
/// * Vision (`vision_config`, `llama4_vision_model`): 34 layers, hidden 1408,
///   16 heads, intermediate 5632, GELU MLP, `image_size` 336, `patch_size` 14
///   (24x24 = 576 patches + class token = 577 per tile), `pixel_shuffle_ratio`
///   0.5 (144 tokens per tile).
/// * Tiles: `max_patches` 16, `resize_to_max_canvas` false, a global tile
///   when there is more than one (`Llama4ImageProcessorFast`); the tile
///   separator and `<|image|>` text tokens are not counted.
/// * Projector: the vision adapter Linear(5632, 4096), GELU, Linear(4096,
///   4096) (`projector_input_dim`, `projector_output_dim` 4096), then
///   `multi_modal_projector` Linear(4096, 5120): 23,068,672 + 16,777,216 +
///   20,971,520 = 60,817,408 weights.
/// * LLM (`text_config`): 48 layers, hidden 5120, 40 heads, 8 KV heads,
///   head_dim 128, vocab 202048, untied; every layer MoE
///   (`interleave_moe_layer_step` 1): 16 experts (`num_local_experts`), top 1,
///   expert width `intermediate_size` 8192, one shared expert of the same
///   width; `intermediate_size_mlp` 16384 is the dense MLP width, which no
///   layer of Scout uses. 36 of the 48 layers attend within 8192-token chunks
///   (`attention_chunk_size`); they are counted as full attention, exact up
///   to 8192 tokens of context and an overestimate beyond.
fn llama4_scout() -> ModelArch {
    ModelArch {
        name: "llama-4-scout-17b-16e".into(),
        encoder: Some(EncoderArch {
            kind: EncoderKind::TiledVit {
                image_size: 336,
                patch: 14,
                pixel_shuffle: 2,
                tiling: Tiling::Llama4 { max_tiles: 16 },
                projector: vec![5632, 4096, 4096, 5120],
            },
            layers: 34,
            hidden: 1408,
            heads: 16,
            ffn: 5632,
            gated_mlp: false,
            projector_params: 5632 * 4096 + 4096 * 4096 + 4096 * 5120,
            dtype_bytes: BF16,
        }),
        llm: LlmArch {
            layers: 48,
            hidden: 5120,
            heads: 40,
            kv_heads: 8,
            head_dim: 128,
            ffn: 16384,
            vocab: 202_048,
            dtype_bytes: BF16,
            kv_dtype_bytes: None,
            max_positions: None,
            moe: Some(MoeArch {
                experts: 16,
                top_k: 1,
                expert_ffn: 8192,
                shared_experts: 1,
                shared_ffn: 8192,
                first_dense_layers: 0,
                router: 16,
                routing: MoeRouting::Balanced,
            }),
        },
    }
}

/// Qwen3-Omni-30B-A3B-Instruct (`Qwen/Qwen3-Omni-30B-A3B-Instruct`): the
/// thinker's audio encoder and LLM (`thinker_config`).
///
/// * Audio (`audio_config`): 32 layers, `d_model` 1280, 20 heads,
///   `encoder_ffn_dim` 5120, GELU MLP, 128 mel bins; `n_window` 50 (100-frame
///   conv chunks), `n_window_infer` 800 (attention within 8 chunks = 104
///   tokens); Conv2d front end of `downsample_hidden_size` 480 channels;
///   projector `proj1` Linear(1280, 1280), GELU, `proj2` Linear(1280, 2048)
///   (`output_dim`): 4,259,840 weights.
/// * LLM (`text_config`): 48 layers, hidden 2048, 32 heads, 4 KV heads,
///   head_dim 128, vocab 152064, untied; every layer MoE: 128 experts, top 8,
///   `moe_intermediate_size` 768, no shared expert.
/// * Not modelled: the thinker's vision tower (27 layers, hidden 1152, patch
///   16: the Qwen3-VL family; a model here has one encoder, so this preset
///   takes audio) and the talker that speaks the answer.
///
/// Figures from a printout of the checkpoint's config (the transformers
/// class defaults differ: `output_dim` 3584 there).
fn qwen3_omni_30b_a3b() -> ModelArch {
    ModelArch {
        name: "qwen3-omni-30b-a3b".into(),
        encoder: Some(EncoderArch {
            kind: EncoderKind::OmniAudio {
                mel_bins: 128,
                chunk_frames: 100,
                window_chunks: 8,
                conv_channels: 480,
                projector: vec![1280, 1280, 2048],
            },
            layers: 32,
            hidden: 1280,
            heads: 20,
            ffn: 5120,
            gated_mlp: false,
            projector_params: 1280 * 1280 + 1280 * 2048,
            dtype_bytes: BF16,
        }),
        llm: LlmArch {
            layers: 48,
            hidden: 2048,
            heads: 32,
            kv_heads: 4,
            head_dim: 128,
            ffn: 768,
            vocab: 152_064,
            dtype_bytes: BF16,
            kv_dtype_bytes: None,
            max_positions: None,
            moe: Some(qwen3_moe(768)),
        },
    }
}

/// The Qwen3 MoE block: 128 routed experts of `expert_ffn`, top 8, a router
/// of 128 logits, no shared expert, no dense leading layer.
fn qwen3_moe(expert_ffn: u32) -> MoeArch {
    MoeArch {
        experts: 128,
        top_k: 8,
        expert_ffn,
        shared_experts: 0,
        shared_ffn: 0,
        first_dense_layers: 0,
        router: 128,
        routing: MoeRouting::Balanced,
    }
}

/// The tiny LLM shared by the test presets: 4 layers, hidden 256, 4 heads, 2 KV heads,
/// head_dim 64, FFN 1024, vocab 32000 (made-up small shapes, Llama-style).
fn tiny_llm() -> LlmArch {
    LlmArch {
        layers: 4,
        hidden: 256,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        ffn: 1024,
        vocab: 32000,
        dtype_bytes: BF16,
        kv_dtype_bytes: None,
        max_positions: None,
        moe: None,
    }
}

/// Test preset mimicking LLaVA-NeXT: CLIP-like ViT with anyres tiling at tile 224,
/// patch 14 (16*16 = 256 patches + CLS = 257 tokens per tile), pinpoints the 336-px
/// set scaled by 224/336; 4 layers, hidden 256, 4 heads, FFN 1024, GELU;
/// projector 256 -> 256 -> 256 (2*256*256 weights). Made-up shapes for tests.
fn tiny_vit_lm() -> ModelArch {
    ModelArch {
        name: "tiny-vit-lm".into(),
        encoder: Some(EncoderArch {
            kind: EncoderKind::ClipAnyres {
                image_size: 224,
                patch: 14,
                grid_pinpoints: vec![(224, 448), (448, 224), (448, 448), (672, 224), (224, 672)],
            },
            layers: 4,
            hidden: 256,
            heads: 4,
            ffn: 1024,
            gated_mlp: false,
            projector_params: 2 * 256 * 256,
            dtype_bytes: BF16,
        }),
        llm: tiny_llm(),
    }
}

/// Test preset mimicking Qwen2.5-VL: same token rules (patch 14, temporal 2, merge 2,
/// window 112 px, same pixel bounds), 4 blocks with full attention every 2nd,
/// hidden 256, 4 heads, SwiGLU FFN 512; merger 1024 -> 256 -> 256. Made-up shapes.
fn tiny_qwenvl_lm() -> ModelArch {
    ModelArch {
        name: "tiny-qwenvl-lm".into(),
        encoder: Some(EncoderArch {
            kind: EncoderKind::QwenVit {
                patch: 14,
                temporal_patch: 2,
                spatial_merge: 2,
                window_px: 112,
                fullatt_every: 2,
                min_pixels: 3136,
                max_pixels: 12_845_056,
                video_min_pixels: crate::QWEN_VIDEO_MIN_PIXELS,
                video_max_pixels: crate::QWEN_VIDEO_MAX_PIXELS,
                deepstack: Vec::new(),
                video_bounds_per_clip: false,
            },
            layers: 4,
            hidden: 256,
            heads: 4,
            ffn: 512,
            gated_mlp: true,
            projector_params: 1024 * 256 + 256 * 256,
            dtype_bytes: BF16,
        }),
        llm: tiny_llm(),
    }
}

/// Test preset mimicking Ultravox: Whisper token rules (30-s windows of 1500 frames,
/// stack 8 -> 6.25 LLM tokens/s), 80 mel bins (whisper-tiny's), 4 layers, hidden 256,
/// 4 heads, FFN 1024, GELU; stacking projector 2048 -> 512 (SwiGLU -> 256) -> 256.
/// Made-up shapes; LM head tied like Gemma-3.
fn tiny_whisper_lm() -> ModelArch {
    ModelArch {
        name: "tiny-whisper-lm".into(),
        encoder: Some(EncoderArch {
            kind: EncoderKind::Whisper {
                mel_bins: 80,
                window_s: 30.0,
                frames_per_window: 1500,
                stack: 8,
            },
            layers: 4,
            hidden: 256,
            heads: 4,
            ffn: 1024,
            gated_mlp: false,
            projector_params: 2048 * 512 + 256 * 256,
            dtype_bytes: BF16,
        }),
        llm: tiny_llm(),
    }
}

/// Text-only test preset: the tiny LLM, no encoder.
fn text_lm_tiny() -> ModelArch {
    ModelArch {
        name: "text-lm-tiny".into(),
        encoder: None,
        llm: tiny_llm(),
    }
}

/// The LLM of the CPU presets: 4 layers, hidden 256, 4 heads, 2 KV heads, head_dim 64,
/// SwiGLU FFN 768, vocab 4096 (made-up shapes, Llama-style; a decode step of a few
/// sequences takes about a millisecond on one CPU core).
fn cpu_llm() -> LlmArch {
    LlmArch {
        layers: 4,
        hidden: 256,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        ffn: 768,
        vocab: 4096,
        dtype_bytes: F32,
        kv_dtype_bytes: None,
        max_positions: None,
        moe: None,
    }
}

/// CPU preset for real execution, LLaVA-NeXT token rules scaled down: anyres tiles of
/// 112 px, patch 14 (8*8 = 64 patches + CLS = 65 tokens per tile), pinpoints
/// (112, 224), (224, 112), (224, 224); 2 blocks, hidden 256, 4 heads, GELU FFN 1024;
/// projector Linear(256, 256) + GELU + Linear(256, 256). A 224x224 image is 5 tiles
/// = 325 encoder tokens and 64 + 256 + 16 = 336 LLM tokens. Made-up shapes.
fn tiny_image() -> ModelArch {
    ModelArch {
        name: "tiny-image".into(),
        encoder: Some(EncoderArch {
            kind: EncoderKind::ClipAnyres {
                image_size: 112,
                patch: 14,
                grid_pinpoints: vec![(112, 224), (224, 112), (224, 224)],
            },
            layers: 2,
            hidden: 256,
            heads: 4,
            ffn: 1024,
            gated_mlp: false,
            projector_params: 2 * 256 * 256,
            dtype_bytes: F32,
        }),
        llm: cpu_llm(),
    }
}

/// CPU preset for real execution of a mixture-of-experts LLM: [`tiny_image`]'s
/// encoder and token rules, and [`cpu_llm`]'s attention with every layer's MLP
/// replaced by a router over 8 SwiGLU experts of width 256, of which each token
/// takes 2, plus one shared expert of width 256 (Qwen3-MoE's routing with a
/// Llama 4-style shared expert). Made-up shapes.
fn tiny_moe() -> ModelArch {
    let mut m = tiny_image();
    m.name = "tiny-moe".into();
    m.llm.moe = Some(MoeArch {
        experts: 8,
        top_k: 2,
        expert_ffn: 256,
        shared_experts: 1,
        shared_ffn: 256,
        first_dense_layers: 0,
        router: 8,
        routing: MoeRouting::Balanced,
    });
    m
}

/// CPU preset for real execution, Qwen2.5-VL token rules scaled down: patch 14,
/// temporal patch 2, 2x2 merge, 56-px windows (4x4 patches), full attention every 2nd
/// block; images 3136..50176 px (56x56..224x224), video frames 3136..12544 px
/// (56x56..112x112); 2 blocks, hidden 256, 4 heads, SwiGLU FFN 512; merger
/// Linear(1024, 1024) + GELU + Linear(1024, 256). Eight 112x112 frames are 4 temporal
/// patches of 64 patches = 256 encoder tokens and 64 LLM tokens. Made-up shapes.
fn tiny_video() -> ModelArch {
    ModelArch {
        name: "tiny-video".into(),
        encoder: Some(EncoderArch {
            kind: EncoderKind::QwenVit {
                patch: 14,
                temporal_patch: 2,
                spatial_merge: 2,
                window_px: 56,
                fullatt_every: 2,
                min_pixels: 3136,
                max_pixels: 50_176,
                video_min_pixels: 3136,
                video_max_pixels: 12_544,
                deepstack: Vec::new(),
                video_bounds_per_clip: false,
            },
            layers: 2,
            hidden: 256,
            heads: 4,
            ffn: 512,
            gated_mlp: true,
            projector_params: 1024 * 1024 + 1024 * 256,
            dtype_bytes: F32,
        }),
        llm: cpu_llm(),
    }
}

/// CPU preset for real execution, Whisper + Ultravox token rules scaled down: 5-s
/// windows of 250 encoder frames (50 Hz after the stride-2 conv over 100 Hz log-mel
/// frames), 80 mel bins, stack 8 (6.25 LLM tokens/s); 2 blocks, hidden 256, 4 heads,
/// GELU FFN 1024; projector Linear(2048, 512) + SwiGLU + Linear(256, 256). A 4-s clip
/// is 250 encoder tokens and 25 LLM tokens. Made-up shapes.
fn tiny_audio() -> ModelArch {
    ModelArch {
        name: "tiny-audio".into(),
        encoder: Some(EncoderArch {
            kind: EncoderKind::Whisper {
                mel_bins: 80,
                window_s: 5.0,
                frames_per_window: 250,
                stack: 8,
            },
            layers: 2,
            hidden: 256,
            heads: 4,
            ffn: 1024,
            gated_mlp: false,
            projector_params: 2048 * 512 + 256 * 256,
            dtype_bytes: F32,
        }),
        llm: cpu_llm(),
    }
}

impl ModelArch {
    /// The preset called `name` (see [`ModelArch::preset_names`]), or `None`.
    pub fn preset(name: &str) -> Option<ModelArch> {
        Some(match name {
            "llava-v1.6-34b" => llava_v16_34b(),
            "qwen2.5-vl-32b" => qwen25_vl_32b(),
            "ultravox-v0.6-27b" => ultravox_v06_27b(),
            "tiny-vit-lm" => tiny_vit_lm(),
            "tiny-qwenvl-lm" => tiny_qwenvl_lm(),
            "tiny-whisper-lm" => tiny_whisper_lm(),
            "text-lm-tiny" => text_lm_tiny(),
            "tiny-image" => tiny_image(),
            "tiny-moe" => tiny_moe(),
            "tiny-video" => tiny_video(),
            "tiny-audio" => tiny_audio(),
            "qwen3-vl-8b" => qwen3_vl_8b(),
            "qwen3-vl-32b" => qwen3_vl_32b(),
            "qwen3-vl-30b-a3b" => qwen3_vl_30b_a3b(),
            "qwen3-vl-235b-a22b" => qwen3_vl_235b_a22b(),
            "gemma-3-27b" => gemma_3_27b(),
            "internvl3-38b" => internvl3_38b(),
            "llama-4-scout-17b-16e" => llama4_scout(),
            "qwen3-omni-30b-a3b" => qwen3_omni_30b_a3b(),
            _ => return None,
        })
    }

    /// Names of all presets, real-size first.
    pub fn preset_names() -> &'static [&'static str] {
        PRESET_NAMES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_resolves_and_round_trips() {
        for name in ModelArch::preset_names() {
            let m = ModelArch::preset(name).expect(name);
            assert_eq!(m.name, *name);
        }
        assert!(ModelArch::preset("gpt-5").is_none());
    }

    #[test]
    fn yi_34b_weights_are_68_8_gb_at_bf16() {
        let m = ModelArch::preset("llava-v1.6-34b").unwrap();
        let b = m.llm_weight_bytes();
        assert!((b - 68.78e9).abs() < 0.05e9, "{b}");
    }

    #[test]
    fn qwen25_32b_has_about_32_8e9_params() {
        let m = ModelArch::preset("qwen2.5-vl-32b").unwrap();
        let p = m.llm_params();
        assert!((p - 32.76e9).abs() < 0.05e9, "{p}");
    }

    #[test]
    fn gemma3_27b_has_about_27e9_params_tied() {
        let m = ModelArch::preset("ultravox-v0.6-27b").unwrap();
        assert!(m.tied_embeddings());
        let p = m.llm_params();
        assert!((p - 27.01e9).abs() < 0.05e9, "{p}");
    }

    /// Published sizes: InternVL3-38B 38.4B (InternViT-6B-448px-V2_5 5.5B +
    /// Qwen2.5-32B); Llama 4 Scout 109B total, 17B active (Meta's model
    /// card); Qwen3-Omni-30B-A3B's thinker LLM about 30.5B of the
    /// checkpoint's 35.3B (the rest: encoders, talker, code2wav).
    #[test]
    fn new_presets_have_their_published_sizes() {
        let i = ModelArch::preset("internvl3-38b").unwrap();
        let vit = i.encoder.as_ref().unwrap().params();
        assert!((vit - 5.62e9).abs() < 0.05e9, "{vit}");
        let total = vit + i.llm_params();
        assert!((total - 38.4e9).abs() < 0.2e9, "{total}");
        let l = ModelArch::preset("llama-4-scout-17b-16e").unwrap();
        let total = l.llm_params() + l.encoder.as_ref().unwrap().params();
        assert!((total - 108.6e9).abs() < 0.5e9, "{total}");
        let active = l.llm.active_body_params() + 2.0 * l.llm.vocab_matrix_params();
        assert!((active - 17.2e9).abs() < 0.3e9, "{active}");
        let o = ModelArch::preset("qwen3-omni-30b-a3b").unwrap();
        let p = o.llm_params();
        assert!((p - 30.5e9).abs() < 0.3e9, "{p}");
        let audio = o.encoder.as_ref().unwrap().params();
        assert!((audio - 0.65e9).abs() < 0.05e9, "{audio}");
    }

    #[test]
    fn encoder_sizes_match_known_towers() {
        // CLIP ViT-L/14-336: ~303M; Qwen2.5-VL ViT incl. merger: ~0.67-0.69B;
        // Whisper large encoder: ~635M (+53M projector).
        let clip = ModelArch::preset("llava-v1.6-34b")
            .unwrap()
            .encoder
            .unwrap();
        let clip_body = clip.params() - clip.projector_params as f64;
        assert!((clip_body - 303e6).abs() < 2e6, "{clip_body}");
        let qwen = ModelArch::preset("qwen2.5-vl-32b")
            .unwrap()
            .encoder
            .unwrap();
        assert!(
            (qwen.params() - 0.688e9).abs() < 0.02e9,
            "{}",
            qwen.params()
        );
        let wh = ModelArch::preset("ultravox-v0.6-27b")
            .unwrap()
            .encoder
            .unwrap();
        let wh_body = wh.params() - wh.projector_params as f64;
        assert!((wh_body - 635e6).abs() < 5e6, "{wh_body}");
    }

    #[test]
    fn kv_bytes_per_token_of_yi_34b() {
        let m = ModelArch::preset("llava-v1.6-34b").unwrap();
        assert_eq!(m.kv_bytes_per_token(), 245_760.0);
        assert_eq!(m.embedding_bytes_per_token(), 14_336.0);
        assert_eq!(m.allreduce_bytes_per_layer(10), 143_360.0);
    }

    #[test]
    fn text_model_has_no_encoder_bytes() {
        let m = ModelArch::preset("text-lm-tiny").unwrap();
        assert_eq!(m.encoder_weight_bytes(), 0.0);
        assert!(m.llm_weight_bytes() > 0.0);
    }

    /// Total and active parameters of the MoE presets, from their configs'
    /// shapes: Qwen3-VL-30B-A3B 30.53e9 / 3.35e9, Qwen3-VL-235B-A22B
    /// 235.09e9 / 22.19e9 (the names' "30B"/"A3B", "235B"/"A22B").
    #[test]
    fn moe_presets_hold_every_expert_and_compute_top_k() {
        let vocab = |m: &ModelArch| 2.0 * m.llm.vocab_matrix_params();
        for (name, total, active) in [
            ("qwen3-vl-30b-a3b", 30.53e9, 3.35e9),
            ("qwen3-vl-235b-a22b", 235.09e9, 22.19e9),
        ] {
            let m = ModelArch::preset(name).unwrap();
            let p = m.llm_params();
            assert!((p - total).abs() < 0.01e9, "{name}: {p}");
            let a = m.llm.active_body_params() + vocab(&m);
            assert!((a - active).abs() < 0.01e9, "{name}: {a}");
            assert!((m.llm_weight_bytes() - 2.0 * total).abs() < 0.02e9);
        }
        let dense = ModelArch::preset("qwen3-vl-8b").unwrap();
        assert_eq!(dense.llm.active_body_params(), dense.llm.body_params());
        // Qwen3-VL's ViT with its four mergers: ~0.41e9 + 0.12e9 (30B-A3B)
        let e = ModelArch::preset("qwen3-vl-30b-a3b")
            .unwrap()
            .encoder
            .unwrap();
        assert!((e.params() - 0.534e9).abs() < 0.01e9, "{}", e.params());
    }
}
