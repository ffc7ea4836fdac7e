"""The commands of `reslice`, one module per family; `launcher.cli.app` mounts them on its typer app in
the order `reslice --help` lists them."""
