"""`dbprovider dev --config values.yaml`: the local stack with the user's own install values. Values
that cannot work locally are refused before anything starts; with engines.cloudberry.enabled a user can
register a cloudberry Shard against a DatabaseCluster and watch it follow the cluster's phase."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import requests

from tests.cli.conftest import DBPROVIDER, read_docs, run, write_yaml
from tests.support.common import condition, wait_for
from tests.support.dev_command import read_env_file, wait_ready_line
from tests.support.kubeapi import KubeApi


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"metrics": {"serviceMonitor": {"enabled": True}}}, "metrics.serviceMonitor.enabled"),
        ({"shardTLS": {"caBundle": {"configMap": {"name": "ca", "key": "ca.crt"}}}}, "shardTLS.caBundle"),
        ({"softDelete": {"retention": "1w"}}, "softDelete.retention"),
        ({"engines": {"cloudberry": {"enabeld": True}}}, "engines.cloudberry.enabeld"),
        ({"sizeClasses": {"small": {"connectionLimit": "5"}}}, "sizeClasses.small.connectionLimit"),
        (["not", "a", "mapping"], "mapping"),
    ],
    ids=["service-monitor", "ca-bundle", "invalid-duration", "unknown-key", "wrong-type", "not-a-mapping"],
)
def test_values_that_cannot_work_are_refused_naming_the_key_before_anything_starts(
    tmp_path: Path, values: Any, key: str
) -> None:
    write_yaml(tmp_path / "values.yaml", values)
    result = run("dev", "--config", "values.yaml", "--state-dir", "state", cwd=tmp_path)
    assert result.returncode == 2
    assert key in result.stderr
    assert "starting" not in result.stdout
    assert not (tmp_path / "state").exists()


def test_a_missing_values_file_is_refused(tmp_path: Path) -> None:
    result = run("dev", "--config", "nothere.yaml", "--state-dir", "state", cwd=tmp_path)
    assert result.returncode == 2
    assert "nothere.yaml" in result.stderr


VALUES = {
    "namespace": "devvalues",
    "engines": {"cloudberry": {"enabled": True}},
    "sizeClasses": {"xl": {"connectionLimit": 80}},
    "softDelete": {"retention": "0"},
}


@pytest.mark.server  # `dbprovider dev` starts an apiserver and a PostgreSQL server
def test_dev_with_cloudberry_values_lets_a_shard_follow_its_database_cluster(tmp_path: Path) -> None:
    write_yaml(tmp_path / "values.yaml", VALUES)
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [str(DBPROVIDER), "dev", "--config", "values.yaml", "--state-dir", str(state), "--postgres", "18"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
    )
    try:
        text = wait_ready_line(proc, 240)
        assert "dbprovider dev: ready" in text, text
        example = state / "cloudberry-example.yaml"
        assert f"kubectl apply -f {example}" in text
        assert "dropped after 0s" in text  # the user's retention, not dev's 2 minutes
        env = read_env_file(state / "env")

        with kubernetes.config.new_client_from_config(config_file=env["KUBECONFIG"]) as client:
            api = KubeApi(client)
            cluster, shard = read_docs(example)
            assert cluster["metadata"]["namespace"] == "devvalues"
            for doc in (cluster, shard):  # as the printed `kubectl apply -f` does
                api.apply(doc, field_manager="kubectl")

            def shard_reason(reason: str) -> Any:
                def probe() -> Any:
                    got = api.get(shard).body
                    ready = condition(got, "Ready")
                    return ready is not None and ready["reason"] == reason and got

                return wait_for(probe, timeout=60, what=f"the shard to report {reason}")

            shard_reason("ClusterNotRunning")  # no phase yet: Keldon has not reported Running
            for phase, reason in (("Running", "Ok"), ("Scaling", "ClusterScaling"), ("Running", "Ok")):
                patched = api.merge_patch(cluster, {"status": {"phase": phase}}, subresource="status")
                assert patched.status == 200, patched.message
                shard_reason(reason)

        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {env['DBPROVIDER_TOKEN']}"
        call = functools.partial(session.request, verify=env["DBPROVIDER_CA_FILE"], timeout=10)
        base = f"{env['DBPROVIDER_API_URL']}/v1/databases"
        created = call("PUT", f"{base}/analytics", json={"sizeClass": "xl", "engine": "cloudberry"})
        assert created.status_code == 201, created.text  # xl exists only in the user's values
        view = wait_for(
            lambda: (v := call("GET", f"{base}/analytics").json()).get("phase") == "Ready" and v,
            timeout=60,
            what="the cloudberry database to be Ready",
        )
        assert view["connectionLimit"] == 80
        assert call("DELETE", f"{base}/analytics").status_code == 202
        wait_for(lambda: call("GET", f"{base}/analytics").status_code == 404, timeout=60, what="the drop (retention 0)")

        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=150)
        assert proc.returncode == 0, rest
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
