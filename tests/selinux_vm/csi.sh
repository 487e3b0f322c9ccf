#!/bin/sh
# The CSI scenario of tests/selinux_vm.rs: a labelled CSI volume with a
# driver that really mounts (volumed-testdriver, packed beside volumed). It
# drives volumed and the driver and gathers evidence; the Rust test makes
# every assertion on that evidence. tests/selinux_vm/common.sh comes first.
#
# The CSIDriver says `seLinuxMount: true`, the PV is ReadWriteOncePod, so
# pod A's level s0:c10,c20 becomes `context="…"` in NodeStage's mount flags
# and the driver mounts its tmpfs with it. Then: kill -9 and restart of
# volumed (no RPC may be re-issued), pod B with another level on the same
# claim (refused), both pods gone (NodeUnpublish, NodeUnstage, nothing left
# mounted).

CSI_DRIVER=sel.csi.volumed.dev
CSI_PV=pv-csi-sel
CSI_HANDLE=vol-sel-1
CSI_DIR=/run/csi
CALLS=$CSI_DIR/state/calls.jsonl
CSI_STAGING=$ROOT/plugins/kubernetes.io/csi/$CSI_DRIVER/$(printf %s "$CSI_HANDLE" | sha256sum | cut -d' ' -f1)/globalmount
CSI_TARGET_A=$ROOT/pods/$UID_A/volumes/kubernetes.io~csi/$CSI_PV/mount
CSI_TARGET_B=$ROOT/pods/$UID_B/volumes/kubernetes.io~csi/$CSI_PV/mount
VOLUMED_EXTRA="--csi-driver $CSI_DRIVER=$CSI_DIR/csi.sock"

say "@@INFO csi scenario start, uptime $T0 s"
block env sh -c 'uname -r; cat /sys/kernel/security/lsm; echo; getenforce;
  grep -E " /sys/fs/selinux " /proc/self/mountinfo'

mkdir -p "$PODS" "$OBJECTS" "$ROOT" "$CSI_DIR"
cat >"$OBJECTS/csi.yaml" <<EOF
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: $CSI_DRIVER}
spec:
  attachRequired: false
  seLinuxMount: true
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: $CSI_PV}
spec:
  capacity: {storage: 64Mi}
  accessModes: [ReadWriteOncePod]
  persistentVolumeReclaimPolicy: Retain
  claimRef: {namespace: default, name: claim-csi}
  csi:
    driver: $CSI_DRIVER
    volumeHandle: $CSI_HANDLE
    fsType: tmpfs
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: claim-csi, namespace: default}
spec:
  accessModes: [ReadWriteOncePod]
  volumeName: $CSI_PV
  resources:
    requests: {storage: 64Mi}
EOF
# pod() of common.sh, on this claim
csi_pod() { pod "$1" "$2" | sed 's/claimName: claim-sel/claimName: claim-csi/'; }

volumed-testdriver --name "$CSI_DRIVER" --endpoint "$CSI_DIR/csi.sock" \
  --state "$CSI_DIR/state" --node-id vm >"$CSI_DIR/driver.log" 2>&1 &
DRIVER_PID=$!
wait_for driver_ready 30 test -S "$CSI_DIR/csi.sock"

csi_mismatch_counted() {
  http /metrics | grep '^volume_manager_selinux_volume_context_mismatch_errors_total{' |
    grep 'access_mode="RWOP"' | grep "volume_plugin=\"kubernetes.io/csi/$CSI_DRIVER\"" |
    awk '$NF >= 1 {found = 1} END {exit !found}'
}
nothing_mounted() {
  ! grep -qE " ($CSI_STAGING|$CSI_TARGET_A|$CSI_TARGET_B) " /proc/self/mountinfo
}
calls() { cat "$CALLS"; }

# --- pod A: staged with its label, published.
csi_pod "$UID_A" s0:c10,c20 >"$PODS/pod-a.yaml"
start_volumed
wait_for a_ready 60 ready
wait_for a_mounted 60 mounted "$CSI_TARGET_A"
echo "written by pod A" >"$CSI_TARGET_A/hello.txt"
block a_mountinfo mountinfo
block a_labels labels_of "$CSI_STAGING" "$CSI_TARGET_A" "$CSI_TARGET_A/hello.txt"
block a_debug_state http /debug/state
block a_dump volumed dump --journal-dir "$ROOT/volumed" --format json
block a_calls calls

# --- kill -9 and restart: the journal and the mount table agree, no RPC.
kill -9 "$VOLUMED_PID"
wait "$VOLUMED_PID" 2>/dev/null
say "@@INFO volumed killed"
echo "--- restart ---" >>"$LOG"
start_volumed
wait_for restart_ready 60 ready
# time for a wrongly re-issued call to show in the call log
sleep 3
block restart_debug_state http /debug/state
block restart_metrics http /metrics
block restart_mountinfo mountinfo
block restart_calls calls

# --- pod B: same claim, another level, while pod A holds the volume.
csi_pod "$UID_B" s0:c30,c40 >"$PODS/pod-b.yaml"
wait_for b_refused 30 csi_mismatch_counted
sleep 2
block b_metrics http /metrics
block b_debug_state http /debug/state
block b_mountinfo mountinfo

# --- both pods go (B first, so it never takes the volume over).
rm -f "$PODS/pod-b.yaml"
sleep 2
rm -f "$PODS/pod-a.yaml"
wait_for gone 60 nothing_mounted
sleep 1
block final_mountinfo mountinfo
block final_debug_state http /debug/state
block final_calls calls
block final_dirs sh -c "ls -d '$CSI_STAGING' '$CSI_TARGET_A' 2>&1; true"

kill -TERM "$VOLUMED_PID"
if wait_for sigterm_exit 30 exited "$VOLUMED_PID"; then
  wait "$VOLUMED_PID"
  block sigterm_status echo "$?"
else
  kill -9 "$VOLUMED_PID"
fi
kill -TERM "$DRIVER_PID"
wait "$DRIVER_PID" 2>/dev/null
block driver_log cat "$CSI_DIR/driver.log"
block volumed_log cat "$LOG"
block dmesg dmesg
say "@@DONE after $(($(cut -d. -f1 /proc/uptime) - T0)) s"
