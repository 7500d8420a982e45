"""Several processes on one job (``torchrun`` / ``accelerate launch``): one results folder.

    torchrun --nproc_per_node N -m attnprune finetune ...
    accelerate launch --multi_gpu --num_processes N -m attnprune finetune ...   (also on CPU)

Training is data-parallel through ``accelerate`` (:mod:`attnprune.train`: the prepared loader
gives each process its own batches, DDP averages the gradients). Everything around it must
then happen once, not N times, and agree across processes:

* the results folder: process 0 makes it (its timestamped name) and sends the path to the
  others (:func:`start_results`); only process 0 writes into it (:class:`SharedResults`), and
  the questions asked of the folder ("is this run finished?") are answered by process 0, so
  every process takes the same branches even when the others cannot see its files (several
  machines without a shared disk);
* evaluation: each process scores every N-th batch (:func:`shard_batches`, accelerate's
  ``BatchSamplerShard`` with ``even_batches=False``: no batch is repeated to even out the
  last round, so no row is scored, or FLOPs-counted, twice) and :func:`gather` collects the
  pieces; the batches are those of one process, padding included, so FLOPs sums equal a
  one-process run's;
* anything else done once (the summary, wall-time measurements): process 0 alone
  (:func:`on_main`, :func:`is_main`), with the others waiting for its answer.

In one process (no launcher) every function here is a no-op that never touches
``torch.distributed`` or ``accelerate``. The process group is accelerate's ``PartialState``
(gloo on CPU, NCCL on GPUs), the one :func:`attnprune.train.fit`'s ``Accelerator`` then reuses.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from attnprune.runs.results import ResultsDir

__all__ = ["SharedResults", "barrier", "broadcast", "finish", "gather", "is_main", "launched",
           "on_main", "rank", "shard_batches", "start_results", "world_size"]

T = TypeVar("T")

# the environment variables accelerate reads for the number of processes (torchrun and
# accelerate launch set WORLD_SIZE; the others are MPI launchers')
_WORLD_ENV = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")


_ALONE = False  # True while process 0 runs an ``on_main`` function: the others are not listening


def launched() -> bool:
    """True when a launcher started this process as one of several (and the others take part:
    inside an :func:`on_main` function, process 0 runs alone, so every collective of this module
    is local there — a nested ``on_main`` or a :class:`SharedResults` query must not send
    anything the waiting processes would take for the outer call's result)."""
    if _ALONE:
        return False
    for name in _WORLD_ENV:
        v = os.environ.get(name)
        if v:
            return int(v) > 1
    return False


def _state():
    """accelerate's process state, created (and the process group with it) on first use.

    ``cpu`` must be what ``train.fit`` passes to its ``Accelerator``: the state is shared, and
    accelerate refuses a second, different request."""
    import torch
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())


def world_size() -> int:
    return _state().num_processes if launched() else 1


def rank() -> int:
    return _state().process_index if launched() else 0


def is_main() -> bool:
    """Process 0 (or the only process): the one that writes, prints and times."""
    return rank() == 0


def barrier() -> None:
    if launched():
        _state().wait_for_everyone()


def finish() -> None:
    """End a launched run's process group once every process got here: a process that left
    with the group alive could abort at interpreter exit ("terminate called without an active
    exception", SIGABRT) while another still wrote its results."""
    if not launched():
        return
    import torch.distributed as dist

    barrier()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def broadcast(obj: T) -> T:
    """Process 0's ``obj`` on every process (any picklable object)."""
    if not launched():
        return obj
    from accelerate.utils import broadcast_object_list

    _state()
    return broadcast_object_list([obj], from_process=0)[0]


def gather(obj: Any) -> list:
    """``[obj of process 0, obj of process 1, ...]`` on every process."""
    if not launched():
        return [obj]
    from accelerate.utils import gather_object

    _state()
    return gather_object([obj])


class _Failed:
    """Process 0's exception, sent to the others so that they fail too instead of waiting
    (as itself when it pickles, e.g. a ConfigError the command line reports, else described
    in a RuntimeError)."""

    def __init__(self, error: BaseException) -> None:
        import pickle

        try:
            pickle.loads(pickle.dumps(error))
            self.error = error
        except Exception:  # noqa: BLE001 (any pickling failure: send a description instead)
            self.error = RuntimeError(f"process 0 failed: {type(error).__name__}: {error}")


def on_main(fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(*args, **kwargs)`` run by process 0 alone; its result (or its exception, raised
    again) reaches every process. The others wait meanwhile, so nothing they do competes with
    process 0 for the machine (its timings stay clean)."""
    if not launched():
        return fn(*args, **kwargs)
    out: Any = None
    error = None
    global _ALONE
    if is_main():
        _ALONE = True
        try:
            out = fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 (sent to the others, then raised here again)
            error, out = e, _Failed(e)
        finally:
            _ALONE = False
    out = broadcast(out)
    if error is not None:
        raise error
    if isinstance(out, _Failed):
        raise out.error
    return out


# ----------------------------------------------------------------------------- results
class SharedResults(ResultsDir):
    """A results folder seen by every process and written by process 0 alone.

    The writers of :class:`ResultsDir` do nothing on the other processes (``writer`` is
    False); :meth:`run_done`, :meth:`exists` and the readers return process 0's answer on
    every process. Each of those is a collective call: every process must make it, in the
    same order (the commands' loops do, since they take the same branches everywhere)."""

    def __init__(self, path) -> None:
        super().__init__(path, writer=is_main())

    def run_done(self, key: str) -> bool:
        return on_main(super().run_done, key)

    def exists(self, name: str) -> bool:
        return on_main(super().exists, name)

    def read_json(self, name: str) -> Any:
        return on_main(super().read_json, name)

    def load_run(self, key: str) -> dict:
        return on_main(super().load_run, key)


def start_results(out, command: str, exact: bool, config: Any) -> ResultsDir:
    """:meth:`ResultsDir.start` for one process or several: process 0 makes the folder (and
    picks its timestamped name) and writes ``config.yaml``; every process gets that folder."""
    if not launched():
        return ResultsDir.start(out, command, exact, config)
    path = on_main(lambda: str(ResultsDir.start(out, command, exact, config).path))
    return SharedResults(path)


# ----------------------------------------------------------------------------- evaluation
def shard_batches(loader) -> Iterator[tuple[list[int], Any]]:
    """This process's batches of a map-style ``DataLoader``: ``(positions, batch)`` pairs,
    ``positions`` the dataset indices of the batch's rows (to put gathered pieces back in
    order). In one process: every batch. With N processes, process r gets batches r, r + N,
    … of the loader's own batching (same rows, same padding as in one process), the last
    round short rather than padded with repeated rows (accelerate's ``BatchSamplerShard``,
    ``even_batches=False``)."""
    from torch.utils.data import DataLoader

    if loader.batch_sampler is None:
        raise ValueError("loader: needs batches of dataset indices (a map-style DataLoader "
                         "with batch_size), not an iterable dataset")
    if launched():
        from accelerate.data_loader import BatchSamplerShard

        sampler = BatchSamplerShard(loader.batch_sampler, num_processes=world_size(),
                                    process_index=rank(), split_batches=False, even_batches=False)
    else:
        sampler = loader.batch_sampler
    index_batches = [list(b) for b in sampler]  # drawn once: a shuffled sampler draws anew
    mine = DataLoader(loader.dataset, batch_sampler=index_batches, collate_fn=loader.collate_fn,
                      num_workers=loader.num_workers, pin_memory=loader.pin_memory)
    yield from zip(index_batches, mine)
