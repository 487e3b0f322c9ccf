#!/bin/sh
# The kill-restart scenario of tests/selinux_vm.rs (built with the cargo
# feature `failpoints`): labelled volumes through every crash point of the
# four journaled operations and the format step, on a real SELinux kernel.
# tests/selinux_vm/common.sh comes first (names, output format, helpers).
#
# Per crash point P, one cycle: volumed runs with VOLUMED_CRASH_AT=P and dies
# by SIGKILL there (@@STEP P.died); `reconstruct --dry-run` shows what a
# restart decides (@@BEGIN P.dryrun); volumed restarts without the crash
# point and converges (@@STEP P.converged: pod A's volume mounted with its
# label, or nothing mounted after a teardown point); the mount table and
# `dump` are kept (P.mountinfo, P.dump); SIGTERM stops it before the next
# cycle. Mount-side points start from nothing mounted, teardown-side points
# from pod A's volume mounted, the crash coming when its manifest goes.

say "@@INFO crash scenario start, uptime $T0 s"
write_objects
rm -f "$PODS"/*

stop_volumed() {
  kill -TERM "$VOLUMED_PID" 2>/dev/null
  wait_for "$1.stopped" 30 exited "$VOLUMED_PID" || kill -9 "$VOLUMED_PID"
  wait "$VOLUMED_PID" 2>/dev/null
}

a_mounted() { mounted "$TARGET_A" "$LABEL_A" && mounted "$DEVICE_TARGET" "$LABEL_A"; }
none_mounted() { ! mounted "$TARGET_A" && ! mounted "$DEVICE_TARGET"; }

# after_crash P CONVERGED: the evidence of one cycle once volumed died at P.
after_crash() {
  wait_for "$1.died" 60 exited "$VOLUMED_PID"
  wait "$VOLUMED_PID" 2>/dev/null
  block "$1.log" grep -F "crash point $1 reached" "$LOG"
  block "$1.dryrun" volumed reconstruct --dry-run --root-dir "$ROOT" --format json
  unset VOLUMED_CRASH_AT
  start_volumed
  wait_for "$1.ready" 60 ready
  wait_for "$1.converged" 60 "$2"
  block "$1.mountinfo" mountinfo
  block "$1.dump" volumed dump --journal-dir "$ROOT/volumed" --format json
}

for point in format_device.after_op mount_device.after_intent mount_device.after_op \
  setup.after_intent setup.after_op; do
  echo "--- $point ---" >>"$LOG"
  pod "$UID_A" s0:c10,c20 >"$PODS/pod-a.yaml"
  export VOLUMED_CRASH_AT=$point
  start_volumed
  after_crash "$point" a_mounted
  # back to nothing mounted for the next point
  rm -f "$PODS/pod-a.yaml"
  wait_for "$point.cleaned" 60 none_mounted
  stop_volumed "$point"
done

for point in teardown.after_intent teardown.after_op unmount_device.after_intent \
  unmount_device.after_op; do
  echo "--- $point ---" >>"$LOG"
  pod "$UID_A" s0:c10,c20 >"$PODS/pod-a.yaml"
  export VOLUMED_CRASH_AT=$point
  start_volumed
  wait_for "$point.mounted" 60 a_mounted
  rm -f "$PODS/pod-a.yaml"
  after_crash "$point" none_mounted
  stop_volumed "$point"
done

block volumed_log cat "$LOG"
say "@@DONE after $(($(cut -d. -f1 /proc/uptime) - T0)) s"
