"""The rendered install on a real kube-apiserver: CRD schemas and CEL, printer columns, the deletion
protection policy and RBAC are proven by Kubernetes itself, not by reading YAML."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client import ApiClient

from domain.constants import API_VERSION, FINALIZER_SHARD_DATABASES, VERSION
from domain.specs import SHARD_CEL_RULES
from domain.status import Condition, DatabaseStatus
from infra.render import dump_yaml
from tests.generator.conftest import (
    BREAK_GLASS_GROUP,
    OTHER_NS,
    RELEASE_NAMESPACE,
    SHARD_NS_A,
    SHARD_NS_B,
    Installed,
)
from tests.support.common import now_stamp, wait_for
from tests.support.kubeapi import TABLE_ACCEPT, KubeApi
from tests.vectors import objects as vectors
from tests.vectors.hosts import HOST_VECTORS
from tests.vectors.objects import with_changes

SERVICE_ACCOUNT = "gentest"
SA_USER = f"system:serviceaccount:{RELEASE_NAMESPACE}:{SERVICE_ACCOUNT}"
SA_GROUPS = ["system:serviceaccounts", f"system:serviceaccounts:{RELEASE_NAMESPACE}", "system:authenticated"]


def shard(name: str, **changes: Any) -> dict[str, Any]:
    """A valid postgres Shard (the documented example) whose admin Secret is listed, with `a__b=value` changes."""
    listed = {"namespace": SHARD_NS_A, "name": "pg-a-provisioner"}
    return vectors.shard(name, **{"admin__secretRef": listed, **changes})


def cloudberry_shard(name: str, **changes: Any) -> dict[str, Any]:
    listed = {"namespace": RELEASE_NAMESPACE, "name": "local-provisioner"}
    return vectors.shard(name, vectors.CLOUDBERRY_SPEC, **{"admin__secretRef": listed, **changes})


def consumer(name: str, **changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "tokenSecretRef": {"namespace": RELEASE_NAMESPACE, "name": f"{name}-token"},
        "maxDatabases": 50,
    }
    spec = with_changes(spec, **changes)
    return {"apiVersion": API_VERSION, "kind": "Consumer", "metadata": {"name": name}, "spec": spec}


def database(name: str, **changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"consumer": "gentest-consumer-a", "externalId": "orders"}
    return {
        "apiVersion": API_VERSION,
        "kind": "Database",
        "metadata": {"name": name, "namespace": RELEASE_NAMESPACE},
        "spec": with_changes(spec, **changes),
    }


@pytest.fixture
def cleanup(installed: Installed) -> Any:
    """Objects registered here are deleted (as admin, a break-glass member) after the test."""
    objects: list[dict[str, Any]] = []
    yield objects.append
    for obj in objects:
        installed.admin.delete(obj)


# --- applying -------------------------------------------------------------------------------------------


def test_every_manifest_is_applied_and_a_second_apply_changes_nothing(installed: Installed) -> None:
    api = installed.admin
    kinds = {m["kind"] for m in installed.manifests}
    assert {"CustomResourceDefinition", "ValidatingAdmissionPolicy", "Deployment", "PrometheusRule"} <= kinds
    versions = {}
    for obj in installed.manifests:
        got = api.get(obj)
        assert got.status == 200, (obj["kind"], obj["metadata"]["name"], got.message)
        managers = {f["manager"] for f in got.body["metadata"].get("managedFields", [])}
        assert "dbprovider" in managers
        versions[api.object_path(obj)] = got.body["metadata"]["resourceVersion"]
    for obj in installed.manifests:
        again = api.apply(obj)
        assert again["metadata"]["resourceVersion"] == versions[api.object_path(obj)], (
            f"re-applying {obj['kind']} {obj['metadata']['name']} changed it: the manifest is not what the "
            "apiserver stores"
        )


def test_service_monitor_and_rule_are_stored_whole_under_the_prometheus_operator_schemas(
    installed: Installed,
) -> None:
    """Applied against the operator's own CRDs (v0.85.0): nothing we render is pruned or refused."""
    for kind in ("ServiceMonitor", "PrometheusRule"):
        (manifest,) = [m for m in installed.manifests if m["kind"] == kind]
        stored = installed.admin.get(manifest).body
        assert stored["spec"] == manifest["spec"], kind
        assert manifest["metadata"]["labels"].items() <= stored["metadata"]["labels"].items(), kind
        assert stored["metadata"]["annotations"]["example.com/owner"] == "team-db", kind
    (monitor,) = [m for m in installed.manifests if m["kind"] == "ServiceMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert (monitor["spec"]["endpoints"][0]["interval"], monitor["spec"]["endpoints"][0]["scrapeTimeout"]) == (
        "1m30s",
        "20s",
    )
    # The real schema does judge: an interval that is no Prometheus duration is refused.
    broken = {**monitor, "metadata": {**monitor["metadata"], "name": "gentest-broken"}}
    broken["spec"] = {**monitor["spec"], "endpoints": [{**monitor["spec"]["endpoints"][0], "interval": "often"}]}
    assert installed.admin.create(broken, dry_run=True).status == 422


def test_crds_are_established_with_names_scopes_and_status_subresources(installed: Installed) -> None:
    expected = {
        "shards.db.bnerd.com": ("Cluster", ["sh"]),
        "consumers.db.bnerd.com": ("Cluster", ["cons"]),
        "databases.db.bnerd.com": ("Namespaced", ["db"]),
        "databasemoves.db.bnerd.com": ("Namespaced", ["dbmove"]),
    }
    for name, (scope, short_names) in expected.items():
        crd = installed.admin.ok("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        assert crd["spec"]["scope"] == scope
        assert crd["spec"]["names"]["shortNames"] == short_names
        assert "dbc" not in crd["spec"]["names"]["shortNames"]  # Keldon's
        versions = crd["spec"]["versions"]
        assert [(v["name"], v["served"], v["storage"]) for v in versions] == [
            ("v1alpha1", True, True),
            ("v1beta1", True, False),
        ]
        assert crd["spec"]["conversion"] == {"strategy": "None"}
        for version in versions:  # one schema for both: the apiserver rewrites apiVersion and nothing else
            assert version["subresources"] == {"status": {}}
            assert version["schema"] == versions[0]["schema"]
            assert version["additionalPrinterColumns"] == versions[0]["additionalPrinterColumns"]
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions["Established"] == "True"
        assert conditions["NamesAccepted"] == "True"
        assert conditions.get("NonStructuralSchema", "False") == "False"


def test_openapi_published_for_kubectl_explain_carries_descriptions(installed: Installed) -> None:
    api = installed.admin
    # The apiserver publishes CRD schemas asynchronously.
    response = wait_for(
        lambda: (r := api.request("GET", f"/openapi/v3/apis/{API_VERSION}")).status == 200 and r,
        what="the published OpenAPI v3 document",
    )
    schemas = response.body["components"]["schemas"]
    (shard_key,) = [k for k in schemas if k.endswith(f".{VERSION}.Shard")]
    spec = schemas[shard_key]["properties"]["spec"]
    assert "placement never goes over it" in spec["properties"]["maxDatabases"]["description"]
    host = spec["properties"]["client"]["properties"]["host"]
    assert "IPv4" in host["description"]


# --- valid objects and defaults --------------------------------------------------------------------------


def test_valid_objects_are_accepted_and_defaulted(installed: Installed, cleanup: Any) -> None:
    api = installed.admin
    objects = [
        shard("gentest-valid-pg"),
        cloudberry_shard("gentest-valid-cb"),
        consumer("gentest-consumer-a"),
        consumer("gentest-consumer-unlimited", maxDatabases=None, disabled=True),
        database("gentest-valid-db", sizeClass="small"),
    ]
    created = {}
    for obj in objects:
        response = api.create(obj)
        assert response.status == 201, (obj["metadata"]["name"], response.message)
        cleanup(obj)
        created[obj["metadata"]["name"]] = response.body["spec"]

    pg = created["gentest-valid-pg"]
    assert pg["engine"] == "postgres" and pg["accepting"] is True
    assert pg["admin"]["port"] == 5432 and pg["admin"]["sslmode"] == "require"
    assert pg["admin"]["secretRef"]["userKey"] == "user"
    assert pg["admin"]["secretRef"]["passwordKey"] == "password"
    assert pg["client"] == {"host": "192.0.2.200", "port": 5432, "sslmode": "require"}
    assert "serviceName" not in created["gentest-valid-cb"]["admin"]
    assert created["gentest-consumer-a"]["disabled"] is False
    assert created["gentest-consumer-a"]["tokenSecretRef"]["key"] == "sha256"
    assert "maxDatabases" not in created["gentest-consumer-unlimited"]
    assert created["gentest-valid-db"]["engine"] == "postgres"


def test_client_host_rule_of_the_crd_matches_the_domain_vectors(installed: Installed) -> None:
    """Each HOST_VECTORS entry as client.host of a dry-run create: the CRD decides like the domain model."""
    api = installed.admin

    def verdict(index: int, host: str) -> tuple[int, str]:
        response = api.create(shard(f"gentest-host-{index}", client__host=host), dry_run=True)
        return response.status, response.message

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda item: verdict(*item), enumerate(h for h, _, _ in HOST_VECTORS)))
    wrong = []
    for (host, valid, why), (status, message) in zip(HOST_VECTORS, results, strict=True):
        if valid and status != 201:
            wrong.append(f"{host!r} ({why}) should be accepted, got {status}: {message[:200]}")
        if not valid and status != 422:
            wrong.append(f"{host!r} ({why}) should be rejected with 422, got {status}")
    assert not wrong, "\n".join(wrong)
    assert sum(1 for _, valid, _ in HOST_VECTORS if not valid) > 10


# The messages of the Shard's CEL rules (domain.specs): what the apiserver answers when one is broken.
(_, POSTGRES_REFS), (_, CLOUDBERRY_REFS), (_, POSTGRES_SERVICE) = SHARD_CEL_RULES

INVALID_CASES = [
    pytest.param(shard("gentest-bad", admin__sslmode="required"), "spec.admin.sslmode", id="admin-sslmode"),
    pytest.param(shard("gentest-bad", client__sslmode="verify_full"), "spec.client.sslmode", id="client-sslmode"),
    pytest.param(shard("gentest-bad", maxDatabases=0), "spec.maxDatabases", id="max-databases-0"),
    pytest.param(shard("gentest-bad", maxDatabases=None), "spec.maxDatabases", id="max-databases-missing"),
    pytest.param(shard("gentest-bad", engine="mysql"), "spec.engine", id="unknown-engine"),
    pytest.param(
        shard("gentest-bad", keldonCluster={"namespace": "a", "name": "b"}),
        POSTGRES_REFS,
        id="postgres-with-keldon-ref",
    ),
    pytest.param(shard("gentest-bad", perconaCluster=None), POSTGRES_REFS, id="postgres-without-percona-ref"),
    pytest.param(shard("gentest-bad", admin__serviceName=None), POSTGRES_SERVICE, id="postgres-without-admin-service"),
    pytest.param(
        cloudberry_shard("gentest-bad", keldonCluster=None), CLOUDBERRY_REFS, id="cloudberry-without-keldon-ref"
    ),
    pytest.param(
        cloudberry_shard("gentest-bad", perconaCluster={"namespace": "a", "name": "b"}),
        CLOUDBERRY_REFS,
        id="cloudberry-with-percona-ref",
    ),
    pytest.param(shard("gentest-bad", client__port=0), "spec.client.port", id="client-port-0"),
    pytest.param(shard("gentest-bad", client__host="2001:db8::1"), "spec.client.host", id="ipv6-host"),
    pytest.param(consumer("gentest-bad", maxDatabases=-1), "spec.maxDatabases", id="consumer-negative-quota"),
    pytest.param(consumer("gentest-bad", tokenSecretRef=None), "spec.tokenSecretRef", id="consumer-without-ref"),
    pytest.param(database("gentest-bad", externalId="Not_A_Label"), "spec.externalId", id="db-external-id"),
    pytest.param(database("gentest-bad", engine="oracle"), "spec.engine", id="db-engine"),
]


@pytest.mark.parametrize(("obj", "message"), INVALID_CASES)
def test_invalid_objects_are_rejected_by_the_crd(installed: Installed, obj: dict[str, Any], message: str) -> None:
    response = installed.admin.create(obj, dry_run=True)
    assert response.status == 422, response.message
    assert message in response.message


@pytest.mark.parametrize(
    ("field", "value"),
    [("consumer", "gentest-consumer-b"), ("externalId", "invoices"), ("engine", "cloudberry")],
)
def test_database_identity_fields_are_immutable(installed: Installed, cleanup: Any, field: str, value: str) -> None:
    api = installed.admin
    obj = database(f"gentest-immutable-{field.lower()}")
    assert api.create(obj).status == 201
    cleanup(obj)
    response = api.merge_patch(obj, {"spec": {field: value}})
    assert response.status == 422, response.message
    assert f"spec.{field}" in response.message and "is immutable" in response.message
    # The size class is an operator's knob and stays mutable.
    assert api.merge_patch(obj, {"spec": {"sizeClass": "large"}}).status == 200


def test_shard_engine_is_immutable(installed: Installed, cleanup: Any) -> None:
    api = installed.admin
    obj = cloudberry_shard("gentest-immutable-engine")
    assert api.create(obj).status == 201
    cleanup(obj)
    response = api.merge_patch(
        obj,
        {
            "spec": {
                "engine": "postgres",
                "keldonCluster": None,
                "perconaCluster": {"namespace": "a", "name": "b"},
                "admin": {"serviceName": "pg"},
            }
        },
    )
    assert response.status == 422
    assert "spec.engine" in response.message and "is immutable" in response.message


def test_status_subresource_keeps_every_domain_status_field(installed: Installed, cleanup: Any) -> None:
    """What the reconciler writes (domain.status) survives the status schema without pruning."""
    api = installed.admin
    obj = database("gentest-status")
    assert api.create(obj).status == 201
    cleanup(obj)
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    status = DatabaseStatus(
        observed_generation=1,
        phase="Deleting",
        shard="shard01",
        tenant_name="t_orders_0123456789",
        applied_size_class="small",
        applied_connection_limit=5,
        drop_after=now,
        conditions=(
            Condition(type="Ready", status="False", last_transition_time=now, reason="Deleting", message="m"),
            Condition(
                type="TenantDisabled",
                status="True",
                last_transition_time=now,
                reason="Disabled",
                message="",
                observed_generation=1,
            ),
        ),
    ).model_dump(by_alias=True, exclude_none=True, mode="json")
    response = api.merge_patch(obj, {"status": status}, subresource="status")
    assert response.status == 200, response.message
    assert (
        DatabaseStatus.model_validate(response.body["status"]).model_dump()
        == DatabaseStatus.model_validate(status).model_dump()
    )
    # Status is not writable through the main resource, and a bad phase is refused.
    assert api.merge_patch(obj, {"status": {"phase": "Gone"}}, subresource="status").status == 422


# --- printer columns -------------------------------------------------------------------------------------


def _table(api: KubeApi, path: str) -> tuple[list[str], list[list[Any]]]:
    """The columns `kubectl get` shows without -o wide (priority 0) and the row cells under them."""
    table = api.ok("GET", path, accept=TABLE_ACCEPT)
    shown = [i for i, c in enumerate(table["columnDefinitions"]) if c.get("priority", 0) == 0]
    names = [table["columnDefinitions"][i]["name"] for i in shown]
    return names, [[row["cells"][i] for i in shown] for row in table["rows"]]


def test_printer_columns_show_what_the_seed_promises(installed: Installed, cleanup: Any) -> None:
    api = installed.admin
    sh = shard("gentest-columns", maxDatabases=150, accepting=False)
    co = consumer("gentest-columns-consumer", disabled=True, maxDatabases=7)
    db = database("gentest-columns-db", consumer="gentest-columns-consumer", externalId="crm")
    for obj in (sh, co, db):
        assert api.create(obj).status == 201
        cleanup(obj)
    now = now_stamp()
    ready = {"type": "Ready", "status": "True", "reason": "Ok", "message": "", "lastTransitionTime": now}
    shard_status = {
        "databaseCount": 12,
        "connectionsCommitted": 95,
        "connectionBudget": 180,
        "databasesAvailable": 8,
        "conditions": [ready],
    }
    assert api.merge_patch(sh, {"status": shard_status}, "status").status == 200
    assert api.merge_patch(co, {"status": {"databaseCount": 3}}, "status").status == 200
    assert api.merge_patch(db, {"status": {"phase": "Ready", "shard": "gentest-columns"}}, "status").status == 200

    names, rows = _table(api, api.object_path(sh))
    assert names[:9] == ["Name", "Accepting", "Databases", "Max", "Connections", "Budget", "Free", "Ready", "Age"]
    assert rows[0][:8] == ["gentest-columns", False, 12, 150, 95, 180, 8, "True"]

    names, rows = _table(api, api.object_path(co))
    assert names[:4] == ["Name", "Disabled", "Databases", "Max"]
    assert rows[0][:4] == ["gentest-columns-consumer", True, 3, 7]

    names, rows = _table(api, api.object_path(db))
    assert names[:4] == ["Name", "Phase", "Shard", "Consumer"]
    assert rows[0][:4] == ["gentest-columns-db", "Ready", "gentest-columns", "gentest-columns-consumer"]


def database_move(name: str, **changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"database": "gentest-orders", "target": "gentest-shard-b"}
    return {
        "apiVersion": API_VERSION,
        "kind": "DatabaseMove",
        "metadata": {"name": name, "namespace": RELEASE_NAMESPACE},
        "spec": with_changes(spec, **changes),
    }


def test_a_database_move_is_followed_with_kubectl_get(installed: Installed, cleanup: Any) -> None:
    api = installed.admin
    move = database_move("gentest-move-columns")
    created = api.create(move)
    assert created.status == 201, created.message
    cleanup(move)
    assert created.body["spec"] == {
        "database": "gentest-orders",
        "target": "gentest-shard-b",
        "mode": "Auto",
        "force": False,
        "abort": False,
        "rollback": False,
    }
    now = now_stamp()
    refused = {
        "type": "Ready",
        "status": "False",
        "reason": "PreflightFailed",
        "message": "shard gentest-shard-b: wal_level is replica",
        "lastTransitionTime": now,
    }
    status = {
        "phase": "Failed",
        "sourceShard": "gentest-shard-a",
        "targetShard": "gentest-shard-b",
        "mode": "Offline",
        "writePauseSeconds": 0.0,
        "startedAt": now,
        "sourceBytes": 3 << 20,
        "targetBytes": 1 << 20,
        "progress": "1 MiB of 3 MiB",
        "completedAt": now,
        "conditions": [refused],
    }
    patched = api.merge_patch(move, {"status": status}, "status")
    assert patched.status == 200, patched.message
    assert patched.body["status"] == status
    names, rows = _table(api, api.object_path(move))
    assert names == ["Name", "Database", "From", "To", "Mode", "Phase", "Progress", "Pause", "Reason", "Age"]
    assert rows[0][:9] == [
        "gentest-move-columns",
        "gentest-orders",
        "gentest-shard-a",
        "gentest-shard-b",
        "Offline",
        "Failed",
        "1 MiB of 3 MiB",
        0,
        "PreflightFailed",
    ]
    assert api.merge_patch(move, {"status": {"phase": "Teleporting"}}, "status").status == 422
    assert api.merge_patch(move, {"status": {"targetBytes": -1}}, "status").status == 422


@pytest.mark.parametrize(("field", "value"), [("database", "gentest-other"), ("target", "any")])
def test_a_moves_database_and_target_are_immutable(installed: Installed, cleanup: Any, field: str, value: str) -> None:
    api = installed.admin
    move = database_move(f"gentest-move-immutable-{field}")
    assert api.create(move).status == 201
    cleanup(move)
    response = api.merge_patch(move, {"spec": {field: value}})
    assert response.status == 422, response.message
    assert f"spec.{field}" in response.message and "is immutable" in response.message
    assert api.merge_patch(move, {"spec": {"abort": True}}).status == 200


def test_a_move_in_an_unknown_mode_is_refused(installed: Installed) -> None:
    assert installed.admin.create(database_move("gentest-move-mode", mode="Teleport")).status == 422


# --- deletion protection ---------------------------------------------------------------------------------


@pytest.fixture
def shard_deleters(kube: Any, installed: Installed) -> Any:
    """RBAC letting two groups delete shards: admins (no break-glass) and the break-glass group."""
    api = installed.admin
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "gentest-shard-deleter"},
        "rules": [
            {"apiGroups": ["db.bnerd.com"], "resources": ["shards"], "verbs": ["get", "list", "delete", "patch"]}
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "gentest-shard-deleter"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gentest-shard-deleter"},
        "subjects": [
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "gentest:admins"},
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": BREAK_GLASS_GROUP},
        ],
    }
    api.apply(role)
    api.apply(binding)
    with (
        kube.client_as("gentest-alice", ("gentest:admins",)) as alice,
        kube.client_as("gentest-bob", (BREAK_GLASS_GROUP,)) as bob,
    ):
        yield KubeApi(alice), KubeApi(bob)
    api.delete(binding)
    api.delete(role)


def test_deleting_a_shard_with_databases_is_refused_except_for_break_glass(
    installed: Installed, cleanup: Any, shard_deleters: tuple[KubeApi, KubeApi]
) -> None:
    api = installed.admin
    alice, bob = shard_deleters
    busy, empty = shard("gentest-protected"), shard("gentest-empty")
    for obj in (busy, empty):
        assert api.create(obj).status == 201
        cleanup(obj)
    assert api.merge_patch(busy, {"status": {"databaseCount": 3}}, "status").status == 200
    assert api.merge_patch(empty, {"status": {"databaseCount": 0}}, "status").status == 200

    # The policy takes effect once the apiserver has loaded it; probe with dry runs until it does.
    refused = wait_for(lambda: (r := alice.delete(busy, dry_run=True)).status == 403 and r, what="the deletion policy")
    assert "still has 3 database(s)" in refused.message
    assert "ValidatingAdmissionPolicy" in refused.message

    response = alice.delete(busy)
    assert response.status == 403
    assert api.get(busy).status == 200

    # A shard without databases may be deleted by anyone RBAC allows.
    assert alice.delete(empty).status == 200

    # The break-glass group passes.
    assert bob.delete(busy).status == 200
    wait_for(lambda: api.get(busy).status == 404, what="the shard to be gone")


def test_only_the_provider_removes_the_shard_finalizer(
    kube: Any, installed: Installed, cleanup: Any, shard_deleters: tuple[KubeApi, KubeApi]
) -> None:
    """A Shard writer who could delete a Shard whose status lies cannot take its finalizer off either."""
    api = installed.admin
    alice, bob = shard_deleters
    held, other = shard("gentest-finalized"), shard("gentest-finalized-2")
    for obj in (held, other):
        obj["metadata"]["finalizers"] = [FINALIZER_SHARD_DATABASES]
        assert api.create(obj).status == 201
        cleanup(obj)
    assert api.merge_patch(held, {"status": {"databaseCount": 1}}, "status").status == 200
    wait_for(lambda: alice.delete(held, dry_run=True).status == 403, what="the deletion policy")

    removal = {"metadata": {"finalizers": None}}
    refused = alice.merge_patch(held, removal)
    assert refused.status == 403 and "only the provider removes the finalizer" in refused.message
    assert alice.merge_patch(held, {"metadata": {"labels": {"team": "a"}}}).status == 200  # other changes pass
    with kube.client_as(SA_USER, tuple(SA_GROUPS)) as provider:
        assert KubeApi(provider).merge_patch(held, removal).status == 200
    assert bob.merge_patch(other, removal).status == 200  # the break-glass group too


def test_deletion_protection_can_be_disabled() -> None:
    from infra.render import render_manifests
    from tests.generator.conftest import make_config

    kinds = {m["kind"] for m in render_manifests(make_config(deletionProtection={"enabled": False}))}
    assert "ValidatingAdmissionPolicy" not in kinds and "ValidatingAdmissionPolicyBinding" not in kinds


# --- RBAC ------------------------------------------------------------------------------------------------


def _allowed(api: KubeApi, attributes: dict[str, str]) -> bool:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": SA_USER, "groups": SA_GROUPS, "resourceAttributes": attributes},
    }
    result = api.ok("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    return bool(result["status"].get("allowed"))


def _secret(namespace: str, verb: str, name: str = "") -> dict[str, str]:
    attributes = {"namespace": namespace, "verb": verb, "resource": "secrets", "version": "v1"}
    if name:
        attributes["name"] = name
    return attributes


ALLOWED = [
    # The shardSecrets names, and nothing else, outside the release namespace.
    _secret(SHARD_NS_A, "get", "pg-a-provisioner"),
    _secret(SHARD_NS_A, "get", "pg-a2-provisioner"),
    _secret(SHARD_NS_B, "get", "pg-b-provisioner"),
    # The release namespace: credentials and token-hash Secrets.
    *[_secret(RELEASE_NAMESPACE, verb) for verb in ("get", "list", "watch", "create", "update", "patch", "delete")],
    {"namespace": RELEASE_NAMESPACE, "verb": "create", "group": "db.bnerd.com", "resource": "databases"},
    {"namespace": RELEASE_NAMESPACE, "verb": "watch", "group": "db.bnerd.com", "resource": "databases"},
    {
        "namespace": RELEASE_NAMESPACE,
        "verb": "patch",
        "group": "db.bnerd.com",
        "resource": "databases",
        "subresource": "status",
    },
    {
        "namespace": RELEASE_NAMESPACE,
        "verb": "update",
        "group": "db.bnerd.com",
        "resource": "databases",
        "subresource": "finalizers",
    },
    {"verb": "watch", "group": "db.bnerd.com", "resource": "shards"},
    {"verb": "list", "group": "db.bnerd.com", "resource": "consumers"},
    {"verb": "patch", "group": "db.bnerd.com", "resource": "shards", "subresource": "status"},
    # The Shard finalizer (metadata only, though RBAC cannot say so; the admission policy keeps others from
    # removing it).
    {"verb": "patch", "group": "db.bnerd.com", "resource": "shards"},
    {"verb": "update", "group": "db.bnerd.com", "resource": "shards", "subresource": "finalizers"},
    {"verb": "update", "group": "db.bnerd.com", "resource": "consumers", "subresource": "status"},
    {"namespace": RELEASE_NAMESPACE, "verb": "create", "resource": "events"},
    {"namespace": RELEASE_NAMESPACE, "verb": "create", "group": "events.k8s.io", "resource": "events"},
    {"namespace": RELEASE_NAMESPACE, "verb": "update", "group": "coordination.k8s.io", "resource": "leases"},
    {"namespace": "analytics", "verb": "watch", "group": "keldon.io", "resource": "databaseclusters"},
    # The consumers' quota ledgers: read and written by name, with a resourceVersion precondition.
    *[{"namespace": RELEASE_NAMESPACE, "verb": verb, "resource": "configmaps"} for verb in ("get", "create", "patch")],
    # Its own Pod, read once at start (how the previous container ended).
    {"namespace": RELEASE_NAMESPACE, "verb": "get", "resource": "pods"},
]
DENIED = [
    # Other Secrets outside the release namespace: no get, list or watch, even in the shard namespaces.
    _secret(SHARD_NS_A, "get", "pg-b-provisioner"),
    _secret(SHARD_NS_A, "get", "other"),
    _secret(SHARD_NS_B, "get", "pg-a-provisioner"),
    *[_secret(ns, verb) for ns in (SHARD_NS_A, SHARD_NS_B) for verb in ("list", "watch")],
    *[_secret(ns, verb, "pg-a-provisioner") for ns in (SHARD_NS_A,) for verb in ("watch", "update", "delete")],
    *[_secret(OTHER_NS, verb) for verb in ("get", "list", "watch")],
    _secret(OTHER_NS, "get", "pg-a-provisioner"),
    _secret("kube-system", "get", "pg-a-provisioner"),
    *[_secret("", verb) for verb in ("get", "list", "watch")],  # cluster-wide
    # Specs of Git-managed objects are read-only; Databases exist in the release namespace only.
    {"verb": "update", "group": "db.bnerd.com", "resource": "shards"},
    {"verb": "delete", "group": "db.bnerd.com", "resource": "consumers"},
    {"namespace": OTHER_NS, "verb": "create", "group": "db.bnerd.com", "resource": "databases"},
    {"verb": "list", "group": "db.bnerd.com", "resource": "databases"},  # all namespaces
    {"namespace": OTHER_NS, "verb": "update", "group": "coordination.k8s.io", "resource": "leases"},
    {"namespace": "analytics", "verb": "update", "group": "keldon.io", "resource": "databaseclusters"},
    {"namespace": OTHER_NS, "verb": "list", "resource": "configmaps"},
    # No other ConfigMap of the release namespace is listed, watched or changed beyond the ledgers' writes.
    *[{"namespace": RELEASE_NAMESPACE, "verb": verb, "resource": "configmaps"} for verb in ("list", "watch", "delete")],
    {"namespace": OTHER_NS, "verb": "get", "resource": "configmaps"},
    # Pods: read by name in the release namespace only, never listed, watched or changed.
    *[{"namespace": RELEASE_NAMESPACE, "verb": verb, "resource": "pods"} for verb in ("list", "watch", "delete")],
    {"namespace": OTHER_NS, "verb": "get", "resource": "pods"},
]


def _ids(cases: list[dict[str, str]]) -> list[str]:
    return [
        "-".join(
            filter(
                None, (c.get("verb"), c.get("resource"), c.get("subresource"), c.get("namespace") or "*", c.get("name"))
            )
        )
        for c in cases
    ]


@pytest.mark.parametrize("attributes", ALLOWED, ids=_ids(ALLOWED))
def test_service_account_may(installed: Installed, attributes: dict[str, str]) -> None:
    assert _allowed(installed.admin, attributes)


@pytest.mark.parametrize("attributes", DENIED, ids=_ids(DENIED))
def test_service_account_may_not(installed: Installed, attributes: dict[str, str]) -> None:
    assert not _allowed(installed.admin, attributes)


def test_service_account_token_reads_listed_shard_secret_and_nothing_else(installed: Installed, kube: Any) -> None:
    api = installed.admin
    for namespace, name in ((SHARD_NS_A, "pg-a-provisioner"), (SHARD_NS_A, "unlisted")):
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "stringData": {"user": "provisioner", "password": "x"},
        }
        api.apply(secret)
    client: ApiClient = kube.service_account_client(RELEASE_NAMESPACE, SERVICE_ACCOUNT)
    with client:
        sa = KubeApi(client)
        got = sa.request("GET", f"/api/v1/namespaces/{SHARD_NS_A}/secrets/pg-a-provisioner")
        assert got.status == 200, got.message
        assert sa.request("GET", f"/api/v1/namespaces/{SHARD_NS_A}/secrets/unlisted").status == 403
        assert sa.request("GET", f"/api/v1/namespaces/{SHARD_NS_A}/secrets").status == 403
        assert sa.request("GET", f"/apis/{API_VERSION}/shards").status == 200


def test_dump_of_the_installed_objects_is_stable(installed: Installed) -> None:
    """The YAML written for a landscape repo parses back to the very objects applied here."""
    import yaml

    assert list(yaml.safe_load_all(dump_yaml(installed.manifests))) == installed.manifests
