"""Registration through SGLang's own plugin loader; the spec class's answers and start-up methods."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("sglang")

from sglang.srt.plugins import load_plugins  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402
from sglang.srt.speculative.spec_registry import CustomSpecAlgo  # noqa: E402

from ddtree.sglang import plugin  # noqa: E402

STARTUP_METHODS = ("carries_draft_hidden_states", "create_future_map", "need_topk", "get_platform_worker_cls")
EXPECTED_TRUE = {
    "is_some", "is_speculative", "is_dflash", "is_dflash_family",
    "supports_target_verify_for_draft", "supports_prefill_shared_read_done",
}


@pytest.fixture(scope="module")
def ddtree_algo():
    load_plugins()
    return SpeculativeAlgorithm.from_string("ddtree")


def test_entry_point_registers_ddtree(ddtree_algo):
    assert isinstance(ddtree_algo, CustomSpecAlgo)
    assert type(ddtree_algo).__name__ == "DDTreeSpecAlgo"
    assert type(ddtree_algo).__module__ == plugin.__name__
    assert ddtree_algo.name == "DDTREE"
    assert ddtree_algo.supports_overlap is False
    assert ddtree_algo.validate_server_args is plugin.validate_server_args
    assert SpeculativeAlgorithm.from_string("DDTREE") is ddtree_algo


def test_every_enum_predicate_is_answered(ddtree_algo):
    predicates = sorted(n for n in vars(SpeculativeAlgorithm) if n.startswith(("is_", "supports_")))
    assert len(predicates) >= 15
    answers = {name: getattr(ddtree_algo, name)() for name in predicates}
    assert all(isinstance(v, bool) for v in answers.values())
    assert {name for name, v in answers.items() if v} == EXPECTED_TRUE & set(predicates)
    assert ddtree_algo.has_draft_kv() is True


def test_startup_methods_the_base_lacks(ddtree_algo):
    missing_on_base = [m for m in STARTUP_METHODS if not hasattr(CustomSpecAlgo, m)]
    assert missing_on_base == list(STARTUP_METHODS)  # why the spec class must add them
    assert ddtree_algo.carries_draft_hidden_states() is False
    assert ddtree_algo.need_topk() is False
    assert ddtree_algo.get_platform_worker_cls() is None


def test_future_map_builds(ddtree_algo):
    import torch
    from sglang.srt.managers.overlap_utils import FutureMap

    class _Pool:  # FutureMap reads only the request-to-token shape
        req_to_token = torch.zeros((4, 32), dtype=torch.int32)
        size = 4

    fmap = ddtree_algo.create_future_map(torch.device("cpu"), _Pool(), needs_cpu_seq_lens=False)
    assert isinstance(fmap, FutureMap)


def test_builtin_names_are_refused():
    with pytest.raises(ValueError, match="reserved"):
        SpeculativeAlgorithm.register("DFLASH", spec_class=plugin._spec_class())(lambda args: None)


def test_register_is_idempotent(ddtree_algo):
    plugin.register()
    plugin.register()
    assert SpeculativeAlgorithm.from_string("DDTREE") is ddtree_algo


def test_register_failure_is_logged_at_warning(monkeypatch, caplog):
    from sglang.srt.speculative import spec_registry

    def broken(*args, **kwargs):
        raise TypeError("spec class drifted")

    monkeypatch.setattr(spec_registry, "get_spec", lambda name: None)
    monkeypatch.setattr(SpeculativeAlgorithm, "register", classmethod(lambda cls, *a, **k: broken()))
    with caplog.at_level(logging.WARNING, logger=plugin.__name__):
        plugin.register()
    assert any(r.levelno == logging.WARNING and "spec class drifted" in r.getMessage() for r in caplog.records)


def test_worker_widths(ddtree_algo, monkeypatch):
    import sglang.srt.runtime_context as rc

    class _Spec:
        speculative_dflash_block_size = 16

    monkeypatch.setattr(rc, "get_spec", lambda: _Spec())
    assert ddtree_algo.get_num_tokens_per_req_for_target_verify(65, is_draft_worker=False) == 65
    assert ddtree_algo.get_num_tokens_per_req_for_target_verify(65, is_draft_worker=True) == 16
