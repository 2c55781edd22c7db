"""The controllers of one `dbprovider manager` replica, run in the test process.

Wired by `register_controllers` exactly as the manager does, with short Lease timings, shard pings
every 2 s, the admin host pointed at the local test servers and the harness servers' CA as the
shard CA bundle (what shardTLS.caBundle mounts in a pod). Shared by the reconciler and
Cloudberry suites, which differ only in their release (namespace, Lease name, install config).
"""

from __future__ import annotations

from typing import TypedDict

from kubernetes.client import ApiClient

from domain.admin_access import OutsidePod
from domain.config import InstallConfig
from harness.postgres import shard_ca
from reconciler.runtime import ControllerManager
from reconciler.setup import Controllers, register_controllers
from tests.support.common import wait_for


class ReplicaOptions(TypedDict, total=False):
    """What a test may choose of a replica, by keyword; InProcessManager holds the defaults."""

    shard_ca_file: str | None
    shard_ping_interval: float


class InProcessManager:
    def __init__(
        self,
        client: ApiClient,
        config: InstallConfig,
        namespace: str,
        lease_name: str,
        identity: str,
        shard_ca_file: str | None = None,
        shard_ping_interval: float = 2.0,
    ) -> None:
        self.manager = ControllerManager(
            client,
            lease_namespace=namespace,
            lease_name=lease_name,
            identity=identity,
            lease_duration=4.0,
            renew_deadline=3.0,
            retry_period=0.5,
        )
        self.controllers: Controllers = register_controllers(
            self.manager,
            config,
            namespace,
            instance=identity,
            outside_pod=OutsidePod("127.0.0.1", shard_ca_file or str(shard_ca().ca_file)),
            shard_ping_interval=shard_ping_interval,
        )

    def start(self, wait_leading: bool = True) -> InProcessManager:
        self.manager.start()
        if wait_leading:
            # Its controllers started too (each one's first full pass queued): a test that counts passes
            # or events afterwards must not meet that pass.
            wait_for(self.manager.controllers_running, timeout=30, what="the manager to lead")
        return self

    def stop(self) -> None:
        self.manager.stop(timeout=30)
        self.controllers.close()

    def errors(self, controller: str, reason: str, retryable: str | None = None) -> float:
        """dbprovider_reconcile_errors_total{controller, reason}: how often a key failed for it
        (`retryable` "true": retried with backoff, "false": terminal; None: both)."""
        return sum(
            self.manager.metrics.registry.get_sample_value(
                "dbprovider_reconcile_errors_total", {"controller": controller, "reason": reason, "retryable": value}
            )
            or 0.0
            for value in ((retryable,) if retryable else ("true", "false"))
        )
