# Magpie: two set-up commands for a fresh Debian machine.
#   make bench   installs what is missing, builds release, runs the default benchmark suite
#   make test    installs what is missing, builds (no warnings allowed in our code), runs every test
SHELL := /bin/bash
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := libxxhash-dev libzstd-dev pkg-config

.PHONY: deps bench test build docs tsan format clean

deps:
	@if ! pkg-config --exists libxxhash libzstd 2>/dev/null; then \
	  echo "installing $(APT_PACKAGES)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES); \
	fi

bench: deps
	swift build -c release --product magpie-bench
	.build/release/magpie-bench

# Builds everything first and fails on any compiler warning in this package's own files.
build: deps
	@set -o pipefail; swift build --build-tests 2>&1 | tee .build-warnings.log
	@if grep -E "^$(CURDIR)/(Sources|Benchmarks|Tests)/.*warning:" .build-warnings.log; then \
	  echo "error: compiler warnings in Magpie's sources (see above)"; rm -f .build-warnings.log; exit 1; fi
	@rm -f .build-warnings.log

test: build
	swift test

# The concurrency suites under Thread Sanitizer. TSan's deadlock detector can livelock on thread start
# and exit in this toolchain (seen with the I/O pool's threads), so it is off; races are still reported.
tsan: deps
	TSAN_OPTIONS="detect_deadlocks=0 halt_on_error=1" swift test --sanitize=thread --scratch-path .build-tsan \
	  --filter "Cache|MemoryTierPropertyTests|DiskTierConcurrencyTests"

# DocC: builds the symbol graph and the catalog, failing on any warning (undocumented parameter,
# broken link).
docs: deps
	mkdir -p .build-docs/symbols
	swift build --scratch-path .build-docs/build --target Magpie -Xswiftc -emit-symbol-graph -Xswiftc -emit-symbol-graph-dir -Xswiftc $(CURDIR)/.build-docs/symbols
	@set -o pipefail; docc convert Sources/Magpie/Magpie.docc --additional-symbol-graph-dir $(CURDIR)/.build-docs/symbols \
	  --fallback-display-name Magpie --fallback-bundle-identifier org.magpie.Magpie --output-path .build-docs/Magpie.doccarchive \
	  --analyze 2>&1 | tee .build-docs.log
	@if grep -E "^(warning|error)" .build-docs.log; then echo "error: DocC warnings"; rm -f .build-docs.log; exit 1; fi
	@rm -f .build-docs.log

format:
	swift format --in-place --recursive Package.swift Sources Benchmarks Tests

clean:
	rm -rf .build bench-results
