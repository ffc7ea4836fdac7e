# The in-cluster controller image (manifests/controller): the launcher only — no jax, libtpu,
# flax, optax, orbax or grain (tests/controller/test_incluster.py runs `reslice watch --all` with
# those unimportable). Build from the repository root:
#   docker build -f docker/controller.Dockerfile -t reslice-controller .
# linux/amd64: requirements/run.lock pins x86-64 wheels.
FROM --platform=linux/amd64 python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RESLICE_PRESETS_DIR=/app/presets \
    HOME=/tmp

WORKDIR /app

# The launcher's dependencies alone (pyproject.toml's `dependencies`, no extras), hash-pinned.
COPY requirements/run.lock requirements/run.lock
RUN pip install --require-hashes -r requirements/run.lock

COPY pyproject.toml README.md ./
COPY launcher launcher
COPY presets presets
# setuptools finds `trainer*` packages only if present: without trainer/ the wheel is launcher-only.
RUN pip install --no-deps . \
    && groupadd --system --gid 65532 reslice \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin reslice

# Numeric, so that the kubelet can check runAsNonRoot against the image (the Deployment sets it too).
USER 65532:65532
ENTRYPOINT ["reslice"]
CMD ["watch", "--all"]
