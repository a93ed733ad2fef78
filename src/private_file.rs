//! Files laser writes that describe a process: recordings hold sampled register values and
//! stack words, reports and profiles hold run-time addresses (ASLR bases). They are created
//! readable by their owner only (0600), whatever the umask.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Creates (or truncates) `path` with mode 0600. An existing file gets 0600 too: truncating a
/// world-readable file and refilling it would otherwise keep its old mode.
pub fn create(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(file)
}

/// Writes `bytes` to a fresh 0600 file.
pub fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    io::Write::write_all(&mut create(path)?, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_owner_only_even_when_they_existed() {
        let dir = std::env::temp_dir().join(format!("laser-private-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("r.json");
        std::fs::write(&p, "old").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        write(&p, b"new").unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
