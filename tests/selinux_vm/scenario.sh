#!/bin/sh
# The scenario of tests/selinux_vm.rs, run by the VM's /init (busybox sh) as
# /scenario.sh. It drives volumed and gathers evidence; the Rust test makes
# every assertion on that evidence.
#
# tests/selinux_vm/common.sh comes first (names, output format, helpers).

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
write_objects
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
