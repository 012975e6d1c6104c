"""ServerArgs as 0.5.23 has it: built unresolved, then `resolve_once()`, which checks the
capture-only settings as the release's handle_aux_hidden_state_capture does."""

from __future__ import annotations

from dataclasses import dataclass

from fake_core import _ServerArgs


@dataclass(kw_only=True)
class ServerArgs(_ServerArgs):
    enable_return_aux_hidden_states: bool = False
    return_aux_hidden_state_layer_ids: list | None = None
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None

    def resolve_once(self) -> None:
        if getattr(self, "_resolved", False):
            return
        if self.return_aux_hidden_state_layer_ids and not self.enable_return_aux_hidden_states:
            raise ValueError(
                "return_aux_hidden_state_layer_ids needs enable_return_aux_hidden_states"
            )
        if self.enable_return_aux_hidden_states:
            if str(self.speculative_algorithm).upper() not in ("EAGLE3", "DFLASH", "DSPARK"):
                raise ValueError("enable_return_aux_hidden_states needs EAGLE3, DFLASH or DSPARK")
            if self.speculative_draft_model_path or self.pp_size != 1:
                raise ValueError("aux hidden-state capture takes no draft and pp_size 1")
            ids = self.return_aux_hidden_state_layer_ids or []
            if len(set(ids)) != len(ids) or any(i < 0 for i in ids):
                raise ValueError(f"layer ids {ids} must be unique and non-negative")
        self._resolved = True
        self._record()
