//! Test-data generators shared by unit tests and benchmarks: a tiny
//! deterministic xorshift generator and a builder of large, kubelet-shaped
//! mount tables (large fixtures are generated at test time, not
//! committed). Not part of volumed's API.

use std::fmt::Write as _;

/// xorshift64*: deterministic, dependency-free, good enough for test data.
#[derive(Debug, Clone)]
pub(crate) struct XorShift(u64);

impl XorShift {
    /// A generator from a seed (0 is replaced by a fixed non-zero value).
    pub(crate) fn new(seed: u64) -> Self {
        Self(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (`n` > 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// One random byte.
    pub(crate) fn byte(&mut self) -> u8 {
        self.next_u64().to_le_bytes()[0]
    }

    /// `len` random bytes.
    pub(crate) fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.byte()).collect()
    }

    /// A pod UID shaped like the API server's (a lowercase UUID).
    pub(crate) fn pod_uid(&mut self) -> String {
        let a = self.next_u64();
        let b = self.next_u64();
        format!(
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xffff,
            b >> 48,
            b & 0xffff_ffff_ffff
        )
    }
}

/// The kubelet root the generated tables use.
pub(crate) const GEN_ROOT: &str = "/var/lib/kubelet";

/// Builds a mountinfo table of exactly `lines` lines: a few host mounts, then
/// kubelet mounts cycling through local PV device mounts and their pod binds,
/// tmpfs emptyDirs, secret tmpfs mounts, CSI globalmounts and CSI pod mounts
/// (with quoted SELinux labels), all under [`GEN_ROOT`].
pub(crate) fn kubelet_table(lines: usize, seed: u64) -> Vec<u8> {
    let mut rng = XorShift::new(seed);
    let mut out = String::with_capacity(lines * 160);
    let host = [
        "1 0 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw",
        "2 1 0:5 / /proc rw,nosuid,nodev,noexec,relatime shared:2 - proc proc rw",
        "3 1 0:6 / /sys rw,nosuid,nodev,noexec,relatime shared:3 - sysfs sysfs rw,seclabel",
        "4 1 0:7 / /dev rw,nosuid shared:4 - devtmpfs devtmpfs rw,size=4096k,mode=755",
        "5 1 0:8 / /run rw,nosuid,nodev shared:5 - tmpfs tmpfs rw,mode=755",
    ];
    for l in host.iter().take(lines) {
        out.push_str(l);
        out.push('\n');
    }
    let mut pod = rng.pod_uid();
    for n in host.len()..lines {
        let id = n + 100;
        let k = n / 6;
        if n % 6 == 0 {
            pod = rng.pod_uid();
        }
        let pods = format!("{GEN_ROOT}/pods/{pod}/volumes");
        let minor = 1000 + k;
        let hash = format!("{:016x}{:016x}{:016x}{:016x}", k, seed, k * 7, n);
        let label = format!(
            "system_u:object_r:container_file_t:s0:c{},c{}",
            k % 512,
            512 + (k * 7) % 512
        );
        let line = match n % 6 {
            0 => format!(
                "{id} 1 7:{minor} / {GEN_ROOT}/plugins/kubernetes.io/local-volume/mounts/pv-{k} rw,relatime shared:{id} - ext4 /dev/loop{k} rw"
            ),
            1 => format!(
                "{id} 1 7:{minor} / {pods}/kubernetes.io~local-volume/pv-{k} rw,relatime shared:{} - ext4 /dev/loop{k} rw",
                id - 1
            ),
            2 => format!(
                "{id} 1 0:{minor} / {pods}/kubernetes.io~empty-dir/cache-{k} rw,relatime shared:{id} - tmpfs tmpfs rw,size={}k",
                1024 * (1 + rng.below(64))
            ),
            3 => format!(
                "{id} 1 0:{} / {pods}/kubernetes.io~secret/token-{k} rw,relatime shared:{id} - tmpfs tmpfs rw,size=4k",
                minor + 100_000
            ),
            4 => format!(
                "{id} 1 8:{minor} / {GEN_ROOT}/plugins/kubernetes.io/csi/csi.example.com/{hash}/globalmount rw,relatime shared:{id} - xfs /dev/sd{k} rw,seclabel,context=\"{label}\""
            ),
            _ => format!(
                "{id} 1 8:{minor} / {pods}/kubernetes.io~csi/pvc-{k}/mount rw,relatime master:{} - xfs /dev/sd{k} rw,seclabel,context=\"{label}\"",
                id - 1
            ),
        };
        // writing to a String cannot fail
        let _ = writeln!(out, "{line}");
    }
    out.into_bytes()
}
