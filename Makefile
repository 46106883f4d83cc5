# Magpie: two set-up commands for a fresh Debian machine.
#   make bench   installs what is missing, builds release, runs the default benchmark suite
#   make test    installs what is missing, builds (no warnings allowed in our code), runs every test
SHELL := /bin/bash
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := libxxhash-dev libzstd-dev pkg-config

.PHONY: deps bench test build format clean

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

format:
	swift format --in-place --recursive Package.swift Sources Benchmarks Tests

clean:
	rm -rf .build bench-results
