"""Snakemake script: stage a hub model pair at its pinned revisions."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir)))  # noqa: F821 (injected by Snakemake)
from _logging import to_log  # noqa: E402

from ddtree.pipeline.stage import HubUnavailableError, stage_hub_pair  # noqa: E402

log = to_log(snakemake.log[0])  # noqa: F821
pair = snakemake.wildcards.hub_pair  # noqa: F821
try:
    manifest = stage_hub_pair(pair, snakemake.params.spec, Path(snakemake.output.manifest).parent)  # noqa: F821
except HubUnavailableError as exc:
    log.error("%s", exc)
    sys.exit(1)
log.info("staged %s: %s", pair, manifest["models"])
