//! Reading a user's input file (a scenario, a model or GPU file, a profile, a
//! measured report, a trace): only a regular file, and at most
//! [`MAX_INPUT_BYTES`], refused at once otherwise — so a device such as
//! `/dev/zero`, a FIFO or a folder ends in a clear error instead of reading
//! until memory runs out.

use std::io::{Error, ErrorKind, Read};
use std::path::Path;

/// Largest input file read whole, bytes (1 GiB): far above any scenario,
/// profile or report easerve writes (a 1,000,000-request `sim --json` report
/// is a few kB; `vllm bench serve --save-detailed` of 100,000 requests is
/// tens of MB).
pub const MAX_INPUT_BYTES: u64 = 1 << 30;

/// Check that `path` is a regular file of at most [`MAX_INPUT_BYTES`]; its size.
///
/// # Errors
/// The file cannot be examined (missing, no permission), it is not a regular
/// file, or it is larger than the limit (`ErrorKind::InvalidInput` for the
/// last two; the message says which).
pub fn check_regular(path: &Path) -> std::io::Result<u64> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        let what = if meta.is_dir() {
            "a folder"
        } else {
            "not a regular file (a device, FIFO or socket)"
        };
        return Err(Error::new(ErrorKind::InvalidInput, format!("it is {what}")));
    }
    if meta.len() > MAX_INPUT_BYTES {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "it is {} bytes, over the {} GiB limit of an input file",
                meta.len(),
                MAX_INPUT_BYTES >> 30
            ),
        ));
    }
    Ok(meta.len())
}

/// The text of the regular file at `path` ([`check_regular`]), read as UTF-8,
/// never more than [`MAX_INPUT_BYTES`] even if the file grows meanwhile.
///
/// # Errors
/// As [`check_regular`], and a read error or text that is not UTF-8.
pub fn read_text(path: &Path) -> std::io::Result<String> {
    let len = check_regular(path)?;
    let mut text = String::with_capacity(len as usize);
    std::fs::File::open(path)?
        .take(MAX_INPUT_BYTES)
        .read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_folders_are_refused_and_files_read() {
        let e = read_text(Path::new("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let e = read_text(dir.path()).unwrap_err();
        assert!(e.to_string().contains("folder"), "{e}");
        let f = dir.path().join("a.toml");
        std::fs::write(&f, "x = 1\n").unwrap();
        assert_eq!(read_text(&f).unwrap(), "x = 1\n");
    }
}
