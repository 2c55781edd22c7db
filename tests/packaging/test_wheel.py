"""The package as a user installs it: a wheel built from this checkout, `pip install`ed (with its pinned
dependencies from the package index) into a fresh virtualenv, run from a directory outside the
repository, so nothing of the checkout is on the path.

What must work there: `render` (the templates are package data), `lint` and `consumer new` (the
landscape commands); `dev` refuses clearly (it needs the test harness, which the wheel does not ship).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from domain.constants import API_VERSION

REPO = Path(__file__).resolve().parents[2]
VALUES = {
    "namespace": "databases",
    "tls": {"secretName": "dbprovider-tls"},
    "shardSecrets": [{"namespace": "pg-shard01", "name": "pg-shard01-pguser-provisioner"}],
    "sizeClasses": {"small": {"connectionLimit": 5}},
    "prometheusRule": {"enabled": True, "cluster": "eu-1"},
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(REPO)],
        check=True,
        capture_output=True,
        cwd=out,
    )
    (found,) = out.glob("dbprovider-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The `dbprovider` script of a fresh virtualenv that has the wheel and nothing else of ours."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    result = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--no-compile", "--disable-pip-version-check", str(wheel)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    yield venv / "bin" / "dbprovider"


def run(script: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{script.parent}:/usr/bin:/bin", "HOME": str(cwd)}  # no PYTHONPATH, no checkout
    return subprocess.run([str(script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_wheel_ships_the_templates_and_not_the_harness(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    templates = {n for n in names if n.startswith("infra/templates/")}
    assert {f"infra/templates/{t.name}" for t in (REPO / "infra" / "templates").glob("*.j2")} == templates
    assert "api/openapi.yaml" in names
    assert not [n for n in names if n.split("/")[0] in ("harness", "tests", "hack", "bench")]


def test_render_from_the_installed_package(installed: Path, tmp_path: Path) -> None:
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(VALUES))
    where = run(installed.parent / "python", tmp_path, "-c", "import infra; print(infra.__file__)")
    assert where.stdout.startswith(str(installed.parent.parent)), where  # the venv's copy, not the checkout's
    result = run(installed, tmp_path, "render", "--config", "values.yaml")
    assert result.returncode == 0, result.stderr
    kinds = [doc["kind"] for doc in yaml.safe_load_all(result.stdout) if doc]
    assert "Deployment" in kinds and kinds[0] == "CustomResourceDefinition"
    rule = run(installed, tmp_path, "render", "--config", "values.yaml", "--only", "prometheusrule")
    assert rule.returncode == 0 and "PrometheusRule" in rule.stdout, rule.stderr


def test_consumer_and_lint_from_the_installed_package(installed: Path, tmp_path: Path) -> None:
    (tmp_path / "landscape").mkdir()
    command = "consumer new team-a --max-databases 50 --namespace databases --out landscape --token-file team-a.token"
    new = run(installed, tmp_path, *command.split())
    assert new.returncode == 0, new.stderr
    assert len((tmp_path / "team-a.token").read_text().strip()) == 64
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(VALUES))
    clean = run(installed, tmp_path, "lint", "--values", "values.yaml", "landscape")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    (tmp_path / "landscape" / "broken.yaml").write_text(
        f"apiVersion: {API_VERSION}\nkind: Consumer\nmetadata: {{name: team-b}}\nspec: {{maxDatabases: -1}}\n"
    )
    broken = run(installed, tmp_path, "lint", "--values", "values.yaml", "landscape")
    assert broken.returncode == 1 and "broken.yaml" in broken.stdout, broken.stdout + broken.stderr


def test_dev_says_it_needs_a_source_checkout(installed: Path, tmp_path: Path) -> None:
    result = run(installed, tmp_path, "dev")
    assert result.returncode == 2
    assert "source checkout" in result.stderr and "Traceback" not in result.stderr
