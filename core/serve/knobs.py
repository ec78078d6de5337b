"""Knob adapter: logical knobs (`core.profile.KnobsSpec`) -> command-line flags of the vLLM at hand.

Paper 000 (SLO-Tuner) keeps the controller portable by tuning *logical* knobs and letting a thin adapter
map them to whatever a given serving stack exposes. vLLM's flags moved between releases (0.6 had
`--speculative-model`/`--num-speculative-tokens`; current releases take one `--speculative-config` JSON),
so the adapter asks the installed vLLM which flags exist (its `--help`, read by core/serve/install_probe.py)
and refuses a knob it cannot express with an `UnsupportedKnob` naming the cause and the fix, instead of
handing vLLM an argv that crashes it 30 s into start-up.

Client concurrency is a client-side knob (how many requests the load generator keeps in flight); it never
becomes a server flag.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from core.profile import KnobsSpec, ProfileError
from core.serve.install_probe import VllmCapabilities

# Draft-free speculation methods vLLM accepts in `--speculative-config` ("method"); a draft model needs
# none of these (vLLM infers "draft_model" from "model").
DRAFT_FREE_METHODS = frozenset({"ngram", "ngram_gpu", "suffix"})


class UnsupportedKnob(ProfileError):
    """A logical knob this vLLM cannot express. The message is one line: the cause and the fix.

    A ProfileError: the profile asks for something this engine cannot do (bad input, not a crash).
    """


@dataclass(frozen=True, slots=True)
class Speculation:
    """Where speculative tokens come from: a draft model (path or id), or a draft-free method."""

    draft_model: str | None = None
    method: str | None = None  # e.g. "ngram"; None with a draft model means vLLM's "draft_model"
    extra: dict[str, object] = field(default_factory=dict)  # more --speculative-config keys


def _need(caps: VllmCapabilities | None, flag: str, knob: str) -> None:
    if caps is not None and not caps.supports(flag):
        raise UnsupportedKnob(
            f"knob {knob} needs vLLM flag {flag}, which vLLM {caps.version} does not have; "
            f"remove the knob from the profile or use a vLLM that supports it"
        )


def speculative_config(width: int, spec: Speculation) -> dict[str, object]:
    """The `--speculative-config` object for `width` speculative tokens (width > 0)."""
    config: dict[str, object] = {"num_speculative_tokens": width}
    if spec.method is not None:
        config["method"] = spec.method
    if spec.draft_model is not None:
        config["model"] = spec.draft_model
    config.update(spec.extra)
    return config


def knob_flags(
    knobs: KnobsSpec,
    caps: VllmCapabilities | None = None,
    speculation: Speculation | None = None,
    *,
    max_model_len: int | None = None,
) -> list[str]:
    """Translate logical knobs into vLLM flags, refusing what this vLLM (`caps`) cannot do.

    `caps=None` skips the capability check (for building a command line for another machine).
    `max_model_len` (when known) lets a chunked-prefill-off configuration be checked before start-up:
    without chunking vLLM needs the whole prompt in one step, so the token budget must cover it.
    """
    speculation = speculation or Speculation()
    argv: list[str] = []

    _need(caps, "--max-num-seqs", f"max_num_seqs={knobs.max_num_seqs}")
    argv += ["--max-num-seqs", str(knobs.max_num_seqs)]
    _need(caps, "--max-num-batched-tokens", f"max_num_batched_tokens={knobs.max_num_batched_tokens}")
    argv += ["--max-num-batched-tokens", str(knobs.max_num_batched_tokens)]

    if knobs.chunked_prefill:
        _need(caps, "--enable-chunked-prefill", "chunked_prefill=true")
        argv.append("--enable-chunked-prefill")
    else:
        _need(caps, "--no-enable-chunked-prefill", "chunked_prefill=false")
        if max_model_len is not None and knobs.max_num_batched_tokens < max_model_len:
            raise UnsupportedKnob(
                f"chunked_prefill=false needs max_num_batched_tokens >= max_model_len "
                f"({knobs.max_num_batched_tokens} < {max_model_len}); raise max_num_batched_tokens "
                "or keep chunked prefill on"
            )
        argv.append("--no-enable-chunked-prefill")

    if knobs.scheduling_policy != "fcfs" or caps is None or caps.supports("--scheduling-policy"):
        # fcfs is every vLLM's behaviour, so an old vLLM without the flag still honours it.
        _need(caps, "--scheduling-policy", f"scheduling_policy={knobs.scheduling_policy}")
        argv += ["--scheduling-policy", knobs.scheduling_policy]

    width = knobs.effective_spec_width
    if width > 0:
        argv += _speculation_flags(width, speculation, caps)
    return argv


def _speculation_flags(width: int, spec: Speculation, caps: VllmCapabilities | None) -> list[str]:
    knob = f"spec_width={width}"
    if spec.draft_model is None and spec.method is None:
        raise UnsupportedKnob(
            f"{knob} needs a source of draft tokens; set server.draft_model (e.g. "
            "builtin:tiny-llama-draft-high) or server.spec_method: ngram in the profile, or set spec_width: 0"
        )
    if spec.method is not None and spec.draft_model is None and spec.method not in DRAFT_FREE_METHODS:
        raise UnsupportedKnob(
            f"spec_method={spec.method} needs a draft model (server.draft_model); "
            f"draft-free methods are {', '.join(sorted(DRAFT_FREE_METHODS))}"
        )
    if caps is None or caps.supports("--speculative-config"):
        return ["--speculative-config", json.dumps(speculative_config(width, spec), separators=(",", ":"))]
    # vLLM <= 0.6 (the SLO-Tuner paper's 0.6.1): separate flags; "[ngram]" names the draft-free proposer.
    if caps.supports("--speculative-model") and caps.supports("--num-speculative-tokens"):
        if spec.method not in (None, "ngram", "draft_model") or spec.extra:
            raise UnsupportedKnob(
                f"spec_method={spec.method} needs --speculative-config, which vLLM {caps.version} lacks; "
                "use a draft model or ngram, or a newer vLLM"
            )
        model = "[ngram]" if spec.method == "ngram" and spec.draft_model is None else spec.draft_model
        return ["--speculative-model", str(model), "--num-speculative-tokens", str(width)]
    raise UnsupportedKnob(
        f"knob {knob} needs speculative decoding, which vLLM {caps.version} does not offer "
        "(no --speculative-config); set spec_width: 0 or use a vLLM with speculative decoding"
    )
