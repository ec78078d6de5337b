#!/usr/bin/env bash
# The soak's 100,000 requests on a quiet multi-core Linux machine (docs/gateway.md, "100,000 requests"): a
# fault-free run of 3,000 requests, then 100,000 with faults, both at RATE req/s (default 500), the gateway's,
# the client's and the upstream's processes each pinned to a core of its own when the machine has 8 or more.
# About 240 s in all; a guard ends it at 255 s (its workers die with it). Prints the checks and table rows.
# The gateway runs on the loop `slo-console gateway` serves on (uvloop); SOAK_ARGS=--asyncio-loop runs the
# soak's form before 2026-11-26 afternoon (asyncio's default loop), to compare the two on one machine.
#
#   benchmarks/soak_device.sh [PYTHON]        (from anywhere; PYTHON defaults to python3; RATE=500 in the env)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
python=${1:-python3}
rate=${RATE:-500}
requests=${REQUESTS:-100000}  # REQUESTS and BASELINE: smaller, for a try-out
baseline=${BASELINE:-3000}
read -r -a extra <<< "${SOAK_ARGS:-}"
soak=("$python" benchmarks/soak.py --requests "$requests" --rate "$rate" --baseline-requests "$baseline" --max-seconds 205 "${extra[@]}")
if [ "$(nproc)" -ge 8 ] && command -v taskset >/dev/null; then
    # Cores 2, 4, 6: apart from core 0 (interrupts) and from each other's hyperthread siblings.
    soak=(taskset -c 2 "${soak[@]}" --worker-cpus 4,6)
fi
echo "soak_device: $(date -u +%FT%TZ), $(nproc) cores, $("$python" --version 2>&1), tree $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "load before: $(uptime)"
echo "command: ${soak[*]}"
start=$SECONDS
timeout 255 "${soak[@]}"
status=$?
echo "soak_device: exit status $status after $((SECONDS - start)) s; load after: $(uptime)"
exit $status
