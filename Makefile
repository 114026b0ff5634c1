# kvforensics: the single front door. `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test lint bench clean fake-nvml gpu-check sdist image

$(STAMP): pyproject.toml
	@echo ">> creating $(VENV) and installing kvforensics (editable) with test tools"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	@echo ">> kvforensics inspect --from examples/seed-node.json (Kimi-K2.5 TP8, 8 GPUs)"
	@$(BIN)/kvforensics inspect --from examples/seed-node.json; \
	  rc=$$?; if [ $$rc -eq 1 ]; then echo ">> exit code 1: findings at or above --fail-on warning (expected here)"; exit 0; fi; exit $$rc

test: $(STAMP) fake-nvml
	@echo ">> running tests"
	$(BIN)/python -m pytest

# The driver-level fake of libnvidia-ml.so.1 the tests load through the real nvidia-ml-py.
FAKE_NVML := tests/fake_nvml/build/libnvidia-ml.so.1
fake-nvml: $(FAKE_NVML)
$(FAKE_NVML): tests/fake_nvml/fake_nvml.c
	@echo ">> building the fake NVML driver library"
	@mkdir -p $(dir $@)
	$${CC:-cc} -O2 -Wall -shared -fPIC -o $@ $< -ldl

# Only on a machine with an NVIDIA GPU: the NVML collector vs nvidia-smi vs CUDA's cuMemGetInfo, with a
# known allocation made through the CUDA driver API (ctypes; nothing to install beyond the venv).
gpu-check: $(STAMP)
	@echo ">> comparing the NVML collector with nvidia-smi and the CUDA driver API"
	$(BIN)/python bench/gpu_check.py
	@echo ">> inspecting a vLLM-shaped engine core that holds real GPU memory"
	$(BIN)/python bench/gpu_live.py

lint: $(STAMP)
	@echo ">> ruff"
	$(BIN)/ruff check kvforensics agent collectors reports tests bench examples
	@echo ">> complexity (radon cc): no function over 25, at most 5 over 20"
	$(BIN)/python tests/complexity_gate.py

bench: $(STAMP)
	@echo ">> benchmarks (results: bench/RESULTS.md)"
	$(BIN)/python bench/bench_analyze.py
	$(BIN)/python bench/bench_analyze_vllm.py
	$(BIN)/python bench/bench_inspect.py
	$(BIN)/python bench/bench_fleet.py
	$(BIN)/python bench/bench_record.py
	$(BIN)/python bench/bench_hostile.py
	$(BIN)/python bench/bench_serve_slow_clients.py
	$(BIN)/python bench/bench_perf.py
	$(BIN)/python bench/bench_dict_lines.py

# The source distribution (tests, deployment files and all) and the container image built from it
# (deploy/kubernetes/Containerfile; BUILDER=docker or buildah also work).
BUILDER ?= podman
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
sdist: $(STAMP)
	@mkdir -p dist
	$(BIN)/python -c "from setuptools import build_meta; print('dist/' + build_meta.build_sdist('dist'))"

image: sdist
	$(BUILDER) build -f deploy/kubernetes/Containerfile --build-arg VERSION=$(VERSION) -t kvforensics:$(VERSION) dist/

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache bench/out
