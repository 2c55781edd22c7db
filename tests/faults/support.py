"""The fault suite's stack and its one invariant checker.

`FaultStack` owns every process it starts: a kube-apiserver + etcd (with an audit log of every
write), two PostgreSQL 18 shards (with a log of every statement) and `dbprovider manager`
replicas (subprocesses, JSON logs). Tests inject a fault on those PIDs, undo it, and call
`check_invariants`, which waits until every Database has reached the phase the test expects and
then proves from the shards, the Secrets, the statement logs and the audit log that nothing was
lost, orphaned or done twice, and that no replica wrote after it lost the Lease.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import requests
import yaml
from kubernetes.client.exceptions import ApiException

from domain.constants import ANNOTATION_ROTATE_REQUESTED_AT, LABEL_CONSUMER
from domain.resources import CONSUMERS, DATABASES, SHARDS
from harness import KubeControlPlane, PostgresServer
from harness.statement_log import parse_statement_log
from harness.tcp_proxy import TcpProxy
from informers import EVENTS, LEASES, SECRETS, Rest
from informers.leader import lease_holder
from tests.support.audit import Write, audited_control_plane, controller_writes, leading_intervals, parse_time
from tests.support.common import b64, decoded, wait_for
from tests.support.devstack import install_stack
from tests.support.logins import logs_in
from tests.support.replica import ManagerReplica

RELEASE = "faults"
NAMESPACE = "faults-system"
CONSUMER = "faults-consumer"
LEASE = f"{RELEASE}-manager"
SHARD_A, SHARD_B = "faults-pg-a", "faults-pg-b"
SHARD_SECRETS_NAMESPACE = f"{NAMESPACE}-shards"  # where DevStack keeps the admin Secrets
SQL_APP = "dbprovider/"  # + replica name: the application_name of every admin session
# A statement already on the wire when a replica logs "stopped leading" (shutdown) lands a little later.
IN_FLIGHT = 1.0

# One measured row per fault and quantity, printed at the end of the run (see conftest) and written
# to $DBPROVIDER_FAULT_TIMINGS if set: docs/reliability.md quotes these numbers.
TIMINGS: list[dict[str, Any]] = []


def record(fault: str, what: str, seconds: float) -> None:
    TIMINGS.append({"fault": fault, "what": what, "seconds": round(seconds, 1)})


def timed(check: Callable[[], Any], timeout: float, what: str) -> float:
    """Seconds until `check` holds (polled at most every 0.5 s)."""
    start = time.monotonic()
    wait_for(check, timeout, what)
    return time.monotonic() - start


# -- processes ---------------------------------------------------------------------------------


class Replica(ManagerReplica):
    """One `dbprovider manager` subprocess of the stack; its name is its Lease identity and application_name.
    A call waits longer for its answer: under a fault the answer may be slow to come."""

    call_timeout = 15.0


# -- the stack ---------------------------------------------------------------------------------


@dataclass
class FaultStack:
    root: Path
    kube: KubeControlPlane = field(init=False)
    shards: dict[str, PostgresServer] = field(default_factory=dict)
    replicas: list[Replica] = field(default_factory=list)
    # externalId -> "Ready" or "gone": what every Database of the consumer must reach
    expected: dict[str, str] = field(default_factory=dict)
    # problems an invariant check has reported already (they failed that fault's test)
    reported: set[str] = field(default_factory=set)
    # replicas whose link to the apiserver a fault cut: an Event they made while leading may be
    # held by the partition and arrive whenever the link is back (see fencing_violations)
    cut_off: set[str] = field(default_factory=set)
    # proxies a test put in front of the shards (slow_shard_links): closed with the stack
    proxies: list[TcpProxy] = field(default_factory=list)

    def start(self) -> FaultStack:
        self.kube, self.audit_log = audited_control_plane(self.root / "kube")
        # Every statement when it arrives, and a duration line once it completed: a statement cut
        # off by a crash has none, so the DDL count sees what took effect. And durable commits, as
        # on a real shard (durable=True: synchronous_commit=on, see harness.postgres).
        logged = {"log_min_duration_statement": "0"}
        self.shards = {
            SHARD_A: PostgresServer("18", log_statements=True, settings=logged, durable=True).start(),
            SHARD_B: PostgresServer("18", log_statements=True, settings=logged, durable=True).start(),
        }
        self.dev = install_stack(
            self.kube,
            self.shards[SHARD_A],
            self.root / "stack",
            RELEASE,
            shard=SHARD_A,
            softDelete={"retention": "0"},
            # The suite keeps every database it makes (well over 100 on two servers of 200
            # connections): with a limit of 1 each they all fit the shards' connection budgets.
            sizeClasses={"small": {"connectionLimit": 1}},
            shardSecrets=[
                {"namespace": SHARD_SECRETS_NAMESPACE, "name": f"{name}-provisioner"} for name in (SHARD_A, SHARD_B)
            ],
        )
        self._client = self.kube.admin_client()
        self.rest = Rest(self._client)
        self._second_shard()
        self.rest.patch(CONSUMERS, CONSUMER, {"spec": {"maxDatabases": 500}})
        return self

    def _second_shard(self) -> None:
        server = self.shards[SHARD_B]
        secret = f"{SHARD_B}-provisioner"
        self.rest.create(
            SECRETS,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret, "namespace": SHARD_SECRETS_NAMESPACE},
                "data": {
                    "user": b64(server.PROVISIONER),
                    "password": b64(server.provisioner_password),
                },
            },
            SHARD_SECRETS_NAMESPACE,
        )
        shard = self.rest.get(SHARDS, SHARD_A)
        spec = json.loads(json.dumps(shard["spec"]))
        spec["admin"].update(port=server.port, secretRef={"namespace": SHARD_SECRETS_NAMESPACE, "name": secret})
        spec["admin"]["serviceName"] = f"{SHARD_B}-primary"
        spec["client"]["port"] = server.port
        spec["perconaCluster"] = {"namespace": NAMESPACE, "name": SHARD_B}
        self.rest.create(
            SHARDS, {"apiVersion": shard["apiVersion"], "kind": "Shard", "metadata": {"name": SHARD_B}, "spec": spec}
        )

    def close(self) -> None:
        for replica in self.replicas:
            replica.kill()
        for proxy in self.proxies:
            proxy.close()
        for server in self.shards.values():
            server.thaw()  # a test that failed while a shard was frozen
            server.close()
        self._client.close()
        self.kube.close()

    @contextmanager
    def slow_shard_links(self, round_trip: float) -> Iterator[list[TcpProxy]]:
        """Both shards reached (admin and client endpoint) through a TcpProxy adding `round_trip` seconds,
        so that each database's SQL takes seconds: a fault injected once part of a burst is done surely
        lands while the rest is in flight (on a near link a fast machine may finish it all in between).
        Yields the proxies (a test sets their latency to 0 once the fault is in). On exit the Shards'
        own ports are restored; the proxies forward on until the stack closes, for a session or a check
        that still has the old port."""
        proxies = {name: TcpProxy("127.0.0.1", server.port).start() for name, server in self.shards.items()}
        self.proxies.extend(proxies.values())
        originals = {name: self.rest.get(SHARDS, name)["spec"] for name in proxies}
        for name, proxy in proxies.items():
            proxy.set_latency(round_trip)
            link = {"admin": {"port": proxy.port}, "client": {"port": proxy.port}}
            self.rest.patch(SHARDS, name, {"spec": link})
        try:
            yield list(proxies.values())
        finally:
            for name, spec in originals.items():
                own = {"admin": {"port": spec["admin"]["port"]}, "client": {"port": spec["client"]["port"]}}
                self.rest.patch(SHARDS, name, {"spec": own})

    # -- replicas ----------------------------------------------------------------------------

    def replica(self, name: str, kubeconfig: Path | None = None) -> Replica:
        """Start a replica and wait for /readyz 200. Its ports are picked free just before it binds
        them; on a busy machine another socket may take one meanwhile: then it starts again."""
        for _ in range(3):
            replica = Replica(self.dev, name, self.root, kubeconfig=kubeconfig)
            self.replicas.append(replica)
            try:
                replica.wait_ready()
                return replica
            except AssertionError:
                if replica.proc.poll() is None or "Address already in use" not in replica.log.read_text():
                    raise
        raise AssertionError(f"{name}: its ports were taken three times")

    def kubeconfig_through(self, port: int, name: str) -> Path:
        """The managers' kubeconfig, with the apiserver reached at 127.0.0.1:`port` (a TcpProxy)."""
        document = yaml.safe_load(self.dev.manager_kubeconfig.read_text())
        cluster = document["clusters"][0]["cluster"]
        cluster["server"] = re.sub(r":\d+$", f":{port}", cluster["server"])
        path = self.root / f"{name}.kubeconfig"
        path.write_text(yaml.safe_dump(document))
        path.chmod(0o600)
        return path

    def sessions_of(self, replica: Replica) -> int:
        """Open sessions of a replica on every shard (its application_name)."""
        total = 0
        for server in self.shards.values():
            with server.superuser_connection() as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (f"{SQL_APP}{replica.name}",)
                ).fetchone()
                total += row[0]
        return total

    def holder(self) -> str | None:
        try:
            return lease_holder(self.rest.get(LEASES, LEASE, NAMESPACE))
        except ApiException:
            return None

    def leader(self, timeout: float = 60) -> str:
        return wait_for(self.holder, timeout, "a Lease holder")

    def leading_burst(self, name: str, count: int) -> tuple[Replica, list[str]]:
        """Start replica `name`, wait until it leads, then create `count` databases through it."""
        replica = self.replica(name)
        assert self.leader() == name
        return replica, self.burst(replica, name, count)

    # -- consumer actions --------------------------------------------------------------------

    def put(self, replica: Replica, external_id: str, expect: tuple[int, ...] = (200, 201)) -> requests.Response:
        response = replica.call("PUT", f"/v1/databases/{external_id}", json={"sizeClass": "small"})
        assert response.status_code in expect, f"PUT {external_id}: {response.status_code} {response.text}"
        if response.status_code in (200, 201):
            self.expected[external_id] = "Ready"
        return response

    def put_until_accepted(self, replica: Replica, external_id: str, within: float = 30) -> float:
        """PUT as a client does after a 503 (the API's answer while the apiserver is slow or gone):
        again until it is accepted; the seconds that took."""
        started = time.monotonic()

        def accepted() -> bool:
            return self.put(replica, external_id, expect=(200, 201, 503)).status_code in (200, 201)

        wait_for(accepted, within, f"PUT {external_id} accepted")
        return time.monotonic() - started

    def burst(self, replica: Replica, prefix: str, count: int) -> list[str]:
        names = [f"{prefix}-{i}" for i in range(count)]
        for name in names:
            self.put(replica, name)
        return names

    def delete(self, replica: Replica, external_id: str) -> None:
        response = replica.call("DELETE", f"/v1/databases/{external_id}")
        assert response.status_code == 202, f"DELETE {external_id}: {response.status_code} {response.text}"
        self.expected[external_id] = "gone"

    # -- observation -------------------------------------------------------------------------

    def databases(self) -> dict[str, dict[str, Any]]:
        """The consumer's Database objects by externalId (live, from the apiserver)."""
        items = self.rest.list(DATABASES, NAMESPACE, query=[("labelSelector", f"{LABEL_CONSUMER}={CONSUMER}")])
        return {db["spec"]["externalId"]: db for db in items["items"]}

    def phases(self, names: list[str]) -> Counter[str]:
        dbs = self.databases()
        return Counter((dbs.get(n) or {}).get("status", {}).get("phase") or "absent" for n in names)

    def shard_ready(self, shard: str) -> bool:
        conditions = (self.rest.get(SHARDS, shard).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def shard_reason(self, shard: str) -> str | None:
        conditions = (self.rest.get(SHARDS, shard).get("status") or {}).get("conditions") or []
        return next((c["reason"] for c in conditions if c["type"] == "Ready"), None)


# -- the invariant checker ---------------------------------------------------------------------

_TENANT_DDL = re.compile(r'(CREATE ROLE|CREATE DATABASE|DROP ROLE IF EXISTS|DROP DATABASE IF EXISTS) "([^"]+)"')


def audit_writes(stack: FaultStack) -> list[Write]:
    """The controllers' apiserver writes that were applied (2xx; the Lease itself excluded)."""
    return controller_writes(stack.audit_log)


def statement_log(stack: FaultStack) -> list[tuple[datetime, str, str, str, bool]]:
    """(time, application_name, statement, shard, completed) of every statement the shards received.

    `completed`: the statement finished (the server logged its duration) and took effect. Inside an
    explicit transaction (BEGIN ... COMMIT, as psycopg's `conn.transaction()` sends them) a finished
    statement takes effect only with the COMMIT: a crash before it rolls the statement back, and the
    retry running it again is no second execution.
    """
    rows: list[tuple[datetime, str, str, str, bool]] = []
    for shard, server in stack.shards.items():
        open_tx: dict[int, list[int]] = {}  # backend pid -> finished statements of its open transaction
        for statement in parse_statement_log(server.statement_log()):
            index = len(rows)
            assert statement.time is not None
            rows.append((statement.time, statement.application, statement.text, shard, False))
            if not statement.finished:
                continue
            verb = statement.text.strip().rstrip(";").upper()
            if verb in ("BEGIN", "START TRANSACTION"):
                open_tx[statement.pid] = []
            elif verb in ("COMMIT", "END"):
                for done in open_tx.pop(statement.pid, []):
                    rows[done] = (*rows[done][:4], True)
            elif verb == "ROLLBACK":
                open_tx.pop(statement.pid, None)
            elif statement.pid in open_tx:
                open_tx[statement.pid].append(index)
                continue
            rows[index] = (*rows[index][:4], True)
    return rows


def sql_writes(stack: FaultStack) -> list[Write]:
    return [
        Write(app[len(SQL_APP) :], when, statement[:80])
        for when, app, statement, _, _ in statement_log(stack)
        if app.startswith(SQL_APP)
    ]


def fencing_violations(stack: FaultStack) -> list[str]:
    """Writes that broke the fence.

    - No write (SQL or apiserver) by a replica after another replica started leading later than it
      did: the Lease's safety, whatever was in flight. An Event that a replica in `stack.cut_off` made
      while it led (its firstTimestamp) is exempt, in the cut's check and every later one: a partition
      can hold an Event's request sent while leading and deliver it after the link is back, and Events
      carry no precondition (docs/reliability.md, "What is not covered"); every other write either
      did not arrive or failed its resourceVersion precondition.
    - No SQL by a replica outside its own leading intervals. (The apiserver's receive time is no
      proof for the apiserver writes: a paused apiserver receives a write sent while leading only
      after it resumes. The shards are not paused while leadership changes here.)
    """
    intervals = {r.name: leading_intervals(r) for r in stack.replicas}
    starts = sorted((start, name) for name, spans in intervals.items() for start, _ in spans)
    problems = []
    sql = sql_writes(stack)
    applied = audit_writes(stack)
    for write in applied + sql:
        latest = max(((s, n) for s, n in starts if s <= write.when), default=None)
        if latest is None or latest[1] != write.replica:
            if write.replica in stack.cut_off and write.what.startswith("create events/"):
                if _made_while_leading(stack, write, intervals):
                    continue
            holder = latest[1] if latest else None
            problems.append(f"{write.replica} at {write.when.isoformat()} ({write.what}); leader then: {holder}")
    for write in sql:
        inside = any(
            start <= write.when and (stop is None or (write.when - stop).total_seconds() <= IN_FLIGHT)
            for start, stop in intervals.get(write.replica, [])
        )
        if not inside:
            problems.append(f"{write.replica} at {write.when.isoformat()} ({write.what}) while not leading")
    return problems


def _made_while_leading(
    stack: FaultStack, write: Write, intervals: dict[str, list[tuple[datetime, datetime | None]]]
) -> bool:
    """The Event `write` created was made (its firstTimestamp, whole seconds) while its sender led:
    a request held by a partition, not one the fence should have stopped."""
    name = write.what.removeprefix("create events/")
    try:
        event = stack.rest.get(EVENTS, name, NAMESPACE)
    except ApiException:
        return False
    made = parse_time(event["firstTimestamp"])
    return any(
        start - timedelta(seconds=1) <= made and (stop is None or made <= stop)
        for start, stop in intervals.get(write.replica, [])
    )


def _shard_catalog(server: PostgresServer) -> tuple[set[str], set[str]]:
    """Tenant roles and databases on a shard (everything but the server's own)."""
    with server.superuser_connection() as conn:
        roles = {r[0] for r in conn.execute("SELECT rolname FROM pg_roles WHERE rolname !~ '^pg_'")}
        dbs = {r[0] for r in conn.execute("SELECT datname FROM pg_database")}
    return roles - {server.SUPERUSER, server.PROVISIONER}, dbs - {"postgres", "template0", "template1"}


def _logs_in(stack: FaultStack, db: dict[str, Any]) -> str | None:
    """None if the credentials Secret logs in to the database; else why not."""
    try:
        secret = stack.rest.get(SECRETS, f"{db['metadata']['name']}-credentials", NAMESPACE)
    except ApiException as exc:
        return f"Secret: HTTP {exc.status}"
    problem = logs_in(decoded(secret))
    return None if problem is None else f"login failed: {problem}"


def check_invariants(stack: FaultStack, fault: str, timeout: float = 150) -> float:
    """The one invariant check after every fault; returns the seconds until every Database reached
    its expected phase (recorded as the fault's recovery time)."""

    def converged() -> bool:
        dbs = stack.databases()
        for name, want in stack.expected.items():
            db = dbs.get(name)
            if want == "gone" and db is not None:
                return False
            if want == "Ready" and (db is None or (db.get("status") or {}).get("phase") != "Ready"):
                return False
            if want == "Ready":  # and no rotation pending: the Secret's password is the role's
                rotate = (db["metadata"].get("annotations") or {}).get(ANNOTATION_ROTATE_REQUESTED_AT)
                if rotate is not None and db["status"].get("rotationApplied") != rotate:
                    return False
        return True

    start = time.monotonic()
    try:
        wait_for(converged, timeout, "every Database to reach its expected phase")
    except AssertionError:
        dbs = stack.databases()
        stuck = {
            n: ((dbs.get(n) or {}).get("status") or {}).get("phase") or "absent"
            for n, want in stack.expected.items()
            if (want == "Ready") != (((dbs.get(n) or {}).get("status") or {}).get("phase") == "Ready")
        }
        raise AssertionError(f"{fault}: not converged after {timeout:.0f}s: {stuck}") from None
    elapsed = time.monotonic() - start
    dbs = stack.databases()

    # Every Ready database: its role and database on its shard, and its Secret logs in.
    catalogs = {name: _shard_catalog(server) for name, server in stack.shards.items()}
    for name, db in dbs.items():
        status = db.get("status") or {}
        if status.get("phase") != "Ready":
            continue
        roles, databases = catalogs[status["shard"]]
        tenant = status["tenantName"]
        assert tenant in roles and tenant in databases, f"{fault}: {name} Ready but {tenant} missing on its shard"
        problem = _logs_in(stack, db)
        assert problem is None, f"{fault}: {name} Ready but its Secret does not log in: {problem}"

    # No role or database on a shard without an object (retention is 0 here: nothing is retained).
    owned = {(db["status"].get("shard"), db["status"].get("tenantName")) for db in dbs.values() if db.get("status")}
    for shard, (roles, databases) in catalogs.items():
        orphans = {t for t in roles | databases if (shard, t) not in owned}
        assert not orphans, f"{fault}: orphaned tenants on {shard}: {sorted(orphans)}"

    # No tenant created or dropped twice (statements that took effect: a crash may cut one off, or
    # end its transaction before the COMMIT).
    ddl: Counter[tuple[str, str, str]] = Counter()
    for _, _, statement, shard, completed in statement_log(stack):
        for match in _TENANT_DDL.finditer(statement if completed else ""):
            ddl[(shard, match[1], match[2])] += 1
    twice = {f"{verb} {tenant} on {shard}": n for (shard, verb, tenant), n in ddl.items() if n > 1}
    twice = {k: n for k, n in twice.items() if k not in stack.reported}  # an earlier fault's, failed there
    stack.reported.update(twice)
    assert not twice, f"{fault}: tenant DDL ran more than once: {twice}"

    # No SQL and no apiserver write from a replica that did not hold the Lease.
    violations = [v for v in fencing_violations(stack) if v not in stack.reported]
    stack.reported.update(violations)
    assert not violations, f"{fault}: writes without the Lease: {violations[:10]}"
    return elapsed
