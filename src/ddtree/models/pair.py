"""A target + DFlash drafter pair: loading a pair directory, and writing an untrained random one.

Directory layout (docs/CONTRACTS.md):
  PAIR_DIR/target/   Hugging Face causal LM + tokenizer files
  PAIR_DIR/drafter/  config.json (block_size, dflash_config{mask_token_id, target_layer_ids}) + model.safetensors
  PAIR_DIR/manifest.json, PAIR_DIR/prompts/heldout.jsonl (embedded pair only)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ddtree.models.drafter import DFlashConfig, DFlashDrafter


@dataclass
class ModelPair:
    target: Any  # transformers PreTrainedModel (causal LM), eval mode
    drafter: DFlashDrafter
    tokenizer: Any  # transformers tokenizer
    path: Path
    config: DFlashConfig  # the drafter's DFlash config (block_size, mask_token_id, target_layer_ids)

    @property
    def embed_tokens(self) -> torch.nn.Module:
        return self.target.get_input_embeddings()

    @property
    def lm_head(self) -> torch.nn.Module:
        return self.target.get_output_embeddings()

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device


def default_dtype(device: str | torch.device) -> torch.dtype:
    """float32 on CPU, bfloat16 on CUDA."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def _require(path: Path, what: str, is_dir: bool = False) -> Path:
    ok = path.is_dir() if is_dir else path.is_file()
    if not ok:
        raise FileNotFoundError(f"{what} not found: {path}")
    return path


def load_pair(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> ModelPair:
    """Load target, tokenizer and drafter from a pair directory; both models in eval mode."""
    from transformers import AutoModelForCausalLM

    root = _require(Path(path), "pair directory", is_dir=True)
    tdir = _require(root / "target", "target directory", is_dir=True)
    ddir = _require(root / "drafter", "drafter directory", is_dir=True)
    _require(tdir / "config.json", "target config")
    _require(ddir / "config.json", "drafter config")
    if not any(tdir.glob("*.safetensors")) and not any(tdir.glob("*.bin")):
        raise FileNotFoundError(f"target weights not found: {tdir / 'model.safetensors'}")
    device = torch.device(device)
    dtype = dtype if dtype is not None else default_dtype(device)
    target = AutoModelForCausalLM.from_pretrained(str(tdir), dtype=dtype).to(device).eval()
    tokenizer = load_tokenizer(root)
    drafter = DFlashDrafter.from_pretrained(ddir, device=device, dtype=dtype)
    check_compatible(target.config, drafter.config)
    return ModelPair(target=target, drafter=drafter, tokenizer=tokenizer, path=root, config=drafter.config)


def load_tokenizer(path: str | Path) -> Any:
    """The tokenizer of a pair directory (target/), without the models (the server process needs only this)."""
    from transformers import AutoTokenizer

    tdir = _require(_require(Path(path), "pair directory", is_dir=True) / "target", "target directory", is_dir=True)
    return AutoTokenizer.from_pretrained(str(tdir))


def check_compatible(target_config: Any, cfg: DFlashConfig) -> None:
    """Raise ValueError if the drafter cannot run on this target."""
    tcfg = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    if tcfg.hidden_size != cfg.hidden_size:
        raise ValueError(f"drafter hidden_size {cfg.hidden_size} != target hidden_size {tcfg.hidden_size}")
    bad = [i for i in cfg.target_layer_ids if not 0 <= i < tcfg.num_hidden_layers]
    if bad:
        raise ValueError(f"drafter target_layer_ids {bad} outside the target's {tcfg.num_hidden_layers} layers")
    if not 0 <= cfg.mask_token_id < tcfg.vocab_size:
        raise ValueError(f"drafter mask_token_id {cfg.mask_token_id} outside the target vocab ({tcfg.vocab_size})")


def _tokenizer_texts(max_bytes: int) -> list[str]:
    """A few stdlib train files (sorted order) for a quick tokenizer."""
    from ddtree.models.corpus import load_corpus

    return [f.text for f in load_corpus(max_train_bytes=max_bytes) if f.split == "train"]


def random_pair(out_dir: str | Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write an UNTRAINED pair (random weights, real BPE tokenizer) in the pair layout; returns out_dir."""
    from transformers import Qwen3ForCausalLM

    from ddtree.models.sizes import drafter_config, get_size, target_config
    from ddtree.models.tokenizer import save_tokenizer, special_token_ids, train_bpe

    spec = get_size(size)
    out = Path(out_dir)
    torch.manual_seed(seed)
    tok = train_bpe(_tokenizer_texts(200_000), spec.vocab_size)
    ids = special_token_ids(tok)
    vocab = tok.get_vocab_size()
    target = Qwen3ForCausalLM(target_config(spec, vocab, ids["eos_token_id"]))
    target.save_pretrained(str(out / "target"))
    save_tokenizer(tok, out / "target", spec.max_position_embeddings)
    drafter = DFlashDrafter(drafter_config(spec, vocab, ids["mask_token_id"]))
    drafter.save_pretrained(out / "drafter")
    manifest = {"kind": "random", "size": spec.to_dict(), "seed": seed, "vocab_size": vocab, **ids}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return out
