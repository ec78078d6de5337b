"""Build the backend a user asked for: the embedded simulator, a managed vLLM, or a running server."""

from __future__ import annotations

from typing import Literal

from core.backends.base import Backend, BackendUnavailable
from core.profile import Profile, load_calibration

BackendKind = Literal["sim", "vllm", "url"]


def make_backend(
    kind: BackendKind,
    profile: Profile,
    *,
    seed: int | None = None,
    url: str | None = None,
    speed: float | None = None,
) -> Backend:
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
