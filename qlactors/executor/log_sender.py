"""Executor side: the LogSender (cluster worker): ships each attempt's local log to the control side in
chunks (SEMANTICS.md §13), at least every second while new bytes exist, with a bounded window of
unacknowledged chunks; records the acknowledged offset in the journal; stops once the final
offset the completion named is acknowledged. Edge keeps logs in local files and has no sender.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ..domain.results import Result
from ..errors import PeerFault
from ..ids import new_id
from ..process.logs import UnsafeLogPath
from ..runtime.actor import RuntimeActor
from ..runtime.signals import LogFinal, Resume, ShipLog, ShipTick
from ..wire import messages as m
from .context import ExecutorContext
from .log_shipping import LogShipper, chunks_to_send

log = logging.getLogger("qlactors.logs")

SHIP_INTERVAL_S = 1.0
# Ticks without any answer after which the window is sent again (the bridge failed over meanwhile).
RESEND_AFTER_TICKS = 5


@dataclass
class _Shipping:
    run_id: str
    attempt_id: str
    token_hash: str
    path: str
    shipper: LogShipper
    final_offset: int | None = None
    silent_ticks: int = 0


class LogSender(RuntimeActor):
    ctx: ExecutorContext
    name = "logs"
    uses_outbox = True

    def __init__(self, ctx: ExecutorContext) -> None:
        super().__init__(ctx)
        self.shipping: dict[str, _Shipping] = {}
        self.worker_id = ""

    def handlers(self):
        return {ShipLog: self.on_ship, LogFinal: self.on_final, m.LogAck: self.on_ack, ShipTick: self.on_tick,
                Resume: self.on_resume}

    def started(self) -> None:
        self.actor_ref.tell(Resume())  # after a restart of the worker or of this actor

    def on_resume(self, _msg: Resume, _peer: bytes) -> None:
        """Ship on from the journal: every log not yet acknowledged to its final offset, from the
        acknowledged offset (the journal's `shipped_offset`)."""
        for e in self.ctx.journal.walk(("launching", "started", "completed")):
            if e.attempt_id in self.shipping:
                continue
            if e.final_offset is not None and e.shipped_offset >= e.final_offset:
                continue
            self.shipping[e.attempt_id] = _Shipping(
                e.run_id, e.attempt_id, e.callback_token_hash, e.log_path,
                LogShipper(acked_offset=e.shipped_offset), final_offset=e.final_offset)
            self._send(self.shipping[e.attempt_id])
        if self.shipping:
            self._schedule()

    def on_ship(self, msg: ShipLog, _peer: bytes) -> None:
        self.worker_id = msg.worker_id or self.worker_id
        if msg.attempt_id not in self.shipping:
            self.shipping[msg.attempt_id] = _Shipping(msg.run_id, msg.attempt_id, msg.token_hash, msg.path,
                                                      LogShipper(acked_offset=msg.acked_offset))
        self._send(self.shipping[msg.attempt_id])
        self._schedule()

    def on_final(self, msg: LogFinal, _peer: bytes) -> None:
        item = self.shipping.get(msg.attempt_id)
        if item is None:
            return
        item.final_offset = msg.final_offset
        self._send(item)
        self._finish_if_done(item)

    def on_ack(self, msg: m.LogAck, _peer: bytes) -> None:
        item = self.shipping.get(msg.attempt_id)
        if item is None:
            return
        item.silent_ticks = 0
        if msg.result != Result.APPLIED:
            # A gap or a conflict (e.g. after a failover): start again where the control side is.
            log.warning("event=log_chunk_refused attempt=%s acked=%d detail=%s", msg.attempt_id,
                        msg.acked_offset, msg.detail)
            item.shipper = LogShipper(acked_offset=msg.acked_offset)
            self._send(item)
            return
        try:
            moved = item.shipper.acked(msg.acked_offset)
        except PeerFault as err:  # an answer to chunks of an earlier window: start from it
            log.warning("event=log_ack_unexpected attempt=%s error=%s", msg.attempt_id, err)
            item.shipper = LogShipper(acked_offset=msg.acked_offset)
            moved = True
        if moved:
            self.ctx.journal.shipped(msg.attempt_id, msg.acked_offset)
        self._send(item)
        self._finish_if_done(item)

    def on_tick(self, _msg: ShipTick, _peer: bytes) -> None:
        for item in list(self.shipping.values()):
            if item.shipper.in_flight:
                item.silent_ticks += 1
                if item.silent_ticks >= RESEND_AFTER_TICKS:
                    item.silent_ticks = 0
                    item.shipper.rewind()  # sent again from the acknowledged offset
            self._send(item)
        if self.shipping:
            self._schedule()

    def _schedule(self) -> None:
        if self.ctx.bridge.timer_due("log-ship") is None:
            self.ctx.bridge.call_at("log-ship", time.monotonic() + SHIP_INTERVAL_S, self.me, ShipTick())

    def _send(self, item: _Shipping) -> None:
        limit = item.final_offset
        try:
            chunks = chunks_to_send(item.shipper, item.path, end=limit)
        except (OSError, UnsafeLogPath, ValueError) as err:
            log.warning("event=log_read_failed attempt=%s error=%s", item.attempt_id, err)
            return
        for chunk, data in chunks:
            if limit is not None and chunk.offset >= limit:
                break  # nothing past the final offset is the job's (SEMANTICS.md §13)
            self.out.to_control(m.LogChunk(
                request_id=new_id(), worker_id=self.worker_id, run_id=item.run_id, attempt_id=item.attempt_id,
                callback_token_hash=item.token_hash, offset=chunk.offset, data=data, checksum=chunk.checksum))

    def _finish_if_done(self, item: _Shipping) -> None:
        if item.shipper.done(item.final_offset):
            self.ctx.journal.final_offset(item.attempt_id, item.final_offset)
            del self.shipping[item.attempt_id]
            log.info("event=log_shipped attempt=%s bytes=%d", item.attempt_id, item.final_offset)

