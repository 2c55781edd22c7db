"""The ownership record in a tenant role's comment, and the restore that checks it (issue 13)."""

from __future__ import annotations

from dataclasses import replace

import psycopg
import pytest
from psycopg import sql

from harness import PostgresServer
from harness.statement_log import StatementLog
from reconciler.sql.errors import SqlFailure
from reconciler.sql.session import AdminSession
from reconciler.sql.tenant import OwnerRecord, TenantSpec, claim_tenant, ensure_tenant, tenant_state
from tests.sql.helpers import admin_endpoint, can_connect
from tests.support.postgres import drop_as_superuser

OWNER = OwnerRecord("consumer-a", "6f1b3c1e-0000-4000-8000-000000000001")
SUCCESSOR = OwnerRecord("consumer-a", "6f1b3c1e-0000-4000-8000-000000000002")
INTRUDER = OwnerRecord("consumer-b", "6f1b3c1e-0000-4000-8000-000000000003")


def _role_comment(postgres: PostgresServer, name: str) -> str | None:
    with postgres.superuser_connection() as su:
        row = su.execute(
            "SELECT shobj_description(oid, 'pg_authid') FROM pg_roles WHERE rolname = %s", (name,)
        ).fetchone()
    return row[0] if row else None


@pytest.fixture
def owned(admin: AdminSession, tenant: TenantSpec) -> TenantSpec:
    spec = replace(tenant, owner=OWNER)
    ensure_tenant(admin, spec)
    return spec


def test_a_new_tenant_role_carries_its_owner(postgres: PostgresServer, admin: AdminSession, owned: TenantSpec) -> None:
    assert OwnerRecord.parse(_role_comment(postgres, owned.name)) == OWNER
    assert tenant_state(admin, owned.name).owner == OWNER


def test_a_tenant_cannot_rewrite_its_own_record(postgres: PostgresServer, owned: TenantSpec) -> None:
    with postgres.connect(owned.name, owned.password, owned.name) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                sql.SQL("COMMENT ON ROLE {} IS {}").format(
                    sql.Identifier(owned.name), sql.Literal(INTRUDER.comment())
                )
            )
    assert OwnerRecord.parse(_role_comment(postgres, owned.name)) == OWNER


def test_a_record_is_added_to_a_tenant_made_before_records_existed(
    postgres: PostgresServer, admin: AdminSession, tenant: TenantSpec
) -> None:
    ensure_tenant(admin, tenant)  # no owner: as the provider did before
    assert _role_comment(postgres, tenant.name) is None

    ensure_tenant(admin, replace(tenant, owner=OWNER))

    assert OwnerRecord.parse(_role_comment(postgres, tenant.name)) == OWNER


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
        assert OwnerRecord.parse(_role_comment(postgres, owned.name)) == SUCCESSOR
        assert can_connect(postgres, owned.name, owned.password, owned.name)  # nothing else changed

    def test_claiming_again_is_harmless(self, postgres: PostgresServer, admin: AdminSession, owned: TenantSpec) -> None:
        claim_tenant(admin, owned.name, SUCCESSOR, lambda record: True)
        claim_tenant(admin, owned.name, SUCCESSOR, lambda record: False)  # its own record: no question asked
        assert OwnerRecord.parse(_role_comment(postgres, owned.name)) == SUCCESSOR

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
                assert OwnerRecord.parse(_role_comment(logged_postgres, owned.name)) == OWNER
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
