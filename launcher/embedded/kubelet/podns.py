"""A process pod's own view of the files its node gives it, in outside mode: the program the process
runtime starts instead of a container's command, which enters a user and mount namespace of its
own, makes the node's files appear where a real node's runtime puts them, and becomes the
container's command (`exec`: same pid, the kubelet's signals and exit codes unchanged).

- `/etc/hosts` is the cluster's DNS for process pods (`dns.ClusterDns`): a JobSet pod's
  `<hostname>.<subdomain>` resolves to that pod's own loopback address, as kube-dns resolves it
  through the JobSet's headless Service. A name handed over at run time (an in-place world's
  coordinator) then resolves as it does on GKE, where no environment rewrite could reach it.
- each `--mount SRC:DST` is bound read-only at DST (the projected service-account volume at
  /var/run/secrets/kubernetes.io/serviceaccount). A DST whose folders do not exist on this machine
  is made in an overlay of its nearest existing folder (whose own mounts are bound back), so the
  host's files stay as they are and other processes see nothing.

Standard library only (ctypes: Python 3.11 has no os.unshare); Linux with unprivileged user
namespaces and overlayfs in them (kernel 5.11 or later). `--check` says whether this machine can.
Started by `processes.ProcessRunner` as `python -m launcher.embedded.kubelet.podns ... -- ARGV`.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
from pathlib import Path

_CLONE_NEWNS, _CLONE_NEWUSER = 0x00020000, 0x10000000
_MS_RDONLY, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
HOSTS = Path("/etc/hosts")


class NamespaceError(Exception):
    """The namespace or a mount could not be made (the system call and its error)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _call(result: int, what: str) -> None:
    if result != 0:
        raise NamespaceError(f"{what}: {os.strerror(ctypes.get_errno())}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _call(
        _libc().mount(
            source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
            data.encode() if data else None,
        ),
        f"mount {source} on {target}",
    )  # fmt: skip


def enter() -> None:
    """A user namespace mapping this user to itself, and a mount namespace private to it."""
    uid, gid = os.getuid(), os.getgid()
    _call(_libc().unshare(_CLONE_NEWUSER | _CLONE_NEWNS), "unshare(CLONE_NEWUSER|CLONE_NEWNS)")
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    _mount("none", "/", None, _MS_REC | _MS_PRIVATE)  # nothing mounted here reaches the host


def bind(source: str, target: str, read_only: bool = True) -> None:
    _mount(source, target, None, _MS_BIND)
    if read_only:
        _mount(source, target, None, _MS_BIND | _MS_REMOUNT | _MS_RDONLY)


def _submounts(folder: str) -> list[str]:
    """Mount points strictly under `folder`, shallowest first (/proc/self/mountinfo, field 5)."""
    prefix = folder.rstrip("/") + "/"
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return sorted({p for p in points if p.startswith(prefix)}, key=lambda p: p.count("/"))


def make_folder(target: Path, scratch: Path) -> None:
    """Make `target` exist in this namespace: an overlay of its nearest existing folder, with the
    folder's own mounts bound back on top of it (the overlay shows the folder's files only)."""
    existing = target
    while not existing.exists():
        existing = existing.parent
    base = os.path.realpath(existing)
    if base == "/":  # a mount over the root is not seen from it
        raise NamespaceError(f"no folder of {target} exists to make it in")
    rest = target.relative_to(existing)
    _mount("tmpfs", str(scratch), "tmpfs", 0)  # upper and work: a filesystem an overlay takes
    old, upper, work = scratch / "old", scratch / "upper", scratch / "work"
    for d in (old, upper, work):
        d.mkdir()
    subs = _submounts(base)
    if subs:
        _mount(base, str(old), None, _MS_BIND | _MS_REC)
    _mount("overlay", base, "overlay", 0, f"lowerdir={base},upperdir={upper},workdir={work}")
    for point in subs:
        _bind_back(Path(str(old) + point[len(base) :]), Path(point))
    (Path(base) / rest).mkdir(parents=True, exist_ok=True)


def _bind_back(source: Path, place: Path) -> None:
    """`source` (with its mounts) bound at `place`; nothing when it is gone meanwhile: another
    program's mount under the folder (podman's network namespaces under /run/netns come and go)
    is not the pod's."""
    try:
        _mount(str(source), str(place), None, _MS_BIND | _MS_REC)
    except NamespaceError:
        if source.exists() or source.is_symlink():
            raise


def setup(hosts: str | None, mounts: list[tuple[str, str]], scratch: Path) -> None:
    enter()
    if hosts:
        bind(hosts, str(HOSTS))
    for i, (source, target) in enumerate(mounts):
        if not Path(target).exists():
            folder = scratch / f"m{i}"
            folder.mkdir(parents=True, exist_ok=True)
            make_folder(Path(target), folder)
        bind(source, target)


def _pair(mount: str) -> tuple[str, str]:
    source, _, target = mount.partition(":")
    return source, target


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m launcher.embedded.kubelet.podns")
    ap.add_argument("--hosts", help="the file to see as /etc/hosts")
    ap.add_argument("--mount", action="append", default=[], help="SRC:DST, bound read-only")
    ap.add_argument("--scratch", help="a folder of the pod's for the overlays' mount points")
    ap.add_argument("--check", action="store_true", help="say whether this machine can, and exit")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    return ap.parse_args(argv)


def check() -> str | None:
    """Why this machine cannot give a process pod its own mounts (one line), or None when it can:
    the whole set-up tried once, in a child, with a mount point that does not exist."""
    import subprocess

    with tempfile.TemporaryDirectory(prefix="reslice-podns-") as d:
        probe = Path(d, "probe")
        probe.write_text("ok")
        target = f"/run/reslice-podns-check-{os.getpid()}/a/b"
        argv = [sys.executable, "-m", "launcher.embedded.kubelet.podns", "--hosts", str(probe),
                "--mount", f"{d}:{target}", "--scratch", d, "--", "cat", f"{target}/probe"]  # fmt: skip
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if out.returncode == 0 and out.stdout == "ok":
        return None
    return (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.check:
        why = check()
        print(why or "ok")
        return 1 if why else 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("podns: no command", file=sys.stderr)
        return 2
    mounts = [_pair(m) for m in args.mount]
    try:
        setup(args.hosts, mounts, Path(args.scratch or tempfile.mkdtemp(prefix="reslice-podns-")))
    except (NamespaceError, OSError) as e:
        print(f"podns: this machine cannot give a process pod its own mounts: {e}", file=sys.stderr)
        return 126
    try:
        os.execvp(command[0], command)
    except OSError as e:
        print(f"podns: {command[0]}: {e}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
