"""One `dbprovider manager` subprocess of a test: its ports, its JSON log, and how it is stopped.

The suites that run replicas as processes (tests/faults, tests/upgrade) say how to start one (which
release, config, kubeconfig); the rest is here. The replica's name is its Lease identity (POD_NAME).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import requests

from harness.manager_endpoints import ManagerEndpoints
from tests.support.common import wait_for


class ManagerProcess(ManagerEndpoints):
    def __init__(self, name: str, log: Path, ca: str) -> None:
        super().__init__()
        self.name = name
        self.log = log
        self.ca = ca
        self.paused = False
        self.proc: subprocess.Popen[bytes]

    def spawn(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        """Start it (output to the log, a session of its own, so signals reach only it)."""
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**env, "POD_NAME": self.name},
                cwd=cwd,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def readyz(self) -> int:
        """/readyz's status, 0 without an answer."""
        try:
            return requests.get(self.url("/readyz"), verify=self.ca, timeout=3).status_code
        except requests.RequestException:
            return 0

    def wait_ready(self, timeout: float = 90) -> None:
        def ready() -> bool:
            assert self.proc.poll() is None, f"{self.name} exited: {self.log.read_text()[-3000:]}"
            return self.readyz() == 200

        wait_for(ready, timeout, f"{self.name} /readyz 200")

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        if self.paused:
            self.resume()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM (the Lease is released), SIGKILL if it does not exit within 60 s."""
        if self.paused:
            self.resume()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)

    def events(self) -> Iterator[dict[str, Any]]:
        """The JSON log lines (anything else, e.g. a Python warning, is skipped)."""
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    yield json.loads(line)
                except ValueError:
                    continue
