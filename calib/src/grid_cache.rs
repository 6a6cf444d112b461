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
//!   the workspace's `Cargo.lock` (the parquet reader's and the encoder's
//!   versions), the MoE routing names the `distribution` column maps to, what
//!   was asked (system, dtypes), the data folder's path (the tables'
//!   provenance names it) and the relative path and contents of every file
//!   under the GPU's data folder plus its system YAML. Editing a table, the
//!   loader, a dependency or the format gives a new key, and writing the new
//!   entry removes the old one.
//! * **Entry**: `<kind>-<system>-<dtypes>-<folder>-<key>.bin`, where
//!   `<folder>` is 8 hex digits of the XXH3-64 of the data folder's path as
//!   the key hashes it: 8 magic bytes, the payload's length and XXH3-64,
//!   then the payload, the bincode of the prepared tables. A new entry
//!   replaces only the entries of its own kind, system, dtypes and folder,
//!   so two checkouts (or two data folders, or two relative paths to one)
//!   that read the same GPU keep an entry each instead of rebuilding the
//!   other's on every run; of one kind, system and dtypes at most
//!   [`ENTRIES_PER_TABLE`] are kept, the least recently used (read or
//!   written: the file's modification time) removed first, so folders that
//!   are gone do not fill the cache. An entry named without a folder (the
//!   format before it) is removed as superseded, so a build of that format
//!   sharing the cache rebuilds its tables until it is updated. It is written to a temporary file and renamed, so a
//!   reader in another process never sees half a file. An entry that is
//!   truncated, altered, not wholly decoded or holds a grid that fails
//!   [`Grid::is_consistent`](crate::interp::Grid::is_consistent) is rebuilt
//!   from the sources; a cache that cannot be written costs only the rebuild.
//!
//! Errors in the sources are the loader's: the cache is consulted only after
//! the sources were hashed, and a miss builds from them as before.

use crate::aic::{KernelError, KernelTables, MoeTables};
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::Xxh3;

/// Version of the entry format; part of every key.
pub const FORMAT: u32 = 2;

/// `Cargo.lock`: the versions of the crates that read the sources and encode
/// the entries (parquet, bincode, serde).
const LOCKED_VERSIONS: &str = include_str!("../../Cargo.lock");

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

/// Feeds every folder and regular file under `dir` (sorted, recursively) to
/// `h`: its path relative to `root`, and a file's length and bytes. Unreadable entries are
/// skipped (the loader reports them when it reads them).
fn hash_tree(h: &mut Xxh3, root: &Path, dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        let rel = p.strip_prefix(root).unwrap_or(&p);
        if p.is_dir() {
            // the folder's name too: the loader picks the newest version
            // folder, which may be empty
            h.update(rel.to_string_lossy().as_bytes());
            h.update(b"/");
            hash_tree(h, root, &p);
        } else if let Ok(bytes) = std::fs::read(&p) {
            h.update(rel.to_string_lossy().as_bytes());
            h.update(&(bytes.len() as u64).to_le_bytes());
            h.update(&bytes);
        }
    }
}

/// The tag of data folder `dir` in its entries' names: 8 hex digits of the
/// XXH3-64 of the path as given, the string [`key`] hashes (the tables'
/// provenance names it, so two paths to one folder are two entries).
fn folder_tag(dir: &Path) -> String {
    let h = xxhash_rust::xxh3::xxh3_64(dir.display().to_string().as_bytes());
    format!("{:08x}", h >> 32)
}

/// Most entries kept of one kind, system and dtypes across data folders;
/// beyond it the least recently used go (a read or a write marks an entry
/// used, its modification time).
const ENTRIES_PER_TABLE: usize = 4;

/// The key of `kind` tables of `system` (`asked`: the dtypes) read from `dir`.
fn key(dir: &Path, kind: &str, system: &str, asked: &str) -> String {
    let mut h = Xxh3::new();
    h.update(&FORMAT.to_le_bytes());
    for s in LOADER_SOURCE {
        h.update(s.as_bytes());
    }
    // the reader's and the encoder's versions (parquet, bincode, ...) and the
    // routing names the MoE loader maps the `distribution` column to
    h.update(LOCKED_VERSIONS.as_bytes());
    for r in easerve_model::MoeRouting::ALL {
        h.update(r.name().as_bytes());
        h.update(&[0]);
    }
    // the folder itself: the tables' provenance names it
    let folder = dir.display().to_string();
    for s in [kind, system, asked, folder.as_str()] {
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

/// The first bytes of every entry.
const MAGIC: &[u8; 8] = b"EASRVGC\0";

/// Tables whose grids can be checked after decoding ([`Grid::is_consistent`]).
///
/// [`Grid::is_consistent`]: crate::interp::Grid::is_consistent
pub(crate) trait Consistent {
    /// Whether every grid is consistent.
    fn consistent(&self) -> bool;
}

impl Consistent for KernelTables {
    fn consistent(&self) -> bool {
        let pairs = |g: &Option<[crate::interp::Grid; 2]>| {
            g.as_ref()
                .is_none_or(|[a, b]| a.is_consistent() && b.is_consistent())
        };
        [
            &self.gemm,
            &self.context,
            &self.generation,
            &self.allreduce_graph,
            &self.allreduce_eager,
        ]
        .iter()
        .all(|g| g.is_consistent())
            && self.encoder.as_ref().is_none_or(|g| g.is_consistent())
            && pairs(&self.nccl)
            && pairs(&self.quant)
    }
}

impl Consistent for MoeTables {
    fn consistent(&self) -> bool {
        self.shapes.values().all(|g| g.is_consistent())
    }
}

/// Reads the entry at `path`: `MAGIC`, the payload's length and XXH3-64 (both
/// u64, little endian), then the payload, the bincode of the tables. `None` when
/// absent, truncated, altered, not wholly consumed by the decoder, or holding an
/// inconsistent grid.
fn read<T: serde::de::DeserializeOwned + Consistent>(path: &Path) -> Option<T> {
    let bytes = std::fs::read(path).ok()?;
    let rest = bytes.strip_prefix(MAGIC.as_slice())?;
    if rest.len() < 16 {
        return None;
    }
    let len = u64::from_le_bytes(rest[..8].try_into().ok()?);
    let sum = u64::from_le_bytes(rest[8..16].try_into().ok()?);
    let payload = &rest[16..];
    if payload.len() as u64 != len || xxhash_rust::xxh3::xxh3_64(payload) != sum {
        return None;
    }
    let (v, used): (T, usize) =
        bincode::serde::decode_from_slice(payload, bincode::config::standard()).ok()?;
    (used == payload.len() && v.consistent()).then_some(v)
}

/// Writes `v` to `path` through a temporary file and a rename, then prunes
/// the entries beside it ([`prune`]). Errors are ignored (the next run rebuilds) and leave no
/// temporary file behind.
fn write<T: serde::Serialize>(path: &Path, v: &T) {
    let Ok(payload) = bincode::serde::encode_to_vec(v, bincode::config::standard()) else {
        return;
    };
    let Some(parent) = path.parent() else {
        return;
    };
    if std::fs::create_dir_all(parent).is_err() {
        return;
    }
    let mut bytes = Vec::with_capacity(payload.len() + 24);
    bytes.extend_from_slice(MAGIC);
    bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&payload).to_le_bytes());
    bytes.extend_from_slice(&payload);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("entry");
    // unique per process and call: two threads may build the same entry
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp = parent.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    if std::fs::write(&tmp, bytes).is_err() || std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
        return;
    }
    prune(parent, name);
}

/// Removes, beside entry `name` in `dir`: the entries of its kind, system,
/// dtypes and folder under another key (superseded by a source change),
/// those of its kind, system and dtypes named without a folder (the earlier
/// format), and of the rest of its kind, system and dtypes all but the
/// [`ENTRIES_PER_TABLE`] most recently used (`name` counted). Errors are
/// ignored.
fn prune(dir: &Path, name: &str) {
    // `<kind>-<system>-<dtypes>-<folder>-<key>.bin`, parsed from the right
    // (dtypes hold '-')
    let Some((folder_prefix, _)) = name.rsplit_once('-') else {
        return;
    };
    let Some((prefix, _)) = folder_prefix.rsplit_once('-') else {
        return;
    };
    let (prefix, folder_prefix) = (format!("{prefix}-"), format!("{folder_prefix}-"));
    // what follows a prefix: `<32 hex>.bin` (a key), or `<8 hex>-<32 hex>.bin`
    // (a folder and a key); read as bytes, so no name can split a character
    let hex = |b: &[u8]| b.iter().all(u8::is_ascii_hexdigit);
    let is_key = |k: &str| k.len() == 32 + 4 && hex(&k.as_bytes()[..32]);
    let is_tagged = |k: &str| {
        let b = k.as_bytes();
        b.len() == 8 + 1 + 32 + 4 && hex(&b[..8]) && b[8] == b'-' && hex(&b[9..41])
    };
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut others = Vec::new();
    for e in rd.flatten() {
        let other = e.file_name();
        let Some(other) = other.to_str() else {
            continue;
        };
        if other == name || !other.ends_with(".bin") {
            continue;
        }
        let superseded = other.strip_prefix(&folder_prefix).is_some_and(is_key)
            || other.strip_prefix(&prefix).is_some_and(is_key);
        if superseded {
            let _ = std::fs::remove_file(e.path());
        } else if other.strip_prefix(&prefix).is_some_and(is_tagged) {
            let used = e.metadata().and_then(|m| m.modified()).ok();
            others.push((used, e.path()));
        }
    }
    // newest first; `name` is the newest of all
    others.sort_by_key(|o| std::cmp::Reverse(o.0));
    for (_, path) in others.iter().skip(ENTRIES_PER_TABLE.saturating_sub(1)) {
        let _ = std::fs::remove_file(path);
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

fn cached<T: serde::Serialize + serde::de::DeserializeOwned + Consistent>(
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
        "{kind}-{system}-{}-{}-{}.bin",
        asked.replace('/', "-"),
        folder_tag(dir),
        key(dir, kind, system, asked)
    ));
    if let Some(v) = read(&path) {
        // marks it used ([`ENTRIES_PER_TABLE`]); a failure costs nothing
        let _ = std::fs::File::options()
            .append(true)
            .open(&path)
            .and_then(|f| f.set_modified(std::time::SystemTime::now()));
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

    /// Copies folder `from` to `to`, recursively.
    fn copy_tree(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let p = e.unwrap().path();
            let t = to.join(p.file_name().unwrap());
            if p.is_dir() {
                copy_tree(&p, &t);
            } else {
                std::fs::copy(&p, &t).unwrap();
            }
        }
    }

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
        copy_tree(
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
        // ... and the superseded entry is gone: one entry, no temporary file
        let names = || -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(cache.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names().len(), 1, "{:?}", names());
        assert!(names()[0].starts_with("kernels-a100_sxm-bfloat16-bfloat16-"));
        // an altered byte that still decodes is caught by the checksum
        let entry = cache.path().join(&names()[0]);
        let mut bytes = std::fs::read(&entry).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&entry, &bytes).unwrap();
        let (_, h) = kernel_tables(c, dir, "a100_sxm", "bfloat16", "bfloat16").unwrap();
        assert_eq!(h, Hit::Built);
        // an entry with trailing bytes is not trusted either
        let mut bytes = std::fs::read(&entry).unwrap();
        bytes.push(0);
        std::fs::write(&entry, &bytes).unwrap();
        let (_, h) = kernel_tables(c, dir, "a100_sxm", "bfloat16", "bfloat16").unwrap();
        assert_eq!(h, Hit::Built);
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

    #[test]
    fn data_folders_keep_an_entry_each_the_least_used_beyond_four_go_and_an_unfoldered_one_is_superseded(
    ) {
        let Some(src) = data() else { return };
        // the same GPU's data in two folders (two checkouts), read in turns
        let cache = tempfile::tempdir().unwrap();
        let c = Some(cache.path());
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        for root in [a.path(), b.path()] {
            copy_tree(&src.join("data/a100_sxm"), &root.join("data/a100_sxm"));
            std::fs::copy(src.join("a100_sxm.yaml"), root.join("a100_sxm.yaml")).unwrap();
        }
        // an entry of another kind, named as the format before folders did
        let other_kind = cache
            .path()
            .join(format!("moe-a100_sxm-bfloat16-{}.bin", "0".repeat(32)));
        std::fs::write(&other_kind, b"an earlier build's entry").unwrap();
        let load = |dir: &Path| {
            kernel_tables(c, dir, "a100_sxm", "bfloat16", "bfloat16")
                .unwrap()
                .1
        };
        assert_eq!(load(a.path()), Hit::Built);
        assert_eq!(load(b.path()), Hit::Built);
        // neither evicted the other's entry
        assert_eq!(load(a.path()), Hit::Cached);
        assert_eq!(load(b.path()), Hit::Cached);
        let names: Vec<String> = std::fs::read_dir(cache.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let kernels = names
            .iter()
            .filter(|n| n.starts_with("kernels-a100_sxm-bfloat16-bfloat16-"));
        assert_eq!(kernels.count(), 2, "{names:?}");
        // an entry of another kind is not this entry's to remove
        assert!(other_kind.exists(), "{names:?}");
        let unfoldered = cache.path().join(format!(
            "kernels-a100_sxm-bfloat16-bfloat16-{}.bin",
            "0".repeat(32)
        ));
        std::fs::write(&unfoldered, b"an earlier build's entry").unwrap();
        // entries of four folders that are gone, last used 1 to 4 days ago
        let day = std::time::Duration::from_secs(86_400);
        let gone: Vec<PathBuf> = (1..=4u64)
            .map(|d| {
                let p = cache.path().join(format!(
                    "kernels-a100_sxm-bfloat16-bfloat16-{:08x}-{}.bin",
                    d,
                    "0".repeat(32)
                ));
                std::fs::write(&p, b"a gone folder's entry").unwrap();
                let f = std::fs::File::options().append(true).open(&p).unwrap();
                let used = std::time::SystemTime::now() - day * u32::try_from(d).unwrap();
                f.set_modified(used).unwrap();
                p
            })
            .collect();
        // a source change in one folder rebuilds that folder's entry and
        // removes its superseded one and the unfoldered one, not the
        // other's; of the six left, the four used last stay
        let yaml = a.path().join("a100_sxm.yaml");
        let mut y = std::fs::read_to_string(&yaml).unwrap();
        y.push_str("\n# edited\n");
        std::fs::write(&yaml, y).unwrap();
        assert_eq!(load(a.path()), Hit::Built);
        assert!(!unfoldered.exists(), "the unfoldered entry is superseded");
        assert!(
            gone[0].exists() && gone[1].exists(),
            "used 1 and 2 days ago"
        );
        assert!(
            !gone[2].exists() && !gone[3].exists(),
            "used 3 and 4 days ago"
        );
        assert_eq!(load(b.path()), Hit::Cached);
        let kernels = std::fs::read_dir(cache.path())
            .unwrap()
            .filter(|e| {
                let n = e.as_ref().unwrap().file_name();
                n.to_string_lossy()
                    .starts_with("kernels-a100_sxm-bfloat16-bfloat16-")
            })
            .count();
        assert_eq!(kernels, ENTRIES_PER_TABLE);
        assert!(other_kind.exists(), "another kind's entry is not pruned");
    }
}
