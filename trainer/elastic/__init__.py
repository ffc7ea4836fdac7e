"""What lets a trainer outlive a shape change: the world a pod follows (``world``, ``world_source``),
the in-place follower that restarts its trainer child in each world (``follower``), the one-shot
supervisor of a multi-process trainer, whose fork both use (``supervisor``), the process group and
start barrier (``distributed``), telling a lost peer from a bug (``peers``) and the SIGTERM handler
and stall watchdog (``watchdog``). Imported by the entry point and the loop; imports the state's
memory directory, the config and the exit codes."""
