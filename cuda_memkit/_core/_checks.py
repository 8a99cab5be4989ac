"""Argument checks shared by the resource modules: the one home for them.

Each ``check_<what>(value, name)`` raises ``TypeError`` or ``ValueError`` naming
the argument, before anything is allocated or any driver call is made, and
returns the value in the form the caller works with (a plain ``int``, a shape
tuple, a dtype). Checks of one concept's values live with that concept under the
same scheme (``_location.check_exists``, ``_managed_ranges.check_location``,
``_device`` for ordinals); ``to_<what>`` converts between the accepted forms of
one value and raises only ``TypeError``.
"""

from __future__ import annotations

import enum
import math
import operator
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "ADDRESS_END",
    "INT64_MAX",
    "MAX_NBYTES",
    "MAX_U64",
    "check_bool",
    "check_dtype",
    "check_flags",
    "check_index",
    "check_int",
    "check_int64_array",
    "check_nbytes",
    "check_nonneg",
    "check_positive",
    "check_shape",
    "check_span",
    "check_u64",
    "integer_array",
    "one_of",
    "refuse_negative",
    "shape_nbytes",
]

#: Largest byte count a buffer may have (numpy's index type limit).
MAX_NBYTES = sys.maxsize
#: Largest int64 value: offsets and sizes in int64 arrays stay at or below it.
INT64_MAX = (1 << 63) - 1


def check_index(value: object, what: str) -> int:
    """Return ``value`` as an ``int`` (anything with ``__index__``, not a bool)."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not bool")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(value).__name__}") from None


#: Largest address, handle or size the driver takes (a 64-bit unsigned value).
MAX_U64 = (1 << 64) - 1
#: One past the last 64-bit address: a range of memory ends at most here (never wraps).
ADDRESS_END = MAX_U64 + 1


def check_int(value: object, what: str, expected: str = "an int") -> int:
    """``value`` if it is an ``int`` (a subclass too), never a bool; else ``TypeError``.

    Stricter than :func:`check_index`: objects with ``__index__`` that are not ints
    (numpy integers) are refused. ``expected`` completes the message
    "``what`` must be ``expected``".
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be {expected}, not {type(value).__name__}")
    return value


def check_u64(value: object, what: str) -> int:
    """An address, handle or byte count bound for the driver: an int in ``[0, 2**64)``.

    ``ValueError`` for a negative value or one past 64 bits: the bindings would
    raise ``OverflowError`` for those, and a value wrapped to 64 bits would
    name another allocation.
    """
    v = check_index(value, what)
    if v < 0:
        raise ValueError(f"{what} cannot be negative: {v}")
    if v > MAX_U64:
        raise ValueError(f"{what} {v:#x} does not fit in 64 bits")
    return v


def check_bool(value: object, what: str) -> bool:
    """``value`` if it is ``True`` or ``False``, else ``TypeError``.

    No truthiness: ``"False"``, ``1`` and ``None`` are refused.
    """
    if value is True or value is False:
        return value
    raise TypeError(f"{what} must be a bool (True or False), not {type(value).__name__}")


def check_positive(value: object, what: str) -> int:
    """:func:`check_index`, then ``ValueError`` unless the value is > 0."""
    v = check_index(value, what)
    if v <= 0:
        raise ValueError(f"{what} must be > 0, got {v}")
    return v


def check_nonneg(value: object, what: str) -> int:
    """:func:`check_index`, then ``ValueError`` unless the value is >= 0."""
    v = check_index(value, what)
    if v < 0:
        raise ValueError(f"{what} must be >= 0, got {v}")
    return v


def check_nbytes(nbytes: object, what: str = "nbytes") -> int:
    """A byte count: an int in ``[0, MAX_NBYTES]``."""
    n = check_nonneg(nbytes, what)
    if n > MAX_NBYTES:
        raise ValueError(f"{what}={n} is larger than any possible allocation")
    return n


def check_span(offset: object, nbytes: object, total: int, what: str = "buffer") -> tuple[int, int]:
    """Check a byte sub-range ``[offset, offset + nbytes)`` of ``total`` bytes.

    ``nbytes=None`` means "to the end". Returns ``(offset, nbytes)``.

    Raises
    ------
    TypeError
        For non-integer values.
    ValueError
        For negative values, a zero-size range or one that ends past ``total``.
    """
    off = check_index(offset, "offset")
    if off < 0:
        raise ValueError(f"offset must be >= 0, got {off}")
    n = total - off if nbytes is None else check_index(nbytes, "nbytes")
    if n < 0 and nbytes is not None:
        raise ValueError(f"nbytes must be >= 0, got {n}")
    if off > total:
        raise ValueError(f"offset {off} lies outside the {total}-byte {what}")
    if n == 0:
        raise ValueError(f"zero-size range at offset {off} of the {total}-byte {what}: "
                         "hints need at least one byte")
    if off + n > total:
        raise ValueError(f"range [{off}, {off + n}) lies outside the {total}-byte {what}")
    return off, n


def check_flags(flags: object, cls: type[enum.IntFlag], known: int) -> int:
    """Validate a flags argument of type ``cls`` (or a plain int) and return it as an int."""
    flags = check_int(flags, "flags", f"{cls.__name__} or int")
    if isinstance(flags, enum.Enum) and not isinstance(flags, cls):
        raise TypeError(f"flags must be {cls.__name__}, not {type(flags).__name__}")
    value = int(flags)
    if value < 0 or value & ~known:
        raise ValueError(
            f"unknown {cls.__name__} bits 0x{value & ~known if value >= 0 else value:x}; "
            f"valid flags: {', '.join(m.name or '' for m in cls)}"
        )
    return value


def check_shape(shape: object) -> tuple[int, ...]:
    """An array shape: an int or a sequence of non-negative ints."""
    if isinstance(shape, bool):
        raise TypeError("shape must be an int or a tuple of ints, not bool")
    try:
        dims: tuple[Any, ...] = (operator.index(shape),)  # type: ignore[arg-type]
    except TypeError:
        if not isinstance(shape, (tuple, list)):
            raise TypeError(
                f"shape must be an int or a tuple of ints, not {type(shape).__name__}"
            ) from None
        dims = tuple(shape)
    out = []
    for d in dims:
        if isinstance(d, bool):
            raise TypeError(f"shape entries must be ints, not bool: {shape!r}")
        try:
            n = operator.index(d)
        except TypeError:
            raise TypeError(
                f"shape entries must be ints, not {type(d).__name__}: {shape!r}"
            ) from None
        if n < 0:
            raise ValueError(f"negative dimension in shape {shape!r}")
        out.append(n)
    return tuple(out)


def check_dtype(dtype: npt.DTypeLike, where: str = "pinned memory") -> np.dtype[Any]:
    """A numpy dtype that can live in raw memory (no Python objects, a size)."""
    import numpy as np

    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"not a dtype: {dtype!r}") from exc
    if dt.hasobject:
        raise TypeError(f"dtype {dt} holds Python objects, which cannot live in {where}")
    if dt.itemsize == 0:
        raise TypeError(f"dtype {dt} has no size; give a sized dtype such as 'S8' or 'U4'")
    return dt


def check_int64_array(value: object, what: str, *, nonnegative: bool = False,
                copy: bool = False) -> np.ndarray[Any, Any]:
    """A 1-D int64 array from an integer array or sequence (no bools, no floats).

    An empty sequence is accepted (numpy reads ``[]`` as float64). With
    ``nonnegative``, a negative entry raises ``ValueError``; with ``copy``,
    the result never shares memory with ``value``, so later changes to the
    caller's array do not count.
    """
    import numpy as np

    if isinstance(value, (str, bytes)):
        raise TypeError(f"{what} must be an array of integers, not {type(value).__name__}")
    a = integer_array(value)
    kind = a.dtype.kind
    if kind == "O" and a.size:
        values = a.ravel().tolist()
        if all(type(v) is int for v in values) and not all(
                -INT64_MAX - 1 <= v <= INT64_MAX for v in values):
            raise ValueError(f"{what} holds integers past 64 bits")
    if kind not in "iu" and not (a.size == 0 and kind in "fO"):  # np.asarray([]) is float64
        raise TypeError(f"{what} must be an array of integers, not {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional, got shape {a.shape}")
    if kind not in "iu":
        return np.zeros(0, np.int64)
    if a.size and kind == "u" and a.dtype.itemsize == 8 and int(a.max()) > INT64_MAX:
        i = int(np.flatnonzero(a > INT64_MAX)[0])
        raise ValueError(f"{what}[{i}] is above 2**63 - 1")
    a = np.array(a, dtype=np.int64) if copy else a.astype(np.int64, copy=False)
    if nonnegative and a.size and int(a.min()) < 0:
        refuse_negative(a, what)
    return a


def integer_array(value: object) -> np.ndarray[Any, Any]:
    """``np.asarray(value)``, but Python ints numpy would turn into floats stay exact objects.

    numpy makes a list of ints that no one integer dtype holds (``[-1, 2**63]``)
    float64, and one holding an int past 64 bits an object array: both are then
    told from arrays of floats or objects by what they hold.
    """
    import numpy as np

    a = np.asarray(value)
    if a.dtype.kind == "f" and a.size and not isinstance(value, np.ndarray):
        exact = np.asarray(value, dtype=object)
        if all(type(v) is int for v in exact.ravel().tolist()):
            return exact
    return a


def refuse_negative(a: np.ndarray[Any, Any], what: str) -> None:
    """Raise ``ValueError`` naming the first negative entry of ``a`` (one is known to be)."""
    import numpy as np

    i = int(np.flatnonzero(a < 0)[0])
    raise ValueError(f"{what}[{i}] is negative ({int(a[i])})")


def shape_nbytes(shape: tuple[int, ...], dtype: np.dtype[Any]) -> int:
    """Bytes of an array of ``shape`` and ``dtype``; ``ValueError`` past :data:`MAX_NBYTES`."""
    n = math.prod(shape) * dtype.itemsize
    if n > MAX_NBYTES:
        raise ValueError(
            f"shape {shape} of {dtype} needs {n} bytes, more than the largest possible "
            f"buffer ({MAX_NBYTES} bytes)"
        )
    return n


def one_of(value: object, what: str, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of the strings ``choices``, else ``TypeError`` / ``ValueError``."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, one of {choices}, not {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"{what} must be one of {choices}, not {value!r}")
    return value
