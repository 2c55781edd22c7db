"""`DbProvider`: the Pulumi component that installs the provider into one DB cluster.

Every object comes from infra.render (the same templates as `dbprovider render`), created as the typed
pulumi_kubernetes resource of its kind with server-side apply (the provider default). CRDs come first and
every other object depends on them; they are retained on `pulumi destroy`, since deleting a CRD deletes
every object of its kind. The PrometheusRule goes to the central Prometheus' cluster through a
second Kubernetes provider when a kubeconfig for it is given; otherwise its YAML is exported as the output
`prometheus_rule_yaml`, for that Prometheus' own repository. The Grafana dashboard is always the output
`dashboard_json`; with `dashboard_configmap` its ConfigMap for a Grafana sidecar is created in the DB cluster
too. Both come from infra.dashboard, as `dbprovider render --only dashboard [--format configmap]` does.
Nothing is created inside `apply()`, so a preview shows exactly what `up` does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from domain.config import InstallConfig
from domain.metadata import ObjectMeta
from infra.dashboard import dashboard_configmap, dashboard_json
from infra.render import (
    dump_yaml,
    install_warnings,
    object_key,
    prometheus_rule_warnings,
    render_manifests,
    render_prometheus_rule,
)

TYPE_TOKEN = "dbprovider:index:DbProvider"
KIND_CRD = "CustomResourceDefinition"


@dataclass(frozen=True)
class DbProviderArgs:
    """Inputs of a DbProvider.

    config: the validated install config (infra.config.load_stack_config reads it from the stack).
    prometheus_kubeconfig: kubeconfig (contents or path) of the central Prometheus' cluster; when set
        and prometheusRule.enabled, the PrometheusRule is created there.
    prometheus_namespace: namespace of the PrometheusRule in that cluster (default: the release namespace).
    dashboard_configmap: also create the dashboard's ConfigMap (label grafana_dashboard: "1") in the DB
        cluster, in `dashboard.namespace` (default: the release namespace).
    """

    config: InstallConfig
    prometheus_kubeconfig: pulumi.Input[str] | None = None
    prometheus_namespace: str | None = None
    dashboard_configmap: bool = False


# kind -> pulumi_kubernetes class of every object the templates produce.
_RESOURCE_CLASSES: dict[tuple[str, str], type[pulumi.CustomResource]] = {
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): k8s.apiextensions.v1.CustomResourceDefinition,
    ("v1", "ServiceAccount"): k8s.core.v1.ServiceAccount,
    ("v1", "ConfigMap"): k8s.core.v1.ConfigMap,
    ("v1", "Service"): k8s.core.v1.Service,
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): k8s.rbac.v1.ClusterRole,
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): k8s.rbac.v1.ClusterRoleBinding,
    ("rbac.authorization.k8s.io/v1", "Role"): k8s.rbac.v1.Role,
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): k8s.rbac.v1.RoleBinding,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,
    ("policy/v1", "PodDisruptionBudget"): k8s.policy.v1.PodDisruptionBudget,
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"): (
        k8s.admissionregistration.v1.ValidatingAdmissionPolicy
    ),
    ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"): (
        k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding
    ),
}
# Kinds of other operators' CRDs (Prometheus Operator): created as untyped custom resources.
_CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}


def _snake(key: str) -> str:
    return re.sub("([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def resource_name(obj: dict[str, Any]) -> str:
    """The Pulumi name of an object: `<namespace>/<name>`, or `<name>` for a cluster-scoped one.

    Names need to be unique per resource type only (the type is part of the URN); one DbProvider per stack.
    """
    return ObjectMeta.model_validate(obj["metadata"]).key


def create_object(name: str, obj: dict[str, Any], opts: pulumi.ResourceOptions) -> pulumi.CustomResource:
    """Create one rendered manifest as a pulumi_kubernetes resource (its body passed through unchanged)."""
    key = (obj["apiVersion"], obj["kind"])
    if key in _CUSTOM_KINDS:
        extra = set(obj) - {"apiVersion", "kind", "metadata", "spec"}
        if extra:
            raise ValueError(f"{obj['kind']} carries fields a CustomResource cannot pass: {sorted(extra)}")
        return k8s.apiextensions.CustomResource(
            name,
            api_version=obj["apiVersion"],
            kind=obj["kind"],
            metadata=obj["metadata"],
            spec=obj.get("spec"),  # a CustomResource may have none: passed on as it is
            opts=opts,
        )
    cls = _RESOURCE_CLASSES.get(key)
    if cls is None:
        raise ValueError(f"no Pulumi resource class for {key[0]} {key[1]}: add it to infra.component")
    fields = {_snake(field): value for field, value in obj.items()}
    return cls(name, opts=opts, **fields)


def required_namespaces(
    parent: pulumi.Resource, prefix: str, manifests: list[dict[str, Any]], provider: k8s.Provider | None
) -> list[pulumi.Resource]:
    """Read (never create) every namespace the manifests are placed in, so a missing one fails early.

    The install does not own its namespaces: they also hold the TLS Secret, the consumers' token-hash Secrets
    and the shards' admin Secrets, which `pulumi destroy` must never take with it (docs/install.md). A read
    of a missing namespace fails `pulumi preview` and `pulumi up` before anything is created, with
    `kubernetes:core/v1:Namespace (<prefix>must-exist/<ns>): ... resource '<ns>' does not exist`.
    """
    metas = [ObjectMeta.model_validate(obj["metadata"]) for obj in manifests]
    names = sorted({meta.namespace for meta in metas if meta.namespace})
    return [
        k8s.core.v1.Namespace.get(
            f"{prefix}must-exist/{namespace}",
            namespace,
            opts=pulumi.ResourceOptions(parent=parent, provider=provider),
        )
        for namespace in names
    ]


class DbProvider(pulumi.ComponentResource):
    """The provider in one DB cluster: CRDs, admission policy, RBAC, Deployment, Services, monitoring, dashboard."""

    objects: dict[tuple[str, str, str, str], pulumi.CustomResource]
    crds: list[pulumi.CustomResource]
    prometheus_provider: k8s.Provider | None
    prometheus_rule: pulumi.CustomResource | None
    prometheus_rule_yaml: str | None
    dashboard_json: str

    def __init__(self, name: str, args: DbProviderArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE_TOKEN, name, None, opts)
        config = args.config
        manifests = render_manifests(config)
        self.dashboard_json = dashboard_json(config)
        if args.dashboard_configmap:
            # The very object `dbprovider render --only dashboard --format configmap` writes; its namespace
            # (dashboard.namespace) must exist like every other.
            manifests.append(dashboard_configmap(config))
        # Nothing is created before every namespace written into is known to exist (see required_namespaces).
        namespaces = required_namespaces(self, "", manifests, None)
        self.objects = {}
        self.crds = []
        for obj in (o for o in manifests if o["kind"] == KIND_CRD):
            # `pulumi destroy` leaves the CRDs (and so every Shard, Consumer and Database) in place.
            self._add(obj, pulumi.ResourceOptions(parent=self, retain_on_delete=True, depends_on=namespaces))
        for obj in (o for o in manifests if o["kind"] != KIND_CRD):
            self._add(obj, pulumi.ResourceOptions(parent=self, depends_on=[*namespaces, *self.crds]))

        for warning in install_warnings(config):
            pulumi.log.warn(warning, resource=self)

        self.prometheus_provider = None
        self.prometheus_rule = None
        self.prometheus_rule_yaml = None
        if config.prometheus_rule.enabled:
            for warning in prometheus_rule_warnings(config):
                pulumi.log.warn(warning, resource=self)
            rule = render_prometheus_rule(config)
            if args.prometheus_namespace:
                rule["metadata"]["namespace"] = args.prometheus_namespace
            self.prometheus_rule_yaml = dump_yaml([rule])
            if args.prometheus_kubeconfig is not None:
                self.prometheus_provider = k8s.Provider(
                    f"{name}-prometheus",
                    kubeconfig=args.prometheus_kubeconfig,
                    enable_server_side_apply=True,
                    opts=pulumi.ResourceOptions(parent=self),
                )
                rule_namespaces = required_namespaces(self, "prometheus:", [rule], self.prometheus_provider)
                self.prometheus_rule = create_object(
                    resource_name(rule),
                    rule,
                    pulumi.ResourceOptions(parent=self, provider=self.prometheus_provider, depends_on=rule_namespaces),
                )
            else:
                pulumi.log.info(
                    "prometheusRule.enabled without dbprovider:prometheusKubeconfig: the PrometheusRule is not "
                    "created; ship the stack output prometheusRuleYaml to the central Prometheus",
                    resource=self,
                )

        self.register_outputs(
            {
                "namespace": config.namespace,
                "crds": [o["metadata"]["name"] for o in manifests if o["kind"] == KIND_CRD],
                "prometheusRuleYaml": self.prometheus_rule_yaml,
                "dashboardJson": self.dashboard_json,
            }
        )

    def _add(self, obj: dict[str, Any], opts: pulumi.ResourceOptions) -> None:
        resource = create_object(resource_name(obj), obj, opts)
        self.objects[object_key(obj)] = resource
        if obj["kind"] == KIND_CRD:
            self.crds.append(resource)
