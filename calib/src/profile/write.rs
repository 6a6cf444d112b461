//! Writing a profile: [`Profile::to_toml_string`] in one canonical layout (so
//! written → read → written is byte-identical) and [`Profile::save`].

use std::fmt::Write as _;
use std::path::Path;

use super::format::is_integer_axis;
use super::{PrefillBatching, Profile, Stage, Table, FORMAT_VERSION};

impl Profile {
    /// Write the profile to `path` in the canonical layout.
    pub fn save(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        std::fs::write(path, self.to_toml_string())
    }

    /// The profile in the canonical TOML layout (see `calib/README.md`).
    pub fn to_toml_string(&self) -> String {
        let q = |s: &str| toml::Value::String(s.to_string()).to_string();
        let p = &self.provenance;
        let mut o = String::new();
        let _ = writeln!(o, "# easerve profile (format: calib/README.md)");
        let _ = writeln!(o, "format = {FORMAT_VERSION}");
        let _ = writeln!(o, "\n[provenance]");
        let _ = writeln!(o, "model = {}", q(&p.model));
        let _ = writeln!(o, "device = {}", q(&p.device));
        let _ = writeln!(o, "link = {}", q(&p.link));
        let _ = writeln!(o, "source = {}", q(p.source.as_str()));
        let _ = writeln!(o, "backend = {}", q(&p.backend));
        let _ = writeln!(o, "driver = {}", q(&p.driver));
        let libs: Vec<String> = p.libraries.iter().map(|l| q(l)).collect();
        let _ = writeln!(o, "libraries = [{}]", libs.join(", "));
        let _ = writeln!(o, "date = {}", q(&p.date));
        let _ = writeln!(o, "method = {}", q(&p.method));
        let _ = writeln!(o, "repetitions = {}", p.repetitions);
        if let Some(c) = p.cores {
            let _ = writeln!(o, "cores = {c}");
        }
        let _ = writeln!(o, "\n[scalars]");
        let _ = writeln!(o, "time_slice_penalty = {:?}", self.time_slice_penalty);
        let _ = writeln!(
            o,
            "bandwidth_interference = {:?}",
            self.bandwidth_interference
        );
        let _ = writeln!(o, "note = {}", q(&self.scalars_note));
        if self.prefill_batching != PrefillBatching::Packed {
            let _ = writeln!(
                o,
                "prefill_batching = {}",
                q(self.prefill_batching.as_str())
            );
        }
        let mut tables: Vec<&Table> = Vec::new();
        tables.extend(self.encode.as_ref());
        tables.extend(self.encode_tp.as_ref());
        tables.push(&self.prefill);
        tables.push(&self.decode);
        tables.extend(self.transfer.iter());
        tables.extend(self.all_reduce.as_ref());
        tables.extend(self.kv_land.as_ref());
        for t in tables {
            if t.stage == Stage::Transfer {
                let _ = writeln!(o, "\n[[transfer]]");
                let _ = writeln!(o, "link = {}", q(t.link.as_deref().unwrap_or("")));
            } else {
                let _ = writeln!(o, "\n[{}]", t.stage.name());
            }
            let _ = writeln!(o, "unit = {}", q(t.unit.as_str()));
            let cols: Vec<String> = t.columns.iter().map(|c| q(c)).collect();
            let _ = writeln!(o, "columns = [{}]", cols.join(", "));
            let _ = writeln!(o, "rows = [");
            let n_axes = t.stage.axes().len();
            for r in &t.rows {
                let cells: Vec<String> = r
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        if i < n_axes && is_integer_axis(t.stage.axes()[i]) {
                            format!("{}", *v as u64)
                        } else {
                            format!("{v:?}")
                        }
                    })
                    .collect();
                let _ = writeln!(o, "  [{}],", cells.join(", "));
            }
            let _ = writeln!(o, "]");
        }
        if let Some(h) = &self.host_sharing {
            o.push_str(&h.to_toml());
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::tests::{roof, small_grid};
    use crate::profile::GridSpec;

    #[test]
    fn written_read_written_is_byte_identical() {
        for model in ["llava-v1.6-34b", "qwen2.5-vl-32b", "text-lm-tiny"] {
            let p = Profile::from_roofline(
                &roof(model, "a100-sxm4-80gb"),
                &GridSpec::default(),
                "2025-01-02",
            );
            let a = p.to_toml_string();
            let q = Profile::from_toml_str(&a, "mem").unwrap();
            let b = q.to_toml_string();
            assert!(a == b, "{model}: second write differs");
            assert_eq!(q.encode_table(), p.encode_table());
            assert_eq!(q.provenance, p.provenance);
        }
    }

    #[test]
    fn save_and_load_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        let p = Profile::from_roofline(
            &roof("llava-v1.6-34b", "rtx-6000-ada"),
            &small_grid(),
            "2025-01-02",
        );
        p.save(&path).unwrap();
        let q = Profile::load(&path).unwrap();
        assert_eq!(q.to_toml_string(), p.to_toml_string());
        assert_eq!(q.origin, path.display().to_string());
        let e = Profile::load(dir.path().join("missing.toml")).unwrap_err();
        assert!(e.to_string().contains("missing.toml"), "{e}");
    }
}
