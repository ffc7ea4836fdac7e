"""What survives a process: Orbax checkpoints in the run directory (``checkpoint``, ``storage``,
``stages``), the memory snapshots in RAM that in-place restarts restore from (``snapshot``, in the
directory ``memdir`` names), and the compiled train step kept across processes (``compile_cache``).
Imported by the loop and the supervisor; imports only the config."""
