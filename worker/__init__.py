"""The postbox worker: consume streams, claim in PostgreSQL, run handlers, record outcomes.

``python -m postbox.worker run`` / ``postbox worker run``; in-process: ``await Worker(settings).run()``.
"""

from postbox.worker.signals import WorkerSignals
from postbox.worker.worker import Worker, new_worker_id

__all__ = ["Worker", "WorkerSignals", "new_worker_id"]

if __name__ != "postbox.worker":  # this folder imported under its own name, not as the installed package
    raise ImportError("import postbox.worker, not worker: the folder worker/ is installed as postbox.worker")
