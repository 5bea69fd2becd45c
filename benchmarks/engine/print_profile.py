"""Print a cProfile dump: the top functions by own time, then the engine's host path by cumulative time.

    python3 benchmarks/engine/print_profile.py /tmp/admission.prof
"""

from __future__ import annotations

import argparse
import pstats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", help="a file written by `python -m cProfile -o FILE ...`")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--modules", default="batched.py|scheduler.py|stopping.py",
                    help="regex of the files whose functions the cumulative listing keeps")
    args = ap.parse_args()
    stats = pstats.Stats(args.profile)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.modules, args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
