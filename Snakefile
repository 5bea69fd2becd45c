# DDTree experiment pipeline: stage -> build -> benchmark -> aggregate -> report.
# `snakemake --cores all` runs the embedded default on the CPU profile;
# `snakemake --profile gpu-cluster` runs the configured hardware profiles on SLURM.
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/stage.smk"
include: "workflow/rules/build.smk"
include: "workflow/rules/benchmark.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        final_outputs(),
