"""pgBouncer paused, restarted, or its auth_query failing in front of a healthy Patroni shard: the
Databases already Ready keep their phase (the server is fine; the provider never goes through pgBouncer
for its own SQL), a new one waits in Provisioning with the Ready login's real cause (LoginFailed), the
Shard says so, the alert fires, and all turns Ready once pgBouncer serves again."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from psycopg import sql

from domain.naming import database_object_name
from domain.resources import DATABASES, SHARDS
from harness import KubeControlPlane
from harness.patroni import POOLER_AUTH_USER, PatroniShard
from harness.prometheus import PrometheusServer
from informers import Rest
from tests.patroni.conftest import Fleet
from tests.support.alerting import Replica, firing, rule_file, scrape_job
from tests.support.common import condition, wait_for
from tests.support.devstack import install_stack, remove_stack

pytestmark = pytest.mark.server


def test_pgbouncer_paused_then_restarted(patroni18: PatroniShard, fleet: Fleet, start_manager) -> None:
    cluster = patroni18
    assert cluster.pgbouncer is not None
    shard = fleet.patroni_shard(cluster)
    start_manager()
    ready = fleet.database("before")
    fleet.wait_phase(ready, "Ready", timeout=120)

    with cluster.paused_pgbouncer():
        waiting = fleet.database("while-paused")
        db = fleet.wait_reason(waiting, "Provisioning", "LoginFailed", timeout=120)
        assert "(client endpoint) did not log in" in condition(db, "Ready")["message"]
        assert fleet.get_database(ready)["status"]["phase"] == "Ready"  # type: ignore[index]
        fleet.wait_shard(shard, "Ok")  # the shard itself is fine: its admin endpoint is the primary
    fleet.wait_phase(waiting, "Ready", timeout=120)

    cluster.pgbouncer.stop()
    try:
        stopped = fleet.database("while-stopped")
        db = fleet.wait_reason(stopped, "Provisioning", "LoginFailed", timeout=120)
        assert condition(db, "Ready")["message"].startswith("login failed: unreachable")
        assert fleet.get_database(ready)["status"]["phase"] == "Ready"  # type: ignore[index]
    finally:
        cluster.pgbouncer.start()
    fleet.wait_phase(stopped, "Ready", timeout=120)


ALERT_RELEASE = "pgbalert"
TIME_SCALE = 60
CLUSTER = "eu-1"


def set_pooler_password(cluster: PatroniShard, password: str) -> None:
    """The auth user's password on the server (pgBouncer's auth_file keeps the one it was started with)."""
    with cluster.superuser_connection() as conn:
        conn.execute(
            sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(POOLER_AUTH_USER), sql.Literal(password))
        )


def test_auth_query_failing_shows_on_the_shard_and_fires_the_alert(
    patroni18: PatroniShard, kube: KubeControlPlane, tmp_path: Path
) -> None:
    """The auth user's password changed on the server, not in pgBouncer: pgBouncer cannot run its auth_query
    in a new tenant database, so no tenant logs in there. The provider's own SQL is fine (the Shard stays
    Ready); the new database waits in Provisioning with LoginFailed, the Shard says ClientLoginFailing, and
    DBProviderDatabaseStuckProvisioning fires on a real Prometheus (time compressed 60 times). With the
    password back, the database turns Ready and both clear."""
    cluster = patroni18
    stack = install_stack(
        kube,
        cluster,
        tmp_path / "stack",
        ALERT_RELEASE,
        softDelete={"retention": "0"},
        prometheusRule={"enabled": True, "cluster": CLUSTER},
    )
    replica = Replica(stack, f"{ALERT_RELEASE}-a", TIME_SCALE)
    prometheus: PrometheusServer | None = None
    try:
        replica.start()
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}}
        config["scrape_configs"] = [scrape_job(f"{ALERT_RELEASE}-metrics", replica.target, "1s", CLUSTER)]
        rules = {"dbprovider.rules.yaml": rule_file(stack.config_overrides, TIME_SCALE)}
        prometheus = PrometheusServer(tmp_path / "prometheus", config, rules).start()
        with kube.admin_client() as client:
            rest = Rest(client)

            def shard_condition(type_: str) -> dict[str, str] | None:
                return condition(rest.get(SHARDS, stack.shard), type_)

            def database(external_id: str) -> dict[str, object]:
                return rest.get(DATABASES, database_object_name(stack.consumer, external_id), stack.namespace)

            def ready_reason(external_id: str) -> str | None:
                ready = condition(database(external_id), "Ready")
                return None if ready is None else ready["reason"]

            assert replica.call("PUT", "/v1/databases/before").status_code == 201
            wait_for(lambda: ready_reason("before") == "Provisioned", 120, "the first database to be Ready")

            set_pooler_password(cluster, secrets.token_urlsafe(18))
            try:
                assert replica.call("PUT", "/v1/databases/after").status_code == 201
                wait_for(lambda: ready_reason("after") == "LoginFailed", 120, "the new database to wait on its login")
                failing = wait_for(
                    lambda: (c := shard_condition("ClientLoginFailing")) and c["status"] == "True" and c,
                    60,
                    "the Shard to say its client endpoint refuses logins",
                )
                assert failing["reason"] == "LoginFailed"
                assert f"127.0.0.1:{cluster.client_port} (client endpoint) did not log in" in failing["message"]
                assert shard_condition("Ready")["status"] == "True"  # type: ignore[index]

                def stuck_alert() -> dict[str, object] | None:
                    alerts = firing(prometheus).get("DBProviderDatabaseStuckProvisioning", [])  # type: ignore[arg-type]
                    return next((a for a in alerts if a["labels"].get("shard") == stack.shard), None)

                alert = wait_for(stuck_alert, 120, "DBProviderDatabaseStuckProvisioning to fire")
                assert "by Ready reason: LoginFailed (1)." in alert["annotations"]["description"]  # type: ignore[index]
            finally:
                set_pooler_password(cluster, cluster.pooler_password)
            wait_for(lambda: ready_reason("after") == "Provisioned", 120, "the database to turn Ready")
            wait_for(
                lambda: shard_condition("ClientLoginFailing")["status"] == "False",  # type: ignore[index]
                60,
                "ClientLoginFailing to clear",
            )
            wait_for(lambda: stuck_alert() is None, 120, "the alert to clear")
    finally:
        if prometheus is not None:
            prometheus.close()
        replica.stop()
        remove_stack(kube, stack)
