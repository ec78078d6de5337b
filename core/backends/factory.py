"""Build the backend a user asked for: the embedded simulator, a managed vLLM, or a running server."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from core.backend_api import Backend, BackendUnavailable
from core.profile import Profile, SchedulingMode, load_calibration, parse_scheduling_mode
from core.serve.autogroup import separate_autogroup_warning

if TYPE_CHECKING:
    from core.serve.process import StateCallback

BackendKind = Literal["sim", "vllm", "url"]


def make_backend(
    kind: BackendKind,
    profile: Profile,
    *,
    seed: int | None = None,
    url: str | None = None,
    speed: float | None = None,
    mode: SchedulingMode | None = None,
    on_server_state: StateCallback | None = None,
    on_advice: Callable[[str], None] | None = None,
) -> Backend:
    """The backend serves `profile.mode` (the one channel for the scheduling mode). `mode`, when given, is
    applied to the profile first (`Profile.with_mode`) and also asks for the admission gateway on a live
    backend even for fcfs. On the simulator the mode runs in the simulated controller; on a live backend the
    admission gateway (core/backends/gateway_backend.py) runs it in front of the server, when the mode is not
    plain fcfs or when a mode is asked for explicitly. `on_server_state`: called (on the process watcher's
    thread) when a managed vLLM changes state (the console's process tab). `on_advice`: told one line of
    advice about the set-up (a `--backend url` server in another autogroup: core/serve/autogroup.py); by
    default it goes to the log (stderr in batch mode)."""
    if mode is not None:
        profile = profile.with_mode(parse_scheduling_mode(mode))
    mode_name = profile.mode
    if kind == "sim":
        return _make_sim(profile, seed=seed, speed=speed, mode_name=mode_name)
    inner = _make_live(kind, profile, url=url, mode_name=mode_name, on_server_state=on_server_state)
    advice = separate_autogroup_warning(url) if kind == "url" and url else None
    if advice is not None:
        (on_advice or logging.getLogger("slo_console").warning)(advice)
    if mode is not None or mode_name != "fcfs":
        return gateway_in_front(inner, profile, mode_name)
    return inner


def gateway_in_front(inner: Backend, profile: Profile, mode: SchedulingMode) -> Backend:
    """The admission gateway running `mode` in front of a live backend (a running one keeps running): the
    one place a gateway backend is built, for `make_backend` and for a console switching modes live."""
    from core.backends.gateway_backend import GatewayBackend

    return GatewayBackend(inner, profile, mode)


def _make_sim(profile: Profile, *, seed: int | None, speed: float | None, mode_name: SchedulingMode) -> Backend:
    from core.backends.sim import SimBackend
    from core.modes import ModeContext, make_policy

    calibration = load_calibration(profile)
    run_seed = profile.seed if seed is None else seed
    context = ModeContext(profile=profile, calibration=calibration, replicas=profile.replicas, seed=run_seed)
    return SimBackend(
        calibration,
        profile.knobs,
        seed=run_seed,
        speed=speed,
        policy_factory=None if mode_name == "fcfs" else lambda: make_policy(mode_name, context),
        replicas=profile.replicas,
    )


def _make_live(
    kind: BackendKind,
    profile: Profile,
    *,
    url: str | None,
    mode_name: SchedulingMode = "fcfs",
    on_server_state: StateCallback | None = None,
) -> Backend:
    if kind == "url":
        if not url:
            raise BackendUnavailable("--backend url needs --url http://HOST:PORT of a running server")
        try:
            from core.backends.live import UrlBackend
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise BackendUnavailable(f"the live client cannot load ({exc}); reinstall slo-console") from exc
        return UrlBackend(url)
    if kind == "vllm":
        try:
            from core.backends.vllm import VllmBackend
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise BackendUnavailable(f"the vLLM backend cannot load ({exc}); reinstall slo-console") from exc
        extra: dict[str, object] | None = None
        if mode_name == "adaserve":
            from core.control.adaserve.live import live_speculation_extra

            extra = live_speculation_extra(profile)
        return VllmBackend.from_profile(profile, speculation_extra=extra, on_state=on_server_state)
    raise BackendUnavailable(f"unknown backend {kind!r}; use sim, vllm or url")
