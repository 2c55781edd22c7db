# The provider image: `dbprovider manager` (the Deployment's command) and `dbprovider render`.
# Build from the repository root, with the version domain/version.py holds (the build fails on any other):
#   VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' domain/version.py)
#   docker build --build-arg VERSION=$VERSION -t ghcr.io/bnerd/dbprovider:$VERSION .
# hack/build-image.sh builds it with podman on a local Debian Python base (--build-arg BASE=...), cached by hash.

ARG BASE=python:3.11-slim

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
COPY --from=build /opt/dbprovider /opt/dbprovider
ENV PATH=/opt/dbprovider/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
# 8443: the consumer API (HTTPS), /healthz and /readyz; 8080: Prometheus metrics (plain HTTP).
EXPOSE 8443 8080
ENTRYPOINT ["dbprovider"]
CMD ["manager", "--config", "/etc/dbprovider/config.yaml"]
