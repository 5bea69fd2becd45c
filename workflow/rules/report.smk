# Stage 5: papermill executes the notebooks (from shell:, so they stay runnable on their own);
# nbconvert renders HTML without input cells. The executed notebook is kept as the log, so a
# failing cell can be read there.


rule profile_report:
    input:
        tables=table_files(),
        notebook="notebooks/profile_report.ipynb",
    output:
        html="results/reports/{profile}.html",
    params:
        parameters=report_parameters,
        out_dir=subpath(output.html, parent=True),
        name=subpath(output.html, basename=True, strip_suffix=".html"),
    log:
        notebook="results/logs/report/{profile}.ipynb",
        stderr="results/logs/report/{profile}.log",
    conda:
        CONDA_ENV
    shell:
        "papermill {input.notebook} {log.notebook} {params.parameters} -k python3 --log-output "
        "> {log.stderr} 2>&1 && jupyter nbconvert --to html --no-input {log.notebook} "
        "--output-dir {params.out_dir} --output {params.name} >> {log.stderr} 2>&1"


rule summary_report:
    input:
        tables=table_files(),
        notebook="notebooks/summary.ipynb",
    output:
        html="results/reports/summary.html",
    params:
        out_dir=subpath(output.html, parent=True),
    log:
        notebook="results/logs/report/summary.ipynb",
        stderr="results/logs/report/summary.log",
    conda:
        CONDA_ENV
    shell:
        "papermill {input.notebook} {log.notebook} -p tables_dir results/tables -k python3 --log-output "
        "> {log.stderr} 2>&1 && jupyter nbconvert --to html --no-input {log.notebook} "
        "--output-dir {params.out_dir} --output summary >> {log.stderr} 2>&1"
