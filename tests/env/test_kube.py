"""The control plane is a real kube-apiserver of the pinned version with RBAC enforced."""

from __future__ import annotations

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from harness import KubeControlPlane, MissingBinaryError
from harness.kube import pinned_kube_version


def test_version_is_the_pinned_release(kube: KubeControlPlane) -> None:
    with kube.admin_client() as api:
        info = kubernetes.client.VersionApi(api).get_code()
    assert info.git_version == pinned_kube_version()
    assert f"v{info.major}.{info.minor}." in info.git_version + "."


def _can_list_secrets(api: kubernetes.client.ApiClient, namespace: str) -> bool:
    try:
        kubernetes.client.CoreV1Api(api).list_namespaced_secret(namespace)
        return True
    except ApiException as exc:
        if exc.status == 403:
            return False
        raise


def test_rbac_denies_an_unprivileged_service_account_and_allows_admin(kube: KubeControlPlane) -> None:
    kube.ensure_namespace("rbac-check")
    with kube.service_account_client("rbac-check", "nobody") as api:
        assert not _can_list_secrets(api, "rbac-check")
        review = kubernetes.client.AuthenticationV1Api(api).create_self_subject_review({})
        assert review.status.user_info.username == "system:serviceaccount:rbac-check:nobody"
    with kube.admin_client() as api:
        assert _can_list_secrets(api, "rbac-check")


def test_client_certificates_carry_user_and_groups(kube: KubeControlPlane) -> None:
    kube.ensure_namespace("rbac-groups")
    with kube.client_as("alice", ("breakglass", "team-a")) as api:
        info = kubernetes.client.AuthenticationV1Api(api).create_self_subject_review({}).status.user_info
        assert info.username == "alice"
        assert {"breakglass", "team-a", "system:authenticated"} <= set(info.groups)
        assert not _can_list_secrets(api, "rbac-groups")
    with kube.admin_client() as admin:
        rbac = kubernetes.client.RbacAuthorizationV1Api(admin)
        rbac.create_namespaced_role(
            "rbac-groups",
            {
                "metadata": {"name": "secret-reader"},
                "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}],
            },
        )
        rbac.create_namespaced_role_binding(
            "rbac-groups",
            {
                "metadata": {"name": "team-a-reads-secrets"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "secret-reader"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "team-a"}],
            },
        )
    with kube.client_as("alice", ("breakglass", "team-a")) as api:
        assert _can_list_secrets(api, "rbac-groups")


def test_kubeconfig_reaches_the_apiserver(kube: KubeControlPlane, tmp_path) -> None:
    path = kube.write_kubeconfig(tmp_path / "kubeconfig")
    api = kubernetes.config.new_client_from_config(config_file=str(path))
    with api:
        assert kubernetes.client.CoreV1Api(api).read_namespace("default").metadata.name == "default"


def test_missing_binaries_say_how_to_build_them(tmp_path) -> None:
    with pytest.raises(MissingBinaryError, match=r"bash hack/build-kube.sh"):
        KubeControlPlane(bin_dir=tmp_path)
