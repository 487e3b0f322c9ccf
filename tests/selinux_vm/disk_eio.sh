#!/bin/sh
# The VM half of tests/disk_eio_vm.rs: volumed's root on an ext4 whose
# device starts failing every write with EIO (dm-flakey, error_writes)
# while the daemon runs, then works again.
# tests/selinux_vm/common.sh comes first (names, output format, helpers).
#
# /dev/vda (64 MiB) is under the dm device `eio`, /dev/vdb (32 MiB) under
# `eioj`, the ext4's external (jbd2) journal. Their tables are switched
# live (suspend, reload, resume; --nolockfs: a freeze would flush the
# ext4 onto the failing device) between
#   linear  the disk        every I/O goes through
#   flakey  the disk        down from the start for an hour, error_writes:
#                           every write fails with EIO, reads go through
#
# Fault 1, `eio` alone fails (pod A mounted, pod B added during it): the
# jbd2 journal on its own device keeps working, so ext4 (mounted
# errors=continue, data_err=ignore as by default) can outlive failed data
# writes without aborting, and the daemon goes on by itself: the
# in-place path. Fault 2, both fail (pod C added during it): another
# writer's file and sync make a jbd2 commit, which fails, and ext4
# aborts; once the devices work again it is repaired as an operator
# would (SIGKILL, every mount below the disk unmounted, e2fsck, mounted
# again, volumed started): the repair path. After each fault the
# scenario tries a write on the ext4 and takes the path it allows; the
# blocks `path` and `abort.path` say which ran.
#
# Only the root (so the journal, <root>/volumed) is on the failing disk:
# the static pods are in /etc/volumed/pods, their volumes memory
# emptyDirs (a tmpfs needs no block of the disk, only its dir).

say "@@INFO disk-eio scenario start, uptime $T0 s"
MNT=/media/eio
ROOT=$MNT/kubelet
DM=eio
DMJ=eioj
UID_C=cccccccc-cccc-4ccc-8ccc-cccccccccccc
JOURNAL=$ROOT/volumed
# No udev in the VM: libdevmapper makes /dev/mapper/$DM itself.
export DM_DISABLE_UDEV=1

for m in dm_mod dm_flakey; do
  modprobe "$m" || say "@@INFO modprobe $m failed"
done
i=0
while [ ! -b /dev/vdb ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done

linear() { echo "0 $(blockdev --getsz "$1") linear $1 0"; }
failing() { echo "0 $(blockdev --getsz "$1") flakey $1 0 0 3600 1 error_writes"; }
LINEAR=$(linear /dev/vda)
FAILING=$(failing /dev/vda)
LINEAR_J=$(linear /dev/vdb)
FAILING_J=$(failing /dev/vdb)
# switch DEV TABLE: the live table of DEV becomes TABLE.
switch() {
  dmsetup suspend --nolockfs "$1" && dmsetup reload "$1" --table "$2" &&
    dmsetup resume "$1"
}
# repair: what an operator does to an ext4 that aborted: volumed killed,
# every mount below the disk and the disk unmounted, e2fsck, mounted
# again, volumed started.
repair() {
  kill -9 "$VOLUMED_PID"
  wait_for "$1.killed" 30 exited "$VOLUMED_PID"
  wait "$VOLUMED_PID" 2>/dev/null
  grep " $MNT/" /proc/self/mountinfo | awk '{print $5}' | sort -r | while read -r m; do
    $UMOUNT "$m"
  done
  $UMOUNT "$MNT"
  block "$1.e2fsck" sh -c "e2fsck -f -y -j /dev/mapper/$DMJ /dev/mapper/$DM; echo exit \$?"
  $MOUNT -t ext4 -o "$OPTIONS" "/dev/mapper/$DM" "$MNT"
  wait_for "$1.remounted" 10 mounted "$MNT"
  VOLUMED_EXTRA="--poll-ms 200" start_volumed
}
writable() { touch "$MNT/probe" 2>/dev/null && sync && rm -f "$MNT/probe"; }

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
kernel() { dmesg | grep -E 'EXT4-fs|JBD2|Aborting journal|dm-|flakey|I/O error|Buffer I/O' | tail -n 80; }
fs_state() { grep " $MNT " /proc/self/mountinfo; ls -a "$ROOT"; }

if dmsetup create "$DM" --table "$LINEAR" && dmsetup create "$DMJ" --table "$LINEAR_J"; then
  say "@@STEP dm.created ok 0"
else
  say "@@STEP dm.created timeout 0"
fi
block mkfs sh -c "mkfs.ext4 -q -F -b 4096 -O journal_dev /dev/mapper/$DMJ &&
  mkfs.ext4 -q -F -b 4096 -J device=/dev/mapper/$DMJ -E nodiscard,lazy_itable_init=0 /dev/mapper/$DM"
OPTIONS=errors=continue,journal_path=/dev/mapper/$DMJ
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
if switch "$DM" "$FAILING"; then
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
if switch "$DM" "$LINEAR"; then
  say "@@STEP fault.off ok 0"
else
  say "@@STEP fault.off timeout 0"
fi
block after.state fs_state
if writable; then
  block path echo in-place
else
  block path echo repair
  repair fault
fi
wait_for b.mounted 90 mounted "$MEM_B" tmpfs
wait_for ready.again 60 ready
# many passes later: what was re-issued would show
sleep 2
block final.readyz raw_http /readyz
block final.metrics http /metrics
block final.mountinfo mountinfo
block final.dump dump
block final.state fs_state
block final.kernel kernel

# --- fault 2: the disk and the jbd2 journal's disk fail.
if switch "$DMJ" "$FAILING_J" && switch "$DM" "$FAILING"; then
  say "@@STEP abort.on ok 0"
else
  say "@@STEP abort.on timeout 0"
fi
add_pod c.yaml "$UID_C"
wait_for abort.degraded 60 readyz_503
# volumed's failed writes are file data only (sled rewrites blocks its log
# already has), so jbd2 would have nothing to commit: another writer on
# the disk (a file created, then sync) makes a commit, which fails.
block abort.writer sh -c "echo other >$MNT/other; sync; echo sync \$?"
aborted() { dmesg | grep -q 'Aborting journal'; }
wait_for abort.aborted 15 aborted
block abort.readyz raw_http /readyz
block abort.metrics http /metrics
block abort.mountinfo mountinfo
block abort.state fs_state
if switch "$DM" "$LINEAR" && switch "$DMJ" "$LINEAR_J"; then
  say "@@STEP abort.off ok 0"
else
  say "@@STEP abort.off timeout 0"
fi
block abort.after.state fs_state
block abort.kernel kernel
if writable; then
  block abort.path echo in-place
else
  block abort.path echo repair
  repair abort
fi
wait_for c.mounted 90 mounted "$(mem_target "$UID_C")" tmpfs
wait_for ready.repaired 60 ready
sleep 2
block repaired.readyz raw_http /readyz
block repaired.mountinfo mountinfo
block repaired.dump dump
block repaired.state fs_state

kill -TERM "$VOLUMED_PID" 2>/dev/null
wait_for stopped 30 exited "$VOLUMED_PID" || kill -9 "$VOLUMED_PID"
wait "$VOLUMED_PID" 2>/dev/null
block volumed.exit echo "$?"
grep " $MNT/" /proc/self/mountinfo | awk '{print $5}' | sort -r | while read -r m; do
  $UMOUNT "$m"
done
$UMOUNT "$MNT"
dmsetup remove "$DM"
dmsetup remove "$DMJ"
block volumed_log cat "$LOG"
say "@@DONE after $(($(cut -d. -f1 /proc/uptime) - T0)) s"
