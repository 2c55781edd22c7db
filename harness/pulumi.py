"""The real Pulumi CLI, its Python language host and the Kubernetes provider, run as a platform engineer would.

hack/build-pulumi.sh builds the binaries from the Go module proxy (pinned in hack/pulumi/*/go.mod) and
fetches the Prometheus Operator's CRDs (read through harness.prometheus_operator); hack/setup.sh runs it.
Each `PulumiWorkspace` is isolated: its own PULUMI_HOME, a file:// state backend, HOME (for `~/.kube/...`
in documented commands) and KUBECONFIG, and no PULUMI_* variable of the caller leaks in. Plugins are never
downloaded: the binaries on PATH are used.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.process import built_dir

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-pulumi.sh"
BINARIES = ("pulumi", "pulumi-language-python", "pulumi-language-python-exec", "pulumi-resource-kubernetes")
# Only protects the throwaway state of a test stack.
TEST_PASSPHRASE = "dbprovider-test-stack"


class MissingPulumiError(RuntimeError):
    """The Pulumi binaries have not been built yet."""


def binaries_dir() -> Path:
    """Where hack/build-pulumi.sh puts the binaries (DBPROVIDER_PULUMI_BIN overrides)."""
    return built_dir(BUILD_SCRIPT, "DBPROVIDER_PULUMI_BIN", late="pulumi")


class PulumiWorkspace:
    """A Pulumi project directory plus the environment every `pulumi` command of one test run shares."""

    def __init__(self, workdir: Path, project_dir: Path, kubeconfig: Path, bin_dir: Path | None = None) -> None:
        self.bin_dir = bin_dir or binaries_dir()
        missing = [name for name in BINARIES if not os.access(self.bin_dir / name, os.X_OK)]
        if missing:
            raise MissingPulumiError(
                f"{', '.join(missing)} not found in {self.bin_dir}: run `bash hack/setup.sh` (hack/build-pulumi.sh "
                "builds them from the Go module proxy; a cold build takes about half an hour of CPU)"
            )
        self.project_dir = project_dir
        self.home = workdir / "home"
        state = workdir / "state"
        for directory in (self.home, state, workdir / "pulumi-home"):
            directory.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PULUMI_") and k != "KUBECONFIG"}
        venv_bin = Path(sys.executable).parent
        env.update(
            HOME=str(self.home),
            PATH=os.pathsep.join([str(self.bin_dir), str(venv_bin), env.get("PATH", "")]),
            KUBECONFIG=str(kubeconfig),
            PULUMI_HOME=str(workdir / "pulumi-home"),
            PULUMI_BACKEND_URL=f"file://{state}",
            PULUMI_CONFIG_PASSPHRASE=TEST_PASSPHRASE,
            PULUMI_SKIP_UPDATE_CHECK="1",
            PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION="true",
            # The language host of sdk v3.79.0 never receives Pulumi.yaml's runtime options from this CLI.
            PULUMI_PYTHON_CMD=sys.executable,
            NO_COLOR="1",
        )
        self.env = env

    def shell(self, command: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Run one shell command line (as written in the docs) in the project directory."""
        return subprocess.run(
            ["bash", "-c", command],
            cwd=self.project_dir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def pulumi(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """`pulumi <args>` in the project directory; the caller checks returncode."""
        return subprocess.run(
            [str(self.bin_dir / "pulumi"), *args, "--color=never"],
            cwd=self.project_dir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def ok(self, *args: str, timeout: float = 600) -> str:
        """`pulumi <args>`, which must succeed; returns stdout."""
        result = self.pulumi(*args, timeout=timeout)
        if result.returncode != 0:
            raise AssertionError(f"pulumi {' '.join(args)} exited {result.returncode}:\n{output(result)}")
        return result.stdout


def output(result: subprocess.CompletedProcess[str]) -> str:
    """stdout and stderr of a command, for messages and assertions on what the user reads."""
    return f"{result.stdout}\n{result.stderr}"
