"""`NoHostSync`: fail on any operation that would make the host wait for the device (CPU-side check of
capture safety: on CUDA each of these is a synchronisation and is refused inside a CUDA-graph capture)."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# ops whose result the host must read (or whose output shape depends on tensor values)
_HOST_READS = {
    torch.ops.aten._local_scalar_dense.default,  # .item(), bool(t), int(t), float(t)
    torch.ops.aten.is_nonzero.default,
    torch.ops.aten.equal.default,
    torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten._unique2.default,
    torch.ops.aten.unique_dim.default,
    torch.ops.aten.unique_consecutive.default,
}


class NoHostSync(TorchDispatchMode):
    """Within the block, an AssertionError on every host read of tensor values: `.item()`, `bool()`, `int()`,
    data-dependent shapes (nonzero, boolean-mask indexing, unique), and copies to the CPU of device tensors
    (`.tolist()` of a CPU tensor reads its memory directly and is not seen)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        if func in _HOST_READS:
            raise AssertionError(f"host read of tensor values: {name}")
        if func is torch.ops.aten.index.Tensor and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]
        ):
            raise AssertionError(f"host read of tensor values: {name} with a boolean mask")
        if func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
            src = args[1] if func is torch.ops.aten.copy_.default else args[0]
            dst_cpu = (args[0].device.type == "cpu") if func is torch.ops.aten.copy_.default else (
                kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "cpu")
            if isinstance(src, torch.Tensor) and src.device.type != "cpu" and dst_cpu:
                raise AssertionError(f"host read of tensor values: {name} to the CPU")
        return func(*args, **(kwargs or {}))
