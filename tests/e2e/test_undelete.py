"""A consumer undoes its own delete (softDelete.allowUndelete) through two `dbprovider manager` replicas on
the real apiserver and PostgreSQL: the same tenant comes back with its password and its data, a PUT of the
same id is refused until then, and the refusals (missing, too late, over a lowered quota) are clear.
The refusal of an install that does not allow it is in tests/api (the default config)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from dbprovider.devstack import DevStack
from domain.constants import ANNOTATION_DELETE_REQUESTED_AT
from domain.naming import database_object_name
from domain.resources import CONSUMERS, DATABASES
from domain.timefmt import format_micro_time
from harness import KubeControlPlane, PostgresServer
from informers import Rest
from tests.support.common import unique, wait_for
from tests.support.devstack import install_stack, remove_stack
from tests.support.replica import ManagerReplica

RETENTION = timedelta(hours=1)


@pytest.fixture(scope="module")
def stack(kube: KubeControlPlane, postgres_pool: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    postgres: PostgresServer = postgres_pool.get("18")
    created = install_stack(
        kube,
        postgres,
        tmp_path_factory.mktemp("undelete"),
        unique("undel"),
        softDelete={"retention": "1h", "allowUndelete": True},
    )
    yield created
    remove_stack(kube, created)


@pytest.fixture(scope="module")
def replicas(stack: DevStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ManagerReplica, ...]]:
    log_dir = tmp_path_factory.mktemp("undelete-replicas")
    started = (ManagerReplica(stack, "undelete-a", log_dir), ManagerReplica(stack, "undelete-b", log_dir))
    try:
        for replica in started:
            replica.wait_ready()
        yield started
    finally:
        for replica in started:
            replica.kill()


def ready(replica: ManagerReplica, external_id: str, token: str | None = None) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        view: dict[str, Any] = replica.call("GET", f"/v1/databases/{external_id}", token=token).json()
        return view if view.get("phase") == "Ready" else None

    return wait_for(check, 90, f"{external_id} Ready", max_interval=0.5)


def logs_in(uri: str) -> bool:
    try:
        with psycopg.connect(uri, connect_timeout=5):
            return True
    except psycopg.OperationalError:
        return False


def test_an_undelete_brings_back_the_same_tenant_with_its_data(replicas: tuple[ManagerReplica, ...]) -> None:
    a, b = replicas
    assert a.call("PUT", "/v1/databases/orders", json={"sizeClass": "small"}).status_code == 201
    ready(b, "orders")
    before = a.call("GET", "/v1/databases/orders/credentials").json()
    with psycopg.connect(before["uri"]) as conn:
        conn.execute("CREATE TABLE kept (note text)")
        conn.execute("INSERT INTO kept VALUES ('written before the delete')")

    deleted = b.call("DELETE", "/v1/databases/orders")
    assert deleted.status_code == 202 and deleted.json()["deleteRequestedAt"]
    wait_for(lambda: not logs_in(before["uri"]), 60, "the tenant disabled", max_interval=0.5)
    refused = a.call("PUT", "/v1/databases/orders")
    assert refused.status_code == 409 and refused.json()["error"] == "database_deleting"

    undone = a.call("POST", "/v1/databases/orders/undelete")
    assert undone.status_code == 202, undone.text
    assert undone.json()["deleteRequestedAt"] is None
    view = ready(b, "orders")
    assert view["dropAfter"] is None and view["deleteRequestedAt"] is None
    wait_for(lambda: b.call("PUT", "/v1/databases/orders").status_code == 200, 20, "PUT answers the database")

    after = b.call("GET", "/v1/databases/orders/credentials").json()
    assert (after["user"], after["password"], after["database"]) == (
        before["user"],
        before["password"],
        before["database"],
    )
    with psycopg.connect(after["uri"]) as conn:
        assert conn.execute("SELECT note FROM kept").fetchall() == [("written before the delete",)]
    again = b.call("POST", "/v1/databases/orders/undelete")  # a retry: nothing to undo, the same database
    assert again.status_code == 202 and again.json()["phase"] == "Ready"


def test_what_cannot_be_undone_is_told_apart(
    replicas: tuple[ManagerReplica, ...], stack: DevStack, kube: KubeControlPlane
) -> None:
    a, b = replicas
    missing = a.call("POST", "/v1/databases/never-made/undelete")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    assert a.call("POST", "/v1/databases/Not_An_Id/undelete").json()["error"] == "invalid_external_id"
    bad_body = a.call("POST", "/v1/databases/never-made/undelete", json={"force": True})
    assert bad_body.status_code == 400 and bad_body.json()["error"] == "invalid_body"

    # An operator's delete request dated so that dropAfter is 20 s away: too late to undo, then gone.
    assert a.call("PUT", "/v1/databases/late").status_code == 201
    ready(b, "late")
    requested = datetime.now(UTC) - RETENTION + timedelta(seconds=20)
    with kube.admin_client() as client:
        annotations = {ANNOTATION_DELETE_REQUESTED_AT: format_micro_time(requested)}
        name = database_object_name(stack.consumer, "late")
        Rest(client).patch(DATABASES, name, {"metadata": {"annotations": annotations}}, stack.namespace)
    gone = b.call("POST", "/v1/databases/late/undelete")  # decided on the object as the apiserver has it now
    assert gone.status_code == 410 and gone.json()["error"] == "database_gone"
    assert a.call("GET", "/v1/databases/late").json()["deleteRequestedAt"] is not None  # nothing changed
    wait_for(lambda: a.call("GET", "/v1/databases/late").status_code == 404, 90, "late dropped", max_interval=0.5)
    dropped = a.call("POST", "/v1/databases/late/undelete")
    assert dropped.status_code == 404 and dropped.json()["error"] == "not_found"


def test_a_deleted_database_keeps_its_quota_slot_and_a_lowered_quota_refuses_the_undo(
    replicas: tuple[ManagerReplica, ...], stack: DevStack, kube: KubeControlPlane
) -> None:
    a, b = replicas
    consumer = unique("undel-quota")
    with kube.admin_client() as client:
        rest = Rest(client)
        token = stack.add_consumer(rest, consumer, 1)
        try:
            wait_for(lambda: a.call("GET", "/v1/databases", token=token).status_code == 200, 20, "token known")
            assert a.call("PUT", "/v1/databases/only", token=token).status_code == 201
            ready(b, "only", token)  # placed: an unplaced database is removed at once by its delete
            assert b.call("DELETE", "/v1/databases/only", token=token).status_code == 202
            over = a.call("PUT", "/v1/databases/another", token=token)
            assert over.status_code == 429 and over.json()["error"] == "quota_exceeded"  # Deleting counts
            undone = b.call("POST", "/v1/databases/only/undelete", token=token)
            assert undone.status_code == 202, undone.text  # its own slot: no free one needed

            assert a.call("DELETE", "/v1/databases/only", token=token).status_code == 202
            rest.patch(CONSUMERS, consumer, {"spec": {"maxDatabases": 0}})

            def refused() -> dict[str, Any] | None:
                answer = b.call("POST", "/v1/databases/only/undelete", token=token)
                assert answer.status_code in (202, 429), answer.text
                return dict(answer.json()) if answer.status_code == 429 else None

            assert wait_for(refused, 20, "the undo refused")["error"] == "quota_exceeded"
            view = a.call("GET", "/v1/databases/only", token=token).json()
            assert view["deleteRequestedAt"] is not None  # still deleted: nothing changed
            rest.patch(CONSUMERS, consumer, {"spec": {"maxDatabases": 1}})
            wait_for(
                lambda: b.call("POST", "/v1/databases/only/undelete", token=token).status_code == 202,
                20,
                "the undo accepted under the raised quota",
            )
            ready(a, "only", token)
        finally:
            rest.delete(CONSUMERS, consumer)
