#!/usr/bin/env bash
# Runs a command (a swift build or test) and puts Package.resolved back as it was (or removes it if there
# was none). For the builds of CI that resolve less than the full package: a subset of its targets
# (MAGPIE_CI_SUBSET=core, see the end of Package.swift) or its default traits off (the TSan run).
# SwiftPM writes their smaller set of pins to Package.resolved, which would make the next build of the
# full package resolve again; the versions are the same (one graph, fewer nodes).
#   MAGPIE_CI_SUBSET=core scripts/keep-resolved.sh swift test --sanitize=address --scratch-path .build-asan ...
set -uo pipefail
cd "$(dirname "$0")/.."
saved=$(mktemp -t magpie-resolved.XXXXXX)
had=0
if [ -f Package.resolved ]; then cp -p Package.resolved "$saved"; had=1; fi
restore() {
  if [ $had = 1 ]; then cp -p "$saved" Package.resolved; else rm -f Package.resolved; fi
  rm -f "$saved"
}
trap restore EXIT
"$@"
