"""The environment registry: built-in specs, the ``polyturn.envs`` entry-point group, ``register``.

Every environment polyturn can run is an :class:`~polyturn.envs.spec.EnvSpec`
registered here, and with gymnasium (so ``gymnasium.make(id)`` works too):

* built-in environments are the packages under ``polyturn/envs/`` that hold a
  ``spec.py`` with a ``SPEC`` (found by walking the package, not by a list);
* a third-party package names its spec in its ``pyproject.toml``::

      [project.entry-points."polyturn.envs"]
      meeting = "meeting_booking.spec:SPEC"

  (the object may also be a list of specs, or a function returning a spec or a
  list), and is loaded on first use, as gymnasium's ``load_plugin_envs`` does;
* or any code calls :func:`register` before use.

``import polyturn`` runs :func:`load_envs`. A plugin that fails to load is
logged and skipped (:data:`PLUGIN_ERRORS` keeps why), so one broken package
does not break polyturn.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import pkgutil
from collections.abc import Mapping
from typing import Any, Protocol

import gymnasium

import polyturn.envs
from polyturn.envs.spec import EnvSpec, load_attr

log = logging.getLogger(__name__)

#: The entry-point group third-party environments register through.
ENTRY_POINT_GROUP = "polyturn.envs"

_SPECS: dict[str, EnvSpec] = {}
_loaded = False

#: entry-point name -> why it did not load (filled by :func:`load_envs`).
PLUGIN_ERRORS: dict[str, str] = {}


class TextPolicy(Protocol):
    """What a scripted expert (or any text policy) provides."""

    name: str

    def reset(self, obs: str, info: Mapping[str, Any]) -> None:
        """Start an episode from the first observation and its info."""

    def act(self, obs: str, info: Mapping[str, Any]) -> str:
        """The next action text."""


def register(spec: EnvSpec) -> None:
    """Register ``spec`` (and its id with gymnasium); registering the same spec again is a no-op.

    A different spec under an id already taken raises ``ValueError``.
    """
    if not isinstance(spec, EnvSpec):
        raise TypeError(f"Expected a polyturn.envs.spec.EnvSpec, got {type(spec).__name__}")
    old = _SPECS.get(spec.id)
    if old is not None and old != spec:
        raise ValueError(f"Expected a new env id, got {spec.id!r}, already registered with entry point "
                         f"{old.entry_point}; choose another id or version")
    _SPECS[spec.id] = spec
    if spec.id not in gymnasium.registry:
        # max_turns truncation lives in the env itself, so no TimeLimit wrapper here.
        gymnasium.register(id=spec.id, entry_point=spec.entry_point)


def _register_loaded(obj: Any, source: str) -> None:
    if callable(obj) and not isinstance(obj, EnvSpec):
        obj = obj()
    specs = [obj] if isinstance(obj, EnvSpec) else list(obj) if isinstance(obj, (list, tuple)) else [obj]
    for spec in specs:
        if not isinstance(spec, EnvSpec):
            raise TypeError(f"Expected {source} to give an EnvSpec (or a list of them), got {type(spec).__name__}")
        register(spec)


def _builtin_spec_modules() -> list[str]:
    names = []
    for info in pkgutil.iter_modules(polyturn.envs.__path__):
        module = f"polyturn.envs.{info.name}.spec"
        if info.ispkg and importlib.util.find_spec(module) is not None:
            names.append(module)
    return sorted(names)


def load_envs(*, reload_plugins: bool = False) -> None:
    """Register the built-in specs and every spec of the ``polyturn.envs`` entry-point group (once)."""
    global _loaded
    if _loaded and not reload_plugins:
        return
    _loaded = True
    for module in _builtin_spec_modules():
        register(importlib.import_module(module).SPEC)
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            _register_loaded(ep.load(), f"entry point {ep.name} = {ep.value}")
            PLUGIN_ERRORS.pop(ep.name, None)
        except Exception as e:  # noqa: BLE001  (a broken plugin must not break polyturn)
            PLUGIN_ERRORS[ep.name] = f"{type(e).__name__}: {e}"
            log.warning("polyturn.envs entry point %s = %s failed to load: %s", ep.name, ep.value, e)


def env_ids() -> list[str]:
    """The registered env ids, sorted."""
    load_envs()
    return sorted(_SPECS)


def env_spec(env_id: str) -> EnvSpec:
    """The spec registered under ``env_id``; an unknown id raises ``ValueError`` naming the known ones."""
    load_envs()
    if env_id not in _SPECS:
        hint = f"; plugins that failed to load: {PLUGIN_ERRORS}" if PLUGIN_ERRORS else ""
        raise ValueError(f"Expected a registered env id (known: {sorted(_SPECS)}), got {env_id!r}{hint}. "
                         "Install the environment's package or call polyturn.acting.registry.register(spec)")
    return _SPECS[env_id]


def spec_or_none(env_id: str | None) -> EnvSpec | None:
    """The spec of ``env_id`` if one is registered (records of unknown envs are still evaluated generically)."""
    load_envs()
    return _SPECS.get(env_id or "")


def env_id_of(env: gymnasium.Env) -> str:
    """The env id an environment was made with (its class name when it was constructed directly)."""
    spec = env.spec if env.spec is not None else env.unwrapped.spec
    return spec.id if spec is not None else type(env.unwrapped).__name__


def make_env(env_id: str, env_kwargs: Mapping[str, Any] | None = None) -> gymnasium.Env:
    """``gymnasium.make(env_id, **env_kwargs)`` without the env checker; a bad id or kwarg raises ``ValueError``.

    The message names the registered ids, or the keyword the environment rejected.
    """
    if env_kwargs is not None and not isinstance(env_kwargs, Mapping):
        raise ValueError(f"Expected env kwargs as a JSON object (e.g. {{\"max_turns\": 6}}), "
                         f"got {type(env_kwargs).__name__} {env_kwargs!r}")
    load_envs()
    kwargs = dict(env_kwargs or {})
    try:
        return gymnasium.make(env_id, disable_env_checker=True, **kwargs)
    except gymnasium.error.Error as e:
        raise ValueError(f"Expected a registered env id (known: {env_ids()}), got {env_id!r} ({e})") from None
    except TypeError as e:  # the env's constructor rejected a keyword
        reason = str(e).split(" was raised from the environment creator")[0]  # gymnasium appends the kwargs
        raise ValueError(f"Expected env kwargs that {env_id} accepts, got {kwargs} ({reason})") from None


def expert_class(env_id: str) -> type:
    """The scripted expert class of ``env_id`` (its spec's ``expert``); ``ValueError`` when it has none."""
    spec = spec_or_none(env_id)
    if spec is None or spec.expert is None:
        with_expert = sorted(k for k, s in _SPECS.items() if s.expert)
        raise ValueError(f"Expected an env id with a scripted expert ({with_expert}), got {env_id!r}; "
                         "set expert='package.module:Class' in its EnvSpec")
    return load_attr(spec.expert)


def make_expert(env: gymnasium.Env, *, noise: Any = 0.0, seed: int = 0,
                options: Mapping[str, Any] | None = None) -> TextPolicy:
    """The scripted expert of ``env`` (its spec's ``expert``), as ``cls(env, noise=noise, seed=seed, **options)``;
    an option the class does not take is a ``ValueError`` naming the ones it does (``bc.expert_options``)."""
    cls = expert_class(env_id_of(env))
    options = dict(options or {})
    if options:
        params = inspect.signature(cls.__init__).parameters
        taken = sorted(k for k, p in params.items() if p.kind is p.KEYWORD_ONLY and k not in ("noise", "seed"))
        unknown = sorted(set(options) - set(taken))
        if unknown:
            raise ValueError(f"Expected options of {cls.__name__} from {taken or 'none'}, got {unknown}")
    return cls(env, noise=noise, seed=seed, **options)
