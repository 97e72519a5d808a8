"""The wire: message dataclasses and the versioned msgpack codec both sides of every socket speak."""
