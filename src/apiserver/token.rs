//! Service account tokens for projected volumes: the TokenRequest API
//! (`POST .../serviceaccounts/{sa}/token`, bound to the pod) and the
//! kubelet's token manager's rules (`pkg/kubelet/token`), re-stated:
//!
//! - a token is renewed once 80% of the lifetime *asked for* has passed,
//!   or it is older than 24 h, or the clock says it was issued in the
//!   future (a leap of the clock) — each less a small jitter, so a node's
//!   tokens do not all renew at once; the issue time is the expiry less
//!   the lifetime asked for;
//! - a renewal that fails keeps the old token while it is still valid
//!   (and says why in the log); with none, or an expired one, it is an
//!   error the volume shows.
//!
//! The clock is a seam ([`Clock`]) so the renewal is tested with a clock a
//! test moves. A token is a bearer credential: nothing here logs it, and
//! its `Debug` shows its length only.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::{Api, Client};

use crate::model::{IssuedToken, TokenRef};

/// The kubelet's cap on a token's age before it is renewed.
pub const MAX_TOKEN_AGE: Duration = Duration::from_secs(24 * 60 * 60);
/// The most a renewal is brought forward so tokens do not renew at once.
pub const MAX_JITTER: Duration = Duration::from_secs(10);

/// What time it is (wall-clock: a token's expiry is a wall-clock time).
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// now
    fn now(&self) -> SystemTime;
}

/// The system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// Why a token could not be had (never holds the token).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// the TokenRequest failed
    #[error("TokenRequest for service account {namespace}/{service_account}: {message}")]
    Request {
        /// the pod's namespace
        namespace: String,
        /// the service account
        service_account: String,
        /// the API server's or the connection's error
        message: String,
    },
    /// the answer held no token or no expiry
    #[error(
        "TokenRequest for service account {namespace}/{service_account}: the answer has no {missing}"
    )]
    Answer {
        /// the pod's namespace
        namespace: String,
        /// the service account
        service_account: String,
        /// what it lacked
        missing: &'static str,
    },
    /// the renewal failed and the token it had has expired
    #[error(
        "the token for service account {namespace}/{service_account} expired and its renewal failed: {message}"
    )]
    Expired {
        /// the pod's namespace
        namespace: String,
        /// the service account
        service_account: String,
        /// the renewal's error
        message: String,
    },
}

/// Asks the API server for the token `r` describes, bound to its pod.
pub async fn request_token(client: &Client, r: &TokenRef) -> Result<IssuedToken, TokenError> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &r.namespace);
    let req = TokenRequest {
        spec: Some(TokenRequestSpec {
            // none: the API server's own audience
            audiences: r.audience.clone().map(|a| vec![a]),
            expiration_seconds: Some(r.expiration_seconds),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(r.pod_name.clone()),
                uid: Some(r.pod_uid.clone()),
            }),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let answer = api
        .create_token_request(&r.service_account, &Default::default(), &req)
        .await
        .map_err(|e| TokenError::Request {
            namespace: r.namespace.clone(),
            service_account: r.service_account.clone(),
            message: e.to_string(),
        })?;
    let missing = |missing| TokenError::Answer {
        namespace: r.namespace.clone(),
        service_account: r.service_account.clone(),
        missing,
    };
    let status = answer.status.ok_or_else(|| missing("status"))?;
    let token = status
        .token
        .filter(|t| !t.is_empty())
        .ok_or_else(|| missing("token"))?;
    let expires = status
        .expiration_timestamp
        .ok_or_else(|| missing("expirationTimestamp"))?;
    Ok(IssuedToken {
        token,
        expires: SystemTime::from(expires.0),
        // the kubelet reckons from the spec the server answered (which it
        // may have changed), else from what it asked for
        expiration_seconds: answer
            .spec
            .and_then(|s| s.expiration_seconds)
            .unwrap_or(r.expiration_seconds),
    })
}

/// Whether `t` must be renewed at `now`: the kubelet's rule (module doc),
/// with `jitter` (at most [`MAX_JITTER`]) bringing each limit forward.
pub fn needs_refresh(t: &IssuedToken, now: SystemTime, jitter: Duration) -> bool {
    let issued = t.issued();
    let lifetime = Duration::from_secs(u64::try_from(t.expiration_seconds).unwrap_or(0));
    let too_old = issued + MAX_TOKEN_AGE.saturating_sub(jitter);
    let late = t
        .expires
        .checked_sub(lifetime / 5 + jitter)
        .unwrap_or(std::time::UNIX_EPOCH);
    now > too_old || now > late || now < issued
}

/// When `t` will need renewing (without jitter): what a keeper sleeps
/// toward.
pub fn refresh_due(t: &IssuedToken) -> SystemTime {
    let lifetime = Duration::from_secs(u64::try_from(t.expiration_seconds).unwrap_or(0));
    let late = t
        .expires
        .checked_sub(lifetime / 5)
        .unwrap_or(std::time::UNIX_EPOCH);
    late.min(t.issued() + MAX_TOKEN_AGE)
}

/// What one look at a token found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Polled {
    /// a new token (the first, or a renewal)
    Fresh(Arc<IssuedToken>),
    /// the one it had is still good (or its renewal failed while it is
    /// still valid: the error, for the log)
    Kept(Option<TokenError>),
    /// no valid token
    Failed(TokenError),
}

/// Keeps one pod's token: requests it, and renews it when the kubelet
/// would. One per [`TokenRef`] a pod's projected volume names.
#[derive(Debug)]
pub struct TokenKeeper {
    r: TokenRef,
    clock: Arc<dyn Clock>,
    jitter: Duration,
    current: Option<Arc<IssuedToken>>,
}

impl TokenKeeper {
    /// A keeper of `r`'s token with no token yet; `jitter` is capped at
    /// [`MAX_JITTER`].
    pub fn new(r: TokenRef, clock: Arc<dyn Clock>, jitter: Duration) -> Self {
        Self {
            r,
            clock,
            jitter: jitter.min(MAX_JITTER),
            current: None,
        }
    }

    /// Starts from `t`, a token issued before a restart and still in place
    /// in the pod's volume, when it needs no renewal now (the kubelet's
    /// rule, with this keeper's jitter): then no TokenRequest is sent until
    /// its renewal is due, and the payload it is in is not rewritten.
    /// Whether it was kept; a token already due is dropped, and the first
    /// [`TokenKeeper::poll`] requests a new one.
    pub fn seed(&mut self, t: IssuedToken) -> bool {
        let keep = !needs_refresh(&t, self.clock.now(), self.jitter);
        if keep {
            self.current = Some(Arc::new(t));
        }
        keep
    }

    /// The token it holds.
    pub fn current(&self) -> Option<&Arc<IssuedToken>> {
        self.current.as_ref()
    }

    /// Looks at the token: requests one when it has none or the one it has
    /// needs renewing.
    pub async fn poll(&mut self, client: &Client) -> Polled {
        let now = self.clock.now();
        if let Some(t) = &self.current
            && !needs_refresh(t, now, self.jitter)
        {
            return Polled::Kept(None);
        }
        match request_token(client, &self.r).await {
            Ok(t) => {
                let t = Arc::new(t);
                self.current = Some(t.clone());
                Polled::Fresh(t)
            }
            Err(e) => match &self.current {
                Some(t) if self.clock.now() <= t.expires => Polled::Kept(Some(e)),
                _ => {
                    let had = self.current.take().is_some();
                    Polled::Failed(match had {
                        true => TokenError::Expired {
                            namespace: self.r.namespace.clone(),
                            service_account: self.r.service_account.clone(),
                            message: e.to_string(),
                        },
                        false => e,
                    })
                }
            },
        }
    }

    /// How long to sleep before the next [`TokenKeeper::poll`]: until the
    /// renewal is due, between `least` and `most`.
    pub fn next_poll(&self, least: Duration, most: Duration) -> Duration {
        let Some(t) = &self.current else {
            return least;
        };
        let due = refresh_due(t)
            .checked_sub(self.jitter)
            .unwrap_or(std::time::UNIX_EPOCH);
        let wait = due.duration_since(self.clock.now()).unwrap_or_default();
        wait.clamp(least, most)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(issued_secs_ago: u64, lifetime: i64, now: SystemTime) -> IssuedToken {
        let issued = now - Duration::from_secs(issued_secs_ago);
        IssuedToken {
            token: "t".into(),
            expires: issued + Duration::from_secs(u64::try_from(lifetime).unwrap()),
            expiration_seconds: lifetime,
        }
    }

    #[test]
    fn the_kubelets_refresh_rule() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let day = 24 * 3600;
        // (age in seconds, lifetime asked for, jitter, renew?)
        let cases: &[(u64, i64, u64, bool)] = &[
            (0, 3600, 0, false),
            (2879, 3600, 0, false), // just under 80%
            (2880, 3600, 0, false), // exactly 80%: "after", not at
            (2881, 3600, 0, true),
            (2871, 3600, 10, true), // the jitter brings it forward
            (2869, 3600, 10, false),
            (479, 600, 0, false), // the least lifetime: 80% is 480 s
            (481, 600, 0, true),
            (day - 1, 7 * day as i64, 0, false), // long-lived: 24 h first
            (day + 1, 7 * day as i64, 0, true),
            (day - 5, 7 * day as i64, 10, true),
        ];
        for &(age, lifetime, jitter, want) in cases {
            let t = token(age, lifetime, now);
            let got = needs_refresh(&t, now, Duration::from_secs(jitter));
            assert_eq!(
                got, want,
                "age {age} s, lifetime {lifetime} s, jitter {jitter} s"
            );
        }
        // issued in the future: the clock leapt back
        let future = IssuedToken {
            expires: now + Duration::from_secs(3600 + 60),
            ..token(0, 3600, now)
        };
        assert!(needs_refresh(&future, now, Duration::ZERO));
    }

    #[test]
    fn the_refresh_is_due_at_80_percent_or_24_hours() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let t = token(0, 3600, now);
        assert_eq!(refresh_due(&t), now + Duration::from_secs(2880));
        let week = token(0, 7 * 24 * 3600, now);
        assert_eq!(refresh_due(&week), now + MAX_TOKEN_AGE);
    }

    /// A clock a test moves.
    #[derive(Debug)]
    struct FakeClock(std::sync::Mutex<SystemTime>);

    impl Clock for FakeClock {
        fn now(&self) -> SystemTime {
            *self.0.lock().unwrap()
        }
    }

    fn token_ref(expiration_seconds: i64) -> TokenRef {
        TokenRef {
            namespace: "ns".into(),
            service_account: "sa".into(),
            audience: None,
            expiration_seconds,
            pod_name: "p".into(),
            pod_uid: "u".into(),
        }
    }

    /// A token read back after a restart, with the expiry the journal
    /// recorded, is kept while its renewal is not due and dropped once it
    /// is (renewed by the first poll), by the same rule as a fresh one.
    #[test]
    fn a_token_kept_across_a_restart_is_kept_until_its_renewal_is_due() {
        let issued = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let exp = issued + Duration::from_secs(3600);
        let version = IssuedToken {
            token: String::new(),
            expires: exp,
            expiration_seconds: 3600,
        }
        .version();
        assert_eq!(version, "exp:1000003600");
        let read_back = |lifetime| IssuedToken::from_version("t".into(), &version, lifetime);
        assert_eq!(read_back(3600).map(|t| t.expires), Some(exp));
        for bad in ["1000003600", "exp:", "exp:soon", "rv:12"] {
            assert_eq!(
                IssuedToken::from_version("t".into(), bad, 3600),
                None,
                "{bad}"
            );
        }
        // (restarted after, lifetime asked for, jitter, kept?)
        let cases: &[(u64, i64, u64, bool)] = &[
            (5, 3600, 0, true),
            (2870, 3600, 0, true),
            (2880, 3600, 0, true),   // exactly 80%: not yet
            (2881, 3600, 0, false),  // due at the restart: renewed
            (2871, 3600, 10, false), // the jitter brings it forward
            (3700, 3600, 0, false),  // expired while down
            // the server answered a much shorter lifetime than the source
            // asks for (the journal keeps only the expiry): reckoned from
            // what is asked, 80% of it has passed, and it is renewed
            (5, 18_000, 0, false),
        ];
        for &(after, lifetime, jitter, want) in cases {
            let clock = Arc::new(FakeClock(std::sync::Mutex::new(
                issued + Duration::from_secs(after),
            )));
            let r = token_ref(lifetime);
            let mut keeper = TokenKeeper::new(r, clock.clone(), Duration::from_secs(jitter));
            let t = read_back(lifetime).unwrap();
            assert_eq!(
                keeper.seed(t),
                want,
                "{after} s after, {lifetime} s, jitter {jitter}"
            );
            assert_eq!(keeper.current().is_some(), want);
            if want {
                // the next look is when the renewal is due, not before
                let wait = keeper.next_poll(Duration::from_secs(1), Duration::from_secs(1 << 20));
                assert_eq!(wait, Duration::from_secs((2880 - jitter - after).max(1)));
                // and then it is due
                *clock.0.lock().unwrap() = issued + Duration::from_secs(2881);
                assert!(needs_refresh(
                    keeper.current().unwrap(),
                    clock.now(),
                    keeper.jitter
                ));
            }
        }
    }

    #[test]
    fn a_token_shows_no_bytes_in_debug() {
        let now = SystemTime::now();
        let t = IssuedToken {
            token: "eyJ-very-secret".into(),
            ..token(0, 3600, now)
        };
        let shown = format!("{t:?} {:?}", Polled::Fresh(Arc::new(t.clone())));
        assert!(!shown.contains("very-secret"), "{shown}");
    }
}
