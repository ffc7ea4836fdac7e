"""MaxText's command line as the launcher rendered it (launcher/core/maxtext.py), and what the
entrypoint adds in the container. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from maxtext_entry import storage


class ConfigError(Exception):
    """A command line the entrypoint cannot run: exit 2."""


@dataclass(frozen=True)
class Command:
    config: list[str]  # [] (MaxText's base.yml) or [path.yml]
    keys: dict[str, str]

    @property
    def checkpoint_dir(self) -> str:
        return storage.join(self.keys["base_output_directory"], self.keys["run_name"], "checkpoints")

    @property
    def steps(self) -> int:
        return int(self.keys["steps"])

    def argv(self) -> list[str]:
        return [*self.config, *(f"{k}={v}" for k, v in self.keys.items())]


REQUIRED = ("base_output_directory", "run_name", "steps")


def parse(argv: list[str]) -> Command:
    """`[CONFIG.yml] key=value ...` (after `--`); the keys the entrypoint needs must be there."""
    config = argv[:1] if argv and argv[0].endswith((".yml", ".yaml")) else []
    keys: dict[str, str] = {}
    for arg in argv[len(config) :]:
        key, sep, value = arg.partition("=")
        if not sep or not key:
            raise ConfigError(f"argument {arg!r}: expected key=value")
        keys[key] = value
    if missing := [k for k in REQUIRED if k not in keys]:
        raise ConfigError(
            f"missing {', '.join(missing)} (the launcher renders them: launcher/core/maxtext.py)"
        )
    if not keys["steps"].isdigit() or int(keys["steps"]) < 1:
        raise ConfigError(f"steps={keys['steps']}: expected a positive integer")
    return Command(config, keys)


def for_container(cmd: Command, metrics_file: str, cpu: bool) -> Command:
    """The command the child runs here: this process's own local metrics file, and on CPU (the
    embedded cluster) `hardware=cpu` with the slices folded into ICI data parallelism, because
    MaxText sets `num_slices=1` on CPU (`get_num_slices`) and CPU devices have no slice index for
    a hybrid DCN mesh. The mesh keeps its shape: (slices × data) × fsdp × ... devices."""
    keys = dict(cmd.keys, metrics_file=metrics_file)
    if cpu:
        keys["hardware"] = "cpu"
        slices = int(keys.get("dcn_data_parallelism", "1"))
        keys["dcn_data_parallelism"] = "1"
        keys["ici_data_parallelism"] = str(int(keys.get("ici_data_parallelism", "1")) * slices)
    return Command(cmd.config, keys)
