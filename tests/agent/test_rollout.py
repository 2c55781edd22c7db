"""spec.rolloutDeployments on the consumer's real apiserver: new Secret values (a rotation) put their
credentials version into the named Deployments' pod templates, which is a rollout; the first Secret
and passes without a change roll nothing; a Deployment that is not there is told on the claim and in
an Event, and the Secret is written all the same. (No kubelet is needed to see a pod template change:
the Deployment's generation counts them.) An RBAC that does not allow the patch is told the same way.
"""

from __future__ import annotations

from typing import Any

from agent.rollout import DEPLOYMENTS
from domain.agent_config import AGENT_NAME
from domain.constants import ANNOTATION_CREDENTIALS_VERSION
from domain.resources import CLAIMS
from informers import EVENTS, Resource
from tests.agent.conftest import Consumer
from tests.agent.test_agent import decoded, logs_in, ready_claim
from tests.agent.test_observability import wait_passes
from tests.support.common import wait_for

CLUSTER_ROLES = Resource("rbac.authorization.k8s.io", "v1", "clusterroles")


def deployment(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]},
            },
        },
    }


def template_version(consumer: Consumer, namespace: str, name: str) -> tuple[int, str | None]:
    """The Deployment's generation and the credentials version in its pod template."""
    obj = consumer.admin.get(DEPLOYMENTS, name, namespace)
    annotations = obj["spec"]["template"]["metadata"].get("annotations") or {}
    return obj["metadata"]["generation"], annotations.get(ANNOTATION_CREDENTIALS_VERSION)


def rotate(consumer: Consumer, claim: dict[str, Any], value: str) -> None:
    meta = claim["metadata"]
    patch = {"metadata": {"annotations": {"db.bnerd.com/rotate": value}}}
    consumer.admin.patch(CLAIMS, meta["name"], patch, meta["namespace"])


def test_a_rotation_rolls_the_named_deployments_once(consumer: Consumer) -> None:
    claim, before = ready_claim(consumer, {"rolloutDeployments": ["web", "not-there"]})
    meta = claim["metadata"]
    namespace = meta["namespace"]
    consumer.admin.create(DEPLOYMENTS, deployment("web"), namespace)
    consumer.admin.create(DEPLOYMENTS, deployment("other"), namespace)
    wait_passes(consumer, 1)
    assert template_version(consumer, namespace, "web") == (1, None)  # the first Secret rolls nothing

    rotate(consumer, claim, "r1")

    def rolled() -> str | None:
        secret = consumer.secret(namespace, meta["name"]) or {}
        version = (secret.get("metadata") or {}).get("annotations", {}).get(ANNOTATION_CREDENTIALS_VERSION)
        return version if template_version(consumer, namespace, "web") == (2, version) else None

    version = wait_for(rolled, 120, "web rolled to the Secret's new version", max_interval=0.5)
    secret = consumer.secret(namespace, meta["name"])
    assert secret is not None
    after = decoded(secret)
    assert after["password"] != before["password"] and logs_in(after) == before["username"]
    assert template_version(consumer, namespace, "other") == (1, None)  # not named: untouched

    missing = consumer.wait_condition(claim, "DeploymentsRolled", "False")
    assert missing["reason"] == "DeploymentNotFound"
    assert "not-there" in missing["message"] and "web" in missing["message"] and version in missing["message"]
    assert consumer.condition(claim, "Ready")["status"] == "True"
    events = consumer.admin.list(EVENTS, namespace)["items"]
    reasons = {(e["reason"], e["type"]) for e in events if e["involvedObject"]["uid"] == meta["uid"]}
    assert {("DeploymentsRolled", "Normal"), ("DeploymentNotFound", "Warning")} <= reasons

    wait_passes(consumer, 3)  # passes without a change roll nothing
    assert template_version(consumer, namespace, "web") == (2, version)


def test_a_refused_patch_is_told_and_the_next_change_rolls(consumer: Consumer) -> None:
    claim, _ = ready_claim(consumer, {"rolloutDeployments": ["api"]})
    namespace = claim["metadata"]["namespace"]
    consumer.admin.create(DEPLOYMENTS, deployment("api"), namespace)
    role = consumer.admin.get(CLUSTER_ROLES, AGENT_NAME)
    kept = [rule for rule in role["rules"] if "deployments" not in rule["resources"]]
    consumer.admin.patch(CLUSTER_ROLES, AGENT_NAME, {"rules": kept})
    try:
        rotate(consumer, claim, "r1")
        refused = consumer.wait_condition(claim, "DeploymentsRolled", "False", timeout=120)
        assert refused["reason"] == "DeploymentForbidden" and "api" in refused["message"]
        assert consumer.condition(claim, "CredentialsCurrent")["status"] == "True"  # the Secret is written
        assert template_version(consumer, namespace, "api") == (1, None)
    finally:
        consumer.admin.patch(CLUSTER_ROLES, AGENT_NAME, {"rules": role["rules"]})
    rotate(consumer, claim, "r2")
    done = consumer.wait_condition(claim, "DeploymentsRolled", "True", timeout=120)
    assert done["reason"] == "Rolled" and "api" in done["message"]
    generation, version = template_version(consumer, namespace, "api")
    secret = consumer.secret(namespace, claim["metadata"]["name"]) or {}
    assert generation == 2 and version == secret["metadata"]["annotations"][ANNOTATION_CREDENTIALS_VERSION]
