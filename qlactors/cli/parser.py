"""The `qlactors` argument grammar (ARCHITECTURE.md "Command line"); no behaviour lives here."""

from __future__ import annotations

import argparse

from .. import __version__
from ..domain.numbers import WHOLE_HINT, whole_or_none
from ..domain.states import RunStatus


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (what is wrong, where to look), exit 2."""

    def error(self, message: str):
        self.exit(2, f"qlactors: {message} (see `{self.prog} --help`)\n")


def whole(text: str) -> int:
    """An argparse `type` for N options: the strict grammar of docs/cli.md "Numbers"."""
    value = whole_or_none(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{text!r} {WHOLE_HINT}")
    return value


def utf8(value: str) -> str:
    """An argparse `type` for names and ids: text that is valid UTF-8 (argv may hold any bytes).

    Python turns undecodable argv bytes into lone surrogates, which the database driver cannot
    encode; refusing them here gives one line instead of a traceback, before anything is opened.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raw = value.encode("utf-8", "surrogateescape")
        raise argparse.ArgumentTypeError(f"{raw!r} is not valid UTF-8 (task names and run ids are "
                                         "letters, digits, '.', '_' and '-')") from None
    return value


def _task_options(p: argparse.ArgumentParser, *, update: bool) -> None:
    d = argparse.SUPPRESS if update else None
    p.add_argument("--timeout", metavar="SEC", default=d,
                   help="stop the job after SEC seconds (0 = no timeout)")
    p.add_argument("--stop-grace", metavar="SEC", default=d,
                   help="seconds between TERM and KILL when stopping (default 1, max 30)")
    p.add_argument("--max-concurrent", metavar="N", type=str, default=d,
                   help="how many runs of this task may run at once (default 1)")
    p.add_argument("--cwd", metavar="DIR", default=d, help="working directory of the job")
    p.add_argument("--env", metavar="K=V", action="append", default=d,
                   help="environment variable for the job (repeatable; on update, replaces them all)")
    p.add_argument("--keep-leftovers", action=argparse.BooleanOptionalAction, default=d,
                   help="leave what the job started in its process group running when it ends "
                        "(default: stop it, TERM then KILL after the stop grace)")
    labels = p.add_mutually_exclusive_group()
    labels.add_argument("--require-label", metavar="LABEL", action="append", default=d,
                        help="run only on workers that have this label (repeatable; on update, "
                             "replaces them all)")
    if update:
        labels.add_argument("--no-require-label", action="store_true", default=d,
                            help="remove every required label")
    retry = p.add_mutually_exclusive_group()
    retry.add_argument("--retry-on-lost", dest="retry_on_lost", action="store_true", default=d,
                       help="re-run automatically when an attempt is lost (needs --safety)")
    if update:
        retry.add_argument("--no-retry-on-lost", dest="retry_on_lost", action="store_false",
                           default=d, help="stop automatic re-runs")
    p.add_argument("--max-attempts", metavar="N", default=d, help="attempts in all, 1..16")
    p.add_argument("--safety", choices=("unknown", "idempotent", "deduplicated"), default=d,
                   help="whether the job may safely run twice")
    p.add_argument("--backoff", metavar="BASE_SEC[,MAX_SEC]", default=d,
                   help="retry delay: BASE*2^(n-1), at most MAX (default 1,300)")
    p.add_argument("--keep-days", metavar="DAYS", default=d,
                   help="retention of this task's finished runs: keep them DAYS days (fractions allowed, "
                        "1 hour..3650); `default`: the global retention_max_age_ms")
    p.add_argument("--keep-runs", metavar="N", default=d,
                   help="retention: keep this task's newest N finished runs (1..1000000); "
                        "`default`: the global retention_max_runs")
    cron = p.add_mutually_exclusive_group()
    cron.add_argument("--cron", metavar="EXPR", default=d,
                      help="run on this schedule: 5 fields, or 6 with seconds first ('*/5 * * * * *')")
    if update:
        cron.add_argument("--no-cron", dest="no_cron", action="store_true", default=d,
                          help="remove the schedule")
    p.add_argument("--tz", metavar="ZONE", default=d,
                   help="IANA zone of the schedule (default: the system zone, stored by name)")
    p.add_argument("--misfire", metavar="fire_once|skip", default=d,
                   help="after downtime: run the oldest missed occurrence once (default), or skip late ones")
    p.add_argument("--grace", metavar="SEC", default=d,
                   help="with --misfire skip: how late an occurrence may still run (default 30)")
    p.add_argument("--max-queued", metavar="N", default=d,
                   help="with --overlap queue: how many cron runs may wait queued; a fire beyond "
                        "that is recorded as skipped (default 1, max 1024)")
    p.add_argument("--random-delay", metavar="SEC", default=d,
                   help="start each cron run up to SEC seconds late, the same delay on every replica "
                        "for a given occurrence (default 0 = none, max 86400)")
    p.add_argument("--overlap", metavar="queue|skip|replace", default=d,
                   help="a fire while the task is at --max-concurrent: queue (default), skip, or "
                        "replace the oldest running run")


def _profile_options(p: argparse.ArgumentParser, what: str) -> None:
    # SUPPRESS: when not given here, the top-level `--config` stays in force.
    p.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS, help=f"the {what} (required)")
    p.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))


def _cluster_commands(sub) -> None:
    keys = sub.add_parser("keys", help="CurveZMQ key pairs for replicas and workers")
    ksub = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True, parser_class=Parser)
    new = ksub.add_parser("new", help="make NAME.key (public) and NAME.key_secret (0600); never overwrites")
    new.add_argument("name", type=utf8)
    new.add_argument("--dir", default="keys", metavar="DIR", help="where to put them (default ./keys)")

    control = sub.add_parser("control", help="run a cluster control replica in the foreground")
    _profile_options(control, "replica's control.toml")

    worker = sub.add_parser("worker", help="run an executor worker (worker --config FILE), or manage "
                                           "the allow-list (worker allow|revoke), or retire a worker")
    _profile_options(worker, "worker's worker.toml")
    wsub = worker.add_subparsers(dest="worker_command", metavar="ACTION", parser_class=Parser)
    allow = wsub.add_parser("allow", help="let the key in KEYFILE speak for worker NAME")
    allow.add_argument("name", type=utf8)
    allow.add_argument("keyfile", metavar="KEYFILE", help="the worker's NAME.key (public) file")
    revoke = wsub.add_parser("revoke", help="remove worker NAME's key and end its sessions (fences them)")
    revoke.add_argument("name", type=utf8)
    retire = wsub.add_parser("retire", help="the operator's word that nothing of WORKER runs any more: "
                                            "its sessions end and its waiting runs are recovered "
                                            "(lost, then their retry policy)")
    retire.add_argument("name", type=utf8, metavar="WORKER")
    retire.add_argument("--confirm-stopped", action="store_true",
                        help="required: you have made sure none of its jobs runs (its host is down, "
                             "or its processes are gone)")
    retire.add_argument("--force", action="store_true",
                        help="retire it even though its session's heartbeat is fresh (within its lease)")

    confirm = sub.add_parser("confirm-stopped", help="the operator's word that RUN's current attempt runs "
                                                      "nowhere: recovery ends it (lost, then its retry policy)")
    confirm.add_argument("run_id", type=utf8, metavar="RUN")
    confirm.add_argument("--by", type=utf8, metavar="NAME",
                         help="who says it, for the record (default: your login name)")

    workers = sub.add_parser("workers", help="each worker's current session: generation, status, "
                                             "free slots, last heartbeat, clock skew, labels")
    workers.add_argument("--json", action="store_true")


def _task_commands(sub) -> None:
    """`task add|update|enable|disable|list|show|rm`."""
    task = sub.add_parser("task", help="add, change, list and remove tasks")
    tsub = task.add_subparsers(dest="task_command", metavar="ACTION", required=True, parser_class=Parser)
    add = tsub.add_parser("add", help="add a task: task add NAME [options] -- COMMAND [ARG]...")
    add.add_argument("name", type=utf8)
    _task_options(add, update=False)
    upd = tsub.add_parser("update", help="change a task (a new revision): task update NAME [options] [-- COMMAND...]")
    upd.add_argument("name", type=utf8)
    _task_options(upd, update=True)
    for action, text in (("enable", "allow cron admission again"), ("disable", "stop cron admission (run still works)")):
        tsub.add_parser(action, help=text).add_argument("name", type=utf8)
    lst = tsub.add_parser("list", help="list tasks")
    lst.add_argument("--json", action="store_true")
    show = tsub.add_parser("show", help="show one task")
    show.add_argument("name", type=utf8)
    show.add_argument("--json", action="store_true")
    show.add_argument("--reveal", metavar="KEY", type=utf8,
                      help="print the value of the task's environment variable KEY (to a terminal only)")
    show.add_argument("--force", action="store_true", help="with --reveal: print it when stdout is not a terminal")
    rm = tsub.add_parser("rm", help="remove a task (history is kept)")
    rm.add_argument("name", type=utf8)
    rm.add_argument("--force", action="store_true", help="cancel its active runs instead of refusing")


def _run_commands(sub) -> None:
    """`run`, `runs`, `show`, `cancel`, `retry`."""
    run = sub.add_parser("run", help="request a run now; prints the run id")
    run.add_argument("name", type=utf8)
    run.add_argument("--wait", action="store_true",
                     help="follow it to the end; exit with the job's exit code (124 timed out, "
                          "130 cancelled or interrupted, 125 failed without an exit code)")
    run.add_argument("--wait-timeout", metavar="SEC",
                     help="with --wait: give up waiting after SEC seconds, exit 75 (the run goes on)")

    runs = sub.add_parser("runs", help="list runs, newest first")
    runs.add_argument("--task", metavar="NAME", type=utf8)
    runs.add_argument("--state", choices=[s.value for s in RunStatus])
    runs.add_argument("--limit", type=whole, default=20, metavar="N", help="at most N runs (default 20, max 500)")
    runs.add_argument("--after", metavar="CURSOR", type=utf8, help="continue from a previous page's cursor")
    runs.add_argument("--since", metavar="WHEN", help="only runs created at or after WHEN: an ISO 8601 date-time "
                                                      "(2026-12-06T05:00:00Z, or with an offset; without one, "
                                                      "UTC) or milliseconds since the epoch")
    runs.add_argument("--until", metavar="WHEN", help="only runs created before WHEN (as for --since)")
    runs.add_argument("--json", action="store_true")

    show_run = sub.add_parser("show", help="a run with its attempts and events")
    show_run.add_argument("run_id", type=utf8)
    show_run.add_argument("--json", action="store_true")

    cancel = sub.add_parser("cancel", help="cancel a run")
    cancel.add_argument("run_id", type=utf8)

    retry = sub.add_parser("retry", help="run a finished run again (same task revision); prints the new run id")
    retry.add_argument("run_id", type=utf8)
    retry.add_argument("--wait", action="store_true",
                       help="follow the new run to the end; exit statuses as for `run --wait`")
    retry.add_argument("--wait-timeout", metavar="SEC",
                       help="with --wait: give up waiting after SEC seconds, exit 75 (the run goes on)")


def _notify_commands(sub) -> None:
    """`notify add|list|rm`: notifications of runs that end in some states."""
    notify = sub.add_parser("notify", help="where to tell about runs that end failed, timed out, lost... "
                                           "(delivered by `qlactors web`)")
    nsub = notify.add_subparsers(dest="notify_command", metavar="ACTION", required=True, parser_class=Parser)
    add = nsub.add_parser("add", help="notify --webhook URL, --apprise URL or --command CMD")
    add.add_argument("--task", type=utf8, metavar="NAME", help="only this task's runs (default: every task)")
    add.add_argument("--on", metavar="STATES", help="terminal states, `lost` or `recovered`, comma-separated (default failed,timed_out,lost)")
    target = add.add_mutually_exclusive_group(required=True)
    target.add_argument("--webhook", metavar="URL", type=utf8, help="POST the run's facts as JSON to URL")
    target.add_argument("--apprise", metavar="URL", type=utf8,
                        help="send through apprise (tgram://, dingtalk://, wecombot://, bark://, mailto://...)")
    target.add_argument("--command", metavar="CMD", type=utf8, dest="run_command",
                        help="run CMD (sh -c) with the facts in QLACTORS_NOTIFY_* variables")
    add.add_argument("--secret-file", metavar="FILE", type=utf8,
                     help="sign each webhook POST with the secret in FILE (`-`: stdin), never shown again")
    lst = nsub.add_parser("list", help="the notification rules")
    lst.add_argument("--json", action="store_true")
    rm = nsub.add_parser("rm", help="remove rule ID")
    rm.add_argument("rule_id", type=utf8)


def _token_commands(sub) -> None:
    """`token new|revoke|list`: the HTTP API's bearer tokens."""
    token = sub.add_parser("token", help="bearer tokens for the HTTP API (only their hash is stored)")
    tsub = token.add_subparsers(dest="token_command", metavar="ACTION", required=True, parser_class=Parser)
    new = tsub.add_parser("new", help="make token NAME; prints its secret, once, alone on stdout")
    new.add_argument("name", type=utf8)
    new.add_argument("--read-only", action="store_true", help="it may read everything and change nothing")
    revoke = tsub.add_parser("revoke", help="end token NAME: its secret is refused from the next request on")
    revoke.add_argument("name", type=utf8)
    lst = tsub.add_parser("list", help="the tokens, live ones first (never their secrets)")
    lst.add_argument("--json", action="store_true")


def _audit_commands(sub) -> None:
    """`audit receipts`."""
    audit = sub.add_parser("audit", help="read-only checks of the home's files")
    asub = audit.add_subparsers(dest="audit_command", metavar="WHAT", required=True, parser_class=Parser)
    receipts = asub.add_parser("receipts", help="classify receipt files no journal row accounts for")
    receipts.add_argument("--shard", default="00", metavar="HEX", help="first shard to read (00..ff)")
    receipts.add_argument("--shards", type=whole, default=8, metavar="N", help="shards to read (max 32)")
    receipts.add_argument("--per-shard", type=whole, default=32, metavar="N", help="entries per shard (max 64)")
    receipts.add_argument("--quarantine", action="store_true",
                          help="move eligible orphans into .orphan-quarantine (never deletes)")
    receipts.add_argument("--json", action="store_true")


def build() -> Parser:
    top = Parser(prog="qlactors", description="A durable job runtime: run commands as OS processes, keep every result.")
    top.add_argument("--version", action="version", version=f"qlactors {__version__}")
    top.add_argument("--home", metavar="DIR", help="data directory (default $QLACTORS_HOME or $XDG_DATA_HOME/qlactors)")
    top.add_argument("--config", metavar="FILE", help="TOML settings (default <home>/qlactors.toml if present)")
    sub = top.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=Parser)

    _task_commands(sub)

    _run_commands(sub)

    edge = sub.add_parser("edge", help="run the local runtime in the foreground until SIGTERM/SIGINT")
    edge.add_argument("--profile", choices=("edge", "standalone"), help="budgets (default: config, else edge)")
    edge.add_argument("--cancel-running", action="store_true",
                      help="on shutdown cancel running jobs (reason shutdown) instead of leaving them running")
    edge.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))

    status = sub.add_parser("status", help="exit 0 when the runtime for this home is up, 3 when not")
    status.add_argument("--json", action="store_true")
    status.add_argument("--all", action="store_true",
                        help="cluster: list every replica row, stopped and long-silent ones too")

    logs = sub.add_parser("logs", help="the job's output, byte for byte")
    logs.add_argument("run_id", type=utf8)
    logs.add_argument("--attempt", type=whole, metavar="N", help="attempt number (default: the latest)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")

    _cluster_commands(sub)

    _token_commands(sub)

    _notify_commands(sub)

    web = sub.add_parser("web", help="serve the HTTP API and the web page (default 127.0.0.1:5700; "
                                     "docs/web.md); on a cluster with --config control.toml")
    web.add_argument("--listen", metavar="HOST:PORT", help="where to listen (default: [web] listen, "
                                                           "else 127.0.0.1:5700)")
    web.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))

    _audit_commands(sub)
    return top
