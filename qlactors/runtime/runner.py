"""Shared: running a runtime in the foreground: the home lock, signals, the wake pipe and the exit
status.

A profile says how to start its actors and how to stop them; the Runner holds the process
around them. Signal handlers only count and write to the wake pipe (`signal.set_wakeup_fd`);
the main thread sleeps on that pipe and then shuts down. A second SIGTERM/SIGINT exits at once
(`os._exit`: pykka threads are not daemons). A fatal stop (`Fatal.trip`) writes to the pipe too.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time

from ..config import Config, ensure_home
from .context import SharedContext
from .home import RuntimeLock


class Runner:
    """Runs in the foreground until SIGTERM/SIGINT (or `stop()`); `run()` returns an exit status.

    A profile subclasses it with `_build_and_start()` (build the context and start the actors;
    on any failure `_start` stops what already started) and `_shutdown(ctx)` (stop them within
    the drain budget, `_stop_actors` in reverse order).
    """

    name = "runtime"
    log = logging.getLogger("qlactors.runner")  # a profile logs under its own name

    def __init__(self, config: Config) -> None:
        self.config = config
        self.ctx: SharedContext | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._signals = 0
        self.started = threading.Event()

    def _start(self) -> SharedContext:
        """Build the context and start the actors; on any failure stop what already started."""
        try:
            return self._build_and_start()
        except BaseException:
            if self.ctx is not None:
                self._shutdown(self.ctx)
            raise

    def _build_and_start(self) -> SharedContext:
        raise NotImplementedError

    def _start_actors(self, ctx: SharedContext, order: tuple[tuple[str, type, SharedContext], ...],
                      supervisor: type) -> None:
        """Start the bridge, the Supervisor (with a factory per actor, to restart it), then the
        actors in `order`, each `(name, class, its side's context)`. When one of them is
        `recovery`, its startup pass runs before the next starts, and admission opens after it
        (SEMANTICS.md §6); without one, at once."""
        from .signals import StartupPass, Tick

        ctx.bridge.on_exit = ctx.fatal.trip  # a bridge that stopped serving stops the runtime
        ctx.bridge.start()
        ctx.bridge.ready()
        factories = {name: (lambda cls=cls, side=side: cls.start(side)) for name, cls, side in order}
        ctx.directory.set("supervisor", supervisor.start(ctx, factories))
        if "recovery" not in factories:
            ctx.admitting.set()
        for name, _cls, _side in order:
            ctx.directory.set(name, factories[name]())
            if name == "recovery":
                started = time.monotonic()
                totals = ctx.directory.get("recovery").ask(StartupPass(), timeout=300)
                self.log.info("event=startup_recovery_done seconds=%.3f outcomes=%s",
                              time.monotonic() - started, totals)
                ctx.admitting.set()  # recovery is done: admission may open
        ctx.directory.tell("supervisor", Tick("startup"))

    def _stop_actors(self, ctx: SharedContext, names: list[str], deadline: float) -> None:
        """Stop these actors, in this order, within the drain budget that ends at `deadline`."""
        for name in names:
            ref = ctx.directory.get(name)
            if ref is None:
                continue
            try:
                ref.stop(timeout=max(0.1, deadline - time.monotonic()))
            except Exception as err:  # a stuck actor must not keep the process alive
                self.log.error("event=actor_stop_failed actor=%s error=%r", name, err)

    def _shutdown(self, ctx: SharedContext) -> None:
        raise NotImplementedError

    def _started_line(self) -> str:
        return f"event={self.name}_started home={self.config.home}"

    def _acquire(self):
        """Hold what this process must hold alone while it runs (edge: its home); returns a releaser."""
        lock = RuntimeLock(self.config.home)
        ensure_home(self.config)
        lock.acquire()
        return lock.release

    def run(self) -> int:
        release = self._acquire()
        previous = self._install_signals()
        try:
            ctx = self._start()
            self.started.set()
            self.log.info(self._started_line())
            while not ctx.fatal.event.is_set() and self._signals == 0:
                # Signals and a fatal stop write to the wake pipe: no need to poll often.
                select.select([self._wake_r], [], [], 60.0)
                self._drain_pipe()
            if ctx.fatal.event.is_set():
                self.log.error("event=runtime_stopping reason=%s", ctx.fatal.reason)
            self._shutdown(ctx)
            return 1 if ctx.fatal.event.is_set() else 0
        finally:
            self._restore_signals(previous)
            release()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def stop(self) -> None:
        """Ask a runtime running in another thread to shut down (tests, embedding)."""
        self._signals += 1
        self._poke()

    def _poke(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def _drain_pipe(self) -> None:
        try:
            while os.read(self._wake_r, 64):
                pass
        except (BlockingIOError, OSError):
            pass

    def _install_signals(self):
        if threading.current_thread() is not threading.main_thread():
            return None

        def handler(signum, _frame):
            self._signals += 1
            if self._signals > 1:
                os._exit(130)  # a second signal exits at once (pykka threads are not daemons)

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
        previous["wakeup"] = signal.set_wakeup_fd(self._wake_w)
        return previous

    def _restore_signals(self, previous) -> None:
        if not previous:
            return
        signal.set_wakeup_fd(previous.pop("wakeup"))
        for sig, old in previous.items():
            signal.signal(sig, old)
