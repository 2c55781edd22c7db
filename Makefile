# The two commands of the README. Both set the machine up first (hack/setup.sh, idempotent).
.PHONY: setup dev test lint faults

setup:
	bash hack/setup.sh

dev: setup
	.venv/bin/dbprovider dev

test: setup
	.venv/bin/python -m pytest

lint: setup
	.venv/bin/ruff check .
	.venv/bin/lint-imports
	.venv/bin/mypy

# The fault-injection suite alone (also part of `make test`): kills, pauses and restarts real
# processes, checks the invariants after each fault and prints the measured recovery times.
faults: setup
	DBPROVIDER_FAULT_TIMINGS=fault-timings.json .venv/bin/python -m pytest tests/faults -v
