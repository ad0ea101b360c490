#!/usr/bin/env bash
# Measures how long a start takes (docs/testing.md, "How long the first ten minutes take"):
#   bash scripts/time-to-up.sh [--until REGEX] [--log FILE] [--keep] <command…>
#   e.g. bash scripts/time-to-up.sh npm start
#        bash scripts/time-to-up.sh --until '^(PASS|FAIL) +unit ' npm test
# runs the command in a process group of its own, prints the seconds until its output has a line
# matching REGEX (grep -E; default: "Sandbox Agent Platform is up"), then stops it as Ctrl-C would
# (SIGINT to the group) and waits for it to end (--keep: leaves it running). Its output goes to FILE
# (default: a temporary file, printed when the command ends before that line).
set -u
log=""
keep=0
until='Sandbox Agent Platform is up'
while [ $# -gt 0 ]; do
  case "$1" in
    --log) log="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    --until) until="$2"; shift 2 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: bash scripts/time-to-up.sh [--until REGEX] [--log FILE] [--keep] <command…>" >&2; exit 2; }
[ -n "$log" ] || log="$(mktemp)"
: > "$log"
start=$(date +%s%N)
setsid "$@" > "$log" 2>&1 < /dev/null &
pid=$!
# npm start prints its line once, after every process of the stack answers; poll the log for it.
while ! grep -Eq "$until" "$log"; do
  if ! kill -0 "$pid" 2>/dev/null; then
    cat "$log" >&2
    echo "time-to-up: '$*' ended before a line matched $until" >&2
    exit 1
  fi
  sleep 0.1
done
took=$(( ($(date +%s%N) - start) / 1000000 ))
# The CPU time its processes used so far (those that ended are in their parents' counts): on a busy
# machine the wall time says more about the others' load than about the start.
cpu=$(cat /proc/[0-9]*/stat 2>/dev/null | awk -v sid="$pid" '{ sub(/^.*\) /, ""); if ($4 == sid) t += $12 + $13 + $14 + $15 } END { print t + 0 }')
tick=$(getconf CLK_TCK)
grep -Em1 "$until" "$log"
printf 'after %d.%03d s, %s s of CPU: %s (load average %s)\n' $((took / 1000)) $((took % 1000)) "$(awk -v c="$cpu" -v t="$tick" 'BEGIN { printf "%.1f", c / t }')" "$*" "$(cut -d' ' -f1-3 /proc/loadavg)"
grep '^\[toolchain\]' "$log" || true
if [ "$keep" -eq 0 ]; then
  kill -INT -- "-$pid" 2>/dev/null
  wait "$pid"
  echo "stopped (exit $?); its output: $log"
else
  echo "still running: process group $pid (stop it: kill -INT -- -$pid); its output: $log"
fi
