"""`reslice ui`: a local, read-only web page over the run records and run directories that `status`,
`watch` and `report` read (docs/ui.md). `model` shapes what the pages show (pure), `sources` reads it
from the cluster and the run directories, `pages` holds the HTML and its script, `server` serves them
(Starlette on uvicorn). Called by `launcher.cli.commands.ui` and `launcher.cli.demo`."""
