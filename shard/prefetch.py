"""A cache-line prefetch for compiled kernels: ``prefetch(a, i)`` asks the CPU to start loading
the line that holds ``a[i]`` (``a[i, 0]`` for a 2-d array) and goes on at once; it never
faults, whatever ``i`` is, and changes no result. LLVM's ``llvm.prefetch`` intrinsic (read,
high locality, data cache), which the kernels cannot otherwise reach from numba. Checked with
numba 0.59.1 / llvmlite 0.42 (LLVM 14, the oldest ``pyproject.toml`` allows) and 0.68.1 /
0.50: both emit ``prefetcht0``.

A kernel whose next reads are known a few steps ahead (the AP-Tree's leaves addressed by a
message's terms, ``shard.aptree.match``) starts those loads early, so that the misses of
several messages' terms overlap instead of following one another.

>>> import numpy as np
>>> from numba import njit
>>> @njit
... def touch(a, idx):
...     for i in idx:
...         prefetch(a, i)
...     return a.sum()
>>> float(touch(np.ones((4, 2)), np.array([0, 3, 99])))
8.0
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_I8P = ir.IntType(8).as_pointer()
_I32 = ir.IntType(32)
_READ, _HIGH_LOCALITY, _DATA = ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)


@intrinsic
def prefetch(typingctx, a, i):
    """``prefetch(a, i)``: start loading the line of ``a[i]`` (row ``i`` of a 2-d array), no
    bounds check (a prefetch of a bad address is dropped by the CPU). O(1)."""
    if not isinstance(a, types.Array) or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        aryty, ity = sig.args
        ary = context.make_array(aryty)(context, builder, args[0])
        idx = [context.cast(builder, args[1], ity, types.intp)]
        idx += [context.get_constant(types.intp, 0)] * (aryty.ndim - 1)
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, idx, wraparound=False)
        fnty = ir.FunctionType(ir.VoidType(), [_I8P, _I32, _I32, _I32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(ptr, _I8P), _READ, _HIGH_LOCALITY, _DATA])
        return context.get_dummy_value()

    return types.void(a, i), codegen
