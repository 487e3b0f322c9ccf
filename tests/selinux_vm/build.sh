#!/usr/bin/env bash
# Builds the SELinux test VM of tests/selinux_vm.rs (and tests/power_loss.rs)
# from Debian packages only.
#
#   build.sh base OUTDIR
#       Makes OUTDIR/vmlinuz and OUTDIR/base.cpio.gz: a Debian kernel, its
#       ext4/virtio/loop/dm-log-writes/dm-flakey modules, busybox-static,
#       util-linux/coreutils/e2fsprogs/dmsetup binaries from the host with their
#       libraries, the SELinux userland (load_policy, getenforce, setfilecon,
#       …) and a binary policy built from selinux-policy-default plus
#       container.cil. Reused as long
#       as OUTDIR/stamp matches this script, its inputs and the package
#       versions apt offers; rebuilt otherwise. Serialised by flock, so two
#       test runs at once share one build.
#   build.sh payload OUTDIR VOLUMED SCENARIO DEST [TESTDRIVER]
#       Makes DEST, an uncompressed cpio appended to the base initramfs: the
#       volumed binary (debug info stripped) with the libraries ldd names,
#       the scenario as /scenario.sh and, when given, the test CSI driver
#       as volumed-testdriver the same way. The kernel unpacks concatenated
#       archives in order, so the base stays cached while the binary changes
#       (an uncompressed archive must start 4-byte aligned: the test pads the
#       gzip'd base with zeros, which the kernel skips).
#
# Host packages it needs are installed when missing (qemu-system-x86,
# busybox-static, kmod, cpio, …). Progress goes to stderr.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export DEBIAN_FRONTEND=noninteractive
# Modules the initramfs loads (with their dependencies).
MODULES=(ext4 virtio_blk virtio_pci loop crc32c_generic dm_mod dm_log_writes dm_flakey)
# Debian packages downloaded and unpacked (never installed on the host).
VM_PKGS=(selinux-policy-default policycoreutils semodule-utils selinux-utils
  libsemanage2 libsemanage-common libsepol2 libselinux1)
# Host binaries copied into the VM with their libraries.
# dmsetup (with libdevmapper) drives dm-log-writes for tests/power_loss.rs and
# dm-flakey for tests/disk_eio_vm.rs, which repairs its ext4 with e2fsck.
HOST_BINS=(mount umount blkid mkfs.ext4 e2fsck ls stat id chcon dmsetup)

say() { printf 'selinux-vm: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

apt_updated=0
apt_update() {
  if [ "$apt_updated" = 0 ]; then
    say "apt-get update"
    apt-get update -qq >&2 || die "apt-get update failed"
    apt_updated=1
  fi
}

# Installs the host tools the build and the test use, when missing.
ensure_host_tools() {
  local need=()
  command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
  dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || need+=(busybox-static)
  command -v depmod >/dev/null || need+=(kmod)
  command -v cpio >/dev/null || need+=(cpio)
  command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
  command -v strip >/dev/null || need+=(binutils)
  command -v flock >/dev/null || need+=(util-linux)
  command -v dmsetup >/dev/null || need+=(dmsetup)
  if ((${#need[@]})); then
    apt_update
    say "installing host packages: ${need[*]}"
    apt-get install -y -qq --no-install-recommends "${need[@]}" >&2 ||
      die "apt-get install ${need[*]} failed"
  fi
}

# The version apt would download for a package ("" when unknown).
candidate() {
  apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ && $2 != "(none)" {print $2; exit}'
}

# "package version" lines for the versions apt would download (one
# apt-cache call: each one loads the whole cache).
candidates() {
  apt-cache policy "$@" 2>/dev/null |
    awk '/^[^ ].*:$/ {p = substr($0, 1, length($0) - 1)} /Candidate:/ {print p, $2}'
}

# The kernel image package linux-image-amd64 points at.
kernel_pkg() {
  apt-cache depends linux-image-amd64 2>/dev/null |
    awk '/Depends: linux-image-[0-9]/ {print $2; exit}'
}

# Copies a host file (following symlinks) to the same path under $1.
copy_file() {
  local stage=$1 src=$2 dst=${3:-$2}
  mkdir -p "$stage$(dirname "$dst")"
  cp -L "$src" "$stage$dst"
}

# Copies an executable and every library ldd names into $1. A library under
# $LIB_ROOT (an unpacked package tree ldd was pointed at with
# LD_LIBRARY_PATH) lands at its path inside that tree.
copy_with_libs() {
  local stage=$1 bin=$2 dst=$3 lib
  copy_file "$stage" "$bin" "$dst"
  while read -r lib; do
    [ -n "$lib" ] || continue
    if [ -n "${LIB_ROOT:-}" ] && [ "${lib#"$LIB_ROOT"/}" != "$lib" ]; then
      [ -e "$stage/${lib#"$LIB_ROOT"/}" ] || copy_file "$stage" "$lib" "/${lib#"$LIB_ROOT"/}"
    else
      [ -e "$stage$lib" ] || copy_file "$stage" "$lib"
    fi
  done < <(ldd "$bin" | awk '/=> \// {print $3} /^[ \t]*\// {print $1}')
}

build_base() {
  local out=$1
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  ensure_host_tools
  exec 9>"$out/.lock"
  flock 9

  local kpkg
  kpkg=$(kernel_pkg)
  if [ -z "$kpkg" ] || [ -z "$(candidate selinux-policy-default)" ]; then
    apt_update
    kpkg=$(kernel_pkg)
  fi
  [ -n "$kpkg" ] || die "apt-cache depends linux-image-amd64 names no kernel package"
  local key
  key=$(
    {
      cat "$HERE/build.sh" "$HERE/init" "$HERE/container.cil"
      candidates "$kpkg" "${VM_PKGS[@]}"
      dpkg-query -W busybox-static util-linux mount coreutils e2fsprogs libc6 dmsetup 2>/dev/null
    } | sha256sum | cut -d' ' -f1
  )
  if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$key" ] &&
    [ -f "$out/vmlinuz" ] && [ -f "$out/base.cpio.gz" ]; then
    say "base image up to date ($out)"
    return
  fi
  rm -f "$out/stamp"
  local t0=$SECONDS
  local work=$out/work
  rm -rf "$work"
  mkdir -p "$work/debs" "$work/root" "$work/pol" "$work/stage"

  say "downloading $kpkg ${VM_PKGS[*]}"
  # Stale package lists name versions the mirror no longer has: update once.
  download() { (cd "$work/debs" && apt-get download -qq -o APT::Sandbox::User=root "$@" >&2); }
  if ! download "$kpkg" "${VM_PKGS[@]}"; then
    apt_update
    kpkg=$(kernel_pkg)
    download "$kpkg" "${VM_PKGS[@]}" || die "apt-get download $kpkg ${VM_PKGS[*]} failed in $work/debs"
  fi
  local deb
  for deb in "$work"/debs/*.deb; do
    dpkg -x "$deb" "$work/root" || die "dpkg -x $deb"
  done
  local kver
  kver=$(ls "$work/root/lib/modules")
  [ -f "$work/root/boot/vmlinuz-$kver" ] || die "no vmlinuz-$kver in $kpkg"

  # --- the binary policy: the extracted semodule against an alternate root.
  local root=$work/root pol=$work/pol
  local libs=$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu
  mkdir -p "$pol/etc/selinux" "$pol/var/lib/selinux/default"
  cat >"$pol/etc/selinux/semanage.conf" <<EOF
module-store = direct
expand-check = 0
compiler-directory = $root/usr/libexec/selinux/hll
[setfiles]
path = $root/sbin/setfiles
args = -q -c \$@ \$<
[end]
[sefcontext_compile]
path = $root/usr/sbin/sefcontext_compile
args = \$@
[end]
EOF
  say "building the policy with semodule (about 25 s)"
  LD_LIBRARY_PATH=$libs "$root/usr/sbin/semodule" -p "$pol" -s default -X 100 -n \
    $(printf -- '-i %s ' "$root"/usr/share/selinux/default/*.pp.bz2) \
    -i "$HERE/container.cil" >"$work/semodule.log" 2>&1 ||
    { cat "$work/semodule.log" >&2; die "semodule -p $pol failed"; }
  local policy
  policy=$(ls "$pol"/etc/selinux/default/policy/policy.* 2>/dev/null | head -n1)
  [ -n "$policy" ] || die "semodule made no $pol/etc/selinux/default/policy/policy.*"

  # --- the initramfs tree.
  local st=$work/stage d
  for d in bin sbin usr/bin usr/sbin etc proc sys dev tmp run var/lib root mnt lib64; do
    mkdir -p "$st/$d"
  done
  cp "$HERE/init" "$st/init"
  chmod 755 "$st/init"
  cp /bin/busybox "$st/bin/busybox"
  # Host binaries first, so busybox links never shadow them.
  local b p
  for b in "${HOST_BINS[@]}"; do
    p=$(command -v "$b") || die "host binary $b not found"
    copy_with_libs "$st" "$p" "/usr/bin/$b"
  done
  for b in sbin/load_policy usr/sbin/getenforce usr/sbin/setenforce usr/sbin/setfilecon \
    usr/sbin/getfilecon usr/bin/sestatus usr/sbin/selinuxenabled; do
    LIB_ROOT=$root LD_LIBRARY_PATH=$libs copy_with_libs "$st" "$root/$b" "/usr/sbin/$(basename "$b")"
  done
  [ -f /etc/mke2fs.conf ] && cp /etc/mke2fs.conf "$st/etc/mke2fs.conf"
  # busybox applets where nothing else lives.
  local applet
  while read -r applet; do
    [ -e "$st/$applet" ] || [ -e "$st/usr/bin/$(basename "$applet")" ] ||
      [ -e "$st/usr/sbin/$(basename "$applet")" ] || ln -s /bin/busybox "$st/$applet"
  done < <(/bin/busybox --list-full)
  # The policy and its contexts.
  mkdir -p "$st/etc/selinux"
  cp -a "$pol/etc/selinux/default" "$st/etc/selinux/default"
  # Kernel modules with their dependencies.
  depmod -b "$root" "$kver" || die "depmod -b $root $kver"
  local ko
  while read -r ko; do
    ko=${ko#"$root"}
    mkdir -p "$st$(dirname "$ko")"
    cp "$root$ko" "$st$ko"
  done < <(modprobe -d "$root" -S "$kver" -a --show-depends "${MODULES[@]}" | awk '/^insmod/ {print $2}')
  cp "$root/lib/modules/$kver"/modules.{order,builtin,builtin.modinfo} "$st/lib/modules/$kver/"
  depmod -b "$st" "$kver" || die "depmod -b $st $kver"
  echo "$kver" >"$st/etc/vm-kernel-release"

  say "packing the initramfs"
  (cd "$st" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet | gzip -6) \
    >"$out/base.cpio.gz.tmp" || die "cpio of $st"
  mv "$out/base.cpio.gz.tmp" "$out/base.cpio.gz"
  cp "$root/boot/vmlinuz-$kver" "$out/vmlinuz"
  echo "$kpkg" >"$out/kernel-package"
  rm -rf "$work/stage" "$work/debs" "$work/root" "$work/pol"
  echo "$key" >"$out/stamp"
  say "base image built in $((SECONDS - t0)) s ($(du -h "$out/base.cpio.gz" | cut -f1) initramfs)"
}

build_payload() {
  local out=$1 volumed=$2 scenario=$3 dest=$4 driver=${5:-}
  [ -x "$volumed" ] || die "volumed binary $volumed is not executable"
  [ -f "$scenario" ] || die "scenario $scenario missing"
  [ -z "$driver" ] || [ -x "$driver" ] || die "test driver $driver is not executable"
  local st
  st=$(mktemp -d "${dest}.stage.XXXXXX")
  mkdir -p "$st/usr/local/bin"
  copy_with_libs "$st" "$volumed" /usr/local/bin/volumed
  strip --strip-debug "$st/usr/local/bin/volumed" || die "strip $st/usr/local/bin/volumed"
  if [ -n "$driver" ]; then
    copy_with_libs "$st" "$driver" /usr/local/bin/volumed-testdriver
    strip --strip-debug "$st/usr/local/bin/volumed-testdriver" ||
      die "strip $st/usr/local/bin/volumed-testdriver"
  fi
  cp "$scenario" "$st/scenario.sh"
  chmod 755 "$st/scenario.sh"
  (cd "$st" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet) >"$dest" ||
    die "cpio of $st"
  rm -rf "$st"
}

case "${1:-}" in
  base) [ $# = 2 ] || die "usage: build.sh base OUTDIR"; build_base "$2" ;;
  payload)
    [ $# = 5 ] || [ $# = 6 ] || die "usage: build.sh payload OUTDIR VOLUMED SCENARIO DEST [TESTDRIVER]"
    build_payload "$2" "$3" "$4" "$5" "${6:-}"
    ;;
  *) die "usage: build.sh base OUTDIR | build.sh payload OUTDIR VOLUMED SCENARIO DEST [TESTDRIVER]" ;;
esac
