"""Staging model pairs into the pair layout (target/, drafter/, manifest.json).

Shipped embedded pairs (`weights: shipped`) are copied from the package (`ddtree/models/embedded/`)
after every file is checked against the pair's SHA256SUMS; hub pairs are downloaded.

Offline is detected cheaply and up front (HF_HUB_OFFLINE, or a HEAD request to the hub
with a short timeout) so that a configured hub pair fails at once with a message naming
the model and the ways forward, never with a traceback from deep inside a download.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Mapping

DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUTHY = {"1", "true", "yes", "on"}


class HubUnavailableError(RuntimeError):
    """The hub cannot be reached (or is disabled) and the pair is not staged locally."""


def hub_offline_reason(endpoint: str | None = None, timeout_s: float = 3.0) -> str | None:
    """None when the hub answers; otherwise a short reason. One HEAD request at most."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in _TRUTHY:
            return f"{var} is set"
    url = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    import httpx

    try:
        httpx.head(url, timeout=timeout_s, follow_redirects=False)
    except httpx.HTTPError as exc:  # DNS failure, refused connection, timeout
        return f"{url} is unreachable ({type(exc).__name__})"
    return None


def pair_is_staged(pair_dir: str | Path) -> bool:
    """True when the pair directory holds both models in the contract layout."""
    root = Path(pair_dir)
    return (root / "target" / "config.json").is_file() and (root / "drafter" / "config.json").is_file()


def offline_message(pair: str, pair_cfg: Mapping[str, Any], pair_dir: str | Path, reason: str) -> str:
    target = pair_cfg["target"]
    drafter = pair_cfg["drafter"]
    return (
        f"model pair {pair!r} needs {target['repo']}@{target['revision']} (target) and "
        f"{drafter['repo']}@{drafter['revision']} (drafter) from the Hugging Face hub, "
        f"but the hub is not available: {reason}.\n"
        f"To proceed, either:\n"
        f"  - go online (and set HF_TOKEN for gated models such as {drafter['repo']}), or\n"
        f"  - pre-download both into {Path(pair_dir)}/target and {Path(pair_dir)}/drafter "
        f"(e.g. `hf download {target['repo']} --revision {target['revision']} --local-dir "
        f"{Path(pair_dir)}/target`), or\n"
        f"  - pick the embedded pair: --config pairs='[embedded-small]'"
    )


def ensure_hub_available(
    pair: str, pair_cfg: Mapping[str, Any], pair_dir: str | Path, *, timeout_s: float = 3.0
) -> None:
    """Raise HubUnavailableError with the full how-to message when staging cannot work."""
    if pair_is_staged(pair_dir):
        return
    reason = hub_offline_reason(timeout_s=timeout_s)
    if reason is not None:
        raise HubUnavailableError(offline_message(pair, pair_cfg, pair_dir, reason))


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download(repo: str, revision: str, local_dir: Path, repo_type: str = "model") -> str:
    from huggingface_hub import snapshot_download

    local_dir.mkdir(parents=True, exist_ok=True)
    path = snapshot_download(
        repo_id=repo,
        revision=revision,
        repo_type=repo_type,
        local_dir=str(local_dir),
        token=os.environ.get("HF_TOKEN") or None,
    )
    return str(path)


def stage_hub_pair(pair: str, pair_cfg: Mapping[str, Any], pair_dir: str | Path) -> dict[str, Any]:
    """Download target and drafter at their pinned revisions; write manifest.json; return it."""
    root = Path(pair_dir)
    ensure_hub_available(pair, pair_cfg, root)
    started = time.time()
    parts: dict[str, Any] = {}
    for part in ("target", "drafter"):
        spec = pair_cfg[part]
        if not (root / part / "config.json").is_file():
            _download(spec["repo"], spec["revision"], root / part)
        config_file = root / part / "config.json"
        parts[part] = {
            "repo": spec["repo"],
            "revision": spec["revision"],
            "config_sha256": file_sha256(config_file),
        }
    manifest = {
        "pair": pair,
        "source": "hub",
        "models": parts,
        "staged_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "stage_seconds": round(time.time() - started, 3),
    }
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def ensure_dataset_available(
    name: str, dataset_cfg: Mapping[str, Any], out_dir: str | Path, *, timeout_s: float = 3.0
) -> None:
    """Raise HubUnavailableError naming the dataset when it is not local and the hub is unreachable."""
    if (Path(out_dir) / dataset_cfg["file"]).is_file():
        return
    reason = hub_offline_reason(timeout_s=timeout_s)
    if reason is not None:
        raise HubUnavailableError(
            f"dataset {name!r} needs {dataset_cfg['repo']}@{dataset_cfg['revision']} from the Hugging Face hub, "
            f"but the hub is not available: {reason}.\nTo proceed, go online, or place "
            f"{dataset_cfg['file']} under {Path(out_dir)}, or drop {name!r} from 'datasets'."
        )


def stage_hub_dataset(name: str, dataset_cfg: Mapping[str, Any], out_dir: str | Path) -> Path:
    """Download one file of a hub dataset at its pinned revision; return its local path."""
    from huggingface_hub import hf_hub_download

    local = Path(out_dir) / dataset_cfg["file"]
    if local.is_file():
        return local
    ensure_dataset_available(name, dataset_cfg, out_dir)
    path = hf_hub_download(
        repo_id=dataset_cfg["repo"],
        filename=dataset_cfg["file"],
        revision=dataset_cfg["revision"],
        repo_type="dataset",
        local_dir=str(out_dir),
        token=os.environ.get("HF_TOKEN") or None,
    )
    return Path(path)


SHIPPED_ROOT = Path(__file__).resolve().parents[1] / "models" / "embedded"
CHECKSUMS = "SHA256SUMS"


class ShippedPairError(RuntimeError):
    """A shipped pair is missing or a file does not match its recorded sha256."""


def shipped_pair_dir(size: str, seed: int) -> Path:
    """Where the package keeps the trained `size` pair of `seed` (`ddtree train-pair` reproduces it)."""
    return SHIPPED_ROOT / f"{size}-seed{int(seed)}"


def write_checksums(pair_dir: str | Path) -> Path:
    """SHA256SUMS (sha256sum format, sorted relative paths) over every file of a pair directory."""
    root = Path(pair_dir)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != CHECKSUMS)
    lines = [f"{file_sha256(p)}  {p.relative_to(root).as_posix()}" for p in files]
    out = root / CHECKSUMS
    out.write_text("\n".join(lines) + "\n")
    return out


def verify_checksums(pair_dir: str | Path) -> dict[str, str]:
    """{relative path: sha256} of a pair directory, after checking every file against its SHA256SUMS.

    Raises ShippedPairError naming the first missing or changed file (a file not listed is an error
    too: the pair would not be the one that was recorded)."""
    root = Path(pair_dir)
    sums = root / CHECKSUMS
    if not sums.is_file():
        raise ShippedPairError(f"{sums} is missing: {root} is not a shipped pair")
    recorded: dict[str, str] = {}
    for line in sums.read_text().splitlines():
        digest, _, rel = line.partition("  ")
        recorded[rel] = digest
    present = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name != CHECKSUMS}
    for rel in sorted(set(recorded) | present):
        if rel not in present:
            raise ShippedPairError(f"shipped pair {root}: {rel} is listed in {CHECKSUMS} but missing")
        if rel not in recorded:
            raise ShippedPairError(f"shipped pair {root}: {rel} is not listed in {CHECKSUMS}")
        actual = file_sha256(root / rel)
        if actual != recorded[rel]:
            raise ShippedPairError(f"shipped pair {root}: {rel} has sha256 {actual}, recorded {recorded[rel]}")
    return recorded


def stage_shipped_pair(size: str, seed: int, pair_dir: str | Path) -> dict[str, Any]:
    """Copy the verified shipped pair (SHA256SUMS included) into `pair_dir`, check the copy again and
    return its manifest (the one `ddtree train-pair` wrote when the pair was trained)."""
    import shutil

    source = shipped_pair_dir(size, seed)
    if not source.is_dir():
        raise ShippedPairError(
            f"no shipped {size!r} pair for seed {seed} under {SHIPPED_ROOT}; set `weights: train` for this "
            f"pair (the job then runs `ddtree train-pair --size {size} --seed {seed}`)"
        )
    verify_checksums(source)
    root = Path(pair_dir)
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(source, root)
    verify_checksums(root)
    return json.loads((root / "manifest.json").read_text())
