"""The consumer agent's install values (`dbprovider render --agent --config FILE`): one consumer cluster.

providerUrl: https://dbprovider.example:8443   # the provider's consumer API
tokenSecret: dbprovider-token                   # Secret in `namespace`, key `token`: the consumer token
caSecret: dbprovider-ca                         # optional: Secret with key ca.crt, the API's CA
namespace: dbprovider-agent
watchNamespace: team-a                          # optional: only this namespace's claims (a Role there)
resources: {requests: {cpu: 20m, memory: 96Mi}, limits: {memory: 256Mi}}   # the defaults
metrics: {serviceMonitor: {enabled: false}}     # as the provider's install key of that name
prometheusRule: {enabled: false}                # the agent's alert rules (AgentPrometheusRuleConfig)
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Any

from pydantic import AfterValidator, Field, StrictBool, StrictInt, StrictStr, ValidationError, field_validator

from domain.config import (
    DEFAULT_IMAGE,
    ConfigError,
    Duration,
    LabelKey,
    LabelValue,
    MetricsConfig,
    PromqlText,
    RunbookUrl,
)
from domain.sizing import AgentResources
from domain.validation import ConfigModel, Namespace, ObjectName, validation_problems

AGENT_NAME = "dbprovider-agent"


def _check_https(value: str) -> str:
    if not value.startswith("https://") or any(c.isspace() for c in value):
        raise ValueError("must be an https:// URL without spaces")
    return value


AGENT_RUNBOOK_BASE_URL = "https://github.com/bnerd/dbprovider/blob/main/docs/consumers.md"


class AgentPrometheusRuleConfig(ConfigModel):
    """The agent's alert rules, for the consumer cluster's Prometheus: a PrometheusRule among the agent's
    objects when enabled; `dbprovider render --agent --only prometheusrule [--format rules]` renders them
    either way."""

    enabled: StrictBool = False
    job_selector: PromqlText = ""  # the `job` label of the agent's series; default: the metrics Service's name
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    annotations: dict[LabelKey, StrictStr] = Field(default_factory=dict)
    runbook_base_url: RunbookUrl = AGENT_RUNBOOK_BASE_URL
    provider_unreachable_after: Duration = timedelta(minutes=10)  # DBProviderAgentProviderUnreachable
    claim_not_ready_after: Duration = timedelta(minutes=15)  # DBProviderAgentClaimsNotReady

    @field_validator("provider_unreachable_after", "claim_not_ready_after")
    @classmethod
    def _at_least_a_minute(cls, value: timedelta) -> timedelta:
        if value < timedelta(minutes=1):
            raise ValueError("must be at least 1m")
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
    prometheus_rule: AgentPrometheusRuleConfig = AgentPrometheusRuleConfig()

    def metrics_service_name(self) -> str:
        """The Service in front of the agents' metrics port, `<name>-metrics` (a ServiceMonitor's job label)."""
        return f"{self.name}-metrics"

    def effective_job_selector(self) -> str:
        """The `job` label the alert rules select: prometheusRule.jobSelector, else the metrics Service."""
        return self.prometheus_rule.job_selector or self.metrics_service_name()


def load_agent_config(data: Mapping[str, Any] | None) -> AgentInstallConfig:
    """Validate parsed agent values; ConfigError naming every offending key."""
    try:
        return AgentInstallConfig.model_validate(dict(data or {}))
    except ValidationError as exc:
        raise ConfigError(validation_problems(exc)) from None
