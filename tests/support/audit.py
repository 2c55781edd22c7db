"""Who wrote what, when: the apiserver's audit log of a control plane of a suite's own, and when each
manager process led (its own log). Suites that check "no write without the Lease" read these."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from harness import KubeControlPlane
from tests.support.manager_process import ManagerProcess

CONTROLLER_AGENT = "dbprovider-controllers/"  # + replica name: the controllers' writes (User-Agent)
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}

AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: None
    verbs: ["get", "list", "watch"]
  - level: Metadata
"""


def audited_control_plane(kube_dir: Path) -> tuple[KubeControlPlane, Path]:
    """A started kube-apiserver + etcd in `kube_dir` that logs every write (blocking), and its log."""
    kube_dir.mkdir(parents=True)
    policy = kube_dir / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    audit_log = kube_dir / "audit.log"
    kube = KubeControlPlane(
        workdir=kube_dir,
        extra_args=[f"--audit-policy-file={policy}", f"--audit-log-path={audit_log}", "--audit-log-mode=blocking"],
    ).start()
    return kube, audit_log


@dataclass(frozen=True)
class Write:
    """One write a replica sent: an apiserver request or a SQL statement, with its wall-clock time."""

    replica: str
    when: datetime
    what: str


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def controller_writes(audit_log: Path) -> list[Write]:
    """The controllers' apiserver writes that were applied (2xx; the Lease itself excluded);
    `what` is "<verb> <resource>[/<subresource>]/<name>"."""
    writes = []
    for line in audit_log.read_text(errors="replace").splitlines():
        entry = json.loads(line)
        agent = entry.get("userAgent") or ""
        ref = entry.get("objectRef") or {}
        applied = 200 <= ((entry.get("responseStatus") or {}).get("code") or 0) < 300  # a 409 changed nothing
        if agent.startswith(CONTROLLER_AGENT) and entry.get("verb") in WRITE_VERBS and ref.get("resource") != "leases":
            if not applied:
                continue
            resource = ref.get("resource") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            writes.append(
                Write(
                    agent[len(CONTROLLER_AGENT) :],
                    parse_time(entry["requestReceivedTimestamp"]),
                    f"{entry['verb']} {resource}/{ref.get('name')}",
                )
            )
    return writes


def leading_intervals(replica: ManagerProcess) -> list[tuple[datetime, datetime | None]]:
    """[started leading, stopped leading) of one replica, from its own log."""
    intervals: list[tuple[datetime, datetime | None]] = []
    for event in replica.events():
        message = event.get("message", "")
        if message.endswith(": started leading"):
            intervals.append((parse_time(event["time"]), None))
        elif message.endswith(": stopped leading") and intervals and intervals[-1][1] is None:
            intervals[-1] = (intervals[-1][0], parse_time(event["time"]))
    return intervals
