//! Hardware presets: GPUs and the links between them.
//!
//! Numbers are datasheet values unless a line says otherwise. Bandwidths are GB/s
//! (1e9 bytes/s); compute is dense (no 2:4 sparsity) BF16 tensor-core TFLOPS.

/// An interconnect between GPUs of one stage (TP all-reduce) or between stages.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    /// Preset name, e.g. `"pcie4-x16"`.
    pub name: String,
    /// GB/s per direction (1e9 bytes/s).
    pub bandwidth_gbs: f64,
    /// Seconds of fixed setup per transfer.
    pub latency_s: f64,
}

/// Names accepted by [`LinkSpec::preset`].
pub const LINK_PRESET_NAMES: &[&str] = &[
    "pcie4-x16",
    "pcie5-x16",
    "nvlink3",
    "nvlink4",
    "nvlink5",
    "loopback",
];

impl LinkSpec {
    /// The link preset called `name`, or `None`.
    ///
    /// * `pcie4-x16`: 25 GB/s effective per direction of 31.5 GB/s theoretical
    ///   (16 GT/s * 16 lanes * 128b/130b); ~25 GB/s is what CUDA `bandwidthTest`
    ///   typically reports for pinned host<->device copies on Gen4 x16. Latency 15 µs:
    ///   assumption (a small NCCL / cudaMemcpy transfer costs ~10-20 µs).
    /// * `pcie5-x16`: 50 GB/s effective of 63 GB/s theoretical (32 GT/s x16), same
    ///   ~80 % efficiency as Gen4 (assumption); latency 15 µs (assumption).
    /// * `nvlink3` (A100 SXM4): 600 GB/s total = 300 GB/s per direction (NVIDIA A100
    ///   datasheet); latency 10 µs (assumption, NCCL small all-reduce on NVLink).
    /// * `nvlink4` (H100/H200 SXM): 900 GB/s total = 450 GB/s per direction (NVIDIA
    ///   H100 datasheet); latency 10 µs (assumption).
    /// * `nvlink5` (B200 SXM): 1.8 TB/s total = 900 GB/s per direction (NVIDIA HGX
    ///   B200 datasheet; aiconfigurator's `b200_sxm.yaml` `intra_node_bw`); latency
    ///   10 µs (assumption).
    /// * `loopback`: local sockets between worker processes on one host (the CPU
    ///   executor): 2 GB/s, 30 µs (assumptions; `easerve profile --device cpu`
    ///   measures the real curve into the profile's transfer table).
    pub fn preset(name: &str) -> Option<LinkSpec> {
        let (bw, lat) = match name {
            "pcie4-x16" => (25.0, 15e-6),
            "pcie5-x16" => (50.0, 15e-6),
            "nvlink3" => (300.0, 10e-6),
            "nvlink4" => (450.0, 10e-6),
            "nvlink5" => (900.0, 10e-6),
            "loopback" => (2.0, 30e-6),
            _ => return None,
        };
        Some(LinkSpec {
            name: name.to_string(),
            bandwidth_gbs: bw,
            latency_s: lat,
        })
    }

    /// Names of all link presets.
    pub fn preset_names() -> &'static [&'static str] {
        LINK_PRESET_NAMES
    }

    /// Seconds to move `bytes` once: `latency_s + bytes / (bandwidth_gbs * 1e9)`.
    /// Zero bytes cost nothing (no transfer is made).
    pub fn transfer_time(&self, bytes: f64) -> f64 {
        if bytes <= 0.0 {
            return 0.0;
        }
        self.latency_s + bytes / (self.bandwidth_gbs * 1e9)
    }
}

/// One GPU model.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    /// Preset name, e.g. `"rtx-6000-ada"`.
    pub name: String,
    /// Dense BF16 tensor TFLOPS (1e12 FLOP/s), without 2:4 sparsity.
    pub bf16_tflops: f64,
    /// HBM/GDDR bandwidth GB/s (1e9 bytes/s).
    pub mem_bandwidth_gbs: f64,
    /// Memory capacity, GB (1e9 bytes).
    pub memory_gb: f64,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// Link between GPUs of this kind (TP all-reduce and inter-stage transfers).
    pub link: LinkSpec,
}

/// Names accepted by [`GpuSpec::preset`].
pub const GPU_PRESET_NAMES: &[&str] = &[
    "rtx-6000-ada",
    "a100-sxm4-80gb",
    "h100-sxm",
    "h200-sxm",
    "b200-sxm",
    "l40s",
    "rtx-pro-6000",
    "cpu",
];

impl GpuSpec {
    /// The GPU preset called `name`, or `None`.
    ///
    /// * `rtx-6000-ada`: 364.2 dense BF16 TFLOPS (728.5 with sparsity), 960 GB/s
    ///   GDDR6, 48 GB, 142 SMs, PCIe 4.0 x16 (NVIDIA RTX 6000 Ada datasheet / Ada
    ///   architecture whitepaper). The EAServe paper's testbed GPU.
    /// * `a100-sxm4-80gb`: 312 TFLOPS, 2039 GB/s HBM2e, 80 GB, 108 SMs, NVLink3
    ///   (NVIDIA A100 datasheet).
    /// * `h100-sxm`: 989 TFLOPS, 3350 GB/s HBM3, 80 GB, 132 SMs, NVLink4 (NVIDIA H100
    ///   datasheet).
    /// * `h200-sxm`: 989 TFLOPS, 4800 GB/s HBM3e, 141 GB, 132 SMs, NVLink4 (NVIDIA H200
    ///   datasheet).
    /// * `b200-sxm`: 2250 TFLOPS, 7700 GB/s HBM3e, 180 GB, 148 SMs, NVLink5 (NVIDIA HGX
    ///   B200 datasheet; the same peak and bandwidth as aiconfigurator's `b200_sxm.yaml`).
    /// * `l40s`: 362 TFLOPS, 864 GB/s GDDR6, 48 GB, 142 SMs, PCIe 4.0 x16 (NVIDIA L40S
    ///   datasheet; AD102, the RTX 6000 Ada's die).
    /// * `rtx-pro-6000`: RTX PRO 6000 Blackwell Server Edition: 467.8 dense BF16 TFLOPS
    ///   (aiconfigurator's `rtx_pro_6000_server.yaml`, at 2430 MHz), 1792 GB/s GDDR7,
    ///   96 GB, 188 SMs, PCIe 5.0 x16 (NVIDIA RTX PRO 6000 Blackwell datasheet).
    /// * `cpu`: the host CPU as the real executor's device, nominal 2-core x86-64 figures
    ///   (assumptions, not a datasheet): 0.19 TFLOPS = 2 cores * 2 FMA units * 8 f32
    ///   lanes * 2 FLOP * 3 GHz (f32, not BF16), 20 GB/s memory, 24 GB, 2 "SMs" (one per
    ///   core: the SM level of a CPU worker is its share of cores), `loopback` link.
    ///   Use a measured profile (`easerve profile --device cpu`) for real figures.
    pub fn preset(name: &str) -> Option<GpuSpec> {
        let (tflops, bw, mem, sms, link) = match name {
            "rtx-6000-ada" => (364.0, 960.0, 48.0, 142, "pcie4-x16"),
            "a100-sxm4-80gb" => (312.0, 2039.0, 80.0, 108, "nvlink3"),
            "h100-sxm" => (989.0, 3350.0, 80.0, 132, "nvlink4"),
            "h200-sxm" => (989.0, 4800.0, 141.0, 132, "nvlink4"),
            "b200-sxm" => (2250.0, 7700.0, 180.0, 148, "nvlink5"),
            "l40s" => (362.0, 864.0, 48.0, 142, "pcie4-x16"),
            "rtx-pro-6000" => (467.8, 1792.0, 96.0, 188, "pcie5-x16"),
            "cpu" => (0.192, 20.0, 24.0, 2, "loopback"),
            _ => return None,
        };
        Some(GpuSpec {
            name: name.to_string(),
            bf16_tflops: tflops,
            mem_bandwidth_gbs: bw,
            memory_gb: mem,
            sms,
            link: LinkSpec::preset(link)?,
        })
    }

    /// Names of all GPU presets.
    pub fn preset_names() -> &'static [&'static str] {
        GPU_PRESET_NAMES
    }

    /// Memory capacity in bytes (`memory_gb * 1e9`).
    pub fn memory_bytes(&self) -> f64 {
        self.memory_gb * 1e9
    }

    /// Peak dense BF16 FLOP/s (`bf16_tflops * 1e12`).
    pub fn peak_flops(&self) -> f64 {
        self.bf16_tflops * 1e12
    }

    /// Peak memory bandwidth in bytes/s (`mem_bandwidth_gbs * 1e9`).
    pub fn peak_bandwidth(&self) -> f64 {
        self.mem_bandwidth_gbs * 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_presets_resolve() {
        for n in GpuSpec::preset_names() {
            assert_eq!(GpuSpec::preset(n).unwrap().name, *n);
        }
        for n in LinkSpec::preset_names() {
            assert_eq!(LinkSpec::preset(n).unwrap().name, *n);
        }
        assert!(GpuSpec::preset("rtx-4090").is_none());
        assert!(LinkSpec::preset("ethernet").is_none());
    }

    #[test]
    fn rtx_6000_ada_facts() {
        let g = GpuSpec::preset("rtx-6000-ada").unwrap();
        assert_eq!(g.memory_bytes(), 48e9);
        assert_eq!(g.sms, 142);
        assert_eq!(g.link.name, "pcie4-x16");
        assert_eq!(g.peak_flops(), 364e12);
    }

    #[test]
    fn transfer_time_is_latency_plus_bytes_over_bandwidth() {
        let l = LinkSpec::preset("pcie4-x16").unwrap();
        // 25 MB over 25 GB/s = 1 ms, + 15 µs
        assert!((l.transfer_time(25e6) - 1.015e-3).abs() < 1e-12);
        assert_eq!(l.transfer_time(0.0), 0.0);
        let nv = LinkSpec::preset("nvlink4").unwrap();
        assert!(nv.transfer_time(1e9) < l.transfer_time(1e9) / 10.0);
    }
}
