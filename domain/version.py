"""The provider's release version: the one place it is written.

`dbprovider --version`, the package metadata (pyproject.toml reads it), the image's
`org.opencontainers.image.version` label (the Dockerfile's VERSION build argument is checked against
it), the `dbprovider_build_info` metric, the default image tag and the `app.kubernetes.io/version`
label of every rendered object all read it from here. Released versions and their commits are listed
in releases.yaml; CHANGELOG.md says what each one changed and what a user must do.
"""

from __future__ import annotations

__version__ = "0.2.0"


def parse_version(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a `MAJOR.MINOR.PATCH` version; ValueError for anything else."""
    parts = version.split(".")
    if len(parts) != 3 or not all(part.isdigit() and (part == "0" or not part.startswith("0")) for part in parts):
        raise ValueError(f"{version!r} is not a MAJOR.MINOR.PATCH version")
    major, minor, patch = (int(part) for part in parts)
    return major, minor, patch


# The release this one upgrades from directly (the newest in releases.yaml; tests/upgrade checks it).
UPGRADES_FROM = "0.1.0"
