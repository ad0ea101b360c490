#!/usr/bin/env bash
# Runs the given npm scripts side by side (`bash scripts/parallel.sh lint:eslint lint:format …`), each
# to the end whatever the others do; prints each one's output in the order given, once it has ended,
# with its exit status and time; exits 1 if any of them failed. The build (the server's tsc and the
# console's) and npm test's static checks (the tests' type check, eslint, prettier, dependency-cruiser)
# are independent single-threaded Node processes: one after another they leave a core idle.
# `--live NAME` first: NAME is run too, its output straight to the terminal as it comes (npm test's
# unit tests: a failure shows at once), the others at a lower priority (nice) so that it is not slowed
# by them; its status line comes first.
set -u
cd "$(dirname "$0")/.."
live=""
if [ "${1:-}" = "--live" ] && [ "$#" -ge 2 ]; then
  live="$2"
  shift 2
fi
if [ "$#" -eq 0 ] && [ -z "$live" ]; then
  echo "usage: bash scripts/parallel.sh [--live <npm script>] <npm script>…" >&2
  exit 2
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
failed=0
if [ -n "$live" ]; then
  (
    start=$SECONDS
    npm run -s "$live"
    status=$?
    echo "$status $((SECONDS - start))" > "$out/live.status"
  ) &
  live_pid=$!
fi
pids=()
i=0
nice=()
[ -n "$live" ] && nice=(nice -n 10)
for name in "$@"; do
  (
    start=$SECONDS
    "${nice[@]}" npm run -s "$name" > "$out/$i.log" 2>&1
    status=$?
    echo "$status $((SECONDS - start))" > "$out/$i.status"
  ) &
  pids+=("$!")
  i=$((i + 1))
done
if [ -n "$live" ]; then
  wait "$live_pid"
  read -r status took < "$out/live.status" || { status=1; took='?'; }
  if [ "$status" -eq 0 ]; then
    echo "[$live] ok (${took} s)"
  else
    echo "[$live] FAILED, exit $status (${took} s)" >&2
    failed=1
  fi
fi
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
