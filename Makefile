# Ferry: `make demo` and `make test` work on a fresh Debian bookworm machine.
BUILD ?= build
BUILD_TYPE ?= RelWithDebInfo
CMAKE_FLAGS ?=

.PHONY: all deps configure build test unit integration demo cuda-check clean

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

clean:
	rm -rf $(BUILD)
