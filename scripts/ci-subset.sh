#!/usr/bin/env bash
# Runs a command (a swift build or test) over a subset of the package (MAGPIE_CI_SUBSET, see the end of
# Package.swift) without disturbing the full package's resolution: SwiftPM writes the subset's pins to
# Package.resolved, which would make the next build of the full package resolve again. The versions are
# the same (one graph, fewer nodes), so the full file is put back as it was, or removed if there was none.
#   scripts/ci-subset.sh core swift test --sanitize=address --scratch-path .build-asan ...
set -uo pipefail
cd "$(dirname "$0")/.."
subset=$1; shift
saved=$(mktemp -t magpie-resolved.XXXXXX)
had=0
if [ -f Package.resolved ]; then cp -p Package.resolved "$saved"; had=1; fi
restore() {
  if [ $had = 1 ]; then cp -p "$saved" Package.resolved; else rm -f Package.resolved; fi
  rm -f "$saved"
}
trap restore EXIT
MAGPIE_CI_SUBSET=$subset "$@"
