#!/bin/sh
# The scenario of tests/selinux_vm.rs, run by the VM's /init (busybox sh) as
# /scenario.sh. It drives volumed and gathers evidence; the Rust test makes
# every assertion on that evidence.
#
# Output, on /dev/ttyS1 only (the console carries the kernel's messages):
#   @@STEP <name> <ok|timeout> <seconds>   a wait for a condition ended
#   @@BEGIN <name> … @@END <name>          a block of evidence (command output)
#   @@DONE                                 the scenario ran to its end
# Everything is echoed to the console too, for the log a failure prints.
#
# busybox sh runs its own applets before PATH (standalone shell), so the
# glibc tools that know SELinux are called by full path.
LS=/usr/bin/ls
STAT=/usr/bin/stat
MOUNT=/usr/bin/mount
UMOUNT=/usr/bin/umount
OUT=/dev/ttyS1

ROOT=/var/lib/kubelet
PODS=/etc/volumed/pods
OBJECTS=/etc/volumed/objects
PORT=10264
URL=http://127.0.0.1:$PORT
LOG=/tmp/volumed.log
PV=pv-sel
UID_A=aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa
UID_B=bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb
LABEL_A='system_u:object_r:container_file_t:s0:c10,c20'
LABEL_B='system_u:object_r:container_file_t:s0:c30,c40'
DEVICE_TARGET=$ROOT/plugins/kubernetes.io/local-volume/mounts/$PV
TARGET_A=$ROOT/pods/$UID_A/volumes/kubernetes.io~local-volume/$PV
TARGET_B=$ROOT/pods/$UID_B/volumes/kubernetes.io~local-volume/$PV
T0=$(cut -d. -f1 /proc/uptime)

say() { echo "$*"; echo "$*" >"$OUT"; }

# block NAME CMD…: CMD's output (and stderr) as an evidence block.
block() {
  name=$1
  shift
  out=$("$@" 2>&1)
  printf '@@BEGIN %s\n%s\n@@END %s\n' "$name" "$out" "$name" >"$OUT"
  printf '@@BEGIN %s\n%s\n@@END %s\n' "$name" "$out" "$name"
}

# wait_for NAME SECONDS CMD…: polls CMD every 0.2 s until it succeeds.
wait_for() {
  name=$1 limit=$2
  shift 2
  start=$(cut -d. -f1 /proc/uptime)
  while :; do
    if "$@" >/dev/null 2>&1; then
      say "@@STEP $name ok $(($(cut -d. -f1 /proc/uptime) - start))"
      return 0
    fi
    if [ $(($(cut -d. -f1 /proc/uptime) - start)) -ge "$limit" ]; then
      say "@@STEP $name timeout $limit"
      return 1
    fi
    sleep 0.2
  done
}

http() { wget -q -O- "$URL$1"; }
ready() { http /readyz; }
# mounted PATH [TEXT]: PATH is a mount point (and its line contains TEXT).
mounted() { grep " $1 " /proc/self/mountinfo | grep -qF "${2:-}"; }
mismatch_counted() {
  http /metrics | grep '^volume_manager_selinux_volume_context_mismatch_errors_total{' |
    grep 'access_mode="RWOP"' | grep 'volume_plugin="kubernetes.io/local-volume"' |
    awk '$NF >= 1 {found = 1} END {exit !found}'
}
mountinfo() { cat /proc/self/mountinfo; }
# exited PID: the process is gone or a zombie (kill -0 still finds a zombie).
exited() { ! grep -qE '^State:[[:space:]]+[^Z]' "/proc/$1/status" 2>/dev/null; }
labels_of() {
  for f in "$@"; do
    printf '%s %s\n' "$($STAT -c %C "$f" 2>&1)" "$f"
  done
  $LS -Z "$@" 2>&1
}

start_volumed() {
  VOLUMED_LOG=info volumed run --root-dir "$ROOT" --node-name vm \
    --static-pods "$PODS" --static-objects "$OBJECTS" \
    --listen 127.0.0.1:$PORT --selinux auto >>"$LOG" 2>&1 &
  VOLUMED_PID=$!
  say "@@INFO volumed started, pid $VOLUMED_PID"
}

pod() { # pod UID LEVEL
  cat <<EOF
apiVersion: v1
kind: Pod
metadata: {name: pod-$1, namespace: default, uid: $1}
spec:
  securityContext:
    seLinuxOptions: {level: "$2"}
  containers:
  - name: app
    image: busybox
    volumeMounts:
    - {name: data, mountPath: /data}
  volumes:
  - name: data
    persistentVolumeClaim: {claimName: claim-sel}
EOF
}

say "@@INFO scenario start, uptime $T0 s"
block env sh -c 'uname -r; cat /sys/kernel/security/lsm; echo; getenforce;
  grep -E " /sys/fs/selinux " /proc/self/mountinfo; cat /etc/selinux/config; /usr/bin/id -Z'

# --- control: the kernel takes a context= mount from util-linux mount.
mkdir -p /mnt/control
$MOUNT -t tmpfs -o "context=\"$LABEL_A\"" tmpfs /mnt/control 2>&1
echo hello >/mnt/control/file
block control_mountinfo grep " /mnt/control " /proc/self/mountinfo
block control_labels labels_of /mnt/control/file
$UMOUNT /mnt/control

# --- objects and pod A.
mkdir -p "$PODS" "$OBJECTS" "$ROOT"
cat >"$OBJECTS/pv.yaml" <<EOF
apiVersion: v1
kind: PersistentVolume
metadata: {name: $PV}
spec:
  capacity: {storage: 64Mi}
  accessModes: [ReadWriteOncePod]
  volumeMode: Filesystem
  persistentVolumeReclaimPolicy: Retain
  storageClassName: local
  claimRef: {namespace: default, name: claim-sel}
  local:
    path: /dev/vda
    fsType: ext4
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {key: kubernetes.io/hostname, operator: In, values: [vm]}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: claim-sel, namespace: default}
spec:
  accessModes: [ReadWriteOncePod]
  volumeMode: Filesystem
  storageClassName: local
  volumeName: $PV
  resources:
    requests: {storage: 64Mi}
EOF
pod "$UID_A" s0:c10,c20 >"$PODS/pod-a.yaml"

start_volumed
wait_for a_ready 60 ready
wait_for a_mounted 60 mounted "$TARGET_A"
echo "written by pod A" >"$TARGET_A/hello.txt"
block a_mountinfo mountinfo
block a_labels labels_of "$DEVICE_TARGET" "$TARGET_A" "$TARGET_A/hello.txt"

# --- pod B: same claim, another label, while pod A holds the volume.
pod "$UID_B" s0:c30,c40 >"$PODS/pod-b.yaml"
wait_for b_refused 30 mismatch_counted
sleep 2
block b_metrics http /metrics
block b_debug_state http /debug/state
block b_mountinfo mountinfo

# --- kill -9 and restart with the same flags.
kill -9 "$VOLUMED_PID"
wait "$VOLUMED_PID" 2>/dev/null
say "@@INFO volumed killed"
echo "--- restart ---" >>"$LOG"
start_volumed
wait_for restart_ready 60 ready
block restart_dump volumed dump --journal-dir "$ROOT/volumed" --format json
block restart_metrics http /metrics
block restart_mountinfo mountinfo

# --- pod A goes: the volume comes back with pod B's label.
rm -f "$PODS/pod-a.yaml"
wait_for b_mounted 45 mounted "$TARGET_B" "$LABEL_B"
sleep 1
block final_mountinfo mountinfo
block final_labels labels_of "$DEVICE_TARGET" "$TARGET_B" "$TARGET_B/hello.txt"
block final_debug_state http /debug/state
block final_metrics http /metrics

kill -TERM "$VOLUMED_PID"
if wait_for sigterm_exit 30 exited "$VOLUMED_PID"; then
  wait "$VOLUMED_PID"
  block sigterm_status echo "$?"
else
  kill -9 "$VOLUMED_PID"
fi
block volumed_log cat "$LOG"
block dmesg dmesg
say "@@DONE after $(($(cut -d. -f1 /proc/uptime) - T0)) s"
