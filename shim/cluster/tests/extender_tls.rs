//! The extender over TLS with client certificates, and its per-peer connection bound: only a
//! client with a certificate the configured CA signed gets an answer; one peer cannot hold
//! every connection. Certificates are made with `openssl` for each run.
#![expect(
    clippy::tests_outside_test_module,
    reason = "an integration-test crate is the test module"
)]

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use mqfq_cluster::extender::{Cache, Extender, router};
use mqfq_cluster::http::{Limits, serve};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

fn openssl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (scripts/deps.sh installs it)");
    assert!(
        o.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A CA (`<ca>.crt`, `<ca>.key`) in `dir`.
fn ca(dir: &Path, ca: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{ca}.key"),
            "-out",
            &format!("{ca}.crt"),
            "-days",
            "1",
            "-subj",
            &format!("/CN={ca}"),
        ],
    );
}

/// `<name>.crt` / `<name>.key` signed by `ca`, with these extensions.
fn leaf(dir: &Path, ca: &str, name: &str, ext: &str) {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={name}"),
        ],
    );
    std::fs::write(dir.join(format!("{name}.ext")), ext).unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.crt"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &format!("{name}.crt"),
            "-days",
            "1",
            "-extfile",
            &format!("{name}.ext"),
        ],
    );
}

fn certs(path: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// A client trusting `ca`, presenting `client` (a name in `dir`) if given.
fn connector(dir: &Path, client: Option<&str>) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    for c in certs(&dir.join("ca.crt")) {
        roots.add(c).unwrap();
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let b = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match client {
        Some(name) => b
            .with_client_auth_cert(
                certs(&dir.join(format!("{name}.crt"))),
                PrivateKeyDer::from_pem_file(dir.join(format!("{name}.key"))).unwrap(),
            )
            .unwrap(),
        None => b.with_no_client_auth(),
    };
    TlsConnector::from(Arc::new(config))
}

/// A filter request over TLS; the status line, or the error that ended it.
async fn filter(addr: std::net::SocketAddr, c: &TlsConnector) -> Result<String, String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let mut s = c.connect(name, tcp).await.map_err(|e| e.to_string())?;
    let body = br#"{"pod": {}, "nodenames": []}"#;
    let head = format!(
        "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(body).await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out))
        .await
        .expect("no answer within 30 s")
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out).into_owned();
    Ok(text.lines().next().unwrap_or_default().to_owned())
}

#[tokio::test]
async fn only_a_client_with_a_certificate_of_the_configured_ca_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ca(d, "ca");
    ca(d, "other");
    leaf(
        d,
        "ca",
        "server",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    );
    leaf(d, "ca", "scheduler", "extendedKeyUsage=clientAuth\n");
    leaf(d, "other", "stranger", "extendedKeyUsage=clientAuth\n");
    let tls = mqfq_cluster::tls::acceptor(
        &d.join("server.crt"),
        &d.join("server.key"),
        &d.join("ca.crt"),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let x = Arc::new(Extender::new(Arc::new(Cache::default()), 180.0));
    tokio::spawn(serve(listener, router(x), Limits::default(), Some(tls)));

    let ok = filter(addr, &connector(d, Some("scheduler"))).await;
    assert_eq!(ok.as_deref(), Ok("HTTP/1.1 200 OK"));
    // No certificate, or one another CA signed: refused in the handshake, never answered.
    for client in [None, Some("stranger")] {
        let r = filter(addr, &connector(d, client)).await;
        assert!(r.is_err(), "{client:?} was answered: {r:?}");
    }
    // The files are named when they are wrong.
    for ([cert, key, ca], named) in [
        (["nope.crt", "server.key", "ca.crt"], "--tls-cert"),
        (["server.crt", "server.key", "server.key"], "--client-ca"),
    ] {
        let e = mqfq_cluster::tls::acceptor(&d.join(cert), &d.join(key), &d.join(ca))
            .err()
            .unwrap();
        assert!(e.to_string().contains(named), "{e}");
    }
}

/// One peer holds at most `per_peer` connections: the next is closed at once, while those it
/// holds stay open (before, any one client could hold all 32).
#[tokio::test]
async fn one_peer_cannot_hold_every_connection() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let x = Arc::new(Extender::new(Arc::new(Cache::default()), 180.0));
    let limits = Limits {
        per_peer: 2,
        header: Duration::from_secs(60),
        ..Limits::default()
    };
    tokio::spawn(serve(listener, router(x), limits, None));
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        held.push(s);
    }
    let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut out = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(30), third.read_to_end(&mut out))
        .await
        .expect("the third connection was kept")
        .unwrap_or(0);
    assert_eq!(n, 0, "{}", String::from_utf8_lossy(&out));
    // The two it holds are still served: finishing a request gets its answer.
    for mut s in held {
        s.write_all(b"Connection: close\r\n\r\n").await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out))
            .await
            .unwrap()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200"),
            "{out:?}"
        );
    }
}
