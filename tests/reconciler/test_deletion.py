"""Soft delete with retention, recovery, DeletionHeld, credential rotation and shard drain."""

from __future__ import annotations

import time

import kubernetes
import psycopg
import pytest

from domain.constants import (
    ANNOTATION_DELETE_REQUESTED_AT,
    ANNOTATION_PASSWORD_ID,
    ANNOTATION_ROTATE_OVERLAP,
    ANNOTATION_ROTATE_REQUESTED_AT,
    API_VERSION,
)
from domain.naming import alternate_name
from domain.resources import DATABASES, SHARDS
from harness.statement_log import log_text, parse_records
from informers import SECRETS
from tests.reconciler.conftest import (
    NAMESPACE,
    install_config,
    provisioner_statements,
    secret_data,
    tenant_sql,
    wait_events,
    wait_for_later_shard_check,
)
from tests.support.common import condition, wait_for
from tests.support.postgres import tenant_exists


def test_retention_zero_disables_drops_and_removes_everything(postgres, fleet, start_manager, admin_rest):
    fleet.shard(postgres)
    start_manager()
    name = fleet.database(f"gone{postgres.major}")
    tenant = fleet.wait_phase(name, "Ready")["status"]["tenantName"]
    fleet.request_delete(name)
    wait_for(lambda: fleet.get_database(name) is None, timeout=60, what=f"{name} removed")
    assert tenant_exists(postgres, tenant) == (False, False)
    with pytest.raises(kubernetes.client.exceptions.ApiException) as missing:
        admin_rest.get(SECRETS, f"{name}-credentials", NAMESPACE)
    assert missing.value.status == 404
    wait_events(admin_rest, name, {"DeleteRequested", "Disabled", "Dropped"})


def test_retention_window_disables_then_recovery_restores_the_same_credentials(
    postgres, fleet, start_manager, admin_rest
):
    fleet.shard(postgres)
    start_manager(install_config(softDelete={"retention": "1h"}))
    name = fleet.database(f"undo{postgres.major}")
    tenant = fleet.wait_phase(name, "Ready")["status"]["tenantName"]
    creds = secret_data(admin_rest, f"{name}-credentials")
    session = postgres.connect(creds["user"], creds["password"], creds["database"])

    fleet.request_delete(name)
    db = fleet.wait_database(name, lambda d: (c := condition(d, "TenantDisabled")) and c["status"] == "True")
    assert db["status"]["phase"] == "Deleting"
    assert condition(db, "Ready")["reason"] == "Deleting"
    assert db["status"]["dropAfter"]
    # The open session was ended and new logins are refused; nothing is dropped yet.
    with pytest.raises(psycopg.OperationalError):
        session.execute("SELECT 1")
    with pytest.raises(psycopg.OperationalError):
        postgres.connect(creds["user"], creds["password"], creds["database"])
    assert tenant_exists(postgres, tenant) == (True, True)
    first_drop_after = db["status"]["dropAfter"]

    # Recovery: remove the annotation before the drop.
    admin_rest.patch(DATABASES, name, {"metadata": {"annotations": {ANNOTATION_DELETE_REQUESTED_AT: None}}}, NAMESPACE)
    db = fleet.wait_database(
        name, lambda d: d["status"].get("phase") == "Ready" and condition(d, "Ready")["status"] == "True"
    )
    assert condition(db, "TenantDisabled") is None and not db["status"].get("dropAfter")
    assert secret_data(admin_rest, f"{name}-credentials") == creds
    with postgres.connect(creds["user"], creds["password"], creds["database"]) as conn:
        assert conn.execute("SELECT 1").fetchone()[0] == 1

    # Asking again restarts the retention window. Not a wait for "nothing": the stamps have whole
    # seconds, so the second request must fall in a later second to move dropAfter.
    time.sleep(1.1)
    fleet.request_delete(name)
    db = fleet.wait_database(name, lambda d: d["status"].get("phase") == "Deleting" and d["status"].get("dropAfter"))
    assert db["status"]["dropAfter"] > first_drop_after


def test_kubernetes_delete_without_annotation_is_held_without_sql(logged_pg, fleet, start_manager, admin_rest):
    fleet.shard(logged_pg)
    start_manager()
    name = fleet.database("held")
    tenant = fleet.wait_phase(name, "Ready")["status"]["tenantName"]
    before = len(provisioner_statements(logged_pg))
    admin_rest.delete(DATABASES, name, NAMESPACE)  # kubectl delete / a GitOps prune
    db = fleet.wait_database(name, lambda d: (c := condition(d, "DeletionHeld")) and c["status"] == "True")
    assert db["metadata"]["deletionTimestamp"]
    wait_events(admin_rest, name, {"DeletionHeld"})
    # The held pass ended before its Event went out: a Shard health check logged after that shows
    # the statement log has caught up past the pass.
    wait_for_later_shard_check(logged_pg)
    statements = provisioner_statements(logged_pg)[before:]
    assert tenant_sql(statements) == [], statements  # not even a catalog read of the tenant
    assert tenant_exists(logged_pg, tenant) == (True, True)

    # Adding the delete annotation lets the soft delete proceed (retention 0 here).
    fleet.request_delete(name)
    wait_for(lambda: fleet.get_database(name) is None, timeout=60, what="held database released")
    assert tenant_exists(logged_pg, tenant) == (False, False)


def password_id_of(admin_rest, name: str) -> str:
    """The id of the password in the Database's credentials Secret."""
    return admin_rest.get(SECRETS, f"{name}-credentials", NAMESPACE)["metadata"]["annotations"][ANNOTATION_PASSWORD_ID]


def test_deleting_the_credentials_secret_rotates_the_password(postgres, fleet, start_manager, admin_rest):
    fleet.shard(postgres)
    start_manager()
    name = fleet.database(f"rot{postgres.major}")
    fleet.wait_phase(name, "Ready")
    old = secret_data(admin_rest, f"{name}-credentials")
    admin_rest.delete(SECRETS, f"{name}-credentials", NAMESPACE)

    def rotated():
        try:
            new = secret_data(admin_rest, f"{name}-credentials")
        except kubernetes.client.exceptions.ApiException:
            return None
        secret_id = password_id_of(admin_rest, name)
        applied = fleet.get_database(name)["status"].get("passwordApplied")
        if new["password"] == old["password"] or applied != secret_id:
            return None  # the new password is not set on the role yet
        return new

    new = wait_for(rotated, what="a new password")
    with postgres.connect(new["user"], new["password"], new["database"]) as conn:
        assert conn.execute("SELECT 1").fetchone()[0] == 1
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        postgres.connect(old["user"], old["password"], old["database"])


def test_rotation_request_annotation_sets_one_new_password(logged_pg, fleet, start_manager, admin_rest):
    fleet.shard(logged_pg)
    start_manager()
    name = fleet.database("rot-api")
    tenant = fleet.wait_phase(name, "Ready")["status"]["tenantName"]
    old = secret_data(admin_rest, f"{name}-credentials")
    old_id = password_id_of(admin_rest, name)
    assert fleet.get_database(name)["status"]["passwordApplied"] == old_id
    before = len(provisioner_statements(logged_pg))
    stamp = "2026-11-30T10:00:00.000001Z"
    admin_rest.patch(DATABASES, name, {"metadata": {"annotations": {ANNOTATION_ROTATE_REQUESTED_AT: stamp}}}, NAMESPACE)
    db = fleet.wait_database(name, lambda d: d["status"].get("rotationApplied") == stamp)
    new = secret_data(admin_rest, f"{name}-credentials")
    assert new["password"] != old["password"]
    # The new password came with a new id, and the status names it as the one on the role.
    new_id = password_id_of(admin_rest, name)
    assert db["status"]["passwordApplied"] == new_id != old_id
    alters = [s.text for s in provisioner_statements(logged_pg)[before:] if s.text.upper().startswith("ALTER ROLE")]
    assert len(alters) == 1 and tenant in alters[0] and new["password"] not in alters[0]
    with logged_pg.connect(new["user"], new["password"], new["database"]) as conn:
        assert conn.execute("SELECT 1").fetchone()[0] == 1
    assert new["password"] not in log_text(parse_records(logged_pg.statement_log()))


def test_rotation_with_an_overlap_then_soft_delete_and_recovery_reopen_only_the_login_handed_out(
    logged_pg, fleet, start_manager, admin_rest
):
    fleet.shard(logged_pg)
    start_manager(install_config(softDelete={"retention": "1h"}))
    name = fleet.database("rot-overlap")
    tenant = fleet.wait_phase(name, "Ready")["status"]["tenantName"]
    old = secret_data(admin_rest, f"{name}-credentials")
    stamp = "2026-11-30T10:00:00.000002Z"
    annotations = {ANNOTATION_ROTATE_REQUESTED_AT: stamp, ANNOTATION_ROTATE_OVERLAP: "3600"}
    admin_rest.patch(DATABASES, name, {"metadata": {"annotations": annotations}}, NAMESPACE)
    db = fleet.wait_database(name, lambda d: d["status"].get("rotationApplied") == stamp)
    new = secret_data(admin_rest, f"{name}-credentials")
    # The Secret names the alternate with the new password; the status says so and when the old one ends.
    assert (new["user"], new["database"]) == (alternate_name(tenant), tenant) and new["password"] != old["password"]
    assert db["status"]["loginRole"] == new["user"] and db["status"]["retireLoginAt"]
    for creds in (old, new):
        with logged_pg.connect(creds["user"], creds["password"], creds["database"]) as conn:
            assert conn.execute("SELECT current_user").fetchone()[0] == tenant

    fleet.request_delete(name)
    fleet.wait_database(name, lambda d: (c := condition(d, "TenantDisabled")) and c["status"] == "True")
    for creds in (old, new):
        with pytest.raises(psycopg.OperationalError):
            logged_pg.connect(creds["user"], creds["password"], creds["database"])

    admin_rest.patch(DATABASES, name, {"metadata": {"annotations": {ANNOTATION_DELETE_REQUESTED_AT: None}}}, NAMESPACE)
    fleet.wait_database(
        name, lambda d: d["status"].get("phase") == "Ready" and condition(d, "Ready")["status"] == "True"
    )
    with logged_pg.connect(new["user"], new["password"], new["database"]) as conn:
        assert conn.execute("SELECT 1").fetchone()[0] == 1
    with pytest.raises(psycopg.OperationalError):
        logged_pg.connect(old["user"], old["password"], old["database"])
    assert new["password"] not in log_text(parse_records(logged_pg.statement_log()))


def test_missing_shard_blocks_delete_and_draining_keeps_managing(postgres_pool, fleet, start_manager, admin_rest):
    pg = postgres_pool.get("18")
    shard = fleet.shard(pg)
    start_manager()
    kept = fleet.database("drain-kept")
    fleet.wait_phase(kept, "Ready")
    admin_rest.patch(SHARDS, shard, {"spec": {"accepting": False}})
    # Draining: existing databases are still managed, including deletes.
    fleet.request_delete(kept)
    wait_for(lambda: fleet.get_database(kept) is None, timeout=60, what="delete on a draining shard")
    wait_for(lambda: fleet.get_shard(shard)["status"].get("databaseCount") == 0, what="shard emptied")

    other = fleet.shard(pg)
    orphan = fleet.database("orphan")
    assert fleet.wait_phase(orphan, "Ready")["status"]["shard"] == other
    admin_rest.delete(SHARDS, other)
    fleet.request_delete(orphan)
    db = fleet.wait_database(
        orphan, lambda d: d["status"]["phase"] == "Deleting" and condition(d, "Ready")["reason"] == "ShardNotFound"
    )
    assert "neither disabled nor dropped" in condition(db, "Ready")["message"]
    assert db["status"]["phase"] == "Deleting"


def test_held_database_can_be_kept_by_restoring_it_onto_its_tenant(postgres, fleet, start_manager, admin_rest):
    """The other way out of DeletionHeld: keep the data. Release the object, re-create it on its tenant."""
    fleet.shard(postgres)
    start_manager()
    name = fleet.database(f"keep{postgres.major}")
    status = fleet.wait_phase(name, "Ready")["status"]
    creds = secret_data(admin_rest, f"{name}-credentials")
    with postgres.connect(creds["user"], creds["password"], creds["database"]) as conn:
        conn.execute("CREATE TABLE kept (v text)")
        conn.execute("INSERT INTO kept VALUES ('survives')")
        conn.commit()
    admin_rest.delete(DATABASES, name, NAMESPACE)
    fleet.wait_database(name, lambda d: (c := condition(d, "DeletionHeld")) and c["status"] == "True")

    # The documented steps: note shard and tenant, drop the finalizer and the old Secret, re-create.
    admin_rest.patch(DATABASES, name, {"metadata": {"finalizers": None}}, NAMESPACE)
    wait_for(lambda: fleet.get_database(name) is None, what="released object")
    admin_rest.delete(SECRETS, f"{name}-credentials", NAMESPACE)
    fleet.restore(name, "rectest-consumer", f"keep{postgres.major}", status["shard"], status["tenantName"])
    restored = fleet.wait_phase(name, "Ready")["status"]
    assert (restored["shard"], restored["tenantName"]) == (status["shard"], status["tenantName"])
    new = secret_data(admin_rest, f"{name}-credentials")
    assert new["password"] != creds["password"]  # a new Secret, a new password on the same role
    with postgres.connect(new["user"], new["password"], new["database"]) as conn:
        assert conn.execute("SELECT v FROM kept").fetchone()[0] == "survives"


def test_short_retention_drops_after_the_window_even_across_a_restart(postgres_pool, fleet, start_manager):
    pg = postgres_pool.get("18")
    fleet.shard(pg)
    config = install_config(softDelete={"retention": "4s"})
    manager = start_manager(config)
    name = fleet.database("window")
    tenant = fleet.wait_phase(name, "Ready")["status"]["tenantName"]
    fleet.request_delete(name)
    db = fleet.wait_database(name, lambda d: (c := condition(d, "TenantDisabled")) and c["status"] == "True")
    assert tenant_exists(pg, tenant) == (True, True)  # disabled, not dropped: the window is open
    # The leader goes away between disable and drop; the next one picks up where it stopped.
    manager.stop()
    start_manager(config)
    wait_for(lambda: fleet.get_database(name) is None, timeout=60, what="dropped after the window")
    assert tenant_exists(pg, tenant) == (False, False)
    assert db["status"]["dropAfter"]


def test_emptied_drained_shard_may_be_deleted_under_deletion_protection(
    kube, postgres_pool, fleet, start_manager, admin_rest, installed
):
    """With deletion protection on, the policy refuses the delete until the last database is gone."""
    from infra.render import render_manifests
    from tests.support.kubeapi import KubeApi

    policy_objects = [
        m
        for m in render_manifests(install_config(deletionProtection={"enabled": True}))
        if m["kind"].startswith("ValidatingAdmissionPolicy")
    ]
    api = KubeApi(kube.admin_client())
    for obj in policy_objects:
        api.apply(obj)
    operator = "rectest-operator"
    rbac = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": operator},
            "rules": [{"apiGroups": ["db.bnerd.com"], "resources": ["shards"], "verbs": ["get", "delete"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": operator},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": operator},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": operator}],
        },
    ]
    for obj in rbac:
        api.apply(obj)
    try:
        pg = postgres_pool.get("16")
        shard = fleet.shard(pg)
        start_manager()
        name = fleet.database("last-one")
        fleet.wait_phase(name, "Ready")
        wait_for(lambda: fleet.get_shard(shard)["status"].get("databaseCount") == 1, what="count 1")
        admin_rest.patch(SHARDS, shard, {"spec": {"accepting": False}})
        as_operator = KubeApi(kube.client_as(operator))
        shard_ref = {"apiVersion": API_VERSION, "kind": "Shard", "metadata": {"name": shard}}
        # A new policy takes a moment to be enforced: probe with dry-run deletes until it refuses.
        wait_for(lambda: as_operator.delete(shard_ref, dry_run=True).status in (403, 422), what="policy active")
        refused = as_operator.delete({"apiVersion": API_VERSION, "kind": "Shard", "metadata": {"name": shard}})
        assert refused.status in (403, 422), refused.message
        fleet.request_delete(name)
        wait_for(lambda: fleet.get_database(name) is None, timeout=60, what="last database gone")
        wait_for(lambda: fleet.get_shard(shard)["status"].get("databaseCount") == 0, what="count 0")
        allowed = as_operator.delete({"apiVersion": API_VERSION, "kind": "Shard", "metadata": {"name": shard}})
        assert allowed.status == 200, allowed.message
    finally:
        for obj in reversed(policy_objects + rbac):
            api.delete(obj)
