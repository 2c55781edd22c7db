#!/usr/bin/env bash
# Builds CoreDNS, the cluster DNS of the harness' one-node Kubernetes (harness/node.py), from the Go
# module proxy: the wrapper module hack/coredns pins the version and chooses the plugins (main.go).
# Cached under $DBPROVIDER_CACHE/coredns/<version>-<hash of go.mod, go.sum and main.go>; prints the
# directory on its last line; `--dir` prints it without building.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mod="$here/coredns"
cache=${DBPROVIDER_CACHE:-$HOME/.cache/dbprovider}
version=$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" {print $3}' "$mod/go.mod")
[ -n "$version" ] || { echo "build-coredns: no github.com/coredns/coredns version in $mod/go.mod" >&2; exit 1; }
digest=$(cat "$mod/go.mod" "$mod/go.sum" "$mod/main.go" | sha256sum | cut -c1-12)
out="$cache/coredns/$version-$digest"
if [ "${1:-}" = "--dir" ]; then echo "$out"; exit 0; fi
if [ -x "$out/coredns" ]; then echo "$out"; exit 0; fi
mkdir -p "$cache/coredns"
exec 9>"$out.lock"
flock 9
if [ -x "$out/coredns" ]; then echo "$out"; exit 0; fi
tmp="$out.tmp.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
cd "$mod"
echo "build-coredns: building CoreDNS $version" >&2
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$version" \
  -o "$tmp/coredns" .
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "$out"
