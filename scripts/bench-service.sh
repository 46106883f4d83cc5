#!/usr/bin/env bash
# The example services under a real HTTP load: wrk against each caching mode in one run, with the origin
# healthy and then failing. One product endpoint (Examples/Catalog: the origin, the product, the
# strategies) on Hummingbird (Examples/HummingbirdService) and on Vapor (Examples/VaporService, the modes
# named vapor-*); each handler renders the product as JSON. `make bench-service` runs it; `make
# service-check` (part of `make test`) runs the short smoke form and checks its promises.
#
# For each mode: start the service (its log to a file), warm every key, then
#   healthy: wrk for DURATION seconds;
#   failing: tell the origin to fail for FAIL seconds and run wrk for those FAIL seconds.
# Reported per phase: requests/s, latency p50 / p99 / p99.9, error responses (non-2xx and socket errors),
# origin calls per second (the origin's own count), and, for the failing phase, the log lines the service
# wrote while the origin failed. magpie-fleet runs two service processes sharing one redis-server (started
# here on a free loopback port, in a temporary directory, and always stopped), each loaded by its own wrk
# with half the connections; throughput and origin calls are summed, latencies are the worse process's.
#
# Environment (defaults): DURATION (10), FAIL (10), CONNECTIONS (64), THREADS (2), KEYS (1000),
# ORIGIN_MS (20), FRESH (5), MODES (every mode), CONFIGURATION (release), OUT (bench-results/service),
# SCRATCH (.build-example: the example's build directory; `make service-check` shares .build).
# magpie-responses is the same endpoint behind Magpie's HTTP response cache (Integrations/MagpieHTTPCache,
# Hummingbird's ResponseCacheMiddleware) over the uncached handler: the row to read beside magpie-memory
# (the loader) and none (uncached); the run ends with its ratios to the loader's row. The Vapor modes:
# vapor-none, vapor-memory (Vapor's memory cache through app.cache, get then set), vapor-magpie-cache
# (the same handler over app.caches.use(.magpie(...))), vapor-magpie-memory (the loader) and
# vapor-magpie-responses (MagpieResponseCacheMiddleware).
# --smoke: 2 s phases, the modes none, hummingbird-memory, magpie-memory, magpie-responses, vapor-none,
# vapor-magpie-memory and vapor-magpie-responses, debug build, and checks:
# exits non-zero when a cached mode returned errors while the origin failed, when the uncached one did
# not, or when the service logged more than 5 lines in a failing phase.
# A full run (not --smoke) also writes $OUT/results.json, in magpie-bench's report format (a row per mode
# and phase, the machine, the commit and the settings), which `make bench-md` puts in BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

smoke=0
if [ "${1:-}" = "--smoke" ]; then smoke=1; fi
if [ $smoke = 1 ]; then
  DURATION=${DURATION:-2} FAIL=${FAIL:-3} CONFIGURATION=${CONFIGURATION:-debug}
  MODES=${MODES:-"none hummingbird-memory magpie-memory magpie-responses vapor-none vapor-magpie-memory vapor-magpie-responses"}
fi
DURATION=${DURATION:-10}
FAIL=${FAIL:-10}
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-2}
KEYS=${KEYS:-1000}
ORIGIN_MS=${ORIGIN_MS:-20}
FRESH=${FRESH:-5}
CONFIGURATION=${CONFIGURATION:-release}
MODES=${MODES:-"none hummingbird-memory magpie-persist magpie-memory magpie-responses magpie-disk magpie-fleet vapor-none vapor-memory vapor-magpie-cache vapor-magpie-memory vapor-magpie-responses"}
OUT=${OUT:-bench-results/service}
export KEYS

for tool in wrk curl python3; do
  command -v $tool >/dev/null || { echo "error: $tool is missing (make bench-service installs it)"; exit 1; }
done

# The commit of the checkout the service is built from, read before the run (for results.json); changed
# prose (*.md, docs/) does not mark it "+changes".
commit=$(git rev-parse --short HEAD 2>/dev/null || true)
if [ -n "$commit" ] && [ -n "$(git status --porcelain --untracked-files=no -- . ':(exclude)*.md' ':(exclude)docs' 2>/dev/null)" ]; then commit="$commit+changes"; fi

scratch=${SCRATCH:-.build-example}
# Each example package is built whole (one executable each), never with --product: in a scratch directory
# another root package used last, SwiftPM looks a product up in that package's build description and fails
# ("No target named 'magpie-vapor-example-…' in build description"); a build without it plans anew.
swift build -c "$CONFIGURATION" --package-path Examples/HummingbirdService --scratch-path "$scratch"
bin="$(cd "$scratch" && pwd)/$CONFIGURATION/magpie-example"
if [[ " $MODES " == *" vapor-"* ]]; then
  swift build -c "$CONFIGURATION" --package-path Examples/VaporService --scratch-path "$scratch"
fi
vapor_bin="$(cd "$scratch" && pwd)/$CONFIGURATION/magpie-vapor-example"
mkdir -p "$OUT"
rm -f "$OUT"/*.log "$OUT"/*-stats.json "$OUT"/service.md
work=$(mktemp -d -t magpie-service.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# start_service NAME ARGS...: starts the service on a free port, waits until it listens; sets $port.
start_service() {
  local name=$1; shift
  local log="$OUT/$name.log"
  # The log exists before the loop below reads it: the service's own redirection may come later (with
  # pipefail, a sed of a missing file ended the run on a loaded machine).
  : >"$log"
  "$bin" --port 0 --origin-latency-ms "$ORIGIN_MS" --fresh-seconds "$FRESH" "$@" >"$log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 200); do
    port=$(sed -n 's/^magpie-example: .* listening on .*:\([0-9]*\)$/\1/p' "$log" | head -n 1)
    if [ -n "$port" ]; then return 0; fi
    if ! kill -0 "${pids[-1]}" 2>/dev/null; then echo "error: $name exited"; cat "$log"; exit 1; fi
    sleep 0.05
  done
  echo "error: $name did not start"; cat "$log"; exit 1
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_vapor NAME MODE: starts the Vapor example (production environment: notice and above logged) with
# the catalog's MODE on a free port, waits until /health answers; sets $port.
start_vapor() {
  local name=$1 mode=$2
  local log="$OUT/$name.log"
  port=$(free_port)
  mkdir -p "$work/$name"
  MAGPIE_EXAMPLE_CACHE="$mode" MAGPIE_EXAMPLE_ORIGIN_MS="$ORIGIN_MS" MAGPIE_EXAMPLE_FRESH_SECONDS="$FRESH" \
    MAGPIE_VAPOR_DIR="$work/$name" "$vapor_bin" serve --env production --hostname 127.0.0.1 --port "$port" >"$log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 400); do
    if curl -sf --noproxy "*" "http://127.0.0.1:$port/health" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "${pids[-1]}" 2>/dev/null; then echo "error: $name exited"; cat "$log"; exit 1; fi
    sleep 0.05
  done
  echo "error: $name did not start"; cat "$log"; exit 1
}

stop_services() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}

# field NAME LINE: a RESULT field.
field() { sed -n "s/.*\b$1=\([0-9]*\).*/\1/p" <<<"$2"; }
origin_calls() { curl -sf --noproxy "*" "http://127.0.0.1:$1/admin/stats" | sed -n 's/.*"calls":\([0-9]*\).*/\1/p'; }

# load SECONDS CONNECTIONS PORT...: one wrk per port (CONNECTIONS split between them), in parallel;
# prints "rps p50 p99 p999 errors" (requests summed, latencies the worst).
load() {
  local seconds=$1 connections=$2; shift 2
  local each=$((connections / $#)) index=0
  local files=() loaders=()
  for p in "$@"; do
    index=$((index + 1))
    SEED=$index WARM="${WARM:-0}" wrk -t "$THREADS" -c "$each" -d "${seconds}s" --timeout 5s -s Examples/HummingbirdService/scripts/products.lua \
      "http://127.0.0.1:$p" >"$work/wrk-$index.out" 2>&1 &
    loaders+=($!)
    files+=("$work/wrk-$index.out")
  done
  for loader in "${loaders[@]}"; do wait "$loader" || true; done
  local requests=0 duration=0 p50=0 p99=0 p999=0 errors=0
  for f in "${files[@]}"; do
    local line; line=$(grep '^RESULT' "$f" || { echo "error: wrk printed no result" >&2; cat "$f" >&2; exit 1; })
    requests=$((requests + $(field requests "$line")))
    local d; d=$(field duration_us "$line"); [ "$d" -gt "$duration" ] && duration=$d
    local v
    v=$(field p50_us "$line"); [ "$v" -gt "$p50" ] && p50=$v
    v=$(field p99_us "$line"); [ "$v" -gt "$p99" ] && p99=$v
    v=$(field p999_us "$line"); [ "$v" -gt "$p999" ] && p999=$v
    errors=$((errors + $(field non2xx "$line") + $(field connect "$line") + $(field read "$line") + $(field write "$line") + $(field timeout "$line")))
  done
  echo "$(awk -v r=$requests -v d=$duration 'BEGIN { printf "%.0f", r / (d / 1e6) }') $p50 $p99 $p999 $errors"
}

ms() { awk -v us="$1" 'BEGIN { printf "%.2f", us / 1000 }'; }

redis_pid=""
start_redis() {
  command -v redis-server >/dev/null || { echo "error: redis-server is missing"; exit 1; }
  redis_port=$(free_port)
  mkdir -p "$work/redis"
  redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work/redis" --daemonize no \
    >"$work/redis/log" 2>&1 &
  redis_pid=$!
  pids+=($redis_pid)
  for _ in $(seq 1 100); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "error: redis-server did not start"; cat "$work/redis/log"; exit 1
}

# check_counters STATS: whether the service's counters agree exactly with the origin's own (every call the
# cache made is a loader run, but for the runs that got another instance's value through the fleet's
# lease instead; every failure a loader failure; without a loader, every failure is an error response). Prints "exact" or what disagrees; fails on a disagreement.
check_counters() {
  python3 - "$1" <<'PY'
import json, sys
stats = json.load(open(sys.argv[1]))
origin, cache = stats["origin"], stats.get("cache")
problems = []
if origin["failures"] == 0:
    problems.append("the origin never failed: the failing phase tested nothing")
if cache is not None and stats.get("through_loader"):
    loads = cache["loader_runs"] - cache.get("shared_loads", 0)
    if loads != origin["calls"]:
        problems.append(f"loader runs {cache['loader_runs']} - shared loads {cache.get('shared_loads', 0)} != origin calls {origin['calls']}")
    if cache["loader_failures"] != origin["failures"]:
        problems.append(f"loader failures {cache['loader_failures']} != origin failures {origin['failures']}")
elif stats["unavailable"] != origin["failures"]:
    problems.append(f"error responses {stats['unavailable']} != origin failures {origin['failures']}")
print("; ".join(problems) if problems else "exact")
sys.exit(1 if problems else 0)
PY
}

table="$OUT/service.md"
{
  echo "| mode | healthy req/s | p50 ms | p99 ms | p99.9 ms | errors | origin calls/s | failing req/s | p99 ms | errors | origin calls/s | log lines |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
} >"$table"
status=0
for mode in $MODES; do
  ports=()
  logs=()
  case $mode in
    magpie-fleet)
      start_redis
      for instance in 1 2; do
        mkdir -p "$work/fleet-$instance"
        start_service "$mode-$instance" --cache "$mode" --directory "$work/fleet-$instance" --redis "redis://127.0.0.1:$redis_port"
        ports+=("$port"); logs+=("$OUT/$mode-$instance.log")
      done ;;
    vapor-memory)
      start_vapor "$mode" vapor-memory; ports+=("$port"); logs+=("$OUT/$mode.log") ;;
    vapor-*)
      start_vapor "$mode" "${mode#vapor-}"; ports+=("$port"); logs+=("$OUT/$mode.log") ;;
    magpie-disk)
      mkdir -p "$work/disk"
      start_service "$mode" --cache "$mode" --directory "$work/disk"; ports+=("$port"); logs+=("$OUT/$mode.log") ;;
    *)
      start_service "$mode" --cache "$mode"; ports+=("$port"); logs+=("$OUT/$mode.log") ;;
  esac
  # Every key asked for (each wrk thread walks them all in turn): the failing phase's checks count errors
  # for cached keys, and 2 s of uniform requests left a few keys unasked now and then.
  WARM=1 load 2 "$CONNECTIONS" "${ports[@]}" >/dev/null

  counters_ok=1
  calls() { local sum=0; for p in "${ports[@]}"; do sum=$((sum + $(origin_calls "$p"))); done; echo $sum; }
  loglines() { cat "${logs[@]}" | grep -v -c -e '^magpie-example: .* listening on' -e 'Server started on' || true; }

  before=$(calls)
  read -r rps p50 p99 p999 errors <<<"$(load "$DURATION" "$CONNECTIONS" "${ports[@]}")"
  healthy_calls=$(awk -v a=$before -v b=$(calls) -v s=$DURATION 'BEGIN { printf "%.0f", (b - a) / s }')

  lines_before=$(loglines)
  before=$(calls)
  for p in "${ports[@]}"; do curl -sf --noproxy "*" -X POST "http://127.0.0.1:$p/admin/origin?fail=$FAIL" >/dev/null; done
  read -r frps fp50 fp99 fp999 ferrors <<<"$(load "$FAIL" "$CONNECTIONS" "${ports[@]}")"
  failing_calls=$(awk -v a=$before -v b=$(calls) -v s=$FAIL 'BEGIN { printf "%.0f", (b - a) / s }')
  lines=$(( $(loglines) - lines_before ))
  counters=""
  instance=0
  for p in "${ports[@]}"; do
    instance=$((instance + 1))
    stats="$OUT/$mode-$instance-stats.json"
    curl -sf --noproxy "*" "http://127.0.0.1:$p/admin/stats" >"$stats"
    counters+="$(check_counters "$stats") " || counters_ok=0
  done

  echo "| $mode | $rps | $(ms $p50) | $(ms $p99) | $(ms $p999) | $errors | $healthy_calls | $frps | $(ms $fp99) | $ferrors | $failing_calls | $lines |" >>"$table"
  echo "$mode $rps $p50 $p99 $p999 $errors $healthy_calls $frps $fp50 $fp99 $fp999 $ferrors $failing_calls $lines" >>"$work/rows"
  echo "$mode: healthy $rps req/s (p50 $(ms $p50) ms, p99 $(ms $p99) ms, p99.9 $(ms $p999) ms, $errors errors, $healthy_calls origin calls/s); origin failing: $frps req/s, $ferrors errors, $failing_calls origin calls/s, $lines log lines; counters: $counters"

  if [ $smoke = 1 ]; then
    case $mode in
      none|vapor-none) [ "$ferrors" -gt 0 ] || { echo "check failed: the uncached service returned no errors while the origin failed"; status=1; } ;;
      magpie-*|vapor-magpie-*) [ "$ferrors" -eq 0 ] || { echo "check failed: $mode returned $ferrors errors for cached keys while the origin failed"; status=1; } ;;
    esac
    [ "$lines" -le 5 ] || { echo "check failed: $mode logged $lines lines while the origin failed"; cat "${logs[@]}"; status=1; }
    [ "$errors" -eq 0 ] || { echo "check failed: $mode returned $errors errors with the origin healthy"; status=1; }
    [ "$counters_ok" = 1 ] || { echo "check failed: $mode's counters disagree with the origin's: $counters"; status=1; }
  fi
  stop_services
  if [ -n "$redis_pid" ]; then redis_pid=""; fi
done
echo
cat "$table"
echo "(wrk -t $THREADS -c $CONNECTIONS, $KEYS keys uniform, origin $ORIGIN_MS ms, fresh $FRESH s; healthy $DURATION s, failing $FAIL s; logs and stats in $OUT)"
# The response cache against the loader on the same endpoint (issue #66's bars: ≥ 1.2 × the requests/s,
# p99 no higher, no errors while the origin fails). A mode named more than once in MODES (alternating,
# say MODES="magpie-memory magpie-responses magpie-memory magpie-responses") is summarised by its medians.
python3 - "$work/rows" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
def median(mode, column): return statistics.median(float(r[column]) for r in rows if r[0] == mode)
for framework, prefix in (("Hummingbird", ""), ("Vapor", "vapor-")):
    responses, loader = prefix + "magpie-responses", prefix + "magpie-memory"
    runs = sum(1 for r in rows if r[0] == responses)
    if runs == 0 or not any(r[0] == loader for r in rows): continue
    errors = sum(int(r[11]) for r in rows if r[0] == responses)
    print(f"{framework}: response cache / loader ({runs} run(s), medians): {median(responses, 1) / median(loader, 1):.2f} x the "
          f"requests/s (bar 1.2), p99 {median(responses, 3) / 1000:.2f} ms against {median(loader, 3) / 1000:.2f} ms, "
          f"{errors} errors while the origin failed")
PY
if [ $smoke = 0 ]; then
  swift_version=$(swift --version 2>/dev/null | sed -n 's/.*Swift version \([0-9.]*\).*/\1/p' | head -n 1)
  python3 - "$work/rows" "$OUT/results.json" "$commit" "${swift_version:-unknown}" <<PY
import json, os, sys, time
rows_path, out, commit, swift = sys.argv[1:5]
def cpu():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"): return line.split(":", 1)[1].strip()
    return "unknown"
def memory():
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"): return int(line.split()[1]) * 1024
    return 0
def system():
    for line in open("/etc/os-release"):
        if line.startswith("PRETTY_NAME="): return line.split("=", 1)[1].strip().strip('"')
    return "Linux"
def row(phase, mode, rps, p50, p99, p999, extra):
    us = lambda v: int(v) * 1000
    return {"scenario": "service-" + phase, "system": mode, "threads": $CONNECTIONS, "operations": 0,
            "seconds": float($DURATION if phase == "healthy" else $FAIL), "ops_per_sec": float(rps),
            "latency_ns": {"p50": us(p50), "p90": 0, "p99": us(p99), "p999": us(p999), "max": 0},
            "hit_ratio": 0, "extra": extra}
results = []
for line in open(rows_path):
    m, rps, p50, p99, p999, err, calls, frps, fp50, fp99, fp999, ferr, fcalls, lines = line.split()
    results.append(row("healthy", m, rps, p50, p99, p999, {"errors": int(err), "origin_calls_per_second": int(calls)}))
    results.append(row("failing", m, frps, fp50, fp99, fp999,
                       {"errors": int(ferr), "origin_calls_per_second": int(fcalls), "log_lines": int(lines)}))
report = {"tool": "bench-service", "version": "1", "date": time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()),
          "machine": {"cores": os.cpu_count(), "os": system(), "cpu": cpu(), "memory_bytes": memory(), "swift": swift},
          "config": {"service": {"connections": $CONNECTIONS, "threads": $THREADS, "keys": $KEYS, "origin_ms": $ORIGIN_MS,
                                 "fresh_seconds": $FRESH, "duration_seconds": $DURATION, "fail_seconds": $FAIL,
                                 "modes": "$MODES".split(), "configuration": "$CONFIGURATION"}},
          "results": results, "commands": {"service": "make bench-service"}}
if commit: report["commit"] = commit
json.dump(report, open(out, "w"), indent=1, sort_keys=True)
print("wrote " + out)
PY
fi
exit $status
