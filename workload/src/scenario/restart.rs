//! What a worker's restart costs in the twin: the backoff the controller
//! asks for ([`easerve_sched::Backoff`]) plus the time the new process takes
//! to load its model, derived here.

use super::Scenario;
use easerve_model::Parallel;
use easerve_sched::WorkerRef;

impl Scenario {
    /// Seconds a restarted worker `w` takes to load its model, derived as
    /// the bytes of weights one of its GPUs holds over the bandwidth they
    /// reach it with ([`Scenario::weight_load_gbs`]): the encoder's (and
    /// projector's) split `TP` ways on an encode worker, the LLM's
    /// ([`easerve_model::ModelArch::llm_weight_bytes_per_gpu`]) on a prefill
    /// or decode worker, both on an aggregated replica.
    ///
    /// A lower bound: the weights are taken as held in host memory (the page
    /// cache, warm after the first start), and process start, device context
    /// creation and warm-up are left out. `easerve exec` and `serve` measure
    /// the real load of each restart (the worker's `Ready`), reported beside it.
    pub fn restart_load_s(&self, w: WorkerRef) -> f64 {
        let topology = self.topology();
        let Some(t) = topology.workers().find(|t| t.wref == w) else {
            return 0.0;
        };
        let par = Parallel::new(t.tp, t.ep);
        let encoder = self.model.encoder_weight_bytes() / f64::from(t.tp.max(1));
        let llm = self.model.llm_weight_bytes_per_gpu(par);
        let bytes = match w {
            WorkerRef::Encode(_) => encoder,
            WorkerRef::Prefill(_) | WorkerRef::Decode(_) => llm,
            WorkerRef::Replica(_) => encoder + llm,
        };
        bytes / (self.weight_load_gbs() * 1e9)
    }

    /// GB/s at which a GPU of this scenario takes its weights from host
    /// memory: its host link, PCIe. A PCIe card's own link
    /// ([`easerve_calib::LinkSpec`]'s `pcie4-x16`, `pcie5-x16` effective
    /// rates); an SXM part's host link is PCIe 5.0 x16 on H100, H200 and B200
    /// and PCIe 4.0 x16 on A100 (NVIDIA's HGX datasheets). On the CPU
    /// "device", a copy within host memory: its memory bandwidth.
    pub fn weight_load_gbs(&self) -> f64 {
        use easerve_calib::LinkSpec;
        let pcie = |name: &str| LinkSpec::preset(name).map_or(25.0, |l| l.bandwidth_gbs);
        match (self.gpu.name.as_str(), self.gpu.link.name.as_str()) {
            ("cpu", _) => self.gpu.mem_bandwidth_gbs,
            (_, link) if link.starts_with("pcie") => self.gpu.link.bandwidth_gbs,
            ("a100-sxm4-80gb", _) => pcie("pcie4-x16"),
            _ => pcie("pcie5-x16"),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::scenario::Overrides;
    use crate::Scenario;
    use easerve_sched::WorkerRef;

    fn scenario(name: &str) -> Scenario {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        Scenario::load(&root.join("scenarios").join(name), &Overrides::default()).unwrap()
    }

    #[test]
    fn a_restart_loads_the_stage_s_weights_over_the_host_link() {
        let sc = scenario("image.toml");
        let p = sc.restart_load_s(WorkerRef::Prefill(0));
        let e = sc.restart_load_s(WorkerRef::Encode(0));
        let bytes = sc
            .model
            .llm_weight_bytes_per_gpu(easerve_model::Parallel::new(
                sc.deployment.allocation.prefill.tp,
                1,
            ));
        assert!((p - bytes / (sc.weight_load_gbs() * 1e9)).abs() < 1e-12);
        assert!(
            e > 0.0 && e < p,
            "the encoder is smaller than the LLM: {e} vs {p}"
        );
    }
}
