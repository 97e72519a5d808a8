"""The soak's ledger parsed back into executions (no process)."""

from __future__ import annotations

from invariants import Execution
from ledger import parse

A1 = "01a23283-d829-7e7c-ab9c-8f91143bdd46"
A2 = "01a23283-ec50-713d-8149-585ebc2ab03a"
FIFO = "/tmp/x/state-w1/receipts/ab/{}.fifo"


def test_starts_and_ends_pair_up_by_attempt_and_process_group_in_milliseconds_and_name_their_worker():
    text = "\n".join([
        f"start 1000000000 41 {FIFO.format(A1)}",
        f"start 1500000000 42 {FIFO.format(A2)}",
        f"end 2000999999 41 {FIFO.format(A1)}",
    ])
    executions, bad = parse(text)
    assert bad == []
    assert sorted(executions, key=lambda e: e.start_ms) == [
        Execution(A1, 1000, 2000, 41, "w1"), Execution(A2, 1500, None, 42, "w1")]


def test_an_attempt_started_twice_is_two_executions_and_a_line_naming_no_attempt_is_returned():
    text = "\n".join([
        f"start 1000000000 41 {FIFO.format(A1)}",
        f"start 3000000000 41 {FIFO.format(A1)}",
        f"end 4000000000 41 {FIFO.format(A1)}",
        "start 5000000000 43 pipe:[1234]",
        "garbage",
    ])
    executions, bad = parse(text)
    assert sorted(executions, key=lambda e: e.start_ms) == [
        Execution(A1, 1000, None, 41, "w1"), Execution(A1, 3000, 4000, 41, "w1")]
    assert bad == ["start 5000000000 43 pipe:[1234]", "garbage"]
