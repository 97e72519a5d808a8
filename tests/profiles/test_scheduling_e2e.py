"""Schedules and lost-run retry with the real `qlactors edge` process (SEMANTICS.md §8, §10):
every occurrence of a per-second schedule admitted once, each overlap policy with a job that
outlives its period, and a reboot in the middle of a run (the boot id read from a file the test
changes)."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from edge_harness import TERMINAL, Home, kill_group, wait_until


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def cron_runs(home: Home, task: str) -> list:
    return home.query("SELECT r.* FROM runs r JOIN tasks t ON t.id = r.task_id WHERE t.name = ? "
                      "AND r.trigger_type = 'cron' ORDER BY r.scheduled_for_ms", (task,))


def trigger_events(home: Home, task: str) -> list:
    return home.query("SELECT e.* FROM trigger_events e JOIN triggers g ON g.id = e.trigger_id "
                      "JOIN tasks t ON t.id = g.task_id WHERE t.name = ? ORDER BY e.scheduled_for_ms", (task,))


def each_occurrence_once(runs: list, events: list) -> list[int]:
    """The seconds a per-second schedule accounted for, each exactly once: a run, a `skipped`
    event (one occurrence) or a `missed` event (`occurrences` seconds from its first), and
    together every second from the first to the last, none left out. Returns them in order."""
    seen = [r["scheduled_for_ms"] for r in runs]
    for e in events:
        seen += [e["scheduled_for_ms"] + 1000 * i for i in range(e["occurrences"])]
    assert all(s % 1000 == 0 for s in seen), seen  # occurrences fall on whole seconds
    assert len(seen) == len(set(seen)), sorted(seen)  # never two outcomes for one occurrence
    assert sorted(seen) == list(range(min(seen), max(seen) + 1000, 1000)), sorted(seen)  # none lost
    return sorted(seen)


def test_a_per_second_schedule_admits_each_occurrence_once_and_runs_it(home):
    # Counted in fires, not in a wall-clock window: ten admitted runs, then the schedule is
    # disabled and every second it covered must be one run or one recorded miss (a loaded
    # machine may fold a late second into `missed`; it may never lose or double one). How late
    # each run is admitted is a speed figure: benchmarks/bench_cron.py measures it.
    home.add_tasks(("tick", "--cron", "* * * * * *", "--tz", "UTC", "--", "true"))
    edge = home.start_edge()
    wait_until(lambda: len(cron_runs(home, "tick")) >= 10, 60,
               lambda: f"ten cron runs: {len(cron_runs(home, 'tick'))}\n{edge.log()[-2000:]}")
    home.ok("task", "disable", "tick")  # no more fires; what is there settles
    runs, events = cron_runs(home, "tick"), trigger_events(home, "tick")
    each_occurrence_once(runs, events)
    assert {e["type"] for e in events} <= {"missed"}, events  # `queue` with `true`: nothing skipped
    assert len({r["idempotency_key"] for r in runs}) == len(runs)
    admitted = {r["id"] for r in runs}

    def ended() -> list:
        rows = [r for r in cron_runs(home, "tick") if r["id"] in admitted]
        return rows if all(r["status"] in TERMINAL for r in rows) else []
    ran = wait_until(ended, 30, lambda: f"every admitted run to end: {[r['status'] for r in cron_runs(home, 'tick')]}")
    assert {r["status"] for r in ran} == {"succeeded"}, [r["status"] for r in ran]


def intervals(home: Home, task: str) -> list[tuple[int, int]]:
    """(started, finished) of every run of the task that started."""
    rows = home.query("SELECT r.started_at_ms, COALESCE(r.finished_at_ms, 9e15) AS f FROM runs r "
                      "JOIN tasks t ON t.id = r.task_id WHERE t.name = ? AND r.started_at_ms IS NOT NULL",
                      (task,))
    return sorted((r["started_at_ms"], int(r["f"])) for r in rows)


def never_overlapping(spans: list[tuple[int, int]]) -> bool:
    return all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))


def _skipped(events: list) -> list:
    return [e for e in events if e["type"] == "skipped"]


def _replaced(runs: list) -> list:
    return [r for r in runs if r["cancel_reason"] == "policy"]


# What each policy must have done before the schedule is disabled: counted in fires and their
# outcomes, not in seconds of wall clock (a loaded machine admits fewer fires in the same time).
ENOUGH_FIRES = {
    "queue": lambda runs, events: len(runs) >= 2 and len(_skipped(events)) >= 1,
    "skip": lambda runs, events: len(runs) >= 1 and len(_skipped(events)) >= 2,
    # Two replaced runs that ended cancelled, and the run that replaced the second one.
    "replace": lambda runs, events: sum(r["status"] == "cancelled" for r in _replaced(runs)) >= 2
                                    and len(runs) >= 3,
}


@pytest.mark.parametrize("overlap", ["queue", "skip", "replace"])
def test_each_overlap_policy_with_a_job_that_outlives_its_period(home, overlap):
    task = f"slow-{overlap}"
    home.add_tasks((task, "--cron", "* * * * * *", "--tz", "UTC", "--overlap", overlap,
                    "--stop-grace", "0", "--", "sleep", "2.5"))
    edge = home.start_edge()
    wait_until(lambda: ENOUGH_FIRES[overlap](cron_runs(home, task), trigger_events(home, task)), 60,
               lambda: f"the fires {overlap} needs: runs {[(r['status'], r['cancel_reason']) for r in cron_runs(home, task)]}, "
                       f"events {[(e['type'], e['occurrences']) for e in trigger_events(home, task)]}\n{edge.log()[-2000:]}")
    home.ok("task", "disable", task)  # no more fires; what is there settles
    runs = cron_runs(home, task)
    events = trigger_events(home, task)
    spans = intervals(home, task)
    assert never_overlapping(spans), spans  # max_concurrent 1: never two copies at once
    each_occurrence_once(runs, events)  # every fire was a run, a skip or a miss, once
    if overlap == "queue":
        # --max-queued 1 (the default): one run waits, the fires beyond it are recorded skipped
        # (before it, every fire queued: 8 runs waited after 21 s of `*/2` with `sleep 5`)
        assert sum(r["status"] == "queued" for r in runs) <= 1, [r["status"] for r in runs]
        assert not _replaced(runs)
    elif overlap == "skip":
        # A fire while the one run is active is skipped: never a second run waiting behind it.
        assert sum(r["status"] == "queued" for r in runs) <= 1 and not _replaced(runs), [r["status"] for r in runs]
        assert len(_skipped(events)) >= 2
    else:
        # Replace never skips a fire; a loaded machine may fold a late second into `missed`.
        assert not _skipped(events), events
        replaced = _replaced(runs)
        assert len(replaced) >= 2, [(r["status"], r["cancel_reason"]) for r in runs]
        assert all(r["status"] == "cancelled" for r in replaced[:-1]), [r["status"] for r in replaced]
        # Each replaced run was replaced by the next fire's run: it is not the newest.
        assert runs[-1]["id"] not in {r["id"] for r in replaced[:-1]}
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
