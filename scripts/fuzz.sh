#!/usr/bin/env bash
# `npm run fuzz`: installs schemathesis (once, pinned) into the Python venv that holds the Temporal CLI,
# then fuzzes the running stack (scripts/fuzz/run.py). Not part of `npm test`, which never pays for it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="4.32.5"
[ -e "$root/.tools/bin/temporal" ] || bash "$root/scripts/toolchain.sh"
venv="$(dirname "$(dirname "$(readlink -f "$root/.tools/bin/temporal")")")"
if [ "$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("schemathesis"))' 2>/dev/null)" != "$version" ]; then
  echo "[fuzz] installing schemathesis $version into $venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check "schemathesis==$version"
fi
exec "$venv/bin/python" "$root/scripts/fuzz/run.py" "$@"
