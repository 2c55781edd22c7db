"""One `dbprovider manager` process of a DevStack, as the end-to-end suites run it.

    replica = ManagerReplica(stack, "replica-a", tmp_path)     # started; its log in tmp_path/replica-a.log
    replica.wait_ready()
    replica.call("PUT", "/v1/databases/orders")                # the stack's token unless token= is given
    replica.stop(signal.SIGKILL)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import requests

from dbprovider.devstack import DevStack, free_port
from tests.support.common import wait_for

REPO = Path(__file__).resolve().parents[2]


class ManagerReplica:
    def __init__(
        self, stack: DevStack, name: str, log_dir: Path, args: tuple[str, ...] = (), env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.api_port, self.metrics_port = free_port(), free_port()
        self.log = log_dir / f"{name}.log"
        env = {**os.environ, **stack.manager_env(), "POD_NAME": name, **(env or {})}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [*stack.manager_argv(sys.executable, self.api_port, self.metrics_port), *args],
                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO,
            )
        self.ca = str(stack.ca_file)
        self.token = stack.token

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.api_port}{path}"

    def call(
        self, method: str, path: str, token: str | None = None, timeout: float = 10, **kwargs
    ) -> requests.Response:
        headers = {"Authorization": f"Bearer {token or self.token}"}
        return requests.request(method, self.url(path), headers=headers, verify=self.ca, timeout=timeout, **kwargs)

    def metrics(self) -> str:
        return requests.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text

    def wait_ready(self, timeout: float = 60) -> None:
        def ready() -> bool:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                return requests.get(self.url("/readyz"), verify=self.ca, timeout=2).status_code == 200
            except requests.RequestException:
                return False

        try:
            wait_for(ready, timeout, f"{self.name} to be ready")
        except AssertionError as exc:
            raise AssertionError(f"{self.name} not ready: {self.log.read_text()[-2000:]}") from exc

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)
