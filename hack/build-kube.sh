#!/usr/bin/env bash
# Builds the real kube-apiserver and etcd used by the test harness from the Go module proxy.
# The versions are pinned in hack/kube/go.mod; the binaries are cached under
# $DBPROVIDER_CACHE/kube/<kubernetes version>-<hash of go.mod and go.sum> so a second run is instant.
# Prints the directory holding the binaries on its last line; `--dir` prints it without building.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mod="$here/kube"
cache=${DBPROVIDER_CACHE:-$HOME/.cache/dbprovider}
kube_version=$(awk '$1 == "k8s.io/kubernetes" {print $2}' "$mod/go.mod" | head -n1)
[ -n "$kube_version" ] || { echo "build-kube: no k8s.io/kubernetes version in $mod/go.mod" >&2; exit 1; }
digest=$(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -c1-12)
out="$cache/kube/$kube_version-$digest"
if [ "${1:-}" = "--dir" ]; then echo "$out"; exit 0; fi
if [ -x "$out/kube-apiserver" ] && [ -x "$out/etcd" ]; then
  echo "$out"
  exit 0
fi
# One build at a time per version: parallel setups (several checkouts, several test runs) wait for
# the first instead of compiling the same packages side by side on a small machine.
mkdir -p "$cache/kube"
exec 9>"$out.lock"
flock 9
if [ -x "$out/kube-apiserver" ] && [ -x "$out/etcd" ]; then
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
echo "build-kube: building kube-apiserver $kube_version and etcd (a cold build takes several minutes)" >&2
CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "$out"
