"""EAGLE-3 drafter pipeline: one module per DVC stage, library code in subpackages."""
