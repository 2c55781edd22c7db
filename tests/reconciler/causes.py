"""Causes of failure a test sets up on a real shard, and how it waits for their reason.

Shared by test_failure_reasons.py and test_terminal_failures.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from psycopg import sql

from domain.naming import tenant_name
from domain.resources import DATABASES
from harness import PostgresServer
from informers import Rest
from tests.reconciler.conftest import NAMESPACE, Fleet
from tests.support.common import condition


def wait_reason(fleet: Fleet, name: str, reason: str, type_: str = "Ready", timeout: float = 60) -> dict[str, Any]:
    def has_reason(db: dict[str, Any]) -> bool:
        found = condition(db, type_)
        return found is not None and found.get("reason") == reason

    return fleet.wait_database(name, has_reason, timeout, f"{name}: {type_} reason {reason}")


def tenant_of(admin_rest: Rest, name: str) -> str:
    """The tenant name the manager will choose (it is derived from the object's UID)."""
    db = admin_rest.get(DATABASES, name, NAMESPACE)
    return tenant_name(db["spec"]["externalId"], db["metadata"]["uid"])


def retry_now(admin_rest: Rest, name: str) -> None:
    """What an operator does after fixing the cause of a terminal failure: any change of the object."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    admin_rest.patch(DATABASES, name, {"metadata": {"annotations": {"rectest.example.com/retry": stamp}}}, NAMESPACE)


@contextmanager
def foreign_database(server: PostgresServer, name: str) -> Iterator[str]:
    """A database of that name owned by another role (left by an operator or a restore); yields its owner."""
    owner = f"squatter_{uuid.uuid4().hex[:8]}"
    with server.superuser_connection() as su:
        su.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(owner)))
        su.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(owner)))
    try:
        yield owner
    finally:
        with server.superuser_connection() as su:
            su.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
            su.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(owner)))
