# Ferry: `make demo` and `make test` work on a fresh Debian bookworm machine.
BUILD ?= build
BUILD_TYPE ?= RelWithDebInfo
CMAKE_FLAGS ?=

.PHONY: all deps configure build test unit integration demo cuda-check clean \
        fuzz-build fuzz fuzz-ci fuzz-seeds sanitize

all: build

deps:
	bash scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD)

# The whole suite: unit and integration tests against real redis-server/broker/worker processes.
test: build
	ctest --test-dir $(BUILD) --output-on-failure --timeout 600

unit: build
	ctest --test-dir $(BUILD) --output-on-failure -L unit

integration: build
	ctest --test-dir $(BUILD) --output-on-failure -L integration

demo: build
	bash scripts/demo.sh $(BUILD)

# Compiles and links the worker's CUDA path against Debian's CUDA libtorch 2.6 (no GPU needed;
# downloads ~1.2 GB of .debs into /tmp the first time). Not part of `make test`.
cuda-check:
	bash scripts/check-cuda-build.sh

# Fuzzing and sanitizers (tests/fuzz/README.md), each in a clang build dir of its own, without
# libtorch (nothing fuzzed or sanitized here needs it). `make fuzz`: every libFuzzer target for
# FUZZ_SECONDS each; `make fuzz-ci`: each over its committed corpus plus FUZZ_CI_SECONDS of new
# inputs; both fail on any crash, sanitizer report, leak or oversized allocation. `make sanitize`:
# the unit tests, and the integration tests that need no ferry-worker, built with ASan + UBSan.
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_CI_SECONDS ?= 15
ASAN_BUILD ?= build-asan
# Left out of the sanitized run: the glibc malloc policy tests (ASan replaces malloc), the
# deploy files check (Python; `make test` runs it) and the install test (it links a consumer,
# built without ASan, against the instrumented libraries).
SANITIZE_CTEST_ARGS ?= -E "^(MallocPolicyTest[.]|deploy[.]files_validate$$|install[.])"
CLANG_CMAKE = CC=clang CXX=clang++ cmake -S . -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	-DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON

fuzz-build: deps
	bash tests/fuzz/install-clang.sh
	$(CLANG_CMAKE) -B $(FUZZ_BUILD) -DFERRY_FUZZ=ON -DFERRY_BUILD_TESTS=OFF
	cmake --build $(FUZZ_BUILD) --target fuzzers

fuzz: fuzz-build
	bash tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

fuzz-ci: fuzz-build
	bash tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_CI_SECONDS)

# Rewrites tests/fuzz/corpus from Ferry's own encoders (review the diff before committing it).
fuzz-seeds: fuzz-build
	$(FUZZ_BUILD)/tests/fuzz/ferry_fuzz_seeds tests/fuzz/corpus

sanitize: deps
	bash tests/fuzz/install-clang.sh
	$(CLANG_CMAKE) -B $(ASAN_BUILD) -DFERRY_SANITIZE=address,undefined
	cmake --build $(ASAN_BUILD)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir $(ASAN_BUILD) --output-on-failure --timeout 600 $(SANITIZE_CTEST_ARGS)

clean:
	rm -rf $(BUILD)
