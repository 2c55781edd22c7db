"""The ownership record in a tenant role's comment, and the restore that checks it."""

from __future__ import annotations

from dataclasses import replace

import psycopg
import pytest
from psycopg import sql

from harness import PostgresServer
from harness.statement_log import StatementLog
from reconciler.sql.errors import SqlFailure
from reconciler.sql.session import AdminSession, connect_admin
from reconciler.sql.tenant import (
    OwnerRecord,
    Ownership,
    TenantSpec,
    claim_tenant,
    confirm_ownership,
    ensure_tenant,
    inspect_ownership,
    tenant_state,
)
from tests.sql.helpers import admin_endpoint, can_connect
from tests.support.postgres import drop_as_superuser, role_comment

OWNER = OwnerRecord("consumer-a", "6f1b3c1e-0000-4000-8000-000000000001")
SUCCESSOR = OwnerRecord("consumer-a", "6f1b3c1e-0000-4000-8000-000000000002")
INTRUDER = OwnerRecord("consumer-b", "6f1b3c1e-0000-4000-8000-000000000003")


@pytest.fixture
def owned(admin: AdminSession, tenant: TenantSpec) -> TenantSpec:
    spec = replace(tenant, owner=OWNER)
    ensure_tenant(admin, spec)
    return spec


def test_a_new_tenant_role_carries_its_owner(postgres: PostgresServer, admin: AdminSession, owned: TenantSpec) -> None:
    assert OwnerRecord.parse(role_comment(postgres, owned.name)) == OWNER
    assert tenant_state(admin, owned.name).owner == OWNER


def test_a_tenant_cannot_rewrite_its_own_record(postgres: PostgresServer, owned: TenantSpec) -> None:
    with postgres.connect(owned.name, owned.password, owned.name) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                sql.SQL("COMMENT ON ROLE {} IS {}").format(sql.Identifier(owned.name), sql.Literal(INTRUDER.comment()))
            )
    assert OwnerRecord.parse(role_comment(postgres, owned.name)) == OWNER


def test_provisioning_records_a_recordless_tenant_only_where_it_can_prove_it_made_it(
    postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec
) -> None:
    """An attempt by a build before records existed left the role: from 16 on the provisioner holds
    ADMIN on what it created and finishes it; before 16 that proof does not exist: name_taken."""
    ensure_tenant(admin, tenant)  # no owner: as the provider did before
    assert role_comment(postgres, tenant.name) is None

    if postgres.major >= 16:
        ensure_tenant(admin, replace(tenant, owner=OWNER))
        assert OwnerRecord.parse(role_comment(postgres, tenant.name)) == OWNER
        return
    with pytest.raises(SqlFailure) as failure:
        ensure_tenant(admin, replace(tenant, owner=OWNER))
    assert failure.value.error_class == "name_taken" and "before PostgreSQL 16" in str(failure.value)
    assert role_comment(postgres, tenant.name) is None


def test_provisioning_never_adopts_a_foreign_role_of_the_tenant_name(
    postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec
) -> None:
    """A role somebody else made under the tenant's name (0.1.0 adopted it before PostgreSQL 16)."""
    with postgres.superuser_connection() as su:
        su.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(tenant.name)))
    with pytest.raises(SqlFailure) as failure:
        ensure_tenant(admin, replace(tenant, owner=OWNER))
    assert failure.value.error_class == "name_taken"
    assert role_comment(postgres, tenant.name) is None
    state = tenant_state(admin, tenant.name)
    assert not state.database_exists
    granted = postgres.query(  # and no membership was granted to the provisioner
        "SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid WHERE r.rolname = %s",
        (tenant.name,),
    )
    assert granted == [(0,)]


def test_ensure_refuses_a_role_recorded_for_another_database(admin: AdminSession, owned: TenantSpec) -> None:
    with pytest.raises(SqlFailure) as failure:
        ensure_tenant(admin, replace(owned, owner=INTRUDER))
    assert failure.value.error_class == "name_taken"


class TestClaim:
    def test_the_same_consumer_takes_over_once_the_owner_is_gone(
        self, postgres: PostgresServer, admin: AdminSession, owned: TenantSpec
    ) -> None:
        asked: list[OwnerRecord] = []

        def released(record: OwnerRecord) -> bool:
            asked.append(record)
            return True

        claim_tenant(admin, owned.name, SUCCESSOR, released)

        assert asked == [OWNER]
        assert OwnerRecord.parse(role_comment(postgres, owned.name)) == SUCCESSOR
        assert can_connect(postgres, owned.name, owned.password, owned.name)  # nothing else changed

    def test_claiming_again_is_harmless(self, postgres: PostgresServer, admin: AdminSession, owned: TenantSpec) -> None:
        claim_tenant(admin, owned.name, SUCCESSOR, lambda record: True)
        claim_tenant(admin, owned.name, SUCCESSOR, lambda record: False)  # its own record: no question asked
        assert OwnerRecord.parse(role_comment(postgres, owned.name)) == SUCCESSOR

    @pytest.mark.parametrize(
        ("claimant", "released", "why"),
        [
            (INTRUDER, True, "another consumer"),
            (SUCCESSOR, False, "still exists"),
        ],
        ids=["other-consumer", "owner-still-exists"],
    )
    def test_refused_claims_change_nothing(
        self,
        postgres: PostgresServer,
        logged_postgres: PostgresServer,
        owned: TenantSpec,
        claimant: OwnerRecord,
        released: bool,
        why: str,
    ) -> None:
        with AdminSession.for_endpoint(admin_endpoint(logged_postgres)) as logged_admin:
            ensure_tenant(logged_admin, owned)
            try:
                log = StatementLog(logged_postgres)
                with pytest.raises(SqlFailure) as failure:
                    claim_tenant(logged_admin, owned.name, claimant, lambda record: released)

                assert failure.value.error_class == "restore_refused" and why in str(failure.value)
                keywords = {s.keyword for s in log.statements(logged_postgres.PROVISIONER)}
                assert keywords <= {"BEGIN", "SELECT", "ROLLBACK"}, keywords
                assert OwnerRecord.parse(role_comment(logged_postgres, owned.name)) == OWNER
                assert can_connect(logged_postgres, owned.name, owned.password, owned.name)
            finally:
                drop_as_superuser(logged_postgres, owned.name)

    def test_a_role_without_a_record_is_refused(self, admin: AdminSession, tenant: TenantSpec) -> None:
        ensure_tenant(admin, tenant)
        with pytest.raises(SqlFailure) as failure:
            claim_tenant(admin, tenant.name, SUCCESSOR, lambda record: True)
        assert failure.value.error_class == "restore_refused" and "no ownership record" in str(failure.value)
        assert tenant_state(admin, tenant.name).owner is None

    def test_a_missing_tenant_is_refused_not_created(self, admin: AdminSession, tenant: TenantSpec) -> None:
        with pytest.raises(SqlFailure) as failure:
            claim_tenant(admin, tenant.name, SUCCESSOR, lambda record: True)
        assert failure.value.error_class == "restore_refused"
        assert tenant_state(admin, tenant.name).absent


@pytest.mark.parametrize(
    "comment",
    [None, "", "not json", "[]", '{"consumer": "a"}', '{"consumer": 1, "databaseUid": "u"}'],
)
def test_foreign_comments_are_no_record(comment: str | None) -> None:
    assert OwnerRecord.parse(comment) is None


def test_the_record_round_trips() -> None:
    assert OwnerRecord.parse(OWNER.comment()) == OWNER


# -- adoption of a Ready database's tenant made before records existed (0.2.0) ----------------------


def _legacy(admin: AdminSession, tenant: TenantSpec) -> TenantSpec:
    """A tenant as builds before ownership records made it: finished, no comment."""
    ensure_tenant(admin, tenant)
    return tenant


def _as_superuser(postgres: PostgresServer, statement: str, *names: str) -> None:
    with postgres.superuser_connection() as su:
        su.execute(sql.SQL(statement).format(*(sql.Identifier(n) for n in names)))


class TestConfirm:
    def test_a_recorded_tenant_is_confirmed_with_one_catalog_read(
        self, logged_postgres: PostgresServer, tenant: TenantSpec
    ) -> None:
        spec = replace(tenant, owner=OWNER)
        with AdminSession.for_endpoint(admin_endpoint(logged_postgres)) as logged_admin:
            ensure_tenant(logged_admin, spec)
            try:
                log = StatementLog(logged_postgres)
                check = confirm_ownership(logged_admin, spec.name, OWNER, spec.connection_limit)
                statements = log.statements(logged_postgres.PROVISIONER)
            finally:
                drop_as_superuser(logged_postgres, spec.name)
        assert check.verdict == Ownership.RECORDED
        assert [s.keyword for s in statements] == ["SELECT"] and statements[0].mentions(spec.name)

    def test_a_tenant_made_before_records_is_adopted_once(
        self, postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec
    ) -> None:
        legacy = _legacy(admin, tenant)
        assert confirm_ownership(admin, legacy.name, OWNER, legacy.connection_limit).verdict == Ownership.ADOPTED
        assert OwnerRecord.parse(role_comment(postgres, legacy.name)) == OWNER
        assert confirm_ownership(admin, legacy.name, OWNER, legacy.connection_limit).verdict == Ownership.RECORDED
        assert can_connect(postgres, legacy.name, legacy.password, legacy.name)  # nothing else changed

    @pytest.mark.parametrize(
        ("alter", "why"),
        [
            ("ALTER ROLE {} CREATEDB", "has createdb"),
            ("ALTER ROLE {} CONNECTION LIMIT 99", "connection limit"),
            ("GRANT CONNECT ON DATABASE {} TO PUBLIC", "privileges are not the provider's"),
            ("GRANT pg_read_all_data TO {}", "member of other roles"),
        ],
        ids=["attribute", "limit", "acl", "membership"],
    )
    def test_a_tenant_that_does_not_look_like_the_providers_is_left_alone(
        self, postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec, alter: str, why: str
    ) -> None:
        legacy = _legacy(admin, tenant)
        _as_superuser(postgres, alter, legacy.name)
        check = confirm_ownership(admin, legacy.name, OWNER, legacy.connection_limit)
        assert check.verdict == Ownership.FOREIGN and any(why in p for p in check.problems), check
        assert role_comment(postgres, legacy.name) is None

    def test_a_role_made_by_somebody_else_is_foreign_from_16_on_even_in_the_providers_shape(
        self, postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec
    ) -> None:
        """The same role and database, made by a superuser: from 16 on the provisioner holds no ADMIN on
        it. Before 16 nothing tells the two apart: a Ready database's tenant in this shape is adopted."""
        name = tenant.name
        with postgres.superuser_connection() as su:
            su.execute(sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 5").format(sql.Identifier(name)))
            su.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(name)))
            su.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(name)))
            su.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(name), sql.Identifier(name)))
        with connect_admin(admin_endpoint(postgres)) as conn:
            check = inspect_ownership(conn, name, OWNER, 5)
        if postgres.major >= 16:
            assert check.verdict == Ownership.FOREIGN and "ADMIN" in check.problems[0]
        else:
            assert check.verdict == Ownership.ADOPTABLE

    def test_another_databases_record_and_a_missing_tenant_are_reported_not_changed(
        self, postgres: PostgresServer, admin: AdminSession, owned: TenantSpec, tenant: TenantSpec
    ) -> None:
        assert confirm_ownership(admin, owned.name, SUCCESSOR, 5).verdict == Ownership.OTHER_OWNER
        assert OwnerRecord.parse(role_comment(postgres, owned.name)) == OWNER
        drop_as_superuser(postgres, owned.name)
        assert confirm_ownership(admin, owned.name, OWNER, 5).verdict == Ownership.MISSING
        assert tenant_state(admin, owned.name).absent
