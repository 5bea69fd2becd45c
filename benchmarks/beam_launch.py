"""The one-program beam kernel (`triton_build._beam_kernel`) over its launch choices: unrolled or runtime depth
loop, warps, and the tau cut (`prune`: sort only the candidates scoring at least logw[W-1] + logq[0] when at
most that many are left; 4 W by default from width 64 on), per beam width (= budget) and batch, against the
default launch; every output is checked against the torch beam. The draft logits are randn x --scale (12 by
default: peaky rows, as a trained drafter gives; flat rows leave more candidates above the cut).
Prints one line per configuration as it goes and stops starting new ones at --deadline-s.

    PYTHONPATH=src python benchmarks/beam_launch.py --widths 32,64,128 --batch-sizes 1,8 --deadline-s 150
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from ddtree.bench.core import time_call
from ddtree.core.build import _beam_torch, _candidate_pairs, depth_topk
from ddtree.core.triton_build import BEAM_UNROLL_MAX_WIDTH, PRUNE_MIN_WIDTH, PRUNE_WIDTHS, beam_search


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--widths", default="32,64,128")
    ap.add_argument("--batch-sizes", default="1,8")
    ap.add_argument("--depth", type=int, default=15, help="draft positions D (block size - 1)")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--warps", default="4,8,16")
    ap.add_argument("--prunes", default="0,2,4", help="tau-cut sizes in multiples of the padded width (0: off)")
    ap.add_argument("--scale", type=float, default=12.0, help="logits = randn x scale (12: peaky, 1: flat)")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--deadline-s", type=float, default=150.0)
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--device", default="cuda", help="cpu runs under TRITON_INTERPRET=1 (a check of the script)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    start = time.perf_counter()
    rows = []
    for width in [int(x) for x in args.widths.split(",")]:
        for batch in [int(x) for x in args.batch_sizes.split(",")]:
            logits = torch.randn((batch, args.depth, args.vocab), device=dev) * args.scale
            logq, ids, _ = depth_topk(logits, width)
            js, rs, low = _candidate_pairs(width, width, dev)
            ref = _beam_torch(logq, ids, js, rs, low, width)
            default = width <= BEAM_UNROLL_MAX_WIDTH
            # runtime loops first: unrolled beams compile for tens of seconds (wider than 64: minutes, not tried)
            w_pad = 1 << (width - 1).bit_length()
            prunes = [int(x) * w_pad for x in args.prunes.split(",")]
            default_prune = PRUNE_WIDTHS * w_pad if width >= PRUNE_MIN_WIDTH else 0
            configs = [(None, None, None)] + [(u, w, p) for u in (False, True)
                                           for w in (int(x) for x in args.warps.split(",")) for p in prunes
                                           if not (u and width > 64)]
            for unroll, warps, prune in configs:
                if time.perf_counter() - start > args.deadline_s:
                    print("deadline: stopping", flush=True)
                    return _done(rows, args)
                try:
                    got = beam_search(logq, ids, js, rs, width, unroll=unroll, num_warps=warps, prune=prune)
                    ok = all(torch.equal(a, b) for a, b in zip(got, ref))
                    def ten() -> None:  # back to back, so the host's launch time hides behind the kernels
                        for _ in range(10):
                            beam_search(logq, ids, js, rs, width, unroll=unroll, num_warps=warps, prune=prune)

                    ms = time_call(ten, dev, args.repeats, warmup=1) / 10
                except Exception as exc:  # noqa: BLE001 - a launch that does not compile is a result too
                    ok, ms = False, float("nan")
                    print(f"  failed: {exc!s:.200}", flush=True)
                row = {"width": width, "batch": batch, "m": js.numel(),
                       "unroll": default if unroll is None else unroll, "warps": warps or "default",
                       "prune": default_prune if prune is None else prune,
                       "is_default": unroll is None, "us": ms * 1e3, "equal": ok}
                rows.append(row)
                print(f"W {width:4d} B {batch:3d} M {js.numel():5d} unroll {row['unroll']!s:5} warps "
                      f"{row['warps']!s:7} prune {row['prune']:4d} {row['us']:9.1f} us  equal {ok}{'  (default)' if unroll is None else ''}",
                      flush=True)
    return _done(rows, args)


def _done(rows, args) -> int:
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
