# Two entry points (see README): `make demo` runs the main job on a zoo model, `make test`
# runs the fast test suite (`make test-slow` the rest). Both create the virtual environment they need from scratch.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_MODEL ?= llama
DEMO_ARGS ?=
# How the demo installs graphsub: editable in a checkout; CI uses a plain `pip install .`.
DEMO_INSTALL ?= -e .
PYTEST_ARGS ?=

.PHONY: demo test test-slow typecheck bench bench-generate bench-targets bench-cpu bench-search bench-egraph fuzz clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The stamp is written only once the installed package imports: a failed install or an
# undeclared dependency leaves no stamp behind, so the next `make demo` installs again.
$(VENV)/.demo-installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q $(DEMO_INSTALL)
	$(BIN)/python -c "import graphsub, graphsub.cli"
	touch $@

$(VENV)/.test-installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e '.[test,torch]'
	$(BIN)/python -c "import graphsub, graphsub.cli"
	touch $@

demo: $(VENV)/.demo-installed
	mkdir -p out
	$(BIN)/graphsub optimize $(DEMO_MODEL) -o out/$(DEMO_MODEL).opt.onnx --report out/$(DEMO_MODEL).report.html $(DEMO_ARGS)

# The fast suite (under 15 minutes on 2 cores); the tests marked slow run with `make test-slow`
# (CI runs both).
test: $(VENV)/.test-installed
	$(BIN)/python -m pytest -n 2 -m "not slow" $(PYTEST_ARGS)

test-slow: $(VENV)/.test-installed
	$(BIN)/python -m pytest -n 2 -m slow $(PYTEST_ARGS)

# mypy over src/, strictly (configured in pyproject.toml)
typecheck: $(VENV)/.test-installed
	$(BIN)/python -m mypy

bench: $(VENV)/.test-installed
	$(BIN)/python bench/bench_ir.py
	$(BIN)/python bench/bench_optimize.py

bench-generate: $(VENV)/.test-installed
	$(BIN)/python bench/bench_generate.py gen --max-ops 3 --ops matmul,ewadd,ewmul,conv,concat,split,relu --variables 2
	$(BIN)/python bench/bench_generate.py taso-verify

bench-targets: $(VENV)/.test-installed
	$(BIN)/python bench/bench_targets.py

$(VENV)/.bench-installed: $(VENV)/.test-installed
	$(BIN)/python -m pip install -q -e '.[bench]'
	touch $@

bench-cpu: $(VENV)/.bench-installed
	$(BIN)/python bench/bench_cpu_wins.py

bench-search: $(VENV)/.bench-installed
	$(BIN)/python bench/bench_algorithms.py exact
	$(BIN)/python bench/bench_algorithms.py scaling --cap 20
	$(BIN)/python bench/bench_algorithms.py quality

bench-egraph: $(VENV)/.test-installed
	$(BIN)/python bench/bench_extraction.py
	$(BIN)/python bench/bench_egraph.py --cost a100
	$(BIN)/python bench/bench_egraph.py --cost measured --algorithms backtracking,eqsat,mcts --mcts-seconds 60

fuzz: $(VENV)/.test-installed
	$(BIN)/python bench/fuzz.py --count 1000 --seed 0 --time-limit 1

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build src/*.egg-info
