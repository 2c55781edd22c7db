"""`DbProviderAgent`: the Pulumi component that installs the consumer agent into one consumer cluster.

The objects are those of `dbprovider render --agent` (infra.render.render_agent_manifests), created as
DbProvider creates the provider's: typed pulumi_kubernetes resources, the CRD first and retained on
`pulumi destroy` (deleting it would delete every claim), the namespaces read, never created.

    DbProviderAgent("agent", load_agent_config({"providerUrl": ..., "tokenSecret": ...}))
"""

from __future__ import annotations

import pulumi

from domain.agent_config import AgentInstallConfig
from infra.component import KIND_CRD, create_object, required_namespaces, resource_name
from infra.render import object_key, render_agent_manifests

TYPE_TOKEN = "dbprovider:index:DbProviderAgent"


class DbProviderAgent(pulumi.ComponentResource):
    """The agent in one consumer cluster: the DatabaseClaim CRD, RBAC, Deployment, PodDisruptionBudget."""

    objects: dict[tuple[str, str, str, str], pulumi.CustomResource]

    def __init__(self, name: str, config: AgentInstallConfig, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE_TOKEN, name, None, opts)
        manifests = render_agent_manifests(config)
        namespaces = required_namespaces(self, "", manifests, None)
        self.objects = {}
        crds = []
        for obj in (o for o in manifests if o["kind"] == KIND_CRD):
            options = pulumi.ResourceOptions(parent=self, retain_on_delete=True, depends_on=namespaces)
            crds.append(create_object(resource_name(obj), obj, options))
            self.objects[object_key(obj)] = crds[-1]
        for obj in (o for o in manifests if o["kind"] != KIND_CRD):
            options = pulumi.ResourceOptions(parent=self, depends_on=[*namespaces, *crds])
            self.objects[object_key(obj)] = create_object(resource_name(obj), obj, options)
        self.register_outputs(
            {"namespace": config.namespace, "crds": [o["metadata"]["name"] for o in manifests if o["kind"] == KIND_CRD]}
        )
