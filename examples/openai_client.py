"""Query a vLLM server with the OpenAI client: a completion and a streamed chat.

Needs a running server (start one with examples/serve_pp2.sh MODEL) and the
openai package, which vLLM installs. MODEL defaults to the server's first model.

    python examples/openai_client.py [--url http://localhost:8000] [--model NAME]
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://localhost:8000",
                        help="the server (default: %(default)s)")
    parser.add_argument("--model", help="the served model name (default: the server's first)")
    args = parser.parse_args()
    url = args.url.rstrip("/").removesuffix("/v1")
    try:
        import openai
    except ImportError:
        sys.exit(f"{parser.prog}: the openai package is not installed. "
                 "Install it with: pip install openai (vLLM installs it too)")

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    try:
        model = args.model or client.models.list().data[0].id
        completion = client.completions.create(
            model=model, prompt="Pipeline parallelism splits a model", max_tokens=24,
            temperature=0.0)
        print("completion:", repr(completion.choices[0].text))

        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Name three colours."}],
            max_tokens=24, temperature=0.0, stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        print("chat (streamed):", repr(text))
    except openai.APIConnectionError as error:
        sys.exit(f"{parser.prog}: could not reach the server at {url}: "
                 f"{error.__cause__ or error}. Start one with: examples/serve_pp2.sh MODEL")
    except openai.APIStatusError as error:
        sys.exit(f"{parser.prog}: the server at {url} answered "
                 f"{error.status_code}: {error.message}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
