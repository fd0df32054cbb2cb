# tvmsched: `make demo` and `make test` work on a fresh machine (they create .venv first).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TVMSCHED := $(VENV)/bin/tvmsched
STAMP := $(VENV)/.installed
DEMO_MODEL ?= resnet18
PYTEST_WORKERS ?= 2

# The package is built by scikit-build-core (pyproject.toml [tool.scikit-build], CMakeLists.txt): the engine
# (C++17 on tvm-ffi; the CUDA driver API is declared in runtime/native/src/cuda_driver.h, libcuda is loaded at run
# time), its headers and CMake package, and the gRPC stubs, installed into the package. `make setup` installs it
# editable into .venv without build isolation (the build requirements are installed into .venv first) and with a
# persistent build folder, so an engine edit rebuilds only what changed; it also builds the wheel once into the
# wheelhouse with the wheels of its run-time dependencies (tests/test_wheel.py installs them offline).
SKBUILD := --no-build-isolation -Cbuild-dir=build/{wheel_tag}
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2
ENGINE := $(VENV)/.engine
ENGINE_SOURCES := $(wildcard CMakeLists.txt build_support/* runtime/native/CMakeLists.txt runtime/native/src/* \
	runtime/native/include/tvmsched/* runtime/native/cmake/* tvmsched/serve/proto/*)
WHEELHOUSE := build/wheelhouse
WHEEL := $(WHEELHOUSE)/.wheel
WHEEL_DEPS := $(WHEELHOUSE)/.deps
PACKAGE_FILES := $(shell git ls-files tvmsched runtime passes tuning_db models 2>/dev/null)
# a field of pyproject.toml, one requirement a line (xargs keeps ">=" away from the shell)
PYPROJECT = $(PYTHON) -c 'import sys, tomllib; t = tomllib.load(open("pyproject.toml", "rb")); print(*eval(sys.argv[1]), sep="\n")'

.PHONY: setup wheel demo test lint clean cpp

setup: $(ENGINE) $(WHEEL) $(WHEEL_DEPS)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PYPROJECT) 't["build-system"]["requires"]' | xargs -d '\n' $(PY) -m pip install -q
	$(PY) -m pip install -q $(SKBUILD) -e ".[dev]"
	touch $(STAMP) $(ENGINE)

# an engine (or proto) edit: the editable install again, which rebuilds incrementally in build/<wheel tag> (not
# right after $(STAMP)'s install, which built it)
$(ENGINE): $(STAMP) $(ENGINE_SOURCES)
	if [ ! -e $@ ] || [ -n "$$(find $(ENGINE_SOURCES) -newer $@)" ]; then \
		$(PY) -m pip install -q --no-deps $(SKBUILD) -e . && touch $@; fi

# the wheel (the same build folder: only its install step runs again) and, once per pyproject.toml, the wheels of its
# run-time dependencies (pip's cache keeps later downloads short)
wheel: $(WHEEL)
$(WHEEL): $(ENGINE) $(PACKAGE_FILES)
	mkdir -p $(WHEELHOUSE) && rm -f $(WHEELHOUSE)/tvmsched-*.whl
	$(PY) -m pip wheel -q --no-deps $(SKBUILD) -w $(WHEELHOUSE) .
	touch $(WHEEL)
$(WHEEL_DEPS): pyproject.toml $(STAMP)
	mkdir -p $(WHEELHOUSE)
	$(PYPROJECT) 't["project"]["dependencies"]' | xargs -d '\n' $(PY) -m pip download -q --only-binary=:all: -d $(WHEELHOUSE)
	touch $(WHEEL_DEPS)

# the C++ examples (examples/cpp, README "Embedding in C++"): build/cpp/tvmsched_run, build/cpp/tvmsched_server
CPP_PACKAGES := libcpp-httplib-dev nlohmann-json3-dev libprotobuf-dev protobuf-compiler
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

cpp: setup
	dpkg -s $(CPP_PACKAGES) >/dev/null 2>&1 || ($(SUDO) apt-get update && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y $(CPP_PACKAGES))
	mkdir -p build && cmake -S examples/cpp -B build/cpp -DPython_EXECUTABLE=$(abspath $(PY)) \
		-Dtvmsched_DIR="$$($(PY) -m tvmsched.runtime.native --cmakedir)" > build/cpp-cmake.log || (cat build/cpp-cmake.log; exit 1)
	cmake --build build/cpp -j2

demo: setup
	mkdir -p out
	$(TVMSCHED) models build $(DEMO_MODEL) -o out/$(DEMO_MODEL).onnx
	$(TVMSCHED) compile out/$(DEMO_MODEL).onnx -o out/$(DEMO_MODEL).tvms
	$(TVMSCHED) inspect out/$(DEMO_MODEL).tvms | head -8
	$(TVMSCHED) run out/$(DEMO_MODEL).tvms --check out/$(DEMO_MODEL).onnx --repeat 20

# style: ruff (pyproject.toml [tool.ruff]) and clang-format (.clang-format) on the engine and the C++ examples
CPP_FILES = $(shell find runtime/native examples/cpp \( -name '*.cc' -o -name '*.h' \) -not -path '*/build/*')
lint: setup
	$(PY) -m ruff check .
	$(VENV)/bin/clang-format --dry-run --Werror $(CPP_FILES)

# the engine's tests again with the CPU device's launches asynchronous (a GPU stream's behaviour: launch queues, K in
# flight, events, re-plans), so the GPU path's logic is tested on every run (docs/architecture.md)
# (every test file that runs models on the engine's streams: the whole of test_stress.py found two GPU-path defects
# the narrower set missed, 2026-11-26)
ASYNC_TESTS = tests/runtime/test_engine.py tests/runtime/test_preemption.py tests/runtime/test_switching.py \
	tests/runtime/test_tiering.py tests/runtime/test_faults.py tests/runtime/test_stress.py \
	tests/runtime/test_runtime.py tests/runtime/test_runtime_budgets.py tests/runtime/test_memory_budget.py \
	tests/runtime/test_request_priority.py tests/runtime/test_policies.py tests/runtime/test_host_overhead.py \
	tests/runtime/test_engine_runtime.py tests/runtime/test_runtime_api.py tests/runtime/test_multi_device.py tests/runtime/test_split_model.py \
	tests/test_batch_sizes.py::test_the_runtime_holds_a_stream_per_size_and_every_answer_agrees_with_the_batch_1_run \
	tests/test_batch_sizes.py::test_each_size_figure_follows_its_launches_and_a_size_none_chooses_runs_again \
	tests/test_batch_sizes.py::test_preferred_batch_sizes_must_be_compiled_sizes_and_a_preferred_size_launches_without_waiting \
	tests/test_batch_sizes.py::test_two_slots_each_hold_every_size_and_both_serve_a_burst \
	tests/test_batch_sizes.py::test_real_time_requests_preempt_the_batched_launches_of_every_size_which_resume_and_answer_right \
	tests/test_batch_sizes.py::test_switched_or_streamed_a_model_of_several_sizes_serves_its_largest_alone_padded \
	tests/test_batch_sizes.py::test_the_batch_size_is_chosen_with_the_candidates_the_policy_takes_at_each_size \
	tests/test_batch_sizes.py::test_one_row_is_padded_into_a_larger_size_where_that_runs_faster_outright \
	tests/test_batch_sizes.py::test_admission_of_a_model_of_several_sizes_counts_the_rows_its_batches_run \
	tests/test_batch_sizes.py::test_rows_of_requests_that_expire_in_the_queue_are_no_longer_ahead
# --dist loadscope: a module's tests go to one worker, so its module fixtures (servers, tuned databases, kits) run
# once per run, not once per worker; compiled artifacts are shared across workers by tests/artifact_cache.py
test: setup lint
	$(PY) -m pytest -q -rs -n $(PYTEST_WORKERS) --dist loadscope --durations=25 --basetemp=build/pytest
	TVMSCHED_CPU_LAUNCHES=async TVMSCHED_TEST_CACHE=build/pytest/shared-cache \
		$(PY) -m pytest -q -rs -n $(PYTEST_WORKERS) --dist loadscope --durations=25 --basetemp=build/pytest-async $(ASYNC_TESTS)

clean:
	rm -rf out .pytest_cache $(WHEELHOUSE)
