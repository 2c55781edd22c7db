"""The credentials route: 409 before Ready, the values and a URI once Ready, 503 when unusable.

The test plays the reconciler: it writes the Database's status (phase Ready) through the status
subresource and the `<name>-credentials` Secret owned by the Database (controller reference).
"""

from __future__ import annotations

import json

import pytest
from psycopg.conninfo import conninfo_to_dict

from domain.naming import credentials_secret_name, database_object_name
from tests.api.support import ApiEnv, Consumer
from tests.support.common import wait_for
from tests.vectors.objects import CA_PEM


def creds_path(external_id: str) -> str:
    return f"/v1/databases/{external_id}/credentials"


@pytest.fixture
def ready(env: ApiEnv) -> tuple[Consumer, str, dict]:
    """A consumer with a Ready database (no credentials Secret yet)."""
    consumer = env.ready_consumer()
    external_id = "app-db"
    assert env.call("PUT", f"/v1/databases/{external_id}", consumer.token).status_code == 201
    db = env.make_ready(consumer.name, external_id)
    return consumer, external_id, db


def test_not_ready_before_phase_ready(env: ApiEnv) -> None:
    consumer = env.ready_consumer()
    assert env.call("PUT", "/v1/databases/young", consumer.token).status_code == 201
    response = env.call("GET", creds_path("young"), consumer.token)
    assert response.status_code == 409
    assert response.json()["error"] == "not_ready"
    env.set_status(consumer.name, "young", {"phase": "Provisioning"})
    assert env.call("GET", creds_path("young"), consumer.token).status_code == 409


def test_credentials_of_a_ready_database(env: ApiEnv, ready: tuple[Consumer, str, dict]) -> None:
    consumer, external_id, db = ready
    password = "p@ss:w/rd %?#&=+ü"
    values = env.credentials_secret(db, values={"password": password, "host": "pg.shard01.example", "port": "6432"})
    response = env.call("GET", creds_path(external_id), consumer.token)
    assert response.status_code == 200, response.text
    assert response.headers["Cache-Control"] == "no-store"
    body = response.json()
    assert {k: body[k] for k in ("host", "database", "user", "password", "sslmode")} == {
        "host": "pg.shard01.example",
        "database": values["database"],
        "user": values["user"],
        "password": password,
        "sslmode": "require",
    }
    assert body["port"] == 6432
    # The URI is what libpq reads back, every part percent-encoded.
    assert body["uri"].startswith("postgresql://")
    assert password not in body["uri"]
    parsed = conninfo_to_dict(body["uri"])
    assert parsed == {
        "host": "pg.shard01.example",
        "port": "6432",
        "dbname": values["database"],
        "user": values["user"],
        "password": password,
        "sslmode": "require",
    }


def test_the_client_endpoint_ca_is_served_when_the_secret_holds_one(
    env: ApiEnv, ready: tuple[Consumer, str, dict]
) -> None:
    consumer, external_id, db = ready
    env.credentials_secret(db)
    assert "caCert" not in env.call("GET", creds_path(external_id), consumer.token).json()
    version = env.call("GET", f"/v1/databases/{external_id}", consumer.token).json()["credentialsVersion"]
    env.credentials_secret(db, values={"sslmode": "verify-full", "caCert": CA_PEM})
    body = wait_for(
        lambda: (r := env.call("GET", creds_path(external_id), consumer.token).json()).get("caCert") and r,
        30,
        "caCert in the answer",
    )
    assert body["caCert"] == CA_PEM and body["sslmode"] == "verify-full"
    # The CA is part of what the credentials are: consumers see a new credentialsVersion.
    assert env.call("GET", f"/v1/databases/{external_id}", consumer.token).json()["credentialsVersion"] != version


@pytest.mark.parametrize("host", ["bad_host", "::1", "[::1]", "host.", "a b", "010.0.0.1", "x" * 254, "h;rm -rf"])
def test_invalid_host_gives_503(env: ApiEnv, ready: tuple[Consumer, str, dict], host: str) -> None:
    consumer, external_id, db = ready
    env.credentials_secret(db, values={"host": host})
    response = env.call("GET", creds_path(external_id), consumer.token)
    assert response.status_code == 503
    assert response.json()["error"] == "credentials_unavailable"
    assert host not in response.text


def test_missing_secret_gives_503(env: ApiEnv, ready: tuple[Consumer, str, dict]) -> None:
    consumer, external_id, _ = ready
    response = env.call("GET", creds_path(external_id), consumer.token)
    assert response.status_code == 503
    assert response.json()["error"] == "credentials_unavailable"


@pytest.mark.parametrize(
    "variant",
    [
        {"owned": False},
        {"controller": False},
        {"values": {"password": None}},
        {"values": {"user": None}},
        {"values": {"user": "someone_else"}},
        {"values": {"port": "not-a-port"}},
        {"values": {"port": "70000"}},
        {"values": {"sslmode": "sometimes"}},
    ],
    ids=["unowned", "not-controller", "no-password", "no-user", "other-user", "bad-port", "port-range", "sslmode"],
)
def test_foreign_or_inconsistent_secret_gives_503(
    env: ApiEnv, ready: tuple[Consumer, str, dict], variant: dict
) -> None:
    consumer, external_id, db = ready
    env.credentials_secret(db, **variant)
    response = env.call("GET", creds_path(external_id), consumer.token)
    assert response.status_code == 503
    assert response.json() == {
        "error": "credentials_unavailable",
        "message": "the credentials of this database are temporarily unavailable",
    }


def test_secret_of_another_database_is_not_accepted(env: ApiEnv, ready: tuple[Consumer, str, dict]) -> None:
    """A Secret owned by some other Database (another uid) is foreign."""
    consumer, external_id, db = ready
    impostor = {**db, "metadata": {**db["metadata"], "uid": "00000000-0000-0000-0000-000000000000"}}
    env.credentials_secret(impostor)
    assert env.call("GET", creds_path(external_id), consumer.token).status_code == 503


def test_secret_repaired_takes_effect(env: ApiEnv, ready: tuple[Consumer, str, dict]) -> None:
    consumer, external_id, db = ready
    env.credentials_secret(db, values={"host": "bad_host"})
    assert env.call("GET", creds_path(external_id), consumer.token).status_code == 503
    env.credentials_secret(db)
    assert env.call("GET", creds_path(external_id), consumer.token).status_code == 200
    env.delete_secret(credentials_secret_name(database_object_name(consumer.name, external_id)))
    assert env.call("GET", creds_path(external_id), consumer.token).status_code == 503


def test_pending_password_is_not_handed_out(env: ApiEnv, ready: tuple[Consumer, str, dict]) -> None:
    """A password the reconciler has not set on the role yet (a rotation in flight) gives 503."""
    consumer, external_id, db = ready
    values = env.credentials_secret(db, password_id="0f1e2d3c4b5a6978")
    response = env.call("GET", creds_path(external_id), consumer.token)
    assert response.status_code == 503
    assert response.json() == {
        "error": "credentials_unavailable",
        "message": "a new password is being set; retry in a few seconds",
    }
    assert values["password"] not in response.text
    # The reconciler records the id once ALTER ROLE ran: now it is handed out (live read, no cache wait).
    env.set_status(consumer.name, external_id, {"passwordApplied": "0f1e2d3c4b5a6978"})
    response = env.call("GET", creds_path(external_id), consumer.token)
    assert response.status_code == 200, response.text
    assert response.json()["password"] == values["password"]


def test_other_consumer_gets_404(env: ApiEnv, ready: tuple[Consumer, str, dict]) -> None:
    _, external_id, db = ready
    env.credentials_secret(db)
    other = env.ready_consumer()
    response = env.call("GET", creds_path(external_id), other.token)
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


def test_deleting_database_has_no_credentials(env: ApiEnv, ready: tuple[Consumer, str, dict]) -> None:
    consumer, external_id, db = ready
    env.credentials_secret(db)
    assert env.call("GET", creds_path(external_id), consumer.token).status_code == 200
    assert env.call("DELETE", f"/v1/databases/{external_id}", consumer.token).status_code == 202
    response = env.call("GET", creds_path(external_id), consumer.token)
    assert response.status_code == 409
    assert response.json()["error"] == "not_ready"


def test_the_cache_holds_no_password_and_a_changed_secret_is_read_anew(
    env: ApiEnv, ready: tuple[Consumer, str, dict]
) -> None:
    """The Secrets cache keeps metadata and a digest only: the credentials route reads the Secret from the
    apiserver, keeps the last ones read while the cache shows that version, and reads a changed one anew."""
    consumer, external_id, db = ready
    env.credentials_secret(db, values={"password": "first-password"})
    assert env.call("GET", creds_path(external_id), consumer.token).json()["password"] == "first-password"
    cached = env.components.store.secrets.get(
        f"{db['metadata']['namespace']}/{credentials_secret_name(db['metadata']['name'])}"
    )
    assert cached is not None and "data" not in cached
    assert "first-password" not in json.dumps(cached) and "Zmlyc3QtcGFzc3dvcmQ" not in json.dumps(cached)
    assert env.call("GET", creds_path(external_id), consumer.token).json()["password"] == "first-password"
    env.credentials_secret(db, values={"password": "second-password"})  # returns once the cache shows it
    assert env.call("GET", creds_path(external_id), consumer.token).json()["password"] == "second-password"
