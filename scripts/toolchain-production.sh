#!/usr/bin/env bash
# The production profile's servers (`npm run start:production`, scripts/production.ts; its test,
# test/integration/ops/production.test.ts, through the tests' global setup), on top of scripts/toolchain.sh,
# cached by version like it:
#   - PostgreSQL's server (Debian's postgresql), for Temporal and FerretDB, when the system lacks it
#   - the Temporal server and temporal-sql-tool, built from the go.temporal.io/server module (the
#     version the dev stack's Temporal CLI embeds), with its PostgreSQL schema files
#   - FerretDB with its PostgreSQL backend (.tools/bin/ferretdb-postgresql), from tools/ferretdb like
#     the dev stack's SQLite-only build
#   - Temporal's Web UI server, github.com/temporalio/ui-server/v2 (its web assets are embedded), the
#     version the CLI embeds
# The first run on a machine builds them from Go: about ten minutes on 2 cores (Go's caches make
# a rebuild faster); later runs take a second. The dev stack (npm start) needs none of this.
set -euo pipefail
# shellcheck source=scripts/toolchain-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/toolchain-lib.sh"
toolchain_lock toolchain-production
command -v go >/dev/null 2>&1 || { say "missing: Go (scripts/toolchain.sh installs it; run it first)"; exit 1; }

missing=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
apt_install "${missing[@]}"

tsv="1.32.0"
tsdir="$cache/temporal-server-$tsv"
uiv="2.54.1"
uibin="$cache/temporal-ui-server-$uiv"
if [ ! -f "$tsdir/.complete" ] || [ ! -x "$uibin" ]; then
  say "building the production profile's servers: the Temporal server $tsv, temporal-sql-tool and Temporal's UI server $uiv"
  say "(about ten minutes the first time on 2 cores; npm start does not need them)"
fi

temporal_server() {
  [ -f "$tsdir/.complete" ] && return 0
  local t0=$SECONDS tsrc
  rm -rf "$tsdir" && mkdir -p "$tsdir/bin"
  tsrc="$(go_module_source "go.temporal.io/server@v$tsv")"
  (cd "$tsrc" && go build -trimpath -o "$tsdir/bin/" ./cmd/server ./cmd/tools/sql)
  mv "$tsdir/bin/server" "$tsdir/bin/temporal-server" && mv "$tsdir/bin/sql" "$tsdir/bin/temporal-sql-tool"
  mkdir -p "$tsdir/schema" && cp -r "$tsrc/schema/postgresql" "$tsdir/schema/" && chmod -R u+w,go+rX "$tsdir/schema"
  touch "$tsdir/.complete"
  say "built the Temporal server $tsv and temporal-sql-tool ($((SECONDS - t0)) s)"
}

ui_server() {
  [ -x "$uibin" ] && return 0
  local t0=$SECONDS uisrc
  uisrc="$(go_module_source "github.com/temporalio/ui-server/v2@v$uiv")"
  (cd "$uisrc" && go build -trimpath -o "$uibin.tmp" ./cmd/server && mv "$uibin.tmp" "$uibin")
  say "built Temporal's UI server $uiv ($((SECONDS - t0)) s)"
}

ferretdb_postgresql() {
  ferretdb_build ferretdb-postgresql ""
}

run_steps temporal_server
run_steps ui_server
run_steps ferretdb_postgresql
ln -sfn "$tsdir/bin/temporal-server" "$root/.tools/bin/temporal-server"
ln -sfn "$tsdir/bin/temporal-sql-tool" "$root/.tools/bin/temporal-sql-tool"
ln -sfn "$tsdir/schema" "$root/.tools/temporal-schema"
ln -sfn "$uibin" "$root/.tools/bin/temporal-ui-server"
