"""One `dbprovider manager` process of a DevStack, as the end-to-end suites run it (this release, the
stack's config and kubeconfig; ports, log and stopping are ManagerProcess's).

    replica = ManagerReplica(stack, "replica-a", tmp_path)     # started; its log in tmp_path/replica-a.log
    replica.wait_ready()
    replica.call("PUT", "/v1/databases/orders")                # the stack's token unless token= is given
    replica.kill()                                             # or stop(): SIGTERM, the Lease released
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import requests

from dbprovider.devstack import DevStack
from tests.support.manager_process import ManagerProcess

REPO = Path(__file__).resolve().parents[2]


class ManagerReplica(ManagerProcess):
    """See the module docstring. `args` are appended to the stack's manager command line, `env` to its
    environment; `kubeconfig` replaces the stack's (a replica that reaches the apiserver through a proxy)."""

    call_timeout = 10.0  # seconds a call waits for its answer unless told otherwise

    def __init__(
        self,
        stack: DevStack,
        name: str,
        log_dir: Path,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        kubeconfig: Path | None = None,
    ) -> None:
        super().__init__(name, log_dir / f"{name}.log", str(stack.ca_file))
        self.token = stack.token
        argv = [*stack.manager_argv(sys.executable, self.api_port, self.metrics_port), *args]
        if kubeconfig is not None:
            argv[argv.index("--kubeconfig") + 1] = str(kubeconfig)
        self.spawn(argv, {**os.environ, **stack.manager_env(), **(env or {})}, REPO)

    def call(
        self, method: str, path: str, token: str | None = None, timeout: float | None = None, **kwargs: Any
    ) -> requests.Response:
        headers = {"Authorization": f"Bearer {token or self.token}"}
        return requests.request(
            method, self.url(path), headers=headers, verify=self.ca, timeout=timeout or self.call_timeout, **kwargs
        )

    @property
    def exit_code(self) -> int | None:
        return self.proc.poll()
