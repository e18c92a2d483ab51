"""The training engine: workers, supervisor, sync models. Knows nothing of AWS or processes."""
