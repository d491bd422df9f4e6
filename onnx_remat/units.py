"""Human-readable sizes and ratios, and parsing of sizes and percentages given on the command line."""

from __future__ import annotations

import re

from onnx_remat.errors import UsageError

_UNITS = {
    "": 1,
    "B": 1,
    "K": 2**10,
    "KB": 10**3,
    "KIB": 2**10,
    "M": 2**20,
    "MB": 10**6,
    "MIB": 2**20,
    "G": 2**30,
    "GB": 10**9,
    "GIB": 2**30,
}


def format_bytes(n: int | float | None) -> str:
    """``225443840`` -> ``'215.0 MiB'``; None -> ``'?'``. Binary units, one decimal."""
    if n is None:
        return "?"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_bytes_apart(a: int, b: int) -> tuple[str, str]:
    """``a`` and ``b`` as :func:`format_bytes` writes them, with the exact byte counts added where
    two different sizes would read the same (``'2.0 MiB (2,062,745 bytes)'``): a message that
    says one is below the other must not print two equal figures."""
    first, second = format_bytes(a), format_bytes(b)
    if first == second and a != b:
        return f"{first} ({a:,} bytes)", f"{second} ({b:,} bytes)"
    return first, second


def plural(n: int, word: str, many: str | None = None) -> str:
    """``plural(1, 'tensor')`` -> ``'1 tensor'``, ``plural(3, 'tensor')`` -> ``'3 tensors'``."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def format_ratio(after: float | None, before: float | None) -> str:
    """``after/before`` as ``'x0.33'``; ``'?'`` when either is unknown or before is zero."""
    if after is None or not before:
        return "?"
    return f"x{after / before:.2f}"


def parse_size(text: str) -> int:
    """``'16M'``, ``'1.5GiB'``, ``'4096'`` -> bytes. Raises :class:`UsageError` on anything else."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise UsageError(f"not a size: {text!r} (examples: 4096, 16M, 1.5GiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def parse_percent(text: str) -> float:
    """``'2%'`` or ``'0.02'`` -> 0.02. Raises :class:`UsageError` on anything else."""
    t = text.strip()
    try:
        return float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise UsageError(f"not a percentage: {text!r} (examples: 2%, 0.02)") from None


# A dimension is an int64 in ONNX; far below that, a tensor of it would not fit any machine.
MAX_DIM = 2**40


def parse_dims(items: tuple[str, ...] | list[str]) -> dict[str, int]:
    """``('batch=8', 'seq=128')`` -> ``{'batch': 8, 'seq': 128}`` (the ``--dim`` option).

    Values are positive integers written in ASCII digits (``'²'`` is a digit to Python's
    ``isdigit`` and not to ``int``), at most :data:`MAX_DIM`; a name given twice with two values
    is refused. Raises :class:`UsageError` (exit status 2) naming the item.
    """
    dims: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not re.fullmatch(r"[0-9]+", value):
            raise UsageError(f"--dim takes name=value with a positive integer value, got {item!r}")
        n = int(value)
        if n < 1:
            raise UsageError(f"--dim {name}={value}: a dimension must be at least 1")
        if n > MAX_DIM:
            raise UsageError(f"--dim {name}={value}: larger than any tensor could be (at most {MAX_DIM})")
        if name in dims and dims[name] != n:
            raise UsageError(f"--dim {name} given twice, as {dims[name]} and {n}")
        dims[name] = n
    return dims


_INT64 = 2**63


def parse_int_range(item: str) -> tuple[str, tuple[int, int]]:
    """``'input_ids=0:512'`` -> ``('input_ids', (0, 512))``; ``'labels=10'`` -> ``('labels', (0, 10))``.

    High is excluded, so low < high; both fit int64. Raises :class:`UsageError` otherwise.
    """
    name, sep, value = item.partition("=")
    low, colon, high = value.partition(":")
    number = r"\s*-?[0-9]+\s*"
    usage = f"--int-range takes name=low:high (high excluded) or name=high, got {item!r}"
    if not sep or not name.strip():
        raise UsageError(usage)
    if colon:
        if not (re.fullmatch(number, low) and re.fullmatch(number, high)):
            raise UsageError(usage)
        rng = (int(low), int(high))
    else:
        if not re.fullmatch(number, low):
            raise UsageError(usage)
        rng = (0, int(low))
    if not all(-_INT64 <= x < _INT64 for x in rng):
        raise UsageError(f"--int-range {item}: the values must fit in 64 bits")
    if rng[0] >= rng[1]:
        raise UsageError(f"--int-range {item}: low must be below high (high is excluded)")
    return name.strip(), rng
