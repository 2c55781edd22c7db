"""The whole landscape-repository flow as a platform engineer runs it: `consumer new` on a terminal,
`lint` on the merge request, the YAML applied to the real apiserver as Flux would (server-side apply),
and the printed token authenticating against a running `dbprovider manager`; then a rotation with both
tokens working, and `--drop-old` cutting the old one off."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from dbprovider.devstack import DevStack
from domain.tokens import hash_token
from harness import KubeControlPlane
from infra.render import config_yaml
from tests.cli.conftest import DBPROVIDER, read_docs, run, run_on_terminal
from tests.support.common import wait_for
from tests.support.kubeapi import KubeApi
from tests.support.manager_process import ManagerProcess
from tests.vectors.objects import NAMESPACE

TOKEN_RE = re.compile(r"^[0-9a-f]{64}$", re.MULTILINE)


@pytest.fixture(scope="module")
def stack(kube: KubeControlPlane, postgres_pool: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    created = DevStack(
        kube,
        postgres_pool.get("18"),
        tmp_path_factory.mktemp("clitest-stack"),
        config_overrides={
            "releaseName": "clitest",
            "namespace": NAMESPACE,
            "tls": {"secretName": "clitest-stack-tls"},
            "deletionProtection": {"enabled": False},
            "softDelete": {"retention": "0"},
        },
        consumer="clitest-dev-consumer",
        shard="clitest-pg",
    ).install()
    yield created
    created.unregister()


class Manager(ManagerProcess):
    """`dbprovider manager` (the installed script) for the stack, as its own process."""

    def __init__(self, stack: DevStack, log: Path) -> None:
        super().__init__("clitest-manager", log, str(stack.ca_file))
        argv = stack.manager_argv("python", self.api_port, self.metrics_port)
        assert argv[1:4] == ["-m", "dbprovider.cli", "manager"]
        self.spawn([str(DBPROVIDER), *argv[3:]], {**os.environ, **stack.manager_env()}, Path.cwd())

    def call(self, method: str, path: str, token: str) -> requests.Response:
        headers = {"Authorization": f"Bearer {token}"}
        return requests.request(method, self.url(path), headers=headers, verify=self.ca, timeout=10)

    def wait_status(self, method: str, path: str, token: str, status: int) -> None:
        wait_for(
            lambda: self.call(method, path, token).status_code == status,
            timeout=30,
            what=f"{method} {path} -> {status}",
        )


def apply_file(api: KubeApi, path: Path) -> None:
    """What Flux does with a merged file: server-side apply of every document."""
    for doc in read_docs(path):
        api.apply(doc, field_manager="clitest-flux")


def test_consumer_made_by_the_cli_authenticates_and_rotates_without_downtime(
    stack: DevStack, kube: KubeControlPlane, tmp_path: Path
) -> None:
    repo = tmp_path / "landscape"
    consumers = repo / "consumers"
    repo.mkdir()
    (repo / "dbprovider-values.yaml").write_text(config_yaml(stack.config))

    made = run_on_terminal(
        "consumer",
        "new",
        "clitest-team",
        "--max-databases",
        "1",
        "--namespace",
        NAMESPACE,
        "--out",
        str(consumers),
        cwd=tmp_path,
    )
    assert made.returncode == 0, made.stderr
    (token,) = TOKEN_RE.findall(made.stdout)
    consumer_file = consumers / "clitest-team.consumer.yaml"
    secret_file = consumers / "clitest-team.token-secret.yaml"

    checked = run("lint", "landscape", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    manager = Manager(stack, tmp_path / "manager.log")
    with kube.admin_client() as client:
        api = KubeApi(client)
        try:
            apply_file(api, secret_file)
            apply_file(api, consumer_file)
            manager.wait_ready(timeout=60)

            # The printed token works; the quota written by --max-databases 1 holds.
            manager.wait_status("GET", "/v1/databases", token, 200)
            assert manager.call("PUT", "/v1/databases/orders", token).status_code == 201
            over = manager.call("PUT", "/v1/databases/billing", token)
            assert (over.status_code, over.json()["error"]) == (429, "quota_exceeded")

            # Rotation: the new hash is added, both tokens work once the change is applied.
            rotated = run_on_terminal("consumer", "rotate", "--secret-file", str(secret_file), cwd=tmp_path)
            assert rotated.returncode == 0, rotated.stderr
            (new_token,) = TOKEN_RE.findall(rotated.stdout)
            apply_file(api, secret_file)
            manager.wait_status("GET", "/v1/databases", new_token, 200)
            assert manager.call("GET", "/v1/databases", token).status_code == 200

            # The consumer has switched: --drop-old, applied, cuts the old token off.
            dropped = run("consumer", "rotate", "--secret-file", str(secret_file), "--drop-old", cwd=tmp_path)
            assert dropped.returncode == 0, dropped.stderr
            apply_file(api, secret_file)
            manager.wait_status("GET", "/v1/databases", token, 401)
            assert manager.call("GET", "/v1/databases/orders", new_token).status_code == 200

            assert manager.call("DELETE", "/v1/databases/orders", new_token).status_code == 202
            manager.wait_status("GET", "/v1/databases/orders", new_token, 404)  # retention 0: dropped
        finally:
            manager.stop()
            for path in (consumer_file, secret_file):
                for doc in read_docs(path):
                    api.delete(doc)
    logs = manager.log.read_text().lower()
    for secret in (token, new_token, hash_token(token), hash_token(new_token)):
        assert secret not in logs
