"""Build one tiny random-weight Llama (and its tokenizer) into a directory. Runs as a standalone script.

This file imports only the standard library at module level and `torch`, `transformers` and `tokenizers`
inside `build()`, because it is executed by *another* interpreter (the vLLM venv's python) as
`python tiny_model_build.py --out DIR --seed N`: slo-console itself does not depend on transformers.

Everything is seeded and the tokenizer's training text is a fixed, sorted selection of the running
interpreter's standard library, so two builds with the same python give the same files.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

VOCAB_SIZE = 2048
# Enough text for a 2k BPE vocabulary; bounded so the build stays a few seconds.
TRAINING_TEXT_BYTES = 4_000_000
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def training_files() -> list[Path]:
    """Standard-library .py files in a fixed order (sorted relative paths), top level only."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return sorted(stdlib.glob("*.py"), key=lambda p: p.name)


def training_text() -> list[str]:
    texts: list[str] = []
    total = 0
    for path in training_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text)
        total += len(text)
        if total >= TRAINING_TEXT_BYTES:
            break
    if not texts:
        raise SystemExit("no standard-library .py files found to train the tokenizer on")
    return texts


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_text(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))


def build_model(out: Path, seed: int, vocab_size: int, bos_id: int, eos_id: int, pad_id: int) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def build(out: Path, seed: int, tokenizer_from: Path | None) -> dict[str, object]:
    from transformers import AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    if tokenizer_from is None:
        build_tokenizer(out)
    else:
        # A draft must share the target's vocabulary token for token; copying guarantees it.
        AutoTokenizer.from_pretrained(str(tokenizer_from)).save_pretrained(str(out))
    tok = AutoTokenizer.from_pretrained(str(out))
    params = build_model(out, seed, len(tok), tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    return {"out": str(out), "seed": seed, "vocab_size": len(tok), "parameters": params}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--tokenizer-from", type=Path, default=None)
    args = parser.parse_args(argv)
    info = build(args.out, args.seed, args.tokenizer_from)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
