"""The DDTREE worker cannot run without a GPU. What CPU can check against the installed sglang 0.5.23: the
worker imports, subclasses DFlashWorkerV2, the plugin's factory returns it, every `self.<name>` it reads
exists on the base worker, and every SGLang callable it calls accepts the argument names it passes
(the private internals it depends on are pinned to this release)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

pytest.importorskip("sglang")


@pytest.fixture(scope="module")
def worker_module():
    from ddtree.sglang import worker

    return worker


def _tree(module) -> ast.Module:
    return ast.parse(Path(module.__file__).read_text())


def test_worker_is_a_dflash_v2_worker_and_the_factory_returns_it(worker_module):
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    from ddtree.sglang import plugin

    assert issubclass(worker_module.DDTreeWorker, DFlashWorkerV2)
    assert plugin._worker_factory(None) is worker_module.DDTreeWorker
    for name in ("forward_batch_generation", "init_cuda_graphs", "prewarm_sampling", "_maybe_build_draft_sampler"):
        assert name in vars(worker_module.DDTreeWorker), name  # overridden, not inherited


def test_every_attribute_the_worker_reads_exists_on_the_base(worker_module):
    import sglang.srt.speculative.dflash_worker_v2 as base

    tree = _tree(worker_module)
    attrs = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"]
    own = {n.attr for n in attrs if isinstance(n.ctx, ast.Store)} | set(vars(worker_module.DDTreeWorker))
    base_source = inspect.getsource(base)
    base_names = set(re.findall(r"self\.([A-Za-z_]\w*)\s*(?::[^=\n]*)?=", base_source)) | set(dir(base.DFlashWorkerV2))
    missing = sorted({n.attr for n in attrs} - own - base_names)
    assert missing == []


def test_sglang_callables_accept_the_arguments_passed(worker_module):
    tree = _tree(worker_module)
    namespace = vars(worker_module)
    checked: list[str] = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        fn = None
        if isinstance(call.func, ast.Name) and call.func.id in namespace:
            fn = namespace[call.func.id]
        elif (isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name)
              and call.func.value.id == "self" and not call.func.attr.startswith("_tp")):
            fn = getattr(worker_module.DDTreeWorker, call.func.attr, None)
        if fn is None or not getattr(fn, "__module__", "").startswith("sglang"):
            continue
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            continue
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            continue
        params = list(sig.parameters.values())
        if params and params[0].name == "self" and not isinstance(fn, type):
            params = params[1:]
        sig = sig.replace(parameters=params)
        sig.bind(*([None] * len(call.args)), **{k.arg: None for k in call.keywords})  # TypeError = drift
        checked.append(getattr(fn, "__name__", repr(fn)))
    for name in ("ForwardBatch", "DFlashVerifyInput", "GenerationBatchResult", "move_accept_tokens_to_target_kvcache",
                 "verify_tree_greedy_func", "_append_target_hidden_to_draft_kv_by_loc"):
        assert name in checked, name


def test_verify_input_keeps_dflash_verify_type():
    import torch
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput
    from sglang.srt.speculative.spec_info import SpecInputType

    mask = torch.ones(10, dtype=torch.bool)
    verify = DFlashVerifyInput(draft_token=torch.zeros(6, dtype=torch.long), positions=torch.zeros(6, dtype=torch.long),
                               draft_token_num=3, custom_mask=mask)
    assert verify.spec_input_type == SpecInputType.DFLASH_VERIFY
    assert verify.num_tokens_per_req == 3 and verify.custom_mask is mask


def test_bucket_is_the_next_power_of_two(worker_module):
    assert [worker_module._bucket(b) for b in (1, 2, 3, 4, 5, 17, 48)] == [1, 2, 4, 4, 8, 32, 64]


def test_the_reference_has_the_cuda_sampling_kernels_signature():
    """On a CPU host `verify_sampling.tree_speculative_sampling_target_only` is None; the CUDA wrapper the worker
    calls on a GPU imports all the same, and the reference mirrors its parameters one for one."""
    from sglang.kernels.ops.speculative.sampling import tree_speculative_sampling_target_only

    from ddtree.sglang.kernel_reference import tree_speculative_sampling_target_only_reference

    cuda = inspect.signature(tree_speculative_sampling_target_only).parameters
    ours = inspect.signature(tree_speculative_sampling_target_only_reference).parameters
    assert list(cuda) == list(ours)
    assert [p.default for p in cuda.values()] == [p.default for p in ours.values()]
