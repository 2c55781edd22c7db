"""The upgrade from the previous release to this one as pods, the way docs/upgrade.md tells a platform
engineer to do it, on the one-node Kubernetes; then the rollback.

One install followed in file order: the previous release (releases.yaml: built from its commit, its own
`dbprovider render`, its image built by hack/build-image.sh from the same source archive) applied with
`kubectl apply`; a Shard behind a Service, a Consumer and Databases (Ready, Deleting within retention,
Failed/NoCapacity); then the CRDs of this checkout's render, then the rest of it (the Deployment's real
rolling update to the image built here) while a consumer calls the API through its Service every
100 ms; then everything checked again; then the rollback as docs/upgrade.md describes it.

tests/upgrade runs the same path with manager processes and more phases; this module adds what only
pods have: images, the kubelet's probes and termination, the Deployment controller's rollout and
kube-proxy's endpoints.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from domain.constants import ANNOTATION_LEADER
from domain.naming import database_object_name
from domain.resources import DATABASES, SHARDS
from domain.version import __version__
from harness.certs import CertificateAuthority
from harness.images import Image, build_image
from harness.node import KubeNode
from harness.releases import BuiltRelease, build
from informers import LEASES, SECRETS, Rest
from tests.cluster.conftest import (
    ADMIN_SECRET,
    CONSUMER,
    FIGURES,
    NAMESPACE,
    POD_SELECTOR,
    PODS,
    RELEASE,
    SHARD,
    SHARDS_NAMESPACE,
    TLS_SECRET,
    ApiClient,
    Caller,
    Shard,
    api_client,
    create_consumer,
    create_shard,
    exec_in,
    leader,
    prepare_install,
    ready_pods,
    wait_phase,
)
from tests.support.common import condition, decoded, wait_for
from tests.upgrade.stack import Runtime, built_release, this_checkout

REPLICAS = 2  # the install's default
CRDS = ("shards.db.bnerd.com", "consumers.db.bnerd.com", "databases.db.bnerd.com")
# Whatever a failed call looked like, it was an HTTP answer (an error status) or no answer at all.
HTTP_ANSWER = re.compile(r"^\S+ (GET|PUT) \d{3} ")


class StoppingPods:
    """Watches the install's pods (a thread, every 100 ms, its own apiserver connection): for each pod
    of `image`, when it was first seen terminating and when it was last seen at all."""

    def __init__(self, node: KubeNode, image: str) -> None:
        self.node = node
        self.image = image
        self.windows: dict[str, list[float]] = {}  # pod -> [first seen terminating, last seen]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StoppingPods:
        self._thread.start()
        return self

    def _run(self) -> None:
        with self.node.admin_client() as client:
            rest = Rest(client)
            while not self._stop.is_set():
                try:
                    found = all_pods(rest)
                except Exception:  # noqa: BLE001 - a missed poll (apiserver busy) leaves the windows as they were
                    found = []
                for pod in found:
                    now = time.monotonic()
                    name = pod["metadata"]["name"]
                    if image_of(pod) != self.image:
                        continue
                    if pod["metadata"].get("deletionTimestamp") and name not in self.windows:
                        self.windows[name] = [now, now]
                    elif name in self.windows:
                        self.windows[name][1] = now
                self._stop.wait(0.1)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def outside(self, caller: Caller, slack: float = 0.5) -> list[str]:
        """The caller's failures sent when no pod of `image` was stopping (a call to a pod that is gone
        fails seconds later: the relay's connect to its address finds no host)."""

        def during_a_stop(failure: str) -> bool:
            when = caller.started + float(failure.split("s ", 1)[0])
            return any(first - slack <= when <= last + slack for first, last in self.windows.values())

        return [failure for failure in caller.failures if not during_a_stop(failure)]


@pytest.fixture(scope="module")
def previous() -> BuiltRelease:
    """The newest release in releases.yaml, exported from its commit and installed in its own venv."""
    return build()


@pytest.fixture(scope="module")
def previous_image(previous: BuiltRelease) -> Image:
    """The previous release's image, built by hack/build-image.sh from its source archive."""
    return build_image(source=previous.source, tag=f"localhost/dbprovider:{previous.release.version}")


@pytest.fixture(scope="module")
def node(image: Image, previous_image: Image) -> Iterator[KubeNode]:
    """The one-node cluster, with both releases' images in its containerd."""
    with KubeNode() as started:
        started.load_image(previous_image)
        started.load_image(image)
        yield started


def install_values(image: str) -> dict[str, Any]:
    """The values a platform engineer keeps in the landscape repository (keys of the previous release,
    which this one reads too). Retention outlasts the test: the Deleting database stays Deleting."""
    return {
        "releaseName": RELEASE,
        "namespace": NAMESPACE,
        "replicas": 2,
        "image": image,
        "tls": {"secretName": TLS_SECRET},
        "shardSecrets": [{"namespace": SHARDS_NAMESPACE, "name": ADMIN_SECRET}],
        "sizeClasses": {"small": {"connectionLimit": 1}},
        "softDelete": {"retention": "1h"},
    }


def render(runtime: Runtime, image: str, workdir: Path) -> list[dict[str, Any]]:
    """`dbprovider render` of `runtime`'s release with the values pointing at `image`."""
    values = workdir / f"values-{runtime.version}-{image.rsplit(':', 1)[-1]}.yaml"
    values.write_text(yaml.safe_dump(install_values(image)))
    return runtime.render(values)


def kubectl_apply(node: KubeNode, manifests: list[dict[str, Any]]) -> None:
    applied = node.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(manifests), timeout=180)
    assert applied.returncode == 0, applied.stderr


def apply_release(node: KubeNode, manifests: list[dict[str, Any]]) -> float:
    """docs/upgrade.md, "The procedure": the CRDs first, until Established, then the rest of the
    install; returns the seconds from the second apply to the finished rollout."""
    crds = [m for m in manifests if m["kind"] == "CustomResourceDefinition"]
    names = [m["metadata"]["name"] for m in crds]
    assert set(CRDS) <= set(names)  # what every release has; later ones add more
    kubectl_apply(node, crds)
    waited = node.kubectl("wait", "--for", "condition=Established", "--timeout=60s", *(f"crd/{name}" for name in names))
    assert waited.returncode == 0, waited.stderr
    started = time.monotonic()
    kubectl_apply(node, [m for m in manifests if m["kind"] != "CustomResourceDefinition"])
    rolled = node.kubectl("-n", NAMESPACE, "rollout", "status", f"deployment/{RELEASE}", "--timeout=600s", timeout=620)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    return time.monotonic() - started


def all_pods(rest: Rest) -> list[dict[str, Any]]:
    """The provider's pods, terminating ones too."""
    items: list[dict[str, Any]] = rest.list(PODS, NAMESPACE, query=[("labelSelector", POD_SELECTOR)])["items"]
    return items


def image_of(pod: dict[str, Any]) -> str:
    image: str = pod["spec"]["containers"][0]["image"]
    return image


def wait_only(rest: Rest, image: str, timeout: float = 120) -> None:
    """Until every pod of the install, terminating ones too, runs `image` (the old ones are gone)."""
    wait_for(lambda: {image_of(p) for p in all_pods(rest)} == {image}, timeout=timeout, what=f"only pods of {image}")


def leader_release(rest: Rest) -> str | None:
    """The release the Lease's leader mark names (None: no mark, as 0.1.0 writes none)."""
    lease = rest.get(LEASES, f"{RELEASE}-manager", NAMESPACE)
    value = (lease["metadata"].get("annotations") or {}).get(ANNOTATION_LEADER)
    release: str | None = json.loads(value)["release"] if value else None
    return release


@dataclass
class Installed:
    """The install and the consumer of this module."""

    previous: Runtime
    current: Runtime
    ca: CertificateAuthority
    workdir: Path
    api: ApiClient
    seconds: float


@pytest.fixture(scope="module")
def installed(
    node: KubeNode,
    rest: Rest,
    shard: Shard,
    previous: BuiltRelease,
    previous_image: Image,
    tmp_path_factory: pytest.TempPathFactory,
) -> Installed:
    """The previous release installed as docs/install.md of its day says, with its own CLI's render."""
    workdir = tmp_path_factory.mktemp("upgrade-pods")
    ca = prepare_install(node, rest, shard, workdir)
    old = built_release(previous)
    seconds = apply_release(node, render(old, previous_image.tag, workdir))
    api = api_client(node, ca, create_consumer(rest))

    def answers() -> bool:  # as `pulumi up` awaits the Service's endpoints: kube-proxy rejects until then
        try:
            return api.call("GET", "/v1/databases")[0] == 200  # the token too, once the pods' caches have it
        except OSError:
            return False

    wait_for(answers, timeout=60, what="the API answering the consumer through its Service")
    return Installed(old, this_checkout(__version__), ca, workdir, api, seconds)


@dataclass
class Case:
    """One Database and how it looked under the previous release."""

    external_id: str
    phase: str
    reason: str
    status: dict[str, Any] = field(default_factory=dict)
    credentials: dict[str, str] | None = None

    @property
    def name(self) -> str:
        return database_object_name(CONSUMER, self.external_id)


def api_port(pod: dict[str, Any]) -> int:
    """The API's container port as the pod declares it (the release that runs it chose the number)."""
    (manager,) = (c for c in pod["spec"]["containers"] if c["name"] == "manager")
    port: int = next(p["containerPort"] for p in manager["ports"] if p["name"] == "https")
    return port


def wait_every_pod_authenticates(node: KubeNode, rest: Rest, api: ApiClient) -> None:
    """Wait until each of the release's pods, asked directly, knows the consumer's token. One 200 through
    the Service shows only the pod kube-proxy picked: under load the other pod's token index may not have
    the token's Secret yet, and a first PUT sent to it answers 401."""

    def every_pod_knows_the_token() -> bool:
        ready = ready_pods(rest)
        if len(ready) < REPLICAS:
            return False
        for pod in ready:
            port = node.forward(pod["status"]["podIP"], api_port(pod))
            try:
                if api.call("GET", "/v1/databases", port=port)[0] != 200:
                    return False
            except OSError:
                return False
        return True

    wait_for(every_pod_knows_the_token, timeout=120, what="every pod authenticating the consumer")


def database(rest: Rest, case: Case) -> dict[str, Any]:
    found: dict[str, Any] = rest.get(DATABASES, case.name, NAMESPACE)
    return found


def credentials_secret(rest: Rest, case: Case) -> dict[str, str] | None:
    try:
        return decoded(rest.get(SECRETS, f"{case.name}-credentials", NAMESPACE))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


LOGIN_SCRIPT = (
    "import json, sys, psycopg\n"
    "out = []\n"
    "for c in json.load(sys.stdin):\n"
    "    try:\n"
    "        with psycopg.connect(host=c['host'], port=int(c['port']), user=c['user'], password=c['password'],\n"
    "                             dbname=c['database'], sslmode=c['sslmode'], connect_timeout=10) as conn:\n"
    "            user = conn.execute('SELECT current_user').fetchone()[0]\n"
    "            out.append(None if user == c['user'] else 'logged in as ' + user)\n"
    "    except psycopg.Error as exc:\n"
    "        out.append(type(exc).__name__)\n"
    "print(json.dumps(out))\n"
)


def logins(node: KubeNode, rest: Rest, credentials: list[dict[str, str]]) -> list[str | None]:
    """Log in with each set of credentials from inside the cluster (a provider pod's network, cluster
    DNS, the shard's Service): None for a login, else the error class."""
    pod = ready_pods(rest)[0]["metadata"]["name"]
    out = exec_in(node, pod, "python", "-c", LOGIN_SCRIPT, stdin=json.dumps(credentials))
    results: list[str | None] = json.loads(out.strip().splitlines()[-1])
    return results


@pytest.fixture(scope="module")
def world(node: KubeNode, rest: Rest, shard: Shard, installed: Installed) -> dict[str, Case]:
    """Databases made through the previous release: two Ready, one Deleting within its retention, one
    Failed/NoCapacity (the shard drained; it stays drained); how each looked, credentials included."""
    create_shard(rest, shard)
    api = installed.api
    cases = {
        c.external_id: c
        for c in (
            Case("ready-1", "Ready", "Provisioned"),
            Case("ready-2", "Ready", "Provisioned"),
            Case("deleting", "Deleting", "Deleting"),
        )
    }
    wait_every_pod_authenticates(node, rest, api)
    for case in cases.values():
        status, body = api.call("PUT", f"/v1/databases/{case.external_id}", {"sizeClass": "small"})
        assert status == 201, body
    for case in cases.values():
        wait_phase(api, case.external_id, "Ready")
    status, body = api.call("DELETE", "/v1/databases/deleting")
    assert status == 202, body
    wait_phase(api, "deleting", "Deleting")
    rest.patch(SHARDS, SHARD, {"spec": {"accepting": False}})
    nocapacity = cases["nocapacity"] = Case("nocapacity", "Failed", "NoCapacity")
    status, body = api.call("PUT", "/v1/databases/nocapacity", {"sizeClass": "small"})
    assert status == 201, body
    wait_phase(api, "nocapacity", "Failed")
    for case in cases.values():
        wait_for(
            lambda c=case: (condition(database(rest, c), "Ready") or {}).get("reason") == c.reason,
            timeout=60,
            what=f"{case.external_id}: Ready reason {case.reason}",
        )
        case.status = database(rest, case)["status"]
        case.credentials = credentials_secret(rest, case)
    assert nocapacity.credentials is None
    return cases


def differences(node: KubeNode, rest: Rest, api: ApiClient, world: dict[str, Case]) -> list[str]:
    """Every way the databases, their credentials and the consumer's view differ from before."""
    problems = []
    for case in world.values():
        db = database(rest, case)
        status = db.get("status") or {}
        reason = (condition(db, "Ready") or {}).get("reason")
        if (status.get("phase"), reason) != (case.phase, case.reason):
            problems.append(f"{case.external_id}: {status.get('phase')}/{reason}, was {case.phase}/{case.reason}")
        for key in ("shard", "tenantName", "dropAfter", "appliedConnectionLimit"):
            if status.get(key) != case.status.get(key):
                problems.append(f"{case.external_id}: status.{key} {status.get(key)!r}, was {case.status.get(key)!r}")
        if credentials_secret(rest, case) != case.credentials:
            problems.append(f"{case.external_id}: the credentials Secret changed")
    # A login from inside the cluster: the Ready ones log in, the disabled (Deleting) tenant does not.
    credentials = {c.external_id: c.credentials for c in world.values() if c.credentials is not None}
    for external_id, why in zip(credentials, logins(node, rest, list(credentials.values())), strict=True):
        case = world[external_id]
        if case.phase == "Ready" and why is not None:
            problems.append(f"{case.external_id}: its credentials do not log in ({why})")
        if case.phase == "Deleting" and why is None:
            problems.append(f"{case.external_id}: a disabled tenant logs in")
    # The consumer's token, and what it sees through the Service.
    status, body = api.call("GET", "/v1/databases")
    if status != 200:
        return [*problems, f"GET /v1/databases answered {status}"]
    seen = {item["externalId"]: item["phase"] for item in body["items"]}
    if seen != {c.external_id: c.phase for c in world.values()}:
        problems.append(f"the consumer sees {seen}")
    for case in world.values():
        if case.phase == "Ready":
            status, body = api.call("GET", f"/v1/databases/{case.external_id}/credentials")
            if status != 200 or (body or {}).get("password") != (case.credentials or {}).get("password"):
                problems.append(f"{case.external_id}: credentials through the API: {status}")
    return problems


def test_the_previous_release_runs_as_two_pods_with_one_leader(
    rest: Rest, installed: Installed, previous_image: Image
) -> None:
    FIGURES["install_previous_rollout_seconds"] = round(installed.seconds, 1)
    ready = ready_pods(rest)
    assert [image_of(p) for p in ready] == [previous_image.tag] * REPLICAS
    assert all("app.kubernetes.io/version" not in p["metadata"]["labels"] for p in ready)  # 0.1.0 set none
    wait_for(lambda: leader(rest) in {p["metadata"]["name"] for p in ready}, timeout=60, what="a pod holding the Lease")


def test_databases_in_their_phases_under_the_previous_release(
    node: KubeNode, rest: Rest, installed: Installed, world: dict[str, Case]
) -> None:
    assert {c.external_id: (c.phase, c.reason) for c in world.values()} == {
        "ready-1": ("Ready", "Provisioned"),
        "ready-2": ("Ready", "Provisioned"),
        "deleting": ("Deleting", "Deleting"),
        "nocapacity": ("Failed", "NoCapacity"),
    }
    assert differences(node, rest, installed.api, world) == []


def _roll_with_caller(
    node: KubeNode, rest: Rest, installed: Installed, manifests: list[dict[str, Any]], image: str, figure: str
) -> tuple[Caller, StoppingPods]:
    """Apply `manifests` the documented way while the consumer calls the API every 100 ms, until
    every old pod is gone (not only until `rollout status` returns: a terminating pod still counts);
    the caller, and when each old pod was stopping."""
    old_pods = all_pods(rest)
    with StoppingPods(node, image_of(old_pods[0])) as stopping, Caller(installed.api, "ready-1") as caller:
        started = time.monotonic()
        FIGURES[f"{figure}_rollout_seconds"] = round(apply_release(node, manifests), 1)
        wait_only(rest, image)
        FIGURES[f"{figure}_old_pods_gone_seconds"] = round(time.monotonic() - started, 1)
    FIGURES[f"{figure}_calls"] = caller.calls
    FIGURES[f"{figure}_failed_calls"] = caller.failures
    FIGURES[f"{figure}_longest_pause"] = round(caller.longest_pause, 2)
    assert len(old_pods) == 2 and len(stopping.windows) == 2, stopping.windows
    assert caller.longest_pause < 2.0, caller.longest_pause  # it kept calling throughout
    ready = ready_pods(rest)
    assert [image_of(p) for p in ready] == [image] * 2
    return caller, stopping


def test_the_upgrade_crds_first_then_the_rolling_update(
    node: KubeNode, rest: Rest, installed: Installed, world: dict[str, Case], image: Image
) -> None:
    caller, stopping = _roll_with_caller(
        node, rest, installed, render(installed.current, image.tag, installed.workdir), image.tag, "upgrade"
    )
    # docs/upgrade.md: 0.1.0 pods have no preStop, so the calls kube-proxy still routes to an old pod
    # after its SIGTERM, until its endpoint is removed, fail. Only those: every failed call happened
    # while an old pod was stopping, and none got an HTTP answer (a pod that answers answers right).
    FIGURES["upgrade_old_pods_stopping_seconds"] = [round(last - first, 1) for first, last in stopping.windows.values()]
    assert stopping.outside(caller) == [], (caller.failures, stopping.windows, caller.started)
    assert not [f for f in caller.failures if HTTP_ANSWER.match(f)], caller.failures
    ready = ready_pods(rest)
    assert {p["metadata"]["labels"].get("app.kubernetes.io/version") for p in ready} == {__version__}
    wait_for(
        lambda: leader(rest) in {p["metadata"]["name"] for p in ready} and leader_release(rest) == __version__,
        timeout=60,
        what="a new pod holding the Lease",
    )


def test_everything_is_kept_after_the_upgrade(
    node: KubeNode, rest: Rest, installed: Installed, world: dict[str, Case]
) -> None:
    # The new leader's first pass over every Database (the ownership check) has had its time.
    wait_for(
        lambda: all(
            condition(database(rest, c), "OwnershipRecorded") is not None for c in world.values() if c.phase == "Ready"
        ),
        timeout=120,
        what="the new leader's ownership check of the Ready databases",
    )
    assert differences(node, rest, installed.api, world) == []


def test_the_rollback_to_the_previous_release(
    node: KubeNode, rest: Rest, installed: Installed, world: dict[str, Case], previous_image: Image
) -> None:
    manifests = render(installed.previous, previous_image.tag, installed.workdir)
    caller, _ = _roll_with_caller(node, rest, installed, manifests, previous_image.tag, "rollback")
    assert caller.failures == []  # the pods that stop are this release's: they leave the Service first
    # docs/upgrade.md: 0.1.0 pods do not lead while the Lease names a 0.2.0 holder; with no 0.2.0
    # pod left, free it.
    assert leader_release(rest) == __version__
    started = time.monotonic()
    patched = node.kubectl(
        "-n",
        NAMESPACE,
        "patch",
        "lease",
        f"{RELEASE}-manager",
        "--type",
        "merge",
        "-p",
        '{"spec":{"holderIdentity":null}}',
    )
    assert patched.returncode == 0, patched.stderr
    ready = {p["metadata"]["name"] for p in ready_pods(rest)}
    wait_for(lambda: leader(rest) in ready, timeout=60, what="a pod of the previous release holding the Lease")
    FIGURES["rollback_lease_freed_to_leader_seconds"] = round(time.monotonic() - started, 1)
    assert differences(node, rest, installed.api, world) == []
