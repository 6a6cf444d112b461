//! A prepared, versioned on-disk cache of the measured kernel tables.
//!
//! Reading aiconfigurator's parquet tables and preparing them (outlier filter,
//! trie, dense monotone grid: [`crate::aic`], [`crate::trie`]) takes about
//! 0.2 s per GPU, most of a short CLI run. The prepared [`KernelTables`] and
//! [`MoeTables`] are therefore kept on disk and read back in a few
//! milliseconds:
//!
//! * **Where**: `$EASERVE_CACHE_DIR` when set (`off` disables the cache), else
//!   the user's cache directory (`$XDG_CACHE_HOME/easerve`, `~/.cache/easerve`
//!   on Linux; `dirs::cache_dir`); never under the data folder, which may be
//!   shared and read-only.
//! * **Key**: XXH3-128 over [`FORMAT`], the source of the code that prepares
//!   the tables (`aic.rs`, `trie.rs`, `interp.rs`, embedded at build time),
//!   what was asked (system, dtypes) and the relative path and contents of
//!   every file under the GPU's data folder plus its system YAML. Editing a
//!   table, the loader or the format gives a new key; the entry of the old
//!   key is left in place and rebuilt never again.
//! * **Entry**: `<kind>-<system>-<dtypes>-<key>.bin`, the bincode of the
//!   prepared tables, written to a temporary file and renamed, so a reader in
//!   another process never sees half a file. An entry that fails to decode is
//!   rebuilt from the sources; a cache that cannot be written costs only the
//!   rebuild.
//!
//! Errors in the sources are the loader's: the cache is consulted only after
//! the sources were hashed, and a miss builds from them as before.

use crate::aic::{KernelError, KernelTables, MoeTables};
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::Xxh3;

/// Version of the entry format; part of every key.
pub const FORMAT: u32 = 1;

/// The code that prepares the tables: a change to it changes every key.
const LOADER_SOURCE: [&str; 3] = [
    include_str!("aic.rs"),
    include_str!("trie.rs"),
    include_str!("interp.rs"),
];

/// The cache directory in use ([module doc](self)), `None` when disabled or
/// when the platform has no user cache directory.
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var_os("EASERVE_CACHE_DIR") {
        Some(d) if d == "off" => None,
        Some(d) if !d.is_empty() => Some(PathBuf::from(d)),
        _ => dirs::cache_dir().map(|d| d.join("easerve")),
    }
}

/// Feeds every regular file under `dir` (sorted, recursively) to `h`: its
/// path relative to `root`, its length and its bytes. Unreadable entries are
/// skipped (the loader reports them when it reads them).
fn hash_tree(h: &mut Xxh3, root: &Path, dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            hash_tree(h, root, &p);
        } else if let Ok(bytes) = std::fs::read(&p) {
            let rel = p.strip_prefix(root).unwrap_or(&p);
            h.update(rel.to_string_lossy().as_bytes());
            h.update(&(bytes.len() as u64).to_le_bytes());
            h.update(&bytes);
        }
    }
}

/// The key of `kind` tables of `system` (`asked`: the dtypes) read from `dir`.
fn key(dir: &Path, kind: &str, system: &str, asked: &str) -> String {
    let mut h = Xxh3::new();
    h.update(&FORMAT.to_le_bytes());
    for s in LOADER_SOURCE {
        h.update(s.as_bytes());
    }
    for s in [kind, system, asked] {
        h.update(s.as_bytes());
        h.update(&[0]);
    }
    let yaml = dir.join(format!("{system}.yaml"));
    if let Ok(b) = std::fs::read(&yaml) {
        h.update(&b);
    }
    hash_tree(&mut h, dir, &dir.join("data").join(system));
    format!("{:032x}", h.digest128())
}

/// Reads the entry at `path`, `None` when absent or undecodable.
fn read<T: serde::de::DeserializeOwned>(path: &Path) -> Option<T> {
    let bytes = std::fs::read(path).ok()?;
    bincode::serde::decode_from_slice(&bytes, bincode::config::standard())
        .ok()
        .map(|(v, _)| v)
}

/// Writes `v` to `path` through a temporary file and a rename; errors are
/// ignored (the next run rebuilds).
fn write<T: serde::Serialize>(path: &Path, v: &T) {
    let Ok(bytes) = bincode::serde::encode_to_vec(v, bincode::config::standard()) else {
        return;
    };
    let Some(parent) = path.parent() else {
        return;
    };
    if std::fs::create_dir_all(parent).is_err() {
        return;
    }
    // unique per process and call: two threads may build the same entry
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp = parent.join(format!(
        ".{}.{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("entry"),
        std::process::id(),
        WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Whether an entry was read from the cache or built from the sources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hit {
    /// Read back from the cache.
    Cached,
    /// Built from the sources (and written, when the cache is on).
    Built,
}

fn cached<T: serde::Serialize + serde::de::DeserializeOwned>(
    cache: Option<&Path>,
    dir: &Path,
    kind: &str,
    system: &str,
    asked: &str,
    build: impl FnOnce() -> Result<T, KernelError>,
) -> Result<(T, Hit), KernelError> {
    let Some(cache) = cache else {
        return build().map(|v| (v, Hit::Built));
    };
    let path = cache.join(format!(
        "{kind}-{system}-{}-{}.bin",
        asked.replace('/', "-"),
        key(dir, kind, system, asked)
    ));
    if let Some(v) = read(&path) {
        return Ok((v, Hit::Cached));
    }
    let v = build()?;
    write(&path, &v);
    Ok((v, Hit::Built))
}

/// [`KernelTables::load_with`] through the cache in `cache` (`None`: no
/// cache).
///
/// # Errors
/// The loader's, when the entry is missing and the sources are bad.
pub fn kernel_tables(
    cache: Option<&Path>,
    dir: &Path,
    system: &str,
    dtype: &str,
    kv_dtype: &str,
) -> Result<(KernelTables, Hit), KernelError> {
    cached(
        cache,
        dir,
        "kernels",
        system,
        &format!("{dtype}/{kv_dtype}"),
        || KernelTables::load_with(dir, system, dtype, kv_dtype),
    )
}

/// [`MoeTables::load`] through the cache in `cache` (`None`: no cache).
///
/// # Errors
/// The loader's, when the entry is missing and the sources are bad.
pub fn moe_tables(
    cache: Option<&Path>,
    dir: &Path,
    system: &str,
    dtype: &str,
) -> Result<(MoeTables, Hit), KernelError> {
    cached(cache, dir, "moe", system, dtype, || {
        MoeTables::load(dir, system, dtype)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> Option<PathBuf> {
        let d = crate::aic::find_data_dir();
        if d.is_none() {
            eprintln!("skipped: ../shared/data/aiconfigurator is absent");
        }
        d
    }

    #[test]
    fn a_cached_entry_equals_the_built_tables_and_a_changed_source_rebuilds() {
        let Some(src) = data() else { return };
        // a private copy of one GPU's data, so a source can be changed
        let root = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let copy = |from: &Path, to: &Path| {
            fn walk(from: &Path, to: &Path) {
                std::fs::create_dir_all(to).unwrap();
                for e in std::fs::read_dir(from).unwrap() {
                    let p = e.unwrap().path();
                    let t = to.join(p.file_name().unwrap());
                    if p.is_dir() {
                        walk(&p, &t);
                    } else {
                        std::fs::copy(&p, &t).unwrap();
                    }
                }
            }
            walk(from, to);
        };
        copy(
            &src.join("data/a100_sxm"),
            &root.path().join("data/a100_sxm"),
        );
        std::fs::copy(src.join("a100_sxm.yaml"), root.path().join("a100_sxm.yaml")).unwrap();
        let dir = root.path();
        let c = Some(cache.path());
        let (built, h1) = kernel_tables(c, dir, "a100_sxm", "bfloat16", "bfloat16").unwrap();
        let (read, h2) = kernel_tables(c, dir, "a100_sxm", "bfloat16", "bfloat16").unwrap();
        assert_eq!((h1, h2), (Hit::Built, Hit::Cached));
        assert_eq!(built.gemm, read.gemm);
        assert_eq!(built.context, read.context);
        assert_eq!(built.generation, read.generation);
        assert_eq!(built.provenance, read.provenance);
        assert_eq!(built.system, read.system);
        assert_eq!(built.raised, read.raised);
        // a changed source gives a new key: built again
        let yaml = dir.join("a100_sxm.yaml");
        let mut y = std::fs::read_to_string(&yaml).unwrap();
        y.push_str("\n# edited\n");
        std::fs::write(&yaml, y).unwrap();
        let (_, h3) = kernel_tables(c, dir, "a100_sxm", "bfloat16", "bfloat16").unwrap();
        assert_eq!(h3, Hit::Built);
        // a corrupt entry is rebuilt, not trusted
        for e in std::fs::read_dir(cache.path()).unwrap() {
            std::fs::write(e.unwrap().path(), b"not bincode").unwrap();
        }
        let (again, h4) = kernel_tables(c, dir, "a100_sxm", "bfloat16", "bfloat16").unwrap();
        assert_eq!(h4, Hit::Built);
        assert_eq!(again.gemm, built.gemm);
        // bad sources still fail as the loader says, cache or not
        let e = kernel_tables(c, dir, "h100_sxm", "bfloat16", "bfloat16").unwrap_err();
        assert!(e.to_string().contains("no kernel data"), "{e}");
    }
}
