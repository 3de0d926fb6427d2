"""How link-bound uncompressed training is at each rate of a slow-link run, from its own rows.

Per shaped rate R, for ``none``: the wire bytes of one step (what the monitor counted: every
frame's header and payload, not TCP/IP's), the seconds they take at R, and that over the
unlimited link's step time in the same run ("link-bound 4x": moving one step's bytes at R
takes 4 unlimited steps). Beside it the step ``none`` measured at R over the unlimited step, and
the share of the bytes no codec touches (raw inputs and targets sent ahead to a later stage):
where the link is the bottleneck, no codec can speed a step up by more than all bytes / those.
"""

from __future__ import annotations

import statistics

from benchmarks.common import fmt, markdown_table

#: Wire bytes a codec never sees: inputs/targets a stage receives raw from the data's reader.
UNCOMPRESSED_KINDS = ("input",)


def per_step(result: dict) -> dict:
    """A worker result's wire bytes per step, total and by link kind (``{}`` if it has none)."""
    if not result.get("bytes") or not result.get("steps"):
        return {}
    steps = result["steps"]
    return {"bytes_per_step": result["bytes"] / steps,
            "bytes_per_step_by_kind": {k: v / steps for k, v in (result.get("bytes_by_kind") or {}).items()}}


def median_per_step(results: list[dict]) -> dict:
    """:func:`per_step` over several runs of one method: the median of each field
    (``bytes_per_step`` None where no run has bytes)."""
    each = [e for e in map(per_step, results) if e]
    if not each:
        return {"bytes_per_step": None}
    kinds = dict.fromkeys(k for e in each for k in e["bytes_per_step_by_kind"])
    return {"bytes_per_step": statistics.median(e["bytes_per_step"] for e in each),
            "bytes_per_step_by_kind": {k: statistics.median(e["bytes_per_step_by_kind"].get(k, 0.0) for e in each)
                                       for k in kinds}}


def link_bound_rows(rows: list[dict], batch: int) -> list[dict]:
    """One dict per shaped rate where ``none`` ran with its bytes and the unlimited ``none`` ran
    too: rate, bytes per step, transfer and unlimited step seconds, their ratio, the measured
    slowdown and the raw share. ``rows``: a slow-link result's rows (rate_mbit, method,
    samples_per_s, bytes_per_step, optional bytes_per_step_by_kind)."""
    none = {r["rate_mbit"]: r for r in rows if r["method"] == "none" and r.get("samples_per_s")}
    unlimited = none.get(None)
    if unlimited is None:
        return []
    unlimited_step = batch / statistics.median(unlimited["samples_per_s"])
    out = []
    for rate, r in none.items():
        nbytes = r.get("bytes_per_step")
        if rate is None or not nbytes:
            continue
        transfer = nbytes * 8 / (rate * 1e6)
        raw = sum((r.get("bytes_per_step_by_kind") or {}).get(k, 0.0) for k in UNCOMPRESSED_KINDS)
        out.append({"rate_mbit": rate, "bytes_per_step": nbytes, "transfer_s": transfer,
                    "unlimited_step_s": unlimited_step, "link_bound": transfer / unlimited_step,
                    "measured_step_s": batch / statistics.median(r["samples_per_s"]),
                    "raw_share": raw / nbytes if r.get("bytes_per_step_by_kind") is not None else None})
    return out


def link_bound_table(rows: list[dict], batch: int) -> str:
    """The markdown table of :func:`link_bound_rows` (empty string where it has no rows)."""
    body = []
    for b in link_bound_rows(rows, batch):
        ceiling = ("-" if b["raw_share"] is None else "no limit" if not b["raw_share"]
                   else fmt(1 / b["raw_share"], ".2f", "x"))
        body.append([fmt(b["rate_mbit"], "g"), f"{b['bytes_per_step'] / 1e6:.2f}", fmt(b["transfer_s"], ".3f"),
                     fmt(b["unlimited_step_s"], ".3f"), fmt(b["link_bound"], ".1f", "x"),
                     fmt(b["measured_step_s"] / b["unlimited_step_s"], ".1f", "x"),
                     "-" if b["raw_share"] is None else f"{100 * b['raw_share']:.0f}%", ceiling])
    if not body:
        return ""
    return markdown_table(["link (Mbit/s)", "none: MB per step", "s to send them at the rate", "unlimited step (s)",
                           "link-bound (send / unlimited step)", "measured none step / unlimited step",
                           "raw inputs' share (no codec)", "codec speed-up ceiling (all / raw bytes)"], body)


def with_link_bound(text: str, rows: list[dict], batch: int) -> str:
    """A slow-link script's tables ``text`` with :func:`link_bound_table` after them, where it has rows."""
    bound = link_bound_table(rows, batch)
    return text + ("\n\n" + bound if bound else "")
