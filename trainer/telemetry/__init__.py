"""What a run reports: metrics records and TensorBoard events in the run directory (``metrics``) and
each process's start-up phases (``startup``). Imported by the loop and the entry point; imports
nothing of the trainer."""
