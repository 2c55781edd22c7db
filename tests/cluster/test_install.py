"""The provider as it is installed: `pulumi up` with the image built here, on a real one-node Kubernetes.

One install, followed through its life in file order: pods Ready and one leader, the pod as it really
runs, a shard reached by its Service name, the consumer flow through the API's Service, metrics through
the metrics Service, a renewed certificate, a burst of PUTs, rolling updates while a client calls every
100 ms, and the loss of the leader pod and of the manager process inside its container.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from cryptography import x509
from kubernetes.client.exceptions import ApiException

from domain.agent_config import AGENT_NAME
from domain.constants import ANNOTATION_CREDENTIALS_VERSION, API_VERSION, LABEL_EXTERNAL_ID
from domain.naming import alternate_name
from domain.resources import CLAIMS, DATABASE_MOVES, DATABASES
from domain.settings import SETTINGS
from harness.images import Image
from harness.node import KubeNode
from harness.pulumi import REPO_ROOT
from informers import LEASES, SECRETS, Rest
from informers.leader import lease_holder
from tests.cluster.conftest import (
    API_HOST,
    FIGURES,
    MOVE_TARGET,
    NAMESPACE,
    PODS,
    RELEASE,
    TLS_SECRET,
    ApiClient,
    Caller,
    Shard,
    Stack,
    container,
    exec_in,
    leader,
    pods,
    ready_leader_pod,
    ready_pods,
    renewed_certificate,
    rss_bytes,
    wait_phase,
)
from tests.support.common import wait_for
from tests.support.documented import file_block, marked_lines

MEMORY_LIMIT = 512 * 1024 * 1024  # the Deployment's limit (infra/templates/deployment.yaml.j2)


def test_pulumi_up_waits_for_two_ready_pods_and_one_leader(node: KubeNode, stack: Stack, rest: Rest) -> None:
    # `pulumi up` (no skipAwait: this cluster has a kubelet) returned only after the rollout finished.
    FIGURES["pulumi_up_to_ready_pods_seconds"] = round(stack.up_seconds, 1)
    ready = ready_pods(rest)
    assert len(ready) == 2, [p["metadata"]["name"] for p in pods(rest)]
    wait_for(lambda: leader(rest) in {p["metadata"]["name"] for p in ready}, timeout=30, what="a pod holding the Lease")
    for pod in ready:
        assert container(pod)["restartCount"] == 0
    FIGURES["rss_per_pod_after_apply_bytes"] = [rss_bytes(node, pod) for pod in ready]


def test_the_pod_runs_as_non_root_read_only_without_capabilities(node: KubeNode, stack: Stack, rest: Rest) -> None:
    for pod in ready_pods(rest):
        name = pod["metadata"]["name"]
        assert exec_in(node, name, "id", "-u").strip() == "10001"
        status = dict(
            line.split(":\t", 1) for line in exec_in(node, name, "cat", "/proc/1/status").splitlines() if ":\t" in line
        )
        assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0, status["CapEff"]
        assert status["NoNewPrivs"].strip() == "1"
        assert status["Seccomp"].strip() == "2"  # RuntimeDefault: a filter
        refused = node.kubectl("-n", NAMESPACE, "exec", name, "--", "sh", "-c", "echo x > /opt/dbprovider/x")
        assert refused.returncode != 0 and "Read-only file system" in refused.stderr
        exec_in(node, name, "sh", "-c", "echo x > /tmp/x && rm /tmp/x")  # the one writable place


def test_the_shard_is_reached_by_its_service_name(node: KubeNode, shard_ready: str, rest: Rest, shard: Shard) -> None:
    # The Shard is Ready (shard_ready waited for it): the leader connected to shard1-primary.shards.svc.
    # With no admin-host override in the pod, that name was resolved by cluster DNS to the Service.
    for pod in ready_pods(rest):
        (manager,) = pod["spec"]["containers"]
        assert not [a for a in manager.get("args", []) if "override" in a]
        assert not [e for e in manager.get("env", []) if "OVERRIDE" in e["name"]]
        resolved = exec_in(node, pod["metadata"]["name"], "getent", "hosts", shard.service.host)
        assert resolved.split()[0] == shard.service.cluster_ip, resolved


def test_consumer_flow_through_the_service(
    node: KubeNode, api: ApiClient, shard_ready: str, shard: Shard, rest: Rest
) -> None:
    status, body = api.call("PUT", "/v1/databases/orders", {"sizeClass": "small"})
    assert status == 201, body
    wait_phase(api, "orders", "Ready")
    status, credentials = api.call("GET", "/v1/databases/orders/credentials")
    assert status == 200
    assert credentials["host"] == shard.service.host  # consumers in the cluster reach it by this name
    # Log in with them from inside the cluster (a pod's network, cluster DNS, the shard's Service).
    pod = ready_pods(rest)[0]["metadata"]["name"]
    script = (
        "import json, sys, psycopg\n"
        "c = json.load(sys.stdin)\n"
        "with psycopg.connect(c['uri'], connect_timeout=10) as conn:\n"
        "    conn.execute('CREATE TABLE hello (id int)')\n"
        "    print(conn.execute('SELECT current_user, current_database()').fetchone())\n"
    )
    out = exec_in(node, pod, "python", "-c", script, stdin=json.dumps(credentials))
    assert credentials["user"] in out and credentials["database"] in out
    status, _ = api.call("DELETE", "/v1/databases/orders")
    assert status == 202
    wait_for(lambda: api.call("GET", "/v1/databases/orders")[0] == 404, timeout=90, what="orders gone")
    with shard.server.superuser_connection() as conn:
        database = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (credentials["database"],))
        assert database.fetchone() is None
        assert conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (credentials["user"],)).fetchone() is None


# -- the agent as a pod, installed as docs/consumers.md says --------------------------------------------

CONSUMERS_DOC = REPO_ROOT / "docs" / "consumers.md"
THIS_TEST = "tests/cluster/test_install.py"
CLAIM_NAMESPACE = "team-a"  # docs/consumers.md's claim: orders in team-a, Secret orders
CLAIM = "orders"
AGENT_NAMESPACE = "dbprovider-agent"
WORKLOAD = "orders-client"
# The workload: logs in with the mounted Secret once a second, reading the files anew each time (from the
# volume's current `..data` directory, one consistent version), and reports each version it logged in
# with; it exits 0 once it has logged in with two (a rotation seen), 1 after 10 minutes without.
WORKLOAD_SCRIPT = """
import os, sys, time, psycopg
root = "/bindings/orders"
seen, failed = [], None
deadline = time.monotonic() + 600
while time.monotonic() < deadline:
    version = os.readlink(os.path.join(root, "..data"))
    try:
        with open(os.path.join(root, version, "uri")) as f:
            uri = f.read()
        with psycopg.connect(uri, connect_timeout=10) as conn:
            user, db = conn.execute("SELECT current_user, current_database()").fetchone()
        if version not in seen:
            seen.append(version)
            print(f"logged in as {user} to {db} with {version}", flush=True)
        if len(seen) == 2:
            sys.exit(0)
    except Exception as exc:
        if failed != (version, type(exc).__name__):
            failed = (version, type(exc).__name__)
            print(f"login failed with {version}: {type(exc).__name__}", flush=True)
    time.sleep(1)
sys.exit(1)
"""


def run_documented(node: KubeNode, workdir: Path, section: str) -> None:
    """Run a section's documented lines with bash in `workdir`, kubectl and dbprovider on PATH, as the admin."""
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(node.node_bin), str(Path(sys.executable).parent), os.environ["PATH"]]),
        "KUBECONFIG": str(node.write_kubeconfig(workdir / "kubeconfig")),
    }
    for line in marked_lines(CONSUMERS_DOC, THIS_TEST, section, runnable=True):
        result = subprocess.run(["bash", "-c", line], cwd=workdir, env=env, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, f"`{line}` exited {result.returncode}:\n{result.stdout}{result.stderr}"


def workload_pod(image: Image) -> dict[str, Any]:
    """A pod of the provider's image that mounts the claim's Secret and runs WORKLOAD_SCRIPT."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": WORKLOAD, "namespace": CLAIM_NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "client",
                    "image": image.tag,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "-c", WORKLOAD_SCRIPT],
                    "volumeMounts": [{"name": "db", "mountPath": "/bindings/orders", "readOnly": True}],
                }
            ],
            "volumes": [{"name": "db", "secret": {"secretName": CLAIM}}],
        },
    }


def claim_condition(rest: Rest, type_: str) -> dict[str, Any]:
    claim = rest.get(CLAIMS, CLAIM, CLAIM_NAMESPACE)
    return next((c for c in (claim.get("status") or {}).get("conditions") or [] if c["type"] == type_), {})


def workload_log(node: KubeNode) -> str:
    return node.kubectl("-n", CLAIM_NAMESPACE, "logs", WORKLOAD).stdout


def gone(read: Callable[[], object]) -> bool:
    try:
        read()
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def ready_agent_pods(rest: Rest, count: int) -> list[dict[str, Any]] | None:
    """The agent's `count` pods once all are Ready (not terminating), else None."""
    found = [p for p in rest.list(PODS, AGENT_NAMESPACE)["items"] if not p["metadata"].get("deletionTimestamp")]
    ready = [
        p
        for p in found
        if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])
    ]
    return ready if len(found) == len(ready) == count else None


def agent_leader(rest: Rest, candidates: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The one of `candidates` that holds the agent's Lease (its identity is `<pod name>_<pid>_<random>`)."""
    holder = lease_holder(rest.get(LEASES, AGENT_NAME, AGENT_NAMESPACE)) or ""
    return next((p for p in candidates if holder.startswith(f"{p['metadata']['name']}_")), None)


def agent_metric(node: KubeNode, pod: dict[str, Any], sample: str) -> float:
    """One sample of an agent pod's /metrics, read on its port from inside the node (0 if absent)."""
    port = node.forward(pod["status"]["podIP"], SETTINGS.ports.agent)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.rsplit(" ", 1)[0] == sample]
    return values[0] if values else 0.0


@pytest.fixture
def agent_install(node: KubeNode, stack: Stack, consumer: str, image: Image, tmp_path: Path) -> Iterator[Path]:
    """docs/consumers.md's install, run as written in a directory with the files it names: the consumer's
    token and the API's CA as given by the provider's operators, and its agent.yaml pointing at the API's
    Service (this image, its two replicas, a 2 s poll). Removed again with everything it created."""
    (tmp_path / "token").write_text(consumer + "\n")
    (tmp_path / "ca.crt").write_bytes(stack.ca.ca_file.read_bytes())
    values = yaml.safe_load(file_block(CONSUMERS_DOC, "agent.yaml"))
    values.update(providerUrl=f"https://{API_HOST}", image=image.tag, pollInterval="2s")
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(values))
    node.ensure_namespace(CLAIM_NAMESPACE)
    try:
        run_documented(node, tmp_path, "Install the agent")
        yield tmp_path
    finally:
        node.kubectl("-n", CLAIM_NAMESPACE, "delete", "pod", WORKLOAD, "--ignore-not-found", "--wait=false")
        if (tmp_path / "dbprovider-agent.yaml").exists():
            node.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", str(tmp_path / "dbprovider-agent.yaml"))


def test_the_agent_as_a_pod_keeps_a_claims_secret_for_a_workload(
    node: KubeNode, agent_install: Path, api: ApiClient, shard_ready: str, shard: Shard, rest: Rest, image: Image
) -> None:
    """docs/consumers.md on this cluster: the agent as pods of the image (its ServiceAccount and RBAC, the
    token and CA Secrets), two replicas of which one leads and the other is ready but idle, reaches the
    API's Service; the documented claim becomes Ready and a Secret that a workload pod logs in with through
    the shard's client endpoint; the documented rotation reaches that pod's mounted Secret; the leader pod
    deleted, the other replica leads and the Secret is kept; the documented delete removes the Secret and
    the database."""
    agent_pods = wait_for(lambda: ready_agent_pods(rest, 2), timeout=180, what="the agent's two Ready pods")
    assert all(p["spec"]["containers"][0]["image"] == image.tag for p in agent_pods)
    agent_pod = wait_for(lambda: agent_leader(rest, agent_pods), timeout=60, what="an agent pod holding the Lease")
    (idle,) = [p for p in agent_pods if p is not agent_pod]
    (agent_install / "claim.yaml").write_text(file_block(CONSUMERS_DOC, "claim.yaml"))
    run_documented(node, agent_install, "Claim a database")
    try:
        wait_for(lambda: claim_condition(rest, "Ready").get("status") == "True", timeout=180, what="the claim Ready")
    except AssertionError as exc:
        claim = rest.get(CLAIMS, CLAIM, CLAIM_NAMESPACE)
        logs = node.kubectl("-n", AGENT_NAMESPACE, "logs", "--tail=40", f"deployment/{AGENT_NAME}").stdout
        raise AssertionError(f"{exc}; claim status {claim.get('status')}; the agent's log:\n{logs}") from None
    claim = rest.get(CLAIMS, CLAIM, CLAIM_NAMESPACE)
    database_id = claim["status"]["databaseId"]
    assert claim["status"]["binding"]["name"] == CLAIM
    secret = rest.get(SECRETS, CLAIM, CLAIM_NAMESPACE)
    before = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
    assert before["host"] == shard.service.host  # the shard's client endpoint, a Service name in this cluster

    rest.create(PODS, workload_pod(image), CLAIM_NAMESPACE)
    first = f"logged in as {before['username']} to {before['database']} with "
    wait_for(lambda: first in workload_log(node), timeout=180, what="the workload's first login")

    version = secret["metadata"]["annotations"][ANNOTATION_CREDENTIALS_VERSION]
    run_documented(node, agent_install, "Rotation")
    wait_for(
        lambda: (
            rest.get(SECRETS, CLAIM, CLAIM_NAMESPACE)["metadata"]["annotations"][ANNOTATION_CREDENTIALS_VERSION]
            != version
        ),
        timeout=120,
        what="the rotated password in the Secret",
    )
    rotated = rest.get(SECRETS, CLAIM, CLAIM_NAMESPACE)
    after = {key: base64.b64decode(value).decode() for key, value in rotated["data"].items()}
    # A rotation with the claim's default overlap hands out the database's other login user.
    assert after["password"] != before["password"] and after["username"] == alternate_name(before["username"])
    finished = wait_for(
        lambda: (
            (p := rest.get(PODS, WORKLOAD, CLAIM_NAMESPACE))["status"].get("phase") in ("Succeeded", "Failed") and p
        ),
        timeout=180,
        what="the workload's login with the rotated Secret",
    )
    log = workload_log(node).splitlines()
    assert finished["status"]["phase"] == "Succeeded", log
    logins = [line for line in log if line.startswith(first)]
    # Two versions of the mounted Secret, both acting as the database's owner role (current_user).
    assert len(logins) == 2 and logins[-1] == log[-1], log
    # The old credentials keep working for the overlap (docs/consumers.md, Rotation): the volume's old
    # version is never refused between the provider's new password and the kubelet's update of the volume.
    refused = [line for line in log if "login failed" in line]
    FIGURES["agent_rotation_workload_refused_versions"] = len(refused)
    assert not refused, log
    shard.server.connect(before["username"], before["password"], before["database"]).close()  # within the overlap

    # The same pod did it all, never restarted; the other one is Ready and has run no pass.
    still = rest.get(PODS, agent_pod["metadata"]["name"], AGENT_NAMESPACE)
    assert container(still)["restartCount"] == 0, container(still).get("lastState")
    assert agent_metric(node, idle, "dbprovider_agent_leader") == 0
    assert agent_metric(node, idle, 'dbprovider_agent_passes_total{outcome="synced"}') == 0
    assert agent_metric(node, agent_pod, "dbprovider_agent_leader") == 1

    # The leader pod deleted: another replica takes the Lease (the idle one, or the pod that replaces the
    # deleted one, whichever campaigns first), and the Secret is kept as it is.
    deleted = agent_pod["metadata"]["name"]
    rest.delete(PODS, deleted, AGENT_NAMESPACE)

    def successor() -> dict[str, Any] | None:
        live = [p for p in rest.list(PODS, AGENT_NAMESPACE)["items"] if p["metadata"]["name"] != deleted]
        leader = agent_leader(rest, live)
        return leader if leader is not None and leader["status"].get("podIP") else None

    leader = wait_for(successor, 120, "another agent replica leading")
    wait_for(lambda: agent_metric(node, leader, 'dbprovider_agent_passes_total{outcome="synced"}') > 0, 60, "its pass")
    kept = rest.get(SECRETS, CLAIM, CLAIM_NAMESPACE)
    assert kept["data"] == rotated["data"] and kept["metadata"]["uid"] == rotated["metadata"]["uid"]
    assert claim_condition(rest, "Ready").get("status") == "True"

    run_documented(node, agent_install, "Deleting a claim")
    wait_for(lambda: gone(lambda: rest.get(CLAIMS, CLAIM, CLAIM_NAMESPACE)), timeout=120, what="the claim gone")
    assert gone(lambda: rest.get(SECRETS, CLAIM, CLAIM_NAMESPACE))
    wait_for(lambda: api.call("GET", f"/v1/databases/{database_id}")[0] == 404, timeout=90, what="the database gone")
    with shard.server.superuser_connection() as conn:
        assert conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (before["database"],)).fetchone() is None


def test_metrics_are_scraped_through_the_metrics_service(node: KubeNode, shard_ready: str, rest: Rest) -> None:
    with node.admin_client() as client:
        service = kubernetes.client.CoreV1Api(client).read_namespaced_service(f"{RELEASE}-metrics", NAMESPACE)
    port = node.forward(service.spec.cluster_ip, service.spec.ports[0].port)

    def scrape() -> str:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            connection.request("GET", "/metrics")
            response = connection.getresponse()
            assert response.status == 200
            return response.read().decode()
        finally:
            connection.close()

    assert "dbprovider_shard_ready{" in scrape()
    # The kubelet's probes hit the API's real port and paths (counted by the API itself; the liveness
    # probe starts 10 s after the container, and each scrape reaches either replica).
    wait_for(
        lambda: all(f'route="{path}"' in scrape() for path in ("/healthz", "/readyz")),
        timeout=60,
        what="a scrape counting the kubelet's probe requests",
    )


def test_a_renewed_certificate_is_served_without_a_restart(
    node: KubeNode, stack: Stack, api: ApiClient, rest: Rest
) -> None:
    before = {p["metadata"]["name"]: container(p)["restartCount"] for p in ready_pods(rest)}
    old = api.served_certificate()
    secret, renewed = renewed_certificate(stack, "api-renewed")
    current = rest.get(SECRETS, TLS_SECRET, NAMESPACE)
    secret["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    started = time.monotonic()
    rest.replace(SECRETS, secret)
    wanted = x509.load_pem_x509_certificate(renewed.cert_file.read_bytes()).serial_number

    def serials() -> set[int]:  # each replica, at its pod's address
        return {
            x509.load_der_x509_certificate(api.served_certificate(p["status"]["podIP"])).serial_number
            for p in ready_pods(rest)
        }

    wait_for(lambda: serials() == {wanted}, timeout=180, what="the renewed certificate from every replica")
    FIGURES["certificate_renewal_served_seconds"] = round(time.monotonic() - started, 1)
    assert old != api.served_certificate()
    after = {p["metadata"]["name"]: container(p)["restartCount"] for p in ready_pods(rest)}
    assert after == before  # same pods, no restarts


def test_a_burst_of_200_puts_stays_within_the_memory_limit(
    node: KubeNode, api: ApiClient, shard_ready: str, rest: Rest
) -> None:
    ids = [f"burst-{i}" for i in range(200)]
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda i: api.call("PUT", f"/v1/databases/{i}", {"sizeClass": "small"})[0], ids))
    assert statuses == [201] * 200
    for external_id in ids:
        wait_phase(api, external_id, "Ready", timeout=300)
    for pod in ready_pods(rest):
        state = container(pod)
        assert state["restartCount"] == 0, state.get("lastState")
        assert "terminated" not in (state.get("lastState") or {}), state["lastState"]
        rss = rss_bytes(node, pod)
        assert 0 < rss < MEMORY_LIMIT
        FIGURES.setdefault("rss_after_200_puts_bytes", []).append(rss)


@pytest.fixture(scope="module")
def steady(api: ApiClient, shard_ready: str) -> Iterator[str]:
    """A Ready database the caller reads and re-puts during rollouts."""
    status, body = api.call("PUT", "/v1/databases/steady", {"sizeClass": "small"})
    assert status in (200, 201), body
    wait_phase(api, "steady", "Ready")
    yield "steady"


def _roll(stack: Stack, api: ApiClient, rest: Rest, steady: str, figure: str, *config: tuple[str, str]) -> None:
    before = {p["metadata"]["name"] for p in pods(rest)}
    with Caller(api, steady) as caller:
        seconds = stack.up(*config)
    FIGURES[figure] = round(seconds, 1)
    FIGURES[f"{figure}_calls"] = caller.calls
    FIGURES[f"{figure}_longest_pause"] = round(caller.longest_pause, 2)
    assert caller.failures == [], caller.failures
    assert caller.longest_pause < 2.0, caller.longest_pause  # it kept calling throughout the rollout
    after = ready_pods(rest)
    assert len(after) == 2
    assert not before & {p["metadata"]["name"] for p in after}  # every pod was replaced


def test_a_new_image_tag_rolls_the_pods_without_a_failed_request(
    node: KubeNode, stack: Stack, api: ApiClient, rest: Rest, image: Image, steady: str
) -> None:
    rolled = node.tag_image(image, f"{image.tag}-rolled")
    _roll(stack, api, rest, steady, "rollout_image_seconds", ("dbprovider:image", rolled.tag))
    assert {p["spec"]["containers"][0]["image"] for p in ready_pods(rest)} == {rolled.tag}


def test_a_config_change_rolls_the_pods_without_a_failed_request(
    stack: Stack, api: ApiClient, rest: Rest, steady: str
) -> None:
    checksum = {p["metadata"]["annotations"]["checksum/config"] for p in ready_pods(rest)}
    _roll(stack, api, rest, steady, "rollout_config_seconds", ("dbprovider:api.idleTimeout", "20s"))
    assert {p["metadata"]["annotations"]["checksum/config"] for p in ready_pods(rest)}.isdisjoint(checksum)


def _put_all(api: ApiClient, prefix: str, count: int) -> list[str]:
    ids = [f"{prefix}-{i}" for i in range(count)]
    for external_id in ids:
        status, body = api.call("PUT", f"/v1/databases/{external_id}", {"sizeClass": "small"})
        assert status == 201, body
    return ids


def _all_databases_ready(rest: Rest) -> bool:
    items = rest.list(DATABASES, NAMESPACE)["items"]
    return bool(items) and all((d.get("status") or {}).get("phase") in ("Ready",) for d in items)


def test_deleting_the_leader_pod_hands_over_the_lease(node: KubeNode, api: ApiClient, rest: Rest, steady: str) -> None:
    old = ready_leader_pod(rest)["metadata"]["name"]
    ids = _put_all(api, "during-delete", 10)
    with Caller(api, steady) as caller:
        started = time.monotonic()
        deleted = node.kubectl("-n", NAMESPACE, "delete", "pod", old, "--wait=false")
        assert deleted.returncode == 0, deleted.stderr
        wait_for(lambda: leader(rest) not in ("", old), timeout=60, what="another replica holding the Lease")
        FIGURES["leader_pod_deleted_lease_moved_seconds"] = round(time.monotonic() - started, 1)
        wait_for(lambda: len(ready_pods(rest)) == 2, timeout=120, what="two Ready pods again")
        FIGURES["leader_pod_deleted_two_ready_seconds"] = round(time.monotonic() - started, 1)
    assert caller.failures == [], caller.failures  # a deleted pod drains like a rolled one
    for external_id in ids:
        wait_phase(api, external_id, "Ready")
    wait_for(lambda: _all_databases_ready(rest), timeout=300, what="every Database Ready")


def test_sigkill_of_the_leaders_manager_hands_over_and_restarts_it(
    node: KubeNode, api: ApiClient, rest: Rest, steady: str
) -> None:
    # The previous test's replacement pod may still be starting.
    pod = ready_leader_pod(rest)
    old = pod["metadata"]["name"]
    restarts = container(pod)["restartCount"]
    pids = node.container_pids(container(pod)["containerID"])
    assert pids
    ids = _put_all(api, "during-kill", 10)
    caller = Caller(api, steady).__enter__()
    started = time.monotonic()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        current = next((p for p in pods(rest) if p["metadata"]["name"] == old), None)
        return current if current is not None and container(current)["restartCount"] == restarts + 1 else None

    after = wait_for(restarted, timeout=120, what=f"{old}'s manager restarted by the kubelet")
    terminated = container(after)["lastState"]["terminated"]
    assert terminated["exitCode"] == 137 and terminated["reason"] != "OOMKilled", terminated
    wait_for(lambda: len(ready_pods(rest)) == 2, timeout=120, what="two Ready pods again")
    ready_leader_pod(rest, timeout=60)
    FIGURES["manager_sigkilled_leader_and_two_ready_seconds"] = round(time.monotonic() - started, 1)
    caller.__exit__()
    # What consumers saw: calls that reached the killed replica before its endpoint was removed failed.
    FIGURES["manager_sigkilled_failed_calls"] = f"{len(caller.failures)} of {caller.calls}"
    for external_id in ids:
        wait_phase(api, external_id, "Ready")
    wait_for(lambda: _all_databases_ready(rest), timeout=300, what="every Database Ready")


def test_an_offline_move_copies_with_the_images_pg_dump_and_pg_restore(
    node: KubeNode, api: ApiClient, shard_ready: str, rest: Rest, shard: Shard, move_target: Shard
) -> None:
    # Each pod finds the image's client tools of each target major as a move's preflight looks for them.
    script = (
        "from reconciler.move.tools import ClientTools\n"
        "tools = ClientTools.from_environment()\n"
        "for major in (15, 16, 17, 18):\n"
        "    chosen = tools.for_move(15, major)\n"
        "    print(chosen.major, chosen.pg_dump, chosen.pg_restore)\n"
    )
    expected = [
        [str(m), f"/opt/postgresql/{m}/bin/pg_dump", f"/opt/postgresql/{m}/bin/pg_restore"] for m in range(15, 19)
    ]
    for pod in ready_pods(rest):
        found = exec_in(node, pod["metadata"]["name"], "python", "-c", script).splitlines()
        assert [line.split() for line in found] == expected, found

    status, body = api.call("PUT", "/v1/databases/moving", {"sizeClass": "small"})
    assert status == 201, body
    wait_phase(api, "moving", "Ready")
    status, credentials = api.call("GET", "/v1/databases/moving/credentials")
    assert status == 200 and credentials["host"] == shard.service.host
    login = (credentials["user"], credentials["password"], credentials["database"])
    with shard.server.connect(*login, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id bigserial PRIMARY KEY, note text NOT NULL)")
        conn.execute("INSERT INTO orders (note) SELECT 'order ' || g FROM generate_series(1, 100) g")
        rows = conn.execute("SELECT id, note FROM orders ORDER BY id").fetchall()
    (database,) = rest.list(DATABASES, NAMESPACE, query=[("labelSelector", f"{LABEL_EXTERNAL_ID}=moving")])["items"]
    name = database["metadata"]["name"]
    rest.create(
        DATABASE_MOVES,
        {
            "apiVersion": API_VERSION,
            "kind": "DatabaseMove",
            "metadata": {"name": "moving-to-shard2", "namespace": NAMESPACE},
            "spec": {"database": name, "target": MOVE_TARGET, "mode": "Offline"},
        },
        NAMESPACE,
    )

    def ended() -> dict[str, Any] | None:
        moved = rest.get(DATABASE_MOVES, "moving-to-shard2", NAMESPACE).get("status") or {}
        return moved if moved.get("phase") in ("Completed", "Failed", "Aborted") else None

    moved = wait_for(ended, timeout=180, what="the offline move to end")
    assert moved["phase"] == "Completed" and moved["mode"] == "Offline", moved
    wait_for(
        lambda: api.call("GET", "/v1/databases/moving/credentials")[1]["host"] == move_target.service.host,
        timeout=60,
        what="the credentials to name shard2",
    )
    with move_target.server.connect(*login) as conn:
        assert conn.execute("SELECT id, note FROM orders ORDER BY id").fetchall() == rows
    status, _ = api.call("DELETE", "/v1/databases/moving")
    assert status == 202
    wait_for(lambda: api.call("GET", "/v1/databases/moving")[0] == 404, timeout=90, what="moving gone")


def test_rss_per_pod_at_the_end(node: KubeNode, rest: Rest) -> None:
    rss = [rss_bytes(node, pod) for pod in ready_pods(rest)]
    FIGURES["rss_per_pod_at_end_bytes"] = rss
    assert all(0 < value < MEMORY_LIMIT for value in rss)
