#!/usr/bin/env bash
# What only the tests need, on top of scripts/toolchain.sh (npm test runs both), cached like it:
#   - docker-compose (test/integration/api/foundation.test.ts checks docker-compose.yml with it) and
#     Debian's chromium (the console's browser tests, test/integration/console/console.test.ts, and
#     npm run console:screenshots / bench -- console), Debian packages, when the system lacks them
#   - OpenComputer's Python client (test/integration/api/python-client.test.ts runs it against the stack)
# The production profile's servers are not here: scripts/toolchain-production.sh, which the tests'
# global setup runs when test/integration/ops/production.test.ts is among the files run.
set -euo pipefail
# shellcheck source=scripts/toolchain-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/toolchain-lib.sh"
toolchain_lock toolchain-test

missing=()
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
[ -x /usr/bin/chromium ] || missing+=(chromium)
apt_install "${missing[@]}"

# opencomputer-sdk from PyPI, pinned, in a venv of its own; test/integration/api/python-client.test.ts
# finds it at .tools/opencomputer-py/bin/python.
ocpy_version="1.1.0"
ocdir="$cache/opencomputer-sdk-$ocpy_version"
pip_venv "$ocdir" "opencomputer-sdk==$ocpy_version" "OpenComputer's Python client (opencomputer-sdk $ocpy_version)"
ln -sfn "$ocdir" "$root/.tools/opencomputer-py"
