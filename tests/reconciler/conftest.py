"""Fixtures of the reconciler suite: the rendered install on the real apiserver, real PostgreSQL
shards, and the controllers running as the provider's own ServiceAccount (so its RBAC is proven too).

Names start with `rectest` so they collide with no other suite on the shared apiserver; every
Shard and Database a test creates is removed when the test ends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from kubernetes.client import ApiClient

from domain.constants import ANNOTATION_DELETE_REQUESTED_AT, FINALIZER_TENANT
from domain.resources import DATABASES, SHARDS
from harness import PostgresServer
from harness.statement_log import LoggedStatement, parse_statement_log
from informers import SECRETS, Informer, Rest
from reconciler.database import DatabaseController
from reconciler.events import EventRecorder
from tests.support.common import condition, decoded, wait_for
from tests.support.fleet import Fleet as BaseFleet
from tests.support.install import Release, release_fixtures

NAMESPACE = "rectest-system"
# Shard admin Secrets live outside the release namespace, as docs/install.md recommends.
SHARD_SECRETS_NAMESPACE = "rectest-shards"
RELEASE = Release("rectest", NAMESPACE, SHARD_SECRETS_NAMESPACE)
BASE_CONFIG = RELEASE.base_config
install_config = RELEASE.config


class Fleet(BaseFleet):
    release = RELEASE
    consumer = "rectest-consumer"

    def request_delete(self, name: str) -> None:
        self.annotate_now(name, ANNOTATION_DELETE_REQUESTED_AT)


installed, provider_client, admin_rest, start_manager, fleet = release_fixtures(RELEASE, Fleet)


def secret_data(rest: Rest, name: str) -> dict[str, str]:
    return decoded(rest.get(SECRETS, name, NAMESPACE))


def event_reasons(rest: Rest, name: str) -> set[str]:
    """The reasons of the Events about object `name` in the release namespace."""
    items = rest.request("GET", f"/api/v1/namespaces/{NAMESPACE}/events")["items"]
    return {e["reason"] for e in items if e["involvedObject"]["name"] == name}


def wait_events(rest: Rest, name: str, reasons: set[str]) -> None:
    """Events are sent in the background, right after the reconcile that records them."""
    wait_for(lambda: reasons <= event_reasons(rest, name), what=f"events {sorted(reasons)} on {name}")


__all__ = ["FINALIZER_TENANT", "Fleet", "condition", "install_config", "secret_data"]


@pytest.fixture(scope="session")
def logged_pg() -> Iterator[PostgresServer]:
    """A PostgreSQL 18 shard with log_statement=all: proves which SQL ran (or that none did)."""
    with PostgresServer("18", log_statements=True) as server:
        yield server


def provisioner_statements(server: PostgresServer) -> list[LoggedStatement]:
    """Every statement the provisioner role sent, in order: parameterized and multi-line ones too."""
    return parse_statement_log(server.statement_log(), server.PROVISIONER)


def is_shard_check(statement: LoggedStatement) -> bool:
    """The Shard controller's periodic health check (it reads the server version and its own role)."""
    return statement.keyword == "SELECT" and "current_setting('server_version_num')" in statement.text


def is_budget_read(statement: LoggedStatement) -> bool:
    """The second statement of the Shard controller's check: the server's connection slots."""
    return statement.keyword == "SELECT" and "current_setting('max_connections')" in statement.text


def tenant_sql(statements: list[LoggedStatement]) -> list[LoggedStatement]:
    """What is left after the Shard controller's health checks: SQL about databases."""
    return [s for s in statements if not is_shard_check(s) and not is_budget_read(s)]


def wait_for_later_shard_check(server: PostgresServer) -> None:
    """Wait until the Shard controller's health check (every 2 s) is logged once more from now on:
    everything the provisioner sent before now is in the statement log by then."""
    seen = sum(map(is_shard_check, provisioner_statements(server)))
    wait_for(
        lambda: sum(map(is_shard_check, provisioner_statements(server))) > seen,
        timeout=15,
        what="a later shard health check in the statement log",
    )


@dataclass
class ControllerParts:
    """What one Database controller works with, started by the test itself (not by a manager), so
    the test decides what the caches see."""

    rest: Rest
    shards: Informer
    databases: Informer
    secrets: Informer
    events: EventRecorder

    def controller(self) -> DatabaseController:
        return DatabaseController(
            self.rest,
            install_config(),
            NAMESPACE,
            self.databases,
            self.shards,
            self.secrets,
            self.events,
            admin_host_override="127.0.0.1",
        )


@contextmanager
def controller_parts(client: ApiClient) -> Iterator[ControllerParts]:
    """Informers (Shards, Databases, Secrets) and an EventRecorder as `client`; all stopped afterwards."""
    rest = Rest(client)
    parts = ControllerParts(
        rest,
        Informer(rest, SHARDS).start(),
        Informer(rest, DATABASES, NAMESPACE).start(),
        Informer(rest, SECRETS, NAMESPACE).start(),
        EventRecorder(rest, "test"),
    )
    try:
        yield parts
    finally:
        parts.events.close()
        for informer in (parts.shards, parts.databases, parts.secrets):
            informer.stop()
