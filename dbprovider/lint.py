"""`dbprovider lint PATH...`: check a landscape repository's merge request before Flux applies it.

One source of rules. Each Shard, Consumer and Database spec is parsed by the domain model the CRD's
schema and CEL rules are generated from (domain.specs, infra.crds), object and Secret names by the
domain's name rules, and the install values by domain.config's own parser, so a key another change adds
there is checked here without touching this file. On top come the rules that otherwise only show at
run time, between objects: a hash on two Consumers (both denied), a Consumer without a quota, a
tokenSecretRef outside the release namespace or to a missing key, a Shard whose admin Secret is not in
shardSecrets, whose admin.sslmode may go without TLS or whose admin endpoint is not the one its
shardSecrets entry binds (or a cloudberry Shard while that engine is off), an admin Secret in the linted
files bound to no endpoint (neither its shardSecrets entry nor its own keys name one), duplicate names, and, with
--kubeconfig, a Shard whose maxDatabases is below what is already placed on it.

Which files: every *.yaml / *.yml under the given paths. A document with apiVersion/kind is checked if
it is a Shard, Consumer, Database or Secret and skipped otherwise (a rendered install, a Flux
Kustomization). A document without a kind is the install values if it is in the --values file, in a
file named on the command line, or in a file whose name ends in `values.yaml`/`values.yml`.

Findings never quote a token, a hash or a Secret's value.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml
from pydantic import BaseModel, ValidationError

from dbprovider.clitools import EXIT_FINDINGS, EXIT_INVALID, EXIT_OK, FORMAT_GITHUB, UsageError
from dbprovider.landscape import SecretValueError, decode_data_value, is_secret, read_secret_value
from domain.admin_access import (
    SECRET_HOST_KEY,
    SECRET_PORT_KEY,
    UNBOUND_ADVICE,
    EndpointBinding,
    bound_endpoint,
    tls_refusal,
)
from domain.config import ConfigError, InstallConfig, load_install_config
from domain.constants import (
    GROUP,
    KIND_CONSUMER,
    KIND_DATABASE,
    KIND_SECRET,
    KIND_SHARD,
    KINDS,
    SERVED_API_VERSIONS,
    Engine,
)
from domain.metadata import Identity
from domain.naming import InvalidName, validate_dns1123_label, validate_dns1123_subdomain, validate_secret_key
from domain.settings import SETTINGS
from domain.sizing import memory_needed_mib
from domain.specs import ConsumerSpec, DatabaseSpec, ShardSpec
from domain.tokens import parse_token_hashes
from domain.validation import validation_problems
from infra.crds import object_schema

ERROR = "error"
WARNING = "warning"

# Rule ids, shown with every finding.
RULE_YAML = "yaml"
RULE_SCHEMA = "schema"  # what the apiserver itself would refuse (CRD schema, CEL, object names)
RULE_UNKNOWN_FIELD = "unknown-field"
RULE_VALUES = "values"
RULE_DUPLICATE_NAME = "duplicate-name"
RULE_DUPLICATE_HASH = "duplicate-token-hash"
RULE_QUOTA = "consumer-quota"
RULE_TOKEN_NAMESPACE = "token-secret-namespace"
RULE_TOKEN_SECRET = "token-secret"
RULE_SHARD_SECRET = "shard-secret"
RULE_SHARD_TLS = "shard-admin-tls"
RULE_SHARD_ENDPOINT = "shard-admin-endpoint"
RULE_SHARD_UNBOUND = "shard-admin-unbound"
RULE_ENGINE = "engine-disabled"
RULE_CAPACITY = "shard-capacity"
RULE_NO_VALUES = "no-values"
RULE_MEMORY = "manager-memory"

_SPEC_MODELS: dict[str, type[BaseModel]] = {
    KIND_SHARD: ShardSpec,
    KIND_CONSUMER: ConsumerSpec,
    KIND_DATABASE: DatabaseSpec,
}
_SCHEMA_KEYS = {names.kind: key for key, names in KINDS.items()}
_TOP_LEVEL = {"apiVersion", "kind", "metadata", "spec", "status"}
_VALUES_NAME_RE = r".*values\.ya?ml"
_PATH_TOKEN_RE = re.compile(r"\[(\d+)\]|\['((?:[^'\\]|\\.)*)'\]|([^.\[\s]+)")


@dataclass(frozen=True)
class Finding:
    file: str
    line: int
    obj: str
    field: str
    message: str
    severity: str
    rule: str

    @property
    def where(self) -> str:
        where = f"{self.obj} {self.field}".strip()
        return f"{where}: " if where else ""

    def text(self) -> str:
        return f"{self.file}:{self.line}: {self.severity}: {self.where}{self.message} [{self.rule}]"

    def github(self) -> str:
        props = f"file={_gh_property(self.file)},line={self.line},title={_gh_property(f'dbprovider lint: {self.rule}')}"
        return f"::{self.severity} {props}::{_gh_data(self.where + self.message)}"


def _gh_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_property(text: str) -> str:
    return _gh_data(text).replace(":", "%3A").replace(",", "%2C")


@dataclass
class Document:
    """One YAML document: its data, its node (for line numbers) and where it came from."""

    file: str
    data: Any
    node: yaml.Node | None

    def line(self, path: Sequence[str | int] = ()) -> int:
        """1-based line of the deepest node along `path` that exists (the document's start otherwise)."""
        node = self.node
        if node is None:
            return 1
        line = node.start_mark.line + 1
        for part in path:
            child = None
            if isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                        child = value
                        line = key.start_mark.line + 1
                        break
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
                child = node.value[part]
                line = child.start_mark.line + 1
            if child is None:
                break
            node = child
        return line

    @property
    def kind(self) -> str:
        return Identity.of(self.data).kind

    @property
    def name(self) -> str:
        return Identity.of(self.data).name

    @property
    def namespace(self) -> str:
        return Identity.of(self.data).namespace

    @property
    def label(self) -> str:
        if self.kind == KIND_SECRET:
            return f"{KIND_SECRET} {self.namespace}/{self.name}" if self.namespace else f"{KIND_SECRET} {self.name}"
        return f"{self.kind} {self.name}" if self.kind else "install values"


@dataclass
class Linter:
    """Collects documents, then checks each on its own and all of them together."""

    findings: list[Finding] = field(default_factory=list)
    objects: list[tuple[Document, BaseModel | None]] = field(default_factory=list)
    secrets: list[Document] = field(default_factory=list)
    values: list[tuple[Document, InstallConfig | None]] = field(default_factory=list)

    def report(self, doc: Document, path: Sequence[str | int], message: str, rule: str, severity: str = ERROR) -> None:
        shown = _format_path(path)
        self.findings.append(Finding(doc.file, doc.line(path), doc.label, shown, message, severity, rule))

    # -- reading --------------------------------------------------------------------------------------

    def add_file(self, path: Path, shown: str, values_file: bool) -> None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            self.findings.append(Finding(shown, 1, "", "", f"cannot read: {type(exc).__name__}", ERROR, RULE_YAML))
            return
        try:
            datas = list(yaml.safe_load_all(text))
            nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark is not None else 1
            problem = getattr(exc, "problem", None) or "not valid YAML"
            self.findings.append(Finding(shown, line, "", "", f"not valid YAML: {problem}", ERROR, RULE_YAML))
            return
        for data, node in zip(datas, nodes, strict=False):
            if data is None:
                continue
            doc = Document(shown, data, node)
            if isinstance(data, dict) and ("kind" in data or "apiVersion" in data):
                self.add_object(doc)
            elif values_file:
                self.add_values(doc)

    def add_object(self, doc: Document) -> None:
        api_version = Identity.of(doc.data).api_version
        if is_secret(doc.data):
            self._check_secret(doc)
            self.secrets.append(doc)
            return
        if api_version.split("/")[0] != GROUP:
            return  # not ours: a rendered install, a Flux object...
        if api_version not in SERVED_API_VERSIONS or doc.kind not in _SPEC_MODELS:
            self.report(doc, ["kind"], f"the apiserver serves no {api_version} {doc.kind}", RULE_SCHEMA)
            return
        self.objects.append((doc, self._check_object(doc)))

    def add_values(self, doc: Document) -> None:
        try:
            config = load_install_config(doc.data)
        except ConfigError as exc:
            for path, message in exc.problems:
                self.report(doc, _parse_path(path), message, RULE_VALUES)
            config = None
        self.values.append((doc, config))

    # -- one object -----------------------------------------------------------------------------------

    def _check_name(self, doc: Document, namespaced: bool) -> None:
        """The apiserver's own rules: object names are DNS-1123 subdomains, namespaces DNS-1123 labels."""
        meta = doc.data.get("metadata")
        if not isinstance(meta, dict):
            self.report(doc, ["metadata"], "is required (a mapping with the object's name)", RULE_SCHEMA)
            return
        try:
            validate_dns1123_subdomain(meta.get("name"))
        except InvalidName as exc:
            self.report(doc, ["metadata", "name"], str(exc), RULE_SCHEMA)
        if namespaced and "namespace" in meta:
            try:
                validate_dns1123_label(meta.get("namespace"))
            except InvalidName as exc:
                self.report(doc, ["metadata", "namespace"], str(exc), RULE_SCHEMA)

    def _check_object(self, doc: Document) -> BaseModel | None:
        self._check_name(doc, namespaced=doc.kind == KIND_DATABASE)
        spec = doc.data.get("spec")
        if spec is None:
            self.report(doc, ["spec"], "is required", RULE_SCHEMA)
            return None
        self._unknown_fields(doc)
        try:
            return _SPEC_MODELS[doc.kind].model_validate(spec)
        except ValidationError as exc:
            errors = exc.errors(include_input=False)
            for error, (_, message) in zip(errors, validation_problems(exc), strict=True):
                self.report(doc, ["spec", *error["loc"]], message, RULE_SCHEMA)
            return None

    def _unknown_fields(self, doc: Document) -> None:
        """Fields the CRD's schema does not know: the apiserver drops them, so a typo silently does nothing."""
        schema = object_schema(_SCHEMA_KEYS[doc.kind])
        for key in doc.data:
            if key not in _TOP_LEVEL:
                self.report(
                    doc, [key], "is not a field of the object; the apiserver drops it", RULE_UNKNOWN_FIELD, WARNING
                )
        self._unknown_in(doc, ["spec"], doc.data.get("spec"), schema["properties"]["spec"])

    def _unknown_in(self, doc: Document, path: list[str | int], value: Any, schema: dict[str, Any]) -> None:
        properties = schema.get("properties")
        if not isinstance(value, dict) or properties is None:
            return
        for key, child in value.items():
            if key not in properties:
                message = "is not a field of the schema; the apiserver drops it (a typo?)"
                self.report(doc, [*path, key], message, RULE_UNKNOWN_FIELD, WARNING)
            else:
                self._unknown_in(doc, [*path, key], child, properties[key])

    def _check_secret(self, doc: Document) -> None:
        self._check_name(doc, namespaced=True)
        if "sops" in doc.data:
            return  # SOPS-encrypted: the values cannot be read here
        for section in ("data", "stringData"):
            content = doc.data.get(section)
            if content is None:
                continue
            if not isinstance(content, dict):
                self.report(doc, [section], "must be a mapping of keys to values", RULE_SCHEMA)
                continue
            for key, value in content.items():
                try:
                    validate_secret_key(key)
                    if section == "data":
                        decode_data_value(value, key)
                    elif not isinstance(value, str):
                        raise SecretValueError(f"stringData.{key} must be a string")
                except (InvalidName, SecretValueError) as exc:
                    message = str(exc).removeprefix(f"{section}.{key} ")
                    self.report(doc, [section, str(key)], message, RULE_SCHEMA)

    # -- between objects ------------------------------------------------------------------------------

    def finish(self, kubeconfig: str | None = None) -> list[Finding]:
        config = self._config()
        self._duplicates()
        self._consumers(config)
        self._shards(config)
        self._unbound_admin_secrets(config)
        self._sizing(config)
        if kubeconfig:
            self._live_capacity(kubeconfig)
        return sorted(self.findings, key=lambda f: (f.file, f.line, f.rule))

    def _config(self) -> InstallConfig | None:
        if len(self.values) > 1:
            first = self.values[0][0]
            for doc, _ in self.values[1:]:
                self.report(
                    doc,
                    [],
                    f"second install values document (the first is in {first.file}); lint one DB cluster at a time",
                    RULE_VALUES,
                )
        config = self.values[0][1] if self.values else None
        if not self.values and self.objects:
            message = (
                "no install values given (--values FILE): the release namespace, shardSecrets and engine rules "
                "were not checked"
            )
            self.findings.append(Finding(self.objects[0][0].file, 1, "", "", message, WARNING, RULE_NO_VALUES))
        return config

    def _sizing(self, config: InstallConfig | None) -> None:
        """The manager's memory limit holds what the documented sizing (domain.sizing) needs for the fleet:
        sizing.expectedDatabases and expectedConsumers, else the linted Shards' maxDatabases summed (the most the
        shards take) and the linted Consumers counted."""
        if config is None or not self.values:
            return
        limit = config.resources.manager.memory_limit_bytes
        if limit is None:
            return
        specs = [spec for _, spec in self.objects]
        sizing = config.sizing
        databases = sizing.expected_databases
        if databases is None:
            databases = sum(spec.max_databases for spec in specs if isinstance(spec, ShardSpec))
        consumers = sizing.expected_consumers
        if consumers is None:
            consumers = sum(1 for spec in specs if isinstance(spec, ConsumerSpec))
        connections = config.api.max_connections * SETTINGS.pod.connection_bytes
        needed = memory_needed_mib(databases, consumers, connections)
        if limit >= needed * 2**20:
            return
        source = "sizing.expectedDatabases" if sizing.expected_databases is not None else "the Shards' maxDatabases"
        self.report(
            self.values[0][0],
            ["resources", "manager", "limits", "memory"],
            f"is {config.resources.manager.limits.memory}, below the {needed}Mi the manager needs for {databases} "
            f"Databases ({source}) and {consumers} Consumers with api.maxConnections {config.api.max_connections} "
            "(docs/install.md, Sizing): the replicas would be OOM-killed one after the other",
            RULE_MEMORY,
            WARNING,
        )

    def _duplicates(self) -> None:
        seen: dict[tuple[str, str, str], Document] = {}
        for doc in [d for d, _ in self.objects] + self.secrets:
            if not doc.name:
                continue
            key = (doc.kind, doc.namespace if doc.kind in (KIND_SECRET, KIND_DATABASE) else "", doc.name)
            if key in seen:
                first = seen[key]
                message = f"is also defined at {first.file}:{first.line()}; only one of them would be applied"
                self.report(doc, ["metadata", "name"], message, RULE_DUPLICATE_NAME)
            else:
                seen[key] = doc

    def _secret(self, namespace: str, name: str) -> Document | None:
        for doc in self.secrets:
            if doc.name == name and doc.namespace == namespace:
                return doc
        return None

    def _consumers(self, config: InstallConfig | None) -> None:
        owners: dict[str, list[Document]] = defaultdict(list)
        for doc, spec in self.objects:
            if doc.kind != KIND_CONSUMER or not isinstance(spec, ConsumerSpec):
                continue
            if spec.max_databases is None:
                self.report(
                    doc,
                    ["spec"],
                    "has no maxDatabases: without a quota this consumer can fill every shard; set it on every consumer",
                    RULE_QUOTA,
                    WARNING,
                )
            ref = spec.token_secret_ref
            if config is not None and ref.namespace != config.namespace:
                self.report(
                    doc,
                    ["spec", "tokenSecretRef", "namespace"],
                    f"is {ref.namespace!r}, not the release "
                    f"namespace {config.namespace!r}: this consumer can never authenticate",
                    RULE_TOKEN_NAMESPACE,
                )
            secret = self._secret(ref.namespace, ref.name)
            if secret is None:
                self.report(
                    doc,
                    ["spec", "tokenSecretRef", "name"],
                    f"Secret {ref.namespace}/{ref.name} is not in "
                    "the linted files; the consumer cannot authenticate until it exists",
                    RULE_TOKEN_SECRET,
                    WARNING,
                )
                continue
            if "sops" in secret.data:
                continue
            for digest in self._hashes(doc, secret, ref.key):
                owners[digest].append(doc)
        for docs in owners.values():
            names = sorted({d.name for d in docs})
            if len(names) < 2:
                continue
            for doc in docs:
                others = ", ".join(n for n in names if n != doc.name)
                self.report(
                    doc,
                    ["spec", "tokenSecretRef"],
                    f"a token hash of this consumer is also configured for "
                    f"{others}: the provider denies every consumer that shares a hash",
                    RULE_DUPLICATE_HASH,
                )

    def _hashes(self, consumer: Document, secret: Document, key: str) -> frozenset[str]:
        try:
            value = read_secret_value(secret.data, key)
        except SecretValueError:
            return frozenset()  # reported on the Secret already
        if value is None:
            self.report(
                consumer,
                ["spec", "tokenSecretRef", "key"],
                f"{secret.label} has no key {key!r}; the consumer cannot authenticate",
                RULE_TOKEN_SECRET,
            )
            return frozenset()
        parsed = parse_token_hashes(value.text)
        section = [value.section, key]
        if not parsed.hashes:
            self.report(
                secret, section, "holds no SHA-256 hex digest: the consumer cannot authenticate", RULE_TOKEN_SECRET
            )
        if parsed.ignored_lines:
            self.report(
                secret,
                section,
                f"{parsed.ignored_lines} line(s) are not SHA-256 hex digests and are "
                "ignored by the provider (a pasted token? remove it)",
                RULE_TOKEN_SECRET,
                WARNING,
            )
        return parsed.hashes

    def _shards(self, config: InstallConfig | None) -> None:
        if config is None:
            return
        for doc, spec in self.objects:
            if doc.kind != KIND_SHARD or not isinstance(spec, ShardSpec):
                continue
            ref = spec.admin.secret_ref
            listed = any(s.namespace == ref.namespace and s.name == ref.name for s in config.shard_secrets)
            if not listed:
                self.report(
                    doc,
                    ["spec", "admin", "secretRef"],
                    f"Secret {ref.namespace}/{ref.name} is not listed "
                    "in the install values' shardSecrets: the provider will not use it and the Shard stays "
                    "not Ready (AdminSecretInvalid)",
                    RULE_SHARD_SECRET,
                )
            refusal = tls_refusal(doc.name, spec.admin.sslmode, config.shard_tls.cleartext_shards)
            if refusal is not None:
                self.report(
                    doc,
                    ["spec", "admin", "sslmode"],
                    f"{refusal}: the Shard stays not Ready (AdminTlsRequired)",
                    RULE_SHARD_TLS,
                )
            entry = next((s for s in config.shard_secrets if (s.namespace, s.name) == (ref.namespace, ref.name)), None)
            binding = EndpointBinding(entry.host, entry.port) if entry is not None else EndpointBinding()
            mismatch = binding.refusal(f"{ref.namespace}/{ref.name}", spec.admin_host, spec.admin.port)
            if mismatch:
                self.report(
                    doc,
                    ["spec", "admin"],
                    f"{mismatch} (its shardSecrets entry): the Shard stays not Ready (AdminEndpointMismatch)",
                    RULE_SHARD_ENDPOINT,
                )
            if spec.engine == Engine.CLOUDBERRY and not config.engines.cloudberry.enabled:
                self.report(
                    doc,
                    ["spec", "engine"],
                    "is cloudberry but engines.cloudberry.enabled is false in the "
                    "install values: the provider cannot read the DatabaseCluster",
                    RULE_ENGINE,
                )

    def _unbound_admin_secrets(self, config: InstallConfig | None) -> None:
        """A warning on each shardSecrets entry whose Secret is in the linted files and bound to no endpoint
        (a Secret elsewhere, or SOPS-encrypted, cannot be told from here: `upgrade check` reads it)."""
        if config is None:
            return
        doc = self.values[0][0]
        for index, entry in enumerate(config.shard_secrets):
            secret = self._secret(entry.namespace, entry.name)
            if secret is None or "sops" in secret.data:
                continue
            values = {}
            for key in (SECRET_HOST_KEY, SECRET_PORT_KEY):
                try:
                    value = read_secret_value(secret.data, key)
                except SecretValueError:
                    continue  # reported on the Secret already
                if value is not None:
                    text = value.text
                    values[key] = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
            if bound_endpoint(EndpointBinding(entry.host, entry.port), values) is None:
                message = f"admin Secret {entry.namespace}/{entry.name} {UNBOUND_ADVICE}"
                self.report(doc, ["shardSecrets", index], message, RULE_SHARD_UNBOUND, WARNING)

    def _live_capacity(self, kubeconfig: str) -> None:
        from dbprovider.livecluster import LiveClusterError, placed_databases

        shards = [(doc, spec) for doc, spec in self.objects if doc.kind == KIND_SHARD and isinstance(spec, ShardSpec)]
        try:
            placed = placed_databases(kubeconfig, [doc.name for doc, _ in shards])
        except LiveClusterError as exc:
            raise UsageError(f"--kubeconfig {kubeconfig}: {exc}") from None
        for doc, spec in shards:
            count = placed.get(doc.name)
            if count is not None and spec.max_databases < count:
                self.report(
                    doc,
                    ["spec", "maxDatabases"],
                    f"is {spec.max_databases} but {count} databases are "
                    "already placed on this shard: it takes no new ones and its capacity alert fires",
                    RULE_CAPACITY,
                )


def _format_path(path: Sequence[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _parse_path(text: str) -> list[str | int]:
    """`shardSecrets[0].name` (domain.validation's notation) back into parts, for the line number."""
    text = text.removesuffix(" (key)")
    parts: list[str | int] = []
    for index, quoted, plain in _PATH_TOKEN_RE.findall(text):
        parts.append(int(index) if index else (quoted or plain))
    return parts


def _yaml_files(root: Path) -> Iterable[Path]:
    for path in sorted(root.rglob("*")):
        if path.suffix in (".yaml", ".yml") and path.is_file() and not any(p.startswith(".") for p in path.parts):
            yield path


def lint_paths(paths: Sequence[str], values: str | None = None, kubeconfig: str | None = None) -> list[Finding]:
    """Every finding for the given files and directories (raises UsageError for a missing path)."""
    linter = Linter()
    seen: set[Path] = set()
    if values is not None:
        if not Path(values).is_file():
            raise UsageError(f"--values {values}: no such file")
        seen.add(Path(values).resolve())
        linter.add_file(Path(values), values, values_file=True)
    for given in paths:
        root = Path(given)
        if not root.exists():
            raise UsageError(f"{given}: no such file or directory")
        if root.is_dir():
            for path in _yaml_files(root):
                if path.resolve() not in seen:
                    seen.add(path.resolve())
                    linter.add_file(path, str(path), values_file=bool(re.fullmatch(_VALUES_NAME_RE, path.name)))
        elif root.resolve() not in seen:
            seen.add(root.resolve())
            linter.add_file(root, given, values_file=True)
    return linter.finish(kubeconfig)


def run_lint(args: argparse.Namespace, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    out, err = stdout or sys.stdout, stderr or sys.stderr
    try:
        findings = lint_paths(args.paths, args.values, args.kubeconfig)
    except UsageError as exc:
        print(f"dbprovider lint: {exc}", file=err)
        return EXIT_INVALID
    for finding in findings:
        print(finding.github() if args.format == FORMAT_GITHUB else finding.text(), file=out)
    errors = sum(1 for f in findings if f.severity == ERROR)
    warnings = len(findings) - errors
    print(f"dbprovider lint: {errors} error(s), {warnings} warning(s)", file=err)
    return EXIT_FINDINGS if errors else EXIT_OK
