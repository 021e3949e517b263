"""Reduction ops and element types, and how the Python names map to the core's codes."""

from __future__ import annotations

import enum
from typing import Any

from . import _C


class ReduceOp(enum.Enum):
    """Reduction ops. ``AVG`` sums then divides once; on integers it truncates toward zero."""

    SUM = "sum"
    AVG = "avg"
    MAX = "max"
    MIN = "min"
    PROD = "prod"


# Codes come from the core (csrc/core/types.h): the index of each name in _C.OP_NAMES.
_FAST = {name: code for code, name in enumerate(_C.OP_NAMES)}
_OP_CODES = {op: _FAST[op.value] for op in ReduceOp}
_OP_ALIASES = {"sum": ReduceOp.SUM, "avg": ReduceOp.AVG, "mean": ReduceOp.AVG,
               "max": ReduceOp.MAX, "min": ReduceOp.MIN, "prod": ReduceOp.PROD,
               "product": ReduceOp.PROD}
_VALID_OPS = ", ".join(_C.OP_NAMES)


def _torch_op_name(op: Any) -> str | None:
    """The name of a torch.distributed.ReduceOp (or its RedOpType), else None."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is always present in practice
        return None
    red_op_type = getattr(dist.ReduceOp, "RedOpType", None)
    if red_op_type is not None and isinstance(op, red_op_type):
        return op.name
    if isinstance(op, dist.ReduceOp):
        for name in ("SUM", "AVG", "MAX", "MIN", "PRODUCT", "BAND", "BOR", "BXOR", "PREMUL_SUM"):
            member = getattr(dist.ReduceOp, name, None)
            if member is not None and op == member:
                return name
        return "UNKNOWN"
    return None



def op_code(op: Any, what: str = "op") -> int:
    """Returns the core code of ``op`` (a string, a ReduceOp, or torch's ReduceOp)."""
    code = _FAST.get(op) if op.__class__ is str else None
    if code is not None:
        return code
    if isinstance(op, ReduceOp):
        return _OP_CODES[op]
    if isinstance(op, str):
        found = _OP_ALIASES.get(op.lower())
        if found is None:
            raise ValueError(f"{what}: unknown reduce op {op!r} (valid: {_VALID_OPS})")
        return _OP_CODES[found]
    name = _torch_op_name(op)
    if name is not None:
        found = _OP_ALIASES.get(name.lower())
        if found is None:
            raise ValueError(
                f"{what}: torch ReduceOp.{name} is not supported (valid: {_VALID_OPS})"
            )
        return _OP_CODES[found]
    raise TypeError(
        f"{what}: op must be a str, pyring.ReduceOp or torch.distributed.ReduceOp, "
        f"got {type(op).__name__}"
    )
