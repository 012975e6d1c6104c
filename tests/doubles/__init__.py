"""Test doubles: stand-ins for what only a GPU node has (SGLang's HTTP server over the hf engine,
with fault knobs and a hash engine for protocol soaks)."""
