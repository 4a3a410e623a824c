"""Run a list of work items on a few lanes: each lane takes the next unstarted item from one shared queue.

`crucible batch --gpus N` gives each GPU a lane, so a lane that drew short tasks takes more of them (dynamic
balancing) and the per-task fixed costs (the harness's start, the starting kernel's check, the final re-check) of
different tasks overlap. The results come back in the items' order whatever order they finished in.

With one lane the items run one after another on the calling thread: exactly the sequential loop, Ctrl-C included.
With more, the calling thread waits for the lanes; a KeyboardInterrupt there (a second Ctrl-C) sets `stop`, gives
the lanes `grace_s` to record their runs as interrupted, and is raised again.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Sequence, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")
WAIT_SLICE_S = 0.2  # the longest a Ctrl-C to the waiting thread can go unnoticed (see run_lanes)


def run_lanes(items: Sequence[T], lanes: int, work: Callable[[T, int], R], *,
              not_started: Callable[[T], R], failed: Callable[[T, Exception], R],
              stop: threading.Event | None = None, grace_s: float = 15.0) -> list[R]:
    """`work(item, lane)` for every item on `lanes` lanes (0 .. lanes-1), results in the items' order.

    Once `stop` is set no item starts: the rest come back as `not_started(item)`. An exception from `work` ends
    only its item: it is logged (its traceback at INFO) and comes back as `failed(item, exc)`; the lane goes on.
    """
    if lanes < 1:
        raise ValueError("run_lanes needs at least one lane")
    results: list[R | None] = [None] * len(items)
    done = [False] * len(items)
    queue = iter(range(len(items)))
    lock = threading.Lock()

    def lane(k: int) -> None:
        try:
            take(k)
        finally:
            ended[k].set()

    def take(k: int) -> None:
        while True:
            with lock:
                i = next(queue, None)
            if i is None:
                return
            item = items[i]
            if stop is not None and stop.is_set():
                results[i] = not_started(item)
            else:
                try:
                    results[i] = work(item, k)
                except Exception as exc:  # noqa: BLE001 - one item's fault must not end the others; it is reported
                    log.error("lane %d: %s failed: %s: %s", k, item, type(exc).__name__, exc)
                    log.info("the traceback of %s", item, exc_info=exc)  # crucible -v shows it
                    results[i] = failed(item, exc)
            done[i] = True

    n_lanes = 1 if lanes == 1 or len(items) <= 1 else min(lanes, len(items))
    ended = [threading.Event() for _ in range(n_lanes)]  # set as a lane returns
    if n_lanes == 1:
        lane(0)
    else:
        # The waiting is on each lane's own event, not Thread.join: on Python 3.11 a KeyboardInterrupt inside join
        # can mark a running thread as stopped (its tstate lock released by the interrupted waiter), so a later
        # join returned at once and the lanes lost their grace (tests/test_lanes.py failed about 1 run in 12).
        # And in slices of WAIT_SLICE_S, never one unbounded wait: a SIGINT that lands after the interpreter last
        # checked for signals but before the lock's sem_wait starts does not interrupt that wait (its C handler
        # has already run), so an unbounded wait would sleep through the Ctrl-C until the lanes ended.
        threads = [threading.Thread(target=lane, args=(k,), name=f"crucible-lane-{k}", daemon=True)
                   for k in range(n_lanes)]
        started: list[int] = []
        try:
            for k, t in enumerate(threads):
                started.append(k)  # before start(): an interrupt may land while start() waits for the thread
                t.start()
            for k in started:
                while not ended[k].wait(WAIT_SLICE_S):
                    pass  # back in the interpreter: a pending SIGINT raises here
        except BaseException:
            if stop is not None:
                stop.set()
            deadline = time.monotonic() + grace_s
            for k in started:
                if threads[k].ident is not None:  # interrupted before this one could start: nothing to wait for
                    ended[k].wait(max(0.0, deadline - time.monotonic()))
            raise
    missing = [items[i] for i, d in enumerate(done) if not d]
    if missing:  # a lane cannot end without finishing its item; this would be a bug here
        raise RuntimeError(f"run_lanes lost {len(missing)} item(s): {missing!r}")
    return results  # type: ignore[return-value]
