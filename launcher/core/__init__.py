"""The core: data in, data out. The run spec, presets, the plan, the run record, the signals, the
policy that decides, the renderer and the accounting. It imports nothing above it, does no I/O
and never reads presets/ itself (it is handed a presets.Catalog)."""
