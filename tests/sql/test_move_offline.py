"""Moving a tenant database offline (reconciler.sql.move_offline) between real PostgreSQL servers: PostgreSQL
15 to 15 and to 18, and 18 to 18, with the provisioner the product's (no superuser, no replication grants).

After the move the target holds what the source held (compared by content: rows, a sequence, a large
object, a view, a function), the tenant's own credentials log in on the target and no longer on the
source; a copy run again does nothing; an abort before the target is opened reopens the source and
leaves nothing on the target.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from harness import PostgresServer
from reconciler.sql import move, move_offline
from reconciler.sql.errors import SqlFailure
from reconciler.sql.session import connect_admin
from reconciler.sql.tenant import TenantSpec, read_state
from tests.sql.conftest import LogicalPool
from tests.sql.helpers import admin_endpoint, can_connect, new_spec
from tests.sql.test_move_privileges import provision
from tests.support.postgres import PG_FLAVORS, drop_as_superuser

# (source major, target major): the target's pg_dump and pg_restore do the copy.
PAIRS = [(f, f) for f in PG_FLAVORS if f in ("15", "18")]
PAIRS += [("15", "18")] if {"15", "18"} <= set(PG_FLAVORS) else []

SCHEMA = (
    "CREATE TABLE owners (id serial PRIMARY KEY, name text UNIQUE NOT NULL)",
    "CREATE TABLE pets (id bigserial PRIMARY KEY, owner int REFERENCES owners (id), photo bytea, born date)",
    "CREATE INDEX pets_born ON pets (born)",
    "CREATE TABLE audit (at timestamptz DEFAULT now(), note text)",  # no primary key: fine offline
    "CREATE VIEW pet_names AS SELECT p.id, o.name FROM pets p JOIN owners o ON o.id = p.owner",
    "CREATE FUNCTION pet_count() RETURNS bigint LANGUAGE sql AS 'SELECT count(*) FROM pets'",
    "INSERT INTO owners (name) SELECT 'owner ' || g FROM generate_series(1, 50) g",
    "INSERT INTO pets (owner, photo, born) SELECT 1 + g % 50, sha256(g::text::bytea), date '2020-01-01' + g"
    " FROM generate_series(1, 2000) g",
    "INSERT INTO audit (note) VALUES ('first'), ('second')",
    "SELECT lo_from_bytea(0, 'a large object')",
)
CONTENT = (
    "SELECT id, name FROM owners ORDER BY id",
    "SELECT id, owner, photo, born FROM pets ORDER BY id",
    "SELECT note FROM audit ORDER BY note",
    "SELECT id, name FROM pet_names ORDER BY id",
    "SELECT pet_count()",
    "SELECT lo_get(oid) FROM pg_largeobject_metadata",
)


@dataclass(frozen=True)
class Offline:
    """A tenant on `source`, the provisioner's sessions to both servers, the target's binaries."""

    source: PostgresServer
    target: PostgresServer
    spec: TenantSpec
    source_admin: psycopg.Connection
    target_admin: psycopg.Connection

    @property
    def plan(self) -> move.MovePlan:
        return move.MovePlan(self.spec, "127.0.0.1", self.source.port, sslmode="disable")

    @property
    def binaries(self) -> tuple[Path, Path]:
        return self.target.bin_dir / "pg_dump", self.target.bin_dir / "pg_restore"

    def content(self, server: PostgresServer) -> list[list[tuple[object, ...]]]:
        """What the tenant reads in its database on `server` (as the superuser: the source is closed)."""
        with server.superuser_connection(self.spec.name) as conn:
            conn.execute(f"SET ROLE {self.spec.name}")
            return [conn.execute(query).fetchall() for query in CONTENT]

    def copy(self) -> None:
        move.prepare_target(self.target_admin, self.spec)
        move_offline.close_source(self.source_admin, self.spec.name)
        move_offline.copy_database(self.source_admin, self.target_admin, self.plan, *self.binaries)


@pytest.fixture(params=PAIRS, ids=[f"pg{s}-pg{t}" for s, t in PAIRS])
def offline(request: pytest.FixtureRequest, logical_pool: LogicalPool) -> Iterator[Offline]:
    source_major, target_major = request.param
    source, target = logical_pool.source(source_major), logical_pool.target(target_major)
    spec = new_spec()
    provision(source, spec)
    with source.connect(spec.name, spec.password, spec.name, autocommit=True) as tenant:
        for statement in SCHEMA:
            tenant.execute(statement)
    with (
        connect_admin(admin_endpoint(source, sslmode="disable")) as source_admin,
        connect_admin(admin_endpoint(target, sslmode="disable")) as target_admin,
    ):
        yield Offline(source, target, spec, source_admin, target_admin)
    drop_as_superuser(source, spec.name)
    drop_as_superuser(target, spec.name)


def test_offline_move_carries_the_database_and_the_credentials(offline: Offline) -> None:
    before = offline.content(offline.source)
    offline.copy()
    assert not can_connect(offline.source, offline.spec.name, offline.spec.password, offline.spec.name)
    assert not can_connect(offline.target, offline.spec.name, offline.spec.password, offline.spec.name)
    offline.copy()  # a pass after a restart: nothing is copied twice
    move_offline.open_offline(offline.source_admin, offline.target_admin, offline.plan)
    move_offline.open_offline(offline.source_admin, offline.target_admin, offline.plan)  # idempotent

    assert offline.content(offline.target) == before
    assert offline.content(offline.source) == before  # the closed source is the rollback copy
    with offline.target.connect(offline.spec.name, offline.spec.password, offline.spec.name, autocommit=True) as t:
        assert t.execute("SELECT nextval('pets_id_seq')").fetchone() == (2001,)
        t.execute("INSERT INTO owners (name) VALUES ('after the move')")
        schemas = t.execute("SELECT nspname FROM pg_namespace WHERE nspname = %s", (move.MARKER_SCHEMA,)).fetchall()
        assert schemas == []
    assert not can_connect(offline.source, offline.spec.name, offline.spec.password, offline.spec.name)


def test_offline_abort_reopens_the_source(offline: Offline) -> None:
    before = offline.content(offline.source)
    offline.copy()
    move.abort(offline.source_admin, offline.target_admin, offline.plan)
    assert can_connect(offline.source, offline.spec.name, offline.spec.password, offline.spec.name)
    assert offline.content(offline.source) == before
    assert not read_state(offline.target_admin, offline.spec.name).role_exists


def test_database_size(offline: Offline) -> None:
    size = move_offline.database_size(offline.source_admin, offline.spec.name)
    assert 1 << 20 < size < 1 << 30


def test_a_cancelled_copy_leaves_nothing_on_the_target(offline: Offline) -> None:
    move.prepare_target(offline.target_admin, offline.spec)
    move_offline.close_source(offline.source_admin, offline.spec.name)
    with pytest.raises(SqlFailure):
        move_offline.dump_and_restore(
            offline.source_admin, offline.target_admin, offline.plan, *offline.binaries, cancelled=lambda: True
        )
    with offline.target.superuser_connection(offline.spec.name) as conn:
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relname = 'pets'").fetchone() == (0,)
    move_offline.copy_database(offline.source_admin, offline.target_admin, offline.plan, *offline.binaries)
    move_offline.open_offline(offline.source_admin, offline.target_admin, offline.plan)
    assert offline.content(offline.target) == offline.content(offline.source)
