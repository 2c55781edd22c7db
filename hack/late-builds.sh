#!/usr/bin/env bash
# The builds that only the late suites need (tests/pulumi, tests/cluster), one after the other: the Pulumi
# CLI and Kubernetes provider, the node's binaries, CoreDNS, the provider image and the pause image.
# Each is cached by version/hash by its own script, so a warm run takes seconds.
#
#   bash hack/late-builds.sh                # build them now (hack/setup.sh does, unless told otherwise)
#   bash hack/late-builds.sh --background   # start them niced and return (CI: .ci/run); a second call
#                                           # while they run does nothing
#
# Each build's state is in build/late/<name>.status (pending, running, ok, or `failed <exit status>`) and
# its output in build/late/<name>.log. The harness waits for a pending or running build (the build
# scripts' locks) and stops a late suite at once, with the log's last lines, when its build failed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
state="$root/build/late"
mkdir -p "$state"
names=(pulumi node coredns image pause)

command_of() {
  case $1 in
    pulumi) echo "bash $root/hack/build-pulumi.sh" ;;
    node) echo "bash $root/hack/build-kube.sh --node" ;;
    coredns) echo "bash $root/hack/build-coredns.sh" ;;
    image) echo "bash $root/hack/build-image.sh" ;;
    pause) echo "bash $root/hack/build-image.sh --pause" ;;
  esac
}

if [ "${1:-}" = "--background" ]; then
  # The runner holds runner.lock while it works; the statuses are written before this returns, so a
  # test that starts right after sees `pending`, never a failure left from an earlier run.
  exec 9>"$state/runner.lock"
  flock -n 9 || exit 0
  for name in "${names[@]}"; do echo pending > "$state/$name.status"; done
  nohup nice -n 10 bash "$0" --run >"$state/runner.log" 2>&1 &
  exit 0
fi
if [ "${1:-}" != "--run" ]; then
  exec 9>"$state/runner.lock"
  flock 9
  for name in "${names[@]}"; do echo pending > "$state/$name.status"; done
fi

status=0
for name in "${names[@]}"; do
  echo running > "$state/$name.status"
  started=$SECONDS
  # shellcheck disable=SC2046 - the command is words
  if $(command_of "$name") >"$state/$name.log" 2>&1; then
    echo ok > "$state/$name.status"
    [ $((SECONDS - started)) -lt 2 ] || echo "late-builds: $name built in $((SECONDS - started)) s" >&2
  else
    rc=$?
    echo "failed $rc" > "$state/$name.status"
    echo "late-builds: $name FAILED (exit $rc) after $((SECONDS - started)) s; see $state/$name.log" >&2
    tail -n 20 "$state/$name.log" >&2
    status=1
  fi
done
exit $status
