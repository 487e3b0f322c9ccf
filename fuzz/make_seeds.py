#!/usr/bin/env python3
"""Writes the committed seed corpora under fuzz/seeds/<target>/.

Text seeds are the repo's own fixtures (mount tables, manifests) plus a few
small manifests in the shapes the sources read; binary seeds (journal
values, protobuf answers) are built here from the golden journal records in
fixtures/journal/ and by hand-encoding the few protobuf fields volumed reads.
Run it from fuzz/ after a fixture or a format changes; the output is
deterministic.
"""
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SEEDS = os.path.join(HERE, "seeds")


def put(target, name, data):
    d = os.path.join(SEEDS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def copy(target, src):
    put(target, os.path.basename(src), open(os.path.join(ROOT, src), "rb").read())


# --- mount tables -----------------------------------------------------------
for f in sorted(os.listdir(os.path.join(ROOT, "fixtures/mountinfo"))):
    if f.endswith(".txt"):
        copy("mountinfo", "fixtures/mountinfo/" + f)

# --- manifests --------------------------------------------------------------
for f in ["fixtures/pods/emptydirs.yaml", "fixtures/pods/hostpath.json",
          "fixtures/pods-local-pv/local-pv-pod.yaml"]:
    copy("pod_manifest", f)
put("pod_manifest", "csi-inline-and-claim.yaml", """\
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ns1, uid: 0b0b0b0b-1111-2222-3333-444444444444}
spec:
  securityContext: {fsGroup: 2000, seLinuxOptions: {level: "s0:c1,c2"}}
  containers: [{name: c, image: i, securityContext: {seLinuxOptions: {type: container_t}}}]
  volumes:
  - name: inline
    csi: {driver: d.example.com, readOnly: true, volumeAttributes: {size: 1Gi}, nodePublishSecretRef: {name: s}}
  - name: data
    persistentVolumeClaim: {claimName: pvc1}
  - name: host
    hostPath: {path: /srv/data, type: DirectoryOrCreate}
  - name: mem
    emptyDir: {medium: Memory, sizeLimit: 1Gi}
""")

copy("static_objects", "fixtures/objects/local-pv.yaml")
put("static_objects", "csi-pv-pvc.yaml", """\
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv-csi}
spec:
  accessModes: [ReadWriteMany]
  claimRef: {namespace: default, name: pvc1}
  mountOptions: [noatime]
  csi:
    driver: d.example.com
    volumeHandle: vol-1
    fsType: ext4
    readOnly: true
    volumeAttributes: {a: b}
    nodeStageSecretRef: {name: stage, namespace: ns1}
    nodePublishSecretRef: {name: pub}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: pvc1, uid: 1234}
spec: {volumeName: pv-csi}
""")
put("static_objects", "driver-attachment-secret.yaml", """\
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: d.example.com}
spec: {attachRequired: true, seLinuxMount: true, requiresRepublish: true, volumeLifecycleModes: [Persistent, Ephemeral], fsGroupPolicy: File}
---
apiVersion: storage.k8s.io/v1
kind: VolumeAttachment
metadata: {name: csi-abc}
spec:
  attacher: d.example.com
  nodeName: node-1
  source: {persistentVolumeName: pv-csi}
status:
  attached: true
  attachmentMetadata: {lun: '3'}
---
apiVersion: v1
kind: Secret
metadata: {name: stage, namespace: ns1}
data: {password: aHVudGVyMg==}
stringData: {user: admin}
""")
put("static_objects", "list.json", """\
{"apiVersion": "v1", "kind": "List", "items": [
 {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv1"},
  "spec": {"accessModes": ["ReadWriteOnce"], "local": {"path": "/mnt/disk1", "fsType": "ext4"},
           "claimRef": {"namespace": "default", "name": "pvc1"}}},
 {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "pvc1"},
  "spec": {"volumeName": "pv1"}}]}
""")

# --- vol_data.json ----------------------------------------------------------
put("vol_data", "globalmount.json",
    '{"driverName":"d.example.com","volumeHandle":"vol-1","specVolID":"pv-csi",'
    '"attachmentID":"csi-abc","nodeName":"node-1","volumeLifecycleMode":"Persistent"}')
put("vol_data", "ephemeral.json",
    '{"driverName":"d.example.com","volumeHandle":"csi-0123","specVolID":"inline",'
    '"volumeLifecycleMode":"Ephemeral","seLinuxMountContext":"system_u:object_r:container_file_t:s0:c1,c2",'
    '"podUID":"0b0b0b0b-1111-2222-3333-444444444444"}')

# --- kubelet paths and names --------------------------------------------------
UID = "0b0b0b0b-1111-2222-3333-444444444444"
for name, p in [
    ("pod-volume", f"pods/{UID}/volumes/kubernetes.io~empty-dir/cache"),
    ("csi-mount", f"pods/{UID}/volumes/kubernetes.io~csi/pv-csi/mount"),
    ("csi-vol-data", f"pods/{UID}/volumes/kubernetes.io~csi/pv-csi/vol_data.json"),
    ("unknown-plugin", f"pods/{UID}/volumes/kubernetes.io~secret/token"),
    ("ready", f"pods/{UID}/plugins/kubernetes.io~empty-dir/cache/ready"),
    ("local-device", "plugins/kubernetes.io/local-volume/mounts/pv-local"),
    ("globalmount", "plugins/kubernetes.io/csi/d.example.com/" + "ab" * 32 + "/globalmount"),
    ("device-vol-data", "plugins/kubernetes.io/csi/d.example.com/" + "ab" * 32 + "/vol_data.json"),
    ("absolute", f"/var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~local-volume/pv1"),
    ("uid", UID),
    ("plugin-dir", "kubernetes.io~host-path"),
]:
    put("kubelet_paths", name, p)

# --- journal ----------------------------------------------------------------
HEADER, TRAILER = 20, 4


def golden(v):
    return bytes.fromhex(open(os.path.join(ROOT, f"fixtures/journal/v{v}/record-golden.hex")).read().strip())


def u64(n):
    return struct.pack("<Q", n)


def u32(n):
    return struct.pack("<I", n)


def s(x):
    b = x.encode()
    return u64(len(b)) + b


def opt(x):
    return b"\x00" if x is None else b"\x01" + x


for v in (1, 2):
    env = golden(v)
    payload = env[HEADER:-TRAILER]
    put("journal_record", f"envelope-v{v}", env)
    put("journal_record", f"record-v{v}", payload)
    # RecordOf: seq, wall, boot_id, then body variant 0 (Intent): op, multi_step, target
    seq, wall = struct.unpack_from("<QQ", payload)
    blen = struct.unpack_from("<Q", payload, 16)[0]
    off = 24 + blen
    boot = payload[24:off]
    variant, op = struct.unpack_from("<II", payload, off)
    assert variant == 0, "the golden record is an intent"
    target = payload[off + 9:]
    outcome = u64(seq + 1) + u64(wall) + s(boot.decode()) + u32(1) + u64(seq) + u32(op) + u32(0) \
        + opt(u32(7) + u32(3) + s("/") + s("ext4") + b"\x00" + opt(s("system_u:object_r:container_file_t:s0:c1,c2")))
    forget = u64(seq + 2) + u64(wall) + s(boot.decode()) + u32(3) + s("kubernetes.io/csi/d^vol-1") + opt(s(UID))
    # a run replay reads: intent, its outcome, a forget
    put("journal_record", f"run-v{v}", payload + outcome + forget)
    # checkpoints: one mounted entry with a pending intent, and an empty one
    entry = target + u32(0) + opt(u32(op) + u64(seq) + b"\x01" + target) \
        + opt(u32(7) + u32(3) + s("/") + s("ext4") + b"\x00" + opt(None)) \
        + u64(seq) + s(boot.decode()) + opt(s("journal and host agree"))
    put("journal_checkpoint", f"one-entry-v{v}", u64(seq) + u64(wall) + u64(1) + entry)
put("journal_checkpoint", "empty", u64(0) + u64(0) + u64(0))


# --- protobuf answers --------------------------------------------------------
def varint(n):
    if n < 0:
        n += 1 << 64
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(num, wire, payload):
    key = varint(num << 3 | wire)
    if wire == 0:
        return key + varint(payload)
    return key + varint(len(payload)) + payload


def msg(num, payload):
    return field(num, 2, payload if isinstance(payload, bytes) else payload.encode())


# csi_responses: the first byte picks the message (see the target)
caps = b"".join(msg(1, msg(1, field(1, 0, t))) for t in (1, 2, 3, 4, 5, 6, 7))
put("csi_responses", "node-caps", bytes([0]) + caps)
usage = msg(1, field(1, 0, 900) + field(2, 0, 1000) + field(3, 0, 100) + field(4, 0, 1)) \
    + msg(1, field(1, 0, 90) + field(2, 0, 100) + field(3, 0, 10) + field(4, 0, 2)) \
    + msg(2, field(1, 0, 1) + msg(2, "disk is gone"))
put("csi_responses", "volume-stats", bytes([1]) + usage)
put("csi_responses", "plugin-caps", bytes([2]) + msg(1, msg(1, field(1, 0, 1))) + msg(1, msg(2, msg(1, field(1, 0, 1)))))
put("csi_responses", "plugin-info", bytes([3]) + msg(1, "d.example.com") + msg(2, "1.2.3") + msg(3, msg(1, "k") + msg(2, "v")))
put("csi_responses", "probe", bytes([4]) + msg(1, field(1, 0, 1)))
put("csi_responses", "node-info", bytes([5]) + msg(1, "node-1") + field(2, 0, 16) + msg(3, msg(1, msg(1, "zone") + msg(2, "a"))))

put("registration", "csi-plugin", msg(1, "CSIPlugin") + msg(2, "d.example.com")
    + msg(3, "/var/lib/kubelet/plugins/d.example.com/csi.sock") + msg(4, "1.0.0") + msg(4, "v1.5.0"))
put("registration", "no-endpoint", msg(1, "CSIPlugin") + msg(2, "d.example.com") + msg(4, "1.0.0"))
