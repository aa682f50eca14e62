#!/usr/bin/env bash
# The one place that runs apt-get for this repository (the Makefile's `system` target and native/build*.sh call it):
#
#   tools/debian_packages.sh install PACKAGE...     installs those of PACKAGE... that are not installed
#   tools/debian_packages.sh download PACKAGE DIR   puts PACKAGE's .deb into DIR (no install)
#
# apt-get holds dpkg's lock while it runs, and a second apt-get started meanwhile fails at once ("Could not get lock
# /var/lib/dpkg/lock-frontend"): `make -j` runs recipes side by side, and two of them may need packages on a fresh
# machine. Every call here first takes one lock (S2T_APT_LOCK, /tmp/skill2triton-apt.lock by default), waiting up
# to S2T_APT_LOCK_SECONDS (900), so calls from this repository run one after another, and the second one finds
# installed what the first installed; apt-get itself also waits that long for an apt run from elsewhere
# (DPkg::Lock::Timeout). Through sudo unless run as root.
set -euo pipefail
me=${0##*/}
# Not under TMPDIR: two callers with different temporary folders would take two different locks.
lock=${S2T_APT_LOCK:-/tmp/skill2triton-apt.lock}
wait_s=${S2T_APT_LOCK_SECONDS:-900}

usage() { echo "usage: $0 install PACKAGE... | download PACKAGE DIR" >&2; exit 2; }
[ $# -ge 2 ] || usage
command=$1
shift
if ! [[ $wait_s =~ ^[0-9]+$ ]]; then
  echo "$me: S2T_APT_LOCK_SECONDS must be a whole number of seconds, got '$wait_s'" >&2
  exit 2
fi

as_root() {
  if [ "$(id -u)" = 0 ]; then
    "$@"
  elif command -v sudo >/dev/null; then
    sudo "$@"
  else
    echo "$me: '$*' needs root: run it as root, or install sudo" >&2
    return 1
  fi
}

# The lock's descriptor is closed for apt-get: a daemon that a package's maintainer script starts (where no init
# system starts it instead, as in a container) would otherwise inherit it and hold the lock as long as it runs.
# DEBIAN_FRONTEND goes through env, after sudo, whose env_reset would drop it from sudo's own environment.
apt_get() {
  as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout="$wait_s" -qq "$@" {lock_fd}>&-
}

# Opened for reading, created first where missing, readable and writable by all: a lock file another user (or root,
# with its umask) created stays usable by everyone, where opening it for writing would be refused.
[ -e "$lock" ] || (umask 000 && : >>"$lock") 2>/dev/null || true
exec {lock_fd}<"$lock"
if ! flock -n "$lock_fd"; then
  echo "$me: waiting for $lock: another install of this repository's Debian packages holds it" >&2
  flock -w "$wait_s" "$lock_fd" || {
    holders=$(lslocks --noheadings --raw --output PID,PATH 2>/dev/null | awk -v path="$lock" '$2 == path { print $1 }' \
      | sort -u | tr '\n' ' ')
    echo "$me: gave up after waiting ${wait_s} s for $lock, still held${holders:+ by process ${holders% }};" \
      "raise S2T_APT_LOCK_SECONDS to wait longer" >&2
    exit 1
  }
fi

installed() { [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]; }

case $command in
  install)
    missing=()
    # Installed, not merely known to dpkg: `dpkg -s` also succeeds for a package removed with its configuration kept.
    for package in "$@"; do installed "$package" || missing+=("$package"); done
    [ ${#missing[@]} -gt 0 ] || exit 0
    echo "installing ${missing[*]}"
    apt_get update
    apt_get install -y "${missing[@]}" >/dev/null
    ;;
  download)
    [ $# -eq 2 ] || usage
    # apt-get download needs no root, but a package list: read one, then fetch again after an update if it failed.
    (cd "$2" && { apt-get -qq download "$1" {lock_fd}>&- 2>/dev/null \
      || { apt_get update && apt-get -qq download "$1" {lock_fd}>&-; }; })
    ;;
  *) usage ;;
esac
