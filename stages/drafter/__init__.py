"""The EAGLE-3 draft model, its training-time-test loss, draft vocabulary, target-layer ids,
export to the SGLang / vLLM checkpoint format, and speculative decoding to measure it."""
from .export import check_export, export_drafter, load_drafter
from .layers import default_aux_indices, serving_layer_ids
from .model import Eagle3Config, Eagle3Drafter, embed_tokens, target_facts
from .speculate import acceptance_stats, speculative_generate
from .ttt import TTTMetrics, ttt_forward
from .vocab import build_draft_vocab, count_supervised_tokens, coverage

__all__ = [
    "Eagle3Config", "Eagle3Drafter", "TTTMetrics", "acceptance_stats", "build_draft_vocab",
    "check_export", "count_supervised_tokens", "coverage", "default_aux_indices", "embed_tokens",
    "export_drafter", "load_drafter", "serving_layer_ids", "speculative_generate", "target_facts",
    "ttt_forward",
]
