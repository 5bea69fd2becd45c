"""Reusable, tested Python behind the Snakemake workflow (`workflow/scripts/` are thin wrappers).

Modules:
  config     run ids, cross-reference checks of the configuration, benchmark plans
  stage      hub staging of model pairs with an up-front offline check
  prompts    held-out / hub prompt preparation into one JSON-lines file per pair
  records    reading the benchmark JSON-lines records (tolerant of a killed run's last line)
  aggregate  tidy tables from the records
  lossless   T = 0 match rate and the T > 0 two-sample test of sampled tokens
  envinfo    environment record (package versions, device, git revision, corpus hashes)
  report     figures and tables used by the papermill notebooks
"""
