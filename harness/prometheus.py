"""A real Prometheus server (the Debian `prometheus` binary) on loopback, for the alert tests.

One class for the three roles the docs describe: an agent that scrapes and remote-writes, a central
server that receives remote_write and evaluates rules, and a server that scrapes and evaluates itself.
The process dies with the test process (harness.process.spawn) and its storage is a temp directory.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import requests
import yaml

from harness.process import free_port, spawn, stop, wait_for_port


class PrometheusNotFound(RuntimeError):
    """The `prometheus` binary is missing (hack/setup.sh installs the Debian package)."""


class PrometheusServer:
    def __init__(
        self,
        workdir: Path,
        config: dict[str, Any],
        rule_files: dict[str, str] | None = None,
        agent: bool = False,
        remote_write_receiver: bool = False,
    ) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise PrometheusNotFound("prometheus not found: install the Debian package `prometheus`")
        self.binary = binary
        self.workdir = workdir
        self.agent = agent
        self.remote_write_receiver = remote_write_receiver
        self.port = free_port()
        self.log = workdir / "prometheus.log"
        workdir.mkdir(parents=True, exist_ok=True)
        files = []
        for name, text in (rule_files or {}).items():
            (workdir / name).write_text(text)
            files.append(str(workdir / name))
        self.config = {**config, **({"rule_files": files} if files else {})}
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(self.config, sort_keys=False))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> PrometheusServer:
        argv = [
            self.binary,
            f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        if self.agent:
            argv += ["--enable-feature=agent", f"--storage.agent.path={self.workdir / 'data'}"]
        else:
            argv += [f"--storage.tsdb.path={self.workdir / 'data'}"]
        if self.remote_write_receiver:
            argv.append("--web.enable-remote-write-receiver")
        self.proc = spawn(argv, self.log)
        wait_for_port(self.port, timeout, self.proc, self.log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"prometheus on {self.port} not ready: {self.log.read_text()[-2000:]}")

    def close(self) -> None:
        stop(self.proc, signal.SIGTERM)
        self.proc = None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def api(self, path: str, **params: Any) -> Any:
        """GET /api/v1/<path>; returns `data` (raises on an error status)."""
        response = requests.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = response.json()
        if body.get("status") != "success":
            raise RuntimeError(f"{path}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def alerts(self) -> list[dict[str, Any]]:
        alerts: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return alerts

    def rules(self) -> list[dict[str, Any]]:
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]
