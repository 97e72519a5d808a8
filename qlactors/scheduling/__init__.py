"""Scheduling helpers that touch the host (the system time zone); the pure rules live in qlactors.domain.cron."""
