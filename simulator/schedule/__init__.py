"""Schedules as plain data: ops, the schedule builder, its columns, compiled column passes, per-rank memory."""
