"""Build the backend a user asked for: the embedded simulator, a managed vLLM, or a running server."""

from __future__ import annotations

from typing import Literal

from core.backends.base import Backend, BackendUnavailable
from core.profile import Profile, ProfileError, load_calibration

BackendKind = Literal["sim", "vllm", "url"]


def make_backend(
    kind: BackendKind,
    profile: Profile,
    *,
    seed: int | None = None,
    url: str | None = None,
    speed: float | None = None,
    mode: str | None = None,
) -> Backend:
    """`mode` (default: the profile's) on a live backend puts the admission gateway in front of the server
    when it is not plain fcfs or when it is asked for explicitly (core/backends/gateway.py)."""
    if mode is not None:
        from core.control.modes import MODES

        if mode not in MODES:
            raise ProfileError(f"--mode {mode}: not available; choose one of: {', '.join(MODES)}")
    live_mode = mode if mode is not None else (profile.mode if profile.mode != "fcfs" else None)
    if kind in ("url", "vllm") and live_mode is not None:
        from core.backends.gateway import GatewayBackend

        inner = make_backend(kind, profile, seed=seed, url=url, speed=speed)
        return GatewayBackend(inner, profile, live_mode)
    if kind == "sim":
        from core.backends.sim import SimBackend

        return SimBackend(
            load_calibration(profile), profile.knobs, seed=profile.seed if seed is None else seed, speed=speed
        )
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
        return VllmBackend.from_profile(profile)
    raise BackendUnavailable(f"unknown backend {kind!r}; use sim, vllm or url")
