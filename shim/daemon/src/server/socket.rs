//! mqfqd's socket: only root may reach it (a shim's Admit is trusted to name its containers).

use std::path::Path;

/// Binds the socket: its directory made if missing (mode 0700) and refused if others can write
/// it (they could swap the socket), a stale socket replaced, a live one (another mqfqd) refused;
/// the socket is made mode 0600 (and the daemon's umask already makes it private from the
/// start).
///
/// # Errors
/// Another daemon listens there, the directory is not safe, or the filesystem refuses.
pub fn bind(path: &Path) -> std::io::Result<ttrpc::r#async::Server> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let md = std::fs::metadata(dir)?;
        // SAFETY: geteuid has no arguments and cannot fail.
        let me = unsafe { libc::geteuid() };
        if md.uid() != me || md.mode() & 0o022 != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "{}: the socket's directory must be owned by uid {me} and writable by nobody else (mode {:o})",
                    dir.display(),
                    md.mode() & 0o7777
                ),
            ));
        }
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("{} is served by a running mqfqd", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let server = ttrpc::r#async::Server::new()
        .bind(&format!("unix://{}", path.display()))
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(server)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_socket_goes_only_into_a_directory_nobody_else_can_write() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let open = t.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = bind(&open.join("mqfqd.sock")).err().unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
        let made = t.path().join("made/here");
        let _server = bind(&made.join("mqfqd.sock")).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&made), 0o700);
        assert_eq!(mode(&made.join("mqfqd.sock")), 0o600);
    }
}
