"""The pure domain: states, transitions, retry policy and the receipt codec. No I/O here."""
