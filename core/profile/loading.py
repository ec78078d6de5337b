"""Reading profiles and the files they name: one-line errors (file, field path, expected value), paths."""

from __future__ import annotations

import difflib
import hashlib
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from core.profile.errors import ProfileError
from core.profile.model import Profile
from core.profile.serving_spec import Calibration

PROFILES_DIR = Path(__file__).resolve().parent.parent.parent / "profiles"

# libyaml's parser where PyYAML was built with it (the wheels are): the same documents, values and errors
# (the constructor and the resolver are PyYAML's Python ones either way), read five to six times faster than
# by the pure-Python parser, whose reading of a profile and its calibration was 1.6% of a one-request batch run.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation can hold (through Optional, unions, lists, dicts, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is None:
        return []
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        args = args[:1]
    elif origin not in (typing.Union, types.UnionType, list, dict, tuple, set):
        return []
    return [model for arg in args for model in _models_in(arg)]


def _field_suggestion(root: type[BaseModel], loc: tuple[Any, ...]) -> str | None:
    """For an unknown key at `loc`, the nearest field name the model at that level has (difflib)."""
    models = [root]
    for part in loc[:-1]:
        if isinstance(part, int):
            continue  # a list index: the same models
        fields = [model.model_fields[part] for model in models if part in model.model_fields]
        inner = [m for info in fields for m in _models_in(info.annotation)]
        # Not a field: a union's tag in the location (e.g. `poisson`); keep the models as they are.
        models = inner or models
    names = {name for model in models for name in model.model_fields}
    near = difflib.get_close_matches(str(loc[-1]), sorted(names), n=1)
    return near[0] if near else None


def _format_validation(path: Path, err: ValidationError, model: type[BaseModel]) -> str:
    errors = err.errors()
    # A misspelt key usually also causes a "field required" error elsewhere; the typo is the cause.
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = ".".join(str(p) for p in first["loc"] if not str(p).startswith("function-after"))
    if first["type"] == "extra_forbidden":
        near = _field_suggestion(model, tuple(p for p in first["loc"] if not str(p).startswith("function-after")))
        hint = f"did you mean {near}? " if near else ""
        msg = f"unknown field; {hint}check its spelling and level against the shipped profiles/quickstart.yaml"
    else:
        # A validator's own message (ValueError) already names the fix; pydantic's prefix adds nothing.
        msg = first["msg"].removeprefix("Value error, ")
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
    shipped = shipped_profiles()
    near = difflib.get_close_matches(str(name_or_path), shipped, n=1)
    hint = f"did you mean {near[0]}? " if near else ""
    raise ProfileError(
        f"{name_or_path}: profile not found; {hint}give a path to a YAML file or a shipped name: {', '.join(shipped)}"
    )


def shipped_profiles() -> list[str]:
    """The names of the profiles installed with slo-console (profiles/*.yaml)."""
    return sorted(path.stem for path in PROFILES_DIR.glob("*.yaml"))


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.load(path.read_text(), Loader=_SAFE_LOADER)
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
        raise ProfileError(_format_validation(path, exc, Profile)) from None
    # Remember where it came from: relative paths inside (calibration, trace) resolve against it.
    profile._source = path.resolve()
    return profile


def profile_source(profile: Profile) -> Path | None:
    return profile._source


def resolve_relative(profile: Profile, ref: str) -> Path:
    """Resolve a path written in a profile: relative to the profile's file, then to profiles/. A directory
    will not do (an empty or blank path names the profile's own directory); a pipe will (`<(zcat t.gz)`)."""
    path = Path(ref)
    source = profile_source(profile)
    candidates = [path] if path.is_absolute() else ([source.parent / path] if source else []) + [PROFILES_DIR / path]
    for candidate in candidates:
        if candidate.exists() and not candidate.is_dir():
            return candidate
    where = f"{source}: " if source else ""
    raise ProfileError(
        f"{where}{ref!r}: no such file (looked in {', '.join(map(str, candidates))}); "
        "fix the path, relative to the profile's directory"
    )


def load_calibration(profile: Profile) -> Calibration:
    ref = profile.engine.calibration
    if isinstance(ref, Calibration):
        return ref
    path = resolve_relative(profile, ref)
    data = _read_yaml(path)
    try:
        return Calibration.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(_format_validation(path, exc, Calibration)) from None


def profile_hash(profile: Profile) -> str:
    """A stable hash of the validated profile (for provenance)."""
    blob = profile.model_dump_json(exclude_none=False).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
