#!/usr/bin/env bash
# Builds the real Pulumi CLI, its Python language host and the Kubernetes provider that
# tests/pulumi runs `pulumi up` with, from the Go module proxy only (versions pinned in the wrapper
# modules under hack/pulumi/), and fetches the Prometheus Operator's CRDs from its Go module: the one
# place they are fetched (harness/prometheus_operator.py runs `--crds`; tests/generator and tests/pulumi
# apply them).
# Binaries are cached under $DBPROVIDER_CACHE/pulumi/<cli version>-<hash of the wrapper modules>,
# the CRDs under $DBPROVIDER_CACHE/prometheus-operator/<version>, so a second run is instant.
# A cold build is ~30 min of CPU, so it runs under `nice`.
# Prints the directory holding the binaries on its last line; `--dir` prints it without building,
# `--crds` fetches the CRDs only (when missing) and prints their directory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mods="$here/pulumi"
cache=${DBPROVIDER_CACHE:-$HOME/.cache/dbprovider}
# The Prometheus Operator release whose CRDs (example/prometheus-operator-crd/ of its module zip)
# the suite installs on its apiservers; a plain module download, not a dependency of any build.
promop_module=github.com/prometheus-operator/prometheus-operator
promop_version=v0.85.0
crd_dir="$cache/prometheus-operator/$promop_version"

modver() { awk -v m="$2" '$1 == m {print $2} $1 == "require" && $2 == m {print $3}' "$mods/$1/go.mod" | head -n1; }
cli_version=$(modver cli github.com/pulumi/pulumi/pkg/v3)
python_sdk_version=$(modver language-python github.com/pulumi/pulumi/sdk/v3)
k8s_module=github.com/pulumi/pulumi-kubernetes/provider/v4
k8s_pseudo=$(modver kubernetes "$k8s_module")
for v in cli_version python_sdk_version k8s_pseudo; do
  [ -n "${!v}" ] || { echo "build-pulumi: no $v in $mods/*/go.mod" >&2; exit 1; }
done
# The only provider version the proxy serves is a pseudo-version of the v4.25 development line;
# the provider reports this version to the engine (and the engine only warns that the SDK wants newer).
k8s_version="4.25.0-dev.${k8s_pseudo##*-}"
digest=$(cat "$mods"/*/go.mod "$mods"/*/go.sum | sha256sum | cut -c1-12)
out="$cache/pulumi/$cli_version-$digest"
case "${1:-}" in
  --dir) echo "$out"; exit 0 ;;
  --crds | "") ;;
  *) echo "build-pulumi: unknown argument $1 (--dir, --crds or none)" >&2; exit 2 ;;
esac

moddir() { awk -F'"' '$2 == "Dir" {print $4}'; }
# Run at niceness DBPROVIDER_NICE (default 10) in absolute terms, so `nice bash hack/build-pulumi.sh`
# does not push the build down to 19, where the rest of a busy machine starves it.
niceness=${DBPROVIDER_NICE:-10}
run() { nice -n $(( niceness > $(nice) ? niceness - $(nice) : 0 )) "$@"; }
export CGO_ENABLED=0

crds_fetched() {
  [ -s "$crd_dir/monitoring.coreos.com_servicemonitors.yaml" ] \
    && [ -s "$crd_dir/monitoring.coreos.com_prometheusrules.yaml" ]
}
if ! crds_fetched; then
  # One fetch at a time per version, so parallel test processes never see a half-copied directory.
  mkdir -p "$cache/prometheus-operator"
  exec 8>"$crd_dir.lock"
  flock 8
  if ! crds_fetched; then
    echo "build-pulumi: fetching the Prometheus Operator $promop_version CRDs" >&2
    empty=$(mktemp -d)
    src=$(cd "$empty" && GOWORK=off go mod download -json "$promop_module@$promop_version" | moddir)
    rmdir "$empty"
    [ -d "$src/example/prometheus-operator-crd" ] || { echo "build-pulumi: no CRDs in $src" >&2; exit 1; }
    rm -rf "$crd_dir.tmp.$$"
    mkdir -p "$crd_dir.tmp.$$"
    cp "$src"/example/prometheus-operator-crd/*.yaml "$crd_dir.tmp.$$/"
    chmod -R u+w "$crd_dir.tmp.$$"
    rm -rf "$crd_dir"
    mv "$crd_dir.tmp.$$" "$crd_dir"
  fi
  exec 8>&-
fi
if [ "${1:-}" = --crds ]; then echo "$crd_dir"; exit 0; fi

built() {
  [ -x "$out/pulumi" ] && [ -x "$out/pulumi-language-python" ] \
    && [ -x "$out/pulumi-language-python-exec" ] && [ -x "$out/pulumi-resource-kubernetes" ]
}
if built; then echo "$out"; exit 0; fi
# One build at a time per version (as build-kube.sh): a parallel setup waits for the first one.
mkdir -p "$cache/pulumi"
exec 9>"$out.lock"
flock 9
if built; then echo "$out"; exit 0; fi
tmp="$out.tmp.$$"
mkdir -p "$tmp/kubernetes-src"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
echo "build-pulumi: building pulumi $cli_version, pulumi-language-python $python_sdk_version and" \
  "pulumi-resource-kubernetes $k8s_version (a cold build is ~30 min of CPU)" >&2

# The language host of sdk/v3 v3.79.0 and the script it runs Python programs with, which it looks
# for next to itself.
cd "$mods/language-python"
run go build -trimpath -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$python_sdk_version" \
  -o "$tmp/pulumi-language-python" github.com/pulumi/pulumi/sdk/v3/python/cmd/pulumi-language-python
sdk_dir=$(go mod download -json github.com/pulumi/pulumi/sdk/v3 | moddir)
install -m 0755 "$sdk_dir/python/cmd/pulumi-language-python-exec" "$tmp/pulumi-language-python-exec"
echo "build-pulumi: pulumi-language-python built at $((SECONDS - start)) s" >&2

# The CLI; without the version stamp `pulumi version` prints nothing.
cd "$mods/cli"
run go build -trimpath -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$cli_version" \
  -o "$tmp/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
echo "build-pulumi: pulumi built at $((SECONDS - start)) s" >&2

# The provider's main package embeds a schema its go:generate step writes, so it is built from a
# scratch copy of the wrapper module plus that package's files taken from the module cache.
cd "$mods/kubernetes"
k8s_dir=$(go mod download -json "$k8s_module" | moddir)
src="$tmp/kubernetes-src"
cp go.mod go.sum "$src/"
for f in main.go generate.go schema.json terraform-mapping.json; do
  cp "$k8s_dir/cmd/pulumi-resource-kubernetes/$f" "$src/$f"
done
chmod -R u+w "$src"
cd "$src"
VERSION="$k8s_version" run go run generate.go
run go build -trimpath \
  -ldflags "-s -w -X github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version.Version=$k8s_version" \
  -o "$tmp/pulumi-resource-kubernetes" .
echo "build-pulumi: pulumi-resource-kubernetes built at $((SECONDS - start)) s" >&2

rm -rf "$tmp/kubernetes-src" "$out"
mv "$tmp" "$out"
trap - EXIT
echo "$out"
