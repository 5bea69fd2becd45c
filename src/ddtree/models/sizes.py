"""Size presets of the embedded pair (architecture + training budgets) and config builders.

tiny  : test fixture; step-count schedule (reproducible), ~20 s on a quiet 2-core CPU.
small : the embedded default; 2.5 + 3.0 wall-clock minutes (preparation included) on 2 CPU cores.
        The target stops at 500 steps when the machine is quiet and the drafter gets the rest: a target
        trained much longer produces more varied greedy text and the 3-minute drafter falls behind it
        (measured: target held-out loss 3.43 -> DFlash tau 1.77), a barely trained one loops (tau near b).
        Block 16: on the same target, block 8 gave DDTree(32)/DFlash 1.29, block 16 1.38.
        Sequences: the target trains on 256-token windows and the drafter on 320-token target rollouts, so
        that prompt (<= ~130 tokens) + 128 new tokens stay inside the trained positions: trained at 128,
        the drafter's tau fell from 7.3 (positions 64-127) to 2.0 (320+) and ddtree ran at 0.66x of ar;
        trained at 320, ddtree(16) ran at 1.21x of ar (`ddtree bench engine`, 16 prompts x 128 tokens).
gpu   : the pair for one H200 (bf16 autocast), trained by one command in about 5 minutes (benchmarks/gpu_pair/).
        Replaces `large` (8 x 512 target, time schedule, 2 minutes: held-out loss 3.06 after ~9 epochs of the
        2.6M-token corpus, train loss 0.80, i.e. memorised; DFlash tau 1.72). The target trains ~3 epochs
        (640 steps x 32 x 384 tokens) so that it behaves on the drafter's training prompts as on held-out
        ones; the drafter gets most of the time: 4 layers, 2400 steps x 256 rollouts x 16 blocks (~9.8M
        blocks, 16x the `large` run's), anchored only in the target-generated part of 24,576 rollouts of
        384 tokens (prompt <= ~200 + 128 new + one block), with the frozen target in bf16 as the engine
        runs it. Wall time and its FLOP basis: benchmarks/gpu_pair/README.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class PairSize:
    name: str
    vocab_size: int
    # target (Qwen3ForCausalLM)
    hidden_size: int
    target_layers: int
    target_intermediate: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    # drafter (hidden size = the target's, it borrows embed_tokens / lm_head)
    drafter_layers: int
    drafter_intermediate: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    # training
    seq_len: int
    target_batch: int
    target_lr: float
    target_minutes: float
    target_max_steps: int
    drafter_batch: int
    drafter_anchors: int  # blocks per training sequence
    drafter_lr: float
    drafter_minutes: float
    drafter_max_steps: int
    rollout_rows: int  # size of the drafter's pool of target-generated training sequences
    corpus_max_train_bytes: int | None  # None = the whole train split
    tokenizer_max_bytes: int | None
    max_position_embeddings: int = 4096
    rope_theta: float = 10_000.0
    # "steps": the LR schedule follows step / max_steps only (reproducible; the minutes are a safety cap);
    # "time": it follows max(step / max_steps, elapsed / budget) (uses the whole wall-clock budget).
    schedule: str = "time"
    # Length of the drafter's training sequences (target rollouts); None = seq_len. It must cover the positions
    # decoding reaches (prompt + max_new_tokens): past its training length the drafter's tau collapses
    # (measured on the small pair trained at 128: tau 7.3 at positions 64-127, 4.5 at 128-191, 2.0 at 320+).
    drafter_seq_len: int | None = None
    # Anchor the drafter's training blocks only in the target-generated part of each rollout (position >=
    # its prompt's length), where the labels are one greedy chain as at inference; False anchors anywhere
    # (inside the real-code prompt, a block's later labels follow code the drafter cannot see). The CPU
    # presets keep False, their measured setting.
    anchors_after_prompt: bool = False

    @property
    def rollout_len(self) -> int:
        return self.seq_len if self.drafter_seq_len is None else self.drafter_seq_len

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


SIZES: dict[str, PairSize] = {
    "tiny": PairSize(
        name="tiny", vocab_size=512, hidden_size=64, target_layers=2, target_intermediate=192, num_heads=4,
        num_kv_heads=2, head_dim=16, drafter_layers=1, drafter_intermediate=192, block_size=8,
        target_layer_ids=(0, 1), seq_len=128, target_batch=16, target_lr=3e-3, target_minutes=0.75,
        target_max_steps=150, drafter_batch=8, drafter_anchors=8, drafter_lr=3e-3, drafter_minutes=0.75,
        drafter_max_steps=500, rollout_rows=1024, corpus_max_train_bytes=600_000, tokenizer_max_bytes=300_000,
        max_position_embeddings=1024, schedule="steps",
    ),
    "small": PairSize(
        name="small", vocab_size=2048, hidden_size=128, target_layers=3, target_intermediate=384, num_heads=4,
        num_kv_heads=2, head_dim=32, drafter_layers=2, drafter_intermediate=384, block_size=16,
        target_layer_ids=(0, 1, 2), seq_len=256, target_batch=8, target_lr=3e-3, target_minutes=2.5,
        target_max_steps=500, drafter_batch=8, drafter_anchors=16, drafter_lr=2e-3, drafter_minutes=3.5,
        drafter_max_steps=2400, rollout_rows=1024, drafter_seq_len=320, corpus_max_train_bytes=None,
        tokenizer_max_bytes=4_000_000,
        # Fixed step counts and fixed threads: the same pair on every quiet 2-core machine (a time-driven
        # schedule made pair quality follow machine load); the minutes only stop a run on a loaded machine.
        schedule="steps",
    ),
    "gpu": PairSize(
        name="gpu", vocab_size=4096, hidden_size=512, target_layers=8, target_intermediate=1536, num_heads=8,
        num_kv_heads=4, head_dim=64, drafter_layers=4, drafter_intermediate=1536, block_size=16,
        target_layer_ids=(1, 3, 5, 7), seq_len=384, target_batch=32, target_lr=2e-3, target_minutes=1.25,
        target_max_steps=640, drafter_batch=256, drafter_anchors=16, drafter_lr=2e-3, drafter_minutes=4.25,
        drafter_max_steps=2400, rollout_rows=24576, corpus_max_train_bytes=None, tokenizer_max_bytes=None,
        # Fixed step counts; the minutes (5.5 in all, preparation, rollouts and feature cache included) are a
        # safety stop that the FLOP estimate keeps ~2 minutes away.
        schedule="steps", anchors_after_prompt=True,
    ),
}


def get_size(name: str) -> PairSize:
    if name not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {name!r}")
    return SIZES[name]


def target_config(size: PairSize, vocab_size: int, eos_token_id: int):
    """A transformers Qwen3Config for the target."""
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=size.hidden_size,
        intermediate_size=size.target_intermediate,
        num_hidden_layers=size.target_layers,
        num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_kv_heads,
        head_dim=size.head_dim,
        max_position_embeddings=size.max_position_embeddings,
        rms_norm_eps=1e-6,
        rope_theta=size.rope_theta,
        tie_word_embeddings=True,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        use_cache=True,
    )


def drafter_config(size: PairSize, vocab_size: int, mask_token_id: int):
    from ddtree.models.drafter import DFlashConfig

    return DFlashConfig(
        hidden_size=size.hidden_size,
        intermediate_size=size.drafter_intermediate,
        num_hidden_layers=size.drafter_layers,
        num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_kv_heads,
        head_dim=size.head_dim,
        vocab_size=vocab_size,
        block_size=size.block_size,
        mask_token_id=mask_token_id,
        target_layer_ids=list(size.target_layer_ids),
        rms_norm_eps=1e-6,
        rope_theta=size.rope_theta,
        max_position_embeddings=size.max_position_embeddings,
        num_target_layers=size.target_layers,
    )
