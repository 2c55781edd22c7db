"""Earlier releases of the provider, built from the git history, for the upgrade tests.

releases.yaml lists each release's version and commit. `build(release)` exports that commit with
`git archive` (never a copy of old code kept in the tree) and installs it, with the dependencies its
own pyproject.toml pins, into a virtualenv of its own, exactly as the image does (`pip install .`,
the templates beside it). The result is cached by version and commit under
`$DBPROVIDER_CACHE/releases/<version>-<commit>` (default `~/.cache/dbprovider`); one build at a time
(a file lock), so parallel test runs wait for the first instead of building twice.

A shallow clone may lack the release's commit: then the history is fetched (`git fetch --unshallow`)
before the export, so CI's checkout works whatever its depth.

    python -m harness.releases            # build the previous release (hack/setup.sh runs this)
    python -m harness.releases --dir      # where it is (or would be) cached
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

import yaml

from domain.version import parse_version

REPO = Path(__file__).resolve().parent.parent
RELEASES_FILE = REPO / "releases.yaml"
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class Release:
    """One entry of releases.yaml."""

    version: str
    commit: str
    date: str

    @property
    def version_tuple(self) -> tuple[int, int, int]:
        return parse_version(self.version)


def load_releases(path: Path = RELEASES_FILE) -> list[Release]:
    """Every release in releases.yaml, oldest first (ValueError if the file is malformed)."""
    data = yaml.safe_load(path.read_text())
    entries = data.get("releases") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path.name}: a non-empty list `releases` is required")
    releases = []
    for entry in entries:
        if not isinstance(entry, dict) or set(entry) != {"version", "commit", "date"}:
            raise ValueError(f"{path.name}: each release has exactly version, commit and date: {entry!r}")
        release = Release(str(entry["version"]), str(entry["commit"]), str(entry["date"]))
        parse_version(release.version)
        if not _COMMIT_RE.match(release.commit):
            raise ValueError(f"{path.name}: {release.version}: commit must be 40 lowercase hex digits")
        releases.append(release)
    versions = [r.version_tuple for r in releases]
    if versions != sorted(set(versions)):
        raise ValueError(f"{path.name}: releases must be listed oldest first, each version once")
    return releases


def previous_release(path: Path = RELEASES_FILE) -> Release:
    """The newest recorded release: the one this checkout upgrades from."""
    return load_releases(path)[-1]


def cache_root() -> Path:
    return Path(os.environ.get("DBPROVIDER_CACHE") or Path.home() / ".cache" / "dbprovider") / "releases"


@dataclass(frozen=True)
class BuiltRelease:
    """An installed earlier release: run its `dbprovider` like the image does."""

    release: Release
    root: Path

    @property
    def source(self) -> Path:
        return self.root / "src"

    @property
    def python(self) -> Path:
        return self.root / "venv" / "bin" / "python"

    @property
    def templates(self) -> Path:
        return self.source / "templates"

    def argv(self, *args: str) -> list[str]:
        """`dbprovider <args>` of this release (its console script, from its own virtualenv)."""
        return [str(self.root / "venv" / "bin" / "dbprovider"), *args]

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment its processes run with: its templates, and nothing of this checkout on the path."""
        env = dict(os.environ if base is None else base)
        for leak in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"):
            env.pop(leak, None)
        env["DBPROVIDER_TEMPLATES"] = str(self.templates)
        return env

    def run(self, *args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        """Run `dbprovider <args>` of this release to completion (outside any checkout)."""
        return subprocess.run(
            self.argv(*args),
            env=self.env(),
            cwd=self.root,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )


def build_dir(release: Release) -> Path:
    return cache_root() / f"{release.version}-{release.commit[:12]}"


def _git(*args: str, capture: bool = True) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=capture, check=False)


def ensure_commit(commit: str) -> None:
    """Make sure the checkout has `commit`; fetch the full history of a shallow clone if it lacks it."""
    if _git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0:
        return
    shallow = _git("rev-parse", "--is-shallow-repository").stdout.decode().strip() == "true"
    if shallow:
        print(f"releases: {commit[:12]} is not in this shallow clone; fetching the history", file=sys.stderr)
        fetched = _git("fetch", "--unshallow", "--no-tags", capture=False)
        if fetched.returncode == 0 and _git("cat-file", "-e", f"{commit}^{{commit}}").returncode == 0:
            return
    raise RuntimeError(
        f"commit {commit} (releases.yaml) is not in the git history of {REPO}"
        + (" (a shallow clone: `git fetch --unshallow` failed)" if shallow else "")
    )


def _export(commit: str, target: Path) -> None:
    """The tree of `commit`, as `git archive` gives it."""
    archive = _git("archive", "--format=tar", commit)
    if archive.returncode != 0:
        raise RuntimeError(f"git archive {commit} failed: {archive.stderr.decode(errors='replace')[-500:]}")
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4+: refuse links and paths out of `target`
            tar.extractall(target, filter="data")
        else:
            tar.extractall(target)


def build(release: Release | None = None) -> BuiltRelease:
    """The release (default: the previous one) exported and installed; cached, built once."""
    release = release or previous_release()
    root = build_dir(release)
    built = BuiltRelease(release, root)
    stamp = root / ".complete"
    if stamp.exists():
        return built
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{root}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists():
            return built
        ensure_commit(release.commit)
        shutil.rmtree(root, ignore_errors=True)  # a build that stopped half-way (no stamp)
        (root / "src").mkdir(parents=True)
        _export(release.commit, root / "src")
        print(
            f"releases: installing {release.version} ({release.commit[:12]}) into its own virtualenv", file=sys.stderr
        )
        python = getattr(sys, "_base_executable", None) or sys.executable
        subprocess.run([python, "-m", "venv", str(root / "venv")], check=True)
        subprocess.run(
            [str(built.python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(built.source)],
            check=True,
            env=built.env(),
            cwd=root,
        )
        stamp.write_text(release.commit + "\n")
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.releases", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", action="store_true", help="print where the previous release is cached")
    args = parser.parse_args(argv)
    release = previous_release()
    if args.dir:
        print(build_dir(release))
        return 0
    print(build(release).root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
