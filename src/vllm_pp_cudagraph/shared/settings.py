"""Plugin settings, read from ``VLLM_PP_CUDAGRAPH_*`` environment variables: the one channel
that reaches every process vLLM starts (API server, engine core, workers, Ray workers)."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

ENV_PREFIX = "VLLM_PP_CUDAGRAPH_"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")
#: Settings that were replaced, with what to set instead.
REPLACED = {"VLLM_PP_CUDAGRAPH_FILL_IDLE_STEPS":
            "VLLM_PP_CUDAGRAPH_DECODE_CADENCE (fill for the old 1, vllm for the old 0)"}
#: The plugin's name in ``VLLM_PLUGINS`` and its ``vllm.general_plugins`` entry point.
PLUGIN_NAME = "pp_cudagraph"
#: vLLM's own variable for a layer split set by hand; it wins over the plugin's setting.
PARTITION_ENV = "VLLM_PP_LAYER_PARTITION"
#: vLLM's own variables the plugin reads (its ``VLLM_PP_CUDAGRAPH_*`` ones are the settings).
VLLM_VARIABLES = frozenset({"VLLM_PLUGINS", "VLLM_USE_V2_MODEL_RUNNER", PARTITION_ENV,
                            "VLLM_USE_BREAKABLE_CUDAGRAPH", "PROMETHEUS_MULTIPROC_DIR"})
_current: PPCudaGraphSettings | None = None
_UNREAD = object()
_hand_set: Any = _UNREAD


class SettingsError(ValueError):
    """A ``VLLM_PP_CUDAGRAPH_*`` variable holds a value the plugin cannot use."""


class PluginConfigError(ValueError):
    """The plugin was enabled together with a setting that contradicts it."""


def _parse_bool(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    lowered = value.strip().lower()
    if lowered not in _TRUE + _FALSE:
        raise ValueError("expected one of 1/0, true/false, yes/no, on/off")
    return lowered in _TRUE


EnvBool = Annotated[bool, BeforeValidator(_parse_bool)]


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


def _partition_choice(value: Any) -> Any:
    """``vllm`` or ``auto``; a list of layer counts is pointed to vLLM's own variable."""
    value = _lower(value)
    if isinstance(value, str) and re.fullmatch(r"[\d\s,]+", value) and re.search(r"\d", value):
        split = re.sub(r"\s", "", value)
        raise ValueError("expected 'vllm' or 'auto'; a split set by hand goes in vLLM's own "
                         f"VLLM_PP_LAYER_PARTITION={split} (which wins over this setting)")
    return value


def _writable_directory(value: Any) -> Any:
    """Empty, or a directory the engine's processes can write in, tried by making it and a file
    in it; what the try made is removed, so reading the settings leaves nothing behind."""
    if not isinstance(value, str) or not value.strip():
        return value
    path = Path(value)
    missing = [p for p in (path, *path.parents) if not p.exists()]  # deepest first
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as exc:
        reason = "it is a file" if path.is_file() else (exc.strerror or str(exc))
        raise ValueError(f"expected a directory the server can write in ({reason}); "
                         "leave it empty for a temporary one") from None
    finally:
        for made in missing:
            with contextlib.suppress(OSError):
                made.rmdir()
    return value


class _Choice(str, Enum):
    """A setting's choices; each prints as its value."""

    def __str__(self) -> str:
        return self.value


class DecodeCadence(_Choice):
    """How often a running request may decode under PP (see ``decode_cadence.py``)."""

    AUTO = "auto"
    MERGE = "merge"
    BALANCE = "balance"
    FILL = "fill"
    VLLM = "vllm"


class LayerPartition(_Choice):
    """How the decoder layers are split over the pipeline stages (see ``layer_partition.py``)."""

    VLLM = "vllm"
    AUTO = "auto"


def hand_set_partition() -> str | None:
    """This process's ``VLLM_PP_LAYER_PARTITION`` as it started, before the plugin sets it."""
    global _hand_set
    if _hand_set is _UNREAD:
        _hand_set = os.environ.get(PARTITION_ENV) or None
    return _hand_set


def environment_value(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """``name`` in this process's environment (or ``environ``): the plugin's one reader."""
    if name not in VLLM_VARIABLES and not name.startswith(ENV_PREFIX):
        raise KeyError(f"{name} is not a variable the plugin reads; add it to VLLM_VARIABLES")
    return (os.environ if environ is None else environ).get(name)


def plugin_variables_set() -> list[str]:
    return [name for name in os.environ if name.startswith(ENV_PREFIX)]


def is_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``VLLM_PLUGINS`` names this plugin, parsed exactly as vLLM does."""
    value = environment_value("VLLM_PLUGINS", environ)
    return value is not None and PLUGIN_NAME in value.split(",")


def set_variable(name: str, value: str | None) -> Callable[[], None]:
    """Set (None: unset) ``name`` for this process and those it starts; return the undo."""
    previous = os.environ.get(name)

    def put(new: str | None) -> None:
        if new is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = new
    put(value)
    return lambda: put(previous)


class PPCudaGraphSettings(BaseModel):
    """Validated plugin settings; build with :meth:`from_env`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_unsupported_vllm: EnvBool = Field(default=False, description=(
        "Activate on a vLLM outside the tested range (its internals may differ)."))
    allow_unproven: EnvBool = Field(default=False, description=(
        "Run the plugin with a speculative method or KV connector it is not proven with "
        "on this vLLM; without it such an engine runs as stock."))
    breakable: EnvBool = Field(default=False, description=(
        "Breakable CUDA graphs, as vLLM's VLLM_USE_BREAKABLE_CUDAGRAPH=1."))
    decode_cadence: Annotated[DecodeCadence, BeforeValidator(_lower)] = Field(
        default=DecodeCadence.AUTO, description=(
            "How often a request decodes under PP: auto, merge, balance, fill or vllm "
            "(docs/settings.md, cadence_policy.py)."))
    kv_update_in_graphs: EnvBool = Field(default=True, description=(
        "Keep each layer's KV-cache write inside piecewise CUDA graphs."))
    direct_handoff: EnvBool = Field(default=False, description=(
        "Hand tensors to the next stage without vLLM's per-step metadata "
        "(stage_handoff.py; experimental)."))
    layer_partition: Annotated[LayerPartition, BeforeValidator(_partition_choice)] = Field(
        default=LayerPartition.VLLM, description=(
            "How the layers are split over the stages: vllm (vLLM's even split) or auto (the "
            "fastest predicted, layer_partition.py). A hand-set VLLM_PP_LAYER_PARTITION wins."))
    stall_limit_s: float = Field(default=60.0, ge=0, description=(
        "Seconds a pipeline step may stay out, with work in flight, before the server "
        "names the stuck stage and stops; at least 5x the longest step seen; 0: off."))
    metrics: EnvBool = Field(default=True, description=(
        "Per-stage figures in vllm serve's /metrics and the log (docs/metrics.md)."))
    metrics_dir: Annotated[str, BeforeValidator(_writable_directory)] = Field(
        default="", description=(
            "Where the engine's processes leave those figures for the API server; empty: a "
            "temporary directory."))

    @staticmethod
    def env_name(field: str) -> str:
        return ENV_PREFIX + field.upper()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PPCudaGraphSettings:
        """Read every ``VLLM_PP_CUDAGRAPH_*`` variable; unknown names are errors."""
        environ = os.environ if environ is None else environ
        known = {cls.env_name(name): name for name in cls.model_fields}
        for key in environ:
            if key in REPLACED:
                raise SettingsError(f"{key} was replaced: set {REPLACED[key]}.")
            if key.startswith(ENV_PREFIX) and key not in known:
                raise SettingsError(
                    f"Unknown setting {key}. Known settings: {', '.join(sorted(known))}.")
        values = {known[key]: raw for key, raw in environ.items() if key in known}
        try:
            return cls(**values)
        except ValidationError as exc:
            fields = [(str(err["loc"][0]), err["msg"].removeprefix("Value error, "))
                      for err in exc.errors()]
            problems = [f"{cls.env_name(f)}={values.get(f)!r}: {msg}" for f, msg in fields]
            raise SettingsError("Invalid plugin setting: " + "; ".join(problems)) from None

    @classmethod
    def current(cls) -> PPCudaGraphSettings:
        """This process's settings: its environment is read once, on the first call."""
        global _current
        if _current is None:
            _current = cls.from_env()
        return _current

    @classmethod
    def describe(cls) -> list[tuple[str, str, str]]:
        """(variable, default, description) rows; the README's table must list them."""
        return [(cls.env_name(name), str(field.default), field.description or "")
                for name, field in cls.model_fields.items()]
