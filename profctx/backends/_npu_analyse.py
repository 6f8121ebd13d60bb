"""Run torch_npu's analysis of one raw ``*_ascend_pt`` folder, as a program of its own.

``python -m profctx.backends._npu_analyse FOLDER [EXPORT_TYPE ...]``. The npu backend runs
it in a child process because torch_npu's ``analyse`` switches the whole process to the
``fork`` start method, forks a worker pool, and refuses to run inside a daemon process:
none of that may happen to the training process. Exit 0 when ``analyse`` returned (torch_npu
prints its own errors; the caller checks for the output), 2 on bad arguments, 3 when
torch_npu does not import.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Analyse the folder named in ``argv``; return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m profctx.backends._npu_analyse FOLDER [text|db ...]", file=sys.stderr)
        return 2
    folder, export = args[0], args[1:] or ["text"]
    try:
        from torch_npu.profiler.profiler import analyse
    except ImportError as exc:
        print(f"torch_npu does not import: {exc}", file=sys.stderr)
        return 3
    analyse(folder, export_type=export)
    return 0


if __name__ == "__main__":
    sys.exit(main())
