# The two commands of the README. Both set the machine up first (hack/setup.sh, idempotent).
.PHONY: setup dev test lint

setup:
	bash hack/setup.sh

dev: setup
	.venv/bin/dbprovider dev

test: setup
	.venv/bin/python -m pytest

lint: setup
	.venv/bin/ruff check .
	.venv/bin/lint-imports
