"""What lets a trainer outlive a shape change: the world a pod follows (``world``, ``world_source``),
the supervisor that restarts its trainer child in each world (``supervisor``), the process group and
start barrier (``distributed``), telling a lost peer from a bug (``peers``) and the SIGTERM handler
and stall watchdog (``watchdog``). Imported by the entry point and the loop; imports the state's
memory directory and the config."""
