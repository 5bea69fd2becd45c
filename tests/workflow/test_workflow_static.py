"""Lint, cluster dry run, configuration rejection and environment consistency (no training)."""

from __future__ import annotations

import re
import shutil
import tomllib

import pytest
import yaml

from workflow_helpers import REPO, snakemake

ALL_PROFILES = "hardware=[cpu,h200-x1,rtx-pro-6000-x8,b300-x8]"


def test_lint_is_clean(workdir):
    done = snakemake(workdir, "--lint")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Congratulations, your workflow is in a good condition" in done.stdout + done.stderr


def test_default_dry_run_plans_every_stage(workdir):
    done = snakemake(workdir, "-n", "--cores", "1")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    for rule in ("stage_shipped_pair", "selfcheck", "prepare_prompts", "plan", "benchmark", "aggregate",
                 "environment", "profile_report", "summary_report"):
        assert re.search(rf"^{rule}\s+\d+", out, re.M), rule
    # ar and dflash once, ddtree once per budget (never ar/dflash x budgets), plus one power-panel run per
    # lossy verifier.
    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    lossy = len(config["lossless"]["power_panel"]["verifiers"])
    assert lossy >= 1
    assert re.search(rf"^benchmark\s+{2 + len(config['budgets']) + lossy}$", out, re.M)


def test_cluster_profile_dry_run_maps_hardware_resources(workdir):
    # Works without SLURM. Snakemake's dry run asks `conda info` when the profile deploys conda
    # envs; where conda itself is absent (CI), the deployment method alone is swapped out.
    profile = yaml.safe_load((workdir / "gpu-cluster" / "config.v8+.yaml").read_text())
    assert profile["executor"] == "slurm" and profile["software-deployment-method"] == "conda"
    no_conda = [] if shutil.which("conda") else ["--software-deployment-method", "env-modules"]
    done = snakemake(workdir, "--profile", "gpu-cluster", "-n", *no_conda, "--config", ALL_PROFILES)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    for profile in ("cpu", "h200-x1", "rtx-pro-6000-x8", "b300-x8"):
        hw = yaml.safe_load((REPO / "config" / "hardware" / f"{profile}.yaml").read_text())["resources"]
        block = re.search(
            rf"rule benchmark:.*?wildcards: profile={re.escape(profile)},.*?resources: ([^\n]*)", out, re.S
        )
        assert block, profile
        resources = dict(item.split("=", 1) for item in block.group(1).split(", "))
        assert resources["slurm_partition"] == hw["partition"]
        assert resources["gpu"] == str(hw["gpus"])
        assert resources["gpu_model"] == (hw["gpu_model"] or "")
        assert resources["cpus_per_task"] == str(hw["cpus"])
        assert resources["mem_mb"] == str(hw["mem_mb"])
        assert resources["runtime"] == str(hw["runtime_min"])


@pytest.mark.parametrize(
    "args, needles",
    [
        (["--config", "colour=blue"], ["colour", "Additional properties are not allowed"]),
        (["--config", "budgets=lots"], ["budgets", "is not of type 'array'"]),
        (["--config", "acceptance={max_new_tokens: many}"], ["max_new_tokens", "many"]),
        (["--config", "hardware=[gb200]"], ["hardware profile 'gb200' is unknown"]),
        (["--config", "pairs=[nope]"], ["pairs: 'nope'"]),
    ],
)
def test_bad_configuration_is_rejected_naming_it(workdir, args, needles):
    done = snakemake(workdir, "-n", "--cores", "1", *args)
    out = done.stdout + done.stderr
    assert done.returncode != 0
    for needle in needles:
        assert needle in out, (needle, out[-3000:])


def test_bad_hardware_profile_is_rejected_naming_file_and_key(workdir):
    cpu = yaml.safe_load((workdir / "config/hardware/cpu.yaml").read_text())
    cpu["resources"]["gpu_count"] = 2
    (workdir / "config/hardware/broken.yaml").write_text(yaml.safe_dump(cpu))
    done = snakemake(workdir, "-n", "--cores", "1", "--config", "hardware=[broken]")
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "config/hardware/broken.yaml" in out and "gpu_count" in out


def test_hub_pair_offline_fails_at_once_with_how_to(workdir):
    done = snakemake(workdir, "-n", "--cores", "1", "--config", "pairs=[qwen3-8b]", env={"HF_HUB_OFFLINE": "1"},
                     timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode != 0
    for needle in ("qwen3-8b", "Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", "HF_TOKEN",
                   "resources/models/qwen3-8b", "embedded"):
        assert needle in out, needle
    assert "Traceback" not in out


def test_pre_downloaded_hub_pair_needs_no_hub(workdir):
    for part in ("target", "drafter"):
        (workdir / "resources/models/qwen3-8b" / part).mkdir(parents=True)
        (workdir / "resources/models/qwen3-8b" / part / "config.json").write_text("{}")
    done = snakemake(workdir, "-n", "--cores", "1", "--config", "pairs=[qwen3-8b]", "datasets=[humaneval]",
                     env={"HF_HUB_OFFLINE": "1"}, timeout=60)
    out = done.stdout + done.stderr
    # The pair is usable offline; the (not downloaded) dataset is what is reported missing.
    assert "model pair 'qwen3-8b'" not in out
    assert "dataset 'humaneval'" in out


def test_schema_fills_defaults():
    from snakemake.utils import validate

    config = {
        "model_pairs": {"p": {"source": "embedded"}},
        "dataset_catalog": {"d": {"source": "embedded"}},
        "variants": [{"name": "greedy", "temperature": 0.0}],
    }
    validate(config, str(REPO / "workflow/schemas/config.schema.yaml"))
    assert config["hardware"] == ["cpu"] and config["methods"] == ["ar", "dflash", "ddtree"]
    assert config["variants"][0]["top_k"] == -1 and config["variants"][0]["top_p"] == 1.0
    assert config["model_pairs"]["p"]["size"] == "small"
    assert config["acceptance"]["num_prompts"] >= 1 and config["lossless"]["alpha"] == 0.01
    profile = {"engine": "reference", "device": "cpu", "dtype": "float32",
               "resources": {"partition": "cpu", "gpu_model": None, "gpus": 0, "cpus": 2, "mem_mb": 4000,
                             "runtime_min": 10}}
    validate(profile, str(REPO / "workflow/schemas/hardware.schema.yaml"))
    assert profile["tensor_parallel_size"] == 1 and profile["server_args"] == []


def test_hub_dataset_offline_fails_at_once_naming_it(workdir):
    done = snakemake(workdir, "-n", "--cores", "1", "--config", "datasets=[stdlib-heldout,humaneval]",
                     env={"HF_HUB_OFFLINE": "1"}, timeout=60)
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert "dataset 'humaneval' needs openai/openai_humaneval" in out and "drop 'humaneval'" in out


def _requirements(lines):
    reqs = {}
    for line in lines:
        match = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*(.*)$", line.strip())
        if match and not line.strip().startswith("-"):
            reqs[match.group(1).lower().replace("_", "-")] = match.group(3).replace(" ", "")
    return reqs


@pytest.mark.parametrize("env_file, editable", [("environment.yml", "-e .[pipeline,test]"),
                                                ("workflow/envs/ddtree.yaml", "-e ../..[pipeline,test]")])
def test_environment_files_match_pyproject(env_file, editable):
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = _requirements(project["dependencies"] + project["optional-dependencies"]["pipeline"]
                           + project["optional-dependencies"]["test"])
    env = yaml.safe_load((REPO / env_file).read_text())
    deps = env["dependencies"]
    assert "python=3.11" in deps and "pip" in deps
    pip = next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)
    assert editable in pip, "the package must be installed into the env (not via PYTHONPATH)"
    have = _requirements(pip)
    for name, spec in wanted.items():
        assert name in have, f"{env_file}: {name} from pyproject.toml is missing"
        assert have[name] == spec, f"{env_file}: {name} is {have[name]!r}, pyproject.toml says {spec!r}"


def _readme_commands():
    readme = (REPO / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", quick, re.S)


def test_readme_has_exactly_two_quick_start_commands_and_ci_runs_the_test_one():
    commands = _readme_commands()
    assert len(commands) == 2 and all("\n" not in c for c in commands)
    main, tests = commands
    assert "snakemake --cores all" in main and "pytest" in tests
    ci = (REPO / ".ci" / "run").read_text()
    # the pinned torch and sglang for the CPU come first (the sglang tests run against the real package)
    assert "set -euo pipefail" in ci and "bash .ci/install-sglang-cpu.sh" in ci
    lines = [line for line in ci.splitlines() if line and not line.startswith("#")]
    assert lines[-1] == tests
    assert lines.index("bash .ci/install-sglang-cpu.sh") < lines.index(tests)
    install = (REPO / ".ci" / "install-sglang-cpu.sh").read_text()
    assert "torch==2.14.1" in install and "sglang==0.5.23" in install



def test_sglang_profile_dry_run_lists_ddtree_and_prints_the_plugin_check(workdir):
    done = snakemake(workdir, "-n", "-p", "--cores", "1", "--config", "hardware=[b300-x8]")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    from ddtree.pipeline.config import power_panel_runs

    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    budgets = config["budgets"]
    for run in ["ar", "dflash", *(f"ddtree-b{b}" for b in budgets)]:
        assert re.search(rf"rule benchmark:.*?wildcards: profile=b300-x8, pair=[^,]+, run={re.escape(run)}\b", out, re.S), run
    # plus the report's power panel (deliberately lossy verifiers, on the same profile)
    assert re.search(rf"^benchmark\s+{2 + len(budgets) + len(power_panel_runs(config))}$", out, re.M)
    assert "skipped" not in out
    assert re.search(r"check the DDTREE plugin on the GPU host first with: python -m ddtree\.sglang\.check "
                     r"--model resources/models/\S+ --budget \d+ -- .*--tp-size 8", out), out[-3000:]


def test_h200_profile_benchmarks_the_gpu_pair_trained_on_its_gpu(workdir):
    """h200-x1 replaces the CPU pair by embedded-gpu, which trains with --device cuda on the profile's GPU
    resources; the cpu profile keeps embedded-small, trained on the CPU."""
    no_conda = [] if shutil.which("conda") else ["--software-deployment-method", "env-modules"]
    done = snakemake(workdir, "--profile", "gpu-cluster", "-n", "-p", *no_conda, "--config", "hardware=[cpu,h200-x1]")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "results/h200-x1/embedded-gpu/" in out and "results/h200-x1/embedded-small/" not in out
    assert "results/cpu/embedded-small/" in out
    assert re.search(r"train-pair --size gpu .*--device cuda", out)
    # the cpu profile's embedded-small ships trained: it is copied after its hash check, never trained here
    assert re.search(r"rule stage_shipped_pair:.*?wildcards: shipped_pair=embedded-small", out, re.S), out[-3000:]
    assert "train-pair --size small" not in out
    hw = yaml.safe_load((REPO / "config" / "hardware" / "h200-x1.yaml").read_text())["resources"]
    block = re.search(r"rule train_embedded_pair:.*?wildcards: embedded_pair=embedded-gpu.*?resources: ([^\n]*)",
                      out, re.S)
    assert block, out[-3000:]
    resources = dict(item.split("=", 1) for item in block.group(1).split(", "))
    assert resources["slurm_partition"] == hw["partition"] and resources["gpu"] == str(hw["gpus"])
    assert resources["gpu_model"] == hw["gpu_model"]


def test_config_schema_methods_are_the_engines_methods():
    """The schema (config, YAML) lists the methods again; it must name the code's one list, in its order."""
    from ddtree.engine.types import METHODS

    methods = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())["properties"]["methods"]
    assert methods["items"]["enum"] == list(METHODS) and methods["default"] == list(METHODS)
