"""Server-args handling through SGLang's own resolution (`prepare_server_args` + `resolve_once`).

`--device cuda` on a GPU-less host: resolution reads configs only. The tiny pair's drafter declares block 8;
`drafter16` is the same drafter declaring block 16.
"""

from __future__ import annotations

import pytest

pytest.importorskip("sglang")

from sglang.srt.plugins import load_plugins  # noqa: E402

from ddtree.sglang.plugin import DDTreeArgumentError  # noqa: E402


def resolve(pair, *extra: str, drafter: str = "drafter16"):
    from sglang.srt.server_args import prepare_server_args

    load_plugins()
    args = prepare_server_args(
        [
            "--model-path", str(pair / "target"),
            "--speculative-algorithm", "DDTREE",
            "--speculative-draft-model-path", str(pair / drafter),
            "--device", "cuda",
            *extra,
        ]
    )
    args.resolve_once()
    return args


def test_valid_options_resolve_to_tree_widths(sglang_pair):
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_len_per_decode, get_alloc_reserve_per_decode
    from sglang.srt.runtime_context import publish
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_utils import resolve_num_tokens_per_req

    args = resolve(sglang_pair, "--speculative-num-draft-tokens", "65")
    r = args.resolved_dict()
    assert r["speculative_algorithm"] == "DDTREE"
    assert (r["speculative_num_draft_tokens"], r["speculative_dflash_block_size"]) == (65, 16)
    assert (r["speculative_num_steps"], r["speculative_eagle_topk"]) == (1, 1)
    assert r["attention_backend"] == "triton" and r["speculative_draft_attention_backend"] == "triton"
    assert r["page_size"] == 1
    assert r["disable_overlap_schedule"] is True
    assert r["max_running_requests"] == 48  # min(48, 4096 // 65)

    publish(args, role="test")
    algo = SpeculativeAlgorithm.from_string("DDTREE")
    assert resolve_num_tokens_per_req(phase="target_verify", spec_algorithm=algo, is_draft_worker=False) == 65
    assert resolve_num_tokens_per_req(phase="target_verify", spec_algorithm=algo, is_draft_worker=True) == 16
    assert (get_alloc_len_per_decode(), get_alloc_reserve_per_decode()) == (65, 130)
    # SGLang's own worker selection accepts it (overlap is off) and returns the plugin's worker factory.
    assert algo.factory.__module__ == "ddtree.sglang.plugin"


def test_large_budget_bounds_running_requests(sglang_pair):
    r = resolve(sglang_pair, "--speculative-num-draft-tokens", "257").resolved_dict()
    assert r["max_running_requests"] == 15
    r = resolve(sglang_pair, "--speculative-num-draft-tokens", "257", "--max-running-requests", "4").resolved_dict()
    assert r["max_running_requests"] == 4


def test_flashinfer_is_accepted(sglang_pair):
    r = resolve(sglang_pair, "--speculative-num-draft-tokens", "33", "--attention-backend", "flashinfer").resolved_dict()
    assert r["attention_backend"] == "flashinfer"
    assert r["speculative_draft_attention_backend"] == "flashinfer"


def test_device_default_fa3_is_switched_to_triton(sglang_pair, monkeypatch):
    import sglang.srt.arg_groups.overrides as overrides

    monkeypatch.setattr(overrides, "get_default_attn_backend", lambda *a, **k: "fa3")  # what Hopper resolves
    r = resolve(sglang_pair, "--speculative-num-draft-tokens", "65").resolved_dict()
    assert r["attention_backend"] == "triton"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--speculative-num-draft-tokens", "65", "--attention-backend", "fa3"], r"'fa3'.*ignores a custom attention mask"),
        (["--speculative-num-draft-tokens", "65", "--prefill-attention-backend", "fa3", "--decode-attention-backend", "triton"], r"'fa3'"),
        (["--speculative-num-draft-tokens", "8"], r"must be >= the drafter's block size 16, got 8 \(budget 7\)"),
        ([], r"needs --speculative-num-draft-tokens = tree budget \+ 1"),
        (["--speculative-num-draft-tokens", "65", "--page-size", "16"], r"--page-size 1"),
        (["--speculative-num-draft-tokens", "65", "--speculative-accept-threshold-acc", "0.5"], r"lossy"),
        (["--speculative-num-draft-tokens", "65", "--speculative-eagle-topk", "4"], r"--speculative-eagle-topk must be 1"),
        (["--speculative-num-draft-tokens", "65", "--speculative-draft-window-size", "128"], r"draft-window-size"),
        (["--speculative-num-draft-tokens", "65", "--speculative-use-rejection-sampling"], r"target-only walk"),
        (["--speculative-num-draft-tokens", "65", "--pp-size", "2"], r"--pp-size 1"),
    ],
)
def test_bad_options_are_refused(sglang_pair, extra, message):
    with pytest.raises(DDTreeArgumentError, match=message):
        resolve(sglang_pair, *extra)


def test_lora_is_refused(sglang_pair):
    with pytest.raises(DDTreeArgumentError, match="DDTREE: does not support LoRA"):
        resolve(sglang_pair, "--speculative-num-draft-tokens", "65", "--enable-lora", "--max-lora-rank", "8",
                "--lora-target-modules", "q_proj")


def test_dp_attention_is_refused(sglang_pair):
    with pytest.raises(DDTreeArgumentError, match="DDTREE: does not support DP attention"):
        resolve(sglang_pair, "--speculative-num-draft-tokens", "65", "--tp-size", "2", "--dp-size", "2",
                "--enable-dp-attention")


def test_block_size_comes_from_the_drafter(sglang_pair):
    r = resolve(sglang_pair, "--speculative-num-draft-tokens", "17", drafter="drafter").resolved_dict()
    assert r["speculative_dflash_block_size"] == 8


def test_trtllm_mha_is_refused_with_its_reason(sglang_pair):
    """SGLang itself refuses trtllm_mha on a GPU-less host first, so the plugin's own check is called directly
    on the resolved arguments of a valid run with the verify backend swapped."""
    from types import SimpleNamespace

    from ddtree.sglang.plugin import validate_server_args

    resolved = resolve(sglang_pair, "--speculative-num-draft-tokens", "65").resolved_dict()
    cfg = SimpleNamespace(**{**resolved, "attention_backend": "trtllm_mha", "speculative_dflash_block_size": None})
    with pytest.raises(DDTreeArgumentError, match=r"'trtllm_mha'.*linear chains only.*--attention-backend triton"):
        validate_server_args(cfg)


@pytest.mark.parametrize("profile", ["b300-x8", "rtx-pro-6000-x8"])
def test_the_pipelines_ddtree_command_resolves(sglang_pair, profile):
    """The command the benchmark session starts for a ddtree run on an SGLang profile, as SGLang parses it."""
    from pathlib import Path

    import yaml
    from sglang.srt.server_args import prepare_server_args

    from ddtree.bench.schema import ServerSpec
    from ddtree.bench.session import server_command
    from ddtree.pipeline.config import server_extra_args

    hw = yaml.safe_load((Path(__file__).parents[2] / "config" / "hardware" / f"{profile}.yaml").read_text())
    server = ServerSpec(engine="sglang", model=str(sglang_pair), method="ddtree", budget=64, dtype=hw["dtype"],
                        extra_args=tuple(server_extra_args(hw)))
    cmd = server_command(server, "127.0.0.1", 30000)
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    load_plugins()
    args = prepare_server_args([*cmd[3:], "--device", "cuda"])
    args.resolve_once()
    r = args.resolved_dict()
    assert (r["speculative_algorithm"], r["speculative_num_draft_tokens"], r["tp_size"]) == ("DDTREE", 65, 8)
    assert r["attention_backend"] == "triton" and r["disable_overlap_schedule"] is True
    assert r["max_running_requests"] == 48 and r["cuda_graph_config"]["decode"]["max_bs"] == 48
