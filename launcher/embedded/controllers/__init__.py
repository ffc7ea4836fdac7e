"""The cluster's controllers on the controller runtime's work queues: Job, JobSet, the scheduler and the
node lifecycle. Each decides without I/O (*actions, filters) around a small loop."""
