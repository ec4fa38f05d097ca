"""Query a vLLM server with the OpenAI client: a completion and a streamed chat.

    python examples/openai_client.py [--base-url http://127.0.0.1:8000/v1] [--model demo]
"""

from __future__ import annotations

import argparse

from openai import OpenAI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1",
                        help="the server's OpenAI API (default: %(default)s)")
    parser.add_argument("--model", default="demo",
                        help="the served model name (default: %(default)s)")
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key="unused")

    completion = client.completions.create(
        model=args.model, prompt="Pipeline parallelism splits a model", max_tokens=24,
        temperature=0.0)
    print("completion:", repr(completion.choices[0].text))

    stream = client.chat.completions.create(
        model=args.model, messages=[{"role": "user", "content": "Name three colours."}],
        max_tokens=24, temperature=0.0, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    print("chat (streamed):", repr(text))


if __name__ == "__main__":
    main()
