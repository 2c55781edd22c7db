#!/usr/bin/env bash
# Builds the provider image from a source tree's Dockerfile with podman, on a Debian Python base made
# locally (Docker Hub is not reachable here), and saves it as a tarball that containerd can import.
#
#   hack/build-image.sh [--source DIR] [--tag NAME:TAG]   the project image; prints the tag, then the tarball
#   hack/build-image.sh --pause                           the pause image (catatonit); prints tag, tarball
#
# --source: any tree with a Dockerfile (default: this checkout), e.g. a `git archive` of an older release.
# --tag: the image name (default localhost/dbprovider:<first 12 of the key>); IfNotPresent needs a tag
# other than `latest`.
#
# Everything is cached under $DBPROVIDER_CACHE/images (default ~/.cache/dbprovider/images), keyed by a
# hash of what goes into it, so CI can keep the directory and a warm run takes seconds:
#   base-<key>.tar   Debian bookworm minbase + python3 (mmdebstrap from this machine's apt sources);
#                    key: suite, packages, sources file. Imported as localhost/bookworm-python:3.11-<key>
#                    and also tagged docker.io/library/python:3.11-slim, so a Dockerfile without the
#                    BASE build ARG (an older release's) builds unchanged from it.
#   dbprovider-<key>.tar   key: the build context as the tree's .dockerignore filters it and its
#                    Dockerfile (hack/context_digest.py), the base tarball's sha256, and the tag.
#   pause-<key>.tar  /usr/bin/catatonit as /pause (entrypoint `-P`); key: the binary's sha256.
# Nothing is pulled from a registry (--pull=never); only pip inside the build reaches PyPI, through
# this machine's CA bundle and pip.conf. podman runs with the host network namespace (its bridge
# network would add iptables chains and turn on ip_forward on the host) and its cgroups go under this
# script's own.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${DBPROVIDER_CACHE:-$HOME/.cache/dbprovider}/images
source_dir=$(cd "$here/.." && pwd)
tag=""
pause=0
while [ $# -gt 0 ]; do
  case $1 in
    --source) source_dir=$(cd "$2" && pwd); shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --pause) pause=1; shift ;;
    *) echo "build-image: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
for tool in podman mmdebstrap; do
  command -v $tool >/dev/null || { echo "build-image: $tool is missing (hack/setup.sh installs it)" >&2; exit 1; }
done
mkdir -p "$cache"

# podman: ulimits this machine allows (root cannot raise the hard open-files limit here), host network,
conf="$cache/containers.conf"
# runc, not crun: crun refuses this machine's hybrid cgroup layout (v1 controllers plus a v2 mount).
printf '[containers]\nnetns = "host"\ndefault_ulimits = ["nofile=%s:%s", "nproc=32768:32768"]\n[engine]\nruntime = "runc"\n' \
  "$(ulimit -Hn)" "$(ulimit -Hn)" > "$conf.$$" && mv "$conf.$$" "$conf"
export CONTAINERS_CONF=$conf
# cgroups under our own memory cgroup (cgroup v1: a fresh path per run, or runc fails with EINVAL).
own=$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)
cgroup_parent=${own%/}/dbp-image-$$
remove_cgroups() {
  for h in /sys/fs/cgroup/*/; do
    [ -d "$h${cgroup_parent#/}" ] && find "$h${cgroup_parent#/}" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  return 0
}
trap remove_cgroups EXIT

sha() { sha256sum "$@" | cut -c1-64; }

# load TAR TAG: make TAG present in podman's store from the saved tarball.
load() {
  podman image exists "$2" || podman load -q -i "$1" >/dev/null
  podman image exists "$2" || { echo "build-image: $1 does not hold $2" >&2; exit 1; }
}

# save TAG OUT: write the tarball atomically (docker-archive: `ctr images import` reads it).
save() {
  rm -f "$2.tmp"
  podman save -q --format docker-archive -o "$2.tmp" "$1"
  mv "$2.tmp" "$2"
}

if [ $pause -eq 1 ]; then
  bin=/usr/bin/catatonit
  [ -x $bin ] || { echo "build-image: $bin is missing (apt-get install catatonit)" >&2; exit 1; }
  key=$(sha $bin | cut -c1-12)
  tag=${tag:-localhost/pause:catatonit-$key}
  out="$cache/pause-$key.tar"
  exec 9>"$out.lock"; flock 9
  if [ ! -s "$out" ]; then
    dir=$(mktemp -d); cp $bin "$dir/pause"
    tar -C "$dir" -c pause | podman import -q --change 'ENTRYPOINT ["/pause", "-P"]' - "$tag" >/dev/null
    rm -rf "$dir"
    save "$tag" "$out"
  fi
  echo "$tag"
  echo "$out"
  exit 0
fi

# 1. The base: Debian's own Python 3.11 (the Dockerfile's default, python:3.11-slim, is on Docker Hub).
sources=/etc/apt/sources.list.d/debian.sources
[ -f $sources ] || sources=/etc/apt/sources.list
packages=python3,python3-venv,python-is-python3,ca-certificates
base_key=$( (echo "bookworm minbase $packages"; cat $sources) | sha | cut -c1-12)
base_tar="$cache/base-$base_key.tar"
base_tag=localhost/bookworm-python:3.11-$base_key
exec 8>"$base_tar.lock"; flock 8
if [ ! -s "$base_tar" ]; then
  echo "build-image: building the Debian Python base with mmdebstrap (about a minute)" >&2
  rm -f "$base_tar.tmp.tar"
  nice -n 10 mmdebstrap --quiet --format=tar --variant=minbase --include=$packages --components=main \
    bookworm "$base_tar.tmp.tar" $sources
  mv "$base_tar.tmp.tar" "$base_tar"
  sha "$base_tar" > "$base_tar.sha256"
fi
[ -s "$base_tar.sha256" ] || sha "$base_tar" > "$base_tar.sha256"
if ! podman image exists "$base_tag"; then
  podman import -q "$base_tar" "$base_tag" >/dev/null
fi
podman tag "$base_tag" docker.io/library/python:3.11-slim
flock -u 8

# 2. The image, keyed by what goes into it.
[ -f "$source_dir/Dockerfile" ] || { echo "build-image: no Dockerfile in $source_dir" >&2; exit 1; }
context=$(python3 "$here/context_digest.py" "$source_dir")
key=$( (echo "context $context"; echo "base $(cat "$base_tar.sha256")"; echo "tag $tag") | sha | cut -c1-12)
tag=${tag:-localhost/dbprovider:$key}
out="$cache/dbprovider-$key.tar"
exec 9>"$out.lock"; flock 9
if [ -s "$out" ]; then
  load "$out" "$tag"
else
  echo "build-image: building $tag from $source_dir (about 1.5 minutes)" >&2
  mounts=()
  for f in /etc/ssl/certs/ca-certificates.crt /etc/pip.conf; do
    [ -f $f ] && mounts+=(--volume "$f:$f:ro")
  done
  # The release the tree says it is (domain/version.py; a tree older than that file builds without it).
  version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$source_dir/domain/version.py" 2>/dev/null || true)
  nice -n 10 podman build --quiet --pull=never --network host --cgroup-parent "$cgroup_parent" \
    "${mounts[@]}" --build-arg "BASE=$base_tag" --build-arg "VERSION=$version" \
    -t "$tag" -f "$source_dir/Dockerfile" "$source_dir" >/dev/null
  save "$tag" "$out"
fi
touch "$out"  # last used: the pruning below keeps the images in use
# Each tree edit is a new key (~570 MB): keep the 4 images used last, so the cache never fills the disk
# (a full disk makes the node's kubelet evict pods). An image pruned here is rebuilt when asked for.
ls -1t "$cache"/dbprovider-*.tar 2>/dev/null | tail -n +5 | while read -r old; do
  (exec 8>"$old.lock"; flock -n 8 && rm -f "$old" "$old.lock") || true
done
echo "$tag"
echo "$out"
