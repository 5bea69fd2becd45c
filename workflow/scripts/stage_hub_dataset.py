"""Snakemake script: download one file of a hub dataset at its pinned revision."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir)))  # noqa: F821
from _logging import to_log  # noqa: E402

from ddtree.pipeline.stage import HubUnavailableError, file_sha256, stage_hub_dataset  # noqa: E402

log = to_log(snakemake.log[0])  # noqa: F821
name = snakemake.wildcards.dataset  # noqa: F821
spec = snakemake.params.spec  # noqa: F821
marker = Path(snakemake.output.marker)  # noqa: F821
try:
    path = stage_hub_dataset(name, spec, marker.parent)
except HubUnavailableError as exc:
    log.error("%s", exc)
    sys.exit(1)
marker.write_text(json.dumps({**spec, "path": str(path), "sha256": file_sha256(path)}, indent=2) + "\n")
log.info("staged dataset %s at %s", name, path)
