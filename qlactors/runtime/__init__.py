"""What every runtime process shares, whichever side it runs: the actor base and its directory,
the in-process signals, the Supervisor, the foreground runner, database outages and the home's
status files. It never imports the control side, the executor side or the profiles."""
