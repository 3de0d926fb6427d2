"""``powersgd``'s power iteration and its decode in compiled loops, for small CPU tensors.

``power_iteration``: ``P = orthonormalize(M Q)``, ``Q = M^T P``, repeated, per matrix of the
batch, the orthonormalization a Householder QR with LAPACK's signs (``R``'s diagonal
``-sign(a_kk) |a_k|``, a reflection skipped where the column below the diagonal is zero), so
the factors are the torch path's (``torch.linalg.qr``) up to rounding, column signs included;
``low_rank_product``: ``M ~ P Q^T``. Sums in float64, each result rounded once to its array's
dtype.

Shape legend: B matrices of m x n, rank r.
"""

from __future__ import annotations

import math

import numpy as np

from .jit import jit

__all__ = ["power_iteration", "low_rank_product"]


@jit
def _householder_q(a, m, r, q):  # pragma: no cover - compiled
    """a [m, r] float64 (m >= r), overwritten -> q [m, r] float64: the orthonormal factor of
    its thin QR, as LAPACK's geqrf + orgqr compute it."""
    taus = np.zeros(r)
    for k in range(r):
        alpha = a[k, k]
        tail = 0.0
        for i in range(k + 1, m):
            tail += a[i, k] * a[i, k]
        if tail == 0.0:
            continue  # tau = 0: H_k is the identity
        beta = -math.copysign(math.sqrt(alpha * alpha + tail), alpha)
        taus[k] = (beta - alpha) / beta
        scale = 1.0 / (alpha - beta)
        for i in range(k + 1, m):
            a[i, k] *= scale  # v below the diagonal, v_k = 1
        a[k, k] = beta
        for j in range(k + 1, r):
            _reflect(a, k, taus[k], a, j)
    q[:, :] = 0.0
    for j in range(r):
        q[j, j] = 1.0
    for k in range(r - 1, -1, -1):  # Q = H_0 H_1 ... H_{r-1} I[:, :r]
        if taus[k] == 0.0:
            continue
        for j in range(k, r):
            _reflect(a, k, taus[k], q, j)


@jit
def _reflect(a, k, tau, target, j):  # pragma: no cover - compiled
    """Column j of target [m, *] times ``H_k = I - tau v v^T``, v: 1 at row k, ``a[k + 1:, k]`` below."""
    m = target.shape[0]
    w = target[k, j]
    for i in range(k + 1, m):
        w += a[i, k] * target[i, j]
    w *= tau
    target[k, j] -= w
    for i in range(k + 1, m):
        target[i, j] -= w * a[i, k]


@jit
def power_iteration(matrix, q, iterations, p_out):  # pragma: no cover - compiled
    """matrix [B, m, n] float32/float64; q [B, n, r] (the warm start, overwritten with the new
    Q); p_out [B, m, r], written with P (orthonormal columns); r <= min(m, n). Returns the sum
    of the matrix's values (finite exactly when they all are, but for an overflowing sum).
    Each product is accumulated over its inner index in order, the loops laid out so the
    innermost one runs over independent outputs (the compiler vectorizes it)."""
    batch, m, n = matrix.shape
    r = q.shape[2]
    total = 0.0
    rows = np.empty((m, n))           # M in float64
    columns = np.empty((n, m))        # M^T
    product_t = np.empty((r, m))      # (M Q)^T
    ortho = np.empty((m, r))
    back_t = np.empty((r, n))         # Q^T
    for b in range(batch):
        for i in range(m):
            for k in range(n):
                value = np.float64(matrix[b, i, k])
                total += value
                rows[i, k] = value
                columns[k, i] = value
        for k in range(n):
            for c in range(r):
                back_t[c, k] = q[b, k, c]
        for _ in range(iterations):
            product_t[:, :] = 0.0
            for c in range(r):
                for k in range(n):
                    weight = back_t[c, k]
                    for i in range(m):
                        product_t[c, i] += columns[k, i] * weight
            _householder_q(product_t.T.copy(), m, r, ortho)
            back_t[:, :] = 0.0
            for c in range(r):
                for i in range(m):
                    weight = ortho[i, c]
                    for k in range(n):
                        back_t[c, k] += rows[i, k] * weight
        for i in range(m):
            for c in range(r):
                p_out[b, i, c] = ortho[i, c]
        for k in range(n):
            for c in range(r):
                q[b, k, c] = back_t[c, k]
    return total


@jit
def low_rank_product(p, q, out):  # pragma: no cover - compiled
    """p [B, m, r], q [B, n, r] -> out [B, m, n] = P Q^T per matrix, written (each element
    summed over r in order, in float64, the innermost loop over independent elements)."""
    batch, m, r = p.shape
    n = q.shape[1]
    q_t = np.empty((r, n))
    row = np.empty(n)
    for b in range(batch):
        for k in range(n):
            for c in range(r):
                q_t[c, k] = q[b, k, c]
        for i in range(m):
            row[:] = 0.0
            for c in range(r):
                weight = np.float64(p[b, i, c])
                for k in range(n):
                    row[k] += weight * q_t[c, k]
            for k in range(n):
                out[b, i, k] = row[k]
