"""Snakemake script: the `ddtree bench session` plan of one (profile, pair, run)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir)))  # noqa: F821
from _logging import to_log  # noqa: E402

from ddtree.pipeline.config import build_plan, plan_fingerprint, reset_stale_records  # noqa: E402
from ddtree.bench.schema import write_plan  # noqa: E402
from ddtree.jsonl import read_jsonl  # noqa: E402

log = to_log(snakemake.log[0])  # noqa: F821
wc = snakemake.wildcards  # noqa: F821
plan = build_plan(
    snakemake.params.config,  # noqa: F821
    wc.profile,
    snakemake.params.profile,  # noqa: F821
    wc.pair,
    wc.run,
    model_dir=snakemake.params.model_dir,  # noqa: F821
    prompts=snakemake.input.prompts,  # noqa: F821
    num_prompts=len(read_jsonl(snakemake.input.prompts)),  # noqa: F821
    out_dir=snakemake.params.out_dir,  # noqa: F821
    server_log=snakemake.params.server_log,  # noqa: F821
)
# A rerun with the same plan and model resumes from the records; anything else starts afresh.
removed = reset_stale_records(plan, plan_fingerprint(plan, snakemake.input.manifest))  # noqa: F821
for path in removed:
    log.info("removed stale records %s (plan or model changed)", path)
write_plan(snakemake.output.plan, plan)  # noqa: F821
log.info("plan %s: %s", snakemake.output.plan, json.dumps(plan.tags))  # noqa: F821
