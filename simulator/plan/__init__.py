"""Capacity planning: the decode plan, the time-to-first-token plan and its search, the overlap finder, their command
lines."""
