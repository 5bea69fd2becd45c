"""The embedded pair's corpus: the Python standard library's own `.py` sources.

Deterministic: files are listed in sorted relative-path order, each file's split (train / held-out) is a
function of a hash of its relative path only, and prompts are cut with a seeded generator.
"""

from __future__ import annotations

import hashlib
import random
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
PROMPT_DATASET = "stdlib-heldout"


@dataclass(frozen=True)
class CorpusFile:
    relpath: str  # posix path relative to the stdlib root
    text: str
    sha256: str  # of the raw bytes
    split: str  # "train" | "heldout"


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(relpath: str, heldout_frac: float = 0.05) -> str:
    """Held-out iff the first 32 bits of sha256(relpath) fall below heldout_frac (stable across runs)."""
    if not 0.0 <= heldout_frac < 1.0:
        raise ValueError(f"heldout_frac must be in [0, 1), got {heldout_frac}")
    h = int(hashlib.sha256(relpath.encode()).hexdigest()[:8], 16)
    return "heldout" if h / 2**32 < heldout_frac else "train"


def list_stdlib_files(root: Path | None = None) -> list[str]:
    """Sorted relative paths of the stdlib `.py` files, test suites and site-packages excluded."""
    root = Path(root) if root is not None else stdlib_root()
    if not root.is_dir():
        raise FileNotFoundError(f"stdlib directory not found: {root}")
    out = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root)
        if any(part in EXCLUDED_DIRS for part in rel.parts[:-1]) or not p.is_file():
            continue
        out.append(rel.as_posix())
    return sorted(out)


def load_corpus(
    root: Path | None = None, heldout_frac: float = 0.05, max_train_bytes: int | None = None
) -> list[CorpusFile]:
    """Read and split the corpus. Files that fail to decode as UTF-8 are skipped.

    `max_train_bytes` keeps only a deterministic prefix (sorted order) of the train split, for fast sizes;
    held-out files are always all kept.
    """
    root = Path(root) if root is not None else stdlib_root()
    files: list[CorpusFile] = []
    train_bytes = 0
    for rel in list_stdlib_files(root):
        raw = (root / rel).read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if not text.strip():
            continue
        split = split_of(rel, heldout_frac)
        if split == "train" and max_train_bytes is not None:
            if train_bytes >= max_train_bytes:
                continue
            train_bytes += len(raw)
        files.append(CorpusFile(rel, text, hashlib.sha256(raw).hexdigest(), split))
    if not any(f.split == "train" for f in files):
        raise ValueError(f"no training files found under {root}")
    return files


def corpus_manifest(files: list[CorpusFile], root: Path | None = None, heldout_frac: float = 0.05) -> dict[str, Any]:
    """Provenance record: every file with its sha256 and split, plus one hash over all of them."""
    entries = [{"path": f.relpath, "sha256": f.sha256, "split": f.split} for f in files]
    total = hashlib.sha256("".join(f"{e['path']}\0{e['sha256']}\n" for e in entries).encode()).hexdigest()
    return {
        "source": "python-stdlib",
        "root": str(root if root is not None else stdlib_root()),
        "python_version": sys.version.split()[0],
        "heldout_frac": heldout_frac,
        "num_files": len(entries),
        "num_train": sum(e["split"] == "train" for e in entries),
        "num_heldout": sum(e["split"] == "heldout" for e in entries),
        "corpus_sha256": total,
        "files": entries,
    }


def make_prompts(
    files: list[CorpusFile], n: int = 200, seed: int = 0, min_lines: int = 2, max_lines: int = 12,
    min_chars: int = 60, max_chars: int = 600,
) -> list[dict[str, str]]:
    """Cut `n` prompts from held-out files at line boundaries (each ends with a newline).

    Records: {"id": "heldout-0000", "dataset": "stdlib-heldout", "text": ..., "source": relpath}.
    """
    held = [f for f in files if f.split == "heldout"]
    if not held:
        raise ValueError("no held-out files to cut prompts from")
    rng = random.Random(seed)
    prompts: list[dict[str, str]] = []
    seen: set[str] = set()
    attempts = 0
    while len(prompts) < n:
        attempts += 1
        if attempts > 200 * n:
            raise ValueError(f"could only cut {len(prompts)} prompts of the {n} asked for")
        f = held[rng.randrange(len(held))]
        lines = f.text.splitlines(keepends=True)
        k = rng.randint(min_lines, max_lines)
        if len(lines) < k + 5:
            continue
        i = rng.randrange(0, len(lines) - k - 4)  # leave room for a continuation
        text = "".join(lines[i : i + k])
        if not text.endswith("\n"):
            text += "\n"
        if not (min_chars <= len(text) <= max_chars) or not text.strip() or text in seen:
            continue
        seen.add(text)
        prompts.append({"id": f"heldout-{len(prompts):04d}", "dataset": PROMPT_DATASET, "text": text,
                        "source": f.relpath})
    return prompts
