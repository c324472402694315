"""The postbox worker: consume streams, claim in PostgreSQL, run handlers, record outcomes.

``python -m worker run`` / ``postbox worker run``; in-process: ``await Worker(settings).run()``.
"""

from worker.signals import WorkerSignals
from worker.worker import Worker, new_worker_id

__all__ = ["Worker", "WorkerSignals", "new_worker_id"]
