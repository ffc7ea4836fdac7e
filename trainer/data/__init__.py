"""What is read: token sources (synthetic, token files on disk or gs://), mixtures, the step-indexed
sample order every shape agrees on, and the held-out evaluation sets (``pipeline``). Imported by the
loop and the evaluation; imports only the config."""
