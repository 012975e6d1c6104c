"""`dflash.fp8`: the DFlash drafter's linear products in FP8 e4m3 (stages/drafter/fp8.py, as
EAGLE-3's), checked on the CPU where the quantisation runs as plain tensor code."""

from __future__ import annotations

import torch

from stages.dflash.objective import DFlashObjective
from stages.drafter.model import Linear, use_fp8
from tests.drafter.test_fp8 import assert_fp8_near_float32

from .conftest import make_drafter, random_batch, target_weights


def test_every_linear_of_the_draft_switches(target_config):
    drafter = make_drafter(target_config)
    widths = use_fp8(drafter, True)
    linears = [n for n, m in drafter.named_modules() if isinstance(m, torch.nn.Linear)]
    assert sorted(widths) == sorted(linears) and len(linears) == 1 + 7 * 2  # fc, 2 layers
    assert widths["fc"] == (3 * drafter.cfg.hidden_size, drafter.cfg.hidden_size)
    assert all(m.fp8 for m in drafter.modules() if isinstance(m, Linear))
    use_fp8(drafter, False)
    assert not any(m.fp8 for m in drafter.modules() if isinstance(m, Linear))


def test_the_loss_and_gradients_in_fp8_stay_near_float32(target_config):
    """The whole block objective, the same anchors both ways (a fresh objective of one seed)."""
    drafter = make_drafter(target_config)
    embed, head = target_weights(drafter.cfg)
    batch = random_batch(drafter.cfg, [24, 18])

    def loss():
        objective = DFlashObjective(drafter, embed, head, num_anchors=3, decay_gamma=4.0, seed=5)
        return objective(batch)[0]

    assert_fp8_near_float32(drafter, loss)
