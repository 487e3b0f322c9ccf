//! The node table: which backing inode each FUSE node id stands for.
//!
//! Each node holds an `O_PATH` descriptor of its backing file, so a rename
//! (of the file or of a directory above it) needs no bookkeeping: the
//! descriptor follows the inode. A node is keyed by the backing file's
//! `(st_dev, st_ino)`, so every lookup of one file answers the same node id
//! for as long as the kernel remembers it. The kernel needs that for a
//! unix socket: a bound socket is found by the kernel's inode, which FUSE
//! finds by node id, so a second id for `api.sock` would refuse every
//! connection. The held descriptor also keeps an unlinked inode allocated,
//! so the backing filesystem cannot hand its number to a new file while
//! the kernel still knows the old one.
//!
//! Lookup counts follow the FUSE protocol: every entry the filesystem
//! answers (lookup, create, mknod, mkdir) counts one, `forget` takes its
//! count back, and the node goes at zero. The root is never forgotten.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, PoisonError};

use fuser::INodeNo;
use nix::errno::Errno;

/// One node: its backing `O_PATH` descriptor, key and lookup count.
struct Node {
    fd: Arc<OwnedFd>,
    key: (u64, u64),
    lookups: u64,
}

#[derive(Default)]
struct Table {
    by_id: HashMap<u64, Node>,
    by_key: HashMap<(u64, u64), u64>,
    next_id: u64,
}

/// The node table (shared by the session's threads).
pub struct Nodes {
    table: Mutex<Table>,
}

impl Nodes {
    /// A table holding the root, node 1, on `root` (an `O_PATH` descriptor
    /// of the backing dir).
    pub fn new(root: OwnedFd, key: (u64, u64)) -> Nodes {
        let mut table = Table {
            next_id: INodeNo::ROOT.0 + 1,
            ..Table::default()
        };
        table.by_id.insert(
            INodeNo::ROOT.0,
            Node {
                fd: Arc::new(root),
                key,
                lookups: 1,
            },
        );
        table.by_key.insert(key, INodeNo::ROOT.0);
        Nodes {
            table: Mutex::new(table),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // a panicking handler leaves the table consistent (every change
        // below is one insert or remove): go on serving
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The backing descriptor of node `ino` (ESTALE: the kernel asked for
    /// a node it had forgotten).
    pub fn fd(&self, ino: INodeNo) -> Result<Arc<OwnedFd>, Errno> {
        self.lock()
            .by_id
            .get(&ino.0)
            .map(|n| Arc::clone(&n.fd))
            .ok_or(Errno::ESTALE)
    }

    /// The node for the backing file `fd` with `key`, its lookup count
    /// raised by one: the existing node of that file if there is one (then
    /// `fd` is dropped), else a new one.
    pub fn remember(&self, fd: OwnedFd, key: (u64, u64)) -> INodeNo {
        let mut t = self.lock();
        if let Some(&id) = t.by_key.get(&key)
            && let Some(node) = t.by_id.get_mut(&id)
        {
            node.lookups += 1;
            return INodeNo(id);
        }
        let id = t.next_id;
        t.next_id += 1;
        t.by_id.insert(
            id,
            Node {
                fd: Arc::new(fd),
                key,
                lookups: 1,
            },
        );
        t.by_key.insert(key, id);
        INodeNo(id)
    }

    /// The kernel forgets `n` lookups of node `ino`.
    pub fn forget(&self, ino: INodeNo, n: u64) {
        if ino == INodeNo::ROOT {
            return;
        }
        let mut t = self.lock();
        let Some(node) = t.by_id.get_mut(&ino.0) else {
            return;
        };
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups == 0 {
            let key = node.key;
            t.by_id.remove(&ino.0);
            t.by_key.remove(&key);
        }
    }

    /// How many nodes are known, the root included.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().by_id.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fd() -> OwnedFd {
        std::fs::File::open("/").unwrap().into()
    }

    #[test]
    fn one_file_keeps_one_id_until_every_lookup_is_forgotten() {
        let nodes = Nodes::new(fd(), (1, 2));
        let a = nodes.remember(fd(), (1, 10));
        let again = nodes.remember(fd(), (1, 10));
        let b = nodes.remember(fd(), (1, 11));
        assert_eq!(a, again, "a second lookup of one file answers its node");
        assert_ne!(a, b);
        assert_ne!(a, INodeNo::ROOT);
        assert_eq!(nodes.len(), 3);
        nodes.forget(a, 1);
        assert!(nodes.fd(a).is_ok(), "one lookup is still held");
        nodes.forget(a, 1);
        assert_eq!(nodes.fd(a).err(), Some(Errno::ESTALE));
        let c = nodes.remember(fd(), (1, 10));
        assert_ne!(c, a, "a forgotten node's id is not handed out again");
        assert_eq!(nodes.len(), 3);
    }

    #[test]
    fn the_root_is_never_forgotten_and_its_key_answers_the_root() {
        let nodes = Nodes::new(fd(), (1, 2));
        nodes.forget(INodeNo::ROOT, 100);
        assert!(nodes.fd(INodeNo::ROOT).is_ok());
        assert_eq!(nodes.remember(fd(), (1, 2)), INodeNo::ROOT);
    }

    #[test]
    fn forgetting_more_than_was_looked_up_or_an_unknown_node_is_harmless() {
        let nodes = Nodes::new(fd(), (1, 2));
        let a = nodes.remember(fd(), (1, 10));
        nodes.forget(a, 5);
        nodes.forget(a, 1);
        nodes.forget(INodeNo(999), 1);
        assert_eq!(nodes.len(), 1);
    }
}
