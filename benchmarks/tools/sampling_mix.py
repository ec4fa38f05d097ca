"""The sampling options the soak's load sends, and which of them its token check scores.

With ``--sampling-mix`` each request carries one of :data:`SAMPLING_MIX`'s
options, chosen by its seed (:class:`vllm_pp_cudagraph.bench.serve_load.LoadSpec`),
so every server gets the same mix.
"""

from __future__ import annotations

from typing import Any

#: Sampling options users send, one per request. Sampled ones carry a seed, so
#: a request samples the same tokens wherever its logits are the same. Only
#: requests without options that move the output off the model's top choice
#: are scored by the soak's token check (:func:`scored`).
SAMPLING_MIX: dict[str, dict[str, Any]] = {
    "greedy": {},
    "seeded-top-p-top-k": {"temperature": 0.8, "top_p": 0.9, "top_k": 50, "seed": 7},
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

_OFF_TOP_CHOICE = ("temperature", "presence_penalty", "repetition_penalty",
                   "frequency_penalty", "min_tokens", "n")


def scored(sampling: str) -> bool:
    """Whether outputs of ``sampling`` follow the base model's top choice at every token.

    Only this mix's options qualify: another entry of a load's mix (a LoRA
    adapter of the soak's ``--lora``, say) has a top choice the scorer does not know.
    """
    options = SAMPLING_MIX.get(sampling)
    return options is not None and not any(key in options for key in _OFF_TOP_CHOICE)
