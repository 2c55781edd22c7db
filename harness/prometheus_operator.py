"""The real Prometheus Operator CRDs (ServiceMonitor, PrometheusRule), from the operator's Go module.

`crd_paths()` runs `go mod download -json` once per process (the Go module proxy, or the module cache
when it has the version) and returns the two CRD files of `example/prometheus-operator-crd/`, so tests
apply the operator's own schemas to the real apiserver instead of a copy kept here.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

MODULE = "github.com/prometheus-operator/prometheus-operator"
VERSION = "v0.85.0"
CRD_DIR = "example/prometheus-operator-crd"
CRD_FILES = ("monitoring.coreos.com_servicemonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml")


class OperatorCrdsUnavailable(RuntimeError):
    """`go` is missing or the module could not be downloaded."""


@lru_cache(maxsize=1)
def module_dir() -> Path:
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if go is None:
        raise OperatorCrdsUnavailable("go not found: it is needed to fetch the Prometheus Operator CRDs")
    result = subprocess.run(
        [go, "mod", "download", "-json", f"{MODULE}@{VERSION}"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    try:
        info = json.loads(result.stdout)
    except json.JSONDecodeError:
        info = {}
    if result.returncode != 0 or not info.get("Dir"):
        detail = info.get("Error") or result.stderr
        raise OperatorCrdsUnavailable(f"go mod download {MODULE}@{VERSION} failed: {detail}")
    return Path(info["Dir"])


def crd_paths() -> tuple[Path, Path]:
    """(servicemonitors CRD, prometheusrules CRD) of Prometheus Operator v0.85.0."""
    base = module_dir() / CRD_DIR
    servicemonitors, prometheusrules = (base / name for name in CRD_FILES)
    return servicemonitors, prometheusrules
