"""The landscape-repository commands as a user runs them: the installed `dbprovider` script as a
subprocess, on real files in a temporary directory, on a terminal (a pty) or with stdout redirected.

Objects on the shared apiserver are named `clitest*`; the release namespace is `clitest-system`.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from domain.config import load_install_config
from infra.render import render_manifests
from tests.support.kubeapi import KubeApi, apply_all
from tests.vectors.objects import NAMESPACE

DBPROVIDER = Path(sys.executable).parent / "dbprovider"
RELEASE = "clitest"

VALUES: dict[str, Any] = {
    "releaseName": RELEASE,
    "namespace": NAMESPACE,
    "tls": {"secretName": "clitest-tls"},
    "shardSecrets": [{"namespace": NAMESPACE, "name": "pg-shard01-provisioner"}],
    "sizeClasses": {"small": {"connectionLimit": 5}},
    # No admission policy: it would apply to every Shard on the shared apiserver.
    "deletionProtection": {"enabled": False},
    "softDelete": {"retention": "0"},
}


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> Result:
    """`dbprovider ARGS` with stdout and stderr captured (so stdout is not a terminal)."""
    assert DBPROVIDER.exists(), f"the console script is not installed at {DBPROVIDER}"
    done = subprocess.run(
        [str(DBPROVIDER), *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=env or os.environ.copy()
    )
    return Result(done.returncode, done.stdout, done.stderr)


def run_on_terminal(*args: str, cwd: Path) -> Result:
    """`dbprovider ARGS` with stdout on a pseudo-terminal, as in an interactive shell; stderr captured."""
    return run_argv_on_terminal([str(DBPROVIDER), *args], cwd)


def run_argv_on_terminal(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> Result:
    """`argv` with stdout on a pseudo-terminal (and stderr captured), until it closes the terminal."""
    main, child = pty.openpty()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=child, stderr=subprocess.PIPE, text=False, env=env)
    os.close(child)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 1.0)
        if ready:
            try:
                data = os.read(main, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(main)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    proc.wait(timeout=30)
    return Result(proc.returncode, b"".join(chunks).decode().replace("\r\n", "\n"), stderr)


def write_yaml(path: Path, *docs: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def read_docs(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


@pytest.fixture(scope="session")
def crds(kube: Any) -> Iterator[KubeApi]:
    """The provider's CRDs (shared with other suites, never removed) and the release namespace."""
    kube.ensure_namespace(NAMESPACE)
    with kube.admin_client() as client:
        api = KubeApi(client)
        manifests = render_manifests(load_install_config(VALUES))
        apply_all(api, [m for m in manifests if m["kind"] == "CustomResourceDefinition"])
        yield api
