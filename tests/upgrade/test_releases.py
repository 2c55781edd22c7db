"""Releases are recorded in the repository and one version is shown everywhere.

releases.yaml lists each release with its commit, CHANGELOG.md has an entry per release (the current
one opening with what breaks), `dbprovider --version` and every rendered object say the version of
domain/version.py, and the previous release builds from its commit in the git history.
"""

from __future__ import annotations

import re
import subprocess
import sys

import yaml

from domain.config import load_install_config
from domain.version import UPGRADES_FROM, __version__, parse_version
from harness.releases import REPO, build, ensure_commit, load_releases, previous_release
from infra.render import render_manifests

CHANGELOG = REPO / "CHANGELOG.md"


def _changelog_entries() -> dict[str, str]:
    """version -> its entry (heading line and body) in CHANGELOG.md."""
    text = CHANGELOG.read_text()
    parts = re.split(r"^## ", text, flags=re.M)[1:]
    return {part.split(None, 1)[0]: "## " + part for part in parts}


def test_every_release_is_a_commit_of_this_history_and_this_checkout_is_newer():
    releases = load_releases()
    assert releases[0].version == "0.1.0"
    assert releases[0].commit.startswith("2392321")
    for release in releases:
        ensure_commit(release.commit)  # a shallow clone (CI's may be one) fetches the history first
        found = subprocess.run(
            ["git", "-C", str(REPO), "cat-file", "-t", release.commit], capture_output=True, text=True
        )
        assert found.stdout.strip() == "commit", f"{release.version}: {release.commit} is not in the history"
    assert parse_version(__version__) > releases[-1].version_tuple


def test_the_changelog_has_an_entry_per_release_and_the_current_one_opens_with_what_breaks():
    entries = _changelog_entries()
    assert list(entries)[0] == __version__, "the newest entry comes first"
    current = entries[__version__]
    first_section = re.search(r"^### (.+)$", current, flags=re.M)
    assert first_section is not None and first_section.group(1).startswith("Breaking changes")
    for release in load_releases():
        heading = entries[release.version].splitlines()[0]
        assert release.date in heading and release.commit[:7] in heading, heading


def test_dbprovider_version_prints_the_one_version():
    out = subprocess.run(
        [sys.executable, "-m", "dbprovider.cli", "--version"], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert out.stdout.strip() == f"dbprovider {__version__}"


def test_every_rendered_object_and_the_pods_carry_the_version_but_no_selector_does():
    config = load_install_config({"tls": {"secretName": "tls"}, "metrics": {"serviceMonitor": {"enabled": True}}})
    objects = render_manifests(config)
    for obj in objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/version"] == __version__, obj["kind"]
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/version"] == __version__
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"].endswith(f":{__version__}")
    selectors = [deployment["spec"]["selector"]["matchLabels"]]
    selectors += [o["spec"]["selector"] for o in objects if o["kind"] == "Service"]
    selectors += [o["spec"]["selector"]["matchLabels"] for o in objects if o["kind"] in ("ServiceMonitor",)]
    assert len(selectors) >= 4
    for selector in selectors:
        assert "app.kubernetes.io/version" not in selector  # a rollout must not orphan pods or endpoints


def test_the_previous_release_is_built_from_its_commit_and_runs():
    release = previous_release()
    built = build(release)
    # The exported tree is the commit's, file for file (spot-checked on files that changed since).
    for path in ("reconciler/database/state.py", "dbprovider/cli.py", "pyproject.toml"):
        at_commit = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{release.commit}:{path}"], capture_output=True, check=True
        ).stdout
        assert (built.source / path).read_bytes() == at_commit, path
    # It runs from its own virtualenv, with its own version (0.1.0 had no --version: its metadata says it).
    metadata = subprocess.run(
        [
            str(built.python),
            "-c",
            "import importlib.metadata as m, dbprovider; print(m.version('dbprovider'), dbprovider.__file__)",
        ],
        capture_output=True,
        text=True,
        env=built.env(),
        cwd=built.root,
        check=True,
    ).stdout.split()
    assert metadata[0] == release.version
    assert metadata[1].startswith(str(built.root / "venv")), "it must not import this checkout's code"
    assert built.run("render", "--help").returncode == 0


def test_the_served_api_document_names_the_release():
    document = yaml.safe_load((REPO / "api" / "openapi.yaml").read_text())
    assert document["info"]["version"] == __version__


def test_the_release_the_check_upgrades_from_is_the_newest_recorded() -> None:
    assert UPGRADES_FROM == previous_release().version
