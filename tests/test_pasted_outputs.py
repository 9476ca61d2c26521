"""The outputs pasted in README.md and docs/*.md are what the commands print today (tests/pasted.py): the cheap
commands here, in the suite (tables read from the committed results, runs without a report, topology commands,
refusals); ``python tests/pasted.py`` checks every one, plans and validations included."""

from __future__ import annotations

import pytest
from pasted import Pasted, difference, markdown_files, pasted, run, scratch

SLOW = ("treering plan", "treering validate", "--numeric", "treering calibrate")  # seconds to a minute each


def _cheap(block: Pasted) -> bool:
    command = block.command
    if any(line.startswith("treering: error") for line in block.expected):  # a refusal: at once
        return True
    if any(s in command for s in SLOW):
        return False
    return command.startswith(("python -c", "treering topo", "sed ")) or (
        command.startswith("treering run") and "--no-report" in command)


BLOCKS = [block for path in markdown_files() for block in pasted(path) if _cheap(block)]


def test_the_docs_paste_outputs_the_suite_checks():
    assert len(BLOCKS) >= 12  # README's runs, the cp-strategies table, the topology commands, the refusals


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_a_pasted_output_is_what_the_command_prints(block, tmp_path):
    diff = difference(block.expected, run(block, scratch(tmp_path)))
    assert diff is None, f"{block}: `{block.command}` prints otherwise now (rerun it and paste):\n{diff}"


def test_a_changed_figure_is_caught():
    """The comparison itself: a digit changed, a line missing or out of order is a difference; an elision is not."""
    printed = ["header", "a 1.0", "b 2.0", "c 3.0", "wrote x"]
    assert difference(("header", "a 1.0", "...", "c 3.0"), printed) is None
    assert difference(("header", "a 1.1"), printed) is not None
    assert difference(("header", "b 2.0"), printed) is not None  # not contiguous without an elision
    assert difference(("c 3.0", "...", "a 1.0"), printed) is not None  # out of order
