"""The compiled core: which parts the install built, and the switch that turns it off.

The hottest loops of three stages are written in C as well as in Python, each over integer or float
arrays:

* the emulation's: onnxruntime's memory plan of one order (``plan_walk.c``, through
  :mod:`~onnx_remat.ortsim.plan_arrays`) and its DEFAULT execution order (``default_order.c``,
  through :mod:`~onnx_remat.ortsim.order`);
* the memory schedule's list schedulers (``list_schedule.c``, through
  :class:`~onnx_remat.scheduling.orders.ListScheduler`, on the memory plan's numbering of the graph);
* the budget solver's rotor tables (``rotor_table.c``, through :mod:`~onnx_remat.remat.solve`).

The Python code is the reference: the tests compare both on every graph they plan or order and on
every table of random problems. The C files are optional extensions of the package
(``pyproject.toml``): an install without a C compiler still works, with every loop in Python, and
``ONNX_REMAT_NATIVE=0`` turns the compiled ones off. Why C, and not more of it: each is a loop over
every edge of a graph (or every level of a table), run several times per command, whose Python time
was dictionary lookups or numpy's per-call cost; the rest of the emulation (the optimizer's
rewrites, shapes) works on names and protos, where a compiled pass would first have to copy the
graph into arrays.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def _built(name: str) -> ModuleType | None:
    """The compiled walk ``name`` of this package, None where the install did not build it."""
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ImportError:
        return None


# built by the install where a C compiler is found (setuptools' optional extensions)
plan_walk = _built("plan_walk")
default_order_walk = _built("default_order")
list_schedule_walk = _built("list_schedule")
rotor_table = _built("rotor_table")


def compiled(part: ModuleType | None) -> ModuleType | None:
    """``part`` (one of this module's compiled walks) where it is built and the compiled core is
    not turned off (``ONNX_REMAT_NATIVE=0``), else None."""
    if part is None or os.environ.get("ONNX_REMAT_NATIVE", "1") == "0":
        return None
    return part


def built() -> bool:
    """Whether the install built every compiled part."""
    return all(part is not None for part in (plan_walk, default_order_walk, list_schedule_walk, rotor_table))
