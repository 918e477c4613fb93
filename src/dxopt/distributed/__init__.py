"""Scale-out executors for :func:`dxopt.qp.solve` and :class:`dxopt.qp.QPLayer`.

``dqp.solve(..., executor=RayExecutor(num_workers=8))`` spreads a QP batch over long-lived Ray
actors in chunks; each actor keeps the graphs (and with them the backward's data) of the chunks
it solved, so the backward goes back to the actor that owns each chunk. Results, per-sample
status and gradients are those of the local call. Ray is an optional extra
(``pip install 'dxopt[distributed]'``) imported only when an executor starts.

Owns the Ray executor, its chunking, stitching and worker side. May import ``dxopt.qp`` (the
executor protocol :class:`QPExecutor` and the call's data it receives, :class:`QPData`, are
defined there, in :mod:`dxopt.qp.problem.executor`, and re-exported here) and the top-level
``dxopt`` (``_worker.describe``); ``dxopt.qp`` never imports it.
"""

from dxopt.distributed._errors import DistributedError as DistributedError
from dxopt.distributed._errors import DistributedTypeError as DistributedTypeError
from dxopt.distributed._errors import DistributedValueError as DistributedValueError
from dxopt.distributed._ray import ExecutorStats as ExecutorStats
from dxopt.distributed._ray import RayExecutor as RayExecutor
from dxopt.qp.problem.executor import QPData as QPData
from dxopt.qp.problem.executor import QPExecutor as QPExecutor

__all__ = [
    "DistributedError",
    "DistributedTypeError",
    "DistributedValueError",
    "ExecutorStats",
    "QPData",
    "QPExecutor",
    "RayExecutor",
]
