"""The provider's release version: the one place it is written.

`dbprovider --version`, the package metadata (pyproject.toml reads it), the image's
`org.opencontainers.image.version` label (the Dockerfile's VERSION build argument is checked against
it), the `dbprovider_build_info` metric, the default image tag and the `app.kubernetes.io/version`
label of every rendered object all read it from here. Released versions and their commits are listed
in releases.yaml; CHANGELOG.md says what each one changed and what a user must do.
"""

from __future__ import annotations

__version__ = "0.2.0"
