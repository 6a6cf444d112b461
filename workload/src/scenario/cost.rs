//! Where a scenario's stage costs come from ([`Scenario::cost`]): its
//! profile; else measured kernels (aiconfigurator tables) where its GPU has
//! them and the data is found; else the roofline, with a note saying why
//! when a fallback was taken. Each carries the serving framework's encode
//! terms ([`Scenario::encode_terms`]).

use super::{Scenario, ScenarioError};

impl Scenario {
    /// The stage costs the scenario names: its `profile`; else measured kernels
    /// when its GPU is a preset with aiconfigurator tables, or the RTX 6000 Ada
    /// (priced from the L40S's tables, same AD102 die), and the data is found
    /// ([`Scenario::data_dir`]; `cluster.kernels = "roofline"` opts
    /// out); else the roofline of its model and GPU. Either carries the serving
    /// system's own framework and measured preprocessing terms
    /// ([`easerve_calib::preprocess::EncodeTerms`]). When the tables cannot be
    /// read, or the GPU has tables but the data is absent, the roofline is used
    /// and its notes say why. Encode workers at TP > 1 are priced at their
    /// TP ([`easerve_calib::StageCost::encode_tp`]); without a profile a
    /// note names the term and where its all-reduces come from.
    pub fn cost(&self) -> Box<dyn easerve_calib::StageCost> {
        let cost = self.source_cost();
        let tp = self.deployment.allocation.encode.tp;
        // a cluster's encode group prices its own (the note is its)
        if tp <= 1 || self.profile.is_some() || self.cluster.is_some() {
            return cost;
        }
        let source = if matches!(self.kernel_cost(), Some(Ok(_))) {
            "aiconfigurator's vLLM custom all-reduce table (custom_allreduce_perf, vllm_eager: the prefill all-reduce's source)".to_string()
        } else {
            format!(
                "a ring all-reduce over the {} link spec (as the roofline's LLM TP)",
                self.gpu.link.name
            )
        };
        PerStage::with_note(
            cost,
            format!("encode workers at TP {tp}: each block's GEMMs split over the {tp} GPUs (QKV and MLP up by columns, out and down by rows), attention over 1/{tp} of the heads, stem and projector whole, plus two all-reduces per block of tokens × hidden × dtype bytes from {source}"),
        )
    }

    /// [`Scenario::cost`] before the note on encode workers at TP > 1.
    fn source_cost(&self) -> Box<dyn easerve_calib::StageCost> {
        use easerve_calib::{Efficiency, Roofline};
        if let Some(p) = &self.profile {
            return Box::new(p.clone());
        }
        if let Some(c) = &self.cluster {
            return self.group_cost(c);
        }
        let roofline = || {
            Box::new(
                Roofline::new(self.model.clone(), self.gpu.clone(), Efficiency::default())
                    .with_terms(self.encode_terms()),
            )
        };
        match self.kernel_cost() {
            Some(Ok(k)) => match self.data_dir() {
                Some(found) => PerStage::with_note(
                    Box::new(k),
                    format!(
                        "aiconfigurator data (measured kernel tables) found {}",
                        found.how
                    ),
                ),
                None => Box::new(k),
            },
            Some(Err(e)) => PerStage::with_note(
                roofline(),
                format!("measured kernels unusable, roofline used instead: {e}"),
            ),
            None if !self.roofline_named()
                && self.raw.cluster.gpu.is_some()
                && easerve_calib::kernel_cost::kernel_source_for(&self.gpu.name).is_some()
                && self.data_dir().is_none() =>
            {
                PerStage::with_note(
                    roofline(),
                    format!(
                        "{} has measured kernel tables, but no aiconfigurator data was found ($EASERVE_AICONFIGURATOR_DIR, then shared/data/aiconfigurator beside the scenario's folder, then ../shared/data/aiconfigurator beside the working directory): roofline used instead",
                        self.gpu.name
                    ),
                )
            }
            None => roofline(),
        }
    }

    /// Where the aiconfigurator data is found for this scenario
    /// ([`easerve_calib::aic::locate_data_dir`]: the variable, beside the
    /// scenario's folder, beside the working directory).
    pub fn data_dir(&self) -> Option<easerve_calib::aic::FoundData> {
        easerve_calib::aic::locate_data_dir(Some(std::path::Path::new(&self.file)))
    }

    /// The serving system's encode terms on this deployment's host: framework
    /// terms and measured preprocessing ([`easerve_calib::preprocess::EncodeTerms`]),
    /// preprocessing scaled by `cluster.host_cpu_scale`.
    pub fn encode_terms(&self) -> easerve_calib::preprocess::EncodeTerms {
        easerve_calib::preprocess::EncodeTerms::for_system(
            &self.model,
            self.framework(),
            easerve_calib::Efficiency::default().encode_pass_s,
            self.raw.cluster.host_cpu_scale.unwrap_or(1.0),
        )
    }

    /// The serving framework whose encode terms apply: `deployment.framework`, or
    /// the system's own.
    pub fn framework(&self) -> &str {
        self.raw
            .deployment
            .framework
            .as_deref()
            .unwrap_or(self.system.name())
    }

    /// The LLM's weight dtype in aiconfigurator's names (`bfloat16`, `fp8`,
    /// `fp8_block`): `model.dtype`, else `fp8` for a model file of 1-byte
    /// weights, else `bfloat16`.
    pub fn llm_dtype(&self) -> &str {
        match self.raw.model.dtype.as_deref() {
            Some(d) => d,
            None if self.model.llm.dtype_bytes == 1 => "fp8",
            None => "bfloat16",
        }
    }

    /// Whether the scenario asks for the roofline by name (`cluster.kernels =
    /// "roofline"` or `profile = "roofline"`).
    fn roofline_named(&self) -> bool {
        self.raw.cluster.kernels.as_deref() == Some("roofline")
            || self.raw.profile.as_deref() == Some("roofline")
    }

    /// The measured-kernel cost of this scenario, if its GPU and `cluster.kernels`
    /// select one and the data directory exists; `Some(Err)` when the tables are
    /// there but cannot be read.
    pub fn kernel_cost(
        &self,
    ) -> Option<Result<easerve_calib::KernelCost, easerve_calib::KernelError>> {
        if self.roofline_named() || self.raw.cluster.gpu.is_none() {
            return None;
        }
        let dir = self.data_dir()?.dir;
        easerve_calib::KernelCost::from_data(
            &dir,
            &self.model,
            &self.gpu,
            self.framework(),
            self.llm_dtype(),
            self.raw.cluster.host_cpu_scale.unwrap_or(1.0),
            true,
        )
        .map(|k| k.map(|k| k.with_launch(self.launch.clone())))
        .transpose()
    }

    /// The measured kernel tables [`Scenario::cost`] would read, checked: an
    /// error naming `cluster.kernels` and the unreadable file when the tables
    /// are there but cannot be read (a corrupt GEMM or fused-MoE parquet, a
    /// table without a needed column), where [`Scenario::cost`] itself falls
    /// back to the roofline with a note. The command line refuses such a
    /// scenario (exit 2) rather than answer from another cost source.
    ///
    /// # Errors
    /// As above; absent data or a roofline scenario is not an error.
    pub fn check_kernel_tables(&self) -> Result<(), ScenarioError> {
        match self.kernel_cost() {
            Some(Err(e)) => Err(ScenarioError {
                file: self.file.clone(),
                field: "cluster.kernels".into(),
                message: format!(
                    "the measured kernel tables of {} cannot be read: {e}; restore the file, or set `cluster.kernels = \"roofline\"` to price from the roofline",
                    self.gpu.name
                ),
            }),
            _ => Ok(()),
        }
    }
}

impl Scenario {
    /// This scenario on the GPU of node group `g` alone: the one-node form
    /// with that group's GPU (preset or file) and intra-node link, for its
    /// cost source.
    fn on_group(&self, c: &super::Cluster, g: usize) -> Scenario {
        let mut s = self.clone();
        s.gpu = c.groups[g].gpu.clone();
        s.raw.cluster.gpu = s.raw.cluster.groups[g].gpu.clone();
        s.raw.cluster.gpu_file = s.raw.cluster.groups[g].gpu_file.clone();
        s.raw.cluster.groups.clear();
        s.cluster = None;
        s
    }

    /// Stage costs on a cluster of node groups: each stage priced on its
    /// group's GPU type (measured kernels where it has them, else the
    /// roofline, as [`Scenario::cost`] for one GPU type).
    fn group_cost(&self, c: &super::Cluster) -> Box<dyn easerve_calib::StageCost> {
        use std::sync::Arc;
        let mut built: Vec<Option<Arc<dyn easerve_calib::StageCost>>> = vec![None; c.groups.len()];
        let mut of = |g: usize| -> Arc<dyn easerve_calib::StageCost> {
            built[g]
                .get_or_insert_with(|| Arc::from(self.on_group(c, g).cost()))
                .clone()
        };
        let [e, p, d] = c.stage_groups;
        let names = c.stage_groups.map(|g| c.groups[g].gpu.name.clone());
        Box::new(PerStage {
            stages: [of(e), of(p), of(d)],
            label: Label::Groups(names),
        })
    }

    /// The cost of local prefill workers when they would run on another GPU
    /// type than the remote prefill workers (co-located on the encode GPUs
    /// of a cluster of node groups, whether or not this deployment has
    /// any); `None` when the prefill cost applies.
    pub fn local_prefill_cost(&self) -> Option<Box<dyn easerve_calib::StageCost>> {
        let c = self.cluster.as_ref()?;
        let [e, p, _] = c.stage_groups;
        let differs = c.groups[e].gpu.name != c.groups[p].gpu.name;
        (differs && self.profile.is_none()).then(|| self.on_group(c, e).cost())
    }
}

/// Stage costs delegated by stage: encode (with its preprocessing, SM
/// sharing, interference and transfers) to the first source, prefill to the
/// second, decode to the third. It serves a cluster of node groups (each
/// stage on its group's GPU; a transfer priced from the encode group's
/// link, the simulator pricing each transfer on its own path) and a single
/// source with one more note (why a fallback was taken): the same source
/// three times.
struct PerStage {
    /// Encode, prefill, decode.
    stages: [std::sync::Arc<dyn easerve_calib::StageCost>; 3],
    /// What its notes say about where the costs come from.
    label: Label,
}

/// The notes of a [`PerStage`].
enum Label {
    /// Each stage's GPU name (a cluster of node groups): a note naming them,
    /// then each distinct source's notes.
    Groups([String; 3]),
    /// One source with this note before its own.
    Note(String),
}

impl PerStage {
    /// `cost` with `note` before its own notes.
    fn with_note(cost: Box<dyn easerve_calib::StageCost>, note: String) -> Box<PerStage> {
        let one: std::sync::Arc<dyn easerve_calib::StageCost> = std::sync::Arc::from(cost);
        Box::new(PerStage {
            stages: [one.clone(), one.clone(), one],
            label: Label::Note(note),
        })
    }
}

impl easerve_calib::StageCost for PerStage {
    fn encode_tp(
        &self,
        items: &[easerve_model::ItemTokens],
        sm_share: f64,
        tp: u32,
    ) -> easerve_calib::EncodeTime {
        self.stages[0].encode_tp(items, sm_share, tp)
    }
    fn preprocess(&self, items: &[easerve_model::ItemTokens]) -> f64 {
        self.stages[0].preprocess(items)
    }
    fn prefill(&self, seq_lens: &[u64], par: easerve_model::Parallel, sm_share: f64) -> f64 {
        self.stages[1].prefill(seq_lens, par, sm_share)
    }
    fn prefill_cached(
        &self,
        new: &[u64],
        cached: &[u64],
        par: easerve_model::Parallel,
        sm_share: f64,
    ) -> f64 {
        self.stages[1].prefill_cached(new, cached, par, sm_share)
    }
    fn decode_step(
        &self,
        batch: u64,
        total_context_tokens: u64,
        par: easerve_model::Parallel,
    ) -> f64 {
        self.stages[2].decode_step(batch, total_context_tokens, par)
    }
    fn decode_steps(
        &self,
        batch: u64,
        context: u64,
        par: easerve_model::Parallel,
        steps: u64,
        out: &mut Vec<f64>,
    ) {
        self.stages[2].decode_steps(batch, context, par, steps, out)
    }
    fn transfer(&self, bytes: f64) -> f64 {
        self.stages[0].transfer(bytes)
    }
    fn kv_land(&self, tp: u32, tokens: u64) -> f64 {
        self.stages[2].kv_land(tp, tokens)
    }
    fn time_slice_penalty(&self) -> f64 {
        self.stages[0].time_slice_penalty()
    }
    fn bandwidth_interference(&self) -> f64 {
        self.stages[0].bandwidth_interference()
    }
    fn notes(&self) -> Vec<String> {
        let names = match &self.label {
            Label::Note(note) => {
                let mut n = vec![note.clone()];
                n.extend(self.stages[0].notes());
                return n;
            }
            Label::Groups(names) => names,
        };
        let mut n = vec![format!(
            "per-GPU-type stage costs: encode on {}, prefill on {}, decode on {} (each stage's node group)",
            names[0], names[1], names[2]
        )];
        for (k, stage) in self.stages.iter().enumerate() {
            if k > 0 && names[..k].contains(&names[k]) {
                continue;
            }
            n.extend(
                stage
                    .notes()
                    .into_iter()
                    .map(|x| format!("[{}] {x}", names[k])),
            );
        }
        n
    }
}
