"""Shared by the workflow scripts: send stderr and logging to the rule's log file."""

from __future__ import annotations

import logging
import sys


def to_log(path: str) -> logging.Logger:
    handle = open(path, "w", buffering=1)  # line-buffered: readable while the job runs
    sys.stderr = handle
    logging.basicConfig(stream=handle, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s",
                        force=True)
    return logging.getLogger("ddtree.workflow")
