"""A worker process for the identity tests: Hello with the token from its environment, then
one JobsDone per job of every Jobs frame, until Shutdown. Run as a script:
``python id_worker.py ENDPOINT WORKER_ID [KEY_DIR KEY_NAME]``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pivotflow.protocol import PROTOCOL_VERSION, Hello, JobDone, Jobs, JobsDone, Shutdown, Welcome
from pivotflow.transport.admission import TOKEN_ENV
from pivotflow.transport.curve import load_worker_keys
from pivotflow.transport.zmq_transport import ZmqWorkerChannel


def main() -> int:
    endpoint, worker_id = sys.argv[1], sys.argv[2]
    curve = load_worker_keys(Path(sys.argv[3]), sys.argv[4]) if len(sys.argv) > 4 else None
    with ZmqWorkerChannel(endpoint, worker_id, curve=curve) as ch:
        ch.send(Hello(protocol_version=PROTOCOL_VERSION, worker_id=worker_id, pid=os.getpid(),
                      token=os.environ.pop(TOKEN_ENV, "")))
        if not isinstance(ch.recv(30.0), Welcome):
            return 2
        while True:
            msg = ch.recv(30.0)
            if msg is None or isinstance(msg, Shutdown):
                return 0
            if isinstance(msg, Jobs):
                ch.send(JobsDone(results=[
                    JobDone(job_id=j.job_id, token_ids=[1], logprobs=[0.0], versions=[0],
                            finish_reason="stop") for j in msg.jobs]))


if __name__ == "__main__":
    sys.exit(main())
