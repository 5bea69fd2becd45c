"""Environment record stored beside the tables: what produced these numbers."""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

PACKAGES = (
    "ddtree", "torch", "transformers", "tokenizers", "safetensors", "huggingface_hub", "numpy", "pandas",
    "scipy", "fastapi", "uvicorn", "httpx", "snakemake", "papermill", "seaborn", "sglang",
)


def package_versions(names: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_revision(repo_dir: str | Path) -> dict[str, Any]:
    """Commit of the checkout and whether tracked files differ from it (None outside git)."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=repo_dir, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def device_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": __import__("os").cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
        "gpus": [],
    }
    if torch.cuda.is_available():
        info["cuda"] = torch.version.cuda
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def manifest_hash(pair_dir: str | Path) -> dict[str, Any]:
    """sha256 of a pair's manifest.json and its corpus hash (the manifest's own, else of its corpus entry)."""
    path = Path(pair_dir) / "manifest.json"
    if not path.is_file():
        return {"manifest_sha256": None, "corpus_sha256": None, "training": None}
    raw = path.read_bytes()
    manifest = json.loads(raw)
    corpus = manifest.get("corpus")
    if isinstance(corpus, dict) and corpus.get("corpus_sha256"):
        corpus_hash = str(corpus["corpus_sha256"])  # the trainer's own hash of its corpus files
    elif corpus is not None:
        corpus_hash = hashlib.sha256(json.dumps(corpus, sort_keys=True).encode()).hexdigest()
    else:
        corpus_hash = None
    return {"manifest_sha256": hashlib.sha256(raw).hexdigest(), "corpus_sha256": corpus_hash,
            "training": training_summary(manifest)}


def training_summary(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """What the report's header needs from an embedded pair's manifest (None for hub pairs): whether it was
    trained to its schedule, why not, and the steps reached per phase."""
    training = manifest.get("training")
    if not isinstance(training, dict):
        return None
    phases = {name: training.get(name) or {} for name in ("target", "drafter")}
    stopped = {name: phase.get("stopped_by") for name, phase in phases.items()}
    # manifests written before `complete` existed: complete iff no phase stopped on its wall-clock limit
    complete = training.get("complete", all(v in (None, "max_steps") for v in stopped.values()))
    reason = training.get("incomplete_reason")
    if not complete and not reason:
        reason = "; ".join(f"the {name} stopped at step {phases[name].get('steps')} ({stopped[name]})"
                           for name in phases if stopped[name] not in (None, "max_steps"))
    return {"complete": bool(complete), "incomplete_reason": reason,
            "target_steps": phases["target"].get("steps"), "drafter_steps": phases["drafter"].get("steps"),
            "target_heldout_loss": phases["target"].get("heldout_loss")}


def collect_environment(repo_dir: str | Path, pair_dirs: dict[str, str | Path]) -> dict[str, Any]:
    return {
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": package_versions(),
        "device": device_info(),
        "git": git_revision(repo_dir),
        "pairs": {name: manifest_hash(path) for name, path in pair_dirs.items()},
    }


def environment_rows(env: dict[str, Any]) -> list[dict[str, Any]]:
    """Flatten the record into (key, value) rows for a tidy table."""
    rows: list[dict[str, Any]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        else:
            rows.append({"key": prefix, "value": json.dumps(value) if not isinstance(value, str) else value})

    walk("", env)
    return rows
