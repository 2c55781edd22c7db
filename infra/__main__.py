"""The Pulumi program (Pulumi.yaml `main: infra/`): install the provider into the stack's DB cluster.

The DB cluster is the default Kubernetes provider's (the ambient kubeconfig, or `kubernetes:kubeconfig` /
`kubernetes:context` in the stack config). Stack config keys: see infra/config.py and docs/install.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import infra  # noqa: F401  (installed, or run from the repository)
except ImportError:  # pragma: no cover - Pulumi runs this file with infra/ itself on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pulumi

from infra.component import DbProvider, DbProviderArgs
from infra.config import load_stack_config

stack = load_stack_config()
provider = DbProvider(
    stack.install.release_name,
    DbProviderArgs(
        config=stack.install,
        prometheus_kubeconfig=stack.prometheus_kubeconfig,
        prometheus_namespace=stack.prometheus_namespace,
        dashboard_configmap=stack.dashboard_configmap,
    ),
)
pulumi.export("namespace", stack.install.namespace)
pulumi.export("apiService", f"{stack.install.release_name}.{stack.install.namespace}.svc")
pulumi.export("prometheusRuleYaml", provider.prometheus_rule_yaml)
# The dashboard for any Grafana (`pulumi stack output dashboardJson`), as `dbprovider render --only dashboard`.
pulumi.export("dashboardJson", provider.dashboard_json)
