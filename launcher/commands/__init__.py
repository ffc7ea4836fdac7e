"""The commands of `reslice`, one module per family; `launcher.cli` mounts them on its typer app in
the order `reslice --help` lists them."""
