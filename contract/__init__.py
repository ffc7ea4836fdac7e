"""The words the launcher and the trainer share on the wire (docs/contract.md), defined once: the
enums both sides write and read (`words`), the trainer's exit codes (`exits`), the names of the
environment variables the launcher sets and the trainer reads (`envvars`), and the keys of an
in-place run's world document (`world`).

launcher/ and trainer/ both import it and still import nothing of each other; it imports neither
(import-linter, pyproject.toml), nothing outside the standard library, and no module of its own
holds logic beyond reading an older writer's spelling. Both images carry it (docker/)."""
