"""Compiled host loops (numba): one pass over the elements where numpy takes one per operation.

A codec's host path in numpy is a few dozen array operations. In a pipeline each call
runs between a stage's matmuls, which have evicted the caches the interpreter and numpy's
dispatch used a call before, so each operation costs several times what it costs back to
back, and the number of operations, more than the work per element, sets a codec's cost
(``benchmarks/README.md``, section 5's cold calls). These functions do a codec's
per-element work and its small-table bookkeeping in a few compiled calls, in the codecs'
own arithmetic (the float32 operations of the torch paths, in the same order), so a payload
is the same bit for bit whichever path wrote it; the tests hold each one to its numpy
definition:

- ``packing``: codes in and out of ``bitpack``'s layout, decoding lookups, and the decodes
  that check a payload and look every code up in one call (``levels_decode`` for
  ``quantize`` and ``sortquant``, ``codebook_decode`` for ``lloydmax``), and ``topk``'s
  sparse decode (``sparse_decode``);
- ``scans``: ``quantize``'s ``min_max`` and ``quantize_codes``; ``sampled_frequent_values``
  for ``exact.repeated_values``;
- ``levels_encode``: a levels payload's head in one call (``levels_payload``), and
  ``sortquant``'s host encode past its sort in one call (``sortquant_payload``: its exact
  values, ``repeated_sorted``; its tables, ``sortquant_tables``; its codes,
  ``sortquant_codes``);
- ``lloyd``: ``lloydmax``'s fit sample, fit and each element's nearest level; ``hadamard``'s fit
  and codes;
- ``selection``: ``topk``'s positions of the largest magnitudes (``largest_positions``);
- ``sorting``: a float32 radix sort for the host paths' sorted values (``sort_values``);
- ``rotation``: ``hadamard``'s signs, transform, block scales and whole decode;
- ``lowrank``: ``powersgd``'s power iteration and its decode.

They are compiled on first use and cached on disk (``cache=True``: a process after the
first loads them from there), release the GIL, and run on one core: callers keep torch's
multi-threaded kernels for tensors above ``host.COMPILED_MAX`` elements. Compiled
functions call one another only within a module (``jit``).
"""

from __future__ import annotations

from .jit import jit
from .levels_encode import (CHAIN_BUCKETS, bucket_code, bucket_codes, levels_payload, repeated_sorted, retag_run,
                            sortquant_codes, sortquant_payload, sortquant_tables)
from .lloyd import (count_below, fit_levels_sorted, hadamard_codes, hadamard_payload, lloyd_steps, lloydmax_codes,
                    tail_fit_values, unweighted_lloyd)
from .lowrank import low_rank_product, power_iteration
from .packing import (LOOKUP_WIDTHS, codebook_decode, levels_decode, lookup_codes, pack_codes, sparse_decode,
                      unpack_codes)
from .rotation import exponent_factors, fwht_rows, hadamard_decode, hadamard_rotate, hadamard_signs, transform_scale
from .scans import min_max, quantize_codes, sampled_frequent_values
from .selection import largest_positions
from .sorting import sort_values

__all__ = ["jit", "CHAIN_BUCKETS", "LOOKUP_WIDTHS", "bucket_code", "bucket_codes", "codebook_decode", "count_below",
           "exponent_factors", "fit_levels_sorted", "fwht_rows", "hadamard_codes", "hadamard_decode",
           "hadamard_payload", "hadamard_rotate", "hadamard_signs", "largest_positions", "levels_decode",
           "levels_payload", "lloyd_steps", "lloydmax_codes", "lookup_codes", "low_rank_product", "min_max",
           "pack_codes", "power_iteration", "quantize_codes", "repeated_sorted", "retag_run", "sampled_frequent_values",
           "sort_values", "sortquant_codes", "sortquant_payload", "sortquant_tables", "sparse_decode", "tail_fit_values",
           "transform_scale", "unpack_codes", "unweighted_lloyd"]
