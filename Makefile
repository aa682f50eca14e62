# Two entry points on a fresh Debian machine: `make serve` (the main job) and `make test` (the whole suite).
# Everything else is built on demand: system packages, the virtual environment, the legacy model, the ONNX
# conversion, the parity gate and version 1 in the repository.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
S2T := $(BIN)/s2t
# libb64-0d: perf_analyzer from the tritonclient wheel; docker-compose: validating docker-compose.yml offline;
# curl: the README example the tests run.
APT_PACKAGES := libb64-0d docker-compose curl
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

DATA := artifacts/data/germancredit.csv
SAVED_MODEL := artifacts/legacy/risk_model
SCORER_ONNX := artifacts/onnx/risk_scorer.onnx
ADAPTER_SPEC := model_repository/skill_adapter/1/feature_spec.json

.PHONY: serve test system venv models clean

serve: models
	$(S2T) serve

test: models
	$(BIN)/python -m pytest

system:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing $$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt | system
	[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	# compat: the repository root goes on sys.path, so `tools` is this project's and not the stray top-level
	# `tools/` folder that the tf2onnx wheel installs into site-packages.
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]' \
	  --config-settings editable_mode=compat
	$(BIN)/pip check
	touch $@

$(DATA): | $(VENV)/.installed
	$(S2T) data --out $@

$(SAVED_MODEL)/saved_model.pb: $(DATA) tools/legacy_model.py | $(VENV)/.installed
	$(S2T) legacy build --out $(SAVED_MODEL) --data $(DATA)

$(SCORER_ONNX): $(SAVED_MODEL)/saved_model.pb tools/convert.py
	$(S2T) convert $(SAVED_MODEL) $@

$(ADAPTER_SPEC): $(SCORER_ONNX)
	$(S2T) spec $(SCORER_ONNX) --out $@

# Publish (validation + parity gate + atomic move) whenever the served version is not the current conversion.
models: $(ADAPTER_SPEC)
	@latest=$$(ls -d model_repository/risk_scorer/[0-9]* 2>/dev/null | sort -t/ -k3 -n | tail -n 1); \
	if [ -z "$$latest" ] || ! cmp -s "$$latest/model.onnx" $(SCORER_ONNX); then \
	  $(S2T) publish risk_scorer $(SCORER_ONNX); \
	fi
	$(S2T) check-config

clean:
	rm -rf artifacts model_repository/risk_scorer/[0-9]* $(ADAPTER_SPEC)
