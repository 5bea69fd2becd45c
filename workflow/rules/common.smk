# Imports, configuration and hardware-profile validation, and the helper functions every
# rule uses (no lambdas in rules). Reusable logic lives in the tested `ddtree.pipeline`.
import re
import shlex
from pathlib import Path

import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from ddtree.pipeline import config as pipeline_config
from ddtree.pipeline import stage as pipeline_stage


validate(config, "../schemas/config.schema.yaml")

HARDWARE_DIR = Path("config/hardware")
# Software of every job under --software-deployment-method conda: the dependencies of
# environment.yml with the package installed editable. Snakemake copies env files into
# .snakemake/conda/ before creating them, so that file's `-e ../..` points at the repo root
# (environment.yml's own `-e .` would point into .snakemake/conda/).
CONDA_ENV = "../envs/ddtree.yaml"
AVAILABLE_PROFILES = sorted(p.stem for p in HARDWARE_DIR.glob("*.yaml"))

try:
    pipeline_config.check_references(config, AVAILABLE_PROFILES)
except ValueError as exc:
    raise WorkflowError(f"config: {exc}") from None


def _load_profile(name):
    path = HARDWARE_DIR / f"{name}.yaml"
    data = yaml.safe_load(path.read_text()) or {}
    try:
        validate(data, "../schemas/hardware.schema.yaml")
        pipeline_config.check_hardware_profile(name, data)
    except (WorkflowError, ValueError) as exc:
        raise WorkflowError(f"hardware profile {path}: {exc}") from None
    return data


HARDWARE = {name: _load_profile(name) for name in config["hardware"]}
try:
    # the pairs each profile benchmarks (its replace_pairs applied), and every pair any profile uses
    PROFILE_PAIRS = {
        name: pipeline_config.profile_pairs(config["pairs"], name, profile, config["model_pairs"])
        for name, profile in HARDWARE.items()
    }
except ValueError as exc:
    raise WorkflowError(f"config: {exc}") from None
USED_PAIRS = list(dict.fromkeys(pair for pairs in PROFILE_PAIRS.values() for pair in pairs))
PAIRS = {name: config["model_pairs"][name] for name in USED_PAIRS}
# embedded pairs are trained by the workflow, or shipped trained in the package (copied after a hash check)
EMBEDDED_PAIRS = [
    name for name, pair in PAIRS.items() if pair["source"] == "embedded" and pair.get("weights", "train") == "train"
]
SHIPPED_PAIRS = [
    name for name, pair in PAIRS.items() if pair["source"] == "embedded" and pair.get("weights", "train") == "shipped"
]
try:
    # the hardware profile that trains each trained embedded pair (its device and cluster resources)
    TRAIN_PROFILES = {
        name: _load_profile(pipeline_config.train_profile(name, PAIRS[name], AVAILABLE_PROFILES))
        for name in EMBEDDED_PAIRS
    }
except ValueError as exc:
    raise WorkflowError(f"config: {exc}") from None
HUB_PAIRS = [name for name, pair in PAIRS.items() if pair["source"] == "hub"]
DATASETS = {name: config["dataset_catalog"][name] for name in config["datasets"]}
HUB_DATASETS = [name for name, ds in DATASETS.items() if ds["source"] == "hub"]
RUNS = pipeline_config.run_ids(config["methods"], config["budgets"]) + pipeline_config.power_panel_runs(config)

# A configured hub pair or dataset that is not staged yet fails here, at once, when the hub is
# unreachable.
for _pair in HUB_PAIRS:
    try:
        pipeline_stage.ensure_hub_available(_pair, PAIRS[_pair], f"resources/models/{_pair}")
    except pipeline_stage.HubUnavailableError as exc:
        raise WorkflowError(str(exc)) from None
for _name in HUB_DATASETS:
    if not Path(f"resources/datasets/{_name}/staged.json").is_file():
        try:
            pipeline_stage.ensure_dataset_available(_name, DATASETS[_name], f"resources/datasets/{_name}")
        except pipeline_stage.HubUnavailableError as exc:
            raise WorkflowError(str(exc)) from None


def names_regex(names):
    """Wildcard constraint matching exactly the given names (nothing when empty)."""
    return "|".join(re.escape(n) for n in names) if names else "(?!x)x"


wildcard_constraints:
    profile=names_regex(config["hardware"]),
    pair=names_regex(USED_PAIRS),
    embedded_pair=names_regex(EMBEDDED_PAIRS),
    shipped_pair=names_regex(SHIPPED_PAIRS),
    hub_pair=names_regex(HUB_PAIRS),
    dataset=names_regex(HUB_DATASETS),
    run=names_regex(RUNS),


# ------------------------------------------------------------------ paths


def pair_dir(pair):
    return f"resources/models/{pair}"


def pair_manifest(wildcards):
    return f"{pair_dir(wildcards.pair)}/manifest.json"


def run_dir(profile, pair, run):
    return f"results/{profile}/{pair}/{run}"


def hub_dataset_markers(wildcards):
    return [f"resources/datasets/{name}/staged.json" for name in HUB_DATASETS]


def selfcheck_file(wildcards):
    return f"results/{wildcards.profile}/build/selfcheck.json"


def all_plans():
    return [
        f"{run_dir(profile, pair, run)}/plan.json"
        for profile in config["hardware"]
        for pair in PROFILE_PAIRS[profile]
        for run in RUNS
    ]


def all_summaries():
    return [p.replace("plan.json", "summary.json") for p in all_plans()]


TABLES = list(pipeline_config.TABLE_NAMES)


def table_files():
    return [f"results/tables/{name}.{ext}" for name in TABLES for ext in ("parquet", "csv")]


def aggregate_tables():
    return [f for f in table_files() if Path(f).stem != "environment"]


def output_parent(wildcards, output):
    return str(Path(output[0]).parent)


def final_outputs():
    return (
        [f"results/reports/{profile}.html" for profile in config["hardware"]]
        + ["results/reports/summary.html"]
        + table_files()
    )


# ------------------------------------------------------------------ rule parameters


def embedded_size(wildcards):
    return PAIRS[wildcards.embedded_pair]["size"]


def embedded_seed(wildcards):
    return PAIRS[wildcards.embedded_pair]["seed"]


def train_device(wildcards):
    return TRAIN_PROFILES[wildcards.embedded_pair]["device"]


def _train_resources(wildcards):
    return TRAIN_PROFILES[wildcards.embedded_pair]["resources"]


def train_res_partition(wildcards):
    return _train_resources(wildcards)["partition"]


def train_res_account(wildcards):
    return _train_resources(wildcards).get("account") or ""


def train_res_gpus(wildcards):
    return int(_train_resources(wildcards)["gpus"])


def train_res_gpu_model(wildcards):
    return _train_resources(wildcards)["gpu_model"] or ""


def train_res_mem_mb(wildcards):
    return int(_train_resources(wildcards)["mem_mb"])


def train_options(wildcards):
    """Optional `ddtree train-pair` arguments of an embedded pair."""
    spec = PAIRS[wildcards.embedded_pair]
    options = [f"--max-minutes {spec['max_minutes']}"] if spec.get("max_minutes") else []
    evals = int(spec["eval_prompts"])
    options.append(f"--eval-prompts {evals}" if evals > 0 else "--no-eval")
    return " ".join(options)


def profile_device(wildcards):
    return HARDWARE[wildcards.profile]["device"]


def sglang_check_notice(wildcards):
    """Shell suffix of the build step: on an SGLang profile, print (and log) the one command to run first on
    the GPU host to check the DDTREE plugin end to end; nothing elsewhere."""
    profile = HARDWARE[wildcards.profile]
    if profile["engine"] != "sglang":
        return ""
    command = pipeline_config.sglang_check_command(
        profile, pair_dir(config["pairs"][0]), min(config["budgets"] or [64])
    )
    message = f"SGLang profile {wildcards.profile}: check the DDTREE plugin on the GPU host first with: {command}"
    return f"; echo {shlex.quote(message)} | tee -a results/logs/build/{wildcards.profile}.log"


def profile_threads(wildcards):
    return int(HARDWARE[wildcards.profile]["threads"])


def dataset_spec(wildcards):
    return DATASETS[wildcards.dataset]


def report_parameters(wildcards):
    """papermill -p arguments of the per-profile report (quoted for the shell)."""
    return f"-p profile {wildcards.profile} -p tables_dir results/tables"


# ------------------------------------------------------------------ cluster resources
# Read from the hardware profile of the job's {profile} wildcard: the one place that says
# which partition, GPU model and GPU count a profile gets. The SLURM executor maps
# slurm_partition/gpu/gpu_model/cpus_per_task/mem_mb/runtime onto sbatch.


def _resources(wildcards):
    return HARDWARE[wildcards.profile]["resources"]


def res_partition(wildcards):
    return _resources(wildcards)["partition"]


def res_account(wildcards):
    return _resources(wildcards).get("account") or ""


def res_gpus(wildcards):
    return int(_resources(wildcards)["gpus"])


def res_gpu_model(wildcards):
    return _resources(wildcards)["gpu_model"] or ""


def res_cpus(wildcards):
    return int(_resources(wildcards)["cpus"])


def res_mem_mb(wildcards):
    return int(_resources(wildcards)["mem_mb"])


def res_runtime(wildcards):
    return int(_resources(wildcards)["runtime_min"])



def shipped_pair_spec(wildcards):
    return PAIRS[wildcards.shipped_pair]


def hub_pair_spec(wildcards):
    return PAIRS[wildcards.hub_pair]


def pair_spec(wildcards):
    return PAIRS[wildcards.pair]


def profile_spec(wildcards):
    return HARDWARE[wildcards.profile]


def pair_dir_of(wildcards):
    return pair_dir(wildcards.pair)
