"""The command line: the console entry point, the typer app (the one error path), the shared options
and the commands."""
