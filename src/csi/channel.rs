//! A tonic [`Channel`] over a unix socket, the way CSI plugins and their
//! registration sockets are reached.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint};

/// Why a unix-socket channel could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// The socket could not be connected to (missing, refused, or the
    /// HTTP/2 handshake failed).
    #[error("connecting to {}: {cause}", path.display())]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// What tonic reported.
        cause: tonic::transport::Error,
    },
}

/// Connects a gRPC channel to the unix socket at `path`.
///
/// The URI is a placeholder that tonic requires and never dials: every
/// connection, including reconnects after the plugin restarts, goes to
/// `path`. Connects eagerly, so a missing socket is an error here and not
/// on the first call.
pub async fn connect_unix(path: impl AsRef<Path>) -> Result<Channel, ChannelError> {
    let path = path.as_ref().to_path_buf();
    let target = path.clone();
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let target = target.clone();
        async move {
            let stream = tokio::net::UnixStream::connect(target).await?;
            Ok::<_, std::io::Error>(TokioIo::new(stream))
        }
    });
    Endpoint::from_static("http://[::]:50051")
        .connect_with_connector(connector)
        .await
        .map_err(|cause| ChannelError::Connect { path, cause })
}
