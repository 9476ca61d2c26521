"""``python -m simulator.distributed {validate,calibrate} ...``: one rank of a real run.

Under ``torchrun`` (which sets RANK, WORLD_SIZE, MASTER_ADDR, ...) every process runs this; ``treering validate``
and ``treering calibrate`` start the local ranks themselves through :mod:`simulator.distributed.launch`.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

from simulator.distributed import calibrate, validate
from simulator.distributed.cli_args import parser
from simulator.distributed.launch import FAILED_AT


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        (validate.run_rank if args.verb == "validate" else calibrate.run_rank)(args)
        return 0
    except Exception as err:  # the traceback, then when it failed and the error in one line, for the launcher
        failed_at = time.time()
        traceback.print_exc(file=sys.stderr)
        print(f"{FAILED_AT} {failed_at:.6f}", file=sys.stderr)
        print(f"rank {os.environ.get('RANK', '?')}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
