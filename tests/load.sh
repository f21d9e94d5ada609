#!/usr/bin/env bash
# tests/load.sh N -- COMMAND...: run COMMAND with N CPU-bound busy processes beside it
# (each a shell loop that never sleeps), then stop them, whatever COMMAND's outcome.
# Exits with COMMAND's status. Used to check that the suite passes on a busy machine:
#     tests/load.sh 2 -- bash .ci/run
set -uo pipefail
if [[ $# -lt 3 || $2 != "--" || ! $1 =~ ^[0-9]+$ ]]; then
    echo "usage: tests/load.sh N -- COMMAND..." >&2
    exit 2
fi
count=$1
shift 2
busy_pids=()
stop_busy() {
    local pid
    for pid in "${busy_pids[@]}"; do kill "$pid" 2> /dev/null; done
    for pid in "${busy_pids[@]}"; do wait "$pid" 2> /dev/null; done
    busy_pids=()
}
trap stop_busy EXIT
trap 'exit 130' INT TERM
for ((i = 0; i < count; i++)); do
    ( trap - INT TERM; while :; do :; done ) &
    busy_pids+=($!)
done
echo "== $count busy processes beside: $* (pids ${busy_pids[*]}) ==" >&2
"$@"
status=$?
exit "$status"
