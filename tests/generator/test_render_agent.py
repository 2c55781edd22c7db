"""`dbprovider render --agent`: the consumer agent's objects from its values, and the examples of
docs/consumers.md (the values file and the claim) valid as written."""

from __future__ import annotations

import io
from pathlib import Path

import yaml

from dbprovider.render import EXIT_INVALID, EXIT_OK, run_render_agent
from domain.agent_config import load_agent_config
from domain.specs import DatabaseClaimSpec
from infra.render import render_agent_manifests
from tests.support.documented import file_block

DOC = Path(__file__).resolve().parents[2] / "docs" / "consumers.md"


def test_the_documented_values_and_claim_are_valid() -> None:
    values, claim = (yaml.safe_load(file_block(DOC, name)) for name in ("agent.yaml", "claim.yaml"))
    assert isinstance(values, dict) and isinstance(claim, dict)
    config = load_agent_config(values)
    assert config.ca_secret == "dbprovider-ca"
    assert claim["kind"] == "DatabaseClaim"
    assert DatabaseClaimSpec.model_validate(claim["spec"]).size_class == "small"


def test_render_agent_writes_the_objects(tmp_path: Path) -> None:
    values = tmp_path / "agent.yaml"
    values.write_text(yaml.safe_dump({"providerUrl": "https://p.example:8443", "tokenSecret": "tok"}))
    out = tmp_path / "agent-objects.yaml"
    assert run_render_agent(str(values), str(out), stderr=io.StringIO()) == EXIT_OK
    objects = list(yaml.safe_load_all(out.read_text()))
    assert objects == render_agent_manifests(load_agent_config(yaml.safe_load(values.read_text())))
    assert [o["kind"] for o in objects][:1] == ["CustomResourceDefinition"]
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["agent", "--provider-url", "https://p.example:8443"]
    assert "--ca-file" not in args  # no caSecret: the system CAs


def test_invalid_values_name_the_key(tmp_path: Path) -> None:
    values = tmp_path / "agent.yaml"
    values.write_text(yaml.safe_dump({"providerUrl": "http://plain.example", "tokenSecret": "tok"}))
    err = io.StringIO()
    assert run_render_agent(str(values), str(tmp_path / "out.yaml"), stderr=err) == EXIT_INVALID
    assert "providerUrl" in err.getvalue() and "https://" in err.getvalue()
