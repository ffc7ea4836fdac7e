"""Reading the presets from disk: the presets directory (`$RESLICE_PRESETS_DIR`, e.g. in a container
image, or the repository's `presets/`), its YAML files parsed (launcher/core/presets.py's
`parse_preset`) and checked together, once per directory.

Only the edges call it: the commands (launcher/cli/commands/), `launch.prepare`, a `Controller` when it
is built, preflight, the sweep's spec and the embedded cluster's node pools. The core (plan, record,
policy, signals, render) is handed a `presets.Catalog` and never imports this module (an
import-linter contract in pyproject.toml).
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

import yaml

from launcher.core.errors import UserError
from launcher.core.presets import Catalog, Preset, Shape, check_fallbacks, parse_preset

DEFAULT_PRESETS_DIR = Path(__file__).resolve().parents[2] / "presets"


def presets_dir() -> Path:
    """`RESLICE_PRESETS_DIR` (e.g. in a container image) or the repository's `presets/`."""
    return Path(os.environ.get("RESLICE_PRESETS_DIR") or DEFAULT_PRESETS_DIR)


def load_preset_file(path: Path) -> Preset:
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{path.name}:{where} malformed YAML: {getattr(e, 'problem', e)}") from None
    except OSError as e:
        raise UserError(f"cannot read preset {path}: {e.strerror}") from None
    preset = parse_preset(raw, path.name)
    if preset.name != path.stem:
        raise UserError(f"{path.name}: name {preset.name!r} does not match the file name")
    return preset


def load_presets(directory: Path | None = None) -> dict[str, Preset]:
    """Every preset in `directory`, validated together (fallbacks must exist and be smaller)."""
    return _load_presets(directory or presets_dir())


@cache
def _load_presets(directory: Path) -> dict[str, Preset]:
    if not directory.is_dir():
        raise UserError(f"presets directory {directory} does not exist")
    presets = {p.stem: load_preset_file(p) for p in sorted(directory.glob("*.yaml"))}
    check_fallbacks(presets)
    return presets


def load_catalog(directory: Path | None = None) -> Catalog:
    """The catalog of `directory` (default `presets_dir()`), read from disk once per directory."""
    return _catalog(directory or presets_dir())


@cache
def _catalog(directory: Path) -> Catalog:
    return Catalog(_load_presets(directory))


def load_preset(name: str, directory: Path | None = None) -> Preset:
    return load_catalog(directory).preset(name)


def make_shape(preset_name: str, slices: int | None = None, directory: Path | None = None) -> Shape:
    return load_catalog(directory).shape(preset_name, slices)
