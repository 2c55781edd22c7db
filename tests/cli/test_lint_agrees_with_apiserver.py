"""One source of rules: every shared object vector gets the same verdict from `dbprovider lint` (offline)
and from the real apiserver (server-side apply, dry run, against the CRDs generated from the same
models), and both match the vector's expectation."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.cli.conftest import VALUES, run, write_yaml
from tests.support.kubeapi import KubeApi
from tests.vectors.objects import OBJECT_VECTORS

SCHEMA_ERROR_RE = re.compile(r"^(?P<file>[^:]+):\d+: error: .* \[schema\]$")


def apiserver_accepts(api: KubeApi, obj: dict[str, Any]) -> tuple[bool, str]:
    """Server-side apply with dryRun=All: the apiserver validates fully and persists nothing."""
    response = api.request(
        "PATCH",
        api.object_path(obj),
        obj,
        query={"fieldManager": "clitest", "force": "true", "dryRun": "All"},
        content_type="application/apply-patch+yaml",
    )
    # A wrongly typed field (a string for a number, data that is not base64) fails server-side apply's
    # decoding with a 500; the object is refused all the same.
    refused_by_type = response.status == 500 and any(
        cause in response.message for cause in ("failed to create typed patch object", "failed to convert new object")
    )
    assert response.status < 500 or refused_by_type, (response.status, response.message)
    assert response.status != 404, response.message  # the namespace and the CRDs exist
    return response.status in (200, 201), response.message


def test_lint_and_the_apiserver_agree_on_every_shared_vector(crds: KubeApi, tmp_path: Path) -> None:
    write_yaml(tmp_path / "values.yaml", VALUES)
    for index, (obj, _, _) in enumerate(OBJECT_VECTORS):
        write_yaml(tmp_path / "objects" / f"{index:03d}.yaml", obj)
    result = run("lint", "--values", "values.yaml", "objects", cwd=tmp_path)
    assert result.returncode in (0, 1), result.stderr
    refused_by_lint = {
        int(Path(match["file"]).stem) for line in result.stdout.splitlines() if (match := SCHEMA_ERROR_RE.match(line))
    }

    with ThreadPoolExecutor(max_workers=8) as pool:
        verdicts = list(pool.map(lambda vector: apiserver_accepts(crds, vector[0]), OBJECT_VECTORS))

    wrong = []
    for index, ((obj, valid, why), (accepted, message)) in enumerate(zip(OBJECT_VECTORS, verdicts, strict=True)):
        linted = index not in refused_by_lint
        if not (valid == accepted == linted):
            wrong.append(
                f"#{index} {obj['kind']} ({why}): expected {'valid' if valid else 'invalid'}, apiserver "
                f"{'accepts' if accepted else 'refuses'} ({message[:160]}), lint {'accepts' if linted else 'refuses'}"
            )
    assert not wrong, "\n".join(wrong)
    assert sum(1 for _, valid, _ in OBJECT_VECTORS if not valid) > 40
