# The in-cluster controller image (manifests/controller): the launcher only — no jax, libtpu,
# flax, optax, orbax or grain, no matplotlib or jsonschema, and no launcher/embedded (the embedded
# cluster is a development extra). tests/controller/test_incluster.py runs `reslice watch --all`
# with all of those unimportable. Build from the repository root:
#   docker build -f docker/controller.Dockerfile -t reslice-controller .
# linux/amd64: requirements/controller.lock pins x86-64 wheels.
FROM --platform=linux/amd64 python:3.11-slim AS source

# The launcher without launcher/embedded, in a stage of its own so that no layer of the image
# holds the embedded cluster (a `rm` after the COPY would leave it in the COPY's layer).
COPY launcher /src/launcher
RUN rm -r /src/launcher/embedded

FROM --platform=linux/amd64 python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RESLICE_PRESETS_DIR=/app/presets \
    HOME=/tmp

WORKDIR /app

# pyproject.toml's `controller` extra, hash-pinned.
COPY requirements/controller.lock requirements/controller.lock
RUN pip install --require-hashes -r requirements/controller.lock

COPY pyproject.toml README.md ./
COPY --from=source /src/launcher launcher
# contract/: the words the launcher shares with the trainer (exit codes, environment names).
COPY contract contract
COPY presets presets
# setuptools finds `trainer*` packages only if present: without trainer/ the wheel is launcher-only.
# Its in-tree build leftovers (build/, reslice.egg-info) go in the same layer.
RUN pip install --no-deps . && rm -rf build reslice.egg-info \
    && groupadd --system --gid 65532 reslice \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin reslice

# Numeric, so that the kubelet can check runAsNonRoot against the image (the Deployment sets it too).
USER 65532:65532
ENTRYPOINT ["reslice"]
CMD ["watch", "--all"]
