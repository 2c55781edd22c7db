#!/usr/bin/env bash
# Builds the real kube-apiserver and etcd used by the test harness from the Go module proxy.
# The versions are pinned in hack/kube/go.mod; the binaries are cached under
# $DBPROVIDER_CACHE/kube/<kubernetes version>-<hash of go.mod and go.sum> so a second run is instant.
# Prints the directory holding the binaries on its last line; `--dir` prints it without building.
#
# `--node` builds the node's binaries instead (kubelet, kube-controller-manager, kube-scheduler,
# kube-proxy, kubectl; harness/node.py runs them), from the same module and so the same pinned
# k8s.io/kubernetes, into $DBPROVIDER_CACHE/kube-node/<version>-<hash>. `--node --dir` prints that.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mod="$here/kube"
cache=${DBPROVIDER_CACHE:-$HOME/.cache/dbprovider}
kube_version=$(awk '$1 == "k8s.io/kubernetes" {print $2}' "$mod/go.mod" | head -n1)
[ -n "$kube_version" ] || { echo "build-kube: no k8s.io/kubernetes version in $mod/go.mod" >&2; exit 1; }
digest=$(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -c1-12)
kind=kube
binaries=(kube-apiserver etcd)
if [ "${1:-}" = "--node" ]; then
  shift
  kind=kube-node
  binaries=(kubelet kube-controller-manager kube-scheduler kube-proxy kubectl)
fi
out="$cache/$kind/$kube_version-$digest"
if [ "${1:-}" = "--dir" ]; then echo "$out"; exit 0; fi
built() {
  for b in "${binaries[@]}"; do [ -x "$out/$b" ] || return 1; done
}
if built; then
  echo "$out"
  exit 0
fi
# One build at a time per version: parallel setups (several checkouts, several test runs) wait for
# the first instead of compiling the same packages side by side on a small machine.
mkdir -p "$cache/$kind"
exec 9>"$out.lock"
flock 9
if built; then
  echo "$out"
  exit 0
fi
major=${kube_version#v}; major=${major%%.*}
minor=${kube_version#v*.}; minor=${minor%%.*}
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitVersion=$kube_version"
tmp="$out.tmp.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
cd "$mod"
echo "build-kube: building ${binaries[*]} $kube_version (a cold build takes several minutes)" >&2
for b in "${binaries[@]}"; do
  case $b in
    etcd) CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3 ;;
    *) CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp/$b" "k8s.io/kubernetes/cmd/$b" ;;
  esac
done
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "$out"
