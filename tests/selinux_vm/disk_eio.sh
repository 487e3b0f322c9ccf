#!/bin/sh
# The VM half of tests/disk_eio_vm.rs: volumed's root on an ext4 whose
# device starts failing every write with EIO (dm-flakey, error_writes)
# while the daemon runs, then works again.
# tests/selinux_vm/common.sh comes first (names, output format, helpers).
#
# /dev/vda (64 MiB) is under the dm device `eio`, /dev/vdb (32 MiB) is the
# ext4's external journal. The table of `eio` is switched live
# (suspend, reload, resume; --nolockfs: a freeze would flush the ext4
# onto the failing device) between
#   linear  /dev/vda        every I/O goes through
#   flakey  /dev/vda        down from the start for an hour, error_writes:
#                           every write fails with EIO, reads go through
# The jbd2 journal on its own device keeps working, so ext4 (mounted
# errors=continue, data_err=ignore as by default) can outlive failed data
# writes without aborting: the in-place path. If it aborts all the same
# (read-only, or shut down), the scenario repairs it as an operator would
# (SIGKILL, every mount below the disk unmounted, e2fsck, mounted again,
# volumed started): the repair path. The block `path` says which ran.
#
# Only the root (so the journal, <root>/volumed) is on the failing disk:
# the static pods are in /etc/volumed/pods, their volumes memory
# emptyDirs (a tmpfs needs no block of the disk, only its dir).

say "@@INFO disk-eio scenario start, uptime $T0 s"
MNT=/media/eio
ROOT=$MNT/kubelet
DM=eio
JOURNAL=$ROOT/volumed
# No udev in the VM: libdevmapper makes /dev/mapper/$DM itself.
export DM_DISABLE_UDEV=1

for m in dm_mod dm_flakey; do
  modprobe "$m" || say "@@INFO modprobe $m failed"
done
i=0
while [ ! -b /dev/vdb ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done

sectors=$(blockdev --getsz /dev/vda)
LINEAR="0 $sectors linear /dev/vda 0"
FAILING="0 $sectors flakey /dev/vda 0 0 3600 1 error_writes"
# switch TABLE: the live table of $DM becomes TABLE.
switch() {
  dmsetup suspend --nolockfs "$DM" && dmsetup reload "$DM" --table "$1" &&
    dmsetup resume "$DM"
}

mem_pod() { # mem_pod UID
  cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: pod-$1, namespace: default, uid: $1}
spec:
  containers:
  - name: app
    image: busybox
    volumeMounts:
    - {name: mem, mountPath: /mem}
  volumes:
  - name: mem
    emptyDir: {medium: Memory, sizeLimit: 1Mi}
EOF
}
# add_pod FILE UID: the manifest appears whole (renamed in from a dir on
# the same filesystem).
STAGE=/etc/volumed/staging
add_pod() {
  mem_pod "$2" >"$STAGE/$1" && mv "$STAGE/$1" "$PODS/$1"
}
mem_target() { echo "$ROOT/pods/$1/volumes/kubernetes.io~empty-dir/mem"; }
MEM_A=$(mem_target "$UID_A")
MEM_B=$(mem_target "$UID_B")

# The whole HTTP answer (status line, headers, body): busybox wget shows
# no body for a 503. nc's input stays open until the daemon has answered
# and closed (nc ends with the connection).
raw_http() {
  { printf 'GET %s HTTP/1.0\r\nHost: vm\r\n\r\n' "$1"; sleep 1; } | nc 127.0.0.1 "$PORT"
}
readyz_503() { raw_http /readyz | head -n1 | grep -q ' 503 '; }
dump() { volumed dump --journal-dir "$JOURNAL" --format json; }
# what the kernel said about the disk so far
kernel() { dmesg | grep -E 'EXT4-fs|JBD2|dm-|flakey|I/O error|Buffer I/O' | tail -n 60; }
fs_state() { grep " $MNT " /proc/self/mountinfo; ls -a "$ROOT"; }

if dmsetup create "$DM" --table "$LINEAR"; then
  say "@@STEP dm.created ok 0"
else
  say "@@STEP dm.created timeout 0"
fi
block mkfs sh -c "mkfs.ext4 -q -F -b 4096 -O journal_dev /dev/vdb &&
  mkfs.ext4 -q -F -b 4096 -J device=/dev/vdb -E nodiscard,lazy_itable_init=0 /dev/mapper/$DM"
OPTIONS=errors=continue,journal_path=/dev/vdb
mkdir -p "$MNT" "$PODS" "$OBJECTS" "$STAGE"
$MOUNT -t ext4 -o "$OPTIONS" "/dev/mapper/$DM" "$MNT" && mkdir -p "$ROOT"
wait_for fs.mounted 10 mounted "$MNT"

add_pod a.yaml "$UID_A"
VOLUMED_EXTRA="--poll-ms 200" start_volumed
wait_for ready 60 ready
wait_for a.mounted 60 mounted "$MEM_A" tmpfs
sleep 1
block before.dump dump
block before.metrics http /metrics

# --- the fault: every write to the disk fails with EIO.
if switch "$FAILING"; then
  say "@@STEP fault.on ok 0"
else
  say "@@STEP fault.on timeout 0"
fi
block fault.table dmsetup table "$DM"
add_pod b.yaml "$UID_B"
wait_for degraded 60 readyz_503
block fault.readyz raw_http /readyz
block fault.metrics http /metrics
block fault.state fs_state
# still degraded a few recoveries later, B still waiting
sleep 4
block fault.readyz.later raw_http /readyz
block fault.mountinfo mountinfo
block fault.kernel kernel

# --- the fault ends: the linear table again.
if switch "$LINEAR"; then
  say "@@STEP fault.off ok 0"
else
  say "@@STEP fault.off timeout 0"
fi
block after.state fs_state
if touch "$MNT/probe" 2>/dev/null && sync && rm -f "$MNT/probe"; then
  block path echo in-place
  wait_for b.mounted 90 mounted "$MEM_B" tmpfs
else
  block path echo repair
  kill -9 "$VOLUMED_PID"
  wait_for killed 30 exited "$VOLUMED_PID"
  wait "$VOLUMED_PID" 2>/dev/null
  grep " $MNT/" /proc/self/mountinfo | awk '{print $5}' | sort -r | while read -r m; do
    $UMOUNT "$m"
  done
  $UMOUNT "$MNT"
  block e2fsck e2fsck -f -y -j /dev/vdb "/dev/mapper/$DM"
  $MOUNT -t ext4 -o "$OPTIONS" "/dev/mapper/$DM" "$MNT"
  wait_for fs.remounted 10 mounted "$MNT"
  VOLUMED_EXTRA="--poll-ms 200" start_volumed
  wait_for b.mounted 90 mounted "$MEM_B" tmpfs
fi
wait_for ready.again 60 ready
# many passes later: what was re-issued would show
sleep 2
block final.readyz raw_http /readyz
block final.metrics http /metrics
block final.mountinfo mountinfo
block final.dump dump
block final.state fs_state
block final.kernel kernel

kill -TERM "$VOLUMED_PID" 2>/dev/null
wait_for stopped 30 exited "$VOLUMED_PID" || kill -9 "$VOLUMED_PID"
wait "$VOLUMED_PID" 2>/dev/null
block volumed.exit echo "$?"
grep " $MNT/" /proc/self/mountinfo | awk '{print $5}' | sort -r | while read -r m; do
  $UMOUNT "$m"
done
$UMOUNT "$MNT"
dmsetup remove "$DM"
block volumed_log cat "$LOG"
say "@@DONE after $(($(cut -d. -f1 /proc/uptime) - T0)) s"
