//! Serving the extender's HTTP API with bounds a hostile client cannot lift: at most
//! [`Limits::connections`] connections at once (the next waits in the listen backlog), each
//! with a 16 KiB read buffer, closed when idle or sending headers for [`Limits::header`], and
//! closed gracefully after [`Limits::lifetime`] (its request in progress answered first), so
//! idle, trickling or non-reading connections cannot hold every slot for long. A client that
//! never reads its answers holds at most one answer (at most the body's size, [`MAX_BODY`])
//! per connection until then: the connection cap is sized so that this, with every request
//! slot parsing at once, stays well inside the extender's 256 MiB. The body's own bound is the
//! handler's ([`crate::extender::Extender::body_timeout`]).
//!
//! [`MAX_BODY`]: crate::extender::MAX_BODY
//!
//! `axum::serve` sets none of these (hyper has no header timer without one given), hence this
//! accept loop over hyper's HTTP/1 server.
//!
//! Each peer address holds at most [`Limits::per_peer`] connections (the next is closed at once),
//! so one client — a pod on the cluster network — cannot take them all. With TLS
//! ([`crate::tls`]) a connection is served only once its handshake is done, within
//! [`Limits::handshake`], at most [`Limits::handshakes`] of them at once.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

/// The read buffer of a connection: kube-scheduler's request headers are a few hundred bytes
/// (hyper's default lets one grow to about 400 KiB).
const READ_BUFFER: usize = 16 << 10;

/// What one client may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once.
    pub connections: usize,
    /// Connections one peer address may hold at once (handshaking or served).
    pub per_peer: usize,
    /// TLS handshakes in progress at once (past it a new connection is closed at once). A
    /// connection takes one of [`Limits::connections`] only once its handshake is done, so
    /// clients that never finish theirs cannot hold the served ones.
    pub handshakes: usize,
    /// How long a TLS handshake may take.
    pub handshake: Duration,
    /// Time to send a request's headers, and the most a connection may sit idle between
    /// requests (hyper's header timer runs from when it waits for the next request).
    pub header: Duration,
    /// A connection is closed (gracefully) after this long.
    pub lifetime: Duration,
    /// Once closing, how long its request in progress may still take.
    pub drain: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 32,
            per_peer: 8,
            handshakes: 16,
            handshake: Duration::from_secs(2),
            header: Duration::from_secs(5),
            lifetime: Duration::from_secs(30),
            drain: Duration::from_secs(10),
        }
    }
}

/// Serves `app` on `listener` under `limits`, for ever; over TLS with `tls`.
///
/// # Errors
/// Never in practice: the connection semaphore is never closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    tls: Option<TlsAcceptor>,
) -> std::io::Result<()> {
    let open = Arc::new(Semaphore::new(limits.connections.max(1)));
    let handshakes = Arc::new(Semaphore::new(limits.handshakes.max(1)));
    let peers: Arc<Mutex<HashMap<IpAddr, usize>>> = Arc::default();
    loop {
        // Plain HTTP: a connection slot before accepting (the next waits in the backlog). TLS:
        // one once the handshake is done.
        let permit = match tls {
            None => Some(
                open.clone()
                    .acquire_owned()
                    .await
                    .map_err(std::io::Error::other)?,
            ),
            Some(_) => None,
        };
        let (stream, addr) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors, say: wait rather than spin.
                tracing::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(peer) = PeerSlot::take(&peers, addr.ip(), limits.per_peer) else {
            tracing::debug!(peer = %addr.ip(), "extender: too many connections from one peer; closed");
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        match (&tls, permit) {
            (None, permit) => {
                tokio::spawn(async move {
                    connection(stream, service, limits).await;
                    drop((peer, permit));
                });
            }
            (Some(tls), _) => {
                let Ok(shaking) = handshakes.clone().try_acquire_owned() else {
                    tracing::debug!(peer = %addr.ip(), "extender: too many TLS handshakes at once; closed");
                    continue;
                };
                let (tls, open) = (tls.clone(), open.clone());
                tokio::spawn(async move {
                    let shaken = tokio::time::timeout(limits.handshake, tls.accept(stream)).await;
                    drop(shaking);
                    let s = match shaken {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(peer = %addr.ip(), "extender: TLS handshake refused: {e}");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(peer = %addr.ip(), "extender: TLS handshake too slow");
                            return;
                        }
                    };
                    let Ok(permit) = open.acquire_owned().await else {
                        return;
                    };
                    connection(s, service, limits).await;
                    drop((peer, permit));
                });
            }
        }
    }
}

/// One connection, HTTP/1 under `limits`.
async fn connection<IO>(io: IO, service: TowerToHyperService<Router>, limits: Limits)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header)
        .max_buf_size(READ_BUFFER)
        .serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let done = tokio::select! {
        r = conn.as_mut() => Some(r),
        () = tokio::time::sleep(limits.lifetime) => None,
    };
    let r = match done {
        Some(r) => r,
        None => {
            conn.as_mut().graceful_shutdown();
            tokio::time::timeout(limits.drain, conn)
                .await
                .unwrap_or(Ok(()))
        }
    };
    if let Err(e) = r {
        tracing::debug!("extender connection: {e}");
    }
}

/// A connection counted against its peer's address while it lives.
struct PeerSlot {
    peers: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl PeerSlot {
    fn take(peers: &Arc<Mutex<HashMap<IpAddr, usize>>>, ip: IpAddr, most: usize) -> Option<Self> {
        let mut m = peers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = m.entry(ip).or_default();
        if *n >= most.max(1) {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            peers: peers.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut m = self
            .peers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = m.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}
