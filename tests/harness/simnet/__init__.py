"""The simulated network (issue 17): real actors on a real store in one process, a seeded faulty
link between the worker and each replica, and the invariants checked once it settles."""
