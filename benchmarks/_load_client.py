"""A protocol-level load client for `bench_control_plane.py`: one process that speaks the real
worker messages over a real CURVE connection to one control replica, and spawns nothing.

It registers (Register -> Welcome), then keeps `slots` runs in flight: Pull with one (offer id,
lease token) pair per free slot -> Offers; per offer Activate (the SHA-256 of a fresh callback
token) -> Activated; Started (this process's own identity, as a launcher's would be read) ->
Ack; its whole log in one LogChunk -> LogAck; Completed with the real callback token and the
final log offset -> Ack. Every `heartbeat_ms` a numbered Heartbeat renews every lease it holds.
An empty Offers waits for a Nudge (or re-pulls after a second). It stops when told to, or when
the shared count of completed runs reaches the target.

With `hold`, a started job is never finished: once every slot holds a started job the client
says so (`("holding", name)` on `results`) and from then on only heartbeats, renewing them all
(`bench_renewals.py`).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from dataclasses import dataclass, field

LOG = b"ok\n"  # the no-op job's whole log: one chunk
REPULL_S = 1.0


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Held:
    offer: object
    lease_token: str
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))


@dataclass
class Tally:
    completed: int = 0
    fenced: int = 0
    refused: int = 0
    heartbeats: int = 0
    renewals: int = 0
    running: int = 0  # started and held (hold mode)
    pulls: int = 0
    empty_pulls: int = 0
    first_pull_at: float = 0.0
    last_completed_at: float = 0.0
    errors: list = field(default_factory=list)


def run_client(name: str, endpoint: str, key_dir: str, slots: int, heartbeat_ms: int,
               go, stop, done_counter, target: int, results, hold: bool = False) -> None:
    """The client process's body (multiprocessing target); puts its Tally (as a dict) on `results`."""
    import zmq
    import zmq.auth

    from qlactors.ids import new_id
    from qlactors.wire import codec
    from qlactors.wire import messages as m

    tally = Tally()
    public, secret = zmq.auth.load_certificate(os.path.join(key_dir, f"{name}.key_secret"))
    server_public, _ = zmq.auth.load_certificate(os.path.join(key_dir, "control.key"))
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.curve_publickey, sock.curve_secretkey, sock.curve_serverkey = public, secret, server_public
    sock.linger = 0
    sock.connect(endpoint)
    send = lambda msg: sock.send_multipart(codec.encode(msg))  # noqa: E731
    with open("/proc/sys/kernel/random/boot_id") as fh:
        boot_id = fh.read().strip()
    with open("/proc/self/stat") as fh:
        start_ticks = int(fh.read().rpartition(")")[2].split()[19])
    identity = dict(boot_id=boot_id, pid=os.getpid(), pgid=os.getpgid(0), start_ticks=start_ticks)
    try:
        welcome = None
        send(m.Register(request_id=new_id(), register_id=new_id(), worker_id=name, capacity=slots, boot_id=boot_id, labels=[],
                        protocol_min=codec.PROTOCOL_MIN, protocol_max=codec.PROTOCOL_MAX,
                        worker_clock_ms=_wall_ms(), resume_session_id=None, resume_generation=None,
                        resume_secret=None))
        deadline = time.monotonic() + 30
        while welcome is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: no Welcome within 30 s")
            if sock.poll(200):
                msg = codec.decode(sock.recv_multipart())
                if isinstance(msg, m.Welcome):
                    welcome = msg
        session = dict(worker_id=welcome.worker_id, session_id=welcome.session_id,
                       session_generation=welcome.session_generation)
        results.put(("registered", name))
        go.wait(120)
        live: dict[str, Held] = {}  # attempt id -> what we hold
        pending_pull: dict[str, str] | None = None  # offer id -> lease token
        pulled_at = 0.0
        seq = 0
        next_heartbeat = time.monotonic() + heartbeat_ms / 1000

        def fence(h: Held) -> dict:
            o = h.offer
            return dict(session, run_id=o.run_id, attempt_id=o.attempt_id, offer_id=o.offer_id,
                        lease_generation=o.lease_generation, lease_token=h.lease_token,
                        lease_version=o.lease_version)

        def pull() -> None:
            nonlocal pending_pull, pulled_at
            free = slots - len(live)
            if pending_pull is not None or free <= 0 or done_counter.value >= target:
                return
            pending_pull = {new_id(): secrets.token_urlsafe(32) for _ in range(free)}
            pulled_at = time.monotonic()
            tally.pulls += 1
            if not tally.first_pull_at:
                tally.first_pull_at = time.time()
            send(m.Pull(request_id=new_id(), **session, pull_id=new_id(),
                        offers=[m.OfferSlot(offer_id=o, lease_token=t) for o, t in pending_pull.items()]))

        pull()
        while not stop.is_set() and done_counter.value < target:
            now = time.monotonic()
            if now >= next_heartbeat:
                seq = max(seq + 1, _wall_ms())
                renewals = [m.LeaseRef(run_id=h.offer.run_id, attempt_id=a, offer_id=h.offer.offer_id,
                                       lease_generation=h.offer.lease_generation, lease_token=h.lease_token)
                            for a, h in live.items()]
                send(m.Heartbeat(request_id=new_id(), **session, seq=seq, free_slots=slots - len(live), worker_clock_ms=_wall_ms(),
                                 renewals=renewals))
                tally.heartbeats += 1
                tally.renewals += len(renewals)
                next_heartbeat = now + heartbeat_ms / 1000
            if pending_pull is None and len(live) < slots and now - pulled_at > REPULL_S:
                pull()
            if not sock.poll(50):
                continue
            msg = codec.decode(sock.recv_multipart())
            if isinstance(msg, m.Offers):
                pairs, pending_pull = pending_pull or {}, None
                if not msg.offers:
                    tally.empty_pulls += 1
                for offer in msg.offers:
                    h = live[offer.attempt_id] = Held(offer, pairs[offer.offer_id])
                    send(m.Activate(request_id=new_id(), **fence(h), callback_token_hash=_sha256(h.token.encode()),
                                    log_artifact_id=f"{offer.run_id}/{offer.attempt_id}.log"))
                if len(msg.offers) == len(pairs):
                    pull()
            elif isinstance(msg, m.Activated):
                h = live.get(msg.attempt_id)
                if h is not None:
                    send(m.Started(request_id=new_id(), **fence(h), **identity))
            elif isinstance(msg, m.Ack):
                h = live.get(msg.attempt_id)
                if msg.result in ("fenced", "refused"):
                    tally.fenced += msg.result == "fenced"
                    tally.refused += msg.result == "refused"
                    if len(tally.errors) < 5:
                        tally.errors.append(f"{msg.of} {msg.result}: {msg.detail}")
                    if h is not None and msg.of in ("activate", "started", "completed"):
                        live.pop(msg.attempt_id, None)
                        pull()
                elif msg.of == "started" and h is not None and hold:
                    tally.running += 1
                    if tally.running == slots:
                        results.put(("holding", name))
                elif msg.of == "started" and h is not None:
                    send(m.LogChunk(request_id=new_id(), worker_id=session["worker_id"], run_id=h.offer.run_id,
                                    attempt_id=h.offer.attempt_id, callback_token_hash=_sha256(h.token.encode()),
                                    offset=0, data=LOG, checksum=_sha256(LOG)))
                elif msg.of == "completed" and h is not None:
                    live.pop(msg.attempt_id)
                    tally.completed += 1
                    tally.last_completed_at = time.time()
                    with done_counter.get_lock():
                        done_counter.value += 1
                    pull()
            elif isinstance(msg, m.LogAck):
                h = live.get(msg.attempt_id)
                if h is None:
                    continue
                if msg.result != "applied":
                    tally.refused += 1
                    if len(tally.errors) < 5:
                        tally.errors.append(f"log_chunk {msg.result}: {msg.detail}")
                t = _wall_ms()
                send(m.Completed(request_id=new_id(), **session, run_id=h.offer.run_id, attempt_id=h.offer.attempt_id,
                                 schema_version=2, callback_sequence=1, token=h.token, started_at_ms=t,
                                 finished_at_ms=t, exit_code=0, log_dropped_bytes=0, output_open=0,
                                 stopped_by="exit", final_log_offset=len(LOG)))
            elif isinstance(msg, m.Nudge):
                pull()
            # HeartbeatAck: the renewals are counted on the control side; nothing to do here
    except Exception as err:  # reported with the tally: the benchmark prints it
        tally.errors.append(f"{type(err).__name__}: {err}")
    finally:
        sock.close(0)
        ctx.term()
        results.put(("tally", name, tally.__dict__))


def collect_tallies(results, tallies: dict, clients: int, timeout_s: float = 15.0) -> dict:
    """Each client's Tally (as a dict) from `results` into `tallies`, until all `clients` have
    reported or none did for `timeout_s`; other items are skipped."""
    import queue

    while len(tallies) < clients:
        try:
            item = results.get(timeout=timeout_s)
        except queue.Empty:
            break
        if item[0] == "tally":
            tallies[item[1]] = item[2]
    return tallies


def stop_processes(procs: list) -> None:
    """Join each client process, killing (by pid: our own child) one that does not end."""
    for proc in procs:
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
