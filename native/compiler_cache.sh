# Sourced by the native build scripts, from the repository's root, once their packages are in place: each compile
# runs through ccache, so that a source compiled before from the same inputs (in this checkout, in another clone,
# in the copy a wheel is built from) is taken from ccache's store instead of compiled again. Paths under the root
# are hashed relative to it and the working folder is left out of the hash, so that clones at other paths share the
# store; the scripts write protoc's code at a fixed path under the root for the same reason, and compile apart from
# linking (ccache keeps compiles only).
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=true

# wait_for_each PID...: waits for each compile started in the background; fails if any of them failed.
wait_for_each() {
  local pid status=0
  for pid in "$@"; do wait "$pid" || status=1; done
  return $status
}
