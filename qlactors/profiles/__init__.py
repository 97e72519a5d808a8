"""The profiles: how the actors are wired into processes (edge: all of them in one)."""
