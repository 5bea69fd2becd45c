"""Prompt preparation: one JSON-lines file per model pair, `{"id", "dataset", "text"}` per line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from ddtree.jsonl import read_jsonl

EMBEDDED_PROMPTS = Path("prompts") / "heldout.jsonl"


def load_embedded_prompts(pair_dir: str | Path, dataset: str) -> list[dict[str, Any]]:
    """Held-out prompts that `ddtree train-pair` wrote beside the embedded pair."""
    path = Path(pair_dir) / EMBEDDED_PROMPTS
    if not path.is_file():
        raise FileNotFoundError(f"dataset {dataset!r}: {path} does not exist (only embedded pairs carry it)")
    rows = read_jsonl(path)
    matching = [r for r in rows if r.get("dataset", dataset) == dataset]
    # A pair written with another held-out dataset name still serves its held-out prompts.
    return [{"id": str(r["id"]), "dataset": dataset, "text": str(r["text"])} for r in (matching or rows)]


def _field(row: Mapping[str, Any], dotted: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def load_table_prompts(path: str | Path, dataset: str, text_field: str, id_field: str | None = None) -> list[dict]:
    """Prompts from a downloaded dataset file (parquet, jsonl or json); `text_field` may be dotted (`turns.0`)."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pandas as pd

        rows = pd.read_parquet(path).to_dict(orient="records")
    elif path.suffix == ".jsonl":
        rows = read_jsonl(path)
    elif path.suffix == ".json":
        rows = json.loads(path.read_text(encoding="utf-8"))
    else:
        raise ValueError(f"dataset {dataset!r}: unsupported file type {path.suffix!r} (parquet, jsonl or json)")
    prompts = []
    for index, row in enumerate(rows):
        try:
            text = _field(row, text_field)
        except (KeyError, IndexError, TypeError):
            raise ValueError(f"dataset {dataset!r}: row {index} has no field {text_field!r}") from None
        ident = _field(row, id_field) if id_field else index
        prompts.append({"id": f"{dataset}-{ident}", "dataset": dataset, "text": str(text)})
    return prompts


def apply_chat_template(prompts: list[dict[str, Any]], tokenizer_dir: str | Path) -> list[dict[str, Any]]:
    """Wrap each prompt as one user turn with the target's chat template, thinking off."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    out = []
    for prompt in prompts:
        messages = [{"role": "user", "content": prompt["text"]}]
        try:
            text = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
            )
        except TypeError:  # templates without the thinking switch
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out.append({**prompt, "text": text})
    return out


def select_prompts(prompts: list[dict[str, Any]], num_prompts: int) -> list[dict[str, Any]]:
    """The first `num_prompts` prompts with distinct ids (deterministic, no shuffling)."""
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be at least 1, got {num_prompts}")
    seen: set[str] = set()
    chosen = []
    for prompt in prompts:
        if prompt["id"] in seen:
            continue
        seen.add(prompt["id"])
        chosen.append(prompt)
        if len(chosen) == num_prompts:
            break
    return chosen
