"""What the tree-attention kernel costs the GPU before it runs: registers, spills, stack, shared memory and whether
its key loops are software-pipelined (async copies), per launch, compiled for sm_90 on any host (no GPU: Triton's
own ptxas). A kernel change can be checked here before device time is spent on it: in session 15 a fused epilogue
variant needed 230-255 registers against 128 and spilled at the tree launch, and took 6-10x longer a call on the H200.

    PYTHONPATH=src python benchmarks/kernel_resources.py --widths 1,17,65,129 --batch-sizes 1,8
    PYTHONPATH=src python benchmarks/kernel_resources.py --heads 32 --kv-heads 4 --head-dim 128   # another shape

Each cell compiles the kernel as a launch from the engine would specialise it: the launch `launch_rule` picks (or
--launch), bf16, and Triton's 16-divisibility of every pointer and of each integer argument the engine's shapes
make divisible (strides of the q view, the slot caches and the mask; the width). Triton compiles for its own
version, so a report from this host's Triton can differ from the device's: run it there too (it needs no GPU time
to speak of). Launch fields: block_m, block_n, splits, num_warps, num_stages.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ddtree.engine import triton_attention
from ddtree.engine.triton_attention import Launch, launch_rule


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def signature(width: int, heads: int, kv_heads: int, head_dim: int, capacity: int,
              launch: Launch) -> tuple[dict[str, str], dict[str, object], dict[str, int]]:
    """(signature, constexprs, integer argument values) of `_tree_attention_splits` for one engine call (the batch
    size is only the grid's, so it does not enter the compile)."""
    g = heads // kv_heads
    pointers = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "CTX": "*i64", "OWN": "*i64", "MASK": "*u8",
                "PART": "*fp32", "LSE": "*fp32", "COUNT": "*i32", "OUT": "*bf16"}
    # q: the epilogue's [B, T, h, d] output; keys / values: slot views of [L, slots, h_kv, S, d]; mask [B, T, T]
    values = {"s_qb": width * heads * head_dim, "s_qt": heads * head_dim, "s_qh": head_dim,
              "s_kb": kv_heads * capacity * head_dim, "s_kh": capacity * head_dim, "s_ks": head_dim,
              "s_vb": kv_heads * capacity * head_dim, "s_vh": capacity * head_dim, "s_vs": head_dim,
              "s_mb": width * width, "s_mi": width, "T": width, "H_KV": kv_heads}
    sig = {**pointers, **{name: "i32" for name in values}, "sm_scale": "fp32"}
    constexprs = {"G": g, "D": head_dim, "BLOCK_M": launch.block_m, "BLOCK_N": launch.block_n,
                  "SPLITS": launch.splits, "DIRECT": launch.splits == 1, "PRECISION": "tf32"}
    missing = set(triton_attention._tree_attention_splits.arg_names) - set(sig) - set(constexprs)
    if missing:
        raise SystemExit(f"the kernel takes arguments this report does not model: {sorted(missing)}")
    return {**sig, **{name: "constexpr" for name in constexprs}}, constexprs, values


def resources(width: int, heads: int, kv_heads: int, head_dim: int, capacity: int, launch: Launch,
              arch: int = 90) -> dict[str, object]:
    """Compile one launch for sm_`arch` and read ptxas's report and the pipelined loads."""
    sig, constexprs, values = signature(width, heads, kv_heads, head_dim, capacity, launch)
    names = list(sig)
    # Triton specialises a pointer (assumed 16-byte aligned, as torch allocates) or an int divisible by 16
    divisible = [n for n in names if sig[n].startswith("*") or (sig[n] == "i32" and values[n] % 16 == 0)]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    src = ASTSource(fn=triton_attention._tree_attention_splits, signature=sig, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": launch.num_warps, "num_stages": launch.num_stages})
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "kernel.ptx")
        with open(ptx, "w") as handle:
            handle.write(compiled.asm["ptx"])
        report = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{arch}a", ptx, "-o", os.path.join(tmp, "k.cubin")],
                                capture_output=True, text=True, check=True).stderr

    def number(pattern: str) -> int:
        found = re.search(pattern, report)
        return int(found.group(1)) if found else 0

    return {"registers": number(r"Used (\d+) registers"), "spill_stores": number(r"(\d+) bytes spill stores"),
            "spill_loads": number(r"(\d+) bytes spill loads"), "stack": number(r"(\d+) bytes stack frame"),
            "shared": int(compiled.metadata.shared),
            "async_copies": compiled.asm["ttgir"].count("async_copy_global_to_local")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--heads", type=int, default=32, help="query heads (default: Qwen3-8B)")
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--capacity", type=int, default=1488, help="slot rows (the 8B cost model's slot)")
    p.add_argument("--batch-sizes", default="1")
    p.add_argument("--widths", default="1,17,65", help="query tokens T per row (ar, tree budgets 16 and 64)")
    p.add_argument("--sms", type=int, default=132, help="SM count for the launch rule (H200: 132)")
    p.add_argument("--launch", default=None, help="block_m,block_n,splits,num_warps,num_stages for every cell "
                   "instead of the launch rule's")
    args = p.parse_args(argv)
    print(f"triton {triton.__version__}, sm_90; {args.heads} heads, {args.kv_heads} K/V heads, head dim {args.head_dim}")
    print(f"{'B':>3} {'T':>4}  {'launch':<28} {'regs':>4} {'spill st/ld':>11} {'stack':>5} {'smem':>6} {'async':>5}")
    for batch in ints(args.batch_sizes):
        for width in ints(args.widths):
            rows = args.heads // args.kv_heads * width
            launch = Launch(*ints(args.launch)) if args.launch else launch_rule(batch, args.kv_heads, rows,
                                                                               args.capacity, args.sms, args.head_dim)
            r = resources(width, args.heads, args.kv_heads, args.head_dim, args.capacity, launch)
            fields = f"{launch.block_m},{launch.block_n},{launch.splits},{launch.num_warps}w,{launch.num_stages}s"
            print(f"{batch:>3} {width:>4}  {fields:<28} {r['registers']:>4} "
                  f"{r['spill_stores']:>5}/{r['spill_loads']:<5} {r['stack']:>5} {r['shared']:>6} {r['async_copies']:>5}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
