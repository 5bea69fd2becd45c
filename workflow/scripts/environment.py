"""Snakemake script: the environment record (versions, device, git revision, corpus hashes)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir)))  # noqa: F821
from _logging import to_log  # noqa: E402

import pandas as pd  # noqa: E402

from ddtree.pipeline.envinfo import collect_environment, environment_rows  # noqa: E402

log = to_log(snakemake.log[0])  # noqa: F821
env = collect_environment(Path.cwd(), dict(snakemake.params.pairs))  # noqa: F821
env["selfchecks"] = {path: json.loads(Path(path).read_text()) for path in snakemake.input.selfchecks}  # noqa: F821
Path(snakemake.output.env).write_text(json.dumps(env, indent=2, default=str) + "\n")  # noqa: F821
frame = pd.DataFrame(environment_rows({k: v for k, v in env.items() if k != "selfchecks"}))
frame.to_parquet(snakemake.output.parquet, index=False)  # noqa: F821
frame.to_csv(snakemake.output.csv, index=False)  # noqa: F821
log.info("environment: git %s, torch %s", env["git"], env["packages"]["torch"])
