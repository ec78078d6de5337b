"""Reading profiles and the files they name: one-line errors (file, field path, expected value), paths."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from core.profile.errors import ProfileError
from core.profile.model import Profile
from core.profile.serving_spec import Calibration

PROFILES_DIR = Path(__file__).resolve().parent.parent.parent / "profiles"


def _format_validation(path: Path, err: ValidationError) -> str:
    errors = err.errors()
    # A misspelt key usually also causes a "field required" error elsewhere; the typo is the cause.
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = ".".join(str(p) for p in first["loc"] if not str(p).startswith("function-after"))
    if first["type"] == "extra_forbidden":
        msg = "unknown field; check its spelling and level against the shipped profiles/quickstart.yaml"
    else:
        msg = first["msg"]
    got = first.get("input")
    got_text = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
    if first["type"] == "extra_forbidden":
        got_text = ""
    more = len(errors) - 1
    tail = f"; and {more} more problem(s)" if more else ""
    where = f"{loc}: " if loc else ""
    return f"{path}: {where}{msg}{got_text}{tail}"


def resolve_profile_path(name_or_path: str | Path) -> Path:
    """A path as given, else a name under the shipped profiles/ (with or without .yaml)."""
    path = Path(name_or_path)
    if path.exists():
        return path
    # A name: the working directory's profiles/ (a checkout), then the profiles installed with slo-console.
    local = Path.cwd() / "profiles"
    candidates = (local / f"{path}.yaml", PROFILES_DIR / path, PROFILES_DIR / f"{path}.yaml", PROFILES_DIR / path.name)
    for candidate in candidates:
        if candidate.exists():
            return candidate
    raise ProfileError(f"{name_or_path}: profile not found; give a path to a YAML file or a name from {PROFILES_DIR}")


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read ({exc.strerror}); check the path") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ProfileError(f"{path}:{where} is not valid YAML; fix the syntax there") from exc


def load_profile(name_or_path: str | Path) -> Profile:
    path = resolve_profile_path(name_or_path)
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping of profile fields at the top level")
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(_format_validation(path, exc)) from None
    # Remember where it came from: relative paths inside (calibration, trace) resolve against it.
    profile._source = path.resolve()
    return profile


def profile_source(profile: Profile) -> Path | None:
    return profile._source


def resolve_relative(profile: Profile, ref: str) -> Path:
    """Resolve a path written in a profile: relative to the profile's file, then to profiles/."""
    path = Path(ref)
    if path.is_absolute():
        return path
    source = profile_source(profile)
    candidates = ([source.parent / path] if source else []) + [PROFILES_DIR / path]
    for candidate in candidates:
        if candidate.exists():
            return candidate
    raise ProfileError(f"{ref}: file named in the profile not found (looked in {', '.join(map(str, candidates))})")


def load_calibration(profile: Profile) -> Calibration:
    ref = profile.engine.calibration
    if isinstance(ref, Calibration):
        return ref
    path = resolve_relative(profile, ref)
    data = _read_yaml(path)
    try:
        return Calibration.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(_format_validation(path, exc)) from None


def profile_hash(profile: Profile) -> str:
    """A stable hash of the validated profile (for provenance)."""
    blob = profile.model_dump_json(exclude_none=False).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
