"""A capacity plan as one labelled table: the rate found, what it achieves, what limits it.

The numbers differ for good reasons, and unlabelled they read as a contradiction:

- the rate found is an *offered* rate (arrivals per second) at which every SLO holds;
- the throughput achieved at it is completed requests over the run's duration, which counts
  the drain after the last arrival, so it is below the offered rate;
- the saturated capacity is the throughput of one finite batch sent all at once (ramp-up and
  drain included), the search's starting point; a steady stream can be offered a little more.

The binding SLO is the objective that fails first above the rate found: of those violated at
the closest failing rate, the one using the largest share of its limit at the rate found.
"""

from __future__ import annotations

from pagesim.metrics.report import rejection_line
from pagesim.planning.capacity import CapacityResult

WIDTH = 36  # label column


def binding_slo(cap: CapacityResult) -> str | None:
    """`objective (value at the rate found; value at the first failing rate)`, or None when
    no rate was found or nothing failed up to the search's limit."""
    if cap.max_rate is None or cap.result is None or cap.first_failing_rate is None:
        return None
    failing = next((p for p in cap.probes if p.value == cap.first_failing_rate), None)
    at_pass = {name: (used, shown) for name, used, shown in cap.slos.usage(cap.result)}
    at_fail = {} if failing is None else {n: (u, s) for n, u, s in cap.slos.usage(failing.result)}
    broken = [n for n, (u, _) in at_fail.items() if u > 1] or list(at_pass)
    if not broken:
        return None
    name = max(broken, key=lambda n: at_pass[n][0] if n in at_pass else 0.0)
    found = at_pass[name][1] if name in at_pass else "n/a"
    other = f"; {at_fail[name][1]} at {cap.first_failing_rate:.3f}" if name in at_fail else ""
    return f"{name} ({found} at {cap.max_rate:.3f}{other})"


def capacity_table(cap: CapacityResult, num_prompts: int) -> list[str]:
    """The labelled lines of `pagesim plan`'s answer for one replica."""
    row = "{:<" + str(WIDTH) + "} {}"
    lines = ["{s:{c}^{n}}".format(s=" Capacity plan (one replica) ", n=60, c="=")]
    if cap.refused:
        lines.append(row.format("Rate found within SLOs:", "none: " + cap.refused))
    elif cap.max_rate is None:
        floor = cap.first_failing_rate
        lines.append(row.format("Rate found within SLOs:", f"none down to {floor:g} req/s"))
    else:
        beyond = (
            f"(fails at {cap.first_failing_rate:.3f})"
            if cap.first_failing_rate
            else "(the search's upper limit)"
        )
        found = f"{cap.max_rate:.3f} req/s {beyond}"
        lines.append(row.format("Rate found within SLOs (offered):", found))
        got = (cap.result or {}).get("request_throughput")
        if got is not None:
            how = "completed / duration, drain after the last arrival included"
            lines.append(row.format("Throughput achieved at it:", f"{got:.3f} req/s ({how})"))
        lines.append(row.format("Binding SLO:", binding_slo(cap) or "none failed"))
        rejected = rejection_line(cap.result or {})
        if rejected:
            lines.append(row.format("Rejected at it (allowed):", rejected))
    saturated = f"{cap.saturated_throughput:.3f} req/s ({num_prompts} requests all sent at t=0)"
    lines.append(row.format("Saturated capacity:", saturated))
    lines.append("=" * 60)
    return lines
