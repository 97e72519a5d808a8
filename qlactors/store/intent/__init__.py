"""Store, intent: what users ask for, kept as rows: tasks and their revisions, cron triggers,
runs admitted, retried, cancelled and listed. Imports no other store sub-package."""
