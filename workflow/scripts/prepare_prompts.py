"""Snakemake script: the prompts of one pair, `num_prompts` per selected dataset."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir)))  # noqa: F821
from _logging import to_log  # noqa: E402

from ddtree.pipeline.prompts import (  # noqa: E402
    apply_chat_template,
    load_embedded_prompts,
    load_table_prompts,
    select_prompts,
)
from ddtree.jsonl import write_jsonl  # noqa: E402

log = to_log(snakemake.log[0])  # noqa: F821
pair_dir = Path(snakemake.input.manifest).parent  # noqa: F821
pair_spec = snakemake.params.pair_spec  # noqa: F821
num_prompts = int(snakemake.params.num_prompts)  # noqa: F821
prompts = []
for name, spec in snakemake.params.datasets.items():  # noqa: F821
    if spec["source"] == "embedded":
        if pair_spec["source"] != "embedded":
            log.warning("dataset %s is embedded-only: skipped for hub pair %s", name, pair_dir.name)
            continue
        rows = load_embedded_prompts(pair_dir, name)
    else:
        marker = json.loads(Path(f"resources/datasets/{name}/staged.json").read_text())
        rows = load_table_prompts(marker["path"], name, spec["text_field"], spec.get("id_field"))
        if pair_spec.get("chat_template"):
            rows = apply_chat_template(rows, pair_dir / "target")
    chosen = select_prompts(rows, num_prompts)
    log.info("dataset %s: %d of %d prompts", name, len(chosen), len(rows))
    prompts.extend(chosen)
if not prompts:
    log.error("no prompts for pair %s: select a dataset it supports", pair_dir.name)
    sys.exit(1)
write_jsonl(snakemake.output.prompts, prompts)  # noqa: F821
