#!/bin/sh
# The recording half of tests/power_loss.rs: a busy volumed on an ext4
# whose every block write is logged by dm-log-writes.
# tests/selinux_vm/common.sh comes first (names, output format, helpers).
#
# /dev/vda (64 MiB) is the data device, /dev/vdb the log device (a host
# file the test reads after the VM is gone). The ext4 over
# log-writes(vda, vdb) is mounted at /media/powerloss and holds volumed's
# root (so its journal, <root>/volumed), the static pod folder and the
# objects folder: a replayed image carries the pods present at that
# instant. Manifests are written to a staging dir and renamed in, and end
# with "# end" so the replayer can tell a whole one from a torn one.
#
# Marks in the log: `fs-ready` once the empty ext4 is mounted (states
# before it are not volumed's), `durable-<seq>` after /metrics said
# `volumed_journal_durable_seq <seq>` (every record through seq was
# fsynced before the mark was logged), `stopped` after SIGTERM. A `dump`
# after every round (dump.<round>, final.dump) shows the records written.

say "@@INFO power-loss scenario start, uptime $T0 s"
MNT=/media/powerloss
ROOT=$MNT/kubelet
PODS=$MNT/pods
OBJECTS=$MNT/objects
STAGE=$MNT/staging
DM=lw
# No udev in the VM: libdevmapper makes /dev/mapper/$DM itself.
export DM_DISABLE_UDEV=1
PODS_N=8
ROUNDS=${ROUNDS:-16}

for m in dm_mod dm_log_writes; do
  modprobe "$m" || say "@@INFO modprobe $m failed"
done
i=0
while [ ! -b /dev/vdb ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done

mark() { dmsetup message "$DM" 0 mark "$1"; }
durable() { http /metrics | awk '$1 == "volumed_journal_durable_seq" {print $2}'; }
mark_durable() {
  seq=$(durable)
  [ -n "$seq" ] && mark "durable-$seq" && say "@@INFO mark durable-$seq"
}

uid_of() { printf 'pl%06d-0000-4000-8000-000000000000' "$1"; }
add_pod() {
  uid=$(uid_of "$1")
  cat >"$STAGE/pod-$1.yaml" <<EOF
apiVersion: v1
kind: Pod
metadata: {name: pod-$1, namespace: default, uid: $uid}
spec:
  containers:
  - name: app
    image: busybox
    volumeMounts:
    - {name: mem, mountPath: /mem}
    - {name: disk, mountPath: /disk}
  volumes:
  - name: mem
    emptyDir: {medium: Memory, sizeLimit: 8Mi}
  - name: disk
    emptyDir: {}
# end
EOF
  mv "$STAGE/pod-$1.yaml" "$PODS/pod-$1.yaml"
}
rm_pod() { rm -f "$PODS/pod-$1.yaml"; }

# tmpfs mounts below the pods dir: one per pod whose manifest is present.
tmpfs_count() {
  awk -v p="$ROOT/pods/" 'index($5, p) == 1 && / - tmpfs / {n++} END {print n + 0}' /proc/self/mountinfo
}
converged() { [ "$(tmpfs_count)" = "$(ls "$PODS" | wc -l)" ]; }

sectors=$(blockdev --getsz /dev/vda)
if dmsetup create "$DM" --table "0 $sectors log-writes /dev/vda /dev/vdb"; then
  say "@@STEP dm.created ok 0"
else
  say "@@STEP dm.created timeout 0"
fi
block mkfs mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 "/dev/mapper/$DM"
mkdir -p "$MNT"
$MOUNT -t ext4 "/dev/mapper/$DM" "$MNT" && mkdir -p "$ROOT" "$PODS" "$OBJECTS" "$STAGE" && sync
wait_for fs.mounted 10 mounted "$MNT"
mark fs-ready

# A checkpoint every 40 records: compaction (the checkpoint written, the
# records through it dropped) happens under the recording too.
VOLUMED_EXTRA="--poll-ms 200 --checkpoint-every 40" start_volumed
wait_for ready 60 ready
mark_durable

# Round r adds pod r mod 8 and removes pod (r + 3) mod 8: three to five
# pods present at a time, every pod set up and torn down more than once.
r=0
while [ $r -lt "$ROUNDS" ]; do
  add_pod $((r % PODS_N))
  rm_pod $(((r + 3) % PODS_N))
  sleep 0.6
  mark_durable
  # What the journal held then: records a later checkpoint drops are still
  # known to the test, which compares every recovered record with them.
  block "dump.$r" volumed dump --journal-dir "$ROOT/volumed" --format json
  r=$((r + 1))
done
wait_for converged 60 converged
sleep 1
mark_durable
block final.pods ls "$PODS"
block final.mountinfo mountinfo
block final.dump volumed dump --journal-dir "$ROOT/volumed" --format json

kill -TERM "$VOLUMED_PID" 2>/dev/null
wait_for stopped 30 exited "$VOLUMED_PID" || kill -9 "$VOLUMED_PID"
wait "$VOLUMED_PID" 2>/dev/null
mark stopped
# The tmpfs mounts first (deepest first), then the ext4; removing the
# target logs the end mark and the final entry count.
grep " $MNT/" /proc/self/mountinfo | awk '{print $5}' | sort -r | while read -r m; do
  $UMOUNT "$m"
done
$UMOUNT "$MNT"
if dmsetup remove "$DM"; then
  say "@@STEP dm.removed ok 0"
else
  say "@@STEP dm.removed timeout 0"
fi
blockdev --flushbufs /dev/vdb
sync
block volumed_log cat "$LOG"
say "@@DONE after $(($(cut -d. -f1 /proc/uptime) - T0)) s"
