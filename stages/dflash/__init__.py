"""The DFlash draft model (model), its block-diffusion training objective (objective), its
export to the checkpoint SGLang's DFLASH worker loads (export) and its speculative decoding
against an in-process target (speculate). Import the module you need: this package imports
nothing, so a stage that needs one module does not depend on the others."""
