"""Knob adapter: logical knobs -> the flags of the vLLM at hand, refusing what it cannot do."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from core.backend_api import BackendUnavailable
from core.profile import KnobsSpec, ProfileError, ServerSpec
from core.serve import install_probe as probe_module
from core.serve.cpu_binding import other_slot, replica_core_slots
from core.serve.install_probe import (
    VllmCapabilities,
    VllmProbeError,
    parse_help_flags,
    probe_capabilities,
    probe_install,
)
from core.serve.knobs import Speculation, UnsupportedKnob, knob_flags
from core.serve.vllm_server import VllmServer, merge_args, option_value

# The flags a vLLM 0.32 `--help` lists that the adapter uses (abridged usage block).
HELP_0_32 = """
usage: api_server.py [-h] [--host HOST] [--port PORT] [--model MODEL]
                     [--max-num-seqs MAX_NUM_SEQS] [--max-num-batched-tokens MAX_NUM_BATCHED_TOKENS]
                     [--enable-chunked-prefill | --no-enable-chunked-prefill]
                     [--scheduling-policy {fcfs,priority}]
                     [--speculative-config SPECULATIVE_CONFIG]
                     [--gpu-memory-utilization GPU_MEMORY_UTILIZATION] [--enforce-eager]
                     [--optimization-level OPTIMIZATION_LEVEL] [--max-model-len MAX_MODEL_LEN]
                     [--dtype {auto,bfloat16,float16}] [--served-model-name SERVED_MODEL_NAME]
options:
  -h, --help            show this help message and exit
"""
# vLLM 0.6 (the SLO-Tuner paper's version): separate speculative flags, no scheduling policy.
HELP_0_6 = """
usage: api_server.py [-h] [--host HOST] [--port PORT] [--model MODEL]
                     [--max-num-seqs MAX_NUM_SEQS] [--max-num-batched-tokens MAX_NUM_BATCHED_TOKENS]
                     [--enable-chunked-prefill [ENABLE_CHUNKED_PREFILL]]
                     [--speculative-model SPECULATIVE_MODEL]
                     [--num-speculative-tokens NUM_SPECULATIVE_TOKENS]
"""
CAPS = VllmCapabilities("0.32.0", parse_help_flags(HELP_0_32))
CAPS_OLD = VllmCapabilities("0.6.1", parse_help_flags(HELP_0_6))


def test_help_parser_finds_long_flags_and_negated_forms() -> None:
    flags = parse_help_flags(HELP_0_32)
    assert {"--max-num-seqs", "--speculative-config", "--no-enable-chunked-prefill", "-h"} <= flags
    assert "MAX_NUM_SEQS" not in flags and "--max-num-seqs-x" not in flags


def test_each_knob_becomes_its_flag() -> None:
    argv = knob_flags(
        KnobsSpec(max_num_seqs=8, max_num_batched_tokens=512, chunked_prefill=True, scheduling_policy="priority"),
        CAPS,
    )
    assert argv[argv.index("--max-num-seqs") + 1] == "8"
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "512"
    assert "--enable-chunked-prefill" in argv
    assert argv[argv.index("--scheduling-policy") + 1] == "priority"


def test_chunked_prefill_off_uses_the_negated_flag() -> None:
    argv = knob_flags(KnobsSpec(chunked_prefill=False, max_num_batched_tokens=2048), CAPS, max_model_len=1024)
    assert "--no-enable-chunked-prefill" in argv and "--enable-chunked-prefill" not in argv


def test_chunked_prefill_off_with_a_budget_below_the_context_is_refused_before_start() -> None:
    with pytest.raises(UnsupportedKnob, match="max_num_batched_tokens >= max_model_len"):
        knob_flags(KnobsSpec(chunked_prefill=False, max_num_batched_tokens=512), CAPS, max_model_len=1024)


def test_client_concurrency_is_not_a_server_flag() -> None:
    argv = knob_flags(KnobsSpec(concurrency=16), CAPS)
    assert not any("concurren" in a for a in argv)


@pytest.mark.parametrize("knobs", [KnobsSpec(spec_on=True, spec_width=0), KnobsSpec(spec_on=False, spec_width=8)])
def test_width_zero_or_speculation_off_gives_no_speculative_config(knobs: KnobsSpec) -> None:
    argv = knob_flags(knobs, CAPS, Speculation(draft_model="/models/draft"))
    assert "--speculative-config" not in argv


def test_draft_model_speculation_is_one_json_config() -> None:
    argv = knob_flags(KnobsSpec(spec_on=True, spec_width=8), CAPS, Speculation(draft_model="/models/draft"))
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config == {"num_speculative_tokens": 8, "model": "/models/draft"}


def test_draft_free_ngram_speculation() -> None:
    argv = knob_flags(KnobsSpec(spec_on=True, spec_width=4), CAPS, Speculation(method="ngram"))
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config == {"num_speculative_tokens": 4, "method": "ngram"}


def test_speculation_without_a_draft_source_is_refused_with_the_fix() -> None:
    with pytest.raises(UnsupportedKnob) as caught:
        knob_flags(KnobsSpec(spec_on=True, spec_width=8), CAPS)
    message = str(caught.value)
    assert "\n" not in message and "server.draft_model" in message and "spec_width: 0" in message
    assert isinstance(caught.value, ProfileError)  # batch maps it to the bad-input exit code


def test_a_method_that_needs_a_model_is_refused() -> None:
    with pytest.raises(UnsupportedKnob, match="needs a draft model"):
        knob_flags(KnobsSpec(spec_on=True, spec_width=3), CAPS, Speculation(method="eagle3"))


def test_an_old_vllm_gets_its_own_speculative_flags() -> None:
    argv = knob_flags(KnobsSpec(spec_on=True, spec_width=5), CAPS_OLD, Speculation(draft_model="/d"))
    assert argv[argv.index("--speculative-model") + 1] == "/d"
    assert argv[argv.index("--num-speculative-tokens") + 1] == "5"
    ngram = knob_flags(KnobsSpec(spec_on=True, spec_width=5), CAPS_OLD, Speculation(method="ngram"))
    assert ngram[ngram.index("--speculative-model") + 1] == "[ngram]"


def test_fcfs_on_a_vllm_without_scheduling_policy_is_fine_but_priority_is_refused() -> None:
    assert "--scheduling-policy" not in knob_flags(KnobsSpec(), CAPS_OLD)
    with pytest.raises(UnsupportedKnob) as caught:
        knob_flags(KnobsSpec(scheduling_policy="priority"), CAPS_OLD)
    message = str(caught.value)
    assert "--scheduling-policy" in message and "0.6.1" in message and "\n" not in message


def test_chunked_prefill_off_is_refused_where_there_is_no_negated_flag() -> None:
    with pytest.raises(UnsupportedKnob, match="--no-enable-chunked-prefill"):
        knob_flags(KnobsSpec(chunked_prefill=False), CAPS_OLD)


def test_merge_args_lets_extra_args_override_the_preset() -> None:
    preset = ["--max-model-len", "1024", "--enforce-eager", "--optimization-level", "0", "--dtype", "bfloat16"]
    merged = merge_args(preset, ["--max-model-len=2048", "-O3", "--dtype", "float32"])
    assert merged == ["--enforce-eager", "--max-model-len=2048", "-O3", "--dtype", "float32"]
    assert option_value(merged, "--max-model-len") == "2048"
    # A JSON value is a value, not a flag.
    assert merge_args(["--speculative-config", '{"a": 1}'], []) == ["--speculative-config", '{"a": 1}']


def _fake_vllm_python(tmp_path: Path, version: str = "9.9.9", device: str = "cpu") -> str:
    """An executable that answers the version probe and --help like a vLLM install would."""
    script = tmp_path / "bin" / "python"
    script.parent.mkdir(parents=True)
    script.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-c" ]; then\n'
        f'  echo \'SLO_CONSOLE_PROBE {{"version": "{version}", "device": "{device}", "vllm_dist": false}}\'\n'
        "  exit 0\n"
        "fi\n"
        f"cat <<'EOF'\n{HELP_0_32}\nEOF\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_version_and_flags_are_probed_once_and_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLO_CONSOLE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(probe_module, "_install_cache", {})
    monkeypatch.setattr(probe_module, "_caps_cache", {})
    python = _fake_vllm_python(tmp_path)
    install = probe_install(python)
    assert (install.version, install.device, install.vllm_script) == ("9.9.9", "cpu", None)
    caps = probe_capabilities(install)
    assert caps.supports("--speculative-config")
    cache_files = list((tmp_path / "cache" / "probes").glob("*.json"))
    assert len(cache_files) == 1
    # A second process (empty memory cache) reads the disk cache even if the python's --help now fails.
    monkeypatch.setattr(probe_module, "_caps_cache", {})
    Path(python).write_text("#!/bin/sh\nexit 3\n")
    assert probe_capabilities(install).flags == caps.flags


def test_a_python_without_vllm_is_unavailable_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(VllmProbeError) as caught:
        probe_install(str(tmp_path / "nope" / "python"))
    assert isinstance(caught.value, BackendUnavailable)
    assert "install-vllm-cpu.sh" in str(caught.value) and "SLO_CONSOLE_VLLM_PYTHON" in str(caught.value)
    with pytest.raises(VllmProbeError, match="cannot import vllm"):
        probe_install(os.environ.get("PYTHON_WITHOUT_VLLM", "/usr/bin/true"))


def test_server_command_has_knobs_cpu_preset_and_extra_args(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLO_CONSOLE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(probe_module, "_install_cache", {})
    monkeypatch.setattr(probe_module, "_caps_cache", {})
    spec = ServerSpec(model=str(tmp_path), extra_args=["--max-model-len", "2048"], env={"X": "1"})
    server = VllmServer(spec, KnobsSpec(max_num_seqs=4), python=_fake_vllm_python(tmp_path))
    argv, env = server.command()
    assert argv[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", str(tmp_path)]
    assert option_value(argv, "--max-num-seqs") == "4"
    assert option_value(argv, "--max-model-len") == "2048" and argv.count("--max-model-len") == 1
    assert option_value(argv, "--gpu-memory-utilization") == "0.3" and "--enforce-eager" in argv
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "1", "X": "1"}
    server_none = VllmServer(spec.model_copy(update={"preset": "none"}), python=server.python)
    assert "--enforce-eager" not in server_none.command()[0]


def test_a_launched_replica_binds_vllms_cpu_threads_to_its_cores_unless_the_profile_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLO_CONSOLE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(probe_module, "_install_cache", {})
    monkeypatch.setattr(probe_module, "_caps_cache", {})
    spec = ServerSpec(model=str(tmp_path))
    cpu = _fake_vllm_python(tmp_path)
    assert VllmServer(spec, python=cpu, omp_cores="1").command()[1]["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in VllmServer(spec, python=cpu).command()[1]
    own = spec.model_copy(update={"env": {"VLLM_CPU_OMP_THREADS_BIND": "0-3"}})
    assert VllmServer(own, python=cpu, omp_cores="1").command()[1]["VLLM_CPU_OMP_THREADS_BIND"] == "0-3"
    cuda = _fake_vllm_python(tmp_path / "cuda", device="cuda")
    assert "VLLM_CPU_OMP_THREADS_BIND" not in VllmServer(spec, python=cuda, omp_cores="1").command()[1]


@pytest.mark.parametrize(
    ("allowed", "slots"),
    [([0, 1], ("0", "1")), ([0, 1, 2], ("0", "1")), ([4, 5, 6, 7], ("4,5", "6,7")), ([3], None), ([], None)],
)
def test_replica_core_slots_are_two_disjoint_halves_of_equal_size(
    allowed: list[int], slots: tuple[str, str] | None
) -> None:
    assert replica_core_slots(allowed) == slots
    assert [other_slot(0), other_slot(1)] == [1, 0]
