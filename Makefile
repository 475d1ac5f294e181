# The two set-up commands of the README: `make demo` and `make test`.
# Both build .venv from nothing (Python 3.11 + Java 17 on the machine), then run.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# Bytecode caches are written (a shell that sets PYTHONDONTWRITEBYTECODE would make every interpreter the
# tests and the demo start, hundreds of them, compile the package and, in the compat venvs, every dependency
# it imports from source again)
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test test-fast test-compat lint install java chromium clean

demo: $(STAMP)
	$(BIN)/kappa demo

# (PYTEST_ARGS: what pytest runs, the whole suite by default; .ci/run splits it in two with it)
test: $(STAMP) chromium lint
	@# pytest exits 5 when it collected no test: that is a failure here.
	$(BIN)/python -m pytest --durations=30 $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest ran no tests"; exit 1; fi; exit $$rc

# the fast tier (tests/unit: no Spark, no Airflow DB, no server) on every core (pytest-xdist); worksteal:
# a worker that runs out takes half of what the other still has queued, so the run does not end with one
# worker idle behind the other's last tests (tests/unit/conftest.py runs the heavy tests first)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n auto --dist worksteal tests/unit; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest ran no tests"; exit 1; fi; exit $$rc

install: $(STAMP)

# both ends of the supported Python range from the wheel, not the checkout (tests/compat/run.py): Python
# 3.10 with the lowest declared Airflow, providers and pyiceberg, Python 3.13 with the newest; each in a
# venv of its own under .cache/compat, reused while the wheel and its constraints are the same
# (COMPAT_ARGS: tests/compat/run.py's options, e.g. `--jobs 1`, one end at a time, as .ci/run gives it)
test-compat: $(STAMP)
	$(BIN)/python tests/compat/run.py $(COMPAT_ARGS)

# ruff lint + format check (pyproject.toml [tool.ruff]); part of `make test`
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The UI test drives Debian's chromium headless (no downloaded browser); install it when missing.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium for the UI test"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium is missing: install it with 'sudo apt-get install -y chromium' and retry."; exit 1; fi; }

java:
	@command -v java >/dev/null 2>&1 || { echo "Java 17 is missing: install it with 'apt-get install -y openjdk-17-jre-headless' and retry."; exit 1; }

$(STAMP): setup.cfg pyproject.toml airflow_provider_kappa/engine/jvm.py jvm/fetch.sh jvm/rest-catalog/pom.xml jvm/rest-catalog/KappaRESTCatalogServer.java | java
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "Python 3.11 is missing: install it with 'apt-get install -y python3.11 python3.11-venv' and retry."; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@# --no-compile: bytecode is written on first import, for the modules imported (2457 of 13772 files in the
	@# Spark 4.1 compat venv after its tests), not at install for all of them (this install: 118-121 CPU-s with
	@# compiling, 76-79 without; docs/testing.md, session 36)
	$(BIN)/pip install --quiet --no-compile -e '.[test,demo]'
	# pyspark-client (from the Spark provider) overwrites part of the pyspark package;
	# reinstall pyspark last, at pyspark-client's release, so every file is pyspark's own.
	$(BIN)/pip install --quiet --no-compile --no-deps --force-reinstall "pyspark==$$($(BIN)/python -c 'import importlib.metadata as m; print(m.version("pyspark-client"))')"
	@# JVM packages from Maven Central, once: Spark's Kafka connector and a Kafka broker through Spark's own
	@# spark.jars.packages into its Ivy cache (kappa jars); the tests' Iceberg REST catalog with Maven into
	@# .cache/jvm or $$KAPPA_JVM_DIR (jvm/fetch.sh); nothing is downloaded while a job or a test runs
	SPARK_LOCAL_IP=127.0.0.1 $(BIN)/kappa jars
	jvm/fetch.sh
	touch $(STAMP)

clean:
	rm -rf $(VENV) build *.egg-info .cache/jvm .cache/compat
