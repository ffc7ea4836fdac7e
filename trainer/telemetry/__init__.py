"""What a run reports: metrics records and TensorBoard events in the run directory (``metrics``),
each process's start-up phases (``startup``), profiles (``profile``) and the devices' peak FLOP/s
for MFU (``peaks``). Imported by the loop and the entry point; imports nothing of the trainer but
its config."""
