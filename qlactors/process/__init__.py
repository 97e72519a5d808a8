"""The OS boundary: the launcher script, durable process identity, and the files they publish."""
