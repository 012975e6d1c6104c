"""The check stage refuses a `dflash.mask_token_id` that generation could emit or SGLang could not
embed, naming the key, before any stage runs."""

from __future__ import annotations

import pytest
import yaml

from stages.check import check_mask_token
from stages.params.target import TargetParams
from stages.runtime.errors import ParamsError
from tests.conftest import DEMO_TARGET

TARGET = TargetParams(path=str(DEMO_TARGET))


def params_with(tmp_path, mask):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"dflash": {"mask_token_id": mask}}))
    return path


@pytest.mark.parametrize(
    "mask, refused",
    [
        (None, "null"),
        (2048, "outside the target's vocabulary"),
        (2, "end_of_turn token"),  # <|im_end|>: every reply ends with it
        (13, "end_think token"),  # </think>
    ],
)
def test_a_mask_token_generation_emits_or_outside_the_vocabulary_is_refused(
    tmp_path, mask, refused
):
    with pytest.raises(ParamsError, match=rf"dflash\.mask_token_id: .*{refused}"):
        check_mask_token(params_with(tmp_path, mask), TARGET)


def test_a_padding_token_passes(tmp_path):
    check_mask_token(params_with(tmp_path, 14), TARGET)  # [PAD]
