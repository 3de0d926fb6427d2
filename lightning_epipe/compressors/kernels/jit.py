"""The compile options of every compiled loop of the codecs (``kernels``).

Compiled functions call one another only within one module of this package: numba's disk
cache sees a change to a function's own module, not to a callee in another one.
"""

from __future__ import annotations

import numba

__all__ = ["jit"]

#: The compile options of every loop here and of the codecs' own compiled functions.
jit = numba.njit(cache=True, nogil=True, error_model="numpy")
