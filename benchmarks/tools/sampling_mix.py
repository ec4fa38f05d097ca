"""The sampling options the soak's load sends, and which of them its token check scores.

With ``--sampling-mix`` each request carries one of :data:`SAMPLING_MIX`'s
options, chosen by its seed (:class:`vllm_pp_cudagraph.commands.bench.serve_load.LoadSpec`),
so every server gets the same mix. With ``--structured`` the mix also holds
:data:`STRUCTURED_MIX`'s options: JSON-schema structured output (:data:`SCHEMA`),
which every such output must parse as and match (:func:`schema_problems`).
"""

from __future__ import annotations

import json
from typing import Any

#: Bounded JSON: enums and booleans only, so a random model completes it in a
#: few dozen bytes once whitespace is fixed (STRUCTURED_SERVE_ARGS).
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

#: Server arguments for structured outputs: xgrammar with whitespace fixed, so
#: a random model's JSON ends within a few dozen bytes.
STRUCTURED_SERVE_ARGS = ["--structured-outputs-config",
                         json.dumps({"backend": "xgrammar", "disable_any_whitespace": True})]

#: The OpenAI ``response_format`` asking for JSON that matches SCHEMA.
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA}}

#: Sampling options users send, one per request. Sampled ones carry a seed, so
#: a request samples the same tokens wherever its logits are the same. Only
#: requests without options that move the output off the model's top choice
#: are scored by the soak's token check (:func:`scored`).
SAMPLING_MIX: dict[str, dict[str, Any]] = {
    "greedy": {},
    "seeded-top-p-top-k": {"temperature": 0.8, "top_p": 0.9, "top_k": 50, "seed": 7},
    # Top-p alone, as most OpenAI clients send it: vLLM masks such rows with kernels of
    # their own (split by batch size), which top-k rows never reach.
    "seeded-top-p": {"temperature": 0.9, "top_p": 0.95, "seed": 5},
    "penalties": {"presence_penalty": 0.5, "repetition_penalty": 1.2,
                  "frequency_penalty": 0.3},
    # Stop tokens masked until the 24th token (the load sets ignore_eos, so only the
    # mask moves the output off the top choice where EOS would have been it).
    "min-tokens": {"min_tokens": 24},
    "n2": {"temperature": 0.7, "n": 2, "seed": 11},
    "logprobs": {"logprobs": 5},
    # The soak's word tokenizer spells every token "w<id>": about one token in
    # nine starts with "w1", so most requests stop early on it.
    "stop": {"stop": ["w1"]},
}

#: JSON-schema requests: three options, so with SAMPLING_MIX's eight about a quarter
#: of the load. The grammar ends them with EOS, which the load otherwise ignores.
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
    """Whether outputs of ``sampling`` follow the base model's top choice at every token.

    Only this mix's options qualify: another entry of a load's mix (a LoRA
    adapter of the soak's ``--lora``, say) has a top choice the scorer does not know.
    """
    options = SAMPLING_MIX.get(sampling)
    return options is not None and not any(key in options for key in _OFF_TOP_CHOICE)
