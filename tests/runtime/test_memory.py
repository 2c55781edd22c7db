"""The product must hold 10,000 Databases under 400 MB RSS for the whole manager. This measures
what the informer cache of 10,000 Database-sized objects (with two indexes) costs in a process of
its own: it must stay a small part of that budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness import KubeControlPlane
from informers import Rest
from tests.runtime.support import GROUP, WIDGETS
from tests.support.common import unique

COUNT = 10_000
REPO = Path(__file__).resolve().parents[2]


def _database_like(i: int, namespace: str) -> dict:
    """About the size of a provisioned Database: labels, finalizer, spec and a full status."""
    external_id = f"tenant-{i:05d}"
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Widget",
        "metadata": {
            "name": f"consumer-a-{external_id}-3f9c2a",
            "namespace": namespace,
            "labels": {"db.bnerd.com/consumer": "consumer-a", "db.bnerd.com/external-id": external_id},
            "annotations": {"db.bnerd.com/size-class": "small"},
            "finalizers": ["db.bnerd.com/finalizer"],
        },
        "spec": {
            "consumer": "consumer-a",
            "externalId": external_id,
            "sizeClass": "small",
            "engine": "postgres",
            "status": {  # in spec: the test CRD's status subresource would drop it on create
                "phase": "Ready",
                "shard": f"shard{i % 20:02d}",
                "roleName": f"t_{external_id.replace('-', '_')}_3f9c2a",
                "databaseName": f"t_{external_id.replace('-', '_')}_3f9c2a",
                "appliedConnectionLimit": 20,
                "observedGeneration": 1,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "Provisioned",
                        "message": "tenant exists on the shard",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                        "observedGeneration": 1,
                    },
                    {
                        "type": "ConnectionLimitDrift",
                        "status": "False",
                        "reason": "InSync",
                        "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                        "observedGeneration": 1,
                    },
                ],
            },
        },
    }


CHILD = textwrap.dedent(
    """
    import gc, json, sys, psutil, kubernetes.config
    from informers import Informer, Resource
    api = kubernetes.config.new_client_from_config(config_file=sys.argv[1])
    process = psutil.Process()
    gc.collect()
    before = process.memory_info().rss
    informer = Informer(api, Resource(sys.argv[3], "v1", "widgets"), sys.argv[2])
    informer.add_index("shard", lambda o: [o["spec"]["status"]["shard"]])
    informer.add_index("consumer", lambda o: [o["spec"]["consumer"]])
    informer.start()
    assert informer.wait_for_sync(120)
    gc.collect()
    after = process.memory_info().rss
    print(json.dumps({"count": len(informer), "before": before, "after": after,
                      "shards": len(informer.index_values("shard"))}))
    informer.stop()
    """
)


def test_ten_thousand_databases_cost_the_informer_little_memory(
    kube: KubeControlPlane, admin_rest: Rest, widgets_crd: None, tmp_path: Path
) -> None:
    namespace = unique("rt-memory")
    kube.ensure_namespace(namespace)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: admin_rest.create(WIDGETS, _database_like(i, namespace)), range(COUNT)))

    kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(kubeconfig), namespace, GROUP],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["count"] == COUNT and result["shards"] == 20
    cache_mb = (result["after"] - result["before"]) / 2**20
    total_mb = result["after"] / 2**20
    print(f"informer cache of {COUNT} objects: {cache_mb:.0f} MB; process RSS {total_mb:.0f} MB")
    assert cache_mb < 100, f"the cache of {COUNT} Databases takes {cache_mb:.0f} MB"
    assert total_mb < 250, f"a process holding {COUNT} Databases has {total_mb:.0f} MB RSS"
