"""`qlactors web` on an address it cannot listen on (issue 28): one line naming the address and
the reason, exit 1, and nothing before it saying that it serves."""

from __future__ import annotations

import socket
import subprocess

from edge_harness import QLACTORS, Home, clean_env


def test_a_port_in_use_is_one_line_and_exit_1_before_anything_says_it_serves(tmp_path):
    home = Home(tmp_path)
    home.main("task", "add", "t", "--", "true")  # a home with a database
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        done = subprocess.run([*QLACTORS, "--home", str(home.path), "web", "--listen", f"127.0.0.1:{port}"],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, env=clean_env())
    finally:
        holder.close()
        home.close()
    assert done.returncode == 1, done
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert lines == [f"qlactors: cannot listen on 127.0.0.1:{port}: address already in use"], lines
