"""The vocabulary of the embedded API: the Go types each kind decodes into, the kinds served
(resources), objects as plain dicts and ApiError. Imports nothing else of launcher.embedded."""
