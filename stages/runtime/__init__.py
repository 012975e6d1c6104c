"""Process-level plumbing every heavy stage shares: atomic writes and checksums (files), a stage's
output folder with its stale temps and lock (outputs), the safetensors writer (tensor_file),
progress lines (progress), torchrun ranks and NCCL settings (parallel), device and CPU-thread
choice (device).

The bottom layer of the library: it imports nothing else from the project."""
