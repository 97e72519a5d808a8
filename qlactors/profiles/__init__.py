"""Profile: assembly only: how the actors of each side are wired into processes (edge: both sides in
one)."""
