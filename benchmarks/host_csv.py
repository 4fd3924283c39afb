"""CSV tables of host-side benchmarks: one comment line saying where and when they ran."""

from __future__ import annotations

import csv
import datetime
import platform

import numpy as np


def write_host_csv(path: str, name: str, rows: list[dict], note: str = "") -> None:
    """`rows` as CSV under a `# pagesim <name>, <date>, python, numpy, machine` line."""
    with open(path, "w", newline="") as f:
        f.write(
            f"# pagesim {name}, {datetime.date.today()}, python "
            f"{platform.python_version()}, numpy {np.__version__}, "
            f"{platform.machine()}{'; ' + note if note else ''}\n"
        )
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")
