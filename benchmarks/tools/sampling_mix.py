"""The sampling options the soak's load sends (one per request, chosen by its seed, so every
server gets the same mix), and which of them its token check scores."""

from __future__ import annotations

import json
from typing import Any

#: Enums and booleans only: a random model completes it in a few dozen bytes.
SCHEMA = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "size": {"enum": ["S", "M", "L"]},
        "ok": {"type": "boolean"},
    },
    "required": ["colour", "size", "ok"],
    "additionalProperties": False,
}

STRUCTURED_SERVE_ARGS = ["--structured-outputs-config",
                         json.dumps({"backend": "xgrammar", "disable_any_whitespace": True})]

JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA}}

#: Sampling options users send; sampled ones carry a seed, so equal logits sample equal tokens.
SAMPLING_MIX: dict[str, dict[str, Any]] = {
    "greedy": {},
    "seeded-top-p-top-k": {"temperature": 0.8, "top_p": 0.9, "top_k": 50, "seed": 7},
    # Top-p alone (as most clients send it) takes vLLM kernels that top-k rows never reach.
    "seeded-top-p": {"temperature": 0.9, "top_p": 0.95, "seed": 5},
    "penalties": {"presence_penalty": 0.5, "repetition_penalty": 1.2,
                  "frequency_penalty": 0.3},
    "min-tokens": {"min_tokens": 24},  # EOS masked: off the top choice where EOS was it
    "n2": {"temperature": 0.7, "n": 2, "seed": 11},
    "logprobs": {"logprobs": 5},
    "stop": {"stop": ["w1"]},  # tokens read "w<id>"; one in nine starts "w1": most stop early
}

#: JSON-schema requests (``--structured``), ended by EOS, which the load otherwise ignores.
STRUCTURED_MIX: dict[str, dict[str, Any]] = {
    "json-schema": {"response_format": JSON_SCHEMA_FORMAT, "ignore_eos": False},
    "json-schema-seeded": {"response_format": JSON_SCHEMA_FORMAT, "ignore_eos": False,
                           "temperature": 0.8, "top_p": 0.9, "seed": 13},
    "json-schema-penalties": {"response_format": JSON_SCHEMA_FORMAT, "ignore_eos": False,
                              "presence_penalty": 0.5, "frequency_penalty": 0.3},
}


def structured(sampling: str) -> bool:
    """Whether requests sent with option ``sampling`` must answer JSON matching SCHEMA."""
    return sampling in STRUCTURED_MIX


def schema_problems(text: str) -> list[str]:
    """Why ``text`` is not a JSON document matching :data:`SCHEMA` (empty: it is)."""
    import jsonschema

    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        return [f"does not parse: {exc}: {text[:80]!r}"]
    try:
        jsonschema.validate(document, SCHEMA)
    except jsonschema.ValidationError as exc:
        return [f"does not match the schema: {exc.message}"]
    return []


_OFF_TOP_CHOICE = ("temperature", "presence_penalty", "repetition_penalty",
                   "frequency_penalty", "min_tokens", "n")


def scored(sampling: str) -> bool:
    """Whether outputs of ``sampling`` follow the base model's top choice at every token."""
    options = SAMPLING_MIX.get(sampling)
    return options is not None and not any(key in options for key in _OFF_TOP_CHOICE)
