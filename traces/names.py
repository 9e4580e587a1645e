"""Names of the trace formats the loaders read (``--format``), importable without pandas (command-line help)."""
FORMAT_NAMES = ("azure", "splitwise", "lengths", "mooncake", "burstgpt", "parquet")
