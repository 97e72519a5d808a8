"""Schedules and lost-run retry with the real `qlactors edge` process (SEMANTICS.md §8, §10):
a per-second schedule's rate, each overlap policy with a job that outlives its period, and a
reboot in the middle of a run (the boot id read from a file the test changes)."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from edge_harness import Home, kill_group, wait_until


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def cron_runs(home: Home, task: str) -> list:
    return home.query("SELECT r.* FROM runs r JOIN tasks t ON t.id = r.task_id WHERE t.name = ? "
                      "AND r.trigger_type = 'cron' ORDER BY r.scheduled_for_ms", (task,))


def trigger_events(home: Home, task: str) -> list:
    return home.query("SELECT e.* FROM trigger_events e JOIN triggers g ON g.id = e.trigger_id "
                      "JOIN tasks t ON t.id = g.task_id WHERE t.name = ? ORDER BY e.scheduled_for_ms", (task,))


def test_a_per_second_schedule_observed_for_10_s_admits_9_to_11_runs(home):
    home.add_tasks(("tick", "--cron", "* * * * * *", "--tz", "UTC", "--", "true"))
    edge = home.start_edge()
    time.sleep(1.5)
    start = now_ms()
    time.sleep(10)
    end = now_ms()
    window = [r for r in cron_runs(home, "tick") if start <= r["scheduled_for_ms"] < end]
    assert 9 <= len(window) <= 11, (len(window), edge.log()[-2000:])
    scheduled = [r["scheduled_for_ms"] for r in cron_runs(home, "tick")]
    assert len(scheduled) == len(set(scheduled))  # never two runs for one occurrence
    assert all(s % 1000 == 0 for s in scheduled)
    # Admitted on time: the cadence wakes at each fire (~10 ms late here), not at the 5 s tick.
    late = sorted(r["created_at_ms"] - r["scheduled_for_ms"] for r in window)
    assert late[len(late) // 2] < 250 and late[-1] < 1000, late
    assert {r["status"] for r in window[:-2]} <= {"succeeded"}, [r["status"] for r in window]


def intervals(home: Home, task: str) -> list[tuple[int, int]]:
    """(started, finished) of every run of the task that started."""
    rows = home.query("SELECT r.started_at_ms, COALESCE(r.finished_at_ms, 9e15) AS f FROM runs r "
                      "JOIN tasks t ON t.id = r.task_id WHERE t.name = ? AND r.started_at_ms IS NOT NULL",
                      (task,))
    return sorted((r["started_at_ms"], int(r["f"])) for r in rows)


def never_overlapping(spans: list[tuple[int, int]]) -> bool:
    return all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


@pytest.mark.parametrize("overlap", ["queue", "skip", "replace"])
def test_each_overlap_policy_with_a_job_that_outlives_its_period(home, overlap):
    task = f"slow-{overlap}"
    home.add_tasks((task, "--cron", "* * * * * *", "--tz", "UTC", "--overlap", overlap,
                    "--stop-grace", "0", "--", "sleep", "2.5"))
    edge = home.start_edge()
    time.sleep(5)
    home.ok("task", "disable", task)  # no more fires; what is there settles
    runs = cron_runs(home, task)
    events = trigger_events(home, task)
    spans = intervals(home, task)
    assert never_overlapping(spans), spans  # max_concurrent 1: never two copies at once
    if overlap == "queue":
        # --max-queued 1 (the default): one run waits, the fires beyond it are recorded skipped
        # (before it, every fire queued: 8 runs waited after 21 s of `*/2` with `sleep 5`)
        assert len(runs) >= 2 and sum(r["status"] == "queued" for r in runs) <= 1, [r["status"] for r in runs]
        skipped = [e for e in events if e["type"] == "skipped"]
        assert len(skipped) >= 1, events
        assert not {e["scheduled_for_ms"] for e in skipped} & {r["scheduled_for_ms"] for r in runs}
    elif overlap == "skip":
        assert 1 <= len(runs) <= 3, [r["status"] for r in runs]
        skipped = [e for e in events if e["type"] == "skipped"]
        assert len(skipped) >= 2, events
        assert not {e["scheduled_for_ms"] for e in skipped} & {r["scheduled_for_ms"] for r in runs}
    else:
        # Replace never skips a fire; a loaded machine may fold a late second into `missed`.
        assert len(runs) >= 4 and not [e for e in events if e["type"] != "missed"], events
        replaced = [r for r in runs if r["cancel_reason"] == "policy"]
        assert len(replaced) >= 2, [(r["status"], r["cancel_reason"]) for r in runs]
        assert all(r["status"] == "cancelled" for r in replaced[:-1]), [r["status"] for r in replaced]
    edge.terminate()


def test_a_reboot_mid_run_makes_the_run_lost_and_attempt_2_runs_after_the_backoff(home, tmp_path):
    boot = tmp_path / "boot_id"
    boot.write_text(f"{uuid.uuid4()}\n")
    env = {"QLACTORS_TEST_BOOT_ID_FILE": str(boot)}
    flag = tmp_path / "attempt-1-ran"
    home.add_tasks(("flaky", "--retry-on-lost", "--max-attempts", "2", "--safety", "idempotent",
                    "--backoff", "1", "--", "sh", "-c", f"[ -e {flag} ] && exit 0; : > {flag}; exec sleep 30"))
    edge = home.start_edge(env=env)
    run_id = home.run("flaky")
    first = home.wait_running(run_id)
    # The "reboot": the runtime dies and comes back on a machine with a new boot id. The old
    # launcher is left running on purpose: only the boot id can tell the runtime it is gone.
    edge.kill9()
    boot.write_text(f"{uuid.uuid4()}\n")
    home.start_edge(env=env)
    try:
        assert home.wait_terminal(run_id, timeout=30) == "succeeded"
        assert os.path.exists(f"/proc/{first['pid']}")  # it was the boot id, not /proc, that decided
    finally:
        kill_group(first["pgid"])
    view = home.view(run_id)
    assert [a["state"] for a in view["attempts"]] == ["lost", "succeeded"]
    types = [e["type"] for e in view["events"]]
    assert types.index("run.lost") < types.index("run.retry_wait") < types.index("run.succeeded"), types
    lost_at = next(e["at_ms"] for e in view["events"] if e["type"] == "run.lost")
    assert view["attempts"][1]["created_at_ms"] - lost_at >= 1000  # the 1 s backoff was honoured


def test_retention_retires_the_oldest_finished_runs_on_the_cadence_and_logs_says_so(home):
    home.path.mkdir(mode=0o700, parents=True, exist_ok=True)
    (home.path / "qlactors.toml").write_text("[runtime]\ncadence_tick_ms = 200\nretention_max_runs = 2\n")
    home.add_tasks(("chatty", "--", "sh", "-c", "echo out"))
    edge = home.start_edge()
    run_ids = []
    for _ in range(4):
        run_ids.append(home.run("chatty"))
        assert home.wait_terminal(run_ids[-1]) == "succeeded"
    oldest, second, *kept = run_ids

    def retired() -> bool:
        return len(home.query("SELECT run_id FROM run_tombstones")) == 2
    wait_until(retired, 15, lambda: f"two runs retired; {edge.log()[-1500:]}")
    assert {r["run_id"] for r in home.query("SELECT run_id FROM run_tombstones")} == {oldest, second}
    assert [r["id"] for r in home.query("SELECT id FROM runs ORDER BY created_at_ms")] == kept
    gone = home.ql("logs", oldest)
    assert gone.returncode == 4 and "retired" in gone.stderr, (gone.returncode, gone.stderr)
    assert home.logs(kept[-1]) == b"out\n"  # the newest keep their logs
    assert "event=runs_retired" in edge.log()


SLOW_TICK = """\
[runtime]
cadence_tick_ms = 60000
idle_tick_ms = 60000
"""


def test_a_random_delay_holds_the_cron_run_until_its_not_before_and_the_cadence_wakes_for_it(tmp_path):
    from datetime import datetime, timezone

    from edge_harness import Home
    from qlactors.domain.cron_delay import random_delay_ms

    home = Home(tmp_path, config=SLOW_TICK)  # a minute's tick: only the wake-ups can start it in time
    try:
        at = datetime.fromtimestamp(now_ms() // 1000 + 8, timezone.utc)  # one fire, 8 s from now
        expr = f"{at.second} {at.minute} {at.hour} {at.day} {at.month} *"
        home.add_tasks(("spread", "--cron", expr, "--tz", "UTC", "--random-delay", "8", "--", "true"))
        edge = home.start_edge()
        [run] = wait_until(lambda: [r for r in cron_runs(home, "spread") if r["status"] == "succeeded"], 60,
                           lambda: f"the delayed run to finish: {[dict(r) for r in cron_runs(home, 'spread')]}"
                                   f"\n{edge.log()[-2000:]}")
        scheduled = run["scheduled_for_ms"]
        assert scheduled == int(at.timestamp()) * 1000
        expected = scheduled + random_delay_ms(run["trigger_id"], scheduled, 8_000)
        assert run["not_before_ms"] == expected  # the domain's deterministic delay
        assert run["started_at_ms"] >= expected, (run["started_at_ms"], expected)
        # Started at its not-before, not at the next one-minute tick (a wide margin, not a speed test).
        assert run["started_at_ms"] - expected < 30_000, (run["started_at_ms"], expected)
        shown = home.ok("show", run["id"]).stdout
        assert any(line.startswith("not before:") for line in shown.splitlines()), shown
        assert home.show(run["id"])["not_before_ms"] == expected
        edge.terminate()
    finally:
        home.close()
