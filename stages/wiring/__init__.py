"""Library objects built from params, in one place: the target's tokenizer and roles
(target.py), the generation facts a dataset's fingerprint hashes (generation.py), the generation
engines and SGLang servers (engines.py), the capture engines (capture.py). Each module imports
only what its objects need, so a stage's DVC deps stay the code it runs."""
