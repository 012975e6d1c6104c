"""Stand-in for sglang.srt.sampling.sampling_params."""


class SamplingParams:
    def __init__(self, max_new_tokens: int = 128, temperature: float = 1.0, **kwargs):
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.extra = kwargs
