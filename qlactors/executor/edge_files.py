"""Executor side: what edge's retention must respect and delete first (the store's LocalFiles
port, store/cadence/retention.py): the journal's rows, the receipt files, the log files of this process."""

from __future__ import annotations

import os
from typing import Sequence

from ..process.logs import LogStore
from ..process.receipts import ReceiptStore
from .journal.journal import Journal


class EdgeFiles:
    """Edge's journal and files, for the Scheduler's retention (store/cadence/retention.LocalFiles)."""

    def __init__(self, journal: Journal, logs: LogStore, receipts: ReceiptStore) -> None:
        self.journal, self.logs, self.receipts = journal, logs, receipts

    def journalled(self, attempt_ids: Sequence[str]) -> set[str]:
        return self.journal.held(attempt_ids)

    def receipt_present(self, attempt_id: str) -> bool:
        # lexists: a symlink planted at the receipt's path still means "someone must look first".
        return os.path.lexists(self.receipts.final_path(attempt_id))

    def remove_log(self, run_id: str, attempt_id: str) -> bool:
        return self.logs.remove(run_id, attempt_id)
