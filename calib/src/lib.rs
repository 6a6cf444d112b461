//! Hardware specs and stage cost models for easerve.
//!
//! This crate turns the work that `easerve-model` counts (FLOPs, bytes) into seconds on
//! a named GPU: a roofline (`max(compute, memory)`) scaled by fitted efficiencies, plus
//! the fixed per-pass, per-item and per-step terms DESIGN.md "Cost" requires. It does
//! not measure anything itself: measured (or imported, or roofline-computed)
//! [`profile`]s carry per-stage latency tables with provenance, and [`vidur`] fits
//! efficiency curves from third-party measurements into [`fitted`].
//!
//! Reading guide: [`gpu`] (GPU and link presets with datasheet numbers), [`eff`] (every
//! efficiency/overhead constant and where it came from), [`roofline`] (the cost model),
//! [`cost`] (the [`StageCost`] interface), [`profile`] (the profile format and its
//! lookups), [`vidur`] + [`fitted`] (fits to measured data), [`refine`].
//!
//! ```
//! use easerve_calib::{Efficiency, GpuSpec, Roofline};
//! use easerve_model::ModelArch;
//! let m = ModelArch::preset("llava-v1.6-34b").unwrap();
//! let item = m.image_tokens(672, 672).unwrap();
//! let r = Roofline::new(m, GpuSpec::preset("rtx-6000-ada").unwrap(), Efficiency::default());
//! let t = r.encode(&[item], 1.0);
//! assert!(t.total() > t.t_gpu);
//! ```
#![warn(missing_docs, unreachable_pub)]

pub mod aic;
pub mod alone;
pub mod cost;
pub mod eff;
pub mod fidelity;
pub mod fitted;
pub mod gpu;
pub mod grid_cache;
pub mod input;
pub mod interp;
pub mod kernel_cost;
pub mod launch;
pub mod preprocess;
pub mod profile;
pub mod refine;
pub mod roofline;
pub mod trie;
pub mod vidur;

pub use aic::{KernelError, KernelTables};
pub use cost::StageCost;
pub use eff::{Efficiency, DEFAULT_MEM_UTIL};
pub use gpu::{GpuSpec, LinkSpec};
pub use kernel_cost::KernelCost;
pub use launch::{Engine, Launch, LaunchError, LaunchMode, LaunchStage, StageLaunch};
pub use profile::{
    monotone_envelope, monotone_envelope_columns, GridSpec, HostSharing, PrefillBatching, Profile,
    ProfileError, Provenance, Source, Stage,
};
pub use roofline::{EncodeTime, Roofline};
