# Stage 3: one plan and one `ddtree bench session` per (profile, pair, run). The session starts
# the profile's server, waits for health, runs acceptance then throughput and always stops the
# server's process group. Its per-request JSON lines (records/) are NOT declared outputs, so
# Snakemake never deletes them after a failure: a rerun resumes.


# Writing a plan takes milliseconds: never a cluster job of its own.
localrules:
    plan,


rule plan:
    input:
        prompts="results/prompts/{pair}.jsonl",
        manifest=pair_manifest,
    output:
        plan="results/{profile}/{pair}/{run}/plan.json",
    params:
        profile=profile_spec,
        model_dir=pair_dir_of,
        out_dir=subpath(output.plan, parent=True),
        server_log="results/logs/benchmark/{profile}/{pair}/{run}.server.log",
        config=config,
    log:
        "results/logs/plan/{profile}/{pair}/{run}.log",
    conda:
        CONDA_ENV
    script:
        "../scripts/write_plan.py"


rule benchmark:
    input:
        plan="results/{profile}/{pair}/{run}/plan.json",
        selfcheck=selfcheck_file,
    output:
        summary="results/{profile}/{pair}/{run}/summary.json",
    params:
        session="results/{profile}/{pair}/{run}/records/session.json",
    log:
        session="results/logs/benchmark/{profile}/{pair}/{run}.log",
    threads: profile_threads
    resources:
        slurm_partition=res_partition,
        slurm_account=res_account,
        gpu=res_gpus,
        gpu_model=res_gpu_model,
        cpus_per_task=res_cpus,
        mem_mb=res_mem_mb,
        runtime=res_runtime,
    conda:
        CONDA_ENV
    shell:
        # The session handles SIGTERM/SIGINT itself (stops the server's process group). Its summary
        # becomes the output only on success, so an interrupted run never looks finished.
        "ddtree bench session --plan {input.plan} > {log.session} 2>&1 "
        "&& cp {params.session} {output.summary}"
