"""Snakemake script: tidy tables from every benchmark run's records."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir)))  # noqa: F821
from _logging import to_log  # noqa: E402

from ddtree.pipeline.aggregate import build_tables, load_run_records, load_summaries, write_tables  # noqa: E402

log = to_log(snakemake.log[0])  # noqa: F821
acceptance, throughput = load_run_records(snakemake.input.plans)  # noqa: F821
log.info("%d acceptance and %d throughput records", len(acceptance), len(throughput))
tables = build_tables(
    acceptance,
    throughput,
    summaries=load_summaries(snakemake.input.summaries),  # noqa: F821
    positions=tuple(snakemake.params.positions),  # noqa: F821
    alpha=float(snakemake.params.alpha),  # noqa: F821
)
for path in write_tables(tables, snakemake.params.out_dir):  # noqa: F821
    log.info("wrote %s", path)
