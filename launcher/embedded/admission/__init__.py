"""What the API server does to an object before it is stored: Go decoding, defaulting, the
built-in kinds' validation, and JobSet's CRD schema and webhooks."""
