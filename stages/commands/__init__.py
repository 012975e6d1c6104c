"""Commands run by hand beside `dvc repro`, none of them a DVC stage: `eagle-pipeline` (console:
query, report, estimate, launch-line), `python -m stages.commands.query`, `.estimate` (time a
short sample before committing GPUs) and `.canary` (the capture checked before an extraction)."""
