"""The typed, validated view of params.yaml: one module per top-level section (`train.py` holds
`TrainParams`, read by `TrainParams.read(path)`), the shared validation in `schema.py`, every
section together in `sections.py` (the check stage's). A module imports `schema` and only the
section modules whose types it nests, so a stage depends on the sections it reads and on no other.
"""
