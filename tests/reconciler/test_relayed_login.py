"""A Shard's client endpoint that relays the first login cannot hand a new database to someone else.

Real PostgreSQL 18 and kube-apiserver. The client endpoint offers TLS but no channel binding, as
pgBouncer does (a relay with its own TLS towards the provider and a cleartext connection to the
server). An honest one gets an unbound login, the provider finds nothing, and the database turns
Ready. A hostile one (the same relay, from then on) keeps the session, sets a password of its own
and grants the database and future tables to another consumer's tenant: the database never turns
Ready (`LoginTampered`), its session is ended and the password is the provider's again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from domain.resources import DATABASES
from harness import PostgresServer
from harness.certs import CertFiles, CertificateAuthority
from harness.relay import PostgresRelay
from informers import SECRETS
from tests.reconciler.causes import wait_reason
from tests.reconciler.conftest import NAMESPACE, Fleet
from tests.support.common import condition, wait_for


@pytest.fixture
def pg18(postgres_pool) -> PostgresServer:
    return postgres_pool.get("18")


@pytest.fixture(scope="module")
def relay_cert(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return CertificateAuthority(Path(tmp_path_factory.mktemp("relay")), "relay").issue_server("relay")


def _can_log_in(server: PostgresServer, user: str, password: str, dbname: str) -> bool:
    try:
        server.connect(user, password, dbname).close()
    except Exception:  # noqa: BLE001 - any refusal counts
        return False
    return True


def test_a_relay_that_used_the_first_login_keeps_the_database_from_ready(
    pg18: PostgresServer, relay_cert: CertFiles, fleet: Fleet, start_manager
) -> None:
    with PostgresRelay(pg18.port, terminate_tls=relay_cert, upstream_tls=False) as relay:
        fleet.shard(pg18, client_port=relay.port)
        start_manager()
        other = fleet.database("the-relays-friend", consumer="rectest-other")

        # Honest so far: the unbound login is checked, nothing is found, the database is Ready.
        friend = fleet.wait_reason(other, "Ready", "Provisioned", timeout=90)["status"]["tenantName"]

        assert relay.authenticated == 1
        relay.hijack = [
            f"DO $$ BEGIN EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), '{friend}'); END $$",
            f'ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO "{friend}"',
            "ALTER ROLE CURRENT_USER PASSWORD 'the-relay-knows-this'",
        ]
        name = fleet.database("relayed", consumer="rectest-consumer")

        db = wait_reason(fleet, name, "LoginTampered", timeout=90)

        # The relay acted on one session; every pass logs in again and takes the tenant back after it.
        tenant, creds = db["status"]["tenantName"], fleet.credentials(name)
        wait_for(
            lambda: (
                _can_log_in(pg18, creds["user"], creds["password"], creds["database"])
                and not _can_log_in(pg18, creds["user"], "the-relay-knows-this", creds["database"])
                and pg18.query("SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (tenant,)) == [(0,)]
            ),
            timeout=60,
            what="the relay's session ended and its password replaced",
        )
    db = fleet.get_database(name)
    assert db["status"]["phase"] == "Provisioning" and condition(db, "Ready")["reason"] == "LoginTampered"
    message = condition(db, "Ready")["message"]
    assert f"127.0.0.1:{relay.port} was not bound to TLS" in message
    assert "object(s) or grant(s) in the database or of the role" in message
    assert creds["password"] not in message and friend not in message
    [(acl,)] = pg18.query("SELECT datacl::text FROM pg_database WHERE datname = %s", (tenant,))
    assert friend in acl  # found and left for an operator to look at; the database is not handed out


def test_a_database_restored_onto_its_tenant_behind_a_pooler_keeps_its_data_and_turns_ready(
    pg18: PostgresServer, relay_cert: CertFiles, fleet: Fleet, start_manager, admin_rest
) -> None:
    """A restored tenant is not new: its consumer's tables are no sign of a relay, and are not checked."""
    with PostgresRelay(pg18.port, terminate_tls=relay_cert, upstream_tls=False) as relay:
        shard = fleet.shard(pg18, client_port=relay.port)
        start_manager()
        name = fleet.database("restored-behind-a-pooler")
        status = fleet.wait_reason(name, "Ready", "Provisioned", timeout=90)["status"]
        creds = fleet.credentials(name)
        with pg18.connect(creds["user"], creds["password"], creds["database"], autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (v text)")
            conn.execute("INSERT INTO kept VALUES ('survives')")
        admin_rest.delete(DATABASES, name, NAMESPACE)  # held, then released, as docs/operations.md says
        fleet.wait_database(name, lambda d: (c := condition(d, "DeletionHeld")) is not None and c["status"] == "True")
        admin_rest.patch(DATABASES, name, {"metadata": {"finalizers": None}}, NAMESPACE)
        wait_for(lambda: fleet.get_database(name) is None, what="released object")
        admin_rest.delete(SECRETS, f"{name}-credentials", NAMESPACE)

        fleet.restore(name, "rectest-consumer", "restored-behind-a-pooler", shard, status["tenantName"])

        fleet.wait_reason(name, "Ready", "Provisioned", timeout=90)
        assert relay.authenticated == 2
    new = fleet.credentials(name)
    with pg18.connect(new["user"], new["password"], new["database"]) as conn:
        assert conn.execute("SELECT v FROM kept").fetchone() == ("survives",)
