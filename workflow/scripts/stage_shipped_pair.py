"""Snakemake script: copy a shipped embedded pair into resources/models/<pair>/, checking its SHA256SUMS."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir)))  # noqa: F821 (injected by Snakemake)
from _logging import to_log  # noqa: E402

from ddtree.pipeline.stage import ShippedPairError, stage_shipped_pair  # noqa: E402

log = to_log(snakemake.log[0])  # noqa: F821
spec = snakemake.params.spec  # noqa: F821
try:
    manifest = stage_shipped_pair(spec["size"], spec["seed"], Path(snakemake.output.manifest).parent)  # noqa: F821
except ShippedPairError as exc:
    log.error("%s", exc)
    sys.exit(1)
training = manifest["training"]
log.info("staged shipped %s pair (seed %s): every file matches SHA256SUMS; trained to its schedule: %s",
         spec["size"], spec["seed"], training.get("complete"))
