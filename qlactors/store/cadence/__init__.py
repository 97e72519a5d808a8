"""Store, cadence: what the control cycle decides from the database: timeouts and stops,
recovery (edge and cluster), lost-run retry, cron admission, retention and the status
reads, gathered by the Control record. May import store.intent and store.dispatch."""
