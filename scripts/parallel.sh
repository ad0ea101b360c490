#!/usr/bin/env bash
# Runs the given npm scripts side by side (`bash scripts/parallel.sh lint:eslint lint:format …`), each
# to the end whatever the others do; prints each one's output in the order given, once it has ended,
# with its exit status and time; exits 1 if any of them failed. The build (the server's tsc and the
# console's) and npm test's static checks (the tests' type check, eslint, prettier, dependency-cruiser)
# are independent single-threaded Node processes: one after another they leave a core idle.
set -u
cd "$(dirname "$0")/.."
if [ "$#" -eq 0 ]; then
  echo "usage: bash scripts/parallel.sh <npm script>…" >&2
  exit 2
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
pids=()
i=0
for name in "$@"; do
  (
    start=$SECONDS
    npm run -s "$name" > "$out/$i.log" 2>&1
    status=$?
    echo "$status $((SECONDS - start))" > "$out/$i.status"
  ) &
  pids+=("$!")
  i=$((i + 1))
done
failed=0
i=0
for name in "$@"; do
  wait "${pids[$i]}"
  read -r status took < "$out/$i.status" || { status=1; took='?'; }
  cat "$out/$i.log"
  if [ "$status" -eq 0 ]; then
    echo "[$name] ok (${took} s)"
  else
    echo "[$name] FAILED, exit $status (${took} s)" >&2
    failed=1
  fi
  i=$((i + 1))
done
exit "$failed"
