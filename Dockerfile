# One image for the api, the routers and the workers: the entrypoint is `reins`, the command
# says which (`reins api`, `reins router`, `reins worker`, as helm/reins/values.yaml runs them).
#
#   docker build -t ghcr.io/reins/reins:$(version) .     # anywhere a base image can be pulled
#   make image                                           # here: same file, base built locally
#
# `make image` builds this same file with buildah, the base being Debian bookworm bootstrapped
# from Debian's packages (ops/scripts/build-image.sh), where no registry can be reached.
ARG BASE=docker.io/library/debian:bookworm-slim

# --- build: the wheel of this checkout, installed with its dependencies in /opt/reins --------
FROM ${BASE} AS build
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv ca-certificates \
    && apt-get clean && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# pip's two steps take an optional build secret, pip-ca: a CA bundle, where the build's traffic
# to PyPI goes through a TLS-inspecting proxy (make image passes this machine's; `docker build
# --secret id=pip-ca,src=FILE`). Without it, pip's own; it is never part of a layer.
# The dependencies first, from pyproject.toml alone: a layer rebuilt only when they change.
COPY pyproject.toml ./
RUN --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && python3 -m venv /opt/reins \
    && python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' > /tmp/requirements.txt \
    && /opt/reins/bin/pip install --no-cache-dir --disable-pip-version-check -r /tmp/requirements.txt
# Then the wheel built from the source (.dockerignore keeps the tests and local state out),
# installed without touching the dependencies; pip and setuptools leave the runtime venv.
COPY . .
RUN --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && /opt/reins/bin/pip wheel --no-cache-dir --disable-pip-version-check --no-deps -w /dist . \
    && /opt/reins/bin/pip install --no-cache-dir --disable-pip-version-check --no-deps /dist/reins-*.whl \
    && /opt/reins/bin/pip check \
    && /opt/reins/bin/python -m pip uninstall -y -q setuptools pip \
    && /opt/reins/bin/reins --version

# --- runtime: Debian's python3, the venv, a user of its own --------------------------------
FROM ${BASE}
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 ca-certificates \
    && apt-get clean && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10001 reins \
    && useradd --uid 10001 --gid 10001 --home-dir /home/reins --create-home \
        --shell /usr/sbin/nologin reins
COPY --from=build /opt/reins /opt/reins
# The bytecode was compiled at install: nothing is written under /opt (the chart mounts the root
# file system read-only and gives /tmp as the one writable place).
ENV PATH=/opt/reins/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/home/reins
# Numeric, so Kubernetes can check runAsNonRoot (the chart's podSecurityContext is 10001 too).
USER 10001:10001
WORKDIR /home/reins
LABEL org.opencontainers.image.title="reins" \
      org.opencontainers.image.description="reins: api, router and worker (entrypoint reins)" \
      org.opencontainers.image.source="https://github.com/reins/reins" \
      org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["reins"]
CMD ["--help"]
