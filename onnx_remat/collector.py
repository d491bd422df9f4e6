"""The cyclic garbage collector, paused while a command works on a graph.

A command builds a few large structures that live as long as it does and hold no reference cycles
but graphsurgeon's (the imported graph, emulations, tensor sizes, memory plans: millions of
objects at 10^5 nodes). CPython's cyclic collector makes a full pass each time the objects that
survived its younger passes grow by a quarter, and each full pass walks every one of them: on a
10^5-node ``apply``, 7 full passes cost 6.1 s of 34 s in the command's own process (and its forked
children, which inherit the heap, pay again and copy the pages the passes write to). They free
almost nothing reference counting would not: the graphs' node <-> tensor cycles are cut where a
graph is let go (:meth:`~onnx_remat.graph.bridge.ModelGraph.release`) or stay alive to the end.

:func:`paused` (a context manager) and :func:`pauses` (a decorator, on the public entry points:
``onnx_remat.apply``, ``schedule``, ``plan``, ``analyze_model``, :func:`~onnx_remat.estimate.estimate`)
turn the collector off for the call and back on after it, if it was on; nested calls leave it as
the outermost found it. The command line turns it off for its whole process (``cli/entry.py``).
Measured in one process with the collector paused (another job on the machine, so compare the
pairs, not the seconds): ``onnx_remat.apply`` at 10^5 nodes 26.0 s instead of 35.2 s, peak RSS
1,687 MiB instead of 1,686; at 20,813 nodes 6.9 s instead of 9.2 s (425 MiB instead of 413), with
``budget="50%"`` 23.7 s instead of 31.1 s (595 MiB instead of 593).
The cycles left when a call returns (its analysed graph, about 370,000 objects at 20,813 nodes)
are collected by the first pass after it.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Turn the cyclic collector off for the block; on again after it, where it was on."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def pauses(func: Callable[P, R]) -> Callable[P, R]:
    """``func``, run with the cyclic collector :func:`paused`."""

    @functools.wraps(func)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with paused():
            return func(*args, **kwargs)

    return run
