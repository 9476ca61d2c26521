"""Printing for the command line: a reader that goes away (``treering ... | head``) is not an error."""

from __future__ import annotations

import os
import sys

__all__ = ["say"]


def say(text: str = "") -> None:
    """Print to stdout; a reader that went away (``| head``) is not an error and the command goes on."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # later prints (and the exit's flush) go nowhere
        os.close(devnull)
