#!/usr/bin/env bash
# npm run build:console: the console's type check (tsc -p console/tsconfig.json) and its build (vite,
# into dist/console), skipped when what they read is what the build there was made from: the hash of
# console/ (sources, public/, index.html, configs), contract/ (whose types it imports) and the lockfile,
# kept in dist/console/.inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=dist/console/.inputs
hash="$( (find console contract -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; sha256sum package-lock.json) | sha256sum | cut -d' ' -f1)"
if [ -f dist/console/index.html ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$hash" ]; then
  exit 0
fi
rm -f "$stamp"
tsc -p console/tsconfig.json
vite build -c console/vite.config.ts
printf '%s' "$hash" > "$stamp"
