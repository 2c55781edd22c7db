"""Status keys a release does not know: the previous release dropped them, this one keeps them.

The same stored Database, with a key a newer release writes, is read and dumped again for a status
write by each release's own code (the previous one's in its own virtualenv). A key missing from the
dump becomes `null` in the merge patch: the writer removes it.
"""

from __future__ import annotations

import json
import subprocess
import textwrap

from domain.constants import API_VERSION
from harness.releases import BuiltRelease
from reconciler.database.state import Database
from reconciler.runtime.status import merge_patch

STORED = {
    "apiVersion": API_VERSION,
    "kind": "Database",
    "metadata": {"name": "d", "namespace": "n", "uid": "u", "resourceVersion": "7", "generation": 1},
    "spec": {"consumer": "c", "externalId": "e"},
    "status": {
        "phase": "Ready",
        "shard": "s",
        "tenantName": "t_e_1",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Provisioned",
                "message": "tenant exists on the shard",
                "lastTransitionTime": "2026-12-01T10:00:00Z",
                "observedGeneration": 1,
            },
            {
                "type": "FromTheFuture",
                "status": "True",
                "reason": "Later",
                "message": "a newer release's",
                "lastTransitionTime": "2026-12-01T10:00:00Z",
            },
        ],
        "nextReleaseField": {"anything": 1},
    },
}

PREVIOUS = textwrap.dedent(
    """
    import json, sys
    from reconciler.database.state import Pass
    print(json.dumps(Pass.read(json.load(sys.stdin)).status_body()))
    """
)


def test_the_previous_release_drops_a_newer_releases_status_key_and_this_one_keeps_it(previous: BuiltRelease):
    out = subprocess.run(
        [str(previous.python), "-c", PREVIOUS],
        input=json.dumps(STORED),
        capture_output=True,
        text=True,
        env=previous.env(),
        cwd=previous.root,
        check=True,
    )
    previous_body = json.loads(out.stdout)
    assert merge_patch(STORED["status"], previous_body) == {"nextReleaseField": None}  # removed on its next write

    body = Database.read(STORED).status_body()
    assert merge_patch(STORED["status"], body) == {}  # this release writes nothing it did not change
    # Conditions of types neither knows survive both (a list of typed conditions, any type).
    assert [c["type"] for c in previous_body["conditions"]] == ["Ready", "FromTheFuture"]
