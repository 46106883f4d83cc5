#!/usr/bin/env bash
# Proves that a release build of Magpie carries no test seam: no fault-injection table or check in
# FileIO, no key-hash counter, no sealer parking probe. They exist only under the MAGPIE_TESTING
# condition, which Package.swift sets for debug builds. Usage: check-release-seams.sh RELEASE_BINARY
# DEBUG_BINARY
# The debug binary (the test bundle) is the control: there the symbols must be present, so that a
# renamed symbol cannot make this check pass vacuously.
set -euo pipefail
release=$1
debug=$2
seams=(injectedFailures hasInjections KeyHashCounter parkingProbe)
status=0
for seam in "${seams[@]}"; do
  in_debug=$(nm "$debug" | grep -c "$seam" || true)
  in_release=$(nm "$release" | grep -c "$seam" || true)
  if [ "$in_debug" = 0 ]; then
    echo "error: the control failed: no symbol '$seam' in the debug build $debug"; status=1
  fi
  if [ "$in_release" != 0 ]; then
    echo "error: the release build $release has $in_release symbol(s) of the test seam '$seam'"; status=1
  else
    echo "  release build: no '$seam' (debug build: $in_debug symbols)"
  fi
done
exit $status
