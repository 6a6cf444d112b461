//! `easerve serve`'s socket: its own accept loop over hyper's HTTP/1
//! connections, with the limits `axum::serve` does not offer.
//!
//! * a **header read timeout**: a connection whose request headers have not
//!   all come within [`SocketLimits::header_timeout`] is closed (slowloris);
//!   hyper's own default is 30 s once a timer is set
//!   (`hyper::server::conn::http1::Builder::header_read_timeout`), and so is
//!   ours. It also bounds how long a kept-alive connection may sit idle.
//! * a **body read timeout**: the body of a chat request must be received
//!   whole within [`SocketLimits::body_timeout`] of its headers, else a 408
//!   (`serve.rs`); default 60 s, nginx's `client_body_timeout`.
//! * a **cap on connections open at once** ([`SocketLimits::max_connections`]):
//!   one more is answered `503` and closed at once, as uvicorn's
//!   `--limit-concurrency` answers. Its default is what the process's
//!   open-file limit leaves ([`default_max_connections`]): beyond it,
//!   `accept` would fail anyway.
//!
//! Each connection runs on its own task; on shutdown the loop stops
//! accepting and every open connection is told to close after the request it
//! serves (hyper-util's graceful shutdown).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// hyper's header read timeout once a timer is set, seconds.
pub const DEFAULT_HEADER_TIMEOUT_S: f64 = 30.0;
/// nginx's `client_body_timeout` default, seconds.
pub const DEFAULT_BODY_TIMEOUT_S: f64 = 60.0;

/// Descriptors the server keeps for itself besides its connections: stdin,
/// stdout and stderr, the listener, the tokio runtime's own (an epoll and
/// an eventfd), and per worker process its socket and its two pipes.
pub fn reserved_descriptors(worker_processes: u32) -> u64 {
    6 + 3 * u64::from(worker_processes)
}

/// The default cap on connections: the process's soft open-file limit
/// (`RLIMIT_NOFILE`) less [`reserved_descriptors`]; at least 1. `None`
/// where the limit cannot be read or is unlimited.
pub fn default_max_connections(worker_processes: u32) -> Option<usize> {
    #[cfg(unix)]
    {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit into the struct we own
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
        if !ok || lim.rlim_cur == libc::RLIM_INFINITY {
            return None;
        }
        // rlim_t is u64 on Linux, not on every unix
        #[allow(clippy::unnecessary_cast)]
        let cur = lim.rlim_cur as u64;
        let left = cur.saturating_sub(reserved_descriptors(worker_processes));
        Some(usize::try_from(left.max(1)).unwrap_or(usize::MAX))
    }
    #[cfg(not(unix))]
    {
        let _ = worker_processes;
        None
    }
}

/// What the socket allows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SocketLimits {
    /// A request's headers must all come within this.
    pub header_timeout: Duration,
    /// A chat request's body must all come within this after its headers.
    pub body_timeout: Duration,
    /// Connections open at once; `None`: no cap.
    pub max_connections: Option<usize>,
}

impl Default for SocketLimits {
    fn default() -> Self {
        SocketLimits {
            header_timeout: Duration::from_secs_f64(DEFAULT_HEADER_TIMEOUT_S),
            body_timeout: Duration::from_secs_f64(DEFAULT_BODY_TIMEOUT_S),
            max_connections: None,
        }
    }
}

/// The answer to a connection over the cap, before its request is read.
const OVER_CAP: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 123\r\n\r\n{\"error\":{\"message\":\"too many connections are open; retry later\",\"type\":\"ServiceUnavailableError\",\"param\":null,\"code\":503}}";

/// Serve `router` on `listener` within `limits` until `stop` resolves, then
/// let the open connections finish the requests they serve.
pub async fn serve_http(
    listener: TcpListener,
    router: Router,
    limits: SocketLimits,
    stop: impl std::future::Future<Output = ()>,
) {
    let permits = limits
        .max_connections
        .map(|n| Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS))));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    tokio::pin!(stop);
    loop {
        let (stream, _) = tokio::select! {
            conn = listener.accept() => match conn {
                Ok(c) => c,
                // out of descriptors or a connection reset before accept:
                // wait a little rather than spin
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let permit = match &permits {
            Some(p) => match p.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    tokio::spawn(refuse(stream));
                    continue;
                }
            },
            None => None,
        };
        let service = TowerToHyperService::new(router.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            // a connection's errors (a reset, a header timeout) end it alone
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Answer a connection over the cap with a 503 and close it, giving the
/// client a moment to take the answer.
async fn refuse(mut stream: tokio::net::TcpStream) {
    let write = async {
        let _ = stream.write_all(OVER_CAP).await;
        let _ = stream.shutdown().await;
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_is_a_whole_http_response() {
        let text = std::str::from_utf8(OVER_CAP).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], 503);
    }

    #[test]
    fn the_default_cap_leaves_the_servers_own_descriptors() {
        if let Some(n) = default_max_connections(4) {
            assert!(n >= 1);
            assert_eq!(reserved_descriptors(4), 18);
        }
    }
}
