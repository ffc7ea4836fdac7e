"""The project's images by name, one source for both sides: what `python3.11 dev.py images` tags the
build of each Dockerfile as (podman keeps a short name as `localhost/<name>`), and what the launcher
puts in a pod when `--image` is not given. So the embedded cluster's podman runtime
(`reslice demo --runtime podman`) runs the images dev.py built, unrenamed. Standard library only:
dev.py imports it before any virtual environment exists."""

from __future__ import annotations

TRAINER = "reslice-trainer:latest"
CONTROLLER = "reslice-controller:latest"
MAXTEXT = "reslice-maxtext:latest"


def registry_error(image: str) -> str | None:
    """Why a real cluster cannot pull `image` as meant, or None. A name with no `/` has no registry:
    a GKE node's containerd reads it as `docker.io/library/<name>`, which is never reslice's image
    (the defaults above are short names on purpose: dev.py's builds, which the embedded cluster's
    podman runtime finds locally). One with a path but no host (`org/img`) is Docker Hub's, and may
    be meant."""
    if "/" in image:
        return None
    return (
        f"--image {image}: no registry in the name, so a cluster's nodes would pull"
        f" docker.io/library/{image}; push the image and pass its full name, e.g."
        f" --image REGION-docker.pkg.dev/PROJECT/REPO/{image} (docs/gke.md)"
    )


# (tag, Dockerfile): built from the repository root, the Dockerfiles as they are.
DOCKERFILES = (
    (TRAINER, "docker/Dockerfile"),
    (CONTROLLER, "docker/controller.Dockerfile"),
    (MAXTEXT, "docker/maxtext.Dockerfile"),
)
