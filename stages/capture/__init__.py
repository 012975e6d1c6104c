"""Hidden-state capture: everything that turns token ids into the target's EAGLE-3 features.

interface.py  the `Capture` interface every engine implements, and `Role`
hf.py         the hf engine (a whole target per process), with hooks.py (forward hooks on the
              decoder layers) and packing.py (samples packed into rows without padding)
sglang.py     the sglang engine (SGLang's model runner, tensor parallel), for the SGLang
              releases in releases.py
shards.py     the extract stage's shard loop over any engine, with buffers.py (host memory)
online.py     the features the train stage computes on each batch instead (store none): a
              whole target per rank, or one engine tensor parallel over every rank
canary.py     the comparison of a capture with a reference, layer by layer; served.py fetches a
              SGLang server's own capture over HTTP as one
"""
