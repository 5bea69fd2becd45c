"""Where the fused epilogue + tree-attention kernel loses time (session 15: on the H200 it made `ar` 6.47 ms against
4.90 ms unfused, 53 us a call instead of 8.6 at one query token). Times, per round of --layers graph-replayed calls
(Qwen3-8B heads, context 512, batch 1), the unfused kernel over a prepared q, `qkv_epilogue` alone, and the fused
kernel with and without the q/k norm and the own-token write, at each width.

    PYTHONPATH=src python benchmarks/fused_attention_probe.py --widths 1,65
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_launch_sweep import make_inputs, median_ms  # noqa: E402

from ddtree.engine import fast_model, triton_attention  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--widths", default="1,65")
    p.add_argument("--layers", type=int, default=36)
    args = p.parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    shape = argparse.Namespace(heads=32, kv_heads=8, head_dim=128, context=512, capacity=1488, seed=0)
    h, kv, d = 32, 8, 128
    for width in (int(w) for w in args.widths.split(",")):
        x = make_inputs(shape, 1, width, 1, device, dtype)
        keys, values, vis = x.keys[0], x.values[0], x.vis
        qkv = torch.randn((1, width, (h + 2 * kv) * d), device=device, dtype=dtype)
        positions = (vis.own_start.unsqueeze(1) + torch.arange(width, device=device)).contiguous()
        norm = torch.ones(d, device=device, dtype=dtype)
        inv_freq = fast_model.rope_inv_freq(d, 1e6, device)
        rows = vis.rows()
        q = torch.empty((1, width, h, d), device=device, dtype=dtype).copy_(qkv[..., : h * d].view(1, width, h, d))

        def repeat(fn):
            return lambda: [fn() for _ in range(args.layers)]

        calls = {
            "unfused attention (q given)": lambda: triton_attention.tree_attention(
                q, keys, values, vis.context_len, vis.own_start, vis.own_mask),
            "qkv_epilogue alone": lambda: triton_attention.qkv_epilogue(
                qkv, h, kv, d, positions, norm, norm, rows, keys, values, 1e-6, inv_freq),
        }
        for with_norm in (True, False):
            for write in (True, False):
                calls[f"fused norm={with_norm} write={write}"] = (
                    lambda n=with_norm, w=write: triton_attention.fused_tree_attention(
                        qkv, positions, norm if n else None, norm if n else None, 1e-6, inv_freq, keys, values,
                        vis.context_len, vis.own_start, vis.own_mask, write_own=w))
        for name, fn in calls.items():
            fn()
            ms = median_ms(repeat(fn), device, 10, graphs=True)
            print(f"T={width:<4} {name:<32} {ms:7.3f} ms per {args.layers} calls ({1e3 * ms / args.layers:6.1f} us a call)",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
