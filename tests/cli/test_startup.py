"""Each `dbprovider` command loads what it needs and nothing of the others: `--help` and argument errors
come before any subcommand's module is imported, `lint` or `consumer` never pull in `upgrade check`'s
Kubernetes client, psycopg and reconciler, and `dev` checks the user's values before importing the stack.
(Imports were 0.4 s of every command's start before dbprovider/cli.py declared the arguments itself.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Runs `dbprovider ARGS` in-process (dbprovider.cli.main, as the console script does) and prints the
# modules it loaded.
PROBE = """
import json, sys
from dbprovider.cli import main
sys.argv = ["dbprovider", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""
SUBCOMMAND_MODULES = {"dbprovider.consumer_cmd", "dbprovider.lint", "dbprovider.upgrade_check", "dbprovider.render"}
HEAVY = {"pydantic", "kubernetes", "psycopg", "jinja2", "reconciler", "infra", "api"}


def loaded_by(args: list[str], cwd: Path) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    modules: list[str] = json.loads(done.stderr.splitlines()[-1])
    return set(modules)


@pytest.mark.parametrize(
    "args",
    [["--help"], ["consumer", "new", "--help"], ["lint", "--help"], ["upgrade", "check", "--help"], ["lint"]],
    ids=" ".join,
)
def test_help_and_argument_errors_import_no_subcommand(args: list[str], tmp_path: Path) -> None:
    loaded = loaded_by(args, tmp_path)
    assert not loaded & SUBCOMMAND_MODULES
    assert not {m.split(".")[0] for m in loaded} & HEAVY


@pytest.mark.parametrize(
    ("args", "runs", "not_loaded"),
    [
        (["lint", "."], "dbprovider.lint", {"dbprovider.consumer_cmd", "dbprovider.upgrade_check"}),
        (
            ["consumer", "new", "team-a", "--max-databases", "1", "--token-file", "-"],
            "dbprovider.consumer_cmd",
            {"dbprovider.lint", "dbprovider.upgrade_check"},
        ),
    ],
    ids=["lint", "consumer-new"],
)
def test_a_subcommand_imports_its_module_and_not_the_others(
    args: list[str], runs: str, not_loaded: set[str], tmp_path: Path
) -> None:
    loaded = loaded_by(args, tmp_path)
    assert runs in loaded
    assert not loaded & not_loaded
    assert not {m.split(".")[0] for m in loaded} & {"kubernetes", "psycopg", "reconciler"}


def test_dev_refuses_values_before_importing_the_stack(tmp_path: Path) -> None:
    """A values file dev cannot use is refused before the servers' harness and the manager are imported."""
    (tmp_path / "values.yaml").write_text("metrics: {serviceMonitor: {enabled: true}}\n")
    loaded = loaded_by(["dev", "--config", "values.yaml", "--state-dir", "state"], tmp_path)
    assert "dbprovider.dev_values" in loaded
    assert not loaded & {"dbprovider.dev", "dbprovider.manager", "harness"}
    assert not (tmp_path / "state").exists()
