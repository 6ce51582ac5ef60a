# spark-qtransport developer commands. Each target sets up what it needs, so any works on a fresh clone.
# setup: .venv with the package and its dev extra, and Delta Lake's jars in .cache/ivy (fetched once).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-dev

.PHONY: setup system-deps test test-unit test-fast compat compat-table chaos demo bench lint docs wheel clean mutation

setup: $(STAMP)

# unixODBC + FreeTDS let pyodbc (the SQL Server driver) load; best effort: needs root and apt-get.
system-deps:
	@if ! ldconfig -p 2>/dev/null | grep -q libodbc.so.2; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing unixODBC and FreeTDS (for pyodbc)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq unixodbc tdsodbc >/dev/null) \
	      || echo "warning: could not install unixODBC; SQL Server connections will not work"; \
	  else echo "note: unixODBC not found; SQL Server connections need it (apt-get install unixodbc tdsodbc)"; fi; \
	fi

$(STAMP): pyproject.toml
	@$(MAKE) --no-print-directory system-deps
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) tests/site_workers.py
	$(PY) jobs/_spark.py fetch-jars
	touch $@

# the suite's files on TEST_WORKERS workers (pytest-xdist; each has its own SparkSession and embedded
# PostgreSQL; the long files start first: tests/conftest.py); the 15 slowest tests printed at the end
TEST_WORKERS ?= 3
# the tests' JVMs (the sessions, the jobs they start, spark-submit, the Connect server) live seconds to
# minutes: C1 only and the serial collector halve a JVM's start-up CPU (12 s -> 6 s a session here), and
# the suite is CPU-bound on two cores. make bench and make chaos keep the JVM's defaults.
test test-fast compat compat-table: export SPARK_SUBMIT_OPTS ?= -XX:TieredStopAtLevel=1 -XX:+UseSerialGC
test: setup
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15

# the unit tier: no Spark, no database (tests/conftest.py sets the tier from the fixtures a test uses)
test-unit: setup
	$(PY) -m pytest -m "unit and not slow" -q

test-fast: setup
	$(PY) -m pytest -m "not slow"

# the compatibility suite (tests marked compat) on the Spark lines besides the development pin:
# 4.0 and 4.1 (Databricks 17.3 LTS, 18 LTS) and 4.3, each in its own .venv-spark<line>; fails when
# docs/spark-versions.md's table differs from what ran (tests/compat/README.md)
compat: setup
	$(PY) tests/compat/run.py --check-table docs/spark-versions.md

# the same on all four lines (4.2, the development pin, too), then docs/spark-versions.md written again
compat-table: setup
	$(PY) tests/compat/run.py --lines 4.0,4.1,4.2,4.3 --write-table docs/spark-versions.md

# the long chaos run: 20 job kills under a faster producer, the database killed three times (5 s, 60 s, past the bound), a 1,000,000-message backlog, two
# minutes of competition; in both claim modes: the claim table (a server without prepared transactions) writes
# reports/chaos.md and its plots (reports/*.png), prepared claims (64 allowed) reports/prepared/
CHAOS_ENV := SQLQUEUE_CHAOS_KILLS=20 SQLQUEUE_CHAOS_PAUSE=0.05 SQLQUEUE_CHAOS_BACKLOG=1000000 SQLQUEUE_CHAOS_OUTAGES=5,60,past \
	  SQLQUEUE_CHAOS_COMPETE_SECONDS=120
chaos: setup
	$(CHAOS_ENV) SQLQUEUE_TEST_PREPARED_SLOTS=0 SQLQUEUE_CHAOS_REPORT=reports $(PY) -m pytest -s tests/chaos
	$(CHAOS_ENV) SQLQUEUE_TEST_PREPARED_SLOTS=64 SQLQUEUE_CHAOS_REPORT=reports/prepared $(PY) -m pytest -s tests/chaos

demo: setup
	$(PY) jobs/demo.py

# speed.py first: the table of the connector against NServiceBus and the floor, and the goals
bench: setup
	$(PY) bench/speed.py
	$(PY) bench/claim_modes.py
	$(PY) bench/large_bodies.py
	$(PY) bench/phases.py
	$(PY) bench/audit.py
	$(PY) bench/queues.py
	$(PY) bench/many_tables.py
	$(PY) bench/start.py

# mutation testing of the unit tier's pure modules (mutmut, pinned in tests/mutation/run.py; about 15-25 minutes on
# 2 cores): a table of killed and surviving mutants per module; survivors' diffs in reports/tmp/mutation/
mutation: setup
	$(PY) tests/mutation/run.py

# ruff over everything, mypy over the package (its settings: pyproject.toml)
lint: setup
	$(PY) -m ruff check spark_qtransport tests jobs bench notebooks
	$(PY) -m mypy

# the documentation site (mkdocs.yml, docs/) built into site/; --strict: a broken link or anchor fails it
# (mkdocs-material 9.x prints an end-of-life notice for May 2027 unless told not to)
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# dist/spark_qtransport-<version>-py3-none-any.whl: for pip install on clusters or spark-submit --py-files
wheel: setup
	$(PY) -m build --wheel --outdir dist .

clean:
	rm -rf $(VENV) .venv-spark*/ build dist *.egg-info .pytest_cache
