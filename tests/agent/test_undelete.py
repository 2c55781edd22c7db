"""A claim deleted by mistake and created again before its database is dropped: where the provider lets
consumers undo a delete, the agent gets the same database back (its password and its data); where it
does not, the claim says why and until when it waits, and gets a new database after the drop."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import yaml

from dbprovider.dev_values import merge_values
from dbprovider.devstack import DevStack
from domain.config import load_install_config
from domain.naming import claim_database_id
from domain.resources import CLAIMS
from informers import EVENTS
from infra.render import config_yaml
from tests.agent.conftest import Consumer, Provider
from tests.agent.test_agent import decoded, provider_view, ready_claim
from tests.support.common import wait_for


@contextmanager
def provider_config(provider: Provider, stack: DevStack, values: dict[str, Any]) -> Iterator[None]:
    """The provider restarted with `values` merged into its install config, and with the old one after."""
    original = stack.config_file.read_text()
    stack.config_file.write_text(config_yaml(load_install_config(merge_values(yaml.safe_load(original), values))))
    provider.stop()
    provider.start()
    try:
        yield
    finally:
        stack.config_file.write_text(original)
        provider.stop()
        provider.start()


def delete_and_recreate(consumer: Consumer, claim: dict[str, Any]) -> dict[str, Any]:
    """Delete the claim (the agent soft-deletes its database), wait until it is gone, create it again."""
    meta = claim["metadata"]
    consumer.admin.delete(CLAIMS, meta["name"], meta["namespace"])
    wait_for(lambda: consumer.get_claim(claim) is None, 60, "the claim gone", max_interval=0.5)
    return consumer.claim(meta["namespace"], claim["spec"], name=meta["name"])


def write_note(uri: str) -> None:
    with psycopg.connect(uri) as conn:
        conn.execute("CREATE TABLE notes (note text)")
        conn.execute("INSERT INTO notes VALUES ('kept')")


def test_a_recreated_claim_gets_its_database_back_where_the_provider_allows_undo(
    consumer: Consumer, provider: Provider, stack: DevStack
) -> None:
    with provider_config(provider, stack, {"softDelete": {"retention": "10m", "allowUndelete": True}}):
        claim, before = ready_claim(consumer)
        meta = claim["metadata"]
        write_note(before["uri"])
        again = delete_and_recreate(consumer, claim)
        consumer.wait_condition(again, "Ready", "True", timeout=120)
        secret = consumer.secret(meta["namespace"], meta["name"])
        assert secret is not None
        after = decoded(secret)
        assert (after["username"], after["password"], after["database"]) == (
            before["username"],
            before["password"],
            before["database"],
        )
        with psycopg.connect(after["uri"]) as conn:
            assert conn.execute("SELECT note FROM notes").fetchall() == [("kept",)]
        view = provider_view(stack, claim_database_id(meta["namespace"], meta["name"]))
        assert view["deleteRequestedAt"] is None and view["phase"] == "Ready"
        status = (consumer.get_claim(again) or {})["status"]
        assert status.get("dropAfter") is None and status["phase"] == "Ready"
        events = consumer.admin.list(EVENTS, meta["namespace"])["items"]
        assert "Undeleted" in {e["reason"] for e in events if e["involvedObject"]["uid"] == again["metadata"]["uid"]}


def test_where_undo_is_not_allowed_the_recreated_claim_waits_for_the_drop(consumer: Consumer, stack: DevStack) -> None:
    claim, before = ready_claim(consumer)  # the suite's provider: allowUndelete off, retention 30s
    meta = claim["metadata"]
    db_id = claim_database_id(meta["namespace"], meta["name"])
    write_note(before["uri"])
    again = delete_and_recreate(consumer, claim)
    deleted_at = provider_view(stack, db_id)["deleteRequestedAt"]

    waiting = consumer.wait_condition(again, "Ready", "False")
    assert waiting["reason"] == "DatabaseDeleting", waiting
    assert "does not allow undoing a delete" in waiting["message"] and db_id in waiting["message"]
    status = (consumer.get_claim(again) or {})["status"]
    assert status["phase"] == "Deleting" and status["dropAfter"] in waiting["message"]
    assert provider_view(stack, db_id)["deleteRequestedAt"] == deleted_at  # the delete stands
    assert consumer.secret(meta["namespace"], meta["name"]) is None

    # After the drop the claim gets a new database under the same id: a new, empty one.
    consumer.wait_condition(again, "Ready", "True", timeout=180)
    secret = consumer.secret(meta["namespace"], meta["name"])
    assert secret is not None
    with psycopg.connect(decoded(secret)["uri"]) as conn:
        assert conn.execute("SELECT to_regclass('notes')").fetchone() == (None,)
