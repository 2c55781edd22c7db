"""The install config across releases: a pod mounts the ConfigMap by name, so during a rolling update
a pod of one release may start on the ConfigMap another release rendered.

- This release's rendered config must be readable by the previous release (its own strict parser, in
  its own virtualenv): an old pod that restarts mid-rollout (a crash, an eviction) must start. A key
  this release adds breaks that unless it is left out of the render while it has its default;
  changing this test is a decision for CHANGELOG.md and docs/upgrade.md, not a fix.
- This release ignores keys it does not know in the mounted config (a newer release's), with a warning,
  so the next upgrade does not depend on that care; `render` and `lint` stay strict.
"""

from __future__ import annotations

import logging
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from dbprovider.manager import load_rendered_config
from domain.config import ConfigError, load_install_config
from harness.releases import BuiltRelease
from infra.render import config_yaml
from tests.upgrade.stack import VALUES

PREVIOUS_PARSER = textwrap.dedent(
    """
    import sys
    from domain.config import ConfigError, load_install_config_file
    try:
        load_install_config_file(sys.argv[1])
    except ConfigError as exc:
        print(exc)
        sys.exit(1)
    """
)

CONFIGS = {
    "defaults": {"tls": {"secretName": "tls"}},
    "upgrade-suite": {**VALUES, "shardSecrets": [{"namespace": "shards", "name": "pg-provisioner"}]},
}


@pytest.mark.parametrize("values", CONFIGS.values(), ids=CONFIGS.keys())
def test_the_previous_release_starts_on_this_releases_rendered_config(
    previous: BuiltRelease, tmp_path: Path, values: dict
) -> None:
    rendered = tmp_path / "config.yaml"
    rendered.write_text(config_yaml(load_install_config(values)))
    out = subprocess.run(
        [str(previous.python), "-c", PREVIOUS_PARSER, str(rendered)],
        capture_output=True,
        text=True,
        env=previous.env(),
        cwd=previous.root,
    )
    assert out.returncode == 0, (
        f"{previous.release.version} refuses the install config this release renders: {out.stdout.strip()}; "
        "its pods could not restart during the rolling update"
    )


def test_this_release_ignores_a_newer_releases_keys_in_the_mounted_config_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    newer = {
        **CONFIGS["defaults"],
        "keyOfTheNextRelease": {"enabled": True},
        "sizeClasses": {"small": {"connectionLimit": 5, "alsoNew": 1}},
    }
    mounted = tmp_path / "config.yaml"
    mounted.write_text(yaml.safe_dump(newer))
    with caplog.at_level(logging.WARNING, logger="dbprovider.manager"):
        config = load_rendered_config(str(mounted))
    assert config.size_classes["small"].connection_limit == 5
    assert sorted(caplog.records[0].keys) == ["keyOfTheNextRelease", "sizeClasses.small.alsoNew"]
    with pytest.raises(ConfigError, match="is not a known key"):
        load_install_config(newer)  # render, lint and dev still refuse a typo
    mounted.write_text(yaml.safe_dump({**newer, "replicas": "two"}))
    with pytest.raises(ConfigError, match="replicas"):
        load_rendered_config(str(mounted))  # a wrong value still stops the start
