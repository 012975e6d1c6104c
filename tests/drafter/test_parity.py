"""The drafter against an independent reference of the forward the serving engines run.

`ServingReference` is written from docs/serving.md section 3 alone, in the way an engine executes
it: it reads config.json and model.safetensors of an exported checkpoint, keeps a list of cached
keys/values, and lets each new token attend to every cached entry up to itself. The prefix is
one extend over the target's features; each chain step appends one token at the next position.
"""

import json
import math

import torch
from safetensors.torch import load_file

from stages.drafter.export import export_drafter, load_drafter
from stages.drafter.speculate import Eagle3Proposer
from stages.drafter.ttt import ttt_unroll

from .conftest import VOCAB, features


class ServingReference:
    def __init__(self, checkpoint, embedding):
        self.c = json.loads((checkpoint / "config.json").read_text())
        self.w = load_file(str(checkpoint / "model.safetensors"))
        self.embedding = embedding
        self.cache = []  # (key [kv_heads, head_dim], value) per cached token

    def rms(self, x, name):
        return (
            self.w[name] * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.c["rms_norm_eps"])
        )

    def rotate(self, x, position):
        d = self.c["head_dim"]
        inv_freq = 1.0 / self.c["rope_theta"] ** (torch.arange(0, d, 2).float() / d)
        angle = position * inv_freq
        cos, sin = torch.cat([angle.cos(), angle.cos()]), torch.cat([angle.sin(), angle.sin()])
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def forward(self, token_ids, hidden, positions):
        """Append these tokens (each reading `hidden` of the same row) and return
        (draft logits over target ids, out) per token."""
        w, c = self.w, self.c
        heads, kv_heads, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        if hidden.shape[-1] == 3 * c["target_hidden_size"]:  # first step only
            hidden = hidden @ w["fc.weight"].T
        residual = hidden
        x = torch.cat(
            [
                self.rms(self.embedding[token_ids], "midlayer.input_layernorm.weight"),
                self.rms(hidden, "midlayer.hidden_norm.weight"),
            ],
            dim=-1,
        )
        q = (x @ w["midlayer.self_attn.q_proj.weight"].T).view(-1, heads, d)
        k = (x @ w["midlayer.self_attn.k_proj.weight"].T).view(-1, kv_heads, d)
        v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(-1, kv_heads, d)
        attended = []
        for n, position in enumerate(positions):
            self.cache.append((self.rotate(k[n], position), v[n]))
            keys = torch.stack([key for key, _ in self.cache])  # [S, kv_heads, d]
            values = torch.stack([value for _, value in self.cache])
            per_head = []
            for h in range(heads):
                g = h // (heads // kv_heads)
                scores = keys[:, g] @ self.rotate(q[n, h], position) / math.sqrt(d)
                per_head.append(scores.softmax(0) @ values[:, g])
            attended.append(torch.cat(per_head))
        x = torch.stack(attended) @ w["midlayer.self_attn.o_proj.weight"].T
        residual = x + residual
        x = self.rms(residual, "midlayer.post_attention_layernorm.weight")
        gate = x @ w["midlayer.mlp.gate_proj.weight"].T
        up = x @ w["midlayer.mlp.up_proj.weight"].T
        out = (torch.nn.functional.silu(gate) * up) @ w["midlayer.mlp.down_proj.weight"].T
        out = out + residual
        logits = self.rms(out, "norm.weight") @ w["lm_head.weight"].T
        target_ids = torch.arange(len(w["d2t"])) + w["d2t"]
        return torch.full((len(positions), VOCAB), float("-inf")).index_copy(
            1, target_ids, logits
        ), out

    def draft(self, ids, aux, chain_tokens):
        """Prefix ids[0..P] with features aux[0..P-1], then one chain step per chain token."""
        P = aux.shape[0]
        logits, out = self.forward(ids[1 : P + 1], aux, list(range(P)))
        all_logits = [logits[-1]]
        for j, token in enumerate(chain_tokens, start=1):
            logits, out = self.forward(torch.tensor([token]), out[-1:], [P - 1 + j])
            all_logits.append(logits[0])
        return all_logits


def to_target_vocab(drafter, logits):
    full = torch.full((*logits.shape[:-1], VOCAB), float("-inf"))
    return full.index_copy(-1, drafter.draft_ids(), logits)


@torch.no_grad()
def test_decoding_matches_the_serving_forward(tmp_path, drafter, target, target_config):
    checkpoint = export_drafter(drafter, drafter.cfg, tmp_path / "drafter", target_config, {})
    loaded, cfg = load_drafter(checkpoint)
    embedding = target.model.embed_tokens.weight
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (9,))
    aux, _ = features(target, ids[None], cfg.aux_layer_ids)
    aux = aux[0, :7]  # features of the prefix ids[0..6]
    # Serving: prefix extend, then chain steps feeding back `out` and the drafted token.
    reference = ServingReference(checkpoint, embedding)
    ref_first = reference.draft(ids, aux, [])[0]
    chain = [int(ref_first.argmax())]
    step = loaded.step(embedding[ids[None, 1:8]], aux[None])
    ours = [to_target_vocab(loaded, step.logits[0, -1])]
    hidden, kv = step.out[:, -1:], step.kv.select_queries(torch.tensor([6]))
    for _ in range(2):
        step = loaded.step(embedding[torch.tensor([[chain[-1]]])], hidden, kv)
        hidden, kv = step.out, step.kv
        ours.append(to_target_vocab(loaded, step.logits[0, -1]))
        chain.append(int(ours[-1].argmax()))
    expected = ServingReference(checkpoint, embedding).draft(ids, aux, chain[:2])
    for mine, theirs in zip(ours, expected):
        torch.testing.assert_close(mine, theirs, atol=2e-5, rtol=1e-4)
    # Speculative decoding drafts this greedy chain, and samples from the serving distributions.
    proposer = Eagle3Proposer(loaded, embedding)
    assert proposer.propose(ids[:8], aux[None], 3, 0.0, None).tokens == chain
    sampled = proposer.propose(ids[:8], aux[None], 3, 1.0, torch.Generator().manual_seed(0))
    expected = ServingReference(checkpoint, embedding).draft(ids, aux, sampled.tokens[:2])
    torch.testing.assert_close(
        sampled.probs, torch.stack(expected).softmax(-1), atol=1e-6, rtol=1e-4
    )
    # The prefix logits at every position too.
    prefix = ServingReference(checkpoint, embedding).forward(ids[1:8], aux, list(range(7)))[0]
    first = loaded.step(embedding[ids[None, 1:8]], aux[None]).logits[0]
    torch.testing.assert_close(to_target_vocab(loaded, first), prefix, atol=2e-5, rtol=1e-4)


@torch.no_grad()
def test_training_unroll_matches_serving_chains(tmp_path, drafter, target, target_config):
    """TTT step k at position i == serving with the prefix ending at i and k chain steps over
    the real next tokens; also for a right-padded row of a batch."""
    checkpoint = export_drafter(drafter, drafter.cfg, tmp_path / "drafter", target_config, {})
    loaded, cfg = load_drafter(checkpoint)
    embedding = target.model.embed_tokens.weight
    torch.manual_seed(1)
    T, steps, short = 8, 3, 6
    ids = torch.randint(0, VOCAB, (2, T))
    attention = torch.ones(2, T, dtype=torch.bool)
    attention[1, short:] = False
    aux, _ = features(target, ids, cfg.aux_layer_ids)
    aux[1, short:] = 0.0
    unrolled = ttt_unroll(loaded, embedding, aux, ids, attention, steps)
    for row, length in ((0, T), (1, short)):
        for i in range(length - 1):
            chain = ids[row, i + 2 : i + 1 + steps].tolist()
            k_max = min(steps - 1, length - 2 - i)
            expected = ServingReference(checkpoint, embedding).draft(
                ids[row, : i + 2 + k_max], aux[row, : i + 1], chain[:k_max]
            )
            for k in range(k_max + 1):
                torch.testing.assert_close(
                    to_target_vocab(loaded, unrolled[k][row, i]), expected[k], atol=2e-5, rtol=1e-4
                )
