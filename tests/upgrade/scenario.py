"""The upgrade scenario, written against a `Cluster`: the databases it creates and what must hold.

`populate` creates, through the previous release, Shards, Consumers and a Database in every phase a
user can have at upgrade time: Ready ones, one Deleting within its retention, one held by a
Kubernetes delete (DeletionHeld), one with a rotation pending (its tenant holds a lock on its own
role, so the rotation's ALTER ROLE waits), one Failed with NoCapacity (every shard drained), and one
whose tenant was made before ownership records existed. It remembers how each looked.
`kept` lists every difference from that: phase, placement, tenant, retention, conditions of the
phase, the credentials Secret, a login with it, and what each consumer token sees through the API.
`unannounced_sql` lists the statements Ready databases ran beyond what CHANGELOG.md announces.
`Poller` is a client calling the API all the time; every answer must be a success.

The scenario needs only what `Cluster` offers (the apiserver, the shard servers, requests through
the Service), so the same phases run wherever a release can be installed and rolled out.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg
from kubernetes.client.exceptions import ApiException
from psycopg import sql

from domain.naming import database_object_name
from domain.resources import DATABASES, SHARDS
from harness import PostgresServer
from harness.background import Background
from harness.statement_log import LoggedStatement, parse_statement_log
from informers import SECRETS, Rest
from tests.support.common import condition, decoded, wait_for
from tests.support.logins import logs_in

TEAM_A, TEAM_B, TEAM_OFF = "upg-team-a", "upg-team-b", "upg-team-off"

# SQL a Ready database may run while the provider is upgraded to this release: the 0.2.0 entry of
# CHANGELOG.md ("SQL that runs on existing databases during the upgrade"), as patterns, with how
# often each may run per database. Add a row here only together with a line there.
ANNOUNCED_READY_SQL: dict[str, tuple[re.Pattern[str], int]] = {
    # The read's text as 0.2.0 sent it, and as it names its columns since (the same read).
    "ownership check: the tenant's catalog row": (
        re.compile(r"^SELECT r\.oid(?: IS NOT NULL AS role_exists)?, coalesce\(r\.rolcanlogin"),
        2,
    ),
    "ownership check: the lock of an adoption": (re.compile(r"^SELECT pg_catalog\.pg_advisory_xact_lock"), 1),
    "ownership record of a tenant made before records": (re.compile(r'^COMMENT ON ROLE "[a-z0-9_]+" IS '), 1),
}


class Answer(Protocol):
    status: int
    body: Any


class Cluster(Protocol):
    """What the scenario needs from wherever the provider runs."""

    rest: Rest  # cluster-admin
    namespace: str
    shard_servers: dict[str, PostgresServer]  # Shard name -> its server (superuser access, statement log)

    def call(self, token: str, method: str, path: str, **kwargs: Any) -> Answer: ...


@dataclass
class Case:
    """One Database of the scenario and how it looked before the upgrade."""

    external_id: str
    consumer: str
    phase: str
    reason: str | None = None
    conditions: dict[str, str] = field(default_factory=dict)  # type -> status that must stay
    name: str = ""
    status: dict[str, Any] = field(default_factory=dict)
    credentials: dict[str, str] | None = None
    # rotating only: the credentials before the rotation was requested (the Secret holds the new,
    # pending password from the request on)
    before_rotation: dict[str, str] | None = None

    def __post_init__(self) -> None:
        self.name = database_object_name(self.consumer, self.external_id)

    @property
    def tenant(self) -> str:
        return self.status["tenantName"]


@dataclass
class World:
    """What `populate` made: tokens, cases, and the tenant session that keeps a rotation pending."""

    tokens: dict[str, str]
    cases: dict[str, Case] = field(default_factory=dict)
    blocker: psycopg.Connection | None = None
    statement_offsets: dict[str, int] = field(default_factory=dict)

    def ready(self) -> list[Case]:
        return [c for c in self.cases.values() if c.phase == "Ready" and c.external_id != "rotating"]


def new_world() -> World:
    return World({team: secrets.token_hex(32) for team in (TEAM_A, TEAM_B, TEAM_OFF)})


# -- populate ---------------------------------------------------------------------------------------


def _database(cluster: Cluster, case: Case) -> dict[str, Any] | None:
    try:
        return cluster.rest.get(DATABASES, case.name, cluster.namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _wait(cluster: Cluster, case: Case, check: Any, what: str, timeout: float = 90) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        db = _database(cluster, case)
        return db if db is not None and check(db) else None

    return wait_for(probe, timeout, f"{case.external_id}: {what}")


def _phase(db: dict[str, Any]) -> str | None:
    return (db.get("status") or {}).get("phase")


def _ok(answer: Answer, *codes: int) -> Answer:
    assert answer.status in codes, f"{answer.status}: {answer.body}"
    return answer


def set_accepting(cluster: Cluster, accepting: bool) -> None:
    for shard in cluster.shard_servers:
        cluster.rest.patch(SHARDS, shard, {"spec": {"accepting": accepting}})


def wait_shards_ready(cluster: Cluster, timeout: float = 90) -> None:
    for shard in cluster.shard_servers:
        wait_for(
            lambda s=shard: (condition(cluster.rest.get(SHARDS, s), "Ready") or {}).get("status") == "True",
            timeout,
            f"shard {shard} Ready",
        )


def populate(cluster: Cluster, world: World) -> None:
    """Databases in every phase, made through the release that runs now (see the module docstring)."""
    wait_shards_ready(cluster)
    plan = [
        Case("ready-a1", TEAM_A, "Ready", "Provisioned"),
        Case("ready-a2", TEAM_A, "Ready", "Provisioned"),
        Case("ready-b1", TEAM_B, "Ready", "Provisioned"),
        Case("legacy", TEAM_A, "Ready", "Provisioned"),
        Case("rotating", TEAM_A, "Ready", "AdminUnavailable"),
        Case("deleting", TEAM_A, "Deleting", "Deleting", {"TenantDisabled": "True"}),
        Case("held", TEAM_B, "Ready", "Provisioned", {"DeletionHeld": "True"}),
    ]
    for case in plan:
        _ok(
            cluster.call(
                world.tokens[case.consumer], "PUT", f"/v1/databases/{case.external_id}", json={"sizeClass": "small"}
            ),
            201,
        )
        world.cases[case.external_id] = case
    for case in plan:
        _wait(cluster, case, lambda db: _phase(db) == "Ready", "Ready")

    # A tenant made by a build before ownership records existed: no comment on its role.
    legacy = world.cases["legacy"]
    legacy.status = _database(cluster, legacy)["status"]
    with _superuser(cluster, legacy) as su:
        su.execute(sql.SQL("COMMENT ON ROLE {} IS NULL").format(sql.Identifier(legacy.tenant)))

    _ok(cluster.call(world.tokens[TEAM_A], "DELETE", "/v1/databases/deleting"), 202)
    _wait(
        cluster,
        world.cases["deleting"],
        lambda db: _phase(db) == "Deleting" and (condition(db, "TenantDisabled") or {}).get("status") == "True",
        "Deleting, disabled",
    )

    held = world.cases["held"]
    cluster.rest.delete(DATABASES, held.name, cluster.namespace)  # kubectl delete, no annotation
    _wait(cluster, held, lambda db: (condition(db, "DeletionHeld") or {}).get("status") == "True", "DeletionHeld")

    # The rotation: the tenant keeps its own role row locked, so ALTER ROLE ... PASSWORD waits and
    # fails with lock_timeout, and is retried, until the tenant lets go (after the upgrade).
    rotating = world.cases["rotating"]
    rotating.status = _database(cluster, rotating)["status"]
    creds = rotating.before_rotation = credentials_of(cluster, rotating)
    world.blocker = psycopg.connect(
        host="127.0.0.1",
        port=int(creds["port"]),
        user=creds["user"],
        password=creds["password"],
        dbname=creds["database"],
        sslmode="require",
        autocommit=False,
    )
    world.blocker.execute(
        sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(rotating.tenant), sql.Literal(secrets.token_hex(8)))
    )
    _ok(cluster.call(world.tokens[TEAM_A], "POST", "/v1/databases/rotating/credentials/rotate", json={}), 202)
    _wait(
        cluster,
        rotating,
        lambda db: (condition(db, "Ready") or {}).get("reason") == "AdminUnavailable",
        "rotation pending (lock_timeout)",
        timeout=120,
    )

    # No capacity: every shard drained, then one more database.
    set_accepting(cluster, False)
    nocap = Case("nocapacity", TEAM_B, "Failed", "NoCapacity")
    world.cases[nocap.external_id] = nocap
    _ok(cluster.call(world.tokens[TEAM_B], "PUT", "/v1/databases/nocapacity", json={}), 201)
    _wait(cluster, nocap, lambda db: _phase(db) == "Failed", "Failed/NoCapacity")

    for case in world.cases.values():
        db = _database(cluster, case)
        case.status = db["status"]
        case.credentials = credentials_of(cluster, case)


def credentials_of(cluster: Cluster, case: Case) -> dict[str, str] | None:
    try:
        return decoded(cluster.rest.get(SECRETS, f"{case.name}-credentials", cluster.namespace))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


class _superuser:  # noqa: N801 - a context manager, used like a function
    def __init__(self, cluster: Cluster, case: Case) -> None:
        self.server = cluster.shard_servers[case.status["shard"]]

    def __enter__(self) -> psycopg.Connection:
        self.conn = self.server.superuser_connection()
        return self.conn

    def __exit__(self, *exc: object) -> None:
        self.conn.close()


def release_rotation_blocker(world: World) -> None:
    """The tenant ends its transaction (rolled back): the pending rotation can go through."""
    if world.blocker is not None:
        world.blocker.rollback()
        world.blocker.close()
        world.blocker = None


def mark_statement_logs(cluster: Cluster, world: World) -> None:
    """From here on, `unannounced_sql` looks at what the shards receive."""
    world.statement_offsets = {name: len(server.statement_log()) for name, server in cluster.shard_servers.items()}


# -- invariants -------------------------------------------------------------------------------------


_KEPT_STATUS = ("shard", "tenantName", "dropAfter", "appliedConnectionLimit", "appliedSizeClass", "passwordApplied")


def kept(cluster: Cluster, world: World, *, rotation_done: bool = False) -> list[str]:
    """Every way the databases, their credentials and the consumers' view differ from before."""
    problems: list[str] = []
    for case in world.cases.values():
        db = _database(cluster, case)
        if db is None:
            problems.append(f"{case.external_id}: the Database is gone")
            continue
        status = db.get("status") or {}
        ready = condition(db, "Ready") or {}
        want_reason = "Provisioned" if case.external_id == "rotating" and rotation_done else case.reason
        if status.get("phase") != case.phase or ready.get("reason") != want_reason:
            problems.append(
                f"{case.external_id}: {status.get('phase')}/{ready.get('reason')}, was {case.phase}/{want_reason}"
            )
        for key in _KEPT_STATUS:
            if key == "passwordApplied" and case.external_id == "rotating" and rotation_done:
                continue
            if status.get(key) != case.status.get(key):
                problems.append(f"{case.external_id}: status.{key} {status.get(key)!r}, was {case.status.get(key)!r}")
        for type_, value in case.conditions.items():
            if (condition(db, type_) or {}).get("status") != value:
                problems.append(f"{case.external_id}: condition {type_} is not {value}")
        problems += _credentials_kept(cluster, case, rotation_done)
    problems += _consumers_see_their_databases(cluster, world)
    return problems


def _credentials_kept(cluster: Cluster, case: Case, rotation_done: bool) -> list[str]:
    now = credentials_of(cluster, case)
    if case.credentials is None:
        return [] if now is None else [f"{case.external_id}: a credentials Secret appeared"]
    if now is None:
        return [f"{case.external_id}: the credentials Secret is gone"]
    rotated = case.external_id == "rotating"
    if rotated and rotation_done:
        assert case.before_rotation is not None
        problems = [] if now["password"] != case.before_rotation["password"] else [f"{case.external_id}: not rotated"]
        why = logs_in(now)
        old = logs_in(case.before_rotation)
        if why is not None:
            problems.append(f"{case.external_id}: the rotated password does not log in ({why})")
        if old is None:
            problems.append(f"{case.external_id}: the old password still logs in after the rotation")
        return problems
    if _endpoint(now) != _endpoint(case.credentials):
        return [f"{case.external_id}: the credentials Secret changed"]
    if not rotated and now["password"] != case.credentials["password"]:
        return [f"{case.external_id}: the password changed"]
    if case.phase == "Ready" and not rotated:
        why = logs_in(now)
        if why is not None:
            return [f"{case.external_id}: its credentials do not log in ({why})"]
    if case.phase == "Deleting" and logs_in(now) is None:
        return [f"{case.external_id}: a disabled tenant logs in"]
    return []


def _endpoint(credentials: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in credentials.items() if k != "password"}


def _consumers_see_their_databases(cluster: Cluster, world: World) -> list[str]:
    problems = []
    for team, token in world.tokens.items():
        answer = cluster.call(token, "GET", "/v1/databases")
        if team == TEAM_OFF:
            if answer.status != 401:
                problems.append(f"{team} (disabled): {answer.status}, not 401")
            continue
        if answer.status != 200:
            problems.append(f"{team}: GET /v1/databases answered {answer.status}")
            continue
        seen = {item["externalId"]: item["phase"] for item in answer.body["items"]}
        expected = {c.external_id: c.phase for c in world.cases.values() if c.consumer == team}
        if seen != expected:
            problems.append(f"{team}: sees {seen}, expected {expected}")
    one = world.cases["ready-a1"]
    answer = cluster.call(world.tokens[TEAM_A], "GET", "/v1/databases/ready-a1/credentials")
    if answer.status != 200 or answer.body.get("password") != (one.credentials or {}).get("password"):
        problems.append(f"ready-a1: credentials through the API: {answer.status}")
    return problems


def unannounced_sql(cluster: Cluster, world: World) -> list[str]:
    """Statements about Ready databases' tenants since `mark_statement_logs` that CHANGELOG.md does
    not announce (or announced ones run more often than it says)."""
    problems = []
    for shard, server in cluster.shard_servers.items():
        text = server.statement_log()[world.statement_offsets.get(shard, 0) :]
        statements = parse_statement_log(text, server.PROVISIONER)
        for case in world.ready():
            if case.status.get("shard") != shard:
                continue
            problems += _check_tenant_sql(case, [s for s in statements if _about(s, case.tenant)])
    return problems


def _about(statement: LoggedStatement, tenant: str) -> bool:
    word = rf"(?<![a-z0-9_]){re.escape(tenant)}(?![a-z0-9_])"
    return re.search(word, statement.text + statement.parameters) is not None


def _check_tenant_sql(case: Case, statements: list[LoggedStatement]) -> list[str]:
    counts: Counter[str] = Counter()
    problems = []
    for statement in statements:
        kind = next((k for k, (pattern, _) in ANNOUNCED_READY_SQL.items() if pattern.match(statement.text)), None)
        if kind is None:
            problems.append(f"{case.external_id}: unannounced SQL: {statement.text[:120]}")
            continue
        counts[kind] += 1
    for kind, n in counts.items():
        if n > ANNOUNCED_READY_SQL[kind][1]:
            problems.append(f"{case.external_id}: {kind} ran {n} times")
    return problems


# -- a client calling all the time ------------------------------------------------------------------


class Poller(Background):
    """Calls the API through the Service every `interval` seconds (a list and one database's
    credentials, in turn) until stopped; every answer must be a 200."""

    join_timeout = 30.0

    def __init__(self, cluster: Cluster, token: str, external_id: str, interval: float = 0.2) -> None:
        super().__init__()
        self.cluster = cluster
        self.token = token
        self.paths = ["/v1/databases", f"/v1/databases/{external_id}/credentials"]
        self.interval = interval
        self.answers: list[tuple[float, str, int, str]] = []  # (sent at, path, status, replica)

    def run(self) -> None:
        turn = 0
        while not self.stopping.is_set():
            path = self.paths[turn % len(self.paths)]
            sent = time.monotonic()
            answer = self.cluster.call(self.token, "GET", path)
            self.answers.append((sent, path, answer.status, getattr(answer, "replica", "")))
            turn += 1
            self.stopping.wait(self.interval)

    def failures(self) -> list[tuple[float, str, int, str]]:
        return [a for a in self.answers if a[2] != 200]


# -- kubectl get ------------------------------------------------------------------------------------

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def kubectl_get(cluster: Cluster, version: str) -> dict[str, list[str]]:
    """What `kubectl get <kind>` shows for each kind in `version`: the column names (the apiserver's
    Table, from the CRD's printer columns), then the row names; AssertionError if a kind is not served."""
    shown = {}
    for plural, namespaced in (("shards", False), ("consumers", False), ("databases", True)):
        path = f"/apis/db.bnerd.com/{version}/" + (f"namespaces/{cluster.namespace}/" if namespaced else "") + plural
        status, table = _get_table(cluster.rest, path)
        assert status == 200 and table.get("kind") == "Table", f"kubectl get {plural}.{version}: HTTP {status}"
        columns = [c["name"] for c in table["columnDefinitions"]]
        shown[plural] = columns + sorted(r["object"]["metadata"]["name"] for r in table["rows"])
    return shown


def _get_table(rest: Rest, path: str) -> tuple[int, dict[str, Any]]:
    """GET `path` as kubectl does (asking for a Table); (HTTP status, body)."""
    client = rest.api_client
    method, url, headers, body, _ = client.param_serialize(
        "GET", path, header_params={"Accept": TABLE}, auth_settings=["BearerToken"]
    )
    response = client.call_api(method, url, headers, body, None, _request_timeout=30)
    try:
        data = response.read()
    finally:
        response.response.release_conn()
    try:
        return response.status, json.loads(data) if data else {}
    except ValueError:  # "404 page not found": a version not served
        return response.status, {}
