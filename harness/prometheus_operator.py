"""The real Prometheus Operator CRDs (ServiceMonitor, PrometheusRule), so tests apply the operator's own schemas.

hack/build-pulumi.sh is the one place they are fetched and their version pinned: it copies
`example/prometheus-operator-crd/` of the operator's Go module into
$DBPROVIDER_CACHE/prometheus-operator/<version>, once per version (hack/setup.sh runs it). `crd_paths()`
runs it with `--crds`, which returns at once from that cache and fetches only on a machine where setup
has not run yet, so tests/generator and tests/pulumi read the very same files.
"""

from __future__ import annotations

import subprocess
from functools import lru_cache
from pathlib import Path

BUILD_SCRIPT = Path(__file__).resolve().parent.parent / "hack" / "build-pulumi.sh"
CRD_FILES = ("monitoring.coreos.com_servicemonitors.yaml", "monitoring.coreos.com_prometheusrules.yaml")


class OperatorCrdsUnavailable(RuntimeError):
    """hack/build-pulumi.sh could not fetch the CRDs (no `go`, no Go module proxy)."""


@lru_cache(maxsize=1)
def crd_dir() -> Path:
    """The cached CRD directory, fetched first if missing."""
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--crds"], capture_output=True, text=True, timeout=600, check=False
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise OperatorCrdsUnavailable(f"bash {BUILD_SCRIPT} --crds exited {result.returncode}: {result.stderr.strip()}")
    return Path(lines[-1])


def crd_paths() -> tuple[Path, Path]:
    """(servicemonitors CRD, prometheusrules CRD) of the pinned Prometheus Operator release."""
    servicemonitors, prometheusrules = (crd_dir() / name for name in CRD_FILES)
    missing = [str(path) for path in (servicemonitors, prometheusrules) if not path.is_file()]
    if missing:
        raise OperatorCrdsUnavailable(f"{', '.join(missing)} not found after bash {BUILD_SCRIPT} --crds")
    return servicemonitors, prometheusrules
