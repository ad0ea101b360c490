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

# ferretdb_build NAME TAGS: FerretDB built from tools/ferretdb with Go build tags TAGS (comma-separated,
# may be empty), once per version of its sources, patches, TAGS and build flags, as $cache/NAME-<hash>, linked as
# .tools/bin/NAME. FerretDB's module source, patched (tools/ferretdb/patches: see each file), replaces
# the published module in a copy of our Go module. Go's build cache makes a second variant cheaper.
ferretdb_build() {
  local name="$1" tags="$2" src="$root/tools/ferretdb" hash fbin build moddir p t0=$SECONDS
  # No DWARF (-dwarf=false, -s -w): about a fifth of a cold build's CPU. Go's profiler (-pprof) and
  # panics' stack traces do without it (they read the runtime's own tables); a debugger would not.
  local flags=(-trimpath -tags "$tags" -gcflags=all=-dwarf=false "-ldflags=-s -w")
  hash="$( (cat "$src/go.mod" "$src/go.sum" "$src"/*.go "$src"/patches/*.patch; echo "flags ${flags[*]}") | sha256sum | cut -c1-16)"
  fbin="$cache/$name-$hash"
  if [ ! -x "$fbin" ]; then
    say "building $name (FerretDB${tags:+, tags $tags}; a minute or two the first time)"
    build="$cache/$name-build-$hash"
    rm -rf "$build" && mkdir -p "$build/app"
    cp "$src/go.mod" "$src/go.sum" "$src"/*.go "$build/app/"
    moddir="$(cd "$build/app" && GOFLAGS=-mod=mod go mod download -json github.com/FerretDB/FerretDB | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [ -d "$moddir" ] || { echo "toolchain: could not download FerretDB's module source" >&2; exit 1; }
    cp -r "$moddir" "$build/FerretDB" && chmod -R u+w "$build/FerretDB"
    for p in "$src"/patches/*.patch; do patch -s -p1 -d "$build/FerretDB" < "$p"; done
    # CGO_ENABLED=0: nothing here needs C (the SQLite backend is pure Go), and the standard library's
    # cgo parts (net, os/user, runtime/cgo) would cost a C compiler's time on a cold Go cache.
    (cd "$build/app" && go mod edit -replace github.com/FerretDB/FerretDB=../FerretDB \
      && CGO_ENABLED=0 GOFLAGS=-mod=mod go build "${flags[@]}" -o "$fbin.tmp" . && mv "$fbin.tmp" "$fbin")
    rm -rf "$build"
    say "built $name ($((SECONDS - t0)) s)"
  fi
  ln -sfn "$fbin" "$root/.tools/bin/$name"
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
