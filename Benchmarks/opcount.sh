#!/usr/bin/env bash
# Instructions per operation of the public Cache API, counted by callgrind (deterministic, unlike
# time on our VMs): each operation runs twice with different counts inside `measuredLoop` only
# (--toggle-collect), and instructions per operation = (Ir(2n) - Ir(n)) / n.
#   Benchmarks/opcount.sh [--scratch-path DIR] [operation...]   (default: all four)
# The binary's debug info is stripped first: valgrind 3.19 cannot read Swift 6's.
set -euo pipefail
cd "$(dirname "$0")/.."
scratch=.build
if [ "${1:-}" = --scratch-path ]; then scratch=$2; shift 2; fi
operations=("$@")
[ ${#operations[@]} -gt 0 ] || operations=(memory-hit disk-hit store promote)
command -v valgrind >/dev/null || { sudo apt-get install -y -qq valgrind || apt-get install -y -qq valgrind; }
swift build -c release --scratch-path "$scratch" --product magpie-opcount >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
objcopy --strip-debug "$scratch/release/magpie-opcount" "$work/magpie-opcount"
ir() {  # operation count -> instructions inside measuredLoop
  valgrind --tool=callgrind --toggle-collect='*measuredLoop*' --callgrind-out-file="$work/out.$1.$2" \
    "$work/magpie-opcount" "$1" "$2" >/dev/null 2>"$work/log.$1.$2"
  awk '/^(summary|totals):/ {print $2; exit}' "$work/out.$1.$2"
}
echo "commit $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (modified)'), $(valgrind --version)"
for operation in "${operations[@]}"; do
  if [ "$operation" = promote ]; then n=10000; else n=100000; fi
  small=$(ir "$operation" "$n")
  large=$(ir "$operation" $((2 * n)))
  awk -v op="$operation" -v a="$small" -v b="$large" -v n="$n" \
    'BEGIN { printf "%-11s %10.1f instructions/op   (Ir %.0f at %d ops, %.0f at %d)\n", op, (b - a) / n, a, n, b, 2 * n }'
done
