"""Schedules executed on arrays (numpy or torch) with the merge core: decode and prefill."""
