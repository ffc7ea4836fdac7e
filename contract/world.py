"""The world document of an in-place run (docs/contract.md "The document"): its keys, which the
controller writes (launcher/core/world.py `document`) and every pod's supervisor reads
(trainer/elastic/world.py `parse`), and where the ConfigMap holds it."""

from __future__ import annotations

DATA_KEY = "world.json"  # the world ConfigMap's data key that holds the document

RUN = "run"
EPOCH = "epoch"  # strictly increasing for the life of the run
SLICES = "slices"  # the stable slice ids taking part, in process order
HOSTS_PER_SLICE = "hosts_per_slice"
COORDINATOR = "coordinator"  # host:port of process 0
GLOBAL_BATCH = "global_batch"
MICRO_BATCH = "micro_batch"
GRAD_ACCUM = "grad_accum"
MEGASCALE = "megascale"  # {"coordinator_address", "port"}
MEGASCALE_ADDRESS = "coordinator_address"
MEGASCALE_PORT = "port"
SEGMENT = "segment"  # optional: the child's RESLICE_SEGMENT (default: the epoch)
PUBLISHED = "published"  # optional: the controller's unix time of publication
HEARTBEAT = "heartbeat"  # optional: the controller's latest beat while the world waits for a slice
ENV = "env"  # optional: more variables for the child
LOST = "lost"  # optional: slices of the previous world whose hosts are gone
ATTEMPTS = "attempts"  # optional: per slice id, the restart attempt of its JobSet the world is for
