"""The target's tokenizer and chat template, and the fingerprint of everything that shapes its
tokens."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import transformers
from transformers import AutoTokenizer


def load_tokenizer(
    path: str | Path, chat_template: str | Path | None = None, trust_remote_code: bool = False
):
    """The tokenizer of a local model directory, with `chat_template` (a Jinja file) when the
    model ships none or the caller replaces it."""
    path = Path(path)
    if not (path / "config.json").exists() and not (path / "tokenizer_config.json").exists():
        raise FileNotFoundError(
            f"{path} holds no model or tokenizer; point the target path at a "
            f"local Hugging Face model directory"
        )
    try:
        tok = AutoTokenizer.from_pretrained(
            path, trust_remote_code=trust_remote_code, local_files_only=True
        )
    except (OSError, ValueError, KeyError, TypeError, ImportError) as err:
        found = sorted(f.name for f in path.iterdir() if f.name.startswith("tokenizer"))
        why = (
            f"{', '.join(found)} do not load: {str(err).strip().splitlines()[0].rstrip(': ')}"
            if found and str(err).strip()
            else "no tokenizer.json, tokenizer_config.json or tokenizer.model in it"
        )
        raise ValueError(
            f"{path}: no tokenizer ({why}); point the target path at a model directory that "
            f"holds its tokenizer"
        ) from None
    if chat_template:
        template = Path(chat_template)
        if not template.is_file():
            raise FileNotFoundError(f"chat template file {template} does not exist")
        tok.chat_template = template.read_text()
    if not tok.chat_template:
        raise ValueError(
            f"the tokenizer at {path} has no chat template; give a Jinja template "
            f"file as the target's chat template"
        )
    return tok


def render_prompt(
    tokenizer,
    messages: list[dict],
    tools: list | None,
    template_kwargs: dict,
    generation: bool = True,
) -> list[int]:
    """Prompt ids exactly as serving builds them: the chat template with the generation prompt
    (or, with generation False, the conversation alone)."""
    return tokenizer.apply_chat_template(
        messages,
        tools=tools,
        add_generation_prompt=generation,
        tokenize=True,
        return_dict=False,
        **template_kwargs,
    )


def pad_id(tokenizer) -> int:
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if tid is not None:
            return tid
    return 0


def model_fingerprint(path: str | Path, chat_template: str | Path | None, settings: object) -> str:
    """Hash of what shapes the target's tokens: the model directory's weights, config and
    tokenizer, the chat template file, `settings` (JSON: template kwargs, roles, dtype) and the
    transformers version (a chat-template rendering change in it must regenerate)."""
    h = hashlib.sha256()
    for f in sorted(Path(path).iterdir()):
        if f.is_file() and f.suffix in {".json", ".safetensors", ".model", ".jinja", ".txt"}:
            h.update(f.name.encode())
            h.update(_file_digest(f))
    if chat_template:
        h.update(Path(chat_template).read_bytes())
    h.update(json.dumps([settings, transformers.__version__], sort_keys=True).encode())
    return h.hexdigest()[:16]


def _file_digest(path: Path, whole_up_to: int = 64 << 20, edge: int = 1 << 20) -> bytes:
    """Whole-file hash for small files; size + first and last MiB for weight shards of GBs."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size <= whole_up_to:
            return hashlib.sha256(f.read()).digest()
        head = f.read(edge)
        f.seek(size - edge)
        return hashlib.sha256(str(size).encode() + head + f.read(edge)).digest()
