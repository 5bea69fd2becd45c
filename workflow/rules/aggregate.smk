# Stage 4: tidy tables (parquet + CSV) under results/tables/ with the environment recorded.


rule environment:
    input:
        manifests=expand("resources/models/{pair}/manifest.json", pair=USED_PAIRS),
        selfchecks=expand("results/{profile}/build/selfcheck.json", profile=config["hardware"]),
    output:
        env="results/tables/environment.json",
        parquet="results/tables/environment.parquet",
        csv="results/tables/environment.csv",
    params:
        pairs={pair: pair_dir(pair) for pair in USED_PAIRS},
    log:
        "results/logs/aggregate/environment.log",
    conda:
        CONDA_ENV
    script:
        "../scripts/environment.py"


rule aggregate:
    input:
        plans=all_plans(),
        summaries=all_summaries(),
        env="results/tables/environment.json",
    output:
        tables=aggregate_tables(),
    params:
        out_dir=output_parent,
        alpha=config["lossless"]["alpha"],
        positions=config["lossless"]["positions"],
    log:
        "results/logs/aggregate/tables.log",
    conda:
        CONDA_ENV
    script:
        "../scripts/aggregate.py"
