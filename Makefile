# One environment for everything: .venv with the pinned CPU build of torch, then the package and extras.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TORCH  := torch==2.13.0

.PHONY: venv demo test fuzz bench lint clean figures

venv: $(STAMP)

# scripts/install.py installs with uv (about 10 s) where it can pass it pip's settings, else with pip (about 40 s);
# neither byte-compiles the installed modules: Python compiles the ones a run imports, once, when it first imports them
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) scripts/install.py $(TORCH) -e ".[dev]"
	touch $(STAMP)

# the main job: train short, test long (default preset, about 9 minutes on 2 idle CPU cores), into runs/
demo: $(STAMP)
	$(PY) -m rotary experiment --preset default

# the whole suite on 2 processes; the 15 slowest tests are listed at the end (docs/testing.md)
# PYTHONDONTWRITEBYTECODE emptied: the suite starts hundreds of Python processes (the CLI, torchrun, fresh
# interpreters), and each would compile rotary from source again, and pytest would rewrite every test's asserts
test: $(STAMP)
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -q -n 2 --doctest-modules --durations=15 src tests

# the property tests with new random examples every run (make test draws the same ones each time), and the
# kernel tests that make test runs on a covering array of their factors, over the whole product (tests/covering.py)
fuzz: $(STAMP)
	ROTARY_HYPOTHESIS_PROFILE=explore ROTARY_FULL_PRODUCT=1 $(PY) -m pytest -q -n 2 -p no:cacheprovider \
		$$(grep -rlE "from (hypothesis|covering) import" tests --include="*.py")

bench: $(STAMP)
	$(PY) -m rotary bench $(addprefix --cases ,$(wildcard benchmarks/cases/*.py))

# the figures docs/ embeds (PNG; the SVG twins are not committed)
figures: $(STAMP)
	$(PY) -m rotary plot scaling -o docs/figures
	$(PY) -m rotary plot variants -o docs/figures
	$(PY) -m rotary plot decay --measured -o docs/figures/decay
	$(PY) -m rotary plot axial -o docs/figures/axial
	$(PY) -m rotary plot axial --mixed -o docs/figures/rope_mixed
	$(PY) -m rotary plot learnable -o docs/figures/learnable_frequencies
	rm -f docs/figures/*.svg

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
