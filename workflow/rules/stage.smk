# Stage 1: model pairs into resources/models/<pair>/ (target/, drafter/, manifest.json) and
# opt-in hub datasets into resources/datasets/<name>/. An embedded pair is either shipped
# (`weights: shipped`: copied from the package, every file checked against its SHA256SUMS) or
# trained here (`weights: train`; `ddtree train-pair` exits non-zero when a wall-clock limit cut
# its step schedule short, so a shortened pair never reaches the benchmarks).


rule stage_shipped_pair:
    output:
        manifest="resources/models/{shipped_pair}/manifest.json",
    params:
        spec=shipped_pair_spec,
    log:
        "results/logs/stage/{shipped_pair}.log",
    conda:
        CONDA_ENV
    script:
        "../scripts/stage_shipped_pair.py"


rule train_embedded_pair:
    output:
        manifest="resources/models/{embedded_pair}/manifest.json",
    params:
        size=embedded_size,
        seed=embedded_seed,
        options=train_options,
        device=train_device,
        out=subpath(output.manifest, parent=True),
    log:
        "results/logs/stage/{embedded_pair}.log",
    threads: 8
    # where it trains: the pair's train_profile (default cpu; embedded-gpu: h200-x1); cpus and runtime
    # come from the cluster profile's set-resources
    resources:
        slurm_partition=train_res_partition,
        slurm_account=train_res_account,
        gpu=train_res_gpus,
        gpu_model=train_res_gpu_model,
        mem_mb=train_res_mem_mb,
    conda:
        CONDA_ENV
    shell:
        "ddtree train-pair --size {params.size} --seed {params.seed} --out {params.out} --device {params.device} "
        "--threads {threads} --no-progress {params.options} > {log} 2>&1"


rule stage_hub_pair:
    output:
        manifest="resources/models/{hub_pair}/manifest.json",
    params:
        spec=hub_pair_spec,
    log:
        "results/logs/stage/{hub_pair}.log",
    conda:
        CONDA_ENV
    script:
        "../scripts/stage_hub_pair.py"


rule stage_hub_dataset:
    output:
        marker="resources/datasets/{dataset}/staged.json",
    params:
        spec=dataset_spec,
    log:
        "results/logs/stage/dataset-{dataset}.log",
    conda:
        CONDA_ENV
    script:
        "../scripts/stage_hub_dataset.py"


rule prepare_prompts:
    input:
        manifest=pair_manifest,
        datasets=hub_dataset_markers,
    output:
        prompts="results/prompts/{pair}.jsonl",
    params:
        pair_spec=pair_spec,
        datasets=DATASETS,
        num_prompts=config["acceptance"]["num_prompts"],
    log:
        "results/logs/prompts/{pair}.log",
    conda:
        CONDA_ENV
    script:
        "../scripts/prepare_prompts.py"
