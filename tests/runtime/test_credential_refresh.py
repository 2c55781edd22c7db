"""The client's credential hook, run at most once a second instead of before every request, still
picks up a rotated ServiceAccount token (the in-cluster loader of the kubernetes client, a real
kube-apiserver and real tokens from its TokenRequest API)."""

from __future__ import annotations

import datetime
from pathlib import Path

from kubernetes.client import ApiClient, Configuration
from kubernetes.config.incluster_config import InClusterConfigLoader

from harness import KubeControlPlane
from informers import Rest
from informers.rest import throttle_credential_refresh


def whoami(rest: Rest) -> str:
    review = rest.request(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    return str(review["status"]["userInfo"]["username"])


def test_a_rotated_token_is_used_within_the_refresh_interval(
    kube: KubeControlPlane, namespace: str, tmp_path: Path
) -> None:
    first = kube.service_account_token(namespace, "first")
    second = kube.service_account_token(namespace, "second")
    token_file = tmp_path / "token"
    token_file.write_text(first)
    loader = InClusterConfigLoader(
        str(token_file),
        str(kube.ca.ca_file),
        environ={"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(kube.port)},
    )
    configuration = Configuration()
    loader.load_and_set(configuration)
    now = [100.0]
    throttle_credential_refresh(configuration, every=1.0, clock=lambda: now[0])
    with ApiClient(configuration) as client:
        rest = Rest(client)
        own = rest.without_retries()  # a copy of the configuration, as the Lease's client is
        assert whoami(rest) == f"system:serviceaccount:{namespace}:first"

        token_file.write_text(second)  # the kubelet rotated the projected token ...
        loader.token_expires_at = datetime.datetime.now() - datetime.timedelta(seconds=1)  # ... and its minute is up
        now[0] += 0.5
        assert whoami(rest) == f"system:serviceaccount:{namespace}:first"  # within the second: not read yet
        now[0] += 0.6
        assert whoami(rest) == f"system:serviceaccount:{namespace}:second"
        assert whoami(own) == f"system:serviceaccount:{namespace}:second"  # the copy refreshes on its own time
        assert whoami(rest) == f"system:serviceaccount:{namespace}:second"
        own.api_client.close()
