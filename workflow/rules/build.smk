# Stage 2: per hardware profile, install check + self-check of the core on the profile's device.


rule selfcheck:
    output:
        check="results/{profile}/build/selfcheck.json",
    params:
        device=profile_device,
        sglang_check=sglang_check_notice,
    log:
        "results/logs/build/{profile}.log",
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
        "ddtree selfcheck --device {params.device} --out {output.check} > {log} 2>&1{params.sglang_check}"
