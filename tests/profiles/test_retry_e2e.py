"""`qlactors retry --wait` against a real `qlactors edge`: the retried run runs the old revision's command."""

from __future__ import annotations


def test_retry_wait_runs_the_revision_of_the_original_run_and_exits_with_its_code(home):
    home.add_tasks(("job", "--", "echo first; exit 3"))
    home.start_edge()
    original = home.ql("run", "job", "--wait")
    assert original.returncode == 3, (original.stdout, original.stderr)
    first = original.stdout.strip()
    home.main("task", "update", "job", "--", "echo second; exit 0")  # revision 2: not what is retried

    retried = home.ql("retry", first, "--wait")
    assert retried.returncode == 3, (retried.stdout, retried.stderr, home.edge_logs())
    again = retried.stdout.strip()
    assert again != first and retried.stdout == again + "\n"
    view = home.view(again)
    assert (view["task_revision"], view["retry_of_run_id"], view["trigger_type"], view["state"]) == (
        1, first, "manual", "failed")
    assert home.logs(again) == b"first\n"
