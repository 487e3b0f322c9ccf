//! Service account tokens kept across a restart. The journal records a
//! token's version as its expiry (`exp:<unix s>`), never its bytes; the
//! token itself is still in the pod's projected volume, a tmpfs only a
//! reboot clears. So that a restart neither asks the API server for every
//! token again nor rewrites every projected payload (the kubelet does
//! both), a token's keeper starts from the token in place when all of
//! these hold, and else asks as on a first start:
//!
//! - the journal's last payload of the volume names exactly one token of
//!   the service account the keeper's ref names (two, for two audiences,
//!   would not say which file is which);
//! - `..data` points to the dir named after that payload's hash: the
//!   payload the journal recorded is the one in place (a payload dir is
//!   written whole before `..data` is swapped to it);
//! - the file at the token source's path in that dir is a regular file,
//!   read beneath the root dir through [`Sys::read_file_beneath`]: no
//!   symlink followed, `..data` read as a link and never resolved, every
//!   name a plain component, so nothing outside the pod dir is read;
//! - every volume of the pod holding that token holds the same one;
//! - the keeper's renewal rule says it is not due yet
//!   ([`crate::apiserver::token::TokenKeeper::seed`]): one already due is
//!   renewed at once, as usual.
//!
//! The journal is read once, at startup, before the API source starts its
//! keepers; each volume's entry is used once. The bytes go from the file to
//! the keeper and the API store only, never to a log.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use crate::host::sys::{Beneath, Sys, SysError};
use crate::journal::Journal;
use crate::model::{
    IssuedToken, Layout, PAYLOAD_DATA_LINK, PayloadVersion, PluginName, PodUid, TOKEN_OBJECT_KIND,
    TokenRef,
};

/// The most a token file read back may hold (a JWT is a few KiB).
const MAX_TOKEN_BYTES: u64 = 1 << 20;

/// The tokens a restart may keep: the journal's payloads with a token.
pub(in crate::daemon) struct TokenSeeds {
    layout: Layout,
    sys: Arc<dyn Sys>,
    /// the payload each pod target holding a token was last written with,
    /// by volume dir
    journaled: BTreeMap<PathBuf, Arc<PayloadVersion>>,
}

impl TokenSeeds {
    /// The journal's payloads with a token (none without a journal).
    pub(in crate::daemon) fn from_journal(
        journal: Option<&Journal>,
        layout: &Layout,
        sys: Arc<dyn Sys>,
    ) -> Self {
        let journaled = journal.map_or_else(BTreeMap::new, |j| {
            j.with_state(|s| {
                s.entries()
                    .filter_map(|(_, e)| {
                        let p = e.current_params();
                        let v = p.payload()?;
                        let token = v.objects.iter().any(|o| o.kind == TOKEN_OBJECT_KIND);
                        let dir = p.pod_mount_path.as_deref()?;
                        token.then(|| (dir.to_owned(), v.clone()))
                    })
                    .collect()
            })
        });
        Self {
            layout: layout.clone(),
            sys,
            journaled,
        }
    }

    /// The token `r` names as it is in place in its pod's projected
    /// volumes (`paths`: each volume's name and the token's path in it),
    /// if the module doc's conditions but the last hold. Each volume's
    /// journal entry is used once.
    pub(super) fn take(&mut self, r: &TokenRef, paths: &[(String, String)]) -> Option<IssuedToken> {
        let pod = PodUid::new(&r.pod_uid).ok()?;
        let mut found: Option<(String, String)> = None;
        let mut unsure = false;
        for (volume, path) in paths {
            let dir = self
                .layout
                .pod_volume_dir(&pod, PluginName::Projected, volume);
            // a volume the journal never wrote is written with whatever
            // token the keeper has
            let Some(v) = self.journaled.remove(&dir) else {
                continue;
            };
            match self.in_place(&dir, path, &v, r) {
                Some(one) if found.as_ref().is_none_or(|f| *f == one) => found = Some(one),
                _ => unsure = true,
            }
        }
        let (token, version) = found.filter(|_| !unsure)?;
        IssuedToken::from_version(token, &version, r.expiration_seconds)
    }

    /// The token at `path` in the payload dir `v` says is in place in
    /// `dir`, and its journaled version.
    fn in_place(
        &self,
        dir: &Path,
        path: &str,
        v: &PayloadVersion,
        r: &TokenRef,
    ) -> Option<(String, String)> {
        let mut tokens = v.objects.iter().filter(|o| {
            o.kind == TOKEN_OBJECT_KIND && o.namespace == r.namespace && o.name == r.service_account
        });
        let version = tokens.next()?.resource_version.clone();
        if tokens.next().is_some() {
            return None;
        }
        let root = self.layout.root();
        let link = dir.join(PAYLOAD_DATA_LINK);
        let data = self
            .sys
            .read_link_beneath(Beneath::split(root, &link)?)
            .map_err(not_read)
            .ok()?;
        let name = match data.components().collect::<Vec<_>>()[..] {
            [Component::Normal(n)] => n.to_owned(),
            _ => return None,
        };
        if !crate::plugins::payload::atomic::named_for(&name, &v.hash) {
            return None;
        }
        let file = dir.join(name).join(path);
        let bytes = self
            .sys
            .read_file_beneath(Beneath::split(root, &file)?, MAX_TOKEN_BYTES)
            .map_err(not_read)
            .ok()?;
        let token = String::from_utf8(bytes).ok().filter(|t| !t.is_empty())?;
        Some((token, version))
    }
}

/// A token that could not be read back is requested again; the error
/// names the path, never a byte of the file.
fn not_read(e: SysError) {
    tracing::debug!(error = %e, "a token in place not read back; a new one is requested");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::recording_sys::RecordingSys;
    use crate::host::sys::FileKind;
    use crate::model::ObjectVersion;

    const HASH: &str = "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789";
    const UID: &str = "pod-1";

    fn r() -> TokenRef {
        TokenRef {
            namespace: "ns".into(),
            service_account: "sa".into(),
            audience: None,
            expiration_seconds: 3600,
            pod_name: "p".into(),
            pod_uid: UID.into(),
        }
    }

    fn version(tokens: &[&str]) -> Arc<PayloadVersion> {
        let objects = tokens
            .iter()
            .map(|exp| ObjectVersion {
                kind: TOKEN_OBJECT_KIND.into(),
                namespace: "ns".into(),
                name: "sa".into(),
                uid: String::new(),
                resource_version: (*exp).into(),
            })
            .collect();
        Arc::new(PayloadVersion {
            hash: HASH.into(),
            objects,
        })
    }

    /// A node with the volume `vol` in place: `..data` → the payload dir
    /// named after [`HASH`], the token file in it.
    fn node(vols: &[(&str, &str)]) -> (Arc<RecordingSys>, TokenSeeds) {
        let sys = Arc::new(RecordingSys::new());
        let layout = Layout::new("/r");
        let mut journaled = BTreeMap::new();
        for (vol, token) in vols {
            let dir = layout.pod_volume_dir(&PodUid::new(UID).unwrap(), PluginName::Projected, vol);
            let payload = format!("..2026_01_01_00_00_00.000000000.{}", &HASH[..12]);
            sys.add_file(dir.join(&payload).join("token"), *token);
            sys.symlink_beneath(
                Beneath::split(Path::new("/r"), &dir.join(PAYLOAD_DATA_LINK)).unwrap(),
                Path::new(&payload),
            )
            .unwrap();
            journaled.insert(dir, version(&["exp:1900000000"]));
        }
        let seeds = TokenSeeds {
            layout,
            sys: sys.clone(),
            journaled,
        };
        (sys, seeds)
    }

    fn paths(vols: &[&str]) -> Vec<(String, String)> {
        vols.iter()
            .map(|v| ((*v).to_owned(), "token".to_owned()))
            .collect()
    }

    #[test]
    fn the_token_in_place_is_read_back_with_its_journaled_expiry_once() {
        let (_, mut seeds) = node(&[("a", "tok"), ("b", "tok")]);
        let t = seeds.take(&r(), &paths(&["a", "b"])).unwrap();
        assert_eq!(t.token, "tok");
        assert_eq!(t.version(), "exp:1900000000");
        assert_eq!(t.expiration_seconds, 3600);
        assert_eq!(seeds.take(&r(), &paths(&["a", "b"])), None, "used once");
    }

    #[test]
    fn a_token_the_journal_does_not_vouch_for_is_not_read_back() {
        let dir = |v: &str| format!("/r/pods/{UID}/volumes/kubernetes.io~projected/{v}");
        // two volumes that disagree
        let (_, mut seeds) = node(&[("a", "tok"), ("b", "other")]);
        assert_eq!(seeds.take(&r(), &paths(&["a", "b"])), None);
        // another account's token, or two of this one's
        let (_, mut seeds) = node(&[("a", "tok")]);
        let other = TokenRef {
            service_account: "other".into(),
            ..r()
        };
        assert_eq!(seeds.take(&other, &paths(&["a"])), None);
        let (_, mut seeds) = node(&[("a", "tok")]);
        seeds
            .journaled
            .insert(dir("a").into(), version(&["exp:1", "exp:2"]));
        assert_eq!(seeds.take(&r(), &paths(&["a"])), None);
        // `..data` to a dir of another hash (a write cut before its swap
        // journaled a payload not in place)
        let (_, mut seeds) = node(&[("a", "tok")]);
        let mut v = (*version(&["exp:1900000000"])).clone();
        v.hash = "0".repeat(64);
        seeds.journaled.insert(dir("a").into(), Arc::new(v));
        assert_eq!(seeds.take(&r(), &paths(&["a"])), None);
        // the token file a symlink, or a path that leaves the volume
        let (sys, mut seeds) = node(&[("a", "tok")]);
        let payload = format!(
            "{}/..2026_01_01_00_00_00.000000000.{}",
            dir("a"),
            &HASH[..12]
        );
        sys.add(format!("{payload}/link"), FileKind::Symlink);
        let link = vec![("a".to_owned(), "link".to_owned())];
        assert_eq!(seeds.take(&r(), &link), None);
        let (_, mut seeds) = node(&[("a", "tok")]);
        let out = vec![("a".to_owned(), "../../../x/token".to_owned())];
        assert_eq!(seeds.take(&r(), &out), None);
        // no journal entry: nothing to vouch
        let (_, mut seeds) = node(&[]);
        assert_eq!(seeds.take(&r(), &paths(&["a"])), None);
    }
}
