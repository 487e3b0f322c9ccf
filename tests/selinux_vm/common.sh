#!/bin/sh
# Shared by the SELinux VM scenarios (tests/selinux_vm.rs prepends it to the
# scenario it boots): names, evidence output and helpers (busybox sh).
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
# /debug/* is served on TCP only on the lab listener (--debug-listen); the
# VM's own loopback is the lab
DEBUG_PORT=10265
URL=http://127.0.0.1:$DEBUG_PORT
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

# start_volumed: in the background, with $VOLUMED_EXTRA's words appended.
start_volumed() {
  # shellcheck disable=SC2086 # VOLUMED_EXTRA is a list of words
  VOLUMED_LOG=info volumed run --root-dir "$ROOT" --node-name vm \
    --static-pods "$PODS" --static-objects "$OBJECTS" \
    --listen 127.0.0.1:$PORT --debug-listen 127.0.0.1:$DEBUG_PORT --selinux auto ${VOLUMED_EXTRA:-} >>"$LOG" 2>&1 &
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

# write_objects: the local PV on /dev/vda (RWOP) and its bound claim.
write_objects() {
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
}
