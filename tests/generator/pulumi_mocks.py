"""Run the Pulumi program (infra/__main__.py) under `pulumi.runtime.set_mocks` and record what it registers.

No Pulumi CLI or engine is involved: the mock monitor answers every registration, and a subclass of it keeps
each request's type, name, parent, provider, dependencies and inputs for the assertions.
"""

from __future__ import annotations

import json
import runpy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc

REPO_ROOT = Path(__file__).resolve().parents[2]
PROGRAM = REPO_ROOT / "infra" / "__main__.py"


@dataclass
class Registration:
    typ: str
    name: str
    urn: str
    parent: str
    provider: str
    dependencies: list[str]
    inputs: dict[str, Any]
    custom: bool
    retain_on_delete: bool


@dataclass
class ProgramRun:
    registrations: list[Registration] = field(default_factory=list)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)  # urn -> registered outputs
    logs: list[tuple[str, str]] = field(default_factory=list)

    def of_type(self, typ: str) -> list[Registration]:
        return [r for r in self.registrations if r.typ == typ]

    def by_urn(self, urn: str) -> Registration:
        (found,) = [r for r in self.registrations if r.urn == urn]
        return found

    def kubernetes_objects(self) -> list[Registration]:
        return [r for r in self.registrations if r.custom and r.typ.startswith("kubernetes:")]

    def warnings(self) -> list[str]:
        return [msg for level, msg in self.logs if level == "warning"]


class _Mocks(pulumi.runtime.Mocks):
    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        return {}


class _RecordingMonitor(pulumi_mocks.MockMonitor):
    def __init__(self, mocks: pulumi.runtime.Mocks, run: ProgramRun) -> None:
        super().__init__(mocks)
        self.run = run

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            self.run.registrations.append(
                Registration(
                    typ=request.type,
                    name=request.name,
                    urn=response.urn,
                    parent=request.parent,
                    provider=request.provider,
                    dependencies=list(request.dependencies),
                    inputs=rpc.deserialize_properties(request.object),
                    custom=bool(request.custom),
                    retain_on_delete=bool(request.retainOnDelete),
                )
            )
        return response

    def RegisterResourceOutputs(self, request: Any) -> Any:  # noqa: N802
        self.run.outputs[request.urn] = rpc.deserialize_properties(request.outputs)
        return super().RegisterResourceOutputs(request)


class _Logger:
    def __init__(self, run: ProgramRun) -> None:
        self.run = run

    def _log(self, level: str, msg: str, *args: Any, **_: Any) -> None:
        self.run.logs.append((level, msg % args if args else msg))

    def debug(self, msg: str, *args: Any, **kw: Any) -> None:
        self._log("debug", msg, *args)

    def info(self, msg: str, *args: Any, **kw: Any) -> None:
        self._log("info", msg, *args)

    def warning(self, msg: str, *args: Any, **kw: Any) -> None:
        self._log("warning", msg, *args)

    warn = warning

    def error(self, msg: str, *args: Any, **kw: Any) -> None:
        self._log("error", msg, *args)


def stack_config(values: dict[str, Any]) -> dict[str, str]:
    """Stack config as the engine passes it: `dbprovider:<key>` -> string (structured values as JSON)."""
    return {
        f"dbprovider:{key}": value if isinstance(value, str) else json.dumps(value) for key, value in values.items()
    }


def run_program(config: dict[str, Any], *, preview: bool = True) -> ProgramRun:
    """Run infra/__main__.py with `config` as the `dbprovider:` stack config; return what it registered."""
    return run_body(lambda: runpy.run_path(str(PROGRAM), run_name="__pulumi_program__"), config, preview=preview)


def run_body(body: Callable[[], object], config: dict[str, Any] | None = None, *, preview: bool = True) -> ProgramRun:
    """Run `body` (a program, or code that creates a component) under the mocks; return what it registered."""
    run = ProgramRun()
    mocks = _Mocks()
    monitor = _RecordingMonitor(mocks, run)
    pulumi.runtime.set_mocks(mocks, preview=preview, monitor=monitor, logger=_Logger(run))  # type: ignore[arg-type]
    pulumi.runtime.set_all_config(stack_config(config or {}), secret_keys=[])

    @pulumi.runtime.test
    def program() -> None:
        body()

    program()
    return run
