# Shared by scripts/toolchain.sh (the dev stack: npm start), scripts/toolchain-test.sh (what only the
# tests need) and scripts/toolchain-production.sh (the production profile's servers). Sourced, not run.
# Tools land in $SAP_CACHE_DIR (default ~/.cache/sandbox-agent-platform) and are linked into .tools/
# of this checkout.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${SAP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sandbox-agent-platform}"
mkdir -p "$cache" "$root/.tools/bin"
export PATH="$PATH:/usr/local/go/bin"
# The terminal, for the [toolchain] lines of steps whose own output goes to a log (run_steps).
exec 3>&2
say() { printf '[toolchain] %s\n' "$*" >&3; }

# One run of each script at a time per cache: a second one waits (two cold builds into one cache
# would remove each other's work).
toolchain_lock() { # name
  exec 9>"$cache/.$1.lock"
  if ! flock -n 9; then
    say "waiting for another $1 run on this cache to finish"
    flock 9
  fi
}

# apt_install PACKAGE…: Debian packages, as root (else: the command to run, and stop).
apt_install() {
  [ $# -gt 0 ] || return 0
  if [ "$(id -u)" -ne 0 ]; then
    say "missing: $*"
    say "installing it needs root; run this, then try again:"
    say "  sudo apt-get update && sudo apt-get install -y $*"
    exit 1
  fi
  local t0=$SECONDS
  say "apt-get install $*"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  say "apt-get install done ($((SECONDS - t0)) s)"
}

# pip_venv DIR PACKAGE==VERSION WHAT: a venv at DIR with that one package from PyPI, made once
# (DIR/.complete marks it whole; a half-made one is made again).
pip_venv() {
  [ -f "$1/.complete" ] && return 0
  local t0=$SECONDS
  say "installing $3"
  rm -rf "$1"
  python3 -m venv "$1"
  "$1/bin/pip" install -q --disable-pip-version-check "$2"
  touch "$1/.complete"
  say "installed $3 ($((SECONDS - t0)) s)"
}

# go_module_source MODULE@VERSION: downloads a Go module (Go's module cache) and prints its directory.
go_module_source() {
  local tmod dir
  tmod="$(mktemp -d)"
  printf 'module download\ngo 1.26\n' > "$tmod/go.mod"
  dir="$(cd "$tmod" && GOFLAGS=-mod=mod go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  rm -rf "$tmod"
  [ -d "$dir" ] || { echo "toolchain: could not download $1" >&2; return 1; }
  printf '%s\n' "$dir"
}

# start_steps NAME…: starts the shell functions NAME… side by side (downloads and builds that do not
# depend on each other), each with its output in a log; their [toolchain] lines reach the terminal as
# they come. wait_steps NAME…: waits for them; when one failed, prints its log and fails (after
# waiting for all of them). run_steps NAME…: both.
declare -A step_pid=()
step_logs="$(mktemp -d)"
trap 'rm -rf "$step_logs"' EXIT
start_steps() {
  local name
  for name in "$@"; do
    ( set -euo pipefail; "$name" ) > "$step_logs/$name.log" 2>&1 &
    step_pid[$name]=$!
  done
}
wait_steps() {
  local name failed=0
  for name in "$@"; do
    if ! wait "${step_pid[$name]}"; then
      say "$name failed:"
      cat "$step_logs/$name.log" >&3
      failed=1
    fi
  done
  [ "$failed" -eq 0 ]
}
run_steps() {
  start_steps "$@"
  wait_steps "$@"
}
