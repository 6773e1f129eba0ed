"""``python -m pivotflow.worker --endpoint E --id W``: one worker process (exec'd; the local
launcher's zygote forks most workers and calls ``main`` with their argv instead)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import traceback
from typing import NoReturn

from pivotflow.worker.main import end_process, run_worker


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pivotflow.worker")
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--id", required=True, dest="worker_id")
    ap.add_argument("--curve-keys", default="", help="CurveZMQ key dir (worker.key[_secret])")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"[{args.worker_id}] %(levelname)s %(name)s: %(message)s")
    # Ctrl-C belongs to the controller, which shuts workers down in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return run_worker(args.endpoint, args.worker_id, args.curve_keys)


def run_process(argv: list[str] | None = None) -> NoReturn:
    """The whole process from ``argv`` on, exec'd or forked by the zygote alike: an error that
    escapes the worker's own handling is printed to the log, and the process ends through
    ``end_process``."""
    try:
        code = main(argv)
    except Exception:  # (run_worker formats its own errors; this is for the rest)
        traceback.print_exc()
        code = 1
    end_process(code)


if __name__ == "__main__":
    run_process()
