"""Worker sessions driven through the store's Dispatch as a worker would (register, heartbeat, launch,
attest, complete) and leases expired by direct SQL; shared by the store, CLI and recovery tests."""

from __future__ import annotations

import secrets
from typing import NamedTuple

from sqlalchemy import select, update

from qlactors.domain.receipt import Receipt, token_hash
from qlactors.store.dispatch.completion import CompletionService
from qlactors.store.records import Fence, Identity, LeaseQuote, OfferView, Session
from qlactors.store.schema import run_dispatch_leases, worker_sessions

from store_helpers import new_hash, spec


LEASE_MS = 60_000


BOOT = "boot-1"


IDENTITY = Identity(BOOT, 4242, 4242, 77)


class Flight(NamedTuple):
    offer: OfferView
    fence: Fence
    quote: LeaseQuote
    token: str


def register(dispatch, worker_id, secret_hash=None, boot_id=BOOT, capacity=4) -> Session:
    return dispatch.sessions.register(worker_id, capacity, boot_id=boot_id, labels=("gpu", "eu", "gpu"),
                                     session_lease_ms=LEASE_MS, resume_secret_hash=secret_hash or new_hash())


def launch(repo, dispatch, session, *, activated=True, started=True, **spec_kw) -> Flight:
    """Admit a run of a fresh task (`spec_kw` for its spec) and offer it to `session` (activated
    and started by default)."""
    name = f"t{secrets.token_hex(4)}"
    repo.tasks.add(spec(name, **spec_kw), actor_name="tester")
    run_id = repo.runs.request(name).run.id
    lease_hash = new_hash()
    offer = dispatch.offers.one(session.worker_id, session.session_id, session.generation,
                           secrets.token_hex(8), lease_hash, log_cap_bytes=0, lease_ttl_ms=30_000)
    assert offer.run_id == run_id
    fence = offer.fence(lease_hash)
    token = secrets.token_urlsafe(32)
    if activated:
        assert dispatch.reports.activate(fence, token_hash(token), "log").result == "applied"
    if started:
        assert dispatch.reports.started(fence, IDENTITY.boot_id, IDENTITY.pid, IDENTITY.pgid,
                                IDENTITY.start_ticks).result == "applied"
    quote = LeaseQuote(run_id, offer.attempt_id, offer.offer_id, offer.lease_generation, lease_hash)
    return Flight(offer, fence, quote, token)


def beat(dispatch, session, seq, *quotes, free_slots=2, clock=None, run_lease_ms=30_000):
    return dispatch.heartbeats.apply(session.worker_id, session.session_id, session.generation, seq,
                              free_slots=free_slots, worker_clock_ms=clock or 1_000, renewals=quotes,
                              session_lease_ms=LEASE_MS, run_lease_ms=run_lease_ms)


def session_row(repo, session_id):
    with repo.store.read() as conn:
        return conn.execute(select(worker_sessions).where(worker_sessions.c.session_id == session_id)).one()


def expire_lease(repo, attempt_id):
    with repo.store.write() as conn:
        conn.execute(update(run_dispatch_leases).where(run_dispatch_leases.c.attempt_id == attempt_id)
                     .values(expires_at_ms=1))


def expire_session(repo, session_id):
    with repo.store.write() as conn:
        conn.execute(update(worker_sessions).where(worker_sessions.c.session_id == session_id)
                     .values(lease_expires_at_ms=1))


def complete(repo, flight):
    receipt = Receipt(schema_version=1, run_id=flight.quote.run_id, attempt_id=flight.quote.attempt_id,
                      callback_sequence=1, token=flight.token, started_at_ms=1, finished_at_ms=2,
                      exit_code=0, output_open=0)
    assert CompletionService(repo.store).complete(flight.quote.run_id, flight.quote.attempt_id,
                                                  receipt).result == "applied"


def attest(dispatch, session, flight, quoted_session, fact="running", **kw):
    if fact == "running":
        kw.setdefault("new_lease_token_hash", new_hash())
        kw.setdefault("new_offer_id", secrets.token_hex(8))
        kw.setdefault("identity", IDENTITY)
    return dispatch.attestations.apply(session.worker_id, session.session_id, session.generation, flight.quote,
                           quoted_session.session_id, quoted_session.generation, fact,
                           run_lease_ms=30_000, **kw)
