"""Container resources (the provider's install keys `resources` and `sizing`, the agent's `resources`) and what
a fleet needs of them.

`resources.manager` holds the Deployment's requests and limits as Kubernetes quantities (cpu `100m` or `0.5`,
memory `512Mi`, `1Gi`, `600M`); a key left out keeps its default, `null` removes it. `sizing` says how large a
fleet the install is sized for; `manager_memory_mib` is the documented sizing (docs/install.md, "Sizing"),
measured with `python -m bench.scale`, that `dbprovider lint` holds the memory limit against.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator, Field, StrictInt, StrictStr, model_validator

from domain.settings import SETTINGS
from domain.validation import ConfigModel

_MIB = 2**20
_MEMORY_RE = re.compile(r"([0-9]+)(Ki|Mi|Gi|Ti|k|M|G|T)?")
_MEMORY_UNITS = {
    None: 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_CPU_RE = re.compile(r"([0-9]+)m|([0-9]+)(?:\.([0-9]{1,3}))?")


def memory_bytes(quantity: str) -> int:
    """A memory quantity (`512Mi`, `1Gi`, `600M`, `1048576`) in bytes; ValueError if it is not one."""
    match = _MEMORY_RE.fullmatch(quantity)
    if match is None:
        raise ValueError("must be a memory quantity such as 512Mi, 1Gi or 600M")
    return int(match.group(1)) * _MEMORY_UNITS[match.group(2)]


def cpu_millis(quantity: str) -> int:
    """A CPU quantity (`100m`, `0.5`, `2`) in millicores; ValueError if it is not one."""
    match = _CPU_RE.fullmatch(quantity)
    if match is None:
        raise ValueError("must be a CPU quantity such as 100m, 0.5 or 2")
    if match.group(1) is not None:
        return int(match.group(1))
    return int(match.group(2)) * 1000 + int((match.group(3) or "0").ljust(3, "0"))


def _check_memory(value: str) -> str:
    if memory_bytes(value) <= 0:
        raise ValueError("must be more than 0")
    return value


def _check_cpu(value: str) -> str:
    if cpu_millis(value) <= 0:
        raise ValueError("must be more than 0")
    return value


MemoryQuantity = Annotated[StrictStr, AfterValidator(_check_memory)]
CpuQuantity = Annotated[StrictStr, AfterValidator(_check_cpu)]


class ContainerAmounts(ConfigModel):
    """cpu and memory of a container's requests or limits (None: not set)."""

    cpu: CpuQuantity | None = None
    memory: MemoryQuantity | None = None


class ContainerResources(ConfigModel):
    """A container's requests and limits; a request above its limit is refused."""

    requests: ContainerAmounts = ContainerAmounts()
    limits: ContainerAmounts = ContainerAmounts()

    @model_validator(mode="after")
    def _requests_within_limits(self) -> ContainerResources:
        req, lim = self.requests, self.limits
        if req.memory and lim.memory and memory_bytes(req.memory) > memory_bytes(lim.memory):
            raise ValueError(f"requests.memory ({req.memory}) must not exceed limits.memory ({lim.memory})")
        if req.cpu and lim.cpu and cpu_millis(req.cpu) > cpu_millis(lim.cpu):
            raise ValueError(f"requests.cpu ({req.cpu}) must not exceed limits.cpu ({lim.cpu})")
        return self

    @property
    def memory_limit_bytes(self) -> int | None:
        return memory_bytes(self.limits.memory) if self.limits.memory else None

    def container_resources(self) -> dict[str, dict[str, str]]:
        """The container's `resources`: the amounts set (a key set to null is left out)."""
        dumped = self.model_dump(mode="json", exclude_none=True)
        return {part: amounts for part, amounts in dumped.items() if amounts}


class ManagerRequests(ContainerAmounts):
    cpu: CpuQuantity | None = "100m"
    memory: MemoryQuantity | None = f"{SETTINGS.pod.memory_request_mib}Mi"


class ManagerLimits(ContainerAmounts):
    cpu: CpuQuantity | None = None
    memory: MemoryQuantity | None = f"{SETTINGS.pod.memory_limit_mib}Mi"


class ManagerResources(ContainerResources):
    """The manager container's requests and limits."""

    requests: ManagerRequests = ManagerRequests()
    limits: ManagerLimits = ManagerLimits()


class AgentRequests(ContainerAmounts):
    cpu: CpuQuantity | None = "20m"
    memory: MemoryQuantity | None = "96Mi"


class AgentLimits(ContainerAmounts):
    cpu: CpuQuantity | None = None
    memory: MemoryQuantity | None = "256Mi"


class AgentResources(ContainerResources):
    """The consumer agent container's requests and limits (its install key `resources`)."""

    requests: AgentRequests = AgentRequests()
    limits: AgentLimits = AgentLimits()


class ResourcesConfig(ConfigModel):
    """Container resources of the install's pods."""

    manager: ManagerResources = ManagerResources()


class SizingConfig(ConfigModel):
    """The fleet the install is sized for (`dbprovider lint` checks resources.manager.limits.memory against it).
    Unset, lint uses the sum of the linted Shards' maxDatabases and the number of linted Consumers."""

    expected_databases: Annotated[StrictInt, Field(ge=0)] | None = None
    expected_consumers: Annotated[StrictInt, Field(ge=0)] | None = None


@dataclass(frozen=True)
class ManagerSizing:
    """The manager's peak RSS as measured by `python -m bench.scale` (docs/install.md, "Sizing"): a base, a
    share per 1,000 Databases (each with its credentials Secret) and one per Consumer (with its token Secret),
    each rounded up."""

    base_mib: int = 90
    per_1000_databases_kib: int = 3687  # 3.6 MiB
    per_consumer_kib: int = 7

    def manager_memory_mib(self, databases: int, consumers: int) -> int:
        """The peak RSS (MiB) a manager reaches with this fleet."""
        kib = self.base_mib * 1024 + -(-databases * self.per_1000_databases_kib // 1000)
        return -(-(kib + consumers * self.per_consumer_kib) // 1024)


SIZING = ManagerSizing()


def memory_needed_mib(databases: int, consumers: int, api_connections_bytes: int) -> int:
    """What the manager's memory limit must hold: its peak RSS for the fleet plus the API's connections."""
    return SIZING.manager_memory_mib(databases, consumers) + -(-api_connections_bytes // _MIB)
