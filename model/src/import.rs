//! A model file from a Hugging Face checkpoint's `config.json` (`easerve model
//! import`).
//!
//! [`import`] reads the families easerve prices: LLaVA-NeXT (`llava_next`),
//! Qwen2.5-VL (`qwen2_5_vl`), Qwen3-VL dense and MoE (`qwen3_vl`,
//! `qwen3_vl_moe`), Gemma 3 (`gemma3`), InternVL (`internvl_chat`), Llama 4
//! (`llama4`), Qwen3-Omni's thinker (`qwen3_omni_moe`) and Ultravox with its
//! Whisper encoder (`ultravox`), chosen by `model_type`. Every field of the
//! [`ModelArch`] it returns is read from a named key (or derived from named
//! keys, by the rule each preset in `presets.rs` states), and
//! [`Imported::to_toml`] writes that key beside the value. A key the family
//! needs that is absent or of the wrong kind, and a value easerve cannot
//! represent (Llama 4 Maverick's alternating dense and MoE layers, window
//! layers that are not evenly spaced), is an [`ImportError`] naming the key.

use crate::arch::{
    EncoderArch, EncoderKind, LlmArch, ModelArch, MoeArch, MoeRouting, PanAndScan, Tiling,
};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;

/// Which input file a key was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The checkpoint's `config.json`.
    Config,
    /// `preprocessor_config.json` (`--preprocessor`).
    Preprocessor,
    /// `video_preprocessor_config.json` (`--video-preprocessor`).
    VideoPreprocessor,
}

impl Source {
    /// The file's usual name.
    pub fn file_name(self) -> &'static str {
        match self {
            Source::Config => "config.json",
            Source::Preprocessor => "preprocessor_config.json",
            Source::VideoPreprocessor => "video_preprocessor_config.json",
        }
    }
}

/// A key that cannot be mapped: absent, of the wrong kind, or a value easerve
/// cannot represent.
#[derive(Clone, Debug, PartialEq)]
pub struct ImportError {
    /// The file the key belongs to.
    pub file: Source,
    /// Dotted key (`text_config.num_key_value_heads`).
    pub key: String,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: key `{}`: {}",
            self.file.file_name(),
            self.key,
            self.message
        )
    }
}

impl std::error::Error for ImportError {}

/// The `model_type`s [`import`] reads.
pub const FAMILIES: &[&str] = &[
    "llava_next",
    "qwen2_5_vl",
    "qwen3_vl",
    "qwen3_vl_moe",
    "gemma3",
    "internvl_chat",
    "llama4",
    "qwen3_omni_moe",
    "ultravox",
];

/// An imported model: the architecture, where each field came from, and notes
/// on what the file cannot say.
#[derive(Clone, Debug, PartialEq)]
pub struct Imported {
    /// The model.
    pub arch: ModelArch,
    /// The family read (`model_type`).
    pub family: String,
    /// Per field of the model file (dotted, `encoder.kind.QwenVit.patch`): the
    /// key or rule it came from.
    pub sources: BTreeMap<String, String>,
    /// What the model file leaves out or assumes, one sentence each.
    pub notes: Vec<String>,
}

/// The inputs of [`import`].
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// `config.json`.
    pub config: &'a Value,
    /// `preprocessor_config.json`, where given.
    pub preprocessor: Option<&'a Value>,
    /// `video_preprocessor_config.json`, where given.
    pub video_preprocessor: Option<&'a Value>,
}

/// One input file being read.
#[derive(Clone, Copy)]
struct Json<'a> {
    v: &'a Value,
    file: Source,
}

impl<'a> Json<'a> {
    fn err(&self, key: &str, message: impl Into<String>) -> ImportError {
        ImportError {
            file: self.file,
            key: key.into(),
            message: message.into(),
        }
    }

    /// The value at a dotted key, `None` when absent or null.
    fn get(&self, key: &str) -> Option<&'a Value> {
        let mut v = self.v;
        for part in key.split('.') {
            v = v.get(part)?;
        }
        (!v.is_null()).then_some(v)
    }

    fn need(&self, key: &str, what: &str) -> Result<&'a Value, ImportError> {
        self.get(key)
            .ok_or_else(|| self.err(key, format!("missing; needed for {what}")))
    }

    fn u32_of(&self, key: &str, v: &Value) -> Result<u32, ImportError> {
        v.as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| {
                self.err(
                    key,
                    format!("must be a whole number in 0 ..= {}, got {v}", u32::MAX),
                )
            })
    }

    fn u32(&self, key: &str, what: &str) -> Result<u32, ImportError> {
        let v = self.need(key, what)?;
        self.u32_of(key, v)
    }

    fn f64(&self, key: &str, what: &str) -> Result<f64, ImportError> {
        let v = self.need(key, what)?;
        v.as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| self.err(key, format!("must be a number, got {v}")))
    }

    fn bool(&self, key: &str, what: &str) -> Result<bool, ImportError> {
        let v = self.need(key, what)?;
        v.as_bool()
            .ok_or_else(|| self.err(key, format!("must be true or false, got {v}")))
    }

    fn u32_list(&self, key: &str, what: &str) -> Result<Vec<u32>, ImportError> {
        let v = self.need(key, what)?;
        let a = v
            .as_array()
            .ok_or_else(|| self.err(key, format!("must be a list of whole numbers, got {v}")))?;
        a.iter().map(|x| self.u32_of(key, x)).collect()
    }
}

/// Reads fields and records their sources.
struct Reader<'a> {
    inputs: Inputs<'a>,
    sources: BTreeMap<String, String>,
    notes: Vec<String>,
}

impl<'a> Reader<'a> {
    fn config(&self) -> Json<'a> {
        Json {
            v: self.inputs.config,
            file: Source::Config,
        }
    }

    fn note(&mut self, field: &str, source: impl Into<String>) {
        self.sources.insert(field.into(), source.into());
    }

    /// `field` from `key` of `j`.
    fn u32(&mut self, field: &str, j: Json<'a>, key: &str) -> Result<u32, ImportError> {
        let x = j.u32(key, field)?;
        self.note(field, format!("{} `{key}`", j.file.file_name()));
        Ok(x)
    }

    /// The first of `keys` present in `j` (a config that spells a value two ways).
    fn u32_any(&mut self, field: &str, j: Json<'a>, keys: &[&str]) -> Result<u32, ImportError> {
        match keys.iter().find(|k| j.get(k).is_some()) {
            Some(k) => self.u32(field, j, k),
            None => Err(j.err(keys[0], format!("missing; needed for {field}"))),
        }
    }
}

/// The model of `inputs` named `name`.
///
/// # Errors
/// [`ImportError`]: an unknown `model_type` (naming the allowed ones), a key
/// the family needs that is missing or of the wrong kind, a value easerve
/// cannot represent, or a missing preprocessor config a family needs for its
/// token rule (Qwen's pixel bounds).
pub fn import(name: &str, inputs: Inputs<'_>) -> Result<Imported, ImportError> {
    let mut r = Reader {
        inputs,
        sources: BTreeMap::new(),
        notes: Vec::new(),
    };
    let c = r.config();
    let family = c
        .need("model_type", "choosing the model's family")?
        .as_str()
        .ok_or_else(|| c.err("model_type", "must be a string"))?
        .to_string();
    let (encoder, llm) = match family.as_str() {
        "llava_next" => llava_next(&mut r)?,
        "qwen2_5_vl" => qwen_vl(&mut r, false)?,
        "qwen3_vl" | "qwen3_vl_moe" => qwen_vl(&mut r, true)?,
        "gemma3" => gemma3(&mut r)?,
        "internvl_chat" => internvl(&mut r)?,
        "llama4" => llama4(&mut r)?,
        "qwen3_omni_moe" => qwen3_omni(&mut r)?,
        "ultravox" => ultravox(&mut r)?,
        other => {
            return Err(c.err(
                "model_type",
                format!(
                    "`{other}` is not a family easerve reads; allowed: {}",
                    FAMILIES.join(", ")
                ),
            ))
        }
    };
    let c = r.config();
    if let Some(q) = c.get("quantization_config") {
        let method = q
            .get("quant_method")
            .and_then(Value::as_str)
            .unwrap_or("unknown");
        r.notes.push(format!(
            "the checkpoint is quantized (`quantization_config.quant_method` = {method}); the file keeps 2-byte weights: set the scenario's `model.dtype` (fp8, fp8_block) to price it"
        ));
    }
    let tied = [
        "text_config.tie_word_embeddings",
        "llm_config.tie_word_embeddings",
    ]
    .iter()
    .chain(["tie_word_embeddings"].iter())
    .find_map(|k| c.get(k).and_then(Value::as_bool))
    .unwrap_or(false);
    if tied && !crate::arch::TIED_EMBEDDING_MODELS.contains(&name) {
        r.notes.push(
            "`tie_word_embeddings` is true; a model file cannot say so, so its LM head is counted as a separate matrix (vocab x hidden more weight bytes)".into(),
        );
    }
    Ok(Imported {
        arch: ModelArch {
            name: name.into(),
            encoder: Some(encoder),
            llm,
        },
        family,
        sources: r.sources,
        notes: r.notes,
    })
}

/// Bytes per element of `torch_dtype` (or `dtype`) at `prefix` or the top.
fn dtype_bytes(r: &mut Reader<'_>, field: &str, prefixes: &[&str]) -> Result<u32, ImportError> {
    let c = r.config();
    let keys: Vec<String> = prefixes
        .iter()
        .flat_map(|p| [format!("{p}torch_dtype"), format!("{p}dtype")])
        .chain(["torch_dtype".to_string(), "dtype".to_string()])
        .collect();
    let Some((key, v)) = keys.iter().find_map(|k| c.get(k).map(|v| (k, v))) else {
        return Err(c.err("torch_dtype", format!("missing; needed for {field}")));
    };
    let bytes = match v.as_str() {
        Some("bfloat16" | "float16") => 2,
        Some("float32") => 4,
        _ => {
            return Err(c.err(
                key,
                format!("`{v}` is not a weight dtype easerve reads; allowed: bfloat16, float16, float32 (FP8 checkpoints: the base dtype here, `model.dtype` in the scenario)"),
            ))
        }
    };
    r.note(field, format!("config.json `{key}` ({v})"));
    Ok(bytes)
}

/// The decoder LLM under `p` (`text_config.`, `llm_config.`, or `` for the top).
fn llm(r: &mut Reader<'_>, p: &str) -> Result<LlmArch, ImportError> {
    let c = r.config();
    let k = |s: &str| format!("{p}{s}");
    let layers = r.u32("llm.layers", c, &k("num_hidden_layers"))?;
    let hidden = r.u32("llm.hidden", c, &k("hidden_size"))?;
    let heads = r.u32("llm.heads", c, &k("num_attention_heads"))?;
    let kv_heads = if c.get(&k("num_key_value_heads")).is_some() {
        r.u32("llm.kv_heads", c, &k("num_key_value_heads"))?
    } else {
        r.note(
            "llm.kv_heads",
            format!(
                "config.json `{}` (no `{}`)",
                k("num_attention_heads"),
                k("num_key_value_heads")
            ),
        );
        heads
    };
    let head_dim = if c.get(&k("head_dim")).is_some() {
        r.u32("llm.head_dim", c, &k("head_dim"))?
    } else {
        if heads == 0 || !hidden.is_multiple_of(heads) {
            return Err(c.err(
                &k("num_attention_heads"),
                format!(
                    "must divide `{}` ({hidden}) when there is no `{}`",
                    k("hidden_size"),
                    k("head_dim")
                ),
            ));
        }
        r.note(
            "llm.head_dim",
            format!(
                "config.json `{}` / `{}`",
                k("hidden_size"),
                k("num_attention_heads")
            ),
        );
        hidden / heads
    };
    let ffn = r.u32("llm.ffn", c, &k("intermediate_size"))?;
    let vocab = r.u32_any("llm.vocab", c, &[&k("vocab_size"), "vocab_size"])?;
    let prefixes: Vec<&str> = if p.is_empty() { vec![] } else { vec![p] };
    let dtype = dtype_bytes(r, "llm.dtype_bytes", &prefixes)?;
    let positions = k("max_position_embeddings");
    let max_positions = match c.get(&positions) {
        Some(_) => Some(u64::from(r.u32("llm.max_positions", c, &positions)?)),
        None => None,
    };
    Ok(LlmArch {
        layers,
        hidden,
        heads,
        kv_heads,
        head_dim,
        ffn,
        vocab,
        dtype_bytes: dtype,
        kv_dtype_bytes: None,
        max_positions,
        moe: None,
    })
}

fn routing_note(r: &mut Reader<'_>) {
    r.note(
        "llm.moe.routing",
        "not in config.json: how tokens spread over the experts, a scenario knob (balanced; power_law_1.01 and power_law_1.2 as aiconfigurator measured)",
    );
}

/// The Qwen3 MoE block under `p`: `num_experts`, `num_experts_per_tok`,
/// `moe_intermediate_size`, `decoder_sparse_step` 1 and `mlp_only_layers` a
/// leading run of layers.
fn qwen3_moe(r: &mut Reader<'_>, p: &str) -> Result<MoeArch, ImportError> {
    let c = r.config();
    let k = |s: &str| format!("{p}{s}");
    let experts = r.u32("llm.moe.experts", c, &k("num_experts"))?;
    let top_k = r.u32("llm.moe.top_k", c, &k("num_experts_per_tok"))?;
    let expert_ffn = r.u32("llm.moe.expert_ffn", c, &k("moe_intermediate_size"))?;
    r.note(
        "llm.moe.router",
        format!("config.json `{}` (one logit per expert)", k("num_experts")),
    );
    if let Some(step) = c.get(&k("decoder_sparse_step")) {
        if step.as_u64() != Some(1) {
            return Err(c.err(&k("decoder_sparse_step"), format!("{step}: MoE layers every few layers are not representable; allowed: 1 (every layer from the first MoE layer on is MoE)")));
        }
    }
    let dense = if c.get(&k("mlp_only_layers")).is_some() {
        c.u32_list(&k("mlp_only_layers"), "llm.moe.first_dense_layers")?
    } else {
        Vec::new()
    };
    if dense.iter().enumerate().any(|(i, &l)| l as usize != i) {
        return Err(c.err(&k("mlp_only_layers"), format!("{dense:?}: dense layers after the first MoE layer are not representable; allowed: the leading layers [0, 1, ..., k-1] or []")));
    }
    r.note(
        "llm.moe.first_dense_layers",
        format!(
            "config.json `{}` (its length; {dense:?})",
            k("mlp_only_layers")
        ),
    );
    let shared_ffn = match c.get(&k("shared_expert_intermediate_size")) {
        Some(v) => c.u32_of(&k("shared_expert_intermediate_size"), v)?,
        None => 0,
    };
    r.note(
        "llm.moe.shared_experts",
        format!(
            "config.json `{}` (0 or absent: none)",
            k("shared_expert_intermediate_size")
        ),
    );
    r.note(
        "llm.moe.shared_ffn",
        format!(
            "config.json `{}` (0 or absent: none)",
            k("shared_expert_intermediate_size")
        ),
    );
    routing_note(r);
    Ok(MoeArch {
        experts,
        top_k,
        expert_ffn,
        shared_experts: u32::from(shared_ffn > 0),
        shared_ffn,
        first_dense_layers: dense.len() as u32,
        router: experts,
        routing: MoeRouting::Balanced,
    })
}

/// The transformer shape of an encoder under `p`, with its keys.
struct Tower<'k> {
    layers: &'k str,
    hidden: &'k str,
    heads: &'k str,
    ffn: &'k str,
}

const VIT: Tower<'static> = Tower {
    layers: "num_hidden_layers",
    hidden: "hidden_size",
    heads: "num_attention_heads",
    ffn: "intermediate_size",
};

const QWEN_VIT: Tower<'static> = Tower {
    layers: "depth",
    hidden: "hidden_size",
    heads: "num_heads",
    ffn: "intermediate_size",
};

const WHISPER: Tower<'static> = Tower {
    layers: "encoder_layers",
    hidden: "d_model",
    heads: "encoder_attention_heads",
    ffn: "encoder_ffn_dim",
};

/// `(layers, hidden, heads, ffn)` of the encoder under `p`.
fn tower(r: &mut Reader<'_>, p: &str, t: &Tower<'_>) -> Result<[u32; 4], ImportError> {
    let c = r.config();
    Ok([
        r.u32("encoder.layers", c, &format!("{p}{}", t.layers))?,
        r.u32("encoder.hidden", c, &format!("{p}{}", t.hidden))?,
        r.u32("encoder.heads", c, &format!("{p}{}", t.heads))?,
        r.u32("encoder.ffn", c, &format!("{p}{}", t.ffn))?,
    ])
}

/// Whether the encoder's MLP is gated, from its activation at `key`: SiLU
/// (SwiGLU, Qwen2.5-VL) is gated; GELU variants and quick-GELU are not. Absent:
/// `default`, the family's documented MLP.
fn gated(r: &mut Reader<'_>, key: &str, default: bool, why: &str) -> Result<bool, ImportError> {
    let c = r.config();
    let Some(v) = c.get(key) else {
        r.note("encoder.gated_mlp", format!("{why} (no `{key}`)"));
        return Ok(default);
    };
    let act = v.as_str().unwrap_or_default();
    let g = match act {
        "silu" | "swiglu" => true,
        a if a.starts_with("gelu") || a == "quick_gelu" => false,
        _ => {
            return Err(c.err(key, format!("`{v}` is not an activation easerve reads; allowed: silu (gated MLP), gelu, gelu_pytorch_tanh, quick_gelu")));
        }
    };
    r.note(
        "encoder.gated_mlp",
        format!(
            "config.json `{key}` ({act}: {})",
            if g { "gated, 3 matrices" } else { "2 matrices" }
        ),
    );
    Ok(g)
}

fn encoder(
    kind: EncoderKind,
    [layers, hidden, heads, ffn]: [u32; 4],
    gated_mlp: bool,
    projector_params: u64,
    dtype_bytes: u32,
) -> EncoderArch {
    EncoderArch {
        kind,
        layers,
        hidden,
        heads,
        ffn,
        gated_mlp,
        projector_params,
        dtype_bytes,
    }
}

type Parts = (EncoderArch, LlmArch);

fn llava_next(r: &mut Reader<'_>) -> Result<Parts, ImportError> {
    let c = r.config();
    let llm = llm(r, "text_config.")?;
    let t = tower(r, "vision_config.", &VIT)?;
    let image_size = r.u32(
        "encoder.kind.ClipAnyres.image_size",
        c,
        "vision_config.image_size",
    )?;
    let patch = r.u32(
        "encoder.kind.ClipAnyres.patch",
        c,
        "vision_config.patch_size",
    )?;
    let key = "image_grid_pinpoints";
    let v = c.need(key, "encoder.kind.ClipAnyres.grid_pinpoints")?;
    let pairs = v
        .as_array()
        .ok_or_else(|| c.err(key, "must be a list of [height, width] pairs"))?;
    let mut grid = Vec::new();
    for p in pairs {
        match p.as_array().map(Vec::as_slice) {
            Some([h, w]) => grid.push((c.u32_of(key, h)?, c.u32_of(key, w)?)),
            _ => return Err(c.err(key, format!("{p} is not a [height, width] pair"))),
        }
    }
    r.note("encoder.kind.ClipAnyres.grid_pinpoints", "config.json `image_grid_pinpoints` ([height, width], as HF `select_best_resolution` reads them)");
    let g = gated(
        r,
        "vision_config.hidden_act",
        false,
        "CLIP's quick-GELU MLP",
    )?;
    let (vh, th) = (u64::from(t[1]), u64::from(llm.hidden));
    r.note("encoder.projector_params", "LlavaNextMultiModalProjector: Linear(`vision_config.hidden_size`, `text_config.hidden_size`) + GELU + Linear(`text_config.hidden_size`, `text_config.hidden_size`)");
    let dtype = dtype_bytes(r, "encoder.dtype_bytes", &["vision_config."])?;
    let kind = EncoderKind::ClipAnyres {
        image_size,
        patch,
        grid_pinpoints: grid,
    };
    Ok((encoder(kind, t, g, vh * th + th * th, dtype), llm))
}

/// Qwen2.5-VL (`qwen3` false) and Qwen3-VL, dense or MoE (`qwen3` true).
fn qwen_vl(r: &mut Reader<'_>, qwen3: bool) -> Result<Parts, ImportError> {
    let c = r.config();
    // Qwen2.5-VL's text keys sit at the top (newer files repeat them under
    // text_config); Qwen3-VL's under text_config
    let p = if qwen3 || c.get("text_config.hidden_size").is_some() {
        "text_config."
    } else {
        ""
    };
    let mut llm = llm(r, p)?;
    if c.get(&format!("{p}num_experts")).is_some() {
        llm.moe = Some(qwen3_moe(r, p)?);
    }
    let t = tower(r, "vision_config.", &QWEN_VIT)?;
    let v = "encoder.kind.QwenVit.";
    let patch = r.u32(&format!("{v}patch"), c, "vision_config.patch_size")?;
    let temporal_patch = r.u32(
        &format!("{v}temporal_patch"),
        c,
        "vision_config.temporal_patch_size",
    )?;
    let spatial_merge = r.u32(
        &format!("{v}spatial_merge"),
        c,
        "vision_config.spatial_merge_size",
    )?;
    let out = c.u32("vision_config.out_hidden_size", "encoder.projector_params")?;
    let (window_px, fullatt_every, deepstack) = qwen_attention_layout(r, qwen3, patch, t[0])?;
    let [min_pixels, max_pixels, video_min_pixels, video_max_pixels] = qwen_pixel_bounds(r, qwen3)?;
    if qwen3 {
        r.note(
            &format!("{v}video_bounds_per_clip"),
            "Qwen3VLVideoProcessor bounds the whole clip",
        );
    }
    let g = gated(
        r,
        "vision_config.hidden_act",
        !qwen3,
        if qwen3 {
            "Qwen3-VL's GELU MLP"
        } else {
            "Qwen2.5-VL's SwiGLU MLP"
        },
    )?;
    let merged = u64::from(spatial_merge).pow(2) * u64::from(t[1]);
    let mergers = 1 + deepstack.len() as u64;
    r.note("encoder.projector_params", format!("the merger{}: Linear(`spatial_merge_size`² · `vision_config.hidden_size`, same) + GELU + Linear(same, `vision_config.out_hidden_size`)", if qwen3 { " and one per deepstack tap" } else { "" }));
    let dtype = dtype_bytes(r, "encoder.dtype_bytes", &["vision_config."])?;
    let kind = EncoderKind::QwenVit {
        patch,
        temporal_patch,
        spatial_merge,
        window_px,
        fullatt_every,
        min_pixels,
        max_pixels,
        video_min_pixels,
        video_max_pixels,
        deepstack,
        video_bounds_per_clip: qwen3,
    };
    let params = mergers * (merged * merged + merged * u64::from(out));
    Ok((encoder(kind, t, g, params, dtype), llm))
}

/// Qwen-VL's attention layout: the window (pixels), the full-attention
/// stride and the deepstack taps; `depth` is `vision_config.depth`.
fn qwen_attention_layout(
    r: &mut Reader<'_>,
    qwen3: bool,
    patch: u32,
    depth: u32,
) -> Result<(u32, u32, Vec<u32>), ImportError> {
    let c = r.config();
    let v = "encoder.kind.QwenVit.";
    Ok(if qwen3 {
        r.note(
            &format!("{v}window_px"),
            "Qwen3-VL has no window attention: the patch size (unused)",
        );
        r.note(
            &format!("{v}fullatt_every"),
            "Qwen3-VL attends fully in every block: 1",
        );
        let taps = c.u32_list(
            "vision_config.deepstack_visual_indexes",
            "encoder.kind.QwenVit.deepstack",
        )?;
        r.note(
            &format!("{v}deepstack"),
            "config.json `vision_config.deepstack_visual_indexes`",
        );
        (patch, 1, taps)
    } else {
        let w = r.u32(&format!("{v}window_px"), c, "vision_config.window_size")?;
        let key = "vision_config.fullatt_block_indexes";
        let full = c.u32_list(key, "encoder.kind.QwenVit.fullatt_every")?;
        // evenly spaced k-1, 2k-1, ... through the last block
        let every = full.first().map_or(0, |f| f + 1);
        let even = every > 0
            && full
                .iter()
                .enumerate()
                .all(|(i, &b)| b + 1 == every * (i as u32 + 1))
            && (full.len() as u32) * every == depth;
        if !even {
            return Err(c.err(key, format!("{full:?}: full-attention blocks must be evenly spaced k-1, 2k-1, ... through the last of `vision_config.depth` ({depth}) blocks; other layouts are not representable")));
        }
        r.note(
            &format!("{v}fullatt_every"),
            format!("config.json `{key}` ({full:?}: every {every}th block)"),
        );
        (w, every, Vec::new())
    })
}

/// Qwen-VL's image and video pixel bounds (`min_pixels`, `max_pixels`,
/// `video_min_pixels`, `video_max_pixels`): the image processor's pixel bounds,
/// `min_pixels`/`max_pixels`, or `size.shortest_edge`/`size.longest_edge`
/// (pixels, not edges, in these files).
fn qwen_pixel_bounds(r: &mut Reader<'_>, qwen3: bool) -> Result<[u64; 4], ImportError> {
    let c = r.config();
    let v = "encoder.kind.QwenVit.";
    let Some(pre) = r.inputs.preprocessor else {
        return Err(c.err("model_type", "Qwen's token rule needs the image processor's pixel bounds: give --preprocessor preprocessor_config.json (its `min_pixels`/`max_pixels` or `size`)"));
    };
    let pre = Json {
        v: pre,
        file: Source::Preprocessor,
    };
    let min_pixels = pixel_bound(
        r,
        pre,
        &format!("{v}min_pixels"),
        ["min_pixels", "size.shortest_edge"],
    )?;
    let max_pixels = pixel_bound(
        r,
        pre,
        &format!("{v}max_pixels"),
        ["max_pixels", "size.longest_edge"],
    )?;
    let (video_min_pixels, video_max_pixels) = match r.inputs.video_preprocessor {
        Some(vp) => {
            let vp = Json {
                v: vp,
                file: Source::VideoPreprocessor,
            };
            (
                pixel_bound(
                    r,
                    vp,
                    &format!("{v}video_min_pixels"),
                    ["min_pixels", "size.shortest_edge"],
                )?,
                pixel_bound(
                    r,
                    vp,
                    &format!("{v}video_max_pixels"),
                    ["max_pixels", "size.longest_edge"],
                )?,
            )
        }
        None if qwen3 => {
            // the values of every Qwen3-VL checkpoint's file, as the presets cite
            r.note(&format!("{v}video_min_pixels"), "the Qwen3-VL checkpoints' video_preprocessor_config.json `size.shortest_edge` (no --video-preprocessor given)");
            r.note(&format!("{v}video_max_pixels"), "the Qwen3-VL checkpoints' video_preprocessor_config.json `size.longest_edge` (no --video-preprocessor given)");
            (4096, 25_165_824)
        }
        None => {
            r.note(&format!("{v}video_min_pixels"), "Qwen2.5-VL's video processor (qwen-vl-utils VIDEO_MIN_PIXELS; no --video-preprocessor given)");
            r.note(&format!("{v}video_max_pixels"), "Qwen2.5-VL's video processor (qwen-vl-utils VIDEO_MAX_PIXELS; no --video-preprocessor given)");
            (crate::QWEN_VIDEO_MIN_PIXELS, crate::QWEN_VIDEO_MAX_PIXELS)
        }
    };
    Ok([min_pixels, max_pixels, video_min_pixels, video_max_pixels])
}

/// The first of `keys` present in `j`, a whole number of pixels, for `field`.
fn pixel_bound(
    r: &mut Reader<'_>,
    j: Json<'_>,
    field: &str,
    keys: [&str; 2],
) -> Result<u64, ImportError> {
    match keys.iter().find(|k| j.get(k).is_some()) {
        Some(k) => {
            let x = j
                .get(k)
                .and_then(Value::as_u64)
                .ok_or_else(|| j.err(k, "must be a whole number of pixels"))?;
            r.note(field, format!("{} `{k}`", j.file.file_name()));
            Ok(x)
        }
        None => Err(j.err(
            keys[0],
            format!("missing (nor `{}`); needed for {field}", keys[1]),
        )),
    }
}

fn gemma3(r: &mut Reader<'_>) -> Result<Parts, ImportError> {
    let c = r.config();
    let llm = llm(r, "text_config.")?;
    let t = tower(r, "vision_config.", &VIT)?;
    let k = "encoder.kind.Siglip.";
    let image_size = r.u32(&format!("{k}image_size"), c, "vision_config.image_size")?;
    let patch = r.u32(&format!("{k}patch"), c, "vision_config.patch_size")?;
    let per_image = c.u32("mm_tokens_per_image", "encoder.kind.Siglip.pooled_side")?;
    let side = (f64::from(per_image)).sqrt().round() as u32;
    let patches = image_size.checked_div(patch).unwrap_or(0);
    if side * side != per_image || side == 0 || !patches.is_multiple_of(side) {
        return Err(c.err("mm_tokens_per_image", format!("{per_image} must be a square whose side divides the {patches} patches per side (`vision_config.image_size` / `patch_size`)")));
    }
    r.note(
        &format!("{k}pooled_side"),
        format!("config.json `mm_tokens_per_image` (√{per_image})"),
    );
    let pan_and_scan = match r.inputs.preprocessor {
        Some(p) => {
            let j = Json {
                v: p,
                file: Source::Preprocessor,
            };
            if j.get("do_pan_and_scan").and_then(Value::as_bool) == Some(true) {
                let d = PanAndScan::default();
                let num = |key: &str, dflt: u32| -> Result<u32, ImportError> {
                    j.get(key).map_or(Ok(dflt), |v| j.u32_of(key, v))
                };
                let ratio = match j.get("pan_and_scan_min_ratio_to_activate") {
                    Some(_) => j.f64(
                        "pan_and_scan_min_ratio_to_activate",
                        "pan_and_scan.min_ratio",
                    )?,
                    None => d.min_ratio,
                };
                r.note(&format!("{k}pan_and_scan"), "preprocessor_config.json `do_pan_and_scan`, `pan_and_scan_min_crop_size`, `pan_and_scan_max_num_crops`, `pan_and_scan_min_ratio_to_activate`");
                Some(PanAndScan {
                    min_crop: num("pan_and_scan_min_crop_size", d.min_crop)?,
                    max_crops: num("pan_and_scan_max_num_crops", d.max_crops)?,
                    min_ratio: ratio,
                })
            } else {
                None
            }
        }
        None => None,
    };
    let g = gated(r, "vision_config.hidden_act", false, "SigLIP's GELU MLP")?;
    r.note(
        "encoder.projector_params",
        "`mm_input_projection_weight`: `vision_config.hidden_size` x `text_config.hidden_size`",
    );
    let dtype = dtype_bytes(r, "encoder.dtype_bytes", &["vision_config."])?;
    let kind = EncoderKind::Siglip {
        image_size,
        patch,
        pooled_side: side,
        pan_and_scan,
    };
    let params = u64::from(t[1]) * u64::from(llm.hidden);
    Ok((encoder(kind, t, g, params, dtype), llm))
}

/// `1 / ratio` as a whole number of patches per side, or an error at `key`.
fn shuffle(c: Json<'_>, key: &str, field: &str) -> Result<u32, ImportError> {
    let ratio = c.f64(key, field)?;
    let s = (1.0 / ratio).round();
    if !(ratio > 0.0 && s >= 1.0 && (s * ratio - 1.0).abs() < 1e-9) {
        return Err(c.err(
            key,
            format!("{ratio}: must be 1/n for a whole n (0.5: 2x2 patches per token)"),
        ));
    }
    Ok(s as u32)
}

fn internvl(r: &mut Reader<'_>) -> Result<Parts, ImportError> {
    let c = r.config();
    let llm = llm(r, "llm_config.")?;
    let t = tower(r, "vision_config.", &VIT)?;
    let k = "encoder.kind.TiledVit.";
    let image_size = r.u32_any(
        &format!("{k}image_size"),
        c,
        &["force_image_size", "vision_config.image_size"],
    )?;
    let patch = r.u32(&format!("{k}patch"), c, "vision_config.patch_size")?;
    let s = shuffle(c, "downsample_ratio", "encoder.kind.TiledVit.pixel_shuffle")?;
    r.note(
        &format!("{k}pixel_shuffle"),
        "config.json 1 / `downsample_ratio`",
    );
    let tiling = Tiling::InternVl {
        min_tiles: c.u32("min_dynamic_patch", "tiling.min_tiles")?,
        max_tiles: c.u32("max_dynamic_patch", "tiling.max_tiles")?,
        thumbnail: c.bool("use_thumbnail", "tiling.thumbnail")?,
    };
    r.note(&format!("{k}tiling"), "config.json `min_dynamic_patch`, `max_dynamic_patch`, `use_thumbnail` (InternVL's dynamic_preprocess)");
    let g = gated(r, "vision_config.hidden_act", false, "InternViT's GELU MLP")?;
    let shuffled = s * s * t[1];
    let projector = vec![shuffled, llm.hidden, llm.hidden];
    r.note(&format!("{k}projector"), "`mlp1`: LayerNorm, Linear(`vision_config.hidden_size` / `downsample_ratio`², `llm_config.hidden_size`), GELU, Linear(`llm_config.hidden_size`, same)");
    r.note(
        "encoder.projector_params",
        "the projector's widths' products",
    );
    let dtype = dtype_bytes(r, "encoder.dtype_bytes", &["vision_config."])?;
    let params = chain_params(&projector);
    let kind = EncoderKind::TiledVit {
        image_size,
        patch,
        pixel_shuffle: s,
        tiling,
        projector,
    };
    Ok((encoder(kind, t, g, params, dtype), llm))
}

fn chain_params(widths: &[u32]) -> u64 {
    widths
        .windows(2)
        .map(|w| u64::from(w[0]) * u64::from(w[1]))
        .sum()
}

fn llama4(r: &mut Reader<'_>) -> Result<Parts, ImportError> {
    let c = r.config();
    let p = "text_config.";
    let mut llm = llm(r, p)?;
    // `intermediate_size` is the expert width; the dense MLP's is `intermediate_size_mlp`
    llm.ffn = r.u32("llm.ffn", c, "text_config.intermediate_size_mlp")?;
    let step_key = "text_config.interleave_moe_layer_step";
    let step = c.u32(step_key, "llm.moe")?;
    if step != 1 {
        return Err(c.err(step_key, format!("{step}: dense and MoE layers alternate (Llama 4 Maverick), which a model file cannot say; allowed: 1 (every layer MoE, Scout)")));
    }
    let experts = r.u32("llm.moe.experts", c, "text_config.num_local_experts")?;
    let top_k = r.u32("llm.moe.top_k", c, "text_config.num_experts_per_tok")?;
    let expert_ffn = r.u32("llm.moe.expert_ffn", c, "text_config.intermediate_size")?;
    r.note("llm.moe.shared_experts", "Llama 4's MoE layer: one shared expert of the routed experts' width (`text_config.intermediate_size`)");
    r.note(
        "llm.moe.router",
        "config.json `text_config.num_local_experts`",
    );
    r.note(
        "llm.moe.first_dense_layers",
        format!("config.json `{step_key}` (1: every layer MoE)"),
    );
    r.note(
        "llm.moe.shared_ffn",
        "config.json `text_config.intermediate_size` (the shared expert's width is the routed experts')",
    );
    routing_note(r);
    llm.moe = Some(MoeArch {
        experts,
        top_k,
        expert_ffn,
        shared_experts: 1,
        shared_ffn: expert_ffn,
        first_dense_layers: 0,
        router: experts,
        routing: MoeRouting::Balanced,
    });
    let t = tower(r, "vision_config.", &VIT)?;
    let k = "encoder.kind.TiledVit.";
    let image_size = r.u32(&format!("{k}image_size"), c, "vision_config.image_size")?;
    let patch = r.u32(&format!("{k}patch"), c, "vision_config.patch_size")?;
    let s = shuffle(
        c,
        "vision_config.pixel_shuffle_ratio",
        "encoder.kind.TiledVit.pixel_shuffle",
    )?;
    r.note(
        &format!("{k}pixel_shuffle"),
        "config.json 1 / `vision_config.pixel_shuffle_ratio`",
    );
    let max_tiles = match r.inputs.preprocessor {
        Some(pre) => {
            let j = Json {
                v: pre,
                file: Source::Preprocessor,
            };
            let m = j.u32(
                "max_patches",
                "encoder.kind.TiledVit.tiling.Llama4.max_tiles",
            )?;
            r.note(
                &format!("{k}tiling"),
                "preprocessor_config.json `max_patches`",
            );
            m
        }
        None => {
            r.note(
                &format!("{k}tiling"),
                "Llama4ImageProcessorFast's default `max_patches` 16 (no --preprocessor given)",
            );
            16
        }
    };
    let fc1_in = c.u32("vision_config.intermediate_size", "projector")?;
    let fc1_out = c.u32("vision_config.projector_input_dim", "projector")?;
    let fc2 = c.u32("vision_config.projector_output_dim", "projector")?;
    if let Some(v) = c.get("vision_config.vision_output_dim") {
        if c.u32_of("vision_config.vision_output_dim", v)? != fc2 {
            return Err(c.err("vision_config.vision_output_dim", format!("{v}: must equal `vision_config.projector_output_dim` ({fc2}), the width the multi-modal projector reads")));
        }
    }
    let projector = vec![fc1_in, fc1_out, fc2, llm.hidden];
    r.note(&format!("{k}projector"), "the vision adapter Linear(`vision_config.intermediate_size`, `projector_input_dim`), GELU, Linear(`projector_output_dim`, same), then `multi_modal_projector` Linear(`vision_output_dim`, `text_config.hidden_size`)");
    r.note(
        "encoder.projector_params",
        "the projector's widths' products",
    );
    let g = gated(
        r,
        "vision_config.hidden_act",
        false,
        "Llama 4's GELU vision MLP",
    )?;
    let dtype = dtype_bytes(r, "encoder.dtype_bytes", &["vision_config."])?;
    let params = chain_params(&projector);
    let kind = EncoderKind::TiledVit {
        image_size,
        patch,
        pixel_shuffle: s,
        tiling: Tiling::Llama4 { max_tiles },
        projector,
    };
    Ok((encoder(kind, t, g, params, dtype), llm))
}

fn qwen3_omni(r: &mut Reader<'_>) -> Result<Parts, ImportError> {
    let c = r.config();
    let p = "thinker_config.text_config.";
    let mut llm = llm(r, p)?;
    llm.moe = Some(qwen3_moe(r, p)?);
    let a = "thinker_config.audio_config.";
    let t = tower(r, a, &WHISPER)?;
    let k = "encoder.kind.OmniAudio.";
    let key = |s: &str| format!("{a}{s}");
    let mel_bins = r.u32(&format!("{k}mel_bins"), c, &key("num_mel_bins"))?;
    let n_window = c.u32(&key("n_window"), "chunk_frames")?;
    let infer = c.u32(&key("n_window_infer"), "window_chunks")?;
    if n_window == 0 || !infer.is_multiple_of(2 * n_window) {
        return Err(c.err(
            &key("n_window_infer"),
            format!(
                "{infer}: must be a multiple of 2 · `n_window` ({})",
                2 * n_window
            ),
        ));
    }
    r.note(
        &format!("{k}chunk_frames"),
        format!("config.json 2 · `{}`", key("n_window")),
    );
    r.note(
        &format!("{k}window_chunks"),
        format!("config.json `{}` / (2 · `n_window`)", key("n_window_infer")),
    );
    let conv_channels = r.u32(
        &format!("{k}conv_channels"),
        c,
        &key("downsample_hidden_size"),
    )?;
    let out = c.u32(&key("output_dim"), "projector")?;
    if out != llm.hidden {
        return Err(c.err(
            &key("output_dim"),
            format!(
                "{out}: the audio projector must end at the LLM's `hidden_size` ({})",
                llm.hidden
            ),
        ));
    }
    let projector = vec![t[1], t[1], out];
    r.note(
        &format!("{k}projector"),
        format!("`proj1` Linear(`{a}d_model`, same), GELU, `proj2` Linear(same, `output_dim`)"),
    );
    r.note(
        "encoder.projector_params",
        "the projector's widths' products",
    );
    let g = gated(
        r,
        &key("activation_function"),
        false,
        "the audio encoder's GELU MLP",
    )?;
    let dtype = dtype_bytes(r, "encoder.dtype_bytes", &["thinker_config."])?;
    r.notes.push("only the thinker's audio encoder and LLM: a model file has one encoder, so the vision tower (`thinker_config.vision_config`) and the talker are left out".into());
    let params = chain_params(&projector);
    let kind = EncoderKind::OmniAudio {
        mel_bins,
        chunk_frames: 2 * n_window,
        window_chunks: infer / (2 * n_window),
        conv_channels,
        projector,
    };
    Ok((encoder(kind, t, g, params, dtype), llm))
}

fn ultravox(r: &mut Reader<'_>) -> Result<Parts, ImportError> {
    let c = r.config();
    let llm = llm(r, "text_config.")?;
    let a = "audio_config.";
    let t = tower(r, a, &WHISPER)?;
    let k = "encoder.kind.Whisper.";
    let mel_bins = r.u32(&format!("{k}mel_bins"), c, "audio_config.num_mel_bins")?;
    let frames = r.u32(
        &format!("{k}frames_per_window"),
        c,
        "audio_config.max_source_positions",
    )?;
    // Whisper's mel frames are 10 ms and its conv halves them: 2 · frames / 100 s
    let window_s = f64::from(frames) * 2.0 / 100.0;
    r.note(&format!("{k}window_s"), "config.json `audio_config.max_source_positions` · 2 mel frames of 10 ms (Whisper's stride-2 conv)");
    let stack = r.u32(&format!("{k}stack"), c, "stack_factor")?;
    let hidden = c.u32("hidden_size", "encoder.projector_params")?;
    let act_key = "projector_act";
    let act = c.get(act_key).and_then(Value::as_str).unwrap_or("swiglu");
    let mid = match act {
        "swiglu" => hidden / 2,
        a if a.starts_with("gelu") || a == "silu" || a == "relu" => hidden,
        _ => {
            return Err(c.err(
                act_key,
                format!("`{act}`: allowed swiglu, gelu, silu, relu"),
            ))
        }
    };
    r.note("encoder.projector_params", format!("UltravoxProjector: Linear(`audio_config.d_model` · `stack_factor`, `hidden_size`), `projector_act` ({act}{}), Linear(that, `text_config.hidden_size`)", if act == "swiglu" { ": halves the width" } else { "" }));
    let g = gated(
        r,
        "audio_config.activation_function",
        false,
        "Whisper's GELU MLP",
    )?;
    let dtype = dtype_bytes(r, "encoder.dtype_bytes", &["audio_config."])?;
    let params = u64::from(t[1]) * u64::from(stack) * u64::from(hidden)
        + u64::from(mid) * u64::from(llm.hidden);
    let kind = EncoderKind::Whisper {
        mel_bins,
        window_s,
        frames_per_window: frames,
        stack,
    };
    Ok((encoder(kind, t, g, params, dtype), llm))
}

impl Imported {
    /// The model file: a header naming the inputs and the notes, then the
    /// serde form of [`ModelArch`] (what a scenario's `model.file` reads) with
    /// each value's source as a comment on its line.
    ///
    /// # Errors
    /// The TOML serializer's, which a well-formed [`ModelArch`] does not raise.
    pub fn to_toml(&self, inputs: &str) -> Result<String, toml::ser::Error> {
        let body = toml::to_string(&self.arch)?;
        let mut out = format!(
            "# `{}`, imported by `easerve model import` from {inputs} (model_type `{}`).\n# Each value's comment names the key it was read or derived from.\n",
            self.arch.name, self.family
        );
        for n in &self.notes {
            out.push_str(&format!("# Note: {n}\n"));
        }
        out.push('\n');
        let mut table = String::new();
        for line in body.lines() {
            let t = line.trim();
            if let Some(h) = t.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
                table = h.trim_matches(['[', ']']).to_string();
                out.push_str(line);
                out.push('\n');
                continue;
            }
            let Some((k, _)) = t.split_once(" = ") else {
                out.push_str(line);
                out.push('\n');
                continue;
            };
            let field = if table.is_empty() {
                k.to_string()
            } else {
                format!("{table}.{k}")
            };
            // the field's own source, else its parts' (an inline table), else
            // the nearest enclosing field's (a table of a documented whole)
            let src = self.sources.get(&field).cloned().or_else(|| {
                let under: Vec<&str> = self
                    .sources
                    .iter()
                    .filter(|(f, _)| f.starts_with(&format!("{field}.")))
                    .map(|(_, s)| s.as_str())
                    .collect();
                (!under.is_empty()).then(|| under.join("; "))
            });
            let src = src.or_else(|| {
                let mut up = field.as_str();
                while let Some((parent, _)) = up.rsplit_once('.') {
                    if let Some(s) = self.sources.get(parent) {
                        return Some(s.clone());
                    }
                    up = parent;
                }
                None
            });
            match src {
                Some(s) => out.push_str(&format!("{line}  # {s}\n")),
                None if field == "name" => out.push_str(&format!("{line}  # --name\n")),
                None => out.push_str(&format!("{line}\n")),
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The fixtures: the keys of each preset checkpoint's configs that the
    /// importer reads, with the values the preset cites (`tests/hf-configs`).
    fn fixture(preset: &str, file: &str) -> Option<Value> {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/hf-configs")
            .join(preset)
            .join(file);
        let text = std::fs::read_to_string(&p).ok()?;
        Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
    }

    fn import_fixture(preset: &str) -> Result<Imported, ImportError> {
        let config = fixture(preset, "config.json").expect("config.json fixture");
        let pre = fixture(preset, "preprocessor_config.json");
        let video = fixture(preset, "video_preprocessor_config.json");
        import(
            preset,
            Inputs {
                config: &config,
                preprocessor: pre.as_ref(),
                video_preprocessor: video.as_ref(),
            },
        )
    }

    /// Every real-size preset is reproduced from its checkpoint's configs.
    #[test]
    fn every_real_size_preset_is_reproduced_from_its_config() {
        for &name in crate::presets::PRESET_NAMES {
            if crate::presets::hf_checkpoint(name).is_none() {
                continue;
            }
            let got = import_fixture(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(got.arch, ModelArch::preset(name).unwrap(), "{name}");
            // every value of the file names its source
            let text = got.to_toml("test").unwrap();
            for line in text.lines() {
                if line.contains(" = ") && !line.starts_with('#') {
                    assert!(line.contains("  # "), "{name}: no source on `{line}`");
                }
            }
            let back: ModelArch = toml::from_str(&text).unwrap();
            assert_eq!(back, got.arch, "{name}: the file reads back");
        }
    }

    /// [`import`] of `c` with an optional preprocessor config, named `m`.
    fn read(c: &Value, pre: Option<&Value>) -> Result<Imported, ImportError> {
        import(
            "m",
            Inputs {
                config: c,
                preprocessor: pre,
                video_preprocessor: None,
            },
        )
    }

    #[test]
    fn keys_that_cannot_be_mapped_are_named() {
        let mut c = fixture("llama-4-scout-17b-16e", "config.json").unwrap();
        c["text_config"]["interleave_moe_layer_step"] = json!(2);
        let e = read(&c, None).unwrap_err();
        assert_eq!(e.key, "text_config.interleave_moe_layer_step");
        assert!(e.message.contains("Maverick"), "{e}");

        let c = json!({"model_type": "mllama"});
        let e = read(&c, None).unwrap_err();
        assert_eq!(e.key, "model_type");
        assert!(e.message.contains("qwen3_vl_moe"), "{e}");

        let mut c = fixture("qwen2.5-vl-32b", "config.json").unwrap();
        c["vision_config"]["fullatt_block_indexes"] = json!([7, 15, 20, 31]);
        let pre = fixture("qwen2.5-vl-32b", "preprocessor_config.json").unwrap();
        let e = read(&c, Some(&pre)).unwrap_err();
        assert_eq!(e.key, "vision_config.fullatt_block_indexes");

        let c = fixture("qwen2.5-vl-32b", "config.json").unwrap();
        let e = read(&c, None).unwrap_err();
        assert!(e.message.contains("--preprocessor"), "{e}");

        let mut c = fixture("qwen3-vl-30b-a3b", "config.json").unwrap();
        c["text_config"]
            .as_object_mut()
            .unwrap()
            .remove("moe_intermediate_size");
        let pre = fixture("qwen3-vl-30b-a3b", "preprocessor_config.json").unwrap();
        let e = read(&c, Some(&pre)).unwrap_err();
        assert_eq!(e.key, "text_config.moe_intermediate_size");
        assert!(
            e.to_string()
                .starts_with("config.json: key `text_config.moe_intermediate_size`"),
            "{e}"
        );

        let mut c = fixture("qwen3-vl-8b", "config.json").unwrap();
        c["text_config"]["num_hidden_layers"] = json!("36");
        let pre = fixture("qwen3-vl-8b", "preprocessor_config.json").unwrap();
        let e = read(&c, Some(&pre)).unwrap_err();
        assert_eq!(e.key, "text_config.num_hidden_layers");
        assert!(e.message.contains("whole number"), "{e}");
    }

    #[test]
    fn pan_and_scan_is_read_from_the_preprocessor() {
        let c = fixture("gemma-3-27b", "config.json").unwrap();
        let pre = json!({"do_pan_and_scan": true, "pan_and_scan_max_num_crops": 3});
        let got = read(&c, Some(&pre)).unwrap();
        match got.arch.encoder.unwrap().kind {
            EncoderKind::Siglip {
                pan_and_scan: Some(p),
                ..
            } => {
                assert_eq!((p.min_crop, p.max_crops, p.min_ratio), (256, 3, 1.2));
            }
            k => panic!("{k:?}"),
        }
    }
}
