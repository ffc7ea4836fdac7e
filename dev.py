#!/usr/bin/env python3
"""Set up and run reslice from a fresh clone with nothing but Python 3.11 and pip (no make).

    python3 dev.py demo [ARGS]    set up .venv from the lock file, then run the elastic demo
                                  (`--runtime podman`: builds the trainer image first, as `images`)
    python3 dev.py test [ARGS]    set up .venv, lint (ruff, import contracts, mypy), then run the whole test suite
                                  (as root: apt installs chromium and chromium-driver for tests/launcher/ui)
    python3 dev.py bench [NAME]   set up .venv, then list the benchmarks (or run bench.NAME)
    python3 dev.py bench tpu ...  on a TPU host, without set-up: `python3 -m bench.tpu ...` with this
                                  interpreter (the machine's JAX, the trainer's wheels: tpu-wheels)
    python3 dev.py tpu-wheels [--for-bench] [--list]  download the trainer's wheels but JAX's own
                                  into .whl-tpu/ (a TPU host has JAX, and no network; --for-bench:
                                  what bench.tpu imports; --list: print them; docs/measurements.md)
    python3 dev.py lock           regenerate requirements/*.lock after changing pyproject.toml (uv)
    python3 dev.py maxtext        set up .venv-maxtext (Python 3.12) from requirements/maxtext.lock
    python3 dev.py images [NAME]  build the trainer, controller and MaxText images with podman (as root:
                                  apt installs podman, runc, debootstrap; docs/images.md)

Set-up runs again only when requirements/dev.lock, requirements/uv.lock or pyproject.toml changed
since the last one.
`dev.py test` sets up .venv-maxtext too, but only when an argument names tests/maxtext_e2e, and
builds the images (`dev.py images`, cached) when it runs tests/images (the whole suite does).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from launcher.core.images import DOCKERFILES

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / "bin"
STAMP = VENV / ".installed"
LOCK_INPUTS = (ROOT / "requirements" / "dev.lock", ROOT / "requirements" / "uv.lock", ROOT / "pyproject.toml")
# No byte-compiling at install: pip compiles every installed file (41 of the 119 s of a fresh
# set-up here); Python compiles each module the first time something imports it instead, a fraction
# of them. `__main__` lets the venv's processes write those (PYTHONDONTWRITEBYTECODE would make every
# trainer process compile jax from source).
PIP = ("-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile")
# The MaxText trainer profile's venv (docs/maxtext.md): maxtext 0.2.5 needs Python >= 3.12, so it
# has its own lock, compiled from requirements/maxtext.in; the launcher and trainer stay on 3.11.
MAXTEXT_VENV = ROOT / ".venv-maxtext"
MAXTEXT_LOCK = ROOT / "requirements" / "maxtext.lock"
# Tests that run MaxText itself (in .venv-maxtext) live here; tests/maxtext/ needs only .venv.
MAXTEXT_TESTS = "tests/maxtext_e2e"
# Tests that run the images (`dev.py images`): `dev.py test` builds them first when these run.
IMAGE_TESTS = "tests/images"
# (output, extra, platform): the lock files `lock` writes, all for CPython 3.11 on Linux x86-64, one
# per install: dev (tests, the embedded demo: everything), controller (the controller image,
# docker/controller.Dockerfile: the launcher alone), trainer (the trainer image, docker/Dockerfile:
# the trainer and jax[tpu], no launcher).
LOCKS = (
    ("dev.lock", "dev", "x86_64-manylinux_2_28"),
    ("controller.lock", "controller", "x86_64-manylinux_2_28"),
    ("trainer.lock", "tpu", "x86_64-manylinux_2_31"),
)


def python(version: str, why: str) -> str:
    """This interpreter if it is ``version``, else ``python<version>`` on PATH."""
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
        return sys.executable
    found = shutil.which(f"python{version}")
    if found is None:
        sys.exit(f"dev.py: needs Python {version} ({why}); python{version} is not on PATH")
    if subprocess.run([found, "-c", ""], capture_output=True).returncode:
        # A pyenv shim of a version pyenv has installed but not selected fails only when run.
        sys.exit(
            f"dev.py: needs Python {version} ({why}); {found} does not run "
            f"(pyenv: `PYENV_VERSION=<3.11.x>:<{version}.x> python3 dev.py ...`)"
        )
    return found


def python311() -> str:
    """The interpreter the lock files are for."""
    return python("3.11", "the lock files pin wheels for it")


def setup_maxtext(args: list[str] | None = None) -> None:
    """.venv-maxtext from requirements/maxtext.lock (1.1 GB, a few minutes): only for MaxText runs."""
    stamp = MAXTEXT_VENV / ".installed"
    if stamp.exists() and MAXTEXT_LOCK.stat().st_mtime <= stamp.stat().st_mtime:
        return
    stamp.unlink(missing_ok=True)
    _run(python("3.12", "the MaxText profile: maxtext 0.2.5"), "-m", "venv", str(MAXTEXT_VENV))
    _install_lock(str(MAXTEXT_VENV / "bin" / "python"), str(MAXTEXT_LOCK))
    stamp.touch()


def setup() -> None:
    if STAMP.exists() and all(p.stat().st_mtime <= STAMP.stat().st_mtime for p in LOCK_INPUTS):
        return
    STAMP.unlink(missing_ok=True)  # a set-up that fails half-way is redone next time
    _run(python311(), "-m", "venv", str(VENV))
    _install_lock(str(BIN / "python"), "requirements/dev.lock")
    _run(str(BIN / "python"), *PIP, "--no-deps", "-e", ".")
    STAMP.touch()


def _install_lock(python: str, lock: str) -> None:
    """``lock`` into ``python``'s venv, hashes required. With uv (itself pinned by hash,
    requirements/uv.lock, installed by pip): it fetches and unpacks the wheels in parallel, several
    times faster than pip with an empty cache (docs/measurements.md). It trusts the
    system's certificates as pip does (a proxy's CA there; uv's own roots alone fail with
    "UnknownIssuer" unless SSL_CERT_FILE is set). Should uv fail, pip does it."""
    _run(python, *PIP, "--require-hashes", "-r", "requirements/uv.lock")
    uv = str(Path(python).parent / "uv")
    done = subprocess.run(
        [uv, "pip", "install", "-q", "--system-certs", "--python", python, "--require-hashes", "-r", lock],
        cwd=ROOT,
    )
    if done.returncode:
        print(
            f"dev.py: uv could not install {lock} (exit {done.returncode}); pip installs it", file=sys.stderr
        )
        _run(python, *PIP, "--require-hashes", "-r", lock)


def test(args: list[str]) -> None:
    setup()
    if any(MAXTEXT_TESTS in a for a in args):
        setup_maxtext()
    _run(str(BIN / "ruff"), "check", ".")
    _run(str(BIN / "ruff"), "format", "--check", ".")
    _run(str(BIN / "lint-imports"))
    _run(str(BIN / "mypy"))  # what it checks and where it caches: pyproject.toml, [tool.mypy]
    if _runs_image_tests(args):
        _prepare_images()
    browser()
    _exec(str(BIN / "pytest"), *_workers(args), *args)


def _runs_image_tests(args: list[str]) -> bool:
    """Whether pytest will collect tests/images: no path among the arguments (the whole suite), or
    a path that holds it or lies in it."""
    images = ROOT / IMAGE_TESTS
    paths = [(ROOT / a.split("::")[0]).resolve() for a in args if not a.startswith("-")]
    paths = [p for p in paths if p.exists()]
    return not paths or any(p == images or p in images.parents or images in p.parents for p in paths)


def _prepare_images() -> None:
    """The images, built (or found current in podman's cache) before pytest starts, so that no test
    worker builds them beside the others' tests; where no engine can be set up, the image tests skip
    with the one line said here (tests/images/conftest.py reads RESLICE_IMAGES_SKIP, and
    RESLICE_IMAGES_BUILT: nothing left to build)."""
    try:
        build_images()
    except EngineUnavailable as e:
        print(f"dev.py test: the image tests skip: no container engine: {e}", file=sys.stderr)
        os.environ["RESLICE_IMAGES_SKIP"] = f"no container engine: {e}"
        return
    os.environ["RESLICE_IMAGES_BUILT"] = "1"


# `reslice ui`'s browser tests (tests/launcher/ui, tests/support/browser.py): Debian's headless Chromium and
# its WebDriver, driven by selenium (the dev extra).
BROWSER_PACKAGES = ("chromium", "chromium-driver")


def browser() -> None:
    """Debian's chromium and chromium-driver (apt, as root), as `engine` installs podman; where they
    cannot be installed, one line, and the browser tests skip (tests/support/browser.py says why)."""
    if shutil.which("chromium") and Path("/usr/bin/chromedriver").exists():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        print(
            "dev.py test: no chromium, and apt-get cannot install it here: the browser tests skip",
            file=sys.stderr,
        )
        return
    print(f"dev.py test: apt-get install {' '.join(BROWSER_PACKAGES)}", file=sys.stderr)
    quiet: dict[str, Any] = {
        "stdout": subprocess.DEVNULL,
        "env": {**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    }
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *BROWSER_PACKAGES]):
        if subprocess.run(cmd, **quiet).returncode:
            print(f"dev.py test: `{' '.join(cmd)}` failed: the browser tests skip", file=sys.stderr)
            return


def _workers(args: list[str]) -> list[str]:
    """Three pytest workers on the two cores, whole files each: most of an end-to-end test's wall
    time is waiting (on the cluster, the controller, a peer's grace period), so a third file beside
    two others fills the cores (the suite's pytest phase is shorter: docs/measurements.md);
    whole files keep a module's reference run computed once. Each worker that asks for its next
    file gets the one tests/conftest.py chooses (`next_file`, from the last whole run's figures and
    what the other workers run then). ``-n 0`` (or any -n) overrides."""
    if any(a == "-n" or a.startswith(("-n", "--numprocesses")) for a in args):
        return []
    return ["-n", "3", "--dist", "loadfile", "--no-loadscope-reorder"]


def demo(args: list[str]) -> None:
    setup()
    if _podman_demo(args):
        # The trainer image the demo's pods run, and the podman settings of this VM kind for the
        # embedded kubelet's podman commands (its environment reaches them).
        try:
            build_images(["trainer"])
        except EngineUnavailable as e:
            sys.exit(f"dev.py demo: --runtime podman: no container engine: {e}")
        os.environ.update(podman_env())
    _exec(str(BIN / "reslice"), "demo", *args)


def _podman_demo(args: list[str]) -> bool:
    """Whether the demo's arguments ask for the podman runtime (`--runtime podman` or `--runtime=podman`)."""
    return "--runtime=podman" in args or ("--runtime", "podman") in itertools.pairwise(args)


def bench(args: list[str]) -> None:
    if args[:1] == ["tpu"]:
        # A TPU host has the machine's JAX and the trainer's wheels (`tpu-wheels`), no project
        # venv and no network: no set-up, this interpreter.
        _exec(sys.executable, "-m", "bench.tpu", *args[1:])
    setup()
    module = f"bench.{args[0]}" if args else "bench"
    _exec(str(BIN / "python"), "-m", module, *args[1:])


# What a TPU host brings itself (its own JAX build, the libtpu that matches it, and the array
# libraries JAX was built against): the rest of requirements/trainer.lock is `tpu-wheels`'.
TPU_HOST_OWN = ("jax", "jaxlib", "libtpu", "numpy", "ml-dtypes", "scipy")
# What only gs:// input data (gcsfs, its aiohttp and OAuth chains) and `python -m trainer.tokenize`
# (tokenizers, its hub client's chain) need: `tpu-wheels --for-bench` leaves them out, as
# `python -m bench.tpu` imports none of them (traced: every module its benchmarks import), and the
# rest fits what goes to a TPU lease beside the repository (64 MiB).
TPU_BENCH_UNUSED = (
    "gcsfs", "aiohttp", "aiohappyeyeballs", "aiosignal", "frozenlist", "multidict", "propcache", "yarl",
    "google-auth-oauthlib", "requests-oauthlib", "oauthlib",
    "tokenizers", "huggingface-hub", "hf-xet", "httpx2", "httpcore2", "h11", "anyio",
)  # fmt: skip
TPU_WHEELS = ROOT / ".whl-tpu"
# The TPU host: CPython 3.11 on Linux x86-64 with glibc 2.36; the tags its pip accepts.
TPU_PLATFORMS = (
    "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
    "manylinux1_x86_64",
)  # fmt: skip


def tpu_requirements(
    lock: Path = ROOT / "requirements" / "trainer.lock", leave_out: tuple[str, ...] = ()
) -> list[str]:
    """The hash-pinned entries of `lock` (`name==version` and its `--hash` lines) but TPU_HOST_OWN's
    and `leave_out`'s."""
    out: list[str] = []
    keep = False
    for line in lock.read_text().splitlines():
        if line and not line[0].isspace() and "==" in line:
            name = line.split("==")[0].strip().lower().replace("_", "-")
            keep = name not in TPU_HOST_OWN + leave_out
        elif not line.strip().startswith("--hash"):
            continue  # `# via` annotations
        if keep:
            out.append(line)
    return out


def tpu_wheels(args: list[str]) -> None:
    """Download the trainer's wheels for a TPU host into .whl-tpu/ (hashes checked), then print
    each and the total size; `--list`: print the `name==version` list only; `--for-bench`: without
    TPU_BENCH_UNUSED."""
    unknown = [a for a in args if a not in ("--list", "--for-bench")]
    if unknown:
        print(f"dev.py tpu-wheels: no option {unknown[0]} (--list, --for-bench)", file=sys.stderr)
        sys.exit(2)
    reqs = tpu_requirements(leave_out=TPU_BENCH_UNUSED if "--for-bench" in args else ())
    if "--list" in args:
        print("\n".join(line.split(" ")[0] for line in reqs if "==" in line))
        return
    shutil.rmtree(TPU_WHEELS, ignore_errors=True)
    TPU_WHEELS.mkdir()
    (TPU_WHEELS / "requirements.txt").write_text("\n".join(reqs) + "\n")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps"]
    cmd += ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp"]
    cmd += [a for p in TPU_PLATFORMS for a in ("--platform", p)]
    _run(*cmd, "--require-hashes", "-r", str(TPU_WHEELS / "requirements.txt"), "-d", str(TPU_WHEELS))
    wheels = sorted(TPU_WHEELS.glob("*.whl"))
    for w in wheels:
        print(f"{w.stat().st_size / 2**20:7.2f} MiB  {w.name}")
    total = sum(w.stat().st_size for w in wheels)
    print(f"{len(wheels)} wheels, {total / 2**20:.1f} MiB in {TPU_WHEELS.relative_to(ROOT)}/")


def lock(args: list[str]) -> None:
    uv = shutil.which("uv") or sys.exit("dev.py lock: needs uv (pip install uv)")
    # uv itself, for set-up (`_install_lock`): every wheel of the pinned version hashed.
    cmd = [uv, "pip", "compile", "requirements/uv.in", "--generate-hashes", "--no-header"]
    _run(*cmd, "-o", "requirements/uv.lock")
    for out, extra, platform in LOCKS:
        cmd = [uv, "pip", "compile", "pyproject.toml", "--python-version", "3.11"]
        cmd += ["--python-platform", platform, "--generate-hashes", "--no-header"]
        cmd += ["--annotation-style", "line", "-o", f"requirements/{out}"]
        _run(*cmd, *(["--extra", extra] if extra else []))
    # MaxText: .venv-maxtext's lock (CPU), then the image's, at its versions plus libtpu.
    for name, platform in (("maxtext", "x86_64-manylinux_2_28"), ("maxtext-tpu", "x86_64-manylinux_2_31")):
        cmd = [uv, "pip", "compile", f"requirements/{name}.in", "--python-version", "3.12"]
        cmd += ["--python-platform", platform, "--generate-hashes", "--no-header"]
        _run(*cmd, "--annotation-style", "line", "-o", f"requirements/{name}.lock")


# -- `dev.py images`: the three images with podman, without Docker or a registry ------------------
# docs/images.md says what each piece is for and what the stand-in bases differ in.
PODMAN_CONF = ROOT / ".cache" / "containers" / "containers.conf"
# What this VM kind needs of podman (apt's 4.3): its hard nofile limit is 20000 and podman asks for
# more by default; crun refuses its hybrid cgroups, runc runs; no systemd to manage cgroups.
PODMAN_SETTINGS = """[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
APT_PACKAGES = ("podman", "runc", "debootstrap")
# (tag, Dockerfile): built from the repository root, the Dockerfiles as they are, tagged with the
# names the launcher runs when no --image is given (launcher/core/images.py, standard library only).
IMAGES = DOCKERFILES
# The stand-in for the official python:X-slim images (no registry here): a Debian bookworm root
# file system from debootstrap (this VM's release; the official tags' is trixie, docs/images.md)
# with the runtime libraries the official image installs for CPython's extension modules, and this
# machine's own CPython X (a pyenv build) in /usr/local, where the official image builds its CPython.
ROOTFS_SUITE = "bookworm"
ROOTFS_MIRROR = "http://deb.debian.org/debian"
ROOTFS_PACKAGES = (
    "ca-certificates", "netbase", "tzdata", "libssl3", "libffi8", "libsqlite3-0", "libbz2-1.0",
    "liblzma5", "zlib1g", "libreadline8", "libncursesw6", "libexpat1", "libtirpc3", "libuuid1",
    "libgdbm6", "libgdbm-compat4",
)  # fmt: skip
BASE_PYTHONS = ("3.11", "3.12")
# What the official image's build removes from /usr/local, and site-packages: the stand-in's pip
# comes from the interpreter's own ensurepip, not from whatever this machine installed there.
BASE_EXCLUDES = ("test", "tests", "idle_test", "__pycache__", "site-packages", "*.pyc", "libpython*.a")
BASE_DOCKERFILE = """FROM {rootfs}
COPY python /usr/local
RUN ldconfig \\
    && ln -sf python{version} /usr/local/bin/python \\
    && python{version} -m ensurepip --default-pip \\
    && ln -sf pip{version} /usr/local/bin/pip \\
    && python -c "import ssl, sqlite3, ctypes, lzma, bz2, zlib, readline, uuid"
ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \\
    PYTHON_VERSION={full}
LABEL reslice.stand-in={key}
CMD ["python{version}"]
"""


class EngineUnavailable(Exception):
    """Podman cannot be set up here (no apt, not root): the image tests skip with this line."""


def podman_env() -> dict[str, str]:
    """The environment every podman command runs in: the project's containers.conf alone
    (CONTAINERS_CONF replaces the system's files for these commands, and touches nothing else)."""
    return {**os.environ, "CONTAINERS_CONF": str(PODMAN_CONF)}


def podman(*args: str, check: bool = True, capture: bool = False) -> subprocess.CompletedProcess:
    """``podman ARGS``: exits dev.py with podman's error when ``check``; builds' image ids (stdout)
    are not printed."""
    out = None if capture or args[0] != "build" else subprocess.DEVNULL
    done = subprocess.run(
        ["podman", *args], env=podman_env(), cwd=ROOT, capture_output=capture, stdout=out, text=True
    )
    if check and done.returncode:
        detail = f": {done.stderr.strip()[-2000:]}" if capture else ""
        sys.exit(f"dev.py images: podman {' '.join(args[:3])} ... failed (exit {done.returncode}){detail}")
    return done


def engine() -> None:
    """podman, runc and debootstrap (apt, as root) and the project's containers.conf."""
    missing = [p for p in APT_PACKAGES if shutil.which(p) is None and not Path(f"/usr/sbin/{p}").exists()]
    if missing:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise EngineUnavailable(
                f"{' '.join(missing)} not installed and cannot be: "
                + ("apt-get needs root" if shutil.which("apt-get") else "no apt-get")
            )
        print(f"dev.py images: apt-get install {' '.join(APT_PACKAGES)}", file=sys.stderr)
        quiet: dict[str, Any] = {
            "stdout": subprocess.DEVNULL,
            "env": {**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        }
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *APT_PACKAGES]):
            if subprocess.run(cmd, **quiet).returncode:
                raise EngineUnavailable(f"`{' '.join(cmd)}` failed")
    if os.geteuid() != 0:
        raise EngineUnavailable(
            "podman here runs rootful (the VM has no subuid ranges for rootless): run as root"
        )
    PODMAN_CONF.parent.mkdir(parents=True, exist_ok=True)
    if not PODMAN_CONF.exists() or PODMAN_CONF.read_text() != PODMAN_SETTINGS:
        PODMAN_CONF.write_text(PODMAN_SETTINGS)


def _key(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def _labelled(image: str, key: str) -> bool:
    got = podman("image", "inspect", "--format", '{{index .Labels "reslice.stand-in"}}', image,
                 check=False, capture=True)  # fmt: skip
    return got.returncode == 0 and got.stdout.strip() == key


def rootfs() -> str:
    """The Debian root file system as an image, tagged by the hash of what makes it."""
    key = _key(ROOTFS_SUITE, ROOTFS_MIRROR, ROOTFS_PACKAGES)
    tag = f"localhost/reslice-rootfs:{key}"
    if podman("image", "exists", tag, check=False).returncode == 0:
        return tag
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="reslice-rootfs-") as tmp:
        target = Path(tmp) / "root"
        cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(ROOTFS_PACKAGES)}"]
        done = subprocess.run(
            [*cmd, ROOTFS_SUITE, str(target), ROOTFS_MIRROR], capture_output=True, text=True
        )
        if done.returncode:
            sys.exit(
                f"dev.py images: debootstrap failed (exit {done.returncode}): {done.stderr.strip()[-1000:]}"
            )
        # apt's package lists and caches are not part of a slim image.
        for junk in ("var/lib/apt/lists", "var/cache/apt", "var/log"):
            for p in (target / junk).glob("*"):
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        # --one-file-system: nothing of a /proc or /sys that debootstrap failed to unmount.
        tar = subprocess.Popen(
            ["tar", "-C", str(target), "--one-file-system", "-c", "."], stdout=subprocess.PIPE
        )
        imported = subprocess.run(["podman", "import", "-", tag], stdin=tar.stdout, env=podman_env(),
                                  capture_output=True)  # fmt: skip
        if tar.stdout is not None:  # piped: always
            tar.stdout.close()
        if tar.wait() or imported.returncode:
            sys.exit("dev.py images: could not import the debootstrap root file system into podman")
    print(
        f"dev.py images: {tag} (debootstrap {ROOTFS_SUITE}) in {time.monotonic() - started:.0f} s",
        file=sys.stderr,
    )
    return tag


def _interpreter(version: str) -> str:
    """``python<version>`` on PATH when it runs, else pyenv's newest build of it (a pyenv shim of a
    version not selected does not run, though the build is there)."""
    found = shutil.which(f"python{version}")
    if found and subprocess.run([found, "-c", ""], capture_output=True).returncode == 0:
        return found
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    builds = sorted(
        root.glob(f"versions/{version}.*/bin/python{version}"), key=lambda p: _release(p.parent.parent.name)
    )
    if not builds:
        sys.exit(
            f"dev.py images: needs a CPython {version} build for the stand-in python:{version}-slim (pyenv install {version})"
        )
    return str(builds[-1])


def _release(name: str) -> tuple[int, ...]:
    return tuple(int(x) if x.isdigit() else -1 for x in name.split("."))


def base(version: str, rootfs_tag: str) -> None:
    """docker.io/library/python:<version>-slim, the stand-in: `rootfs_tag` plus this machine's
    CPython <version> (found as dev.py finds its interpreters) copied into /usr/local. Rebuilt only
    when the root file system or the interpreter's build changes (the key, a label on the image)."""
    exe = _interpreter(version)
    found = subprocess.run(
        [exe, "-c", "import sys, sysconfig; print(sys.base_prefix); print(sys.version.split()[0]);"
         "print(sysconfig.get_config_var('LDLIBRARY'))"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    prefix, full = Path(found[0]), found[1]
    if prefix in (Path("/usr"), Path("/usr/local")) or not (prefix / "lib" / f"python{version}").is_dir():
        sys.exit(
            f"dev.py images: Python {version} at {prefix} is not a self-contained build to copy (pyenv's is)"
        )
    lib = prefix / "lib" / found[2]
    key = _key(
        rootfs_tag,
        str(prefix),
        full,
        lib.stat().st_size if lib.exists() else 0,
        BASE_DOCKERFILE,
        BASE_EXCLUDES,
    )
    tag = f"docker.io/library/python:{version}-slim"
    if _labelled(tag, key):
        return
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="reslice-base-") as tmp:
        copy = Path(tmp) / "python"
        shutil.copytree(prefix, copy, symlinks=True, ignore=_base_ignore(prefix))
        (copy / "lib" / f"python{version}" / "site-packages").mkdir()
        text = BASE_DOCKERFILE.format(rootfs=rootfs_tag, version=version, full=full, key=key)
        (Path(tmp) / "Dockerfile").write_text(text)
        podman("build", "--quiet", "-t", tag, tmp)
    print(
        f"dev.py images: {tag} (CPython {full} from {prefix}) in {time.monotonic() - started:.0f} s",
        file=sys.stderr,
    )


def _base_ignore(prefix: Path) -> Callable[[str, list[str]], set[str]]:
    """BASE_EXCLUDES anywhere, and in bin/ what is not CPython's own (scripts that packages
    installed into this interpreter put there, pointing at this machine's paths)."""
    patterns = shutil.ignore_patterns(*BASE_EXCLUDES)

    def ignore(folder: str, names: list[str]) -> set[str]:
        out = set(patterns(folder, names))
        if Path(folder) == prefix / "bin":
            out |= {n for n in names if not n.startswith(("python", "pydoc", "idle", "2to3"))}
        return out

    return ignore


def build_mounts() -> list[str]:
    """What pip inside `podman build` needs to reach the package index from here: the host's CA
    bundle (a proxy's CA in it) and pip.conf, where they exist; read-only build mounts, in no layer."""
    mounts = []
    for path in ("/etc/ssl/certs/ca-certificates.crt", "/etc/pip.conf"):
        if Path(path).is_file():
            mounts += ["-v", f"{path}:{path}:ro"]
    return mounts


def build_images(names: list[str] | None = None) -> None:
    """Every image (or those whose tag contains one of ``names``), bases first; podman's layer
    cache makes a second run a few seconds."""
    engine()
    top = rootfs()
    for version in BASE_PYTHONS:
        base(version, top)
    for tag, dockerfile in IMAGES:
        if names and not any(n in tag for n in names):
            continue
        started = time.monotonic()
        podman("build", "--quiet", "--network", "host", *build_mounts(), "-f", dockerfile, "-t", tag, ".")
        size = podman("image", "inspect", "--format", "{{.Size}}", tag, capture=True).stdout.strip()
        print(
            f"dev.py images: {tag} ({int(size) / 1e9:.2f} GB) in {time.monotonic() - started:.0f} s",
            file=sys.stderr,
        )


def images(args: list[str]) -> None:
    known = [tag.split("/")[-1].split(":")[0].removeprefix("reslice-") for tag, _ in IMAGES]
    unknown = [a for a in args if not any(a in tag for tag, _ in IMAGES)]
    if unknown:
        print(f"dev.py images: no image named {unknown[0]!r} (images: {', '.join(known)})", file=sys.stderr)
        sys.exit(2)
    try:
        build_images(args)
    except EngineUnavailable as e:
        sys.exit(f"dev.py images: no container engine: {e}")


def _run(*cmd: str) -> None:
    done = subprocess.run(cmd, cwd=ROOT)
    if done.returncode:
        sys.exit(done.returncode)


def _exec(*cmd: str) -> None:
    os.chdir(ROOT)
    os.execv(cmd[0], list(cmd))


COMMANDS = {
    "test": test,
    "demo": demo,
    "bench": bench,
    "lock": lock,
    "maxtext": setup_maxtext,
    "tpu-wheels": tpu_wheels,
    "images": images,
}

if __name__ == "__main__":
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # see PIP
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    COMMANDS[sys.argv[1]](sys.argv[2:])
