"""The stand-in MaxText (fake_maxtext.py) as an importable package, `maxtext.trainers.pre_train.train`,
for a PYTHONPATH: what the entrypoint runs with `python -m` when its interpreter has "MaxText"."""

from __future__ import annotations

from pathlib import Path


def fake_package(tmp_path: Path) -> Path:
    """The directory to put on PYTHONPATH."""
    pkg = tmp_path / "fake" / "maxtext" / "trainers" / "pre_train"
    pkg.mkdir(parents=True)
    for d in (pkg, pkg.parent, pkg.parent.parent):
        (d / "__init__.py").write_text("")
    (pkg / "train.py").write_text((Path(__file__).parent / "fake_maxtext.py").read_text())
    return tmp_path / "fake"
