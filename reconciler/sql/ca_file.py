"""A CA's PEM as a file libpq can read (libpq takes `sslrootcert` as a path, never as text).

One file per content under the temp directory (the pod's writable /tmp), named by its digest, written
once and atomically, so concurrent workers and later logins share it and a renewed CA gets a file of
its own. The PEM is public (a CA certificate), so the file holds nothing secret.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

DIRECTORY = "dbprovider-ca"


def ca_file(pem: str) -> str:
    """The path of a file holding exactly `pem`."""
    directory = Path(tempfile.gettempdir()) / DIRECTORY
    path = directory / f"{hashlib.sha256(pem.encode('utf-8')).hexdigest()[:32]}.crt"
    if path.is_file():
        return str(path)
    directory.mkdir(mode=0o700, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=directory, suffix=".tmp", delete=False, encoding="utf-8") as out:
        out.write(pem)
    os.replace(out.name, path)
    return str(path)
