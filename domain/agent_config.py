"""The consumer agent's install values (`dbprovider render --agent --config FILE`): one consumer cluster.

providerUrl: https://dbprovider.example:8443   # the provider's consumer API
tokenSecret: dbprovider-token                   # Secret in `namespace`, key `token`: the consumer token
caSecret: dbprovider-ca                         # optional: Secret with key ca.crt, the API's CA
namespace: dbprovider-agent
watchNamespace: team-a                          # optional: only this namespace's claims (a Role there)
resources: {requests: {cpu: 20m, memory: 96Mi}, limits: {memory: 256Mi}}   # the defaults
metrics: {serviceMonitor: {enabled: false}}     # as the provider's install key of that name
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Any

from pydantic import AfterValidator, Field, StrictInt, StrictStr, ValidationError

from domain.config import DEFAULT_IMAGE, ConfigError, Duration, MetricsConfig
from domain.sizing import AgentResources
from domain.validation import ConfigModel, Namespace, ObjectName, validation_problems

AGENT_NAME = "dbprovider-agent"


def _check_https(value: str) -> str:
    if not value.startswith("https://") or any(c.isspace() for c in value):
        raise ValueError("must be an https:// URL without spaces")
    return value


class AgentInstallConfig(ConfigModel):
    """Where the agent runs, what it watches, and how it reaches the provider."""

    provider_url: Annotated[StrictStr, AfterValidator(_check_https)]
    token_secret: ObjectName = Field(description="Secret (key `token`) with the consumer's bearer token.")
    ca_secret: ObjectName | None = None
    namespace: Namespace = AGENT_NAME
    name: ObjectName = AGENT_NAME
    image: StrictStr = DEFAULT_IMAGE
    replicas: Annotated[StrictInt, Field(ge=1)] = 2
    watch_namespace: Namespace | None = None
    poll_interval: Duration = timedelta(seconds=30)
    resources: AgentResources = AgentResources()
    metrics: MetricsConfig = MetricsConfig()

    def metrics_service_name(self) -> str:
        """The Service in front of the agents' metrics port, `<name>-metrics` (a ServiceMonitor's job label)."""
        return f"{self.name}-metrics"


def load_agent_config(data: Mapping[str, Any] | None) -> AgentInstallConfig:
    """Validate parsed agent values; ConfigError naming every offending key."""
    try:
        return AgentInstallConfig.model_validate(dict(data or {}))
    except ValidationError as exc:
        raise ConfigError(validation_problems(exc)) from None
