"""ddtree.switches: environment parsing, validation, and `override` (which wins over the environment)."""

from __future__ import annotations

import pytest

from ddtree import switches


def test_environment_parsing() -> None:
    assert switches.from_environment({}) == switches.Switches()
    assert switches.from_environment({"DDTREE_NO_CUDA_GRAPH": "", "DDTREE_NO_TRITON": "0"}) == switches.Switches()
    env = {"DDTREE_NO_CUDA_GRAPH": "yes", "DDTREE_TRITON_BEAM_MAX_WIDTH": "64", "OTHER": "1"}
    assert switches.from_environment(env) == switches.Switches(no_cuda_graph=True, triton_beam_max_width=64)
    assert switches.from_environment({"DDTREE_NO_OVERLAP": "1"}) == switches.Switches(no_overlap=True)


def test_override_wins_and_nests(monkeypatch) -> None:
    base = switches.Switches(no_cuda_graph=True, triton_beam_max_width=64)
    monkeypatch.setattr(switches, "_from_process_environment", lambda: base)
    assert switches.current() is base
    with switches.override(no_cuda_graph=False, stats_programs=1024) as inner:
        assert switches.current() is inner
        assert inner == switches.Switches(triton_beam_max_width=64, stats_programs=1024)
        with switches.override(no_triton=True):
            assert switches.current().no_triton and switches.current().stats_programs == 1024
        assert not switches.current().no_triton
    assert switches.current().no_cuda_graph


def test_bad_values_raise() -> None:
    with pytest.raises(ValueError, match="unknown switches"), switches.override(no_such_switch=True):
        pass
    with pytest.raises(ValueError, match="no_triton must be a bool"), switches.override(no_triton=1):
        pass
    with pytest.raises(ValueError, match="stats_programs must be >= 1"), switches.override(stats_programs=0):
        pass
    with pytest.raises(ValueError, match="DDTREE_STATS_PROGRAMS must be an integer"):
        switches.from_environment({"DDTREE_STATS_PROGRAMS": "many"})
