"""The project's images by name, one source for both sides: what `python3.11 dev.py images` tags the
build of each Dockerfile as (podman keeps a short name as `localhost/<name>`), and what the launcher
puts in a pod when `--image` is not given. So the embedded cluster's podman runtime
(`reslice demo --runtime podman`) runs the images dev.py built, unrenamed. Standard library only:
dev.py imports it before any virtual environment exists."""

from __future__ import annotations

TRAINER = "reslice-trainer:latest"
CONTROLLER = "reslice-controller:latest"
MAXTEXT = "reslice-maxtext:latest"

# (tag, Dockerfile): built from the repository root, the Dockerfiles as they are.
DOCKERFILES = (
    (TRAINER, "docker/Dockerfile"),
    (CONTROLLER, "docker/controller.Dockerfile"),
    (MAXTEXT, "docker/maxtext.Dockerfile"),
)
