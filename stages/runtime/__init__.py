"""Process-level plumbing every heavy stage shares: atomic writes and checksums (files), a stage's
output folder with its stale temps and lock (outputs), files kept aside in a subfolder by a
journaled swap a kill cannot leave half done (swap), the safetensors writer (tensor_file),
progress lines (progress), torchrun ranks and NCCL settings (parallel), device and CPU-thread
choice (device), a JSON or YAML value read as its declared type (typed: params.yaml's and the
reports').

The bottom layer of the library: it imports nothing else from the project."""
