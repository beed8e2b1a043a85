# zodiac-edge developer targets. Needs only python3.11 and make: everything else is
# installed into .venv from PyPI.

PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
# Inside .venv, so that deleting .venv also forgets that it was installed.
STAMP  := $(VENV)/.install.stamp

.PHONY: venv demo test test-quick bench clean distclean

venv: $(STAMP)

# Re-run the install whenever pyproject.toml changes (new dependency, new entry point...).
# The development install includes the cloud extra (pyspark, needs Java 17), the suite tests
# the Spark job too, and the simulation extra (matplotlib) for the wind-farm report's plots.
$(STAMP): pyproject.toml Makefile
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found on PATH" >&2; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || { \
		echo "error: '$(PYTHON) -m venv' failed (on Debian/Ubuntu: apt-get install python3.11-venv)" >&2; \
		rm -rf $(VENV); exit 1; }
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,cloud,simulation]'
	@touch $@

# The product's main job: the wind-farm simulation (report under out/windfarm/).
demo: venv
	$(BIN)/python -m simulations.windfarm

# The whole suite on two pytest-xdist workers (the CI machines have two cores), the tests of
# the session's SparkSession in one group (one JVM), and the slowest tests listed at the end.
test: venv
	$(BIN)/ruff check . && $(BIN)/python -m pytest -n 2 --dist loadgroup --durations=10

# The edit loop: engine and agent tests that start no process and no Spark, with fewer
# generated examples per property (the hypothesis profile "quick", tests/conftest.py).
test-quick: venv
	HYPOTHESIS_PROFILE=quick $(BIN)/python -m pytest -n 2 -m "not spark and not process and not slow" tests/engine tests/agent

bench: venv
	$(BIN)/python -m simulations.bench.materialise

# Generated files and caches; keeps .venv (use `make distclean` to drop it too).
clean:
	rm -rf out/ build/ dist/ *.egg-info .pytest_cache .ruff_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
