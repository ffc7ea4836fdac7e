"""`python -m launcher.embedded`: run an embedded cluster in the foreground until SIGTERM/SIGINT.

`reslice cluster up` starts this detached. Once serving it writes `cluster.json` (pid, URL,
kubeconfig, node pools) in the state directory; on exit it removes it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from launcher.core.errors import UserError
from launcher.core.words import PodRuntime
from launcher.embedded.cluster import DEFAULT_NODEPOOLS, EmbeddedCluster


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m launcher.embedded")
    ap.add_argument("--nodepools", default=DEFAULT_NODEPOOLS)
    ap.add_argument("--state-dir", required=True, type=Path)
    ap.add_argument("--mode", default="process", choices=("process", "simulate"))
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--sim-duration", type=float, default=None)
    ap.add_argument("--runtime", default=PodRuntime.PROCESS, choices=tuple(PodRuntime))
    ap.add_argument("--share", action="append", default=[], type=Path, help="podman: mounted at its path")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        cluster = EmbeddedCluster(
            nodepools=args.nodepools,
            mode=args.mode,
            state_dir=args.state_dir,
            port=args.port,
            sim_duration_s=args.sim_duration,
            runtime=args.runtime,
            shared=args.share,
        )
        cluster.start()
    except UserError as e:
        print(f"reslice: error: {e}", file=sys.stderr)
        return 2
    info_file = args.state_dir / "cluster.json"
    try:
        info = {
            "pid": os.getpid(),
            "url": cluster.url,
            "kubeconfig": str(cluster.kubeconfig),
            **cluster.info(),
        }
        for p in info["nodepools"]:
            p["hosts"] = cluster.pools[p["name"]].shape.hosts
        tmp = info_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(info, indent=2))
        tmp.replace(info_file)  # atomic: `up` never reads half a file
        logging.info("embedded cluster serving at %s", cluster.url)
        stop.wait()
    finally:
        info_file.unlink(missing_ok=True)
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
