"""The CA of a shard's client endpoint, declared on the Shard (`client.caCert`), reaches consumers: the
provider's credentials answer carries it, the agent writes it into the claim's Secret as `ca.crt` (with
`sslrootcert` naming that file) and keeps it current, a client logs in with sslmode verify-full
trusting only that CA against the real PostgreSQL, whose certificate the test CA signed, and the
provider's own first login of a new database verifies the endpoint with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from dbprovider.devstack import DevStack
from domain.naming import claim_database_id
from domain.resources import SHARDS
from harness import KubeControlPlane
from harness.certs import CertificateAuthority
from harness.postgres import shard_ca
from informers import Rest
from tests.agent.conftest import Consumer
from tests.agent.test_agent import decoded, logs_in, provider_get, ready_claim
from tests.support.common import wait_for


def logs_in_verified(uri: str, sslrootcert: Path) -> str:
    """Connect with the URI, verifying the server's certificate and host name against `sslrootcert` only."""
    with psycopg.connect(uri, sslmode="verify-full", sslrootcert=str(sslrootcert), connect_timeout=10) as conn:
        row = conn.execute("SELECT current_user").fetchone()
    assert row is not None
    return str(row[0])


def test_the_shards_client_ca_reaches_the_secret_and_verifies_the_server(
    consumer: Consumer, stack: DevStack, kube: KubeControlPlane, tmp_path: Path
) -> None:
    claim, before = ready_claim(consumer)
    meta = claim["metadata"]
    db_id = claim_database_id(meta["namespace"], meta["name"])
    assert "ca.crt" not in before and "sslrootcert" not in before
    assert "caCert" not in provider_get(stack, f"/v1/databases/{db_id}/credentials")
    ca_pem = shard_ca().ca_file.read_text()
    other_ca = CertificateAuthority(tmp_path, "other").ca_file

    def secret_values(done: Any) -> dict[str, str] | None:
        secret = consumer.secret(meta["namespace"], meta["name"])
        values = decoded(secret) if secret else {}
        return values if done(values) else None

    with kube.admin_client() as client:
        shards = Rest(client)
        shards.patch(SHARDS, stack.shard, {"spec": {"client": {"sslmode": "verify-full", "caCert": ca_pem}}})
        try:
            values = wait_for(
                lambda: secret_values(lambda v: v.get("ca.crt") == ca_pem), 120, "the CA in the Secret", max_interval=1
            )
            assert values["sslrootcert"] == "ca.crt" and values["sslmode"] == "verify-full"
            assert values["password"] == before["password"]

            # A consumer with the credentials answer: its caCert is what verifies the server.
            answer = provider_get(stack, f"/v1/databases/{db_id}/credentials")
            assert answer["caCert"] == ca_pem and answer["sslmode"] == "verify-full"
            root = tmp_path / "answer-ca.crt"
            root.write_text(answer["caCert"])
            assert logs_in_verified(answer["uri"], root) == before["username"]
            with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
                logs_in_verified(answer["uri"], other_ca)

            # A workload with the Secret projected as files: sslrootcert names the CA file beside it.
            binding = tmp_path / "binding"
            binding.mkdir()
            for key, value in values.items():
                (binding / key).write_text(value)
            assert logs_in_verified(values["uri"], binding / values["sslrootcert"]) == before["username"]

            # A database made now turns Ready: the provider's first login verified the endpoint with that CA.
            _, fresh = ready_claim(consumer)
            assert fresh["ca.crt"] == ca_pem
            assert logs_in_verified(fresh["uri"], root) == fresh["username"]

            # A renewed bundle (old and new CA together, as during a CA rotation) replaces the file.
            bundle = ca_pem + other_ca.read_text()
            shards.patch(SHARDS, stack.shard, {"spec": {"client": {"caCert": bundle}}})
            renewed = wait_for(
                lambda: secret_values(lambda v: v.get("ca.crt") == bundle), 120, "the renewed CA", max_interval=0.5
            )
            assert renewed["password"] == before["password"]
        finally:
            shards.patch(SHARDS, stack.shard, {"spec": {"client": {"sslmode": "require", "caCert": None}}})

    # No CA on the Shard any more: none in the answer, and the Secret's CA keys are gone.
    back = wait_for(
        lambda: secret_values(lambda v: "ca.crt" not in v and v.get("sslmode") == "require"),
        120,
        "the Secret without a CA",
        max_interval=0.5,
    )
    assert "sslrootcert" not in back
    assert "caCert" not in provider_get(stack, f"/v1/databases/{db_id}/credentials")
    assert logs_in(back) == before["username"]
