# The MaxText trainer profile's image (docs/maxtext.md): `python -m maxtext_entry -- ...`, which runs
# MaxText 0.2.5 (`python -m maxtext.trainers.pre_train.train`) in the same interpreter, on GKE TPU VMs.
# MaxText needs Python >= 3.12; the launcher and reslice's own trainer image stay on 3.11.
# Build from the repository root:  docker build -f docker/maxtext.Dockerfile -t reslice-maxtext .
# and launch with `reslice launch --trainer maxtext --image <registry>/reslice-maxtext ...`.
# linux/amd64 whatever the build machine is: TPU VMs are x86-64, and the lock pins x86-64 wheels.
FROM --platform=linux/amd64 python:3.12-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app

WORKDIR /app

# Dependencies first (their layer survives code changes): requirements/maxtext.in at maxtext.lock's
# versions plus libtpu, every version and hash pinned (requirements/maxtext-tpu.lock).
COPY requirements/maxtext-tpu.lock requirements/maxtext-tpu.lock
RUN pip install --require-hashes -r requirements/maxtext-tpu.lock

# The entrypoint imports nothing of launcher/ or trainer/ (import-linter contract in pyproject.toml),
# only contract/ (the exit codes, standard library only) and what the lock above installs: MaxText
# and what it brings (jax, orbax, grain, absl; etils' epath for a gs:// run directory). So the two
# package directories alone, on the path, are all it needs.
COPY contract contract
COPY maxtext_entry maxtext_entry

# Root, as the trainer image (docker/Dockerfile): the TPU device nodes keep the host's ownership.
USER 0
ENTRYPOINT ["python", "-m", "maxtext_entry"]
