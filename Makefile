# The two commands of the README. Both set the machine up first (hack/setup.sh, idempotent): `dev` with only
# what it runs (the virtualenv, PostgreSQL 18, kube-apiserver and etcd), `test` with everything.
.PHONY: setup dev test test-fast lint faults

setup:
	bash hack/setup.sh

dev:
	bash hack/setup.sh --dev
	.venv/bin/dbprovider dev

# Everything, as CI runs it: two workers (the suites mostly wait on reconciles), then the fault and alert
# suites alone, so no other test's load skews the recovery times and alert clocks they check.
test: setup
	.venv/bin/python -m pytest -n 2 --dist loadfile -m "not serial"
	.venv/bin/python -m pytest -m serial

# The inner loop: every test that needs no server (no apiserver, PostgreSQL, Prometheus or Pulumi) and builds
# no wheel (tests/packaging, marked slow), on both cores. A test that starts a server without being marked `server` fails here (tests/conftest.py says how).
test-fast:
	bash hack/setup.sh --python-only
	DBPROVIDER_TEST_NO_SERVERS=1 .venv/bin/python -m pytest -m "not server and not slow" -n 2

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports
	.venv/bin/mypy

# The fault-injection suite alone (also part of `make test`): kills, pauses and restarts real
# processes, checks the invariants after each fault and prints the measured recovery times.
faults: setup
	DBPROVIDER_FAULT_TIMINGS=fault-timings.json .venv/bin/python -m pytest tests/faults -v
