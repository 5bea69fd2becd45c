"""Compare `ddtree bench engine --json-out` files of two code versions: time per output token and tau per
(method, budget, T), each version's best (lowest) time over its passes, and new over old.

    python3 benchmarks/engine/compare_engine_runs.py OLD.json [OLD2.json ...] -- NEW.json [NEW2.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def best_rows(paths: list[str]) -> dict[tuple, dict]:
    """(method, budget, T) -> the row with the lowest time per token over the files (the least disturbed pass)."""
    best: dict[tuple, dict] = {}
    for path in paths:
        for row in json.loads(Path(path).read_text())["rows"]:
            key = (row["method"], row["budget"] or 0, float(row["temperature"]))
            if key not in best or row["tpot_ms"] < best[key]["tpot_ms"]:
                best[key] = row
    return best


def main(argv: list[str]) -> int:
    if "--" not in argv:
        raise SystemExit(__doc__)
    cut = argv.index("--")
    old, new = best_rows(argv[:cut]), best_rows(argv[cut + 1:])
    print(f"{'method':>7} {'budget':>6} {'T':>3} {'old ms/tok':>10} {'new ms/tok':>10} {'new/old':>8} "
          f"{'old tau':>8} {'new tau':>8}")
    worst = 0.0
    for key in sorted(set(old) & set(new)):
        o, n = old[key], new[key]
        ratio = n["tpot_ms"] / o["tpot_ms"]
        worst = max(worst, ratio)
        print(f"{key[0]:>7} {key[1] or '-':>6} {key[2]:>3g} {o['tpot_ms']:>10.3f} {n['tpot_ms']:>10.3f} "
              f"{ratio:>7.2f}x {o['tau']:>8.2f} {n['tau']:>8.2f}")
    print(f"largest new/old: {worst:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
