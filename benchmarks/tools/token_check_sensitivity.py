"""How far below the top choice a mishandled token lands on the soak's model (CPU).

The soak's token check (``python -m benchmarks.tools.soak --token-check``) bounds how far
below the model's top choice a served token may lie. This measures, on the soak's
own model (seeded random weights, Qwen3-0.6B shape) in bfloat16 with Hugging Face
transformers, what the defects it is meant to catch look like: greedy outputs for
a few soak prompts, then at each output position the margin of a token repeated
from the previous position, of the next token served one position early (a lost
token), and of a random vocabulary token. Positions where the defect would not
change the text (the model repeating itself) are left out.

    python -m benchmarks.tools.token_check_sensitivity [--prompts 8] [--tokens 40]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import torch
from transformers import AutoModelForCausalLM

from vllm_pp_cudagraph.commands.bench.dummy_model import write_model_dir

from benchmarks.tools.soak import soak_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=40)
    args = parser.parse_args()
    model_dir = write_model_dir(tempfile.mkdtemp(prefix="sensitivity-"), weights=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16).eval()
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    margins: dict[str, list[float]] = {"repeated": [], "lost": [], "foreign": [], "own": []}
    for prompt in soak_prompts()[: 2 * args.prompts : 2]:
        seq = [int(word[1:]) for word in prompt.split()]
        start = len(seq)
        with torch.no_grad():
            for _ in range(args.tokens):
                seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
            logprobs = torch.log_softmax(model(torch.tensor([seq])).logits[0].float(), -1)
        for j in range(start + 1, len(seq) - 1):
            row = logprobs[j - 1]
            top = row.max()
            margins["own"].append(float(top - row[seq[j]]))
            if seq[j - 1] != seq[j]:
                margins["repeated"].append(float(top - row[seq[j - 1]]))
            if seq[j + 1] != seq[j]:
                margins["lost"].append(float(top - row[seq[j + 1]]))
            foreign = int(torch.randint(0, vocab, (1,), generator=generator))
            margins["foreign"].append(float(top - row[foreign]))
    print("nats below the top choice at the same position")
    print(f"{'token':<10}{'n':>6}{'min':>8}{'p5':>8}{'median':>8}{'share > 0.094':>15}")
    for name, values in margins.items():
        values.sort()
        over = sum(v > 0.094 for v in values) / len(values)
        print(f"{name:<10}{len(values):>6}{values[0]:>8.3f}{values[len(values) // 20]:>8.3f}"
              f"{statistics.median(values):>8.3f}{over:>15.0%}")


if __name__ == "__main__":
    main()
