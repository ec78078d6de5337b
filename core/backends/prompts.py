"""Prompt text of a requested token length, built deterministically (the load client's prompts).

Shared by every live load path (the load client, the gateway): prompts read as plain text to any tokenizer,
are exact when the model's tokenizer is at hand, and carry a per-request tag so vLLM's prefix cache does not
turn prefills into cache hits.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# Without a tokenizer, English-like text averages about 0.75 words per token for BPE vocabularies.
DEFAULT_WORDS_PER_TOKEN = 0.75

# A fixed vocabulary of common words: prompts read as text to any tokenizer and stay deterministic.
_WORD_TEXT = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have "
    "an had they you were their one all we can her has there been if more when will would who so no time "
    "people year way day thing man world life hand part child eye woman place work week case point number "
    "group problem fact system program question government company home water room mother area money "
    "story month lot right study book job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea body "
    "information back parent face others level office door health person art war history party result "
    "change morning reason research girl guy moment air teacher force education good new first last long "
    "great little own other old big high different small large next early young important few public bad "
    "same able"
)
_WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())


class PromptBuilder:
    """Builds prompt text of about N tokens, deterministically; cached by length.

    With `count_tokens` (a callable text -> token count, e.g. from the model's tokenizer) the body is the
    shortest word sequence that reaches N tokens, found by bisection. Without one, token counts are
    estimated at `words_per_token`. A per-request tag at the start (`build(n, salt=request_id)`) makes
    every prompt distinct so vLLM's prefix cache does not turn prefills into cache hits, as random-token
    prompts in `vllm bench serve` also avoid.
    """

    def __init__(
        self,
        count_tokens: Callable[[str], int] | None = None,
        *,
        words_per_token: float = DEFAULT_WORDS_PER_TOKEN,
        seed: int = 0,
    ) -> None:
        self.tokenizer_aware = count_tokens is not None
        self._words_per_token = words_per_token
        self._count = count_tokens or self._estimate_tokens
        self._seed = seed
        self._words: list[str] = []
        self._bodies: dict[int, str] = {}

    @classmethod
    def for_model_dir(cls, model_dir: str | Path | None, **kwargs: Any) -> PromptBuilder:
        """Tokenizer-aware when `<model_dir>/tokenizer.json` exists and `tokenizers` is installed."""
        count = load_token_counter(model_dir) if model_dir is not None else None
        return cls(count, **kwargs)

    @property
    def words_per_token(self) -> float:
        return self._words_per_token

    def calibrate(self, text: str, tokens: int) -> None:
        """Set the words-per-token estimate from a text whose token count is known (e.g. a server's
        /tokenize answer). Only used without a token counter."""
        words = len(text.split())
        if tokens > 0 and words > 0 and not self.tokenizer_aware:
            self._words_per_token = words / tokens
            self._bodies.clear()

    def _estimate_tokens(self, text: str) -> int:
        return math.ceil(len(text.split()) / self._words_per_token)

    def _word_prefix(self, n_words: int) -> str:
        if len(self._words) < n_words:
            rng = random.Random(self._seed + len(self._words))
            self._words.extend(rng.choice(_WORDS) for _ in range(n_words - len(self._words)))
        return " ".join(self._words[:n_words])

    def body(self, n_tokens: int) -> str:
        """Text of about `n_tokens` tokens (at least one word)."""
        n_tokens = max(1, n_tokens)
        cached = self._bodies.get(n_tokens)
        if cached is not None:
            return cached
        # Bisect on the word count: the fewest words whose text reaches n_tokens.
        low, high = 1, max(2, int(n_tokens * 2))
        while self._count(self._word_prefix(high)) < n_tokens:
            low, high = high, high * 2
        while low < high:
            middle = (low + high) // 2
            if self._count(self._word_prefix(middle)) >= n_tokens:
                high = middle
            else:
                low = middle + 1
        text = self._word_prefix(low)
        self._bodies[n_tokens] = text
        return text

    def build(self, n_tokens: int, salt: int | None = None) -> str:
        if salt is None:
            return self.body(n_tokens)
        tag = f"{salt}:"
        return f"{tag} {self.body(n_tokens - self._count(tag))}"


class GivenPrompts(PromptBuilder):
    """Sends given prompt texts instead of building them: request id i gets `texts[i % len(texts)]`.

    For sending another client's exact prompts (benchmarks/client_agreement.py sends `vllm bench serve`'s).
    The texts' lengths are their own: nothing is estimated or recalibrated from the server's /tokenize.
    """

    def __init__(self, texts: Sequence[str]) -> None:
        if not texts:
            raise ValueError("GivenPrompts needs at least one text")
        super().__init__()
        self.tokenizer_aware = True  # exact by construction: no /tokenize calibration
        self._texts = list(texts)

    def build(self, n_tokens: int, salt: int | None = None) -> str:
        return self._texts[(salt or 0) % len(self._texts)]


def load_token_counter(model_dir: str | Path) -> Callable[[str], int] | None:
    """A token counter from `<model_dir>/tokenizer.json`, or None (no file, or `tokenizers` missing)."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer  # optional: the dev install does not need it
    except ImportError:
        return None
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception:  # a corrupt or unsupported tokenizer file only costs us exact prompt lengths
        return None
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)
