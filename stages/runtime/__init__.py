"""Process-level plumbing every heavy stage shares: atomic writes and progress lines (io),
torchrun ranks and NCCL settings (parallel), device and CPU-thread choice (device).

The bottom layer of the library: it imports nothing else from the project."""
